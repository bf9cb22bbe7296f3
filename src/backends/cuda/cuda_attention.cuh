// Internal to the CUDA attention kernels (cuda_attention.cu: the op and prefill; cuda_attention_decode.cu:
// decode): the shape of one Attention op as the kernels take it.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/cuda_kernels.h"

namespace kiln::cuda {

struct Geometry {
  int64_t head_dim, n_heads, n_kv, group, block_size, n_tokens;
  int64_t n_chunks;  // splits of each token's positions
  float scale, softcap;
  int32_t window;
  // Decode only: the result also rounded to 8 bits for the integer GEMV that reads it (the output
  // projection), in quantize_x's layout: row r's element d at xq + r * head_dim + d, its block's scales at
  // xds + (r * head_dim + d) / 32; head_dim a multiple of 32, so that a head's 32s are blocks of the matmul's
  // row. Null: not rounded.
  int8_t* xq;
  float2* xds;
};

__device__ inline float load(const float* p) { return *p; }
__device__ inline float load(const __half* p) { return __half2float(*p); }

// Decode-shaped batches (one or a few tokens a sequence): the split-KV kernels (cuda_attention_decode.cu).
// Chooses g.n_chunks.
cudaError_t attention_decode(const Context& ctx, const ops::Attention& op, Geometry g);

}  // namespace kiln::cuda
