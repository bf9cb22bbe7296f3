// Internal to the Matmul kernels (matmul.cu: the entry point and the GEMVs; matmul_gemm.cu: the GEMMs):
// scratch slots, row helpers, and the GEMM path of one matmul.
#pragma once

#include <cstdint>
#include <span>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/matmul/gemv.cuh"

namespace kiln::cuda {

inline constexpr int kMaxGridY = 65535;
inline constexpr int kPieceThreads = 128;  // threads per block of the elementwise kernels (one piece each)

// Scratch slots of one matmul.
inline constexpr int kSlotW = 0, kSlotX = 1, kSlotDst = 2;

// A contiguous [ne0, n_rows] matrix of elements of `elem` bytes.
inline Rows packed_rows(void* data, int64_t ne0, int64_t n_rows, int elem) {
  const int64_t ld = ne0 * elem;
  return {static_cast<char*>(data), n_rows, 1, ld, ld * n_rows, ld * n_rows};
}

inline Ids ids_of(const Tensor& t) { return {static_cast<const char*>(t.data), t.ne[0], t.nb[0], t.nb[1]}; }

inline int elem_bytes(DType float_type) { return float_type == DType::f32 ? 4 : 2; }

inline bool aligned(const void* p, int64_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// x_vec: the GEMV reads x as float4 when every x row it may read is 16-byte aligned.
inline bool rows_aligned16(const Tensor& t) {
  return aligned(t.data, 16) && t.nb[1] % 16 == 0 && t.nb[2] % 16 == 0 && t.nb[3] % 16 == 0;
}

// f32 rows [ne0, n_rows] to rows of dst_type (saturate: to f16's range) in another layout.
cudaError_t convert_rows(const Context& ctx, const Rows& src, int64_t ne0, int64_t n_rows, const Rows& dst,
                         DType dst_type, bool saturate = false);

// The leading dimension (in elements of `elem` bytes) of t as a column-major [ne0, n_rows] matrix, or 0 when
// its rows are not equally spaced at a multiple of the element size.
int64_t leading_dim(const Tensor& t, int elem);

// The FP8 tensor-core GEMM of an f8_e4m3 weight (fp8_gemm.cu): whether it takes `op` (the fast precision, not
// batch-invariant, more than kGemvMaxCols rows of x, k and n multiples of 16), and the GEMM, which fails
// (cudaErrorNotSupported) where cuBLASLt has no algorithm for it: matmul_gemm then takes its other path.
bool fp8_gemm_applies(const Context& ctx, const ops::Matmul& op);
// x rounded to e4m3 (codes [k, rows] and a scale a row) in scratch slot X, for the GEMMs on it: each row by
// its own largest value (scale 0), or all by a static scale (ops::Weight::input_scale), saturating.
struct Fp8X {
  const uint8_t* codes;
  const float* scales;
};
cudaError_t fp8_round_x(const Context& ctx, const Tensor& x, float scale, Fp8X* out);
// The room fp8_round_x takes for m rows of k (slot X), for a kernel that rounds x as it writes it (E4m3Out,
// `fixed` its static scale or 0).
cudaError_t fp8_x_room(const Context& ctx, int64_t k, int64_t m, float fixed, E4m3Out* out);
// The static scale that a group of matmuls on one x (Q, K and V; gate and up) rounds it with: the largest of
// their weights' input_scale, so that no value saturates that would not under its own (vLLM's choice for
// its fused projections); 0 (per token) unless each has one.
float fp8_group_scale(std::span<const ops::Matmul* const> group);
// `rounded`: op.x as fp8_round_x left it (a fused group's matmuls share it); null: rounded here.
cudaError_t fp8_gemm(const Context& ctx, const ops::Matmul& op, const Fp8X* rounded = nullptr);
// 1-3 matmuls on one x that each take the e4m3 GEMM (fp8_gemm_applies), x rounded once with the group's
// scale (fp8_group_scale), or as `rounded` gives it: Q/K/V stacked as one GEMM (WeightLayout), the others a
// GEMM each. A GEMM cuBLASLt refuses runs, with the rest of the group, on the dequantizing path from f32 x.
cudaError_t fp8_gemm_group(const Context& ctx, std::span<const ops::Matmul* const> group,
                           const Fp8X* rounded = nullptr);
// The GEMM alone: d (f32, column j of token i at d[i * ldd + j]) = the weight times the m rows of x, scratch
// slots W and Partial; cudaErrorNotSupported where cuBLASLt refuses it (fp8_wgmma.cu's kernel takes 9 to 64
// rows on Hopper).
cudaError_t fp8_gemm_f32(const Context& ctx, const ops::Weight& weight, const Fp8X& x, int64_t m, float* d,
                         int64_t ldd);

// One e4m3 GEMM's operands: d (f32, column j of row i at d[i * ldd + j]) = sx[i] sw[j] sum_k x[i, k] w[j, k],
// x's m rows of codes at x + i * k, the weight's n rows at w + j * ldw (16-byte aligned, k a multiple of 16).
// w_constant: the codes lie where the weight does (not rewritten into scratch by this stream).
struct Fp8Operands {
  const uint8_t* w;
  int64_t ldw;
  const float* w_scales;
  bool w_constant;
  const uint8_t* x;
  const float* x_scales;
  float* d;
  int64_t ldd;
  int64_t n, m, k;
};
// The warpgroup e4m3 GEMM (fp8_wgmma.cu): whether it takes m rows of x here (a Hopper device, a build with
// its sm_90a code, a driver that encodes tensor maps, kGemvMaxCols < m <= 64), and the GEMM
// (cudaErrorNotSupported where no tensor map describes the operands).
bool fp8_wgmma_applies(const Context& ctx, int64_t m);
cudaError_t fp8_wgmma_gemm(const Context& ctx, const Fp8Operands& o);

// One matmul through cuBLAS (matmul_gemm.cu): x converted to the GEMM's input type, the weight in place or
// dequantized into scratch, the f32 result converted into dst where dst is not f32 with equally spaced rows.
cudaError_t matmul_gemm(const Context& ctx, const ops::Matmul& op);

}  // namespace kiln::cuda
