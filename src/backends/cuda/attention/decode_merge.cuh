// Internal to the decode attention kernels (attention_decode.cu): the running softmax state of a query head,
// the store of a result row (rounded to 8 bits for the integer GEMV after it where Geometry says), and the
// merge of a split token's chunk records by the last of its blocks to finish.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/attention/attention.cuh"
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_round_q8.cuh"

namespace kiln::cuda {

// The running softmax state of one query head over the positions seen so far: max m, sum l of exp(s - m), and
// acc = sum exp(s - m) * v (the lane's dims).
template <int DPL>
struct State {
  float m = -INFINITY, l = 0.0f;
  float acc[DPL] = {};
};

template <int DPL>
__device__ inline void merge(State<DPL>& a, float m, float l, const float* acc) {
  const float mm = fmaxf(a.m, m);
  if (mm == -INFINITY) return;
  const float ca = a.m == -INFINITY ? 0.0f : expf(a.m - mm), cb = m == -INFINITY ? 0.0f : expf(m - mm);
  a.l = a.l * ca + l * cb;
  for (int j = 0; j < DPL; ++j) a.acc[j] = a.acc[j] * ca + acc[j] * cb;
  a.m = mm;
}

// Row `row` (head h of token t: h + n_heads * t) of the result, held by a warp (v[j]: element lane + 32 j),
// into y, and rounded to 8 bits where g.xq says (a block of 32 a j, as quantize_x_kernel rounds the stored
// values: the same bits).
template <int DPL>
__device__ void store_row(float* y, int64_t row, const float (&v)[DPL], const Geometry& g, int lane) {
#pragma unroll
  for (int j = 0; j < DPL; ++j) {
    const int64_t d = lane + 32 * j;
    if (d < g.head_dim) y[d] = v[j];
  }
  if (g.xq == nullptr) return;
#pragma unroll
  for (int j = 0; j < DPL; ++j) {
    if (32 * j < g.head_dim) {
      const int64_t i = row * g.head_dim + 32 * j;
      round_q8(v[j], g.xq + i + lane, g.xds + i / 32);
    }
  }
}

// The same for rows row0 .. row0 + n - 1 that this block's threads wrote to dst in another layout (before a
// __syncthreads): each warp reads its rows back and rounds them.
__device__ inline void round_rows(const Rows& dst, int64_t row0, int n, const Geometry& g) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
  for (int h = warp; h < n; h += n_warps) {
    const int64_t row = row0 + h;
    const float* y = dst.row_as<const float>(row);
    for (int64_t j = 0; 32 * j < g.head_dim; ++j) {
      const int64_t i = row * g.head_dim + 32 * j;
      round_q8(__ldcg(y + 32 * j + lane), g.xq + i + lane, g.xds + i / 32);
    }
  }
}

// One (token, head)'s chunk records (base: n <= 64 records, of the g.n_chunks a row holds, of head_dim + 2
// floats) scaled to their common maximum and summed in chunk order into dst row y, by one warp. Up to
// kFewChunks chunks, every record is loaded before the first is used: the merge waits on memory once. More:
// every chunk's maximum and sum are read at once (chunks lane and lane + 32), then the records' values,
// kMergeUnroll chunks in flight, about three waits. Both sum the same terms in the same order. The records
// were written by other blocks of the grid: they are read past L1 (__ldcg).
inline constexpr int kMaxChunks = 64;
inline constexpr int kFewChunks = 8;
template <int DPL>
__device__ void merge_chunks(const float* base, float* y, int64_t row, const Geometry& g, int64_t n,
                             int lane) {
  constexpr int kMergeUnroll = 8;
  const int64_t rec = g.head_dim + 2;
  float sum = 0.0f, acc[DPL] = {};
  if (n <= kFewChunks) {
    float m[kFewChunks], l[kFewChunks], v[kFewChunks][DPL];
#pragma unroll
    for (int c = 0; c < kFewChunks; ++c) {
      const bool on = c < n;
      const float* r = base + c * rec;
      m[c] = on ? __ldcg(r + g.head_dim) : -INFINITY;
      l[c] = on ? __ldcg(r + g.head_dim + 1) : 0.0f;
#pragma unroll
      for (int k = 0; k < DPL; ++k) {
        const int64_t d = lane + 32 * k;
        v[c][k] = on && d < g.head_dim ? __ldcg(r + d) : 0.0f;
      }
    }
    float mx = -INFINITY;
#pragma unroll
    for (int c = 0; c < kFewChunks; ++c) mx = fmaxf(mx, m[c]);
    if (mx != -INFINITY) {
#pragma unroll
      for (int c = 0; c < kFewChunks; ++c) {
        if (c >= n) break;
        const float e = m[c] == -INFINITY ? 0.0f : expf(m[c] - mx);
        sum += l[c] * e;
#pragma unroll
        for (int k = 0; k < DPL; ++k) acc[k] += v[c][k] * e;
      }
    }
  } else {
    float m[2], l[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t c = lane + 32 * h;
      m[h] = c < n ? __ldcg(base + c * rec + g.head_dim) : -INFINITY;
      l[h] = c < n ? __ldcg(base + c * rec + g.head_dim + 1) : 0.0f;
    }
    const float mx = warp_max(fmaxf(m[0], m[1]));
    if (mx != -INFINITY) {
      float e[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) e[h] = m[h] == -INFINITY ? 0.0f : expf(m[h] - mx);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t c0 = 32 * h;
#pragma unroll kMergeUnroll
        for (int j = 0; j < 32; ++j) {
          if (c0 + j >= n) break;
          const float* r = base + (c0 + j) * rec;
          const float ej = __shfl_sync(0xffffffffu, e[h], j);
          sum += __shfl_sync(0xffffffffu, l[h], j) * ej;
#pragma unroll
          for (int k = 0; k < DPL; ++k) {
            const int64_t d = lane + 32 * k;
            acc[k] += (d < g.head_dim ? __ldcg(r + d) : 0.0f) * ej;
          }
        }
      }
    }
  }
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
#pragma unroll
  for (int k = 0; k < DPL; ++k) acc[k] *= inv;
  store_row<DPL>(y, row, acc, g, lane);
}

// The end of a split block whose records are written: the last chunk of these heads to finish merges them
// all (no second kernel), its own records and those the others made visible (fence, then count), in chunk
// order. done[blockIdx.x] is reset for the next launch (a graph replays this one).
template <int DPL>
__device__ void merge_if_last(const float* partial, unsigned* done, const Rows& dst, const Geometry& g,
                              int64_t row0, int n_q, int64_t n) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(done + blockIdx.x, 1u) == static_cast<unsigned>(n - 1);
    if (last) done[blockIdx.x] = 0;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
  const int64_t rec = g.head_dim + 2;
  for (int h = warp; h < n_q; h += n_warps) {
    const int64_t row = row0 + h;
    merge_chunks<DPL>(partial + row * g.n_chunks * rec, dst.row_as<float>(row), row, g, n, lane);
  }
}

}  // namespace kiln::cuda
