// GetRows, Matmul and MoeMatmul on the device (contracts: ops/ops.h; dequantization: cuda_quant.cuh).
//
// Matmul has four paths, by m = x.n_rows() and quantize_x:
// - quantize_x, a weight type with an integer path (cuda_q8.cuh) and m <= kQ8MaxCols (decode, batched
//   decode): x rounded to 8 bits per block of 32, then gemv_kernel on integer dot products (__dp4a), up to
//   kGemvMaxCols columns a block, column groups side by side so that a weight row is read from memory once;
//   K-quant batches of kGemvMaxCols + 1 to kMmqMaxCols rows take the int8 tensor cores instead (cuda_mmq.cu).
// - m <= kGemvMaxCols otherwise: gemv_kernel streams the weight once, dequantizes it in registers and
//   computes all m columns from that one pass, in f32. Exact (the products of the exactly dequantized weight
//   and x).
// - m > kGemvMaxCols, quantize_x false: the weight dequantized to f32 (unless it is f32 already),
//   cublasSgemm.
// - m > kGemvMaxCols, quantize_x true: cublasGemmEx on tensor cores with f32 accumulation: bf16 weights with
//   x rounded to bf16; f16 and block-quantized weights (dequantized to f16) with x rounded to f16, saturated;
//   f32 weights in TF32 (~1e-3 relative at worst).
// Every path computes f32 and rounds once to an f16 / bf16 destination. MoeMatmul is a GEMV of one column
// per (token, expert slot), on the integer path under quantize_x when the type has one.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <type_traits>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_convert.cuh"
#include "backends/cuda/cuda_gemv.cuh"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_launch.cuh"
#include "backends/cuda/cuda_mmq.cuh"
#include "backends/cuda/cuda_q8.cuh"
#include "backends/cuda/cuda_quant.cuh"
#include "backends/cuda/cuda_round_q8.cuh"

namespace kiln::cuda {

namespace {

constexpr int kMaxGridY = 65535;
constexpr int kPieceThreads = 128;  // threads per block of the elementwise kernels (one piece each)

// Scratch slots of one matmul.
constexpr int kSlotW = 0, kSlotX = 1, kSlotDst = 2;

// A contiguous [ne0, n_rows] matrix of elements of `elem` bytes.
Rows packed_rows(void* data, int64_t ne0, int64_t n_rows, int elem) {
  const int64_t ld = ne0 * elem;
  return {static_cast<char*>(data), n_rows, 1, ld, ld * n_rows, ld * n_rows};
}

Ids ids_of(const Tensor& t) { return {static_cast<const char*>(t.data), t.ne[0], t.nb[0], t.nb[1]}; }

int elem_bytes(DType float_type) { return float_type == DType::f32 ? 4 : 2; }

bool aligned(const void* p, int64_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// x_vec: the GEMV reads x as float4 when every x row it may read is 16-byte aligned.
bool rows_aligned16(const Tensor& t) {
  return aligned(t.data, 16) && t.nb[1] % 16 == 0 && t.nb[2] % 16 == 0 && t.nb[3] % 16 == 0;
}

template <class F>
cudaError_t visit_q8_type(DType t, F&& f) {
  switch (t) {
#define KILN_CASE(name) \
  case DType::name: return f(std::integral_constant<DType, DType::name>{});
    KILN_CUDA_Q8_TYPES(KILN_CASE)
#undef KILN_CASE
    default: return cudaErrorNotSupported;
  }
}

bool q8_type(DType t) {
  return visit_q8_type(t, [](auto) { return cudaSuccess; }) == cudaSuccess;
}

// The f32 rows of x (k a multiple of 32) rounded to 8 bits per block of 32 (cuda_q8.cuh): one warp a block.
// A block holding a NaN gets a NaN scale, so that the products stay NaN as on the exact path.
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
  auto* out = static_cast<uint8_t*>(ctx.scratch(kSlotX, q_bytes + static_cast<size_t>(n_rows * (k / 32)) * 8));
  if (out == nullptr) return cudaErrorMemoryAllocation;
  a.xq = reinterpret_cast<const int*>(out);
  a.xds = reinterpret_cast<const float2*>(out + q_bytes);
  constexpr int kThreads = 256;
  const auto grid = static_cast<unsigned>(std::min<int64_t>(ceil_div(n_rows * (k / 32), kThreads / 32), 65535));
  return launch_kernel(ctx, quantize_x_kernel, grid, kThreads, 0, rows_of(x), k, n_rows,
                       reinterpret_cast<int*>(out), reinterpret_cast<float2*>(out + q_bytes));
}

// Whether a batch of m x rows on the integer path takes the tensor-core kernel (cuda_mmq.cu) for this type.
bool mmq_batch(const Context& ctx, DType type, int64_t m) {
  return ctx.mmq && m >= ctx.mmq_min_cols && m <= kMmqMaxCols && mmq_type(type);
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
      a.staged = decltype(q8_tag)::value && kStagedType<T> && ctx.staged_gemv_grouped && rows16 &&
                 (a.n_cols == 1 || !kLegacyType<T>);
      rotate(kQ8);
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
    a.staged = decltype(q8_tag)::value && kStagedType<T> && !kGroupedType<T> && ctx.staged_gemv && rows16;
    rotate(kQ8 ? a.staged : natural);
    if (probe) return cudaSuccess;
    launch_gemv_rows<T, kQ8>(ctx, a, natural ? Access::natural : Access::safe, rope);
    return cudaGetLastError();
  };
  if (!q8) return visit_weight_type(w.type, [&](auto tag) { return launch(tag, std::false_type{}); });
  return visit_q8_type(w.type, [&](auto tag) { return launch(tag, std::true_type{}); });
}

// The columns of a dense GEMV of m columns: one group of up to kGemvMaxCols, or groups of kGemvMaxCols side
// by side (the integer path, up to kQ8MaxCols).
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

// ---- dequantization of whole rows: GetRows, and the weight of a GEMM into scratch ----

struct DequantArgs {
  const uint8_t* src;
  int64_t src_nb1;  // bytes between source rows
  int64_t ne0;      // elements per row
  int64_t n_rows;
  bool use_ids;  // row r of dst is source row ids[r]; else source row r
  Ids ids;
  Rows dst;
  DType dst_type;
  bool grouped;  // the source rows are in grouped form
};

// Thread: one piece (8 elements) of one row; grid: (pieces of a row, rows, grid-strided).
template <DType T, int A>
__global__ void dequant_rows_kernel(DequantArgs a) {
  pdl_begin();
  using Q = Quant<T>;
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (8 * p >= a.ne0) return;
  for (int64_t r = blockIdx.y; r < a.n_rows; r += gridDim.y) {
    const uint8_t* src = a.src + (a.use_ids ? a.ids[r] : r) * a.src_nb1;
    char* dst = a.dst.row(r);
    if (8 * p + 8 <= a.ne0) {
      float w[8];
      Q::template piece<A>(src, p, w);
#pragma unroll
      for (int j = 0; j < 8; ++j) store_float(dst, a.dst_type, 8 * p + j, w[j]);
    } else if constexpr (Q::kBlock == 1) {  // the tail of a float row
      for (int64_t e = 8 * p; e < a.ne0; ++e) store_float(dst, a.dst_type, e, Q::element(src, e));
    }
  }
}

cudaError_t launch_dequant(const Context& ctx, const DequantArgs& a, DType type) {
  return visit_weight_type(type, [&](auto tag) {
    constexpr DType T = decltype(tag)::value;
    const int64_t align = Quant<T>::kAlign;
    const dim3 grid(static_cast<unsigned>(ceil_div(ceil_div(a.ne0, 8), kPieceThreads)),
                    static_cast<unsigned>(std::min<int64_t>(a.n_rows, kMaxGridY)));
    if constexpr (kGroupedType<T>) {
      if (a.grouped) {
        (void)launch_kernel(ctx, dequant_rows_kernel<T, 16 | kGrouped>, grid, kPieceThreads, 0, a);
        return cudaGetLastError();
      }
    }
    if (a.grouped) return cudaErrorNotSupported;
    if (aligned(a.src, align) && a.src_nb1 % align == 0) {
      (void)launch_kernel(ctx, dequant_rows_kernel<T, Quant<T>::kAlign>, grid, kPieceThreads, 0, a);
    } else {
      (void)launch_kernel(ctx, dequant_rows_kernel<T, Quant<T>::kSafeAlign>, grid, kPieceThreads, 0, a);
    }
    return cudaGetLastError();
  });
}

// The [k, n] weight `w` (rows in grouped form when `grouped`) as a contiguous matrix of f32, f16 or bf16 in
// scratch slot kSlotW (null: out of memory).
void* dequant_weight(const Context& ctx, const Tensor& w, bool grouped, DType to, cudaError_t* err) {
  const int64_t k = w.ne[0], n = w.ne[1];
  void* out = ctx.scratch(kSlotW, static_cast<size_t>(k * n * elem_bytes(to)));
  if (out == nullptr) {
    *err = cudaErrorMemoryAllocation;
    return nullptr;
  }
  DequantArgs a{};
  a.src = static_cast<const uint8_t*>(w.data);
  a.src_nb1 = w.nb[1];
  a.ne0 = k;
  a.n_rows = n;
  a.dst = packed_rows(out, k, n, elem_bytes(to));
  a.dst_type = to;
  a.grouped = grouped;
  *err = launch_dequant(ctx, a, w.type);
  return *err == cudaSuccess ? out : nullptr;
}

// ---- f32 rows to float rows of another layout and type (x into scratch, scratch into dst) ----

cudaError_t convert_rows(const Context& ctx, const Rows& src, int64_t ne0, int64_t n_rows, const Rows& dst,
                         DType dst_type, bool saturate = false) {
  if (ne0 % 8 == 0 && rows_aligned16(src) && rows_aligned16(dst)) {
    const dim3 grid(static_cast<unsigned>(ceil_div(ne0 / 8, kPieceThreads)),
                    static_cast<unsigned>(std::min<int64_t>(n_rows, kMaxGridY)));
    const auto launch = [&](auto* kernel) {
      (void)launch_kernel(ctx, kernel, grid, kPieceThreads, 0, src, ne0, n_rows, dst, saturate);
    };
    if (dst_type == DType::f16) {
      launch(convert_rows8_kernel<__half>);
    } else if (dst_type == DType::bf16) {
      launch(convert_rows8_kernel<__nv_bfloat16>);
    } else {
      launch(convert_rows8_kernel<float>);
    }
    return cudaGetLastError();
  }
  const dim3 grid(static_cast<unsigned>(ceil_div(ne0, kPieceThreads)),
                  static_cast<unsigned>(std::min<int64_t>(n_rows, kMaxGridY)));
  (void)launch_kernel(ctx, convert_rows_kernel, grid, kPieceThreads, 0, src, ne0, n_rows, dst,
                      store_of(dst_type), saturate);
  return cudaGetLastError();
}

// ---- GEMM through cuBLAS (m > kGemvMaxCols) ----

// The leading dimension (in elements of `elem` bytes) of t as a column-major [ne0, n_rows] matrix, or 0 when
// its rows are not equally spaced at a multiple of the element size.
int64_t leading_dim(const Tensor& t, int elem) {
  if (!aligned(t.data, elem) || t.nb[1] % elem != 0 || t.nb[1] / elem < t.ne[0]) return 0;
  const bool dim2 = t.ne[2] == 1 || t.nb[2] == t.nb[1] * t.ne[1];
  const bool dim3 = t.ne[3] == 1 || t.nb[3] == t.nb[2] * t.ne[2];
  return dim2 && dim3 ? t.nb[1] / elem : 0;
}

// A column-major operand of the GEMM: device pointer and leading dimension in elements.
struct Operand {
  void* data = nullptr;
  int64_t ld = 0;
};

// x as a column-major [k, m] matrix of `type` (f32: in place when its rows are equally spaced).
Operand gemm_x(const Context& ctx, const Tensor& x, DType type, cudaError_t* err) {
  const int64_t k = x.ne[0], m = x.n_rows();
  if (type == DType::f32) {
    if (const int64_t ld = leading_dim(x, 4); ld != 0) return {x.data, ld};
  }
  void* out = ctx.scratch(kSlotX, static_cast<size_t>(k * m * elem_bytes(type)));
  if (out == nullptr) {
    *err = cudaErrorMemoryAllocation;
    return {};
  }
  *err =
      convert_rows(ctx, rows_of(x), k, m, packed_rows(out, k, m, elem_bytes(type)), type, type == DType::f16);
  return {out, k};
}

// Where the GEMM writes its f32 [n, m] result: dst itself when it is f32 with equally spaced rows, else
// scratch.
Operand gemm_dst(const Context& ctx, const Tensor& dst, cudaError_t* err) {
  if (dst.type == DType::f32) {
    if (const int64_t ld = leading_dim(dst, 4); ld != 0) return {dst.data, ld};
  }
  void* out = ctx.scratch(kSlotDst, static_cast<size_t>(dst.ne[0] * dst.n_rows() * 4));
  if (out == nullptr) *err = cudaErrorMemoryAllocation;
  return {out, dst.ne[0]};
}

// cuBLAS failures have no cudaError_t of their own: the launchers report them as cudaErrorUnknown.
cudaError_t cublas_error(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS ? cudaSuccess : cudaErrorUnknown;
}

// dst (column-major n x m) = W^T (W: column-major k x n, i.e. the rows of w) * X (k x m), f32 out. tf32: f32
// inputs on tensor cores, rounded to TF32 (10-bit mantissa).
cudaError_t gemm(const Context& ctx, const Operand& w, const Operand& x, const Operand& d,
                 cudaDataType in_type, int64_t n, int64_t m, int64_t k, bool tf32) {
  const float one = 1.0f, zero = 0.0f;
  const auto ni = static_cast<int>(n), mi = static_cast<int>(m), ki = static_cast<int>(k);
  if (in_type == CUDA_R_32F && tf32) {
    return cublas_error(
        cublasGemmEx(ctx.cublas, CUBLAS_OP_T, CUBLAS_OP_N, ni, mi, ki, &one, w.data, CUDA_R_32F,
                     static_cast<int>(w.ld), x.data, CUDA_R_32F, static_cast<int>(x.ld), &zero, d.data,
                     CUDA_R_32F, static_cast<int>(d.ld), CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT));
  }
  if (in_type == CUDA_R_32F) {
    return cublas_error(cublasSgemm(ctx.cublas, CUBLAS_OP_T, CUBLAS_OP_N, ni, mi, ki, &one,
                                    static_cast<const float*>(w.data), static_cast<int>(w.ld),
                                    static_cast<const float*>(x.data), static_cast<int>(x.ld), &zero,
                                    static_cast<float*>(d.data), static_cast<int>(d.ld)));
  }
  return cublas_error(cublasGemmEx(ctx.cublas, CUBLAS_OP_T, CUBLAS_OP_N, ni, mi, ki, &one, w.data, in_type,
                                   static_cast<int>(w.ld), x.data, in_type, static_cast<int>(x.ld), &zero,
                                   d.data, CUDA_R_32F, static_cast<int>(d.ld), CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
}

// The weight operand: in place when it already has the GEMM's input type `to` and usable rows, else
// dequantized into scratch.
Operand gemm_w(const Context& ctx, const ops::Weight& weight, DType to, cudaError_t* err) {
  const Tensor& w = weight.tensor;
  if (w.type == to) {
    if (const int64_t ld = leading_dim(w, elem_bytes(to)); ld != 0) return {w.data, ld};
  }
  return {dequant_weight(ctx, w, grouped(weight), to, err), w.ne[0]};
}

// The GEMM's input type under the matmul's precision: tensor-core inputs that keep the weight's precision
// under quantize_x (bf16 weights with bf16 x, f32 ones in TF32, f16 and block-quantized ones, whose d * q
// needs more than bf16's 8 bits, in f16 with x saturated to f16's range); f32 otherwise.
DType gemm_input_type(const Context& ctx, const ops::Matmul& op) {
  const DType w = op.w.tensor.type;
  return !ctx.fast || w == DType::f32 ? DType::f32 : w == DType::bf16 ? DType::bf16 : DType::f16;
}

// One matmul's GEMM on x already in the GEMM's input type.
cudaError_t gemm_on(const Context& ctx, const ops::Matmul& op, const Operand& x) {
  const Tensor& wt = op.w.tensor;
  const int64_t k = wt.ne[0], n = wt.ne[1], m = op.x.n_rows();
  const DType in = gemm_input_type(ctx, op);
  cudaError_t err = cudaSuccess;
  const Operand w = gemm_w(ctx, op.w, in, &err);
  if (err != cudaSuccess) return err;
  const Operand d = gemm_dst(ctx, op.dst, &err);
  if (err != cudaSuccess) return err;
  const cudaDataType type = in == DType::f32 ? CUDA_R_32F : in == DType::f16 ? CUDA_R_16F : CUDA_R_16BF;
  if (err = gemm(ctx, w, x, d, type, n, m, k, ctx.fast); err != cudaSuccess) return err;
  if (d.data == op.dst.data) return cudaSuccess;
  return convert_rows(ctx, packed_rows(d.data, n, m, 4), n, m, rows_of(op.dst), op.dst.type);
}

cudaError_t matmul_gemm(const Context& ctx, const ops::Matmul& op) {
  cudaError_t err = cudaSuccess;
  const Operand x = gemm_x(ctx, op.x, gemm_input_type(ctx, op), &err);
  if (err != cudaSuccess) return err;
  return gemm_on(ctx, op, x);
}

}  // namespace

bool supports_weight_type(DType type) {
  switch (type) {
#define KILN_CASE(name) case DType::name:
    KILN_CUDA_WEIGHT_TYPES(KILN_CASE)
#undef KILN_CASE
    return true;
    default: return false;
  }
}

cudaError_t get_rows(const Context& ctx, const ops::GetRows& op) {
  const Tensor& table = op.table.tensor;
  DequantArgs a{};
  a.src = static_cast<const uint8_t*>(table.data);
  a.src_nb1 = table.nb[1];
  a.ne0 = table.ne[0];
  a.n_rows = op.ids.ne[0];
  a.use_ids = true;
  a.ids = ids_of(op.ids);
  a.dst = rows_of(op.dst);
  a.dst_type = op.dst.type;
  a.grouped = grouped(op.table);  // a table that is also the output head
  return launch_dequant(ctx, a, table.type);
}

bool takes_q8(const Context& ctx, const ops::Matmul& op) {
  const Tensor& w = op.w.tensor;
  const int64_t m = op.x.n_rows();
  return ctx.int8_gemv && ctx.fast && q8_type(w.type) &&
         (m <= kQ8MaxCols ||
          (mmq_batch(ctx, w.type, m) && mmq_rows_fit(w.type, w.data, w.nb[1], w.ne[0], grouped(op.w))));
}

bool takes_gemv(const Context& ctx, const ops::Matmul& op) {
  return op.x.n_rows() <= kGemvMaxCols || takes_q8(ctx, op);
}

bool same_gemm_input(const Context& ctx, const ops::Matmul& a, const ops::Matmul& b) {
  return gemm_input_type(ctx, a) == gemm_input_type(ctx, b);
}

namespace {

// Whether the group's weights are parts of one stack (WeightLayout), each one's rows right after the previous
// one's, with one quantize_x and destinations of one float type: then one GEMM computes them all.
bool stacked(std::span<const ops::Matmul* const> group) {
  const ops::Matmul& first = *group[0];
  const WeightLayout* l0 = layout_of(first.w);
  if (group.size() > kMaxSplitParts || first.x.n_rows() > kDecodeGemmMaxCols || l0 == nullptr ||
      l0->stack() == nullptr) {
    return false;
  }
  const Tensor& w0 = first.w.tensor;
  const char* next = static_cast<const char*>(w0.data);
  for (const ops::Matmul* op : group) {
    const Tensor& w = op->w.tensor;
    const WeightLayout* l = layout_of(op->w);
    if (l == nullptr || l->stack() != l0->stack() || w.data != next || w.type != w0.type ||
        w.ne[0] != w0.ne[0] || w.nb[1] != w0.nb[1] || w.ne[2] != 1 || w.ne[3] != 1 ||
        op->dst.type != first.dst.type) {
      return false;
    }
    next += w.ne[1] * w.nb[1];
  }
  return true;
}

// The stacked group's GEMM on x (already in the GEMM's input type): the weights as one matrix [k, sum n_i],
// the f32 result in scratch, then each part's rows to its destination (one kernel where the parts' widths and
// destinations allow 16-byte moves, else one conversion a part).
cudaError_t stacked_gemm(const Context& ctx, std::span<const ops::Matmul* const> group, const Operand& x) {
  const ops::Matmul& first = *group[0];
  Tensor w = first.w.tensor;
  int64_t n = 0;
  for (const ops::Matmul* op : group) n += op->w.tensor.ne[1];
  w.ne[1] = n;
  w.nb[2] = w.nb[3] = w.nb[1] * n;
  ops::Weight whole(w);
  whole.prepared = first.w.prepared;
  const int64_t k = w.ne[0], m = first.x.n_rows();
  const DType in = gemm_input_type(ctx, first);
  cudaError_t err = cudaSuccess;
  const Operand wo = gemm_w(ctx, whole, in, &err);
  if (err != cudaSuccess) return err;
  void* d = ctx.scratch(kSlotDst, static_cast<size_t>(n * m * 4));
  if (d == nullptr) return cudaErrorMemoryAllocation;
  const cudaDataType type = in == DType::f32 ? CUDA_R_32F : in == DType::f16 ? CUDA_R_16F : CUDA_R_16BF;
  if (err = gemm(ctx, wo, x, {d, n}, type, n, m, k, ctx.fast); err != cudaSuccess) return err;
  const Rows result = packed_rows(d, n, m, 4);
  SplitParts parts{};
  bool wide = true;
  int64_t at = 0, longest = 0;
  for (size_t p = 0; p < group.size(); ++p) {
    const int64_t ne0 = group[p]->w.tensor.ne[1];
    parts.first[p] = at;
    parts.ne0[p] = ne0;
    parts.dst[p] = rows_of(group[p]->dst);
    wide = wide && ne0 % 8 == 0 && at % 8 == 0 && rows_aligned16(parts.dst[p]);
    longest = std::max(longest, ne0);
    at += ne0;
  }
  if (!wide) {
    for (size_t p = 0; p < group.size(); ++p) {
      Rows src = result;
      src.data += parts.first[p] * 4;
      err = convert_rows(ctx, src, parts.ne0[p], m, parts.dst[p], first.dst.type);
      if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
  }
  const dim3 grid(static_cast<unsigned>(ceil_div(longest / 8, kPieceThreads)),
                  static_cast<unsigned>(std::min<int64_t>(m, kMaxGridY)),
                  static_cast<unsigned>(group.size()));
  const auto launch = [&](auto* kernel) {
    (void)launch_kernel(ctx, kernel, grid, kPieceThreads, 0, result, m, parts);
  };
  if (first.dst.type == DType::f16) {
    launch(split_rows8_kernel<__half>);
  } else if (first.dst.type == DType::bf16) {
    launch(split_rows8_kernel<__nv_bfloat16>);
  } else {
    launch(split_rows8_kernel<float>);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t matmul_gemm_group(const Context& ctx, std::span<const ops::Matmul* const> group) {
  cudaError_t err = cudaSuccess;
  const Operand x = gemm_x(ctx, group[0]->x, gemm_input_type(ctx, *group[0]), &err);
  if (err == cudaSuccess && stacked(group)) return stacked_gemm(ctx, group, x);
  for (const ops::Matmul* op : group) {
    if (err != cudaSuccess) break;
    err = gemm_on(ctx, *op, x);
  }
  return err;
}

cudaError_t matmul(const Context& ctx, const ops::Matmul& op) {
  if (!takes_gemv(ctx, op)) return matmul_gemm(ctx, op);
  // The exact GEMV serves quantize_x too for the types without an integer path (quantize_x allows, never
  // requires, lower precision).
  GemvArgs a = gemv_args(op.w.tensor, op.x, op.dst);
  set_columns(a, op.x.n_rows());
  const bool q8 = takes_q8(ctx, op);
  if (q8) {
    if (const cudaError_t err = quantize_x(ctx, op.x, a); err != cudaSuccess) return err;
  }
  return launch_gemv(ctx, a, op.w.tensor, q8, grouped(op.w));
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
  if (!ctx.gemv_rope || group.size() != 3) return false;
  const ops::Matmul& first = *group[0];
  const int64_t m = first.x.n_rows();
  for (const ops::Matmul* op : group) {
    if (op->dst.type != DType::f32) return false;
  }
  const ops::Matmul& v = *group[2];
  if (split_v(group) && !(ctx.gemv_rope_split && takes_q8(ctx, first) && takes_q8(ctx, v) &&
                          !mmq_batch(ctx, v.w.tensor.type, m) && v.w.tensor.ne[0] == first.w.tensor.ne[0])) {
    return false;
  }
  const ops::RopeParams& p = rope.q->p;
  return m <= kGemvMaxCols && takes_gemv(ctx, first) &&
         !(takes_q8(ctx, first) && mmq_batch(ctx, first.w.tensor.type, m)) &&
         p.layout == ops::RopeLayout::rope_layout_normal && p.n_rot == rope.q->x.ne[0] && p.n_rot % 2 == 0 &&
         rope.q->positions.is_contiguous() && rope.kv->slots.is_contiguous();
}

namespace {

// The GemvRope of `rope` (but for `on`, which launch_gemv sets) and its frequencies.
RopeFreqs rope_args(GemvArgs& a, const RopeOps& rope) {
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
  return host_rope_freqs(rope.q->p, rope.q->freq_factors.tensor.data);
}

// The GEMV of `a` (launch_gemv's arguments) with `rope` applied in its stores where its path allows, else by
// rope_kv_write after it.
cudaError_t launch_gemv_rope(const Context& ctx, GemvArgs a, const Tensor& w, bool q8, bool grouped,
                             const RopeOps& rope) {
  const RopeFreqs freqs = rope_args(a, rope);
  bool roped = false;
  if (const cudaError_t err = launch_gemv(ctx, a, w, q8, grouped, &freqs, &roped);
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
  const RopeFreqs freqs = rope_args(a, rope);
  (void)rope_args(b, rope);
  b.rope.first_part = 2;
  bool qk_rotates = false, v_rotates = false;
  (void)launch_gemv(ctx, a, first.w.tensor, q8, grouped(first.w), &freqs, &qk_rotates, true);
  (void)launch_gemv(ctx, b, v.w.tensor, q8, grouped(v.w), &freqs, &v_rotates, true);
  const bool rotate = qk_rotates && v_rotates;
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
  return ctx.gemv_act && float_weight && u.type == g.type && gate.x.n_rows() <= kGemvMaxCols &&
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

bool gemm_takes_half_x(const Context& ctx, const ops::Matmul& op) {
  return !takes_gemv(ctx, op) && gemm_input_type(ctx, op) != DType::f32;
}

namespace {

// 1-3 matmuls on one x that take the GEMM in 16 bits, x written in the GEMM's type by the kernel that
// produces it: produce(xh, f16) launches that kernel, given the scratch gemm_x() would convert into, in its
// layout.
template <class Produce>
cudaError_t produced_gemm_group(const Context& ctx, std::span<const ops::Matmul* const> group,
                                Produce&& produce) {
  const ops::Matmul& first = *group[0];
  if (!gemm_takes_half_x(ctx, first)) return cudaErrorInvalidValue;
  const int64_t k = first.x.ne[0], m = first.x.n_rows();
  const DType in = gemm_input_type(ctx, first);
  void* out = ctx.scratch(kSlotX, static_cast<size_t>(k * m * 2));
  if (out == nullptr) return cudaErrorMemoryAllocation;
  if (const cudaError_t err = produce(static_cast<uint16_t*>(out), in == DType::f16); err != cudaSuccess) {
    return err;
  }
  const Operand x{out, k};
  if (stacked(group)) return stacked_gemm(ctx, group, x);
  for (const ops::Matmul* op : group) {
    if (const cudaError_t err = gemm_on(ctx, *op, x); err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t add_norm_gemm_group(const Context& ctx, const ops::Binary& add, const ops::RmsNorm& norm,
                                std::span<const ops::Matmul* const> group) {
  return produced_gemm_group(ctx, group, [&](uint16_t* xh, bool f16) {
    return add_rms_norm(ctx, add, norm, nullptr, nullptr, xh, f16);
  });
}

cudaError_t glu_gemm_group(const Context& ctx, const ops::GatedAct& glu,
                           std::span<const ops::Matmul* const> group) {
  return produced_gemm_group(
      ctx, group, [&](uint16_t* xh, bool f16) { return gated_act(ctx, glu, nullptr, nullptr, xh, f16); });
}

cudaError_t attention_gemv_group(const Context& ctx, const ops::Attention& att,
                                 std::span<const ops::Matmul* const> group) {
  return produced_gemv_group(ctx, group, [&](int* xq, float2* xds) {
    return attention(ctx, att, nullptr, false, reinterpret_cast<int8_t*>(xq), xds);
  });
}

cudaError_t attention_gemm_group(const Context& ctx, const ops::Attention& att,
                                 std::span<const ops::Matmul* const> group) {
  return produced_gemm_group(ctx, group,
                             [&](uint16_t* xh, bool f16) { return attention(ctx, att, xh, f16); });
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
  const bool q8 = ctx.int8_gemv && ctx.fast && q8_type(op.w.tensor.type);
  if (q8) {
    if (const cudaError_t err = quantize_x(ctx, op.x, a); err != cudaSuccess) return err;
  }
  return launch_gemv(ctx, a, op.w.tensor, q8, grouped(op.w));
}

}  // namespace kiln::cuda
