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
    gemv_store<kRows, kCols, kPair, kRope>(acc, red, part, a.dst_type, row0, q0, cols, a.pair, a.more[0],
                                           a.rope, freqs, rope_at);
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
    (void)launch_kernel(ctx, gemv_kernel<T, Quant<T>::kAlign, kCols, kRows, kUnroll, false, true>, pair_grid,
                        kGemvThreads, 0, a, NoRope{});
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
  if (access == Access::natural) {
    if constexpr (kMayRope && !kQ8) {
      if (a.rope.on && a.rope.q8_block != 0) {
        (void)launch_kernel(ctx, gemv_kernel<T, Quant<T>::kAlign, kCols, kRows, kUnroll, kQ8, false, kRopeQ8>,
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
    (void)launch_kernel(ctx, gemv_kernel<T, Quant<T>::kAlign, kCols, kRows, kUnroll, kQ8>, grid, kGemvThreads,
                        0, a, NoRope{});
  } else {
    (void)launch_kernel(ctx, gemv_kernel<T, Quant<T>::kSafeAlign, kCols, kRows, kUnroll, kQ8>, grid,
                        kGemvThreads, 0, a, NoRope{});
  }
}

// Rows a block: more rows make fewer, larger blocks, and each x value loaded from L1 serves them all (x is
// f32: with one row its traffic is twice the weight's); fewer keep the device evenly busy on short matrices.
// The pieces a thread keeps in flight shrink as rows grow (the registers they take). m > 1: four rows, and
// four or eight columns.
template <DType T, bool kQ8, bool kPair>
void launch_gemv_rows(const Context& ctx, const GemvArgs& a, Access access, const RopeFreqs* rope) {
  if (a.m > 4) return launch_gemv_shape<T, kQ8, kGemvMaxCols, 4, 1, kPair>(ctx, a, access, rope);
  if (a.m > 1) return launch_gemv_shape<T, kQ8, 4, 4, 1, kPair>(ctx, a, access, rope);
  const int forced = ctx.options.gemv_rows;  // tests and tuning (bench/matmul_bench --gemv-rows)
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
  const int rows = forced != 0 ? forced : n >= 4096 || short_rows ? 8 : n >= 1024 ? 2 : 1;
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
