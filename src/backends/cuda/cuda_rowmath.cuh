// The arithmetic of the gated activations, shared by their own kernels (cuda_ops.cu) and by the GEMV that
// applies one as it stores the gate and up rows it computes (cuda_matmul.cu, GemvPair), so that both give the
// same bits. Every operation is written as the intrinsic that rounds it, so the compiler cannot contract a
// product and a sum into one fma in one kernel and not in the other.
#pragma once

#include <cuda_runtime.h>

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

}  // namespace kiln::cuda
