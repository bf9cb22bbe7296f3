// The row-wise and elementwise ops on CUDA: norms, RoPE, softmax, KV writes, gated activations, add/mul,
// scale, argmax, MoE routing and mixing. All are bound by memory traffic: one pass over their operands,
// f32 arithmetic (double for RoPE angles, as the CPU backend), rows addressed through their views' strides.
#include <algorithm>
#include <cstdint>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_launch.cuh"
#include "backends/cuda/cuda_round_q8.cuh"
#include "ops/rope_freq.h"

namespace kiln::cuda {

namespace {

constexpr int kThreads = 256;

cudaError_t launched() { return cudaGetLastError(); }

// ---- norms: one block per row ----

// One row of RMSNorm by the whole block. Each thread reads only the elements i = threadIdx.x + k *
// blockDim.x, so a caller may have written them just before (add_rms_norm_kernel) without a barrier.
// xq / xds (optional; n a multiple of 32, st f32): the result also rounded to 8 bits per block of 32 for the
// integer GEMV, as quantize_x_kernel (cuda_matmul.cu) rounds it: a warp holds a block's 32 values.
__device__ inline void rms_norm_row(const float* xr, char* yr, Store st, const float* w, int64_t n, float eps,
                                    float w_add, float* red, int8_t* xq = nullptr, float2* xds = nullptr) {
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float g = w != nullptr ? w[i] + w_add : 1.0f;
    const float v = xr[i] * inv * g;
    store(st, yr, i, v);
    if (xq != nullptr) round_q8(v, xq + i, xds + i / 32);
  }
}

// Rows of up to kRowRegs elements a thread (8192 at 1024 threads) are held in registers: element threadIdx.x
// + k * blockDim.x in slot k. All of a row's loads are issued before its first store (a store between them
// would make each load wait for the one before: the compiler cannot tell they do not alias), so a row costs
// one memory round trip instead of one a slot. Same sums in the same order as rms_norm_row, so the same bits.
constexpr int kRowRegs = 8;

__device__ inline bool row_in_regs(int64_t n) { return n <= int64_t{kRowRegs} * blockDim.x; }

__device__ inline void load_row(const float* p, int64_t n, float (&v)[kRowRegs]) {
#pragma unroll
  for (int k = 0; k < kRowRegs; ++k) {
    const int64_t i = threadIdx.x + int64_t{k} * blockDim.x;
    v[k] = i < n ? p[i] : 0.0f;
  }
}
__device__ inline void load_norm_weight(const float* w, float w_add, int64_t n, float (&g)[kRowRegs]) {
#pragma unroll
  for (int k = 0; k < kRowRegs; ++k) {
    const int64_t i = threadIdx.x + int64_t{k} * blockDim.x;
    g[k] = w != nullptr && i < n ? w[i] + w_add : 1.0f;
  }
}

// rms_norm_row of the row x (slots as above), with the weight g loaded (load_norm_weight).
__device__ inline void rms_norm_regs(const float (&x)[kRowRegs], const float (&g)[kRowRegs], char* yr,
                                     Store st, int64_t n, float eps, float* red, int8_t* xq, float2* xds) {
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kRowRegs; ++k) {
    if (threadIdx.x + int64_t{k} * blockDim.x < n) ss += x[k] * x[k];
  }
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
#pragma unroll
  for (int k = 0; k < kRowRegs; ++k) {
    const int64_t i = threadIdx.x + int64_t{k} * blockDim.x;
    if (i >= n) break;
    const float v = x[k] * inv * g[k];
    store(st, yr, i, v);
    if (xq != nullptr) round_q8(v, xq + i, xds + i / 32);
  }
}

__global__ void __launch_bounds__(1024) rms_norm_kernel(Rows x, Rows dst, Store st, const float* w, int64_t n,
                                                        float eps, float w_add, int64_t n_rows) {
  pdl_begin();
  __shared__ float red[32];
  for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
    if (row_in_regs(n)) {
      float v[kRowRegs], g[kRowRegs];
      load_row(x.row_as<const float>(r), n, v);
      load_norm_weight(w, w_add, n, g);
      rms_norm_regs(v, g, dst.row(r), st, n, eps, red, nullptr, nullptr);
    } else {
      rms_norm_row(x.row_as<const float>(r), dst.row(r), st, w, n, eps, w_add, red);
    }
  }
}

__global__ void layer_norm_kernel(Rows x, Rows dst, const float* w, const float* b, int64_t n, float eps,
                                  int64_t n_rows) {
  pdl_begin();
  __shared__ float red[32];
  for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
    const float* xr = x.row_as<const float>(r);
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += xr[i];
    const float mean = block_sum(s, red) / static_cast<float>(n);
    float v = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) v += (xr[i] - mean) * (xr[i] - mean);
    const float inv = 1.0f / sqrtf(block_sum(v, red) / static_cast<float>(n) + eps);
    float* yr = dst.row_as<float>(r);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      yr[i] = (xr[i] - mean) * inv * (w != nullptr ? w[i] : 1.0f) + (b != nullptr ? b[i] : 0.0f);
    }
  }
}

// ---- RoPE: one block per token; its cos/sin table computed once (in double, as the CPU) for all heads ----

constexpr int kMaxRopePairs = 512;

// The block computes the cos/sin table of position `pos` into cs_sn (n_rot / 2 pairs).
__device__ inline void rope_table(float2* cs_sn, const ops::RopeParams& p, const float* factors,
                                  int32_t pos) {
  for (int i = threadIdx.x; i < p.n_rot / 2; i += blockDim.x) {
    const ops::RopeFreq f = ops::rope_freq(p, i, factors != nullptr ? factors[i] : 1.0f);
    const double angle = static_cast<double>(pos) * f.theta_scale;
    cs_sn[i] =
        make_float2(static_cast<float>(cos(angle) * f.mscale), static_cast<float>(sin(angle) * f.mscale));
  }
}

// Element i of a head's n_rot / 2 pairs and head_dim - n_rot pass-through dims: rotates pair i (or copies
// dim n_rot + i - n_rot / 2) of xr into yr, and hands each element written to out(dim, value). Every RoPE
// kernel goes through here, so fused and unfused RoPE round alike.
template <class Out>
__device__ inline void rope_element(const float* xr, float* yr, int64_t i, const float2* cs_sn,
                                    const ops::RopeParams& p, Out out) {
  const int32_t half = p.n_rot / 2;
  if (i >= half) {
    const int64_t d = p.n_rot + (i - half);
    const float v = xr[d];
    yr[d] = v;
    out(d, v);
    return;
  }
  const bool normal = p.layout == ops::RopeLayout::rope_layout_normal;
  const float cs = cs_sn[i].x, sn = cs_sn[i].y;
  const int64_t a = normal ? 2 * i : i, b = normal ? 2 * i + 1 : i + half;
  const float xa = xr[a], xb = xr[b];
  const float ya = xa * cs - xb * sn, yb = xa * sn + xb * cs;
  yr[a] = ya;
  yr[b] = yb;
  out(a, ya);
  out(b, yb);
}

__global__ void rope_kernel(Rows x, Rows dst, const int32_t* positions, const float* factors,
                            ops::RopeParams p, int64_t head_dim, int64_t n_heads, int64_t n_tokens) {
  pdl_begin();
  __shared__ float2 cs_sn[kMaxRopePairs];
  const int64_t per_head = p.n_rot / 2 + (head_dim - p.n_rot);  // pairs, then pass-through dims
  for (int64_t t = blockIdx.x; t < n_tokens; t += gridDim.x) {
    __syncthreads();  // the previous token's table is no longer read
    rope_table(cs_sn, p, factors, positions[t]);
    __syncthreads();
    for (int64_t c = threadIdx.x; c < per_head * n_heads; c += blockDim.x) {
      const int64_t h = c / per_head, i = c % per_head, row = h + n_heads * t;
      rope_element(x.row_as<const float>(row), dst.row_as<float>(row), i, cs_sn, p, [](int64_t, float) {});
    }
  }
}

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

__global__ void argmax_kernel(Rows x, int32_t* out, int64_t n, int64_t n_rows) {
  pdl_begin();
  __shared__ float sv[32];
  __shared__ int64_t si[32];
  for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
    const float* xr = x.row_as<const float>(r);
    float bv = -INFINITY;
    int64_t bi = n;    // none yet
    bool bad = false;  // a NaN or +inf: no token to take (ops.h)
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      bad = bad || isnan(xr[i]) || xr[i] == INFINITY;
      if (bi == n || better(xr[i], i, bv, bi)) bv = xr[i], bi = i;
    }
    bad = __syncthreads_or(bad);
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int64_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (oi != n && (bi == n || better(ov, oi, bv, bi))) bv = ov, bi = oi;
    }
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    __syncthreads();
    if (lane == 0) sv[warp] = bv, si[warp] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) {
        if (si[w] != n && (bi == n || better(sv[w], si[w], bv, bi))) bv = sv[w], bi = si[w];
      }
      out[r] = bad || bv == -INFINITY ? -1 : static_cast<int32_t>(bi);
    }
  }
}

// ---- elementwise: one thread per element ----

__device__ inline float glu(ops::GluKind kind, float g) {
  switch (kind) {
    case ops::GluKind::glu_kind_silu: return g / (1.0f + expf(-g));
    case ops::GluKind::glu_kind_sigmoid: return 1.0f / (1.0f + expf(-g));
    case ops::GluKind::glu_kind_gelu_tanh: break;
  }
  constexpr float c = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * g * (1.0f + tanhf(c * (g + 0.044715f * g * g * g)));
}

// xq / xds (n a multiple of 32, f32 dst): each warp's 32 consecutive elements are one block of a row, also
// rounded to 8 bits there (round_q8).
__global__ void gated_act_kernel(Rows gate, Rows up, Rows dst, Store st, ops::GluKind kind, bool broadcast,
                                 int64_t n, int64_t total, int8_t* xq, float2* xds) {
  pdl_begin();
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / n, i = e % n;
    const float g = gate.row_as<const float>(r)[broadcast ? 0 : i];
    const float v = glu(kind, g) * up.row_as<const float>(r)[i];
    store(st, dst.row(r), i, v);
    if (xq != nullptr) round_q8(v, xq + r * n + i, xds + r * (n / 32) + i / 32);
  }
}

__global__ void binary_kernel(Rows a, Rows b, Rows dst, Store st, bool mul, bool b_one_row, int64_t n,
                              int64_t total) {
  pdl_begin();
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / n, i = e % n;
    const float av = a.row_as<const float>(r)[i], bv = b.row_as<const float>(b_one_row ? 0 : r)[i];
    store(st, dst.row(r), i, mul ? av * bv : av + bv);
  }
}

__global__ void scale_kernel(Rows x, Rows dst, float s, int64_t n, int64_t total) {
  pdl_begin();
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / n, i = e % n;
    dst.row_as<float>(r)[i] = x.row_as<const float>(r)[i] * s;
  }
}

// ---- KV write: one thread per element of k and v ----

template <class T>
__device__ inline void put(void* pool, int64_t i, float v);
template <>
__device__ inline void put<float>(void* pool, int64_t i, float v) {
  static_cast<float*>(pool)[i] = v;
}
template <>
__device__ inline void put<__half>(void* pool, int64_t i, float v) {
  static_cast<__half*>(pool)[i] = __float2half_rn(v);
}

template <class KT, class VT>
__global__ void kv_write_kernel(Rows k, Rows v, void* k_pool, void* v_pool, const int32_t* slots,
                                int64_t head_dim, int64_t n_kv, int64_t total) {
  pdl_begin();
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t d = e % head_dim, row = e / head_dim;  // row = h + n_kv * t
    const int64_t h = row % n_kv, t = row / n_kv;
    // Pools are [head_dim, n_kv, block_size, n_blocks], contiguous: slot s is row s * n_kv + h.
    const int64_t at = (int64_t{slots[t]} * n_kv + h) * head_dim + d;
    put<KT>(k_pool, at, k.row_as<const float>(row)[d]);
    put<VT>(v_pool, at, v.row_as<const float>(row)[d]);
  }
}

// ---- fused sequences (run_fused): one launch, the arithmetic of the ops one by one ----

// RoPE of q and of k, one block per token as rope_kernel, the rotated k also written to the K pool and v to
// the V pool at the token's slot, as kv_write_kernel.
// A token's heads (q's, then k's) may be split among gridDim.y blocks, heads_per_split each (decode: one
// token's work spread over several multiprocessors); each block computes the token's table itself. The block
// that rotates k head h also writes v head h.
template <class KT, class VT>
__global__ void rope_kv_write_kernel(Rows q, Rows q_dst, Rows k, Rows k_dst, Rows v, void* k_pool,
                                     void* v_pool, const int32_t* slots, const int32_t* positions,
                                     const float* factors, ops::RopeParams p, int64_t head_dim,
                                     int64_t n_heads, int64_t n_kv, int64_t n_tokens,
                                     int64_t heads_per_split) {
  pdl_begin();
  __shared__ float2 cs_sn[kMaxRopePairs];
  const int64_t per_head = p.n_rot / 2 + (head_dim - p.n_rot);
  const int64_t h_lo = blockIdx.y * heads_per_split, h_hi = min(h_lo + heads_per_split, n_heads + n_kv);
  const int64_t v_lo = max(h_lo - n_heads, int64_t{0}), v_hi = max(h_hi - n_heads, int64_t{0});
  for (int64_t t = blockIdx.x; t < n_tokens; t += gridDim.x) {
    __syncthreads();
    rope_table(cs_sn, p, factors, positions[t]);
    __syncthreads();
    const int64_t slot_row = int64_t{slots[t]} * n_kv;  // pools: [head_dim, n_kv, block_size, n_blocks]
    for (int64_t c = threadIdx.x; c < per_head * (h_hi - h_lo); c += blockDim.x) {
      const int64_t h = h_lo + c / per_head, i = c % per_head;
      if (h < n_heads) {
        const int64_t row = h + n_heads * t;
        rope_element(q.row_as<const float>(row), q_dst.row_as<float>(row), i, cs_sn, p,
                     [](int64_t, float) {});
      } else {
        const int64_t hk = h - n_heads, row = hk + n_kv * t;
        KT* pool = static_cast<KT*>(k_pool) + (slot_row + hk) * head_dim;
        rope_element(k.row_as<const float>(row), k_dst.row_as<float>(row), i, cs_sn, p,
                     [&](int64_t d, float val) { put<KT>(pool, d, val); });
      }
    }
    for (int64_t e = threadIdx.x; e < head_dim * (v_hi - v_lo); e += blockDim.x) {
      const int64_t h = v_lo + e / head_dim, d = e % head_dim;
      put<VT>(v_pool, (slot_row + h) * head_dim + d, v.row_as<const float>(h + n_kv * t)[d]);
    }
  }
}

// sum = a + b, then dst = rms_norm(sum) as rms_norm_kernel (same block size, so the same reduction order).
// xq / xds: see rms_norm_row; row r's go at xq + r * n and xds + r * n / 32.
__global__ void __launch_bounds__(1024)
    add_rms_norm_kernel(Rows a, Rows b, Rows sum, Rows dst, Store st, const float* w, int64_t n, float eps,
                        float w_add, int64_t n_rows, int8_t* xq, float2* xds) {
  pdl_begin();
  __shared__ float red[32];
  for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
    const float* ar = a.row_as<const float>(r);
    const float* br = b.row_as<const float>(r);
    float* sr = sum.row_as<float>(r);
    int8_t* q = xq != nullptr ? xq + r * n : nullptr;
    float2* ds = xds != nullptr ? xds + r * (n / 32) : nullptr;
    if (row_in_regs(n)) {
      float va[kRowRegs], vb[kRowRegs], g[kRowRegs];
      load_row(ar, n, va);
      load_row(br, n, vb);
      load_norm_weight(w, w_add, n, g);
#pragma unroll
      for (int k = 0; k < kRowRegs; ++k) {
        const int64_t i = threadIdx.x + int64_t{k} * blockDim.x;
        va[k] += vb[k];
        if (i < n) sr[i] = va[k];
      }
      rms_norm_regs(va, g, dst.row(r), st, n, eps, red, q, ds);
    } else {
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sr[i] = ar[i] + br[i];
      rms_norm_row(sr, dst.row(r), st, w, n, eps, w_add, red, q, ds);
    }
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
    const int64_t t = e / n, i = e % n;
    const float* wt = w.row_as<const float>(t);
    float acc = 0.0f;
    for (int64_t s = 0; s < n_slots; ++s) acc += wt[s] * y.row_as<const float>(s + n_slots * t)[i];
    dst.row_as<float>(t)[i] = acc;
  }
}

}  // namespace

cudaError_t rms_norm(const Context& ctx, const ops::RmsNorm& op) {
  const int64_t n = op.x.ne[0], rows = op.x.n_rows();
  (void)launch_kernel(ctx, rms_norm_kernel, grid_for(rows, 1), row_threads(n), 0, rows_of(op.x),
                      rows_of(op.dst), store_of(op.dst.type), static_cast<const float*>(op.w.tensor.data), n,
                      op.eps, op.add_one ? 1.0f : 0.0f, rows);
  return launched();
}

cudaError_t layer_norm(const Context& ctx, const ops::LayerNorm& op) {
  const int64_t n = op.x.ne[0], rows = op.x.n_rows();
  (void)launch_kernel(ctx, layer_norm_kernel, grid_for(rows, 1), row_threads(n), 0, rows_of(op.x),
                      rows_of(op.dst), static_cast<const float*>(op.w.tensor.data),
                      static_cast<const float*>(op.b.tensor.data), n, op.eps, rows);
  return launched();
}

cudaError_t rope(const Context& ctx, const ops::Rope& op) {
  if (op.p.n_rot / 2 > kMaxRopePairs) return cudaErrorNotSupported;
  const int64_t head_dim = op.x.ne[0], n_heads = op.x.ne[1], n_tokens = op.x.ne[2];
  (void)launch_kernel(ctx, rope_kernel, grid_for(n_tokens, 1), kThreads, 0, rows_of(op.x), rows_of(op.dst),
                      static_cast<const int32_t*>(op.positions.data),
                      static_cast<const float*>(op.freq_factors.tensor.data), op.p, head_dim, n_heads,
                      n_tokens);
  return launched();
}

cudaError_t softmax(const Context& ctx, const ops::Softmax& op) {
  const int64_t n = op.x.ne[0], rows = op.x.n_rows();
  (void)launch_kernel(ctx, softmax_kernel, grid_for(rows, 1), row_threads(n), 0, rows_of(op.x),
                      rows_of(op.dst), op.scale, n, rows);
  return launched();
}

cudaError_t argmax(const Context& ctx, const ops::Argmax& op) {
  const int64_t n = op.x.ne[0], rows = op.x.n_rows();
  (void)launch_kernel(ctx, argmax_kernel, grid_for(rows, 1), row_threads(n), 0, rows_of(op.x),
                      static_cast<int32_t*>(op.out.data), n, rows);
  return launched();
}

cudaError_t gated_act(const Context& ctx, const ops::GatedAct& op, int* xq, float2* xds) {
  const int64_t n = op.up.ne[0], total = n * op.up.n_rows();
  if (xq != nullptr && (n % 32 != 0 || op.dst.type != DType::f32)) return cudaErrorInvalidValue;
  (void)launch_kernel(ctx, gated_act_kernel, grid_for(total, kThreads), kThreads, 0, rows_of(op.gate),
                      rows_of(op.up), rows_of(op.dst), store_of(op.dst.type), op.kind,
                      op.gate.ne[0] == 1 && n > 1, n, total, reinterpret_cast<int8_t*>(xq), xds);
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

cudaError_t kv_write(const Context& ctx, const ops::KvWrite& op) {
  const int64_t head_dim = op.k.ne[0], n_kv = op.k.ne[1], total = head_dim * n_kv * op.k.ne[2];
  const auto* slots = static_cast<const int32_t*>(op.slots.data);
  const unsigned grid = grid_for(total, kThreads);
  const bool k16 = op.k_pool.type == DType::f16, v16 = op.v_pool.type == DType::f16;
  const Rows k = rows_of(op.k), v = rows_of(op.v);
  if (k16 && v16) {
    (void)launch_kernel(ctx, kv_write_kernel<__half, __half>, grid, kThreads, 0, k, v, op.k_pool.data,
                        op.v_pool.data, slots, head_dim, n_kv, total);
  } else if (!k16 && !v16) {
    (void)launch_kernel(ctx, kv_write_kernel<float, float>, grid, kThreads, 0, k, v, op.k_pool.data,
                        op.v_pool.data, slots, head_dim, n_kv, total);
  } else if (k16) {
    (void)launch_kernel(ctx, kv_write_kernel<__half, float>, grid, kThreads, 0, k, v, op.k_pool.data,
                        op.v_pool.data, slots, head_dim, n_kv, total);
  } else {
    (void)launch_kernel(ctx, kv_write_kernel<float, __half>, grid, kThreads, 0, k, v, op.k_pool.data,
                        op.v_pool.data, slots, head_dim, n_kv, total);
  }
  return launched();
}

bool rope_supported(const ops::RopeParams& p) { return p.n_rot / 2 <= kMaxRopePairs; }

cudaError_t rope_kv_write(const Context& ctx, const ops::Rope& q, const ops::Rope& k,
                          const ops::KvWrite& kv) {
  if (!rope_supported(q.p)) return cudaErrorNotSupported;
  const int64_t head_dim = q.x.ne[0], n_heads = q.x.ne[1], n_kv = k.x.ne[1], n_tokens = q.x.ne[2];
  // Few tokens (decode): a token's heads split among blocks, four a block, until the device has ~2 blocks a
  // multiprocessor.
  const int64_t heads = n_heads + n_kv;
  const int64_t splits =
      std::clamp<int64_t>((2 * int64_t{ctx.n_sms} + n_tokens - 1) / n_tokens, 1, (heads + 3) / 4);
  const int64_t per_split = (heads + splits - 1) / splits;
  const dim3 grid(grid_for(n_tokens, 1), static_cast<unsigned>((heads + per_split - 1) / per_split));
  const auto launch = [&](auto k_elem, auto v_elem) {
    using KT = decltype(k_elem);
    using VT = decltype(v_elem);
    (void)launch_kernel(ctx, rope_kv_write_kernel<KT, VT>, grid, kThreads, 0, rows_of(q.x), rows_of(q.dst),
                        rows_of(k.x), rows_of(k.dst), rows_of(kv.v), kv.k_pool.data, kv.v_pool.data,
                        static_cast<const int32_t*>(kv.slots.data),
                        static_cast<const int32_t*>(q.positions.data),
                        static_cast<const float*>(q.freq_factors.tensor.data), q.p, head_dim, n_heads, n_kv,
                        n_tokens, per_split);
  };
  const bool k16 = kv.k_pool.type == DType::f16, v16 = kv.v_pool.type == DType::f16;
  if (k16 && v16) {
    launch(__half{}, __half{});
  } else if (!k16 && !v16) {
    launch(float{}, float{});
  } else if (k16) {
    launch(__half{}, float{});
  } else {
    launch(float{}, __half{});
  }
  return launched();
}

cudaError_t add_rms_norm(const Context& ctx, const ops::Binary& add, const ops::RmsNorm& norm, int* xq,
                         float2* xds) {
  const int64_t n = add.a.ne[0], rows = add.a.n_rows();
  (void)launch_kernel(ctx, add_rms_norm_kernel, grid_for(rows, 1), row_threads(n), 0, rows_of(add.a),
                      rows_of(add.b.tensor), rows_of(add.dst), rows_of(norm.dst), store_of(norm.dst.type),
                      static_cast<const float*>(norm.w.tensor.data), n, norm.eps, norm.add_one ? 1.0f : 0.0f,
                      rows, reinterpret_cast<int8_t*>(xq), xds);
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
