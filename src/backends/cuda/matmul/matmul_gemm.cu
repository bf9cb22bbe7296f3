// The GEMM path of Matmul (m > kGemvMaxCols, outside the integer kernels' ranges: the decision table is at
// the top of matmul.cu) through cuBLAS, with the weight dequantized into scratch where its type is not the
// GEMM's input type; GetRows (rows of a table dequantized); and the fused groups that end in GEMMs (matmuls
// on one x, a stack of weights as one GEMM, x written in 16 bits by the kernel that produces it).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <span>
#include <type_traits>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_launch.cuh"
#include "backends/cuda/matmul/convert.cuh"
#include "backends/cuda/matmul/dequant.cuh"
#include "backends/cuda/matmul/matmul.cuh"

namespace kiln::cuda {

namespace {

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

}  // namespace

// ---- f32 rows to float rows of another layout and type (x into scratch, scratch into dst) ----

cudaError_t convert_rows(const Context& ctx, const Rows& src, int64_t ne0, int64_t n_rows, const Rows& dst,
                         DType dst_type, bool saturate) {
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

int64_t leading_dim(const Tensor& t, int elem) {
  if (!aligned(t.data, elem) || t.nb[1] % elem != 0 || t.nb[1] / elem < t.ne[0]) return 0;
  const bool dim2 = t.ne[2] == 1 || t.nb[2] == t.nb[1] * t.ne[1];
  const bool dim3 = t.ne[3] == 1 || t.nb[3] == t.nb[2] * t.ne[2];
  return dim2 && dim3 ? t.nb[1] / elem : 0;
}

namespace {

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
// at the fast precision (bf16 weights with bf16 x, f32 ones in TF32, f16 and block-quantized ones, whose d *
// q needs more than bf16's 8 bits, in f16 with x saturated to f16's range); f32 otherwise.
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

}  // namespace

cudaError_t matmul_gemm(const Context& ctx, const ops::Matmul& op) {
  if (fp8_gemm_applies(ctx, op)) {
    // Done, or an error of its own (scratch a captured step must not grow): only cuBLASLt's refusal falls
    // back.
    if (const cudaError_t e = fp8_gemm(ctx, op); e != cudaErrorNotSupported) return e;
    static std::once_flag warned;
    std::call_once(warned, [] {
      std::fprintf(stderr,
                   "kiln: cuda: cuBLASLt took no FP8 GEMM for an f8_e4m3 weight; such weights are "
                   "dequantized instead\n");
    });
  }
  cudaError_t err = cudaSuccess;
  const Operand x = gemm_x(ctx, op.x, gemm_input_type(ctx, op), &err);
  if (err != cudaSuccess) return err;
  return gemm_on(ctx, op, x);
}

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

bool same_gemm_input(const Context& ctx, const ops::Matmul& a, const ops::Matmul& b) {
  return gemm_input_type(ctx, a) == gemm_input_type(ctx, b);
}

namespace {

// Whether the group's weights are parts of one stack (WeightLayout), each one's rows right after the previous
// one's, with destinations of one float type: then one GEMM computes them all.
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

// A stacked group's weights as one matrix [k, sum n_i].
ops::Weight stacked_weight(std::span<const ops::Matmul* const> group) {
  const ops::Matmul& first = *group[0];
  Tensor w = first.w.tensor;
  int64_t n = 0;
  for (const ops::Matmul* op : group) n += op->w.tensor.ne[1];
  w.ne[1] = n;
  w.nb[2] = w.nb[3] = w.nb[1] * n;
  ops::Weight whole(w);
  whole.prepared = first.w.prepared;
  return whole;
}

// A stacked group's f32 result d (m rows of sum n_i) to each part's destination: one kernel where the parts'
// widths and destinations allow 16-byte moves, else one conversion a part.
cudaError_t split_stacked(const Context& ctx, std::span<const ops::Matmul* const> group, void* d) {
  const ops::Matmul& first = *group[0];
  int64_t n = 0;
  for (const ops::Matmul* op : group) n += op->w.tensor.ne[1];
  const int64_t m = first.x.n_rows();
  cudaError_t err = cudaSuccess;
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

// The stacked group's GEMM on x (already in the GEMM's input type): the f32 result in scratch, then each
// part's rows to its destination.
cudaError_t stacked_gemm(const Context& ctx, std::span<const ops::Matmul* const> group, const Operand& x) {
  const ops::Matmul& first = *group[0];
  const ops::Weight whole = stacked_weight(group);
  const int64_t k = whole.tensor.ne[0], n = whole.tensor.ne[1], m = first.x.n_rows();
  const DType in = gemm_input_type(ctx, first);
  cudaError_t err = cudaSuccess;
  const Operand wo = gemm_w(ctx, whole, in, &err);
  if (err != cudaSuccess) return err;
  void* d = ctx.scratch(kSlotDst, static_cast<size_t>(n * m * 4));
  if (d == nullptr) return cudaErrorMemoryAllocation;
  const cudaDataType type = in == DType::f32 ? CUDA_R_32F : in == DType::f16 ? CUDA_R_16F : CUDA_R_16BF;
  if (err = gemm(ctx, wo, x, {d, n}, type, n, m, k, ctx.fast); err != cudaSuccess) return err;
  return split_stacked(ctx, group, d);
}

}  // namespace

cudaError_t fp8_gemm_group(const Context& ctx, std::span<const ops::Matmul* const> group,
                           const Fp8X* rounded) {
  Fp8X x{};
  if (rounded != nullptr) {
    x = *rounded;
  } else if (const cudaError_t err = fp8_round_x(ctx, group[0]->x, fp8_group_scale(group), &x);
             err != cudaSuccess) {
    return err;
  }
  bool shared = true;
  if (stacked(group)) {  // Q, K and V as one GEMM
    const ops::Weight whole = stacked_weight(group);
    const int64_t n = whole.tensor.ne[1], m = group[0]->x.n_rows();
    auto* d = static_cast<float*>(ctx.scratch(kSlotDst, static_cast<size_t>(n * m * 4)));
    if (d == nullptr) return cudaErrorMemoryAllocation;
    const cudaError_t err = fp8_gemm_f32(ctx, whole, x, m, d, n);
    if (err == cudaSuccess) return split_stacked(ctx, group, d);
    if (err != cudaErrorNotSupported) return err;
    shared = false;  // refused: the dequantizing path, matmul by matmul
  }
  for (const ops::Matmul* op : group) {
    cudaError_t err = shared ? fp8_gemm(ctx, *op, &x) : matmul_gemm(ctx, *op);
    if (err == cudaErrorNotSupported) {
      // cuBLASLt refused: this matmul and the rest of the group as single matmuls, which then take the
      // dequantizing path and convert x into slot X, over the shared rounding.
      shared = false;
      err = matmul_gemm(ctx, *op);
    }
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

cudaError_t matmul_gemm_group(const Context& ctx, std::span<const ops::Matmul* const> group) {
  // FP8 weights take the e4m3 GEMM a matmul at a time on x rounded once, not the dequantizing GEMM that a
  // stack or a shared converted x would send them to.
  if (fp8_gemm_applies(ctx, *group[0])) {
    if (gemm_takes_e4m3_x(ctx, group)) return fp8_gemm_group(ctx, group);
    for (const ops::Matmul* op : group) {
      if (const cudaError_t err = matmul_gemm(ctx, *op); err != cudaSuccess) return err;
    }
    return cudaSuccess;
  }
  cudaError_t err = cudaSuccess;
  const Operand x = gemm_x(ctx, group[0]->x, gemm_input_type(ctx, *group[0]), &err);
  if (err == cudaSuccess && stacked(group)) return stacked_gemm(ctx, group, x);
  for (const ops::Matmul* op : group) {
    if (err != cudaSuccess) break;
    err = gemm_on(ctx, *op, x);
  }
  return err;
}

bool gemm_takes_e4m3_x(const Context& ctx, std::span<const ops::Matmul* const> group) {
  return !group.empty() && std::all_of(group.begin(), group.end(),
                                       [&](const ops::Matmul* op) { return fp8_gemm_applies(ctx, *op); });
}

bool produced_e4m3_x(const Context& ctx, std::span<const ops::Matmul* const> group) {
  return gemm_takes_e4m3_x(ctx, group) && group[0]->x.n_rows() >= ctx.n_sms;
}

bool gemm_takes_half_x(const Context& ctx, const ops::Matmul& op) {
  // The e4m3 GEMM rounds f32 x itself (fp8_gemm.cu).
  return !takes_gemv(ctx, op) && !fp8_gemm_applies(ctx, op) && gemm_input_type(ctx, op) != DType::f32;
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

// 1-3 matmuls on one x that take the e4m3 GEMM (produced_e4m3_x), x rounded by the kernel that produces
// it: produce(e4) launches that kernel, given the room fp8_round_x would round into and the group's scale.
template <class Produce>
cudaError_t produced_fp8_group(const Context& ctx, std::span<const ops::Matmul* const> group,
                               Produce&& produce) {
  const Tensor& x = group[0]->x;
  E4m3Out e4{};
  if (const cudaError_t err = fp8_x_room(ctx, x.ne[0], x.n_rows(), fp8_group_scale(group), &e4);
      err != cudaSuccess) {
    return err;
  }
  if (const cudaError_t err = produce(e4); err != cudaSuccess) return err;
  const Fp8X rounded{e4.codes, e4.scales};
  return fp8_gemm_group(ctx, group, &rounded);
}

}  // namespace

cudaError_t add_norm_gemm_group(const Context& ctx, const ops::Binary& add, const ops::RmsNorm& norm,
                                std::span<const ops::Matmul* const> group) {
  if (produced_e4m3_x(ctx, group)) {
    return produced_fp8_group(ctx, group, [&](const E4m3Out& e4) {
      return add_rms_norm(ctx, add, norm, nullptr, nullptr, nullptr, false, &e4);
    });
  }
  return produced_gemm_group(ctx, group, [&](uint16_t* xh, bool f16) {
    return add_rms_norm(ctx, add, norm, nullptr, nullptr, xh, f16);
  });
}

cudaError_t glu_gemm_group(const Context& ctx, const ops::GatedAct& glu,
                           std::span<const ops::Matmul* const> group) {
  if (produced_e4m3_x(ctx, group)) {
    if (!gated_act_rounds_e4m3(glu)) return cudaErrorInvalidValue;
    return produced_fp8_group(ctx, group, [&](const E4m3Out& e4) {
      return gated_act(ctx, glu, nullptr, nullptr, nullptr, false, &e4);
    });
  }
  return produced_gemm_group(
      ctx, group, [&](uint16_t* xh, bool f16) { return gated_act(ctx, glu, nullptr, nullptr, xh, f16); });
}

cudaError_t attention_gemm_group(const Context& ctx, const ops::Attention& att,
                                 std::span<const ops::Matmul* const> group) {
  return produced_gemm_group(ctx, group,
                             [&](uint16_t* xh, bool f16) { return attention(ctx, att, xh, f16); });
}

}  // namespace kiln::cuda
