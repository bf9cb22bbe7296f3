// x rounded to 8 bits per block of 32, as the integer GEMV reads it (matmul/dot_q8.cuh): by the kernel that
// does nothing else (quantize_x_kernel, matmul/matmul.cu) or by the norm that produces x (norm_rope/norm.cu),
// the same bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kiln::cuda {

// v is this lane's element of a block of 32 that the warp's lanes hold in order (element j in lane j): stores
// q = round(v / d), d = max|v| / 127 over the block, at *q, and lane 0 stores {d, d * sum(q)} at *ds. A block
// holding a NaN gets a NaN scale, so that the products stay NaN as on the exact path.
__device__ inline void round_q8(float v, int8_t* q, float2* ds) {
  float amax = fabsf(v);
#pragma unroll
  for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
  const bool nan = __any_sync(0xFFFFFFFFu, v != v);
  const float d = nan ? __int_as_float(0x7FC00000) : amax / 127.0f;
  const int qi = amax > 0.0f && !nan ? max(-127, min(127, __float2int_rn(v / d))) : 0;
  int sum = qi;
#pragma unroll
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
  *q = static_cast<int8_t>(qi);
  if (threadIdx.x % 32 == 0) *ds = make_float2(d, d * static_cast<float>(sum));
}

}  // namespace kiln::cuda
