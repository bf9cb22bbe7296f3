// The elementwise and other row-wise ops on CUDA: softmax, argmax, gated activations, add/mul, scale, MoE
// routing and mixing (the norms: norm_rope/norm.cu; RoPE and the KV writes: norm_rope/rope.cu). Bound by
// memory traffic: one pass over their operands, f32 arithmetic, rows addressed through their views' strides.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_launch.cuh"
#include "backends/cuda/cuda_round_q8.cuh"
#include "backends/cuda/cuda_rowmath.cuh"
#include "backends/cuda/matmul/fp8_round.cuh"

namespace kiln::cuda {

namespace {

constexpr int kThreads = 256;

cudaError_t launched() { return cudaGetLastError(); }

// ---- softmax, argmax: one block per row ----

__global__ void softmax_kernel(Rows x, Rows dst, float scale, int64_t n, int64_t n_rows) {
  pdl_begin();
  __shared__ float red[32];
  for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
    const float* xr = x.row_as<const float>(r);
    float* yr = dst.row_as<float>(r);
    float mx = -INFINITY;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) mx = fmaxf(mx, xr[i] * scale);
    mx = block_max(mx, red);
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += expf(xr[i] * scale - mx);
    const float inv = 1.0f / block_sum(s, red);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = expf(xr[i] * scale - mx) * inv;
  }
}

// Whether (v, i) comes before (bv, bi): larger, or equal and earlier (the first index on ties).
__device__ inline bool better(float v, int64_t i, float bv, int64_t bi) {
  return v > bv || (v == bv && i < bi);
}

// One block's best (value, index) of the elements [lo, hi) of xr (bi = n: none), and whether any is a NaN
// or +inf; the block's thread 0 holds the result.
struct Best {
  float v;
  int bad;  // 0 or 1
  int64_t i;
};
__device__ inline void take(Best& a, float v, int64_t i, int64_t n) {
  if (i != n && (a.i == n || better(v, i, a.v, a.i))) a.v = v, a.i = i;
}
__device__ Best block_argmax(const float* xr, int64_t lo, int64_t hi, int64_t n) {
  __shared__ float sv[32];
  __shared__ int64_t si[32];
  Best b{-INFINITY, 0, n};
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    const float v = xr[i];
    b.bad = b.bad || isnan(v) || v == INFINITY ? 1 : 0;
    take(b, v, i, n);
  }
  b.bad = __syncthreads_or(b.bad) != 0 ? 1 : 0;
  for (int o = 16; o > 0; o >>= 1) {
    take(b, __shfl_xor_sync(0xffffffffu, b.v, o), __shfl_xor_sync(0xffffffffu, b.i, o), n);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) sv[warp] = b.v, si[warp] = b.i;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) take(b, sv[w], si[w], n);
  }
  __syncthreads();  // sv / si are free for the next call
  return b;
}

// Row r's elements in gridDim.y slices, a block each. With one slice the block writes out[r]; with several
// each writes its best to part[r * slices + slice], then counts itself done (done[r]: zero before the launch
// and after it), and the last of them takes the best of all slices. The order of (value, index) is total,
// so the result does not depend on which block is last.
__global__ void argmax_kernel(Rows x, int32_t* out, int64_t n, int64_t n_rows, Best* part, unsigned* done) {
  pdl_begin();
  const int64_t slices = gridDim.y, len = (n + slices - 1) / slices;
  const int64_t lo = blockIdx.y * len, hi = min(n, lo + len);
  __shared__ bool last;
  for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
    Best b = block_argmax(x.row_as<const float>(r), lo, hi, n);
    if (slices > 1) {
      if (threadIdx.x == 0) {
        part[r * slices + blockIdx.y] = b;
        __threadfence();
        last = atomicAdd(done + r, 1u) == static_cast<unsigned>(slices - 1);
        if (last) done[r] = 0;  // for the next launch (a graph replays this one)
      }
      __syncthreads();
      if (!last) continue;
      if (threadIdx.x == 0) {
        __threadfence();
        for (int64_t s = 0; s < slices; ++s) {  // written by other blocks: read past L1
          const Best* o = part + r * slices + s;
          const auto oi = static_cast<int64_t>(__ldcg(reinterpret_cast<const long long*>(&o->i)));
          take(b, __ldcg(&o->v), oi, n);
          b.bad |= __ldcg(&o->bad);
        }
      }
    }
    if (threadIdx.x == 0) out[r] = b.bad || b.v == -INFINITY ? -1 : static_cast<int32_t>(b.i);
  }
}

// ---- elementwise: one thread per element ----

// xq / xds (n a multiple of 32, f32 dst): each warp's 32 consecutive elements are one block of a row, also
// rounded to 8 bits there (round_q8).
// xh: the result also in 16 bits (store_half), row r at xh + r * n.
__global__ void gated_act_kernel(Rows gate, Rows up, Rows dst, Store st, ops::GluKind kind, bool broadcast,
                                 int64_t n, int64_t total, int8_t* xq, float2* xds, uint16_t* xh, bool f16) {
  pdl_begin();
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const DivMod ri = divmod(e, n);
    const int64_t r = ri.q, i = ri.r;
    const float g = gate.row_as<const float>(r)[broadcast ? 0 : i];
    const float v = glu_times(kind, g, up.row_as<const float>(r)[i]);
    store(st, dst.row(r), i, v);
    if (xq != nullptr) round_q8(v, xq + r * n + i, xds + r * (n / 32) + i / 32);
    if (xh != nullptr) store_half({reinterpret_cast<char*>(xh + r * n), f16}, i, v);
  }
}

// The same without a broadcast gate or the 8-bit rounding, 4 elements a thread (16-byte loads) for rows of a
// multiple of 4 that start 16-byte aligned (prefill: the per-element kernel moved half the bytes the memory
// could).
__global__ void gated_act4_kernel(Rows gate, Rows up, Rows dst, Store st, ops::GluKind kind, int64_t n,
                                  int64_t total, uint16_t* xh, bool f16) {
  pdl_begin();
  const int64_t n4 = n / 4;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total / 4;
       e += int64_t{gridDim.x} * blockDim.x) {
    const DivMod ri = divmod(e, n4);
    const int64_t r = ri.q, i = 4 * ri.r;
    const float4 g = *reinterpret_cast<const float4*>(gate.row_as<const float>(r) + i);
    const float4 u = *reinterpret_cast<const float4*>(up.row_as<const float>(r) + i);
    const float v[4] = {glu_times(kind, g.x, u.x), glu_times(kind, g.y, u.y), glu_times(kind, g.z, u.z),
                        glu_times(kind, g.w, u.w)};
    char* y = dst.row(r);
    if (st == Store::f32) {
      *reinterpret_cast<float4*>(reinterpret_cast<float*>(y) + i) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) store(st, y, i + j, v[j]);
    }
    if (xh != nullptr) store_half4(HalfCopy{reinterpret_cast<char*>(xh + r * n), f16}, i, v);
  }
}

// The same, also rounded to e4m3 for the FP8 GEMM (E4m3Out), a block a row: a thread's first kActVec groups
// of 4 kept in registers until the row's scale is known (its largest magnitude, over the block); groups past
// them, read back from dst (this thread's own stores: the gate may be dst).
constexpr int kActVec = 4;
__global__ void __launch_bounds__(1024)
    gated_act_e4m3_kernel(Rows gate, Rows up, Rows dst, ops::GluKind kind, int64_t n, E4m3Out e4) {
  pdl_begin();
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  const float* gr = gate.row_as<const float>(r);
  const float* ur = up.row_as<const float>(r);
  float* yr = dst.row_as<float>(r);
  const int64_t step = 4 * int64_t{blockDim.x}, first = 4 * int64_t{threadIdx.x};
  const auto act4 = [&](int64_t e) {
    const float4 g = *reinterpret_cast<const float4*>(gr + e);
    const float4 u = *reinterpret_cast<const float4*>(ur + e);
    const float4 v = make_float4(glu_times(kind, g.x, u.x), glu_times(kind, g.y, u.y),
                                 glu_times(kind, g.z, u.z), glu_times(kind, g.w, u.w));
    *reinterpret_cast<float4*>(yr + e) = v;
    return v;
  };
  float4 v[kActVec];
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < kActVec; ++j) {
    const int64_t e = first + j * step;
    v[j] = e < n ? act4(e) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    amax = amax4(amax, v[j]);
  }
  for (int64_t e = first + kActVec * step; e < n; e += step) amax = amax4(amax, act4(e));
  if (e4.fixed <= 0.0f) amax = block_max(amax, red);
  const float s = fp8_row_scale(amax, e4.fixed);
  if (threadIdx.x == 0) e4.scales[r] = s;
  uint8_t* out = e4.codes + r * n;
#pragma unroll
  for (int j = 0; j < kActVec; ++j) {
    const int64_t e = first + j * step;
    if (e < n) *reinterpret_cast<uint32_t*>(out + e) = fp8_codes4(v[j].x, v[j].y, v[j].z, v[j].w, s);
  }
  for (int64_t e = first + kActVec * step; e < n; e += step) {
    const float4 y = *reinterpret_cast<const float4*>(yr + e);
    *reinterpret_cast<uint32_t*>(out + e) = fp8_codes4(y.x, y.y, y.z, y.w, s);
  }
}

__global__ void binary_kernel(Rows a, Rows b, Rows dst, Store st, bool mul, bool b_one_row, int64_t n,
                              int64_t total) {
  pdl_begin();
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const DivMod ri = divmod(e, n);
    const int64_t r = ri.q, i = ri.r;
    const float av = a.row_as<const float>(r)[i], bv = b.row_as<const float>(b_one_row ? 0 : r)[i];
    store(st, dst.row(r), i, mul ? av * bv : av + bv);
  }
}

__global__ void scale_kernel(Rows x, Rows dst, float s, int64_t n, int64_t total) {
  pdl_begin();
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const DivMod ri = divmod(e, n);
    const int64_t r = ri.q, i = ri.r;
    dst.row_as<float>(r)[i] = x.row_as<const float>(r)[i] * s;
  }
}

// ---- MoE routing (one thread per token) and mixing (one thread per output element) ----

__global__ void moe_route_kernel(Rows logits, int32_t* ids, Rows weights, int64_t n_expert, int64_t n_used,
                                 bool normalize, int64_t n_tokens) {
  pdl_begin();
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < n_tokens;
       t += int64_t{gridDim.x} * blockDim.x) {
    const float* x = logits.row_as<const float>(t);
    float mx = -INFINITY;
    for (int64_t e = 0; e < n_expert; ++e) mx = fmaxf(mx, x[e]);
    float sum = 0.0f;
    for (int64_t e = 0; e < n_expert; ++e) sum += expf(x[e] - mx);
    int32_t* id = ids + n_used * t;
    float chosen = 0.0f;
    // Repeated maximum over the experts not chosen yet: strictly larger logits win, so ties keep the lower
    // index. "Not chosen" is a scan of the ids so far (n_used is small).
    for (int64_t s = 0; s < n_used; ++s) {
      int64_t best = -1;
      for (int64_t e = 0; e < n_expert; ++e) {
        bool taken = false;
        for (int64_t u = 0; u < s; ++u) taken = taken || id[u] == e;
        if (!taken && (best < 0 || x[e] > x[best])) best = e;
      }
      id[s] = static_cast<int32_t>(best);
      chosen += expf(x[best] - mx) / sum;
    }
    float* w = weights.row_as<float>(t);
    for (int64_t s = 0; s < n_used; ++s) w[s] = expf(x[id[s]] - mx) / sum / (normalize ? chosen : 1.0f);
  }
}

__global__ void weighted_sum_kernel(Rows y, Rows w, Rows dst, int64_t n, int64_t n_slots, int64_t total) {
  pdl_begin();
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const DivMod ti = divmod(e, n);
    const int64_t t = ti.q, i = ti.r;
    const float* wt = w.row_as<const float>(t);
    float acc = 0.0f;
    for (int64_t s = 0; s < n_slots; ++s) acc += wt[s] * y.row_as<const float>(s + n_slots * t)[i];
    dst.row_as<float>(t)[i] = acc;
  }
}

}  // namespace

cudaError_t softmax(const Context& ctx, const ops::Softmax& op) {
  const int64_t n = op.x.ne[0], rows = op.x.n_rows();
  (void)launch_kernel(ctx, softmax_kernel, grid_for(rows, 1), row_threads(n), 0, rows_of(op.x),
                      rows_of(op.dst), op.scale, n, rows);
  return launched();
}

cudaError_t argmax(const Context& ctx, const ops::Argmax& op) {
  const int64_t n = op.x.ne[0], rows = op.x.n_rows();
  // A few long rows (a vocabulary's logits, a token or a few decoding) are split over the multiprocessors, at
  // least kArgmaxMinSlice elements a block.
  constexpr int64_t kArgmaxMinSlice = 4096;
  const int64_t slices = std::clamp<int64_t>(
      std::min<int64_t>(ctx.n_sms / std::max<int64_t>(rows, 1), n / kArgmaxMinSlice), 1, 64);
  Best* part = nullptr;
  unsigned* done = nullptr;
  if (slices > 1) {
    part = static_cast<Best*>(ctx.scratch(kSlotPartial, sizeof(Best) * rows * slices));
    done = static_cast<unsigned*>(ctx.scratch(kSlotCounters, sizeof(unsigned) * rows));
    if (part == nullptr || done == nullptr) return cudaErrorMemoryAllocation;
  }
  const dim3 grid(grid_for(rows, 1), static_cast<unsigned>(slices));
  (void)launch_kernel(ctx, argmax_kernel, grid, row_threads(slices > 1 ? n / slices : n), 0, rows_of(op.x),
                      static_cast<int32_t*>(op.out.data), n, rows, part, done);
  return launched();
}

bool gated_act_rounds_e4m3(const ops::GatedAct& op) {
  const int64_t n = op.up.ne[0];
  return op.dst.type == DType::f32 && op.gate.ne[0] == n && n % 4 == 0 && op.up.n_rows() <= 0x7fffffff &&
         rows_aligned16(rows_of(op.gate)) && rows_aligned16(rows_of(op.up)) &&
         rows_aligned16(rows_of(op.dst));
}

cudaError_t gated_act(const Context& ctx, const ops::GatedAct& op, int* xq, float2* xds, uint16_t* xh,
                      bool f16, const E4m3Out* e4) {
  const int64_t n = op.up.ne[0], total = n * op.up.n_rows();
  if (e4 != nullptr) {
    if (!gated_act_rounds_e4m3(op) || xq != nullptr || xh != nullptr) return cudaErrorInvalidValue;
    // Threads enough for each to hold kActVec groups of the row, at most 1024.
    const int threads = row_threads(std::max<int64_t>(1, n / (4 * kActVec)));
    (void)launch_kernel(ctx, gated_act_e4m3_kernel, static_cast<unsigned>(op.up.n_rows()), threads, 0,
                        rows_of(op.gate), rows_of(op.up), rows_of(op.dst), op.kind, n, *e4);
    return launched();
  }
  if (xq != nullptr && (n % 32 != 0 || op.dst.type != DType::f32)) return cudaErrorInvalidValue;
  const bool broadcast = op.gate.ne[0] == 1 && n > 1;
  const Rows gate = rows_of(op.gate), up = rows_of(op.up), dst = rows_of(op.dst);
  if (xq == nullptr && !broadcast && n % 4 == 0 && rows_aligned16(gate) && rows_aligned16(up) &&
      rows_aligned16(dst)) {
    (void)launch_kernel(ctx, gated_act4_kernel, grid_for(total / 4, kThreads), kThreads, 0, gate, up, dst,
                        store_of(op.dst.type), op.kind, n, total, xh, f16);
    return launched();
  }
  (void)launch_kernel(ctx, gated_act_kernel, grid_for(total, kThreads), kThreads, 0, rows_of(op.gate),
                      rows_of(op.up), rows_of(op.dst), store_of(op.dst.type), op.kind,
                      op.gate.ne[0] == 1 && n > 1, n, total, reinterpret_cast<int8_t*>(xq), xds, xh, f16);
  return launched();
}

cudaError_t binary(const Context& ctx, const ops::Binary& op) {
  const int64_t n = op.a.ne[0], total = n * op.a.n_rows();
  (void)launch_kernel(ctx, binary_kernel, grid_for(total, kThreads), kThreads, 0, rows_of(op.a),
                      rows_of(op.b.tensor), rows_of(op.dst), store_of(op.dst.type),
                      op.kind == ops::BinaryKind::binary_kind_mul, op.b.tensor.n_rows() == 1, n, total);
  return launched();
}

cudaError_t scale(const Context& ctx, const ops::Scale& op) {
  const int64_t n = op.x.ne[0], total = n * op.x.n_rows();
  (void)launch_kernel(ctx, scale_kernel, grid_for(total, kThreads), kThreads, 0, rows_of(op.x),
                      rows_of(op.dst), op.scale, n, total);
  return launched();
}

cudaError_t moe_route(const Context& ctx, const ops::MoeRoute& op) {
  const int64_t n_tokens = op.logits.n_rows();
  (void)launch_kernel(ctx, moe_route_kernel, grid_for(n_tokens, 64), 64, 0, rows_of(op.logits),
                      static_cast<int32_t*>(op.ids.data), rows_of(op.weights), op.logits.ne[0],
                      op.weights.ne[0], op.normalize, n_tokens);
  return launched();
}

cudaError_t weighted_sum(const Context& ctx, const ops::WeightedSum& op) {
  const int64_t n = op.y.ne[0], n_slots = op.y.ne[1], total = n * op.dst.n_rows();
  (void)launch_kernel(ctx, weighted_sum_kernel, grid_for(total, kThreads), kThreads, 0, rows_of(op.y),
                      rows_of(op.w), rows_of(op.dst), n, n_slots, total);
  return launched();
}

}  // namespace kiln::cuda
