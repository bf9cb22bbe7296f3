// Internal to the CUDA attention kernels (attention/attention.cu: the op and the exact prefill kernel;
// attention/attention_prefill.cu: prefill on tensor cores; attention/attention_decode.cu: decode): the shape
// of one Attention op as the kernels take it (and, by attention/kv_pool.cuh, the K/V pools' elements as they
// read them).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/attention/kv_pool.cuh"
#include "backends/cuda/cuda_kernels.h"

namespace kiln::cuda {

struct Geometry {
  int64_t head_dim, n_heads, n_kv, group, block_size, n_tokens;
  // Decode: the most chunks a token's positions split into (the grid's y), and the fewest positions a chunk:
  // a token whose span is shorter takes fewer chunks (live_chunks), the blocks past them return at once.
  int64_t n_chunks, min_chunk;
  float scale, softcap;
  int32_t window;
  // Decode only: the result also rounded to 8 bits for the integer GEMV that reads it (the output
  // projection), in quantize_x's layout: row r's element d at xq + r * head_dim + d, its block's scales at
  // xds + (r * head_dim + d) / 32; head_dim a multiple of 32, so that a head's 32s are blocks of the matmul's
  // row. Null: not rounded.
  int8_t* xq;
  float2* xds;
};

// The chunks a decode token of `span` positions splits into: as many of at least g.min_chunk positions as
// fit, from 1 to g.n_chunks. The split depends on the token alone (its position, the launch's geometry), so a
// token's result does not depend on the other tokens of its batch.
__host__ __device__ inline int64_t live_chunks(int64_t span, const Geometry& g) {
  const int64_t n = (span + g.min_chunk - 1) / g.min_chunk;
  return n < 1 ? 1 : n > g.n_chunks ? g.n_chunks : n;
}

// Decode-shaped batches (one or a few tokens a sequence): the split-KV kernels
// (attention/attention_decode.cu). Chooses g.n_chunks.
cudaError_t attention_decode(const Context& ctx, const ops::Attention& op, Geometry g);

// Whether token f of the tile's tokens [t0, t1) is the first of its sequence s = seq[f] there, which opens
// s's turn; if so, [lo, hi]: the positions any token of s in the tile sees (causal, window).
__device__ inline bool opens_turn(const int32_t* seq, const int32_t* positions, int64_t t0, int64_t f,
                                  int64_t t1, const Geometry& g, int32_t& lo, int32_t& hi) {
  const int32_t s = seq[f];
  bool first = true;
  for (int64_t e = t0; e < f && first; ++e) first = seq[e] != s;
  if (!first) return false;
  lo = INT32_MAX, hi = -1;
  for (int64_t e = f; e < t1; ++e) {
    if (seq[e] != s) continue;
    hi = max(hi, positions[e]);
    lo = min(lo, g.window > 0 ? max(0, positions[e] - g.window + 1) : 0);
  }
  return true;
}

// Prefill-shaped batches at the fast precision (attention/attention_prefill.cu): whether the tensor-core
// kernels take the op, and their launch.
bool mma_eligible(const Context& ctx, const ops::Attention& op, const Geometry& g);
cudaError_t attention_prefill_mma(const Context& ctx, const ops::Attention& op, const Geometry& g,
                                  uint16_t* xh, bool f16);

}  // namespace kiln::cuda
