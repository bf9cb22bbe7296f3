// The warp-level tensor-core product (mma.sync, sm_80 and newer) as the kernels here use it: m16n8k16 with
// f16 operands and f32 accumulators, and the packing of two floats into its f16 pair. Fragment layouts (PTX
// ISA, "Matrix Fragments for mma.m16n8k16"): lane l, g = l / 4, t = l % 4, holds A[g][2t, 2t + 1] (a[0]),
// A[g + 8][2t, 2t + 1] (a[1]), A[g][2t + 8, 2t + 9] (a[2]), A[g + 8][2t + 8, 2t + 9] (a[3]); B[2t, 2t + 1][g]
// (b0), B[2t + 8, 2t + 9][g] (b1); C[g][2t, 2t + 1] (c[0], c[1]), C[g + 8][2t, 2t + 1] (c[2], c[3]).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace kiln::cuda {

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// c += a * b: one m16n8k16 tensor-core product (A 16x16 row-major, B 16x8 column-major, f32 accumulators).
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace kiln::cuda
