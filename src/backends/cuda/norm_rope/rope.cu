// RoPE and the KV write on CUDA, alone and fused (RoPE of q and k with the KV write of k and v: run_fused's
// rope_kv_write, into f16, f32, q8_0 or q8_64 pools; 8-bit blocks quantized as the reference quantizes).
// Bound by memory traffic: one pass over their operands, f32 arithmetic with the angles in double (as the CPU
// backend), rows addressed through their views' strides.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backends/cuda/attention/kv_pool.cuh"
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_launch.cuh"
#include "backends/cuda/norm_rope/rope.cuh"
#include "ops/rope_freq.h"

namespace kiln::cuda {

RopeFreqs host_rope_freqs(const ops::RopeParams& p, const void* factors) {
  RopeFreqs r{};
  r.on = factors == nullptr && p.n_rot / 2 <= kRopeArgPairs;
  if (r.on) {
    for (int i = 0; i < p.n_rot / 2; ++i) r.f[i] = ops::rope_freq(p, i, 1.0f);
  }
  return r;
}

namespace {

constexpr int kThreads = 256;

cudaError_t launched() { return cudaGetLastError(); }

// ---- RoPE: one block per token; its cos/sin table computed once (in double, as the CPU) for all heads ----

constexpr int kMaxRopePairs = 512;

// The block computes the cos/sin table of position `pos` into cs_sn (n_rot / 2 pairs).
__device__ inline void rope_table(float2* cs_sn, const ops::RopeParams& p, const float* factors,
                                  const RopeFreqs& fr, int32_t pos) {
  for (int i = threadIdx.x; i < p.n_rot / 2; i += blockDim.x) {
    cs_sn[i] = rope_cs(fr.on ? fr.f[i] : ops::rope_freq(p, i, factors != nullptr ? factors[i] : 1.0f), pos);
  }
}

// The RoPE kernels' start of each token: its table into cs_sn, then, the first time, the wait on the kernel
// before. The positions (step metadata) and the factors (a weight) are not written by kernels, so the first
// token's table is made before that wait.
__device__ inline void token_table(float2* cs_sn, const ops::RopeParams& p, const float* factors,
                                   const RopeFreqs& fr, int32_t pos, bool& waited) {
  rope_table(cs_sn, p, factors, fr, pos);
  if (!waited) {
    pdl_begin();
    waited = true;
  }
}

// Element i of a head's n_rot / 2 pairs and head_dim - n_rot pass-through dims: pair i (dims a and b) or
// pass-through dim a = n_rot + i - n_rot / 2 (b < 0), with the values read from the head's row.
struct RopeIn {
  int64_t a, b;
  float xa, xb;
};
__device__ inline RopeIn rope_load(const float* xr, int64_t i, const ops::RopeParams& p) {
  const int32_t half = p.n_rot / 2;
  if (i >= half) {
    const int64_t d = p.n_rot + (i - half);
    return {d, -1, xr[d], 0.0f};
  }
  const bool normal = p.layout == ops::RopeLayout::rope_layout_normal;
  const int64_t a = normal ? 2 * i : i, b = normal ? 2 * i + 1 : i + half;
  return {a, b, xr[a], xr[b]};
}
// Rotates element i (read by rope_load) into yr, and hands each element written to out(dim, value). Every
// RoPE kernel goes through here, so fused and unfused RoPE round alike.
template <class Out>
__device__ inline void rope_store(const RopeIn& x, float* yr, int64_t i, const float2* cs_sn, Out out) {
  if (x.b < 0) {
    yr[x.a] = x.xa;
    out(x.a, x.xa);
    return;
  }
  const float2 y = rope_rotate(x.xa, x.xb, cs_sn[i]);
  yr[x.a] = y.x;
  yr[x.b] = y.y;
  out(x.a, y.x);
  out(x.b, y.y);
}
template <class Out>
__device__ inline void rope_element(const float* xr, float* yr, int64_t i, const float2* cs_sn,
                                    const ops::RopeParams& p, Out out) {
  rope_store(rope_load(xr, i, p), yr, i, cs_sn, out);
}

__global__ void rope_kernel(Rows x, Rows dst, const int32_t* positions, const float* factors,
                            ops::RopeParams p, RopeFreqs fr, int64_t head_dim, int64_t n_heads,
                            int64_t n_tokens) {
  __shared__ float2 cs_sn[kMaxRopePairs];
  const int64_t per_head = p.n_rot / 2 + (head_dim - p.n_rot);  // pairs, then pass-through dims
  bool waited = false;
  for (int64_t t = blockIdx.x; t < n_tokens; t += gridDim.x) {
    __syncthreads();  // the previous token's table is no longer read
    token_table(cs_sn, p, factors, fr, positions[t], waited);
    __syncthreads();
    for (int64_t c = threadIdx.x; c < per_head * n_heads; c += blockDim.x) {
      const DivMod hi = divmod(c, per_head);
      const int64_t h = hi.q, i = hi.r, row = h + n_heads * t;
      rope_element(x.row_as<const float>(row), dst.row_as<float>(row), i, cs_sn, p, [](int64_t, float) {});
    }
  }
  if (!waited) pdl_begin();
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
    const DivMod rd = divmod(e, head_dim), th = divmod(rd.q, n_kv);  // row rd.q = h + n_kv * t
    const int64_t d = rd.r, row = rd.q, h = th.r, t = th.q;
    // Pools are [head_dim, n_kv, block_size, n_blocks], contiguous: slot s is row s * n_kv + h.
    const int64_t at = (int64_t{slots[t]} * n_kv + h) * head_dim + d;
    put<KT>(k_pool, at, k.row_as<const float>(row)[d]);
    put<VT>(v_pool, at, v.row_as<const float>(row)[d]);
  }
}

// ---- KV write into 8-bit pools (q8_0, q8_64): a warp a block of B values ----

// A warp a block w of k's `total` (row w / blocks_a_row, h + n_kv * t, its block w % blocks_a_row) and the
// same block of v, into the pools at the token's slot (the pools' rows: whole blocks, kv_pool.cuh's KvQ8B).
// blockDim.x is a multiple of 32, so a warp's lanes take the same trips.
template <int B>
__global__ void __launch_bounds__(kThreads)
    kv_write_q8_kernel(Rows k, Rows v, KvQ8B<B>* k_pool, KvQ8B<B>* v_pool, const int32_t* slots,
                       int64_t blocks_a_row, int64_t n_kv, int64_t total) {
  pdl_begin();
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  for (int64_t w = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32; w < total; w += warps) {
    const DivMod rb = divmod(w, blocks_a_row), th = divmod(rb.q, n_kv);  // row rb.q = h + n_kv * t
    const int64_t row = rb.q, h = th.r, t = th.q;
    const int64_t at = (int64_t{slots[t]} * n_kv + h) * blocks_a_row + rb.r;
    float kx[B / 32], vx[B / 32];
#pragma unroll
    for (int i = 0; i < B / 32; ++i) {
      const int64_t d = rb.r * B + 32 * i + lane;
      kx[i] = k.row_as<const float>(row)[d], vx[i] = v.row_as<const float>(row)[d];
    }
    put_q8<B>(kx, k_pool + at, lane);
    put_q8<B>(vx, v_pool + at, lane);
  }
}

// ---- fused: RoPE of q and k, the KV write of k and v ----

// RoPE of q and of k, one block per token as rope_kernel, the rotated k also written to the K pool and v to
// the V pool at the token's slot, as kv_write_kernel.
// A token's heads (q's, then k's) may be split among gridDim.y blocks, heads_per_split each (decode: one
// token's work spread over several multiprocessors); each block computes the token's table itself. The block
// that rotates k head h also writes v head h.
template <class KT, class VT>
__global__ void rope_kv_write_kernel(Rows q, Rows q_dst, Rows k, Rows k_dst, Rows v, void* k_pool,
                                     void* v_pool, const int32_t* slots, const int32_t* positions,
                                     const float* factors, ops::RopeParams p, RopeFreqs fr, int64_t head_dim,
                                     int64_t n_heads, int64_t n_kv, int64_t n_tokens,
                                     int64_t heads_per_split) {
  __shared__ float2 cs_sn[kMaxRopePairs];
  const int64_t per_head = p.n_rot / 2 + (head_dim - p.n_rot);
  const int64_t h_lo = blockIdx.y * heads_per_split, h_hi = min(h_lo + heads_per_split, n_heads + n_kv);
  const int64_t v_lo = max(h_lo - n_heads, int64_t{0}), v_hi = max(h_hi - n_heads, int64_t{0});
  const int64_t n_items = per_head * (h_hi - h_lo), n_v = head_dim * (v_hi - v_lo);
  bool waited = false;
  for (int64_t t = blockIdx.x; t < n_tokens; t += gridDim.x) {
    // Item c of the block: element i of head h (q's heads, then k's) and its row.
    auto item = [&](int64_t c) {
      const DivMod hi = divmod(c, per_head);
      const int64_t h = h_lo + hi.q;
      const int64_t row = h < n_heads ? h + n_heads * t : h - n_heads + n_kv * t;
      return RopeIn{rope_load((h < n_heads ? q : k).row_as<const float>(row), hi.r, p)};
    };
    auto v_at = [&](int64_t e) {
      const DivMod hd = divmod(e, head_dim);
      return v.row_as<const float>(v_lo + hd.q + n_kv * t)[hd.r];
    };
    // Pools: [head_dim, n_kv, block_size, n_blocks]; the slots, step metadata as the positions, are read
    // before the wait too (decode: the block's only token).
    const int64_t slot_row = int64_t{slots[t]} * n_kv;
    __syncthreads();  // the previous token's table is no longer read
    token_table(cs_sn, p, factors, fr, positions[t], waited);
    const RopeIn first = threadIdx.x < n_items ? item(threadIdx.x) : RopeIn{};
    const float first_v = threadIdx.x < n_v ? v_at(threadIdx.x) : 0.0f;
    __syncthreads();
    for (int64_t c = threadIdx.x; c < n_items; c += blockDim.x) {
      const RopeIn x = c == threadIdx.x ? first : item(c);
      const DivMod hi = divmod(c, per_head);
      const int64_t h = h_lo + hi.q, i = hi.r;
      if (h < n_heads) {
        rope_store(x, q_dst.row_as<float>(h + n_heads * t), i, cs_sn, [](int64_t, float) {});
      } else {
        const int64_t hk = h - n_heads;
        KT* pool = static_cast<KT*>(k_pool) + (slot_row + hk) * head_dim;
        rope_store(x, k_dst.row_as<float>(hk + n_kv * t), i, cs_sn,
                   [&](int64_t d, float val) { put<KT>(pool, d, val); });
      }
    }
    for (int64_t e = threadIdx.x; e < n_v; e += blockDim.x) {
      const DivMod hd = divmod(e, head_dim);
      put<VT>(v_pool, (slot_row + v_lo + hd.q) * head_dim + hd.r, e == threadIdx.x ? first_v : v_at(e));
    }
  }
  if (!waited) pdl_begin();
}

// rope_kv_write_kernel for the common shape, where all of a head rotates (n_rot = head_dim, a multiple of 4)
// and every row is 16-byte aligned. A thread's unit is 16 bytes of a row: pairs 2u and 2u + 1 of a q or k
// head (dims 4u..4u+3; neox: dims 2u, 2u + 1 and their partners half on), or 4 dims of a v head, which goes
// to the V pool unrotated. A token's units are its q heads', its k heads', then its v heads'; block (t, s)
// takes units [s * units_per_split, ...) of token t. A unit's row is found with one 32-bit division, and all
// of a thread's loads are issued before its first store and before the barrier that waits for the table. The
// rotation and the roundings are rope_store's, so the bits are rope_kv_write_kernel's and rope_kernel's.
// (rope_kv_write_kernel costs 109 us on the 8B's 2048 tokens, at a quarter of the copy bandwidth: three
// 64-bit divisions an element pair, and one load in flight a thread.)
struct HeadRows {  // row (h, t) of a [head_dim, heads, tokens] view
  char* data;
  int64_t nb_h, nb_t;
  __device__ float* at(int64_t h, int64_t t) const {
    return reinterpret_cast<float*>(data + h * nb_h + t * nb_t);
  }
};
HeadRows head_rows(const Tensor& x) { return {static_cast<char*>(x.data), x.nb[1], x.nb[2]}; }
constexpr int kRopeUnits = 8;  // units a thread holds at once

__device__ inline void put4(float* dst, float4 v) { *reinterpret_cast<float4*>(dst) = v; }
__device__ inline void put4(__half* dst, float4 v) {
  const __half2 lo = __floats2half2_rn(v.x, v.y), hi = __floats2half2_rn(v.z, v.w);
  *reinterpret_cast<uint2*>(dst) =
      make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
}
__device__ inline void put2(float* dst, float a, float b) {
  *reinterpret_cast<float2*>(dst) = make_float2(a, b);
}
__device__ inline void put2(__half* dst, float a, float b) {
  *reinterpret_cast<__half2*>(dst) = __floats2half2_rn(a, b);
}

template <class KT, class VT, bool kNeox>
__global__ void __launch_bounds__(kThreads)
    rope_kv_write_vec_kernel(HeadRows q, HeadRows q_dst, HeadRows k, HeadRows k_dst, HeadRows v, KT* k_pool,
                             VT* v_pool, const int32_t* slots, const int32_t* positions, const float* factors,
                             ops::RopeParams p, RopeFreqs fr, int n_heads, int n_kv, int64_t n_tokens,
                             int units_per_split) {
  __shared__ __align__(16) float2 cs_sn[kMaxRopePairs];
  const int head_dim = p.n_rot, half = head_dim / 2, upr = head_dim / 4;  // units a row
  const int rot = (n_heads + n_kv) * upr, units = rot + n_kv * upr;
  const int lo = static_cast<int>(blockIdx.y) * units_per_split, hi = min(units, lo + units_per_split);
  bool waited = false;
  for (int64_t t = blockIdx.x; t < n_tokens; t += gridDim.x) {
    if (t != blockIdx.x) __syncthreads();  // the previous token's table is no longer read
    token_table(cs_sn, p, factors, fr, positions[t], waited);
    const int64_t slot_row = int64_t{slots[t]} * n_kv;  // pools: [head_dim, n_kv, block_size, n_blocks]
    // Unit u's head (q's, k's, then v's, counted from 0) and its first dim.
    const auto head_of = [&](int u, int& h, int& d) {
      const int r = u < rot ? u : u - rot;
      h = r / upr;
      d = (r - h * upr) * (kNeox && u < rot ? 2 : 4);
    };
    for (int c = lo; c < hi;
         c += kRopeUnits * static_cast<int>(blockDim.x)) {  // the same trips in all threads
      float4 x[kRopeUnits];  // (a, b) of the unit's first pair, then of its second
#pragma unroll
      for (int j = 0; j < kRopeUnits; ++j) {
        const int u = c + static_cast<int>(threadIdx.x + j * blockDim.x);
        if (u >= hi) break;
        int h, d;
        head_of(u, h, d);
        const float* row = u >= rot ? v.at(h, t) : h < n_heads ? q.at(h, t) : k.at(h - n_heads, t);
        if (!kNeox || u >= rot) {
          x[j] = *reinterpret_cast<const float4*>(row + d);
        } else {
          const float2 a = *reinterpret_cast<const float2*>(row + d),
                       b = *reinterpret_cast<const float2*>(row + d + half);
          x[j] = make_float4(a.x, b.x, a.y, b.y);
        }
      }
      if (c == lo) __syncthreads();  // the table is made
#pragma unroll
      for (int j = 0; j < kRopeUnits; ++j) {
        const int u = c + static_cast<int>(threadIdx.x + j * blockDim.x);
        if (u >= hi) break;
        int h, d;
        head_of(u, h, d);
        if (u >= rot) {
          put4(v_pool + (slot_row + h) * head_dim + d, x[j]);
          continue;
        }
        const int pair = kNeox ? d : d / 2;
        const float4 cs = *reinterpret_cast<const float4*>(&cs_sn[pair]);  // pairs `pair` and `pair` + 1
        const float2 y0 = rope_rotate(x[j].x, x[j].y, make_float2(cs.x, cs.y));
        const float2 y1 = rope_rotate(x[j].z, x[j].w, make_float2(cs.z, cs.w));
        const bool is_k = h >= n_heads;
        float* row = is_k ? k_dst.at(h - n_heads, t) : q_dst.at(h, t);
        KT* pool = is_k ? k_pool + (slot_row + h - n_heads) * head_dim : nullptr;
        if (!kNeox) {
          const float4 y = make_float4(y0.x, y0.y, y1.x, y1.y);
          put4(row + d, y);
          if (is_k) put4(pool + d, y);
        } else {
          put2(row + d, y0.x, y1.x);
          put2(row + d + half, y0.y, y1.y);
          if (is_k) {
            put2(pool + d, y0.x, y1.x);
            put2(pool + d + half, y0.y, y1.y);
          }
        }
      }
    }
  }
  if (!waited) pdl_begin();
}

// ---- fused into 8-bit pools: a warp a head row ----

constexpr int kQ8RopeMaxDim = 256;  // the longest head row rope_kv_write_q8_kernel stages

// RoPE of q and k and the KV write into 8-bit pools (blocks of B values), a warp a head row of a token: q's
// heads' rows (rotated into q_dst), k's (rotated into k_dst, and each block of B of them into the K pool),
// then v's (into the V pool). The warp stages its row in shared memory before writing any of it, so that a
// rotation in place reads the row as it was (NeoX pairs lie 32 lanes or more apart); the rotation is
// rope_rotate on the pair, and the blocks put_q8 of the rotated values, as rope_kernel and kv_write_q8_kernel
// apart: the same bits. A token's rows split among gridDim.y blocks, rows_per_split each, each of which
// computes the token's table.
template <int B>
__global__ void __launch_bounds__(kThreads)
    rope_kv_write_q8_kernel(Rows q, Rows q_dst, Rows k, Rows k_dst, Rows v, KvQ8B<B>* k_pool,
                            KvQ8B<B>* v_pool, const int32_t* slots, const int32_t* positions,
                            const float* factors, ops::RopeParams p, RopeFreqs fr, int head_dim, int n_heads,
                            int n_kv, int64_t n_tokens, int rows_per_split) {
  __shared__ float2 cs_sn[kMaxRopePairs];
  __shared__ float staged[kThreads / 32][kQ8RopeMaxDim];
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int warps = static_cast<int>(blockDim.x / 32), blocks_a_row = head_dim / B;
  const int rot = n_heads + n_kv, rows = rot + n_kv;
  const int lo = static_cast<int>(blockIdx.y) * rows_per_split, hi = min(rows, lo + rows_per_split);
  const int half = p.n_rot / 2;
  const bool normal = p.layout == ops::RopeLayout::rope_layout_normal;
  float* row_s = staged[warp];
  bool waited = false;
  for (int64_t t = blockIdx.x; t < n_tokens; t += gridDim.x) {
    if (t != blockIdx.x) __syncthreads();  // the previous token's table is no longer read
    token_table(cs_sn, p, factors, fr, positions[t], waited);
    __syncthreads();
    const int64_t slot_row = int64_t{slots[t]} * n_kv;  // pools: [head_dim, n_kv, block_size, n_blocks]
    for (int r = lo + warp; r < hi; r += warps) {       // the same trips in all of a warp's lanes
      if (r >= rot) {                                   // v head r - rot: its blocks as they are
        const int h = r - rot;
        const float* vr = v.row_as<const float>(h + int64_t{n_kv} * t);
        for (int b = 0; b < blocks_a_row; ++b) {
          float x[B / 32];
#pragma unroll
          for (int i = 0; i < B / 32; ++i) x[i] = vr[B * b + 32 * i + lane];
          put_q8<B>(x, v_pool + (slot_row + h) * blocks_a_row + b, lane);
        }
        continue;
      }
      const bool is_k = r >= n_heads;
      const int h = is_k ? r - n_heads : r;
      const int64_t row = is_k ? h + int64_t{n_kv} * t : h + int64_t{n_heads} * t;
      const float* xr = (is_k ? k : q).row_as<const float>(row);
      for (int d = lane; d < head_dim; d += 32) row_s[d] = xr[d];
      __syncwarp();
      float* yr = (is_k ? k_dst : q_dst).row_as<float>(row);
      for (int b = 0; b < blocks_a_row; ++b) {
        float y[B / 32];
#pragma unroll
        for (int j = 0; j < B / 32; ++j) {
          const int d = B * b + 32 * j + lane;
          y[j] = row_s[d];
          if (d < p.n_rot) {  // else a dim passed through
            const int i = normal ? d / 2 : d % half;
            const int a = normal ? 2 * i : i, pb = normal ? 2 * i + 1 : i + half;
            const float2 rotated = rope_rotate(row_s[a], row_s[pb], cs_sn[i]);
            y[j] = d == a ? rotated.x : rotated.y;
          }
          yr[d] = y[j];
        }
        if (is_k) put_q8<B>(y, k_pool + (slot_row + h) * blocks_a_row + b, lane);
      }
      __syncwarp();  // row_s is read before the warp's next row fills it
    }
  }
  if (!waited) pdl_begin();
}

}  // namespace

cudaError_t rope(const Context& ctx, const ops::Rope& op) {
  if (op.p.n_rot / 2 > kMaxRopePairs) return cudaErrorNotSupported;
  const int64_t head_dim = op.x.ne[0], n_heads = op.x.ne[1], n_tokens = op.x.ne[2];
  (void)launch_kernel(ctx, rope_kernel, grid_for(n_tokens, 1), kThreads, 0, rows_of(op.x), rows_of(op.dst),
                      static_cast<const int32_t*>(op.positions.data),
                      static_cast<const float*>(op.freq_factors.tensor.data), op.p,
                      host_rope_freqs(op.p, op.freq_factors.tensor.data), head_dim, n_heads, n_tokens);
  return launched();
}

namespace {
// 8-bit pools rope_kv_write_q8_kernel writes: both q8_0 or both q8_64, rows of whole blocks, staged whole.
bool rope_kv_write_q8_pools(const ops::KvWrite& kv) {
  const int64_t head_dim = kv.k.ne[0];
  const int64_t block = kv_q8_block(kv.k_pool.type);
  return block > 0 && kv.v_pool.type == kv.k_pool.type && head_dim % block == 0 && head_dim <= kQ8RopeMaxDim;
}
bool float_pools(const ops::KvWrite& kv) {
  const auto float_pool = [](const Tensor& t) { return t.type == DType::f32 || t.type == DType::f16; };
  return float_pool(kv.k_pool) && float_pool(kv.v_pool);
}
}  // namespace

bool rope_kv_write_pools(const ops::KvWrite& kv) { return float_pools(kv) || rope_kv_write_q8_pools(kv); }

namespace {
// f(KT{}, VT{}): the K and V pools' element types (f16 or f32 each), as the KV-writing kernels' template
// arguments.
template <class F>
void with_pool_types(const ops::KvWrite& kv, F&& f) {
  const bool k16 = kv.k_pool.type == DType::f16, v16 = kv.v_pool.type == DType::f16;
  if (k16 && v16) {
    f(__half{}, __half{});
  } else if (!k16 && !v16) {
    f(float{}, float{});
  } else if (k16) {
    f(__half{}, float{});
  } else {
    f(float{}, __half{});
  }
}
}  // namespace

cudaError_t kv_write(const Context& ctx, const ops::KvWrite& op) {
  const int64_t head_dim = op.k.ne[0], n_kv = op.k.ne[1], total = head_dim * n_kv * op.k.ne[2];
  const auto* slots = static_cast<const int32_t*>(op.slots.data);
  const unsigned grid = grid_for(total, kThreads);
  const Rows k = rows_of(op.k), v = rows_of(op.v);
  if (op.k_pool.type == DType::q8_0) {  // and v_pool (cuda::supports)
    // A warp a block: as many threads as values, as the float pools' kernel.
    (void)launch_kernel(ctx, kv_write_q8_kernel<32>, grid, kThreads, 0, k, v,
                        static_cast<KvQ8*>(op.k_pool.data), static_cast<KvQ8*>(op.v_pool.data), slots,
                        head_dim / 32, n_kv, total / 32);
    return launched();
  }
  if (op.k_pool.type == DType::q8_64) {  // and v_pool: a warp a block, half as many threads as values
    (void)launch_kernel(ctx, kv_write_q8_kernel<64>, grid_for(total / 2, kThreads), kThreads, 0, k, v,
                        static_cast<KvQ8x64*>(op.k_pool.data), static_cast<KvQ8x64*>(op.v_pool.data), slots,
                        head_dim / 64, n_kv, total / 64);
    return launched();
  }
  with_pool_types(op, [&](auto k_elem, auto v_elem) {
    (void)launch_kernel(ctx, kv_write_kernel<decltype(k_elem), decltype(v_elem)>, grid, kThreads, 0, k, v,
                        op.k_pool.data, op.v_pool.data, slots, head_dim, n_kv, total);
  });
  return launched();
}

bool rope_supported(const ops::RopeParams& p) { return p.n_rot / 2 <= kMaxRopePairs; }

namespace {

// Whether rope_kv_write_vec_kernel takes these operands.
bool rope_vec_ok(const ops::Rope& q, const ops::Rope& k, const ops::KvWrite& kv) {
  const int64_t head_dim = q.x.ne[0], n_heads = q.x.ne[1], n_kv = k.x.ne[1], n_tokens = q.x.ne[2];
  const auto rows_ok = [&](const Tensor& t, int64_t heads) {
    return t.ne[0] == head_dim && t.ne[1] == heads && t.ne[2] == n_tokens && t.ne[3] == 1 &&
           rows_aligned16(rows_of(t));
  };
  const auto pool_ok = [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data) % 16 == 0; };
  return q.p.n_rot == head_dim && head_dim % 4 == 0 && head_dim / 2 <= kMaxRopePairs &&
         (n_heads + 2 * n_kv) * (head_dim / 4) <= INT32_MAX && rows_ok(q.x, n_heads) &&
         rows_ok(q.dst, n_heads) && rows_ok(k.x, n_kv) && rows_ok(k.dst, n_kv) && rows_ok(kv.v, n_kv) &&
         pool_ok(kv.k_pool) && pool_ok(kv.v_pool);
}

cudaError_t rope_kv_write_vec(const Context& ctx, const ops::Rope& q, const ops::Rope& k,
                              const ops::KvWrite& kv) {
  const int64_t head_dim = q.x.ne[0], n_heads = q.x.ne[1], n_kv = k.x.ne[1], n_tokens = q.x.ne[2];
  // Few tokens (decode): a token's units split among blocks of at least 64, until the device has ~2 blocks
  // a multiprocessor.
  const int64_t units = (n_heads + 2 * n_kv) * (head_dim / 4);
  const int64_t splits =
      std::clamp<int64_t>((2 * int64_t{ctx.n_sms} + n_tokens - 1) / n_tokens, 1, (units + 63) / 64);
  const int64_t per_split = (units + splits - 1) / splits;
  const dim3 grid(grid_for(n_tokens, 1), static_cast<unsigned>((units + per_split - 1) / per_split));
  const int threads = static_cast<int>(std::min<int64_t>(kThreads, (per_split + 31) / 32 * 32));
  const bool neox = q.p.layout != ops::RopeLayout::rope_layout_normal;
  const auto launch = [&](auto k_elem, auto v_elem, auto neox_tag) {
    using KT = decltype(k_elem);
    using VT = decltype(v_elem);
    (void)launch_kernel(
        ctx, rope_kv_write_vec_kernel<KT, VT, decltype(neox_tag)::value>, grid, threads, 0, head_rows(q.x),
        head_rows(q.dst), head_rows(k.x), head_rows(k.dst), head_rows(kv.v), static_cast<KT*>(kv.k_pool.data),
        static_cast<VT*>(kv.v_pool.data), static_cast<const int32_t*>(kv.slots.data),
        static_cast<const int32_t*>(q.positions.data), static_cast<const float*>(q.freq_factors.tensor.data),
        q.p, host_rope_freqs(q.p, q.freq_factors.tensor.data), static_cast<int>(n_heads),
        static_cast<int>(n_kv), n_tokens, static_cast<int>(per_split));
  };
  with_pool_types(kv, [&](auto k_elem, auto v_elem) {
    if (neox) {
      launch(k_elem, v_elem, std::true_type{});
    } else {
      launch(k_elem, v_elem, std::false_type{});
    }
  });
  return launched();
}

}  // namespace

cudaError_t rope_kv_write(const Context& ctx, const ops::Rope& q, const ops::Rope& k,
                          const ops::KvWrite& kv) {
  if (!rope_supported(q.p) || !rope_kv_write_pools(kv)) return cudaErrorNotSupported;
  const int64_t head_dim = q.x.ne[0], n_heads = q.x.ne[1], n_kv = k.x.ne[1], n_tokens = q.x.ne[2];
  if (rope_kv_write_q8_pools(kv)) {
    // Few tokens (decode): a token's rows split among blocks of at least 4 warps, until the device has ~2
    // blocks a multiprocessor.
    const int64_t rows = n_heads + 2 * n_kv;
    const int64_t splits =
        std::clamp<int64_t>((2 * int64_t{ctx.n_sms} + n_tokens - 1) / n_tokens, 1, (rows + 3) / 4);
    const int64_t per_split = (rows + splits - 1) / splits;
    const dim3 grid(grid_for(n_tokens, 1), static_cast<unsigned>((rows + per_split - 1) / per_split));
    const int threads = static_cast<int>(std::min<int64_t>(kThreads, 32 * per_split));
    const auto launch = [&](auto* pool_elem) {
      using KV = std::remove_pointer_t<decltype(pool_elem)>;
      (void)launch_kernel(
          ctx, rope_kv_write_q8_kernel<kKvBlock<KV>>, grid, threads, 0, rows_of(q.x), rows_of(q.dst),
          rows_of(k.x), rows_of(k.dst), rows_of(kv.v), static_cast<KV*>(kv.k_pool.data),
          static_cast<KV*>(kv.v_pool.data), static_cast<const int32_t*>(kv.slots.data),
          static_cast<const int32_t*>(q.positions.data),
          static_cast<const float*>(q.freq_factors.tensor.data), q.p,
          host_rope_freqs(q.p, q.freq_factors.tensor.data), static_cast<int>(head_dim),
          static_cast<int>(n_heads), static_cast<int>(n_kv), n_tokens, static_cast<int>(per_split));
    };
    if (kv.k_pool.type == DType::q8_64) {
      launch(static_cast<KvQ8x64*>(nullptr));
    } else {
      launch(static_cast<KvQ8*>(nullptr));
    }
    return launched();
  }
  if (rope_vec_ok(q, k, kv)) return rope_kv_write_vec(ctx, q, k, kv);
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
    (void)launch_kernel(
        ctx, rope_kv_write_kernel<KT, VT>, grid, kThreads, 0, rows_of(q.x), rows_of(q.dst), rows_of(k.x),
        rows_of(k.dst), rows_of(kv.v), kv.k_pool.data, kv.v_pool.data,
        static_cast<const int32_t*>(kv.slots.data), static_cast<const int32_t*>(q.positions.data),
        static_cast<const float*>(q.freq_factors.tensor.data), q.p,
        host_rope_freqs(q.p, q.freq_factors.tensor.data), head_dim, n_heads, n_kv, n_tokens, per_split);
  };
  with_pool_types(kv, launch);
  return launched();
}

}  // namespace kiln::cuda
