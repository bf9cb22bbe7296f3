// The grouped form of the matmul weights of the legacy block types (matmul/dequant.cuh's legacy_block: each
// run of 8 blocks of a row rewritten on the device as its 8 headers, then its 8 quant arrays) and of Q6_K
// (q6k_block: 8 super-blocks' scales, their d, their quants), rows 16-byte aligned; and the row form of
// f8_e4m3 weights whose rows have one scale each (Quant<f8_e4m3>: the scale, then the row's codes).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>

#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/matmul/dequant.cuh"

namespace kiln::cuda {

namespace {

// Thread: one block of one row (grid-strided), its header and quants copied to their places in grouped
// form.
// Calls f(from, g, j) for block b of row r, a thread each (grid-strided): from, the block's bytes in the
// file's row; g, its run of 8 in the grouped row; j = b % 8, its place in the run.
template <int kBlockBytes, class F>
__device__ void for_each_block(const uint8_t* src, int64_t src_nb1, int64_t n_blocks, int64_t n_rows,
                               uint8_t* dst, int64_t dst_nb1, F&& f) {
  const int64_t total = n_blocks * n_rows;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / n_blocks, b = i % n_blocks;
    f(src + r * src_nb1 + b * kBlockBytes, dst + r * dst_nb1 + (b / 8) * (8 * kBlockBytes),
      static_cast<int>(b % 8));
  }
}

template <int kHead, int kQs>
__global__ void group_rows_kernel(const uint8_t* src, int64_t src_nb1, int64_t n_blocks, int64_t n_rows,
                                  uint8_t* dst, int64_t dst_nb1) {
  for_each_block<kHead + kQs>(src, src_nb1, n_blocks, n_rows, dst, dst_nb1,
                              [](const uint8_t* from, uint8_t* g, int j) {
                                for (int e = 0; e < kHead; ++e) g[j * kHead + e] = from[e];
                                for (int e = 0; e < kQs; ++e) g[8 * kHead + j * kQs + e] = from[kHead + e];
                              });
}

// Thread: one Q6_K super-block of one row (grid-strided): its scales, d and quants (ql's quarters 0, 2, 1, 3,
// then qh) to their places in grouped form.
__global__ void group_q6k_rows_kernel(const uint8_t* src, int64_t src_nb1, int64_t n_blocks, int64_t n_rows,
                                      uint8_t* dst, int64_t dst_nb1) {
  for_each_block<210>(src, src_nb1, n_blocks, n_rows, dst, dst_nb1,
                      [](const uint8_t* from, uint8_t* g, int j) {
                        for (int e = 0; e < 16; ++e) g[16 * j + e] = from[192 + e];
                        g[128 + 2 * j] = from[208];
                        g[128 + 2 * j + 1] = from[209];
                        uint8_t* qs = g + 144 + 192 * j;
                        for (int e = 0; e < 128; ++e)
                          qs[32 * ((e / 32) / 2 + 2 * ((e / 32) % 2)) + e % 32] = from[e];
                        for (int e = 128; e < 192; ++e) qs[e] = from[e];
                      });
}

// Thread: one f8_e4m3 block of one row (grid-strided): its 32 codes to their place in the row, and the first
// block's scale to the row's header (every block of the row has it: grouped_row_bytes(host)).
__global__ void f8_rows_kernel(const uint8_t* src, int64_t src_nb1, int64_t n_blocks, int64_t n_rows,
                               uint8_t* dst, int64_t dst_nb1) {
  const int64_t total = n_blocks * n_rows;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / n_blocks, b = i % n_blocks;
    const uint8_t* from = src + r * src_nb1 + b * 36;
    uint8_t* row = dst + r * dst_nb1;
    if (b == 0) {
      for (int e = 0; e < 4; ++e) row[12 + e] = from[e];
    }
    for (int e = 0; e < 32; ++e) row[16 + b * 32 + e] = from[4 + e];
  }
}

}  // namespace

int64_t grouped_row_bytes(std::span<const Tensor> host) {
  if (host.empty()) return 0;
  const DType type = host[0].type;
  const int64_t k = host[0].ne[0];
  for (const Tensor& t : host) {
    if (t.type != type || t.ne[0] != k) return 0;
  }
  if (type != DType::f8_e4m3 || k % 32 != 0) return grouped_row_bytes(type, k);
  // The row form needs one scale a row: every block of a row at its first block's scale, compared as bytes.
  for (const Tensor& t : host) {
    if (t.ne[3] != 1) return 0;
    for (int64_t j = 0; j < t.ne[1] * t.ne[2]; ++j) {
      const auto* row =
          static_cast<const uint8_t*>(t.data) + (j / t.ne[1]) * t.nb[2] + (j % t.ne[1]) * t.nb[1];
      for (int64_t b = 1; b < k / 32; ++b) {
        if (std::memcmp(row, row + b * 36, 4) != 0) return 0;
      }
    }
  }
  return grouped_row_bytes(type, k);
}

int64_t grouped_row_bytes(DType type, int64_t k) {
  int64_t bytes = 0;
  if (type == DType::f8_e4m3) {
    if (k % 32 == 0) bytes = k + 16;
  } else if (type == DType::q6_k) {
    if (k % 256 == 0) bytes = grouped_bytes(k, 256, 18, 192);  // a multiple of 16
  } else if (k % 32 == 0) {
    (void)visit_weight_type(type, [&](auto tag) {
      using Q = Quant<decltype(tag)::value>;
      if constexpr (kLegacyType<decltype(tag)::value>) {
        bytes =
            (grouped_bytes(k, 32, Q::kHead, Q::kBytes - Q::kHead) + 15) / 16 * 16;  // rows 16-byte aligned
      }
      return cudaSuccess;
    });
  }
  return bytes;
}

cudaError_t group_rows(const Context& ctx, const Tensor& src, void* dst, int64_t dst_nb1) {
  const int64_t n_blocks = src.ne[0] / (src.type == DType::q6_k ? 256 : 32), n_rows = src.ne[1];
  if (const cudaError_t err = cudaMemsetAsync(dst, 0, static_cast<size_t>(n_rows * dst_nb1), ctx.stream);
      err != cudaSuccess) {
    return err;
  }
  constexpr int kThreads = 256;
  const auto grid =
      static_cast<unsigned>(std::min<int64_t>((n_blocks * n_rows + kThreads - 1) / kThreads, 1 << 16));
  if (src.type == DType::f8_e4m3) {
    f8_rows_kernel<<<grid, kThreads, 0, ctx.stream>>>(static_cast<const uint8_t*>(src.data), src.nb[1],
                                                      n_blocks, n_rows, static_cast<uint8_t*>(dst), dst_nb1);
    return cudaGetLastError();
  }
  if (src.type == DType::q6_k) {
    group_q6k_rows_kernel<<<grid, kThreads, 0, ctx.stream>>>(static_cast<const uint8_t*>(src.data), src.nb[1],
                                                             n_blocks, n_rows, static_cast<uint8_t*>(dst),
                                                             dst_nb1);
    return cudaGetLastError();
  }
  return visit_weight_type(src.type, [&](auto tag) {
    using Q = Quant<decltype(tag)::value>;
    if constexpr (kLegacyType<decltype(tag)::value>) {
      group_rows_kernel<Q::kHead, Q::kBytes - Q::kHead>
          <<<grid, kThreads, 0, ctx.stream>>>(static_cast<const uint8_t*>(src.data), src.nb[1], n_blocks,
                                              n_rows, static_cast<uint8_t*>(dst), dst_nb1);
      return cudaGetLastError();
    } else {
      return cudaErrorNotSupported;
    }
  });
}

}  // namespace kiln::cuda
