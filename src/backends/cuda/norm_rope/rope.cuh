// RoPE's arithmetic on the device, shared by the kernels that rotate (norm_rope/rope.cu's, and the Q/K/V GEMV
// that rotates q and k as it stores them: matmul/gemv.cuh), so that every path computes the same cos/sin and
// rounds the rotation alike: the same bits, fused or not.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/rope_freq.h"

namespace kiln::cuda {

// Each pair's frequency and magnitude (ops::rope_freq: a double pow, more under YaRN), made on the host as
// the CPU backend makes them and passed by value, when there are at most kRopeArgPairs pairs and no frequency
// factors (a tensor in device memory); else (on = false) each kernel makes them itself.
inline constexpr int kRopeArgPairs = 128;
struct RopeFreqs {
  ops::RopeFreq f[kRopeArgPairs];
  bool on;
};
RopeFreqs host_rope_freqs(const ops::RopeParams& p, const void* factors);

// cos and sin of a pair of frequency f at position pos, times its magnitude: the angle in double, as the CPU
// backend computes it.
__device__ __forceinline__ float2 rope_cs(const ops::RopeFreq& f, int32_t pos) {
  const double angle = static_cast<double>(pos) * f.theta_scale;
  return make_float2(static_cast<float>(cos(angle) * f.mscale), static_cast<float>(sin(angle) * f.mscale));
}

// Pair (xa, xb) rotated by cs_sn = (cos, sin), each product rounded as written (no contraction left to the
// compiler), so that every RoPE kernel, fused or not, gets the same bits whatever code surrounds it.
__device__ __forceinline__ float2 rope_rotate(float xa, float xb, float2 cs_sn) {
  return make_float2(__fmaf_rn(xa, cs_sn.x, -__fmul_rn(xb, cs_sn.y)),
                     __fmaf_rn(xa, cs_sn.y, __fmul_rn(xb, cs_sn.x)));
}

}  // namespace kiln::cuda
