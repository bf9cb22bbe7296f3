// The rounding of x to e4m3 for the FP8 GEMM (fp8_gemm.cu), shared by the kernel that rounds x on its own
// (fp8_x_rows) and the kernels that round their result as they write it (the add + RMSNorm, the gated
// activation: cuda_kernels.h's E4m3Out), so that both give the GEMM the same bits: the row's scale from its
// largest magnitude, or the checkpoint's static scale, then each value divided by it (correctly rounded) and
// converted saturating at 448.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

namespace kiln::cuda {

inline constexpr float kE4M3Max = 448.0f;

// The scale of a row: `fixed` (a static scale, > 0), else amax / 448 (1 for a row of zeros).
__device__ __forceinline__ float fp8_row_scale(float amax, float fixed) {
  if (fixed > 0.0f) return fixed;
  return amax > 0.0f ? __fdiv_rn(amax, kE4M3Max) : 1.0f;
}

// The largest of a and the magnitudes of u's four values (a row's largest value, four at a time).
__device__ __forceinline__ float amax4(float a, float4 u) {
  return fmaxf(fmaxf(a, fmaxf(fabsf(u.x), fabsf(u.y))), fmaxf(fabsf(u.z), fabsf(u.w)));
}

// v / s as an e4m3 code, saturating.
__device__ __forceinline__ uint8_t fp8_code(float v, float s) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(__fdiv_rn(v, s), __NV_SATFINITE, __NV_E4M3));
}

// Four values as four codes, the first in the lowest byte.
__device__ __forceinline__ uint32_t fp8_codes4(float a, float b, float c, float d, float s) {
  return static_cast<uint32_t>(fp8_code(a, s)) | static_cast<uint32_t>(fp8_code(b, s)) << 8 |
         static_cast<uint32_t>(fp8_code(c, s)) << 16 | static_cast<uint32_t>(fp8_code(d, s)) << 24;
}

}  // namespace kiln::cuda
