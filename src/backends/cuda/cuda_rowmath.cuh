// The arithmetic of the gated activations, shared by their own kernels (elementwise/elementwise.cu) and by
// the GEMV that applies one as it stores the gate and up rows it computes (matmul/matmul.cu, GemvPair), so
// that both give the same bits. Every operation is written as the intrinsic that rounds it, so the compiler
// cannot contract a product and a sum into one fma in one kernel and not in the other. Also the 16-bit copy
// of a result that a kernel writes for the GEMM after it (norms, activations, attention), rounded as the
// GEMM's own conversion.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/ops.h"

namespace kiln::cuda {

// The activation of a gate value.
__device__ __forceinline__ float glu(ops::GluKind kind, float g) {
  switch (kind) {
    case ops::GluKind::glu_kind_silu: return __fdiv_rn(g, __fadd_rn(1.0f, expf(-g)));
    case ops::GluKind::glu_kind_sigmoid: return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g)));
    case ops::GluKind::glu_kind_gelu_tanh: break;
  }
  constexpr float c = 0.7978845608028654f;  // sqrt(2 / pi)
  const float inner = __fmul_rn(c, __fadd_rn(g, __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, g), g), g)));
  return __fmul_rn(__fmul_rn(0.5f, g), __fadd_rn(1.0f, tanhf(inner)));
}

// The gated activation's output element: act(gate) * up.
__device__ __forceinline__ float glu_times(ops::GluKind kind, float gate, float up) {
  return __fmul_rn(glu(kind, gate), up);
}

// A row of a GEMM's 16-bit input that a kernel writes beside its f32 result: bf16, or f16 when f16.
struct HalfCopy {
  char* row = nullptr;
  bool f16 = false;
};
// The result also as a GEMM's 16-bit input: bf16, or f16 saturated to its range, rounded as
// matmul/convert.cuh's convert_rows8_kernel rounds x for cuBLAS, so the GEMM reads the same bits.
__device__ inline void store_half(const HalfCopy& h, int64_t i, float v) {
  if (h.f16) {
    reinterpret_cast<__half*>(h.row)[i] = __float2half_rn(fminf(fmaxf(v, -65504.0f), 65504.0f));
  } else {
    reinterpret_cast<__nv_bfloat16*>(h.row)[i] = __float2bfloat16_rn(v);
  }
}

// Elements i .. i + 3 (i a multiple of 4, the row 8-byte aligned) as store_half rounds them, in one store.
__device__ inline void store_half4(const HalfCopy& h, int64_t i, const float (&v)[4]) {
  uint16_t b[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (h.f16) {
      const __half x = __float2half_rn(fminf(fmaxf(v[j], -65504.0f), 65504.0f));
      b[j] = *reinterpret_cast<const uint16_t*>(&x);
    } else {
      const __nv_bfloat16 x = __float2bfloat16_rn(v[j]);
      b[j] = *reinterpret_cast<const uint16_t*>(&x);
    }
  }
  *reinterpret_cast<uint2*>(h.row + 2 * i) =
      make_uint2(b[0] | uint32_t{b[1]} << 16, b[2] | uint32_t{b[3]} << 16);
}

// Elements i and i + 1 (i even, the row 4-byte aligned) as store_half rounds them, in one store.
__device__ inline void store_half2(const HalfCopy& h, int64_t i, float a, float b) {
  uint32_t bits;
  if (h.f16) {
    const __half2 x =
        __floats2half2_rn(fminf(fmaxf(a, -65504.0f), 65504.0f), fminf(fmaxf(b, -65504.0f), 65504.0f));
    bits = *reinterpret_cast<const uint32_t*>(&x);
  } else {
    const __nv_bfloat162 x = __floats2bfloat162_rn(a, b);
    bits = *reinterpret_cast<const uint32_t*>(&x);
  }
  *reinterpret_cast<uint32_t*>(h.row + 2 * i) = bits;
}

}  // namespace kiln::cuda
