// The GEMV kernel that reads its weight rows straight from global memory (gemv_kernel), and its launch by
// shape: included by the translation units that instantiate launch_gemv_rows for a few weight types each
// (gemv_*.cu, each expanding its part of the list of instances at the end), so that its many instantiations
// compile in parallel. matmul.cu calls them through the declaration in gemv.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_launch.cuh"
#include "backends/cuda/matmul/dequant.cuh"
#include "backends/cuda/matmul/dot_q8.cuh"
#include "backends/cuda/matmul/gemv.cuh"
#include "backends/cuda/mma.cuh"

namespace kiln::cuda {

inline constexpr int kGemvMaxGridY = 65535;
inline constexpr int64_t gemv_div_up(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- GEMV: dst[:, q] = W_q x[:, q] for m <= kGemvMaxCols columns q ----

// Elements 8p .. 8p+7 of an f32 row.
__device__ __forceinline__ void load_x8(const float* x, int64_t p, bool vec, float (&v)[8]) {
  if (vec) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(x) + 2 * p);
    const float4 b = __ldg(reinterpret_cast<const float4*>(x) + 2 * p + 1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = __ldg(x + 8 * p + j);
  }
}

// A block's partial dot products: acc[r][c] over the pieces t, t + kGemvThreads, ... of its kRows rows (t =
// the thread's index in the block: consecutive threads read consecutive pieces). kUnroll pieces per row are
// loaded and dequantized before their products, to keep loads in flight.
template <DType T, int A, int kCols, int kRows, int kUnroll>
__device__ __forceinline__ void gemv_partial(const uint8_t* const (&rows)[kRows],
                                             const float* const (&x)[kCols], int cols, const GemvArgs& a,
                                             float (&acc)[kRows][kCols]) {
  using Q = Quant<T>;
  const int64_t n_pieces = a.k / 8;
  for (int64_t base = threadIdx.x; base < n_pieces; base += kGemvThreads * kUnroll) {
    float wv[kUnroll][kRows][8];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t p = base + kGemvThreads * u;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (p < n_pieces) Q::template piece<A>(rows[r], p, wv[u][r]);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t p = base + kGemvThreads * u;
      if (p >= n_pieces) break;
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        if (c >= cols) break;
        float xv[8];
        load_x8(x[c], p, a.x_vec, xv);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[r][c] = fmaf(wv[u][r][j], xv[j], acc[r][c]);
        }
      }
    }
  }
  if constexpr (Q::kBlock == 1) {  // float rows whose length is not a multiple of 8
    for (int64_t e = n_pieces * 8 + threadIdx.x; e < a.k; e += kGemvThreads) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float wr = Q::element(rows[r], e);
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          if (c < cols) acc[r][c] = fmaf(wr, __ldg(x[c] + e), acc[r][c]);
        }
      }
    }
  }
}

// gemv_partial on the integer path: x rounded to 8 bits, units of kUnit elements (Q8<T>, or Q8G<T> for rows
// in grouped form: matmul/dot_q8.cuh).
template <DType T, int A, int kCols, int kRows, int kUnroll>
__device__ __forceinline__ void gemv_q8_partial(const uint8_t* const (&rows)[kRows], const XRow (&x)[kCols],
                                                int cols, const GemvArgs& a, float (&acc)[kRows][kCols]) {
  using Q = Q8At<T, A>;
  const int64_t n_units = a.k / Q::kUnit;
  for (int64_t base = threadIdx.x; base < n_units; base += kGemvThreads * kUnroll) {
    typename Q::W w[kUnroll][kRows];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t p = base + kGemvThreads * u;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (p < n_units) w[u][r] = Q::template load<A>(rows[r], p);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t p = base + kGemvThreads * u;
      if (p >= n_units) break;
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        if (c >= cols) break;
        const typename Q::X xv = Q::load_x(p, x[c]);
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[r][c] = __fadd_rn(acc[r][c], Q::dot(w[u][r], xv));
      }
    }
  }
}

// ---- FP8 rows on the tensor cores: 1 to 8 columns, 16 rows a block (fp8_mma_gemv) ----

// Whether a GEMV launch of T weights with kRows rows a block and kCols columns takes fp8_mma_sums: FP8 in
// row form, 16 rows, one column or up to 8 (B's columns).
template <DType T, int A, int kCols, int kRows>
inline constexpr bool kFp8Mma = T == DType::f8_e4m3 && (A & kGrouped) != 0 && kRows == 16 &&
                                (kCols == 1 || kCols == 8);
inline constexpr int kFp8MmaChunk = 64;  // bytes of k a warp's step takes from each of its 16 rows
inline constexpr int kFp8MmaUnroll = 4;  // steps a warp keeps in flight
// The fewest tokens that take it. Measured on an H100 (matmul_bench --types f8_e4m3, us, CUDA cores against
// tensor cores; the 8B's weights, k x rows): one token 43.9 / 57.7 on 4096 x 28672 and 23.5 / 48.4 on
// 14336 x 4096 (the CUDA-core GEMV streams at 99% and 93% of the copy bandwidth there); 4 tokens 96.4 / 60.8
// and 53.7 / 57.5; 8 tokens 140.6 / 69.9 and 83.6 / 63.2, 23.4 / 17.6 on 4096 x 4096, 33.6 / 21.3 on
// 4096 x 6144. The CUDA cores' FMAs grow with the tokens, the tensor cores' cost barely does.
inline constexpr int kFp8MmaMinCols = 5;
inline constexpr float kFp8MmaXScale = 1.0f / 16.0f;  // x's factor before f16 (see fp8_mma_sums)

// Two e4m3 codes (the low 16 bits of `pair`) as an f16 pair, exactly (f16 holds every e4m3 value).
__device__ __forceinline__ uint32_t e4m3x2_to_half2(uint32_t pair) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xFFFF), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | static_cast<uint32_t>(h.y) << 16;
}

// A block's 16 FP8 rows in row form (codes at ra / rb: row g and row g + 8 of lane l, g = l / 4) times `cols`
// f32 columns (1 to 8; lane l's, x_g, at xg), on m16n8k16 products: the A operand the rows' codes converted
// to f16 pairs (the card's e4m3x2 conversion, one instruction for two weights), the B operand x in f16,
// column c token c (columns past `cols` zero), so that 8 tokens cost what one does, where the CUDA-core
// GEMV's FMAs grow with the tokens (kFp8MmaMinCols). A warp's step is 64 bytes of k: lane (g, t) reads the
// 16 bytes at 16t of rows g and g + 8, and its four products take them word by word, word q's bytes 0-1 as
// A's columns 2t, 2t + 1 and bytes 2-3 as 2t + 8, 2t + 9 (any order of k serves, x read in the same order). x
// is scaled by 2^-4 before its rounding to f16 (and the sums back), so that values up to 2^20 stay finite
// (f16 alone ends at 65504); below 2^-10 its f16 is subnormal, off by at most 2^-21 (absolute), against the
// 2^-4 relative steps of the weights. The warps take the steps in turn (warp w: w, w + 4, ...); each warp's
// sums, times the rows' scales, go to red[warp] (the C fragment: rows g and g + 8, columns 2t and 2t + 1;
// with one column the lanes of t = 0 alone). A token's sums do not depend on the other columns. The fast
// precision only: x's rounding to f16 is an approximation the exact GEMV does not make.
template <int kRows, int kCols>
__device__ __forceinline__ void fp8_mma_sums(const uint8_t* ra, const uint8_t* rb, const float* xg, int cols,
                                             int64_t k, float (&red)[kGemvThreads / 32][kRows][kCols]) {
  static_assert(kRows == 16 && (kCols == 1 || kCols == 8), "an m16n8 product's rows and columns");
  constexpr int kWarps = kGemvThreads / 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const bool has_x = g < cols;  // B's column g
  const int64_t steps = k / kFp8MmaChunk;
  float c[4] = {};
  for (int64_t s0 = warp; s0 < steps; s0 += kWarps * kFp8MmaUnroll) {
    uint4 wa[kFp8MmaUnroll], wb[kFp8MmaUnroll];
#pragma unroll
    for (int u = 0; u < kFp8MmaUnroll; ++u) {
      const int64_t at = (s0 + int64_t{u} * kWarps) * kFp8MmaChunk + 16 * t;
      if (s0 + u * kWarps < steps) {
        wa[u] = ld_u128<16>(ra + at);
        wb[u] = ld_u128<16>(rb + at);
      }
    }
#pragma unroll
    for (int u = 0; u < kFp8MmaUnroll; ++u) {
      const int64_t at = (s0 + int64_t{u} * kWarps) * kFp8MmaChunk + 16 * t;
      if (s0 + u * kWarps >= steps) break;
      float4 xv[4] = {};
      if (has_x) {
#pragma unroll
        for (int q = 0; q < 4; ++q) xv[q] = __ldg(reinterpret_cast<const float4*>(xg + at) + q);
      }
      const uint32_t a[4] = {wa[u].x, wa[u].y, wa[u].z, wa[u].w}, b[4] = {wb[u].x, wb[u].y, wb[u].z, wb[u].w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint32_t frag[4] = {e4m3x2_to_half2(a[q]), e4m3x2_to_half2(b[q]), e4m3x2_to_half2(a[q] >> 16),
                                  e4m3x2_to_half2(b[q] >> 16)};
        mma_f16(c, frag, pack_half2(xv[q].x * kFp8MmaXScale, xv[q].y * kFp8MmaXScale),
                pack_half2(xv[q].z * kFp8MmaXScale, xv[q].w * kFp8MmaXScale));
      }
    }
  }
  // The rows' scales: 4 bytes before the codes (dequant.cuh's row form).
  const float da = __uint_as_float(ld_u32<4>(ra - 4)), db = __uint_as_float(ld_u32<4>(rb - 4));
  if constexpr (kCols == 1) {
    if (t == 0) {
      red[warp][g][0] = c[0] * (1.0f / kFp8MmaXScale) * da;
      red[warp][g + 8][0] = c[2] * (1.0f / kFp8MmaXScale) * db;
    }
  } else {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      red[warp][g][2 * t + i] = c[i] * (1.0f / kFp8MmaXScale) * da;
      red[warp][g + 8][2 * t + i] = c[2 + i] * (1.0f / kFp8MmaXScale) * db;
    }
  }
}

// Block: kRows consecutive weight rows, its kGemvThreads threads splitting k (split-k inside the block: many
// small blocks fill the device evenly, with no tail of a last partial wave); the threads' sums meet through
// warp shuffles and shared memory, in a fixed order. Grid: (row blocks x col_split, column groups /
// col_split). A is the alignment every block of the weight starts at (Quant<T>::kAlign or kSafeAlign). kQ8:
// the integer path (a.xq, a.xds), else f32 x. A with kGrouped: rows in grouped form
// (matmul/dequant.cuh's legacy_block), 16-byte aligned. kPair (kRows >= 2, a.pair.on): the block's rows are
// kRows / 2 rows of the first matrix from row0 and the same rows of the second (GemvPair). kRope (kRopeFloat
// or kRopeQ8, by the pools; kRows even, a.rope.on): Q, K and V with RoPE and the KV write (GemvRope), the
// frequencies in `freqs`.
template <DType T, int A, int kCols, int kRows, int kUnroll, bool kQ8, bool kPair = false,
          int kRope = kNoRope>
__global__ void __launch_bounds__(kGemvThreads) gemv_kernel(GemvArgs a, RopeArg<kRope> freqs) {
  static_assert(!kPair || kRows >= 2, "a paired block holds a row of each matrix at least");
  static_assert(kRope == kNoRope || (!kPair && kRows % 2 == 0), "a rotating block holds whole pairs of rows");
  __shared__ float red[kGemvThreads / 32][kRows][kCols];
  constexpr int kHalf = kPair ? kRows / 2 : 1;
  constexpr bool paired = kPair;
  unsigned block = blockIdx.x / a.col_split;
  int part_index = 0;
  const GemvPart part = paired ? GemvPart{a.w, a.w_nb1, a.n, a.dst} : gemv_part(a, block, part_index);
  const int64_t row0 = static_cast<int64_t>(block) * (paired ? kHalf : kRows);
  // Row r of the block: its matrix's row (clamped to the last, so that loads stay in bounds) and whether it
  // is a row of that matrix (scalars chosen one by one: a reference to either part would put them in local
  // memory).
  const auto row_of = [&](int r, bool& real) {
    const bool second = paired && r >= kHalf;
    const uint8_t* w = second ? a.more[0].w : part.w;
    const int64_t nb1 = second ? a.more[0].w_nb1 : part.w_nb1, n = second ? a.more[0].n : part.n;
    const int64_t i = row0 + (paired ? r % kHalf : r);
    real = i < n;
    return w + min(i, n - 1) * nb1;
  };
  // The first 2 KiB of each weight row (what the first pass of the threads reads) head for L2 before the wait
  // for the kernel before (pdl_wait): weights are constant, and under programmatic launch that kernel's tail
  // hides their latency. Expert weights wait for their ids.
  if (a.prefetch && !a.use_ids) {
    const int64_t row_bytes = a.k / Quant<T>::kBlock * Quant<T>::kBytes;
    const int lines = static_cast<int>((min(row_bytes, int64_t{2048}) + 127) / 128);
    for (int i = threadIdx.x; i < kRows * lines; i += kGemvThreads) {
      bool real = false;
      const uint8_t* row = row_of(i / lines, real);
      if (real) prefetch_l2(row + (i % lines) * 128);
    }
  }
  const int64_t g_first = static_cast<int64_t>(blockIdx.y) * a.col_split + blockIdx.x % a.col_split;
  RopeAt rope_at{part_index + a.rope.first_part};
  if constexpr (kRope != kNoRope) {
    if (threadIdx.x < 32 && g_first < a.n_groups) {
      const int64_t q0 = g_first * a.m;
      rope_at =
          gemv_rope_ahead<kRows, kCols>(a, freqs, part_index, row0, part.n, q0,
                                        static_cast<int>(min(static_cast<int64_t>(a.m), a.n_cols - q0)));
    }
  }
  pdl_wait();
  if (a.early_trigger) pdl_trigger();
  bool ahead =
      blockIdx.y == 0;  // the first row of blocks sends the next weights toward L2, once (exact GEMV)
  const int64_t g_step = static_cast<int64_t>(gridDim.y) * a.col_split;
  for (int64_t g = g_first; g < a.n_groups; g += g_step) {
    const int64_t q0 = g * a.m;
    const int cols = static_cast<int>(min(static_cast<int64_t>(a.m), a.n_cols - q0));
    const int64_t expert = a.use_ids ? a.ids[q0] * a.w_nb2 : 0;  // MoE: never paired
    const uint8_t* rows[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      bool real = false;
      rows[r] = row_of(r, real) + expert;
    }
    float acc[kRows][kCols] = {};
    if constexpr (kQ8) {
      XRow x[kCols];
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const int64_t i = divmod(q0 + min(c, cols - 1), a.x_div).q;
        x[c] = {a.xq + i * (a.k / 4), a.xds + i * (a.k / 32)};
      }
      gemv_q8_partial<T, A, kCols, kRows, kUnroll>(rows, x, cols, a, acc);
    } else if constexpr (kFp8Mma<T, A, kCols, kRows>) {
      bool real = false;
      const int g = static_cast<int>(threadIdx.x % 32) / 4;
      const auto* xg = reinterpret_cast<const float*>(a.x.row(divmod(q0 + min(g, cols - 1), a.x_div).q));
      fp8_mma_sums<kRows, kCols>(row_of(g, real) + expert + 16, row_of(g + 8, real) + expert + 16, xg, cols,
                                 a.k, red);
    } else {
      const float* x[kCols];
#pragma unroll
      for (int c = 0; c < kCols; ++c)
        x[c] = reinterpret_cast<const float*>(a.x.row(divmod(q0 + min(c, cols - 1), a.x_div).q));
      gemv_partial<T, A, kCols, kRows, kUnroll>(rows, x, cols, a, acc);
    }
    pdl_trigger();  // the weights are read: the next kernel may be scheduled
    if constexpr (!kQ8) {
      if (ahead) prefetch_ahead(a.ahead, blockIdx.x, gridDim.x), ahead = false;
    }
    if constexpr (kFp8Mma<T, A, kCols, kRows>) {
      gemv_store_sums<kRows, kCols, kPair, kRope>(red, part, a.dst_type, row0, q0, cols, a.pair, a.more[0],
                                                  a.rope, freqs, rope_at);
    } else {
      gemv_store<kRows, kCols, kPair, kRope>(acc, red, part, a.dst_type, row0, q0, cols, a.pair, a.more[0],
                                             a.rope, freqs, rope_at);
    }
    rope_at.ready = false;  // made for the first column group only
    __syncthreads();        // red is reused by the next column group
  }
}

// Under programmatic launch, when a GEMV lets the next kernel be scheduled: after its blocks' main loops, or
// right after their wait. Early for the persistent staged kernel, whose blocks all start at once, so that the
// next kernel's launch overlaps the whole GEMV, and for one token's rows of at most kEarlyTriggerMaxK
// elements, whose blocks' passes are short (with 4 tokens, early measured 2.5% slower on the 135M). Measured
// on the H200 (`kiln bench -p 0 -n 128`, two rounds, tokens/s, this rule against the trigger after the main
// loops always): the 8B's Q4_0 394-395 -> 406, the 135M-shaped BF16 model's 1,024 -> 1,047-1,049; early for
// every GEMV, the 8B's BF16 (rows of 4096 and 14336) measured 206.0 -> 204.7-205.2.
constexpr int64_t kEarlyTriggerMaxK = 2048;
inline bool gemv_early_trigger(const Context& ctx, int64_t k, int64_t cols, bool staged) {
  return ctx.pdl && (staged || (k <= kEarlyTriggerMaxK && cols == 1));
}

template <DType T, bool kQ8, int kCols, int kRows, int kUnroll, bool kPair = false>
void launch_gemv_shape(const Context& ctx, GemvArgs a, Access access, const RopeFreqs* rope) {
  a.early_trigger = gemv_early_trigger(ctx, a.k, a.n_cols, kQ8 && kStagedType<T> && a.staged);
  int64_t blocks = gemv_div_up(a.n, kRows);
  a.part_start[0] = 0;
  for (int i = 1; i < a.n_parts; ++i) {
    a.part_start[i] = static_cast<unsigned>(blocks);
    blocks += gemv_div_up(a.more[i - 1].n, kRows);
  }
  const dim3 grid(
      static_cast<unsigned>(blocks * a.col_split),
      static_cast<unsigned>(std::min<int64_t>(gemv_div_up(a.n_groups, a.col_split), kGemvMaxGridY)));
  if constexpr (kPair) {  // each block: rows of both; float weights at their natural alignment, FP8 ones in
                          // row form (gemv_pairs)
    const dim3 pair_grid(static_cast<unsigned>(gemv_div_up(a.n, kRows / 2) * a.col_split), grid.y);
    if constexpr (kGroupedType<T>) {
      if (access == Access::grouped) {
        (void)launch_kernel(ctx, gemv_kernel<T, 16 | kGrouped, kCols, kRows, kUnroll, false, true>, pair_grid,
                            kGemvThreads, 0, a, NoRope{});
        return;
      }
    }
    if constexpr (kRows != 16) {
      (void)launch_kernel(ctx, gemv_kernel<T, Quant<T>::kAlign, kCols, kRows, kUnroll, false, true>,
                          pair_grid, kGemvThreads, 0, a, NoRope{});
    }
    return;
  }
  if constexpr (kQ8 && kStagedType<T>) {
    if (a.staged) return launch_gemv_staged<T, kCols, kRows>(ctx, a, blocks, rope);
  }
  // Rotating (a.rope.on): the exact GEMV at the natural alignment (or FP8 rows in row form) or the integer
  // one in grouped form, of rows a block in pairs (launch_gemv_rows; matmul/matmul.cu's launch_gemv chose the
  // path).
  constexpr bool kMayRope = kRopeGemv<T, kQ8> && kRows % 2 == 0;
  if constexpr (kGroupedType<T>) {
    if (access == Access::grouped) {
      if constexpr (kMayRope) {
        if (a.rope.on && a.rope.q8_block != 0) {
          (void)launch_kernel(ctx, gemv_kernel<T, 16 | kGrouped, kCols, kRows, kUnroll, kQ8, false, kRopeQ8>,
                              grid, kGemvThreads, 0, a, *rope);
          return;
        }
        if (a.rope.on) {
          (void)launch_kernel(ctx,
                              gemv_kernel<T, 16 | kGrouped, kCols, kRows, kUnroll, kQ8, false, kRopeFloat>,
                              grid, kGemvThreads, 0, a, *rope);
          return;
        }
      }
      (void)launch_kernel(ctx, gemv_kernel<T, 16 | kGrouped, kCols, kRows, kUnroll, kQ8>, grid, kGemvThreads,
                          0, a, NoRope{});
      return;
    }
  }
  if constexpr (kRows != 16) {  // FP8 rows on the tensor cores: row form alone (fp8_mma_gemv)
    if (access == Access::natural) {
      if constexpr (kMayRope && !kQ8) {
        if (a.rope.on && a.rope.q8_block != 0) {
          (void)launch_kernel(ctx,
                              gemv_kernel<T, Quant<T>::kAlign, kCols, kRows, kUnroll, kQ8, false, kRopeQ8>,
                              grid, kGemvThreads, 0, a, *rope);
          return;
        }
        if (a.rope.on) {
          (void)launch_kernel(ctx,
                              gemv_kernel<T, Quant<T>::kAlign, kCols, kRows, kUnroll, kQ8, false, kRopeFloat>,
                              grid, kGemvThreads, 0, a, *rope);
          return;
        }
      }
      (void)launch_kernel(ctx, gemv_kernel<T, Quant<T>::kAlign, kCols, kRows, kUnroll, kQ8>, grid,
                          kGemvThreads, 0, a, NoRope{});
    } else {
      (void)launch_kernel(ctx, gemv_kernel<T, Quant<T>::kSafeAlign, kCols, kRows, kUnroll, kQ8>, grid,
                          kGemvThreads, 0, a, NoRope{});
    }
  }
}

// Whether a GEMV of FP8 rows takes the tensor cores (fp8_mma_sums): the fast precision (x rounded to f16),
// not batch-invariant (which keeps one kernel for every m, the exact GEMV), rows in row form, 1 to 8 columns
// in one group, no expert ids, k a multiple of kFp8MmaChunk and x 16-byte aligned, on sm_90 and newer, where
// it is measured (the e4m3 conversion is in hardware from sm_89, which keeps the CUDA-core GEMV).
inline bool fp8_mma_gemv(const Context& ctx, const GemvArgs& a, Access access) {
  return ctx.fast && !ctx.options.batch_invariant && ctx.clusters && access == Access::grouped &&
         a.n_groups == 1 && !a.use_ids && a.k % kFp8MmaChunk == 0 && a.x_vec;
}

// Rows a block: more rows make fewer, larger blocks, and each x value loaded from L1 serves them all (x is
// f32: with one row its traffic is twice the weight's); fewer keep the device evenly busy on short matrices.
// The pieces a thread keeps in flight shrink as rows grow (the registers they take). m > 1: four rows, and
// four or eight columns.
template <DType T, bool kQ8, bool kPair>
void launch_gemv_rows(const Context& ctx, const GemvArgs& a, Access access, const RopeFreqs* rope) {
  const int forced = ctx.options.gemv_rows;  // tests and tuning (bench/matmul_bench --gemv-rows)
  // FP8 rows on the tensor cores from kFp8MmaMinCols tokens, or for any under gemv_rows 16 (tests).
  if constexpr (T == DType::f8_e4m3 && !kQ8) {
    if ((forced == 16 || (forced == 0 && a.m >= kFp8MmaMinCols)) && fp8_mma_gemv(ctx, a, access)) {
      if (a.m > 1) return launch_gemv_shape<T, kQ8, kGemvMaxCols, 16, 1, kPair>(ctx, a, access, rope);
      return launch_gemv_shape<T, kQ8, 1, 16, 1, kPair>(ctx, a, access, rope);
    }
  }
  if (a.m > 4) return launch_gemv_shape<T, kQ8, kGemvMaxCols, 4, 1, kPair>(ctx, a, access, rope);
  if (a.m > 1) return launch_gemv_shape<T, kQ8, 4, 4, 1, kPair>(ctx, a, access, rope);
  // Measured on an H100 (scripts/gpu-check.sh tune): eight rows from 4096 up (84% of the copy bandwidth on
  // the 8B's gate/up/down in bf16, 67% on 4096 x 4096); two on the short k/v projections (1024 rows), where
  // eight leave too few blocks. On the exact path, rows of at most kShortK elements (a small model's: 576 and
  // 1536 in the 135M) take eight whatever their count: a block's pass over them is short, so each launch is
  // bound by its blocks' fixed costs (the wait, the sums across warps, the stores), which eight rows share.
  // On the H200 (`kiln bench -p 0 -n 128`, two rounds, against rows by their count alone) the 135M-shaped
  // BF16 model's decode went from 1,064-1,066 to 1,175-1,180 tokens/s.
  constexpr int64_t kShortK = 2048;
  int64_t n = a.n;  // all the rows of the launch
  for (int i = 1; i < a.n_parts; ++i) n += a.more[i - 1].n;
  const bool short_rows = !kQ8 && a.k <= kShortK;
  const int rows = forced != 0 && forced != 16 ? forced : n >= 4096 || short_rows ? 8 : n >= 1024 ? 2 : 1;
  switch (rows) {
    case 8: return launch_gemv_shape<T, kQ8, 1, 8, 1, kPair>(ctx, a, access, rope);
    case 4: return launch_gemv_shape<T, kQ8, 1, 4, 2, kPair>(ctx, a, access, rope);
    case 1:
      if constexpr (!kPair) {
        if (!a.rope.on) return launch_gemv_shape<T, kQ8, 1, 1, 4>(ctx, a, access, rope);
      }
      [[fallthrough]];  // a gate row and an up row, or the two rows of a rotated pair, at least
    default: return launch_gemv_shape<T, kQ8, 1, 2, 4, kPair>(ctx, a, access, rope);
  }
}

// The GEMV instances: launch_gemv_rows for each weight type, the exact GEMV always, the integer one
// (integer = 1: the types of KILN_CUDA_Q8_TYPES) and the paired gate/up one (paired = 1: the float types and
// FP8) where the type has them. One list, in five parts, each expanded by its own translation unit
// (gemv_float.cu, gemv_kquant.cu, gemv_q4.cu, gemv_q5q8.cu, gemv_iquant.cu) so that the instances compile in
// parallel: X(type, integer, paired).
#define KILN_GEMV_FLOAT_TYPES(X) X(f32, 0, 1) X(f16, 0, 1) X(bf16, 0, 1)
#define KILN_GEMV_KQUANT_TYPES(X) X(q2_k, 0, 0) X(q3_k, 0, 0) X(q4_k, 1, 0) X(q5_k, 1, 0) X(q6_k, 1, 0)
#define KILN_GEMV_Q4_TYPES(X) X(q4_0, 1, 0) X(q4_1, 1, 0) X(q5_0, 1, 0)
#define KILN_GEMV_Q5Q8_TYPES(X) \
  X(q5_1, 1, 0) X(q8_0, 1, 0) X(iq4_nl, 0, 0) X(iq4_xs, 0, 0) X(mxfp4, 0, 0) X(f8_e4m3, 0, 1)
#define KILN_GEMV_IQUANT_TYPES(X) \
  X(iq2_xxs, 0, 0)                \
  X(iq2_xs, 0, 0) X(iq2_s, 0, 0) X(iq3_xxs, 0, 0) X(iq3_s, 0, 0) X(iq1_s, 0, 0) X(iq1_m, 0, 0)

#define KILN_GEMV_IF_0(...)
#define KILN_GEMV_IF_1(...) __VA_ARGS__
#define KILN_GEMV_IF(c, ...) KILN_GEMV_IF_##c(__VA_ARGS__)
#define KILN_GEMV_INSTANTIATE(T, kQ8, kPair)                                                    \
  template void launch_gemv_rows<DType::T, kQ8, kPair>(const Context&, const GemvArgs&, Access, \
                                                       const RopeFreqs*);
// The instances of one entry of the list.
#define KILN_GEMV_INSTANCES(T, integer, paired)                \
  KILN_GEMV_INSTANTIATE(T, false, false)                       \
  KILN_GEMV_IF(integer, KILN_GEMV_INSTANTIATE(T, true, false)) \
  KILN_GEMV_IF(paired, KILN_GEMV_INSTANTIATE(T, false, true))

}  // namespace kiln::cuda
