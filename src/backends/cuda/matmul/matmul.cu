// Matmul on CUDA: the entry point (matmul), the GEMV paths, and the fused groups that end in a GEMV
// (matmul_gemm.cu: the GEMM path through cuBLAS, GetRows, and the fused groups that end in a GEMM).
// Contracts: ops/ops.h; dequantization: dequant.cuh; integer dot products: dot_q8.cuh.
//
// Which kernel a Matmul takes, by its weight type, the backend's precision (fast: yes) and m = x.n_rows()
// (takes_gemv, takes_q8, mmq_batch; the same for each matmul of a fused group):
//
// | weight type                  | fast       | m       | kernel                                           |
// |------------------------------|------------|---------|--------------------------------------------------|
// | any                          | no         | 1-8     | exact GEMV (gemv_kernel.cuh)                     |
// | any                          | no         | > 8     | weight dequantized to f32, cublasSgemm           |
// | Q4_K, Q5_K, Q6_K             | yes        | 1-4     | integer GEMV, staged (gemv_staged.cu) where the  |
// |                              |            |         | rows allow                                       |
// | Q4_K, Q5_K, Q6_K             | yes        | 5-64    | integer tensor-core kernel (mmq.cu) where the    |
// |                              |            |         | rows fit; else the integer GEMV up to 16         |
// | Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 | yes        | 1-16    | integer GEMV (staged: rows in grouped form, m 1) |
// | other types                  | yes        | 1-8     | exact GEMV                                       |
// | f8_e4m3 in row form, k a     | yes        | 5-8     | on sm_90 f16 tensor cores, x rounded to f16      |
// | multiple of 64 (not b.-inv.) |            |         | (gemv_kernel.cuh's fp8_mma_sums)                 |
// | f8_e4m3, n and k multiples  | yes        | 9-64    | x rounded per token to e4m3; on Hopper the       |
// | of 16 (not batch-invariant)  |            |         | warpgroup kernel split over k (fp8_wgmma.cu)     |
// |                              | yes        | beyond  | cuBLASLt e4m3 GEMM (fp8_gemm.cu), both scale     |
// |                              |            |         | vectors on the accumulators (also 9-64 elsewhere)|
// | bf16                         | yes        | beyond  | cublasGemmEx, bf16 weight and x, f32 accumulate  |
// | f32                          | yes        | beyond  | cublasGemmEx in TF32                             |
// | f16, block types             | yes        | beyond  | cublasGemmEx in f16 (the weight dequantized into |
// |                              |            |         | scratch), x saturated to f16's range             |
//
// Why: a decode step's matmul (few rows of x) is bound by the weight's bytes, which the GEMV streams once,
// dequantizing in registers, for all its columns (kGemvMaxCols a block, column groups side by side up to
// kQ8MaxCols on the integer path, so that a weight row is read from memory once). At the fast precision x is
// rounded to 8 bits per block of 32 and the products are integer dot products (__dp4a), which cost fewer
// instructions than dequantizing to f32. From CudaOptions::mmq_min_cols rows (kMmqMinCols, measured there)
// the int8 tensor cores beat the integer GEMV on K-quant batches (kMmqMaxCols at most); beyond the GEMVs'
// ranges a matmul is bound by arithmetic and cuBLAS takes it, on tensor cores at the fast precision. At
// the exact precision every path is exact: the products of the exactly dequantized weight and f32 x. Every
// path computes f32 and rounds once to an f16 / bf16 destination. MoeMatmul is a GEMV of one column per
// (token, expert slot), on the integer path at the fast precision when the type has one.
//
// Under CudaOptions::batch_invariant the kernel depends on the weight type, the precision and the weight's
// layout, never on m: a row's product must not depend on the rows beside it, and every GEMV and the
// tensor-core kernel sum a row's products in an order fixed by the weight's shape alone (gemv_kernel.cuh,
// gemv_staged.cu: a thread's units, then the threads' sums in a fixed tree, whatever the rows a block and
// the columns; mmq.cu: k split from the shape, each token's tile apart), while cuBLAS picks its algorithm by
// m. So: K-quants at the fast precision take the tensor-core kernel for every m where the rows fit (column
// tiles of 8 tokens, the last padded), the other types with an integer path the integer GEMV for every m
// (column groups of kGemvMaxCols), and everything else the exact GEMV for every m.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_launch.cuh"
#include "backends/cuda/cuda_round_q8.cuh"
#include "backends/cuda/matmul/dequant.cuh"
#include "backends/cuda/matmul/dot_q8.cuh"
#include "backends/cuda/matmul/gemv.cuh"
#include "backends/cuda/matmul/matmul.cuh"
#include "backends/cuda/matmul/mmq.cuh"

namespace kiln::cuda {

namespace {

template <class F>
cudaError_t visit_q8_type(DType t, F&& f) {
  switch (t) {
    KILN_CUDA_Q8_TYPES(KILN_CUDA_TYPE_CASE)
    default: return cudaErrorNotSupported;
  }
}

bool q8_type(DType t) {
  return visit_q8_type(t, [](auto) { return cudaSuccess; }) == cudaSuccess;
}

// The f32 rows of x (k a multiple of 32) rounded to 8 bits per block of 32 (matmul/dot_q8.cuh): one warp a
// block. A block holding a NaN gets a NaN scale, so that the products stay NaN as on the exact path.
__global__ void quantize_x_kernel(Rows x, int64_t k, int64_t n_rows, int* xq, float2* xds) {
  pdl_begin();
  const int lane = threadIdx.x % 32;
  const int64_t per_row = k / 32, total = n_rows * per_row;
  const int64_t step = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; i < total;
       i += step) {
    const DivMod rb = divmod(i, per_row);
    const int64_t r = rb.q, b = rb.r;
    const float v = reinterpret_cast<const float*>(x.row(r))[32 * b + lane];
    round_q8(v, reinterpret_cast<int8_t*>(xq + r * (k / 4)) + 32 * b + lane, xds + i);
  }
}

// Rounds the rows of x to 8 bits into scratch for the integer GEMV, and points a.xq / a.xds there.
cudaError_t quantize_x(const Context& ctx, const Tensor& x, GemvArgs& a) {
  const int64_t k = x.ne[0], n_rows = x.n_rows();
  const size_t q_bytes = static_cast<size_t>(n_rows * k);  // a multiple of 32: the scales stay aligned
  auto* out =
      static_cast<uint8_t*>(ctx.scratch(kSlotX, q_bytes + static_cast<size_t>(n_rows * (k / 32)) * 8));
  if (out == nullptr) return cudaErrorMemoryAllocation;
  a.xq = reinterpret_cast<const int*>(out);
  a.xds = reinterpret_cast<const float2*>(out + q_bytes);
  constexpr int kThreads = 256;
  const auto grid =
      static_cast<unsigned>(std::min<int64_t>(ceil_div(n_rows * (k / 32), kThreads / 32), 65535));
  return launch_kernel(ctx, quantize_x_kernel, grid, kThreads, 0, rows_of(x), k, n_rows,
                       reinterpret_cast<int*>(out), reinterpret_cast<float2*>(out + q_bytes));
}

// Whether a batch of m x rows on the integer path takes the tensor-core kernel (matmul/mmq.cu) for this type.
// Batch-invariant: every m, so that a token's product is the kernel's whatever its batch.
bool mmq_batch(const Context& ctx, DType type, int64_t m) {
  return ctx.options.mmq && mmq_type(type) &&
         (ctx.options.batch_invariant || (m >= ctx.options.mmq_min_cols && m <= kMmqMaxCols));
}

// The parts of an integer-path GEMV through the tensor-core kernel, when its type, batch and weight rows
// allow (a part at a time, on the one rounding of x); false when they do not.
bool launch_mmq(const Context& ctx, const GemvArgs& a, DType type, bool grouped, cudaError_t& err) {
  if (a.use_ids || a.x_div != 1 || !mmq_batch(ctx, type, a.n_cols)) return false;
  GemvPart parts[kGemvMaxParts] = {{a.w, a.w_nb1, a.n, a.dst}};
  for (int i = 1; i < a.n_parts; ++i) parts[i] = a.more[i - 1];
  for (int i = 0; i < a.n_parts; ++i) {
    if (!mmq_rows_fit(type, parts[i].w, parts[i].w_nb1, a.k, grouped)) return false;
  }
  MmqArgs m{a.w, a.w_nb1, a.n, a.k, a.n_cols, a.xq, a.xds, a.dst, a.dst_type, grouped};
  err = mmq_tile_x(ctx, m, kSlotW);  // the weights are used in place: their slot is free
  for (int i = 0; i < a.n_parts && err == cudaSuccess; ++i) {
    m.w = parts[i].w, m.w_nb1 = parts[i].w_nb1, m.n = parts[i].n, m.dst = parts[i].dst;
    err = mmq(ctx, m, type);
  }
  return true;
}

// q8: on the integer path (x rounded to 8 bits by quantize_x() first); else exact, in f32. grouped: the
// weight's rows (every part's) are in grouped form. rope (a.rope set but for `on`): the frequencies of Q, K
// and V's RoPE, which the GEMV applies with the KV write where its path allows (kRopeGemv: the exact GEMV at
// the natural alignment, the integer one staged or in grouped form), saying so in *roped.
// probe: nothing launched, *roped alone set (the tensor-core kernel's batches excluded: see launch_mmq).
cudaError_t launch_gemv(const Context& ctx, GemvArgs a, const Tensor& w, bool q8, bool grouped,
                        const RopeFreqs* rope = nullptr, bool* roped = nullptr, bool probe = false) {
  a.prefetch = ctx.pdl;
  // The exact GEMV sends the next matmuls' weights toward L2; the integer one does not (the 135M-shaped
  // model in Q8_0 measured no gain, and 4 requests about 1% less: docs/cuda.md).
  a.ahead = q8 ? L2Ahead{} : ctx.ahead;
  a.rope.on = false;
  if (roped != nullptr) *roped = false;
  if (cudaError_t err = cudaSuccess; !probe && q8 && launch_mmq(ctx, a, w.type, grouped, err)) return err;
  const bool may_rope = rope != nullptr;
  auto launch = [&](auto tag, auto q8_tag) {
    constexpr DType T = decltype(tag)::value;
    constexpr bool kQ8 = decltype(q8_tag)::value;
    const auto rotate = [&](bool path_ok) {
      a.rope.on = may_rope && kRopeGemv<T, kQ8> && path_ok;
      if (roped != nullptr) *roped = a.rope.on;
    };
    if (grouped) {
      if (!kGroupedType<T>) return cudaErrorNotSupported;
      // Grouped rows are whole 16-byte chunks; the staged GEMV needs them to start 16-byte aligned, and takes
      // the legacy types' for one column of x only: measured on an H100 (docs/cuda.md), the 8B's Q4_0 decode
      // gains 3-4% that way while 4 requests lose 5% and Q8_0 neither gains nor loses. Q6_K's it takes for
      // any columns, as the other K-quants' in the file's form.
      bool rows16 = aligned(w.data, 16) && a.w_nb1 % 16 == 0 && (!a.use_ids || a.w_nb2 % 16 == 0);
      for (int i = 1; i < a.n_parts; ++i) {
        rows16 = rows16 && aligned(a.more[i - 1].w, 16) && a.more[i - 1].w_nb1 % 16 == 0;
      }
      a.staged = decltype(q8_tag)::value && kStagedType<T> && ctx.options.staged_gemv && rows16 &&
                 (a.n_cols == 1 || !kLegacyType<T>);
      rotate(true);  // the integer GEMV of the staged types, and the exact one of FP8 rows (kRopeGemv)
      if (probe) return cudaSuccess;
      launch_gemv_rows<T, kQ8>(ctx, a, Access::grouped, rope);
      return cudaGetLastError();
    }
    const int64_t align = Quant<T>::kAlign;
    bool natural = aligned(w.data, align) && a.w_nb1 % align == 0 && (!a.use_ids || a.w_nb2 % align == 0);
    for (int i = 1; i < a.n_parts; ++i) {
      natural = natural && aligned(a.more[i - 1].w, align) && a.more[i - 1].w_nb1 % align == 0;
    }
    // The staged GEMV copies 16-byte chunks: rows that start 16-byte aligned and are whole chunks long.
    const int64_t row_bytes = a.k / Quant<T>::kBlock * Quant<T>::kBytes;
    bool rows16 =
        aligned(w.data, 16) && a.w_nb1 % 16 == 0 && row_bytes % 16 == 0 && (!a.use_ids || a.w_nb2 % 16 == 0);
    for (int i = 1; i < a.n_parts; ++i) {
      rows16 = rows16 && aligned(a.more[i - 1].w, 16) && a.more[i - 1].w_nb1 % 16 == 0;
    }
    // The staged GEMV of the legacy types and Q6_K reads grouped rows only.
    a.staged =
        decltype(q8_tag)::value && kStagedType<T> && !kGroupedType<T> && ctx.options.staged_gemv && rows16;
    rotate(kQ8 ? a.staged : natural);
    if (probe) return cudaSuccess;
    launch_gemv_rows<T, kQ8>(ctx, a, natural ? Access::natural : Access::safe, rope);
    return cudaGetLastError();
  };
  if (!q8) return visit_weight_type(w.type, [&](auto tag) { return launch(tag, std::false_type{}); });
  return visit_q8_type(w.type, [&](auto tag) { return launch(tag, std::true_type{}); });
}

// The columns of a dense GEMV of m columns: one group of up to kGemvMaxCols, or groups of kGemvMaxCols side
// by side (the integer path up to kQ8MaxCols; any m under CudaOptions::batch_invariant, where a block's
// columns do not change a column's sums).
void set_columns(GemvArgs& a, int64_t m) {
  a.m = static_cast<int>(std::min<int64_t>(m, kGemvMaxCols));
  a.n_cols = m;
  a.n_groups = ceil_div(m, a.m);
  a.col_split = static_cast<int>(a.n_groups);
}

GemvArgs gemv_args(const Tensor& w, const Tensor& x, const Tensor& dst) {
  GemvArgs a{};
  a.w = static_cast<const uint8_t*>(w.data);
  a.w_nb1 = w.nb[1];
  a.w_nb2 = w.nb[2];
  a.n = w.ne[1];
  a.k = w.ne[0];
  a.x = rows_of(x);
  a.x_vec = rows_aligned16(x);
  a.x_div = 1;
  a.dst = rows_of(dst);
  a.dst_type = dst.type;
  a.n_parts = 1;
  a.col_split = 1;
  return a;
}

}  // namespace

bool takes_q8(const Context& ctx, const ops::Matmul& op) {
  const Tensor& w = op.w.tensor;
  const int64_t m = op.x.n_rows();
  return ctx.fast && q8_type(w.type) &&
         (ctx.options.batch_invariant || m <= kQ8MaxCols ||
          (mmq_batch(ctx, w.type, m) && mmq_rows_fit(w.type, w.data, w.nb[1], w.ne[0], grouped(op.w))));
}

// Batch-invariant: never cuBLAS, whose algorithm (tiles, split of k) depends on m.
bool takes_gemv(const Context& ctx, const ops::Matmul& op) {
  return ctx.options.batch_invariant || op.x.n_rows() <= kGemvMaxCols || takes_q8(ctx, op);
}

cudaError_t matmul(const Context& ctx, const ops::Matmul& op) {
  if (!takes_gemv(ctx, op)) return matmul_gemm(ctx, op);
  // The exact GEMV serves the fast precision too for the types without an integer path (it allows, never
  // requires, lower precision). A group of one: the launch of one matmul.
  const ops::Matmul* const one[1] = {&op};
  return matmul_gemv_group(ctx, one);
}

namespace {

// The GEMV arguments of 1-3 matmuls on one x (matmul_gemv_group's).
GemvArgs group_args(std::span<const ops::Matmul* const> group) {
  const ops::Matmul& first = *group[0];
  GemvArgs a = gemv_args(first.w.tensor, first.x, first.dst);
  set_columns(a, first.x.n_rows());
  a.n_parts = static_cast<int>(group.size());
  for (size_t i = 1; i < group.size(); ++i) {
    const Tensor& w = group[i]->w.tensor;
    a.more[i - 1] = {static_cast<const uint8_t*>(w.data), w.nb[1], w.ne[1], rows_of(group[i]->dst)};
  }
  return a;
}

}  // namespace

cudaError_t matmul_gemv_group(const Context& ctx, std::span<const ops::Matmul* const> group) {
  const ops::Matmul& first = *group[0];
  if (group.size() > kGemvMaxParts) return cudaErrorInvalidValue;
  GemvArgs a = group_args(group);
  const bool q8 = takes_q8(ctx, first);
  if (q8) {
    if (const cudaError_t err = quantize_x(ctx, first.x, a); err != cudaSuccess) return err;
  }
  return launch_gemv(ctx, a, first.w.tensor, q8, grouped(first.w));
}

namespace {

// Whether V's weight has another type than Q and K's (a Q4_K_M layer's Q6_K V): two GEMV launches.
bool split_v(std::span<const ops::Matmul* const> group) {
  return group.size() == 3 && group[2]->w.tensor.type != group[0]->w.tensor.type;
}

}  // namespace

bool gemv_rope_ok(const Context& ctx, std::span<const ops::Matmul* const> group, const RopeOps& rope) {
  if (!ctx.options.gemv_rope || group.size() != 3) return false;
  const ops::Matmul& first = *group[0];
  const int64_t m = first.x.n_rows();
  for (const ops::Matmul* op : group) {
    if (op->dst.type != DType::f32) return false;
  }
  const ops::Matmul& v = *group[2];
  if (split_v(group) && !(ctx.options.gemv_rope_split && takes_q8(ctx, first) && takes_q8(ctx, v) &&
                          !mmq_batch(ctx, v.w.tensor.type, m) && v.w.tensor.ne[0] == first.w.tensor.ne[0])) {
    return false;
  }
  const ops::RopeParams& p = rope.q->p;
  return m <= kGemvMaxCols && takes_gemv(ctx, first) && rope_kv_write_pools(*rope.kv) &&
         !(takes_q8(ctx, first) && mmq_batch(ctx, first.w.tensor.type, m)) &&
         p.layout == ops::RopeLayout::rope_layout_normal && p.n_rot == rope.q->x.ne[0] && p.n_rot % 2 == 0 &&
         rope.q->positions.is_contiguous() && rope.kv->slots.is_contiguous();
}

namespace {

// The GemvRope of `rope` (but for `on`, which launch_gemv sets) and its frequencies; `in_stores`: whether
// the GEMV may write the pools (rope_kv_write_pools; 8-bit ones: and their row counts had).
RopeFreqs rope_args(const Context& ctx, GemvArgs& a, const RopeOps& rope, bool& in_stores) {
  const ops::KvWrite& kv = *rope.kv;
  a.rope.p = rope.q->p;
  a.rope.factors = static_cast<const float*>(rope.q->freq_factors.tensor.data);
  a.rope.positions = static_cast<const int32_t*>(rope.q->positions.data);
  a.rope.slots = static_cast<const int32_t*>(kv.slots.data);
  a.rope.k_pool = kv.k_pool.data;
  a.rope.v_pool = kv.v_pool.data;
  a.rope.k16 = kv.k_pool.type == DType::f16;
  a.rope.v16 = kv.v_pool.type == DType::f16;
  a.rope.head_dim = static_cast<int>(rope.q->x.ne[0]);
  a.rope.n_kv = static_cast<int>(kv.k.ne[1]);
  a.rope.q8_block = static_cast<int>(kv_q8_block(kv.k_pool.type));
  a.rope.q8_rows = nullptr;
  in_stores = rope_kv_write_pools(kv);
  if (in_stores && a.rope.q8_block > 0) {
    a.rope.q8_rows = static_cast<unsigned*>(
        ctx.scratch(kSlotCounters, sizeof(unsigned) * 2 * kv.k.ne[1] * kv.k.ne[2]));  // [tokens][n_kv][2]
    in_stores = a.rope.q8_rows != nullptr;
  }
  return host_rope_freqs(rope.q->p, rope.q->freq_factors.tensor.data);
}

// The GEMV of `a` (launch_gemv's arguments) with `rope` applied in its stores where its path allows, else by
// rope_kv_write after it.
cudaError_t launch_gemv_rope(const Context& ctx, GemvArgs a, const Tensor& w, bool q8, bool grouped,
                             const RopeOps& rope) {
  bool in_stores = false;
  const RopeFreqs freqs = rope_args(ctx, a, rope, in_stores);
  bool roped = false;
  if (const cudaError_t err = launch_gemv(ctx, a, w, q8, grouped, in_stores ? &freqs : nullptr, &roped);
      err != cudaSuccess || roped)
    return err;
  return rope_kv_write(ctx, *rope.q, *rope.k, *rope.kv);
}

// The group args of Q, K and V (group: the three), or of Q and K where V's weight has another type
// (split_v).
GemvArgs qkv_args(std::span<const ops::Matmul* const> group) {
  return group_args(split_v(group) ? group.first(2) : group);
}

// Q, K and V's GEMV (`a`: qkv_args, x set) with `rope` as launch_gemv_rope; where V's weight has another
// type, V's GEMV is a launch of its own on the same x (first_part 2: its rows are v's), and the two rotate
// and write the pools where both their paths allow, else neither does and rope_kv_write follows.
cudaError_t launch_qkv_rope(const Context& ctx, std::span<const ops::Matmul* const> group, GemvArgs a,
                            bool q8, const RopeOps& rope) {
  const ops::Matmul& first = *group[0];
  if (!split_v(group)) return launch_gemv_rope(ctx, a, first.w.tensor, q8, grouped(first.w), rope);
  const ops::Matmul& v = *group[2];
  GemvArgs b = group_args(group.subspan(2));
  b.xq = a.xq, b.xds = a.xds;
  bool in_stores = false;
  const RopeFreqs freqs = rope_args(ctx, a, rope, in_stores);
  (void)rope_args(ctx, b, rope, in_stores);
  b.rope.first_part = 2;
  bool qk_rotates = false, v_rotates = false;
  (void)launch_gemv(ctx, a, first.w.tensor, q8, grouped(first.w), &freqs, &qk_rotates, true);
  (void)launch_gemv(ctx, b, v.w.tensor, q8, grouped(v.w), &freqs, &v_rotates, true);
  const bool rotate = qk_rotates && v_rotates && in_stores;
  if (const cudaError_t err =
          launch_gemv(ctx, a, first.w.tensor, q8, grouped(first.w), rotate ? &freqs : nullptr);
      err != cudaSuccess) {
    return err;
  }
  if (const cudaError_t err = launch_gemv(ctx, b, v.w.tensor, q8, grouped(v.w), rotate ? &freqs : nullptr);
      err != cudaSuccess || rotate) {
    return err;
  }
  return rope_kv_write(ctx, *rope.q, *rope.k, *rope.kv);
}

}  // namespace

cudaError_t matmul_gemv_rope_group(const Context& ctx, std::span<const ops::Matmul* const> group,
                                   const RopeOps& rope) {
  const ops::Matmul& first = *group[0];
  if (!gemv_rope_ok(ctx, group, rope)) return cudaErrorInvalidValue;
  GemvArgs a = qkv_args(group);
  const bool q8 = takes_q8(ctx, first);
  if (q8) {
    if (const cudaError_t err = quantize_x(ctx, first.x, a); err != cudaSuccess) return err;
  }
  return launch_qkv_rope(ctx, group, a, q8, rope);
}

bool gemv_pairs(const Context& ctx, const ops::Matmul& gate, const ops::Matmul& up) {
  const Tensor &g = gate.w.tensor, &u = up.w.tensor;
  const bool float_weight = g.type == DType::bf16 || g.type == DType::f16 || g.type == DType::f32;
  // FP8 weights in row form (one scale a row): a decode step of an FP8 checkpoint then runs the gated
  // activation in the GEMV, as the float types do, rather than as a kernel of its own.
  const bool fp8_rows = g.type == DType::f8_e4m3 && grouped(gate.w) && grouped(up.w);
  return (float_weight || fp8_rows) && u.type == g.type && gate.x.n_rows() <= kGemvMaxCols &&
         !takes_q8(ctx, gate) && !takes_q8(ctx, up) && u.ne[1] == g.ne[1] && gate.dst.type == DType::f32 &&
         up.dst.type == DType::f32 && aligned(g.data, 16) && g.nb[1] % 16 == 0 && aligned(u.data, 16) &&
         u.nb[1] % 16 == 0;
}

cudaError_t gemv_act_pair(const Context& ctx, const ops::Matmul& gate, const ops::Matmul& up,
                          const ops::GatedAct& glu) {
  if (!gemv_pairs(ctx, gate, up)) return cudaErrorInvalidValue;
  const ops::Matmul* both[2] = {&gate, &up};
  GemvArgs a = group_args(both);
  a.pair = {true, glu.kind, rows_of(glu.dst)};
  a.prefetch = ctx.pdl;
  a.ahead = ctx.ahead;
  switch (gate.w.tensor.type) {
    case DType::bf16: launch_gemv_rows<DType::bf16, false, true>(ctx, a, Access::natural); break;
    case DType::f16: launch_gemv_rows<DType::f16, false, true>(ctx, a, Access::natural); break;
    case DType::f32: launch_gemv_rows<DType::f32, false, true>(ctx, a, Access::natural); break;
    case DType::f8_e4m3: launch_gemv_rows<DType::f8_e4m3, false, true>(ctx, a, Access::grouped); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

namespace {

// 1-3 matmuls on one x that take the integer GEMV, x rounded to 8 bits by the kernel that produces it:
// produce(xq, xds) launches that kernel, given the scratch quantize_x() would round into, in its layout.
// rope: Q, K and V with RoPE after them (launch_qkv_rope; V's weight may have another type).
template <class Produce>
cudaError_t produced_gemv_group(const Context& ctx, std::span<const ops::Matmul* const> group,
                                Produce&& produce, const RopeOps* rope = nullptr) {
  const ops::Matmul& first = *group[0];
  if (group.size() > kGemvMaxParts || !takes_q8(ctx, first)) return cudaErrorInvalidValue;
  GemvArgs a = rope != nullptr ? qkv_args(group) : group_args(group);
  const int64_t k = first.x.ne[0], n_rows = first.x.n_rows();
  const size_t q_bytes = static_cast<size_t>(n_rows * k);
  auto* out =
      static_cast<uint8_t*>(ctx.scratch(kSlotX, q_bytes + static_cast<size_t>(n_rows * (k / 32)) * 8));
  if (out == nullptr) return cudaErrorMemoryAllocation;
  a.xq = reinterpret_cast<const int*>(out);
  a.xds = reinterpret_cast<const float2*>(out + q_bytes);
  if (const cudaError_t err = produce(reinterpret_cast<int*>(out), reinterpret_cast<float2*>(out + q_bytes));
      err != cudaSuccess) {
    return err;
  }
  if (rope != nullptr) return launch_qkv_rope(ctx, group, a, true, *rope);
  return launch_gemv(ctx, a, first.w.tensor, true, grouped(first.w));
}

}  // namespace

cudaError_t add_norm_gemv_group(const Context& ctx, const ops::Binary& add, const ops::RmsNorm& norm,
                                std::span<const ops::Matmul* const> group) {
  return produced_gemv_group(ctx, group,
                             [&](int* xq, float2* xds) { return add_rms_norm(ctx, add, norm, xq, xds); });
}

cudaError_t add_norm_gemv_rope_group(const Context& ctx, const ops::Binary& add, const ops::RmsNorm& norm,
                                     std::span<const ops::Matmul* const> group, const RopeOps& rope) {
  if (!gemv_rope_ok(ctx, group, rope)) return cudaErrorInvalidValue;
  return produced_gemv_group(
      ctx, group, [&](int* xq, float2* xds) { return add_rms_norm(ctx, add, norm, xq, xds); }, &rope);
}

cudaError_t glu_gemv_group(const Context& ctx, const ops::GatedAct& glu,
                           std::span<const ops::Matmul* const> group) {
  return produced_gemv_group(ctx, group, [&](int* xq, float2* xds) { return gated_act(ctx, glu, xq, xds); });
}

cudaError_t attention_gemv_group(const Context& ctx, const ops::Attention& att,
                                 std::span<const ops::Matmul* const> group) {
  return produced_gemv_group(ctx, group, [&](int* xq, float2* xds) {
    return attention(ctx, att, nullptr, false, reinterpret_cast<int8_t*>(xq), xds);
  });
}

cudaError_t moe_matmul(const Context& ctx, const ops::MoeMatmul& op) {
  // dst [n, n_used, n_tokens] gives the shape: ids is any contiguous i32 tensor of n_used * n_tokens.
  const int64_t n_used = op.dst.ne[1], n_tokens = op.dst.ne[2];
  GemvArgs a = gemv_args(op.w.tensor, op.x, op.dst);
  a.m = 1;
  a.n_groups = n_used * n_tokens;  // column q = s + n_used * t: dst row (s, t)
  a.n_cols = a.n_groups;
  a.use_ids = true;
  a.ids = ids_of(op.ids);                  // read flat: id q = s + n_used * t
  a.x_div = op.x.ne[1] == 1 ? n_used : 1;  // x row t, or (s, t)
  const bool q8 = ctx.fast && q8_type(op.w.tensor.type);
  if (q8) {
    if (const cudaError_t err = quantize_x(ctx, op.x, a); err != cudaSuccess) return err;
  }
  return launch_gemv(ctx, a, op.w.tensor, q8, grouped(op.w));
}

}  // namespace kiln::cuda
