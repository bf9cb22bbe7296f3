// The row-wise and elementwise ops on CUDA: norms, RoPE, softmax, KV writes, gated activations, add/mul,
// scale, argmax, MoE routing and mixing. All are bound by memory traffic: one pass over their operands,
// f32 arithmetic (double for RoPE angles, as the CPU backend), rows addressed through their views' strides.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_launch.cuh"
#include "backends/cuda/cuda_round_q8.cuh"
#include "backends/cuda/cuda_rowmath.cuh"
#include "ops/rope_freq.h"

namespace kiln::cuda {

namespace {

constexpr int kThreads = 256;

cudaError_t launched() { return cudaGetLastError(); }

// ---- norms: one row per cluster of blocks ----
//
// A row of n elements is cut into slices of `slice` elements (a multiple of 32), one block each; the blocks
// of a row form a thread-block cluster (sm_90 and newer; elsewhere one block takes the whole row). Each block
// reads and writes only its own slice, so a norm may write in place; the slices' sums of squares meet through
// distributed shared memory, in rank order. A single row (decode) then runs on several multiprocessors: its
// cost is in the instructions each thread issues, not in bytes. The slicing depends on n alone, so a row gets
// the same bits alone or in a batch, fused with the residual add or not.

// Up to kRowRegs elements a thread are held in registers: element lo + threadIdx.x + k * blockDim.x in slot
// k. All of a slice's loads are issued before its first store (a store between them would make each load wait
// for the one before: the compiler cannot tell they do not alias).
constexpr int kRowRegs = 8;
constexpr int kNormMaxCluster = 8;  // the portable cluster size
constexpr int64_t kNormMinSlice = 512;
// The norm kernels are compiled twice: bounded at 1024 threads a block (a prefill's packed rows), where ptxas
// gives a thread 64 registers and the fused add + norm spills its slice, and at kNormSmallBlock, which the
// blocks of a row cut into slices (decode) fit, with room to hold the slice in registers
// (KILN_CUDA_NORM_SMALL_BLOCK=0: the 1024-thread kernels always, for measuring).
constexpr int kNormSmallBlock = 256;
// The slots a thread holds in a kernel bounded at `max_threads`: kRowRegs, but 4 at 1024 threads, whose 64
// registers a thread held 8 slots of a, b and the weight only by spilling them (524 bytes of local loads a
// thread, 153 us for the 8B's 2048 x 4096 add + norm, 4.6 times its bytes at the copy bandwidth). A packed
// row's slices are of 128 threads (norm_shape), so 4 slots hold rows of up to 4096; longer ones read x twice
// (rms_norm_loop: the same sums in the same order as the registers' slots, whose empty ones add zeros).
__host__ __device__ constexpr int norm_slots(int max_threads) { return max_threads >= 1024 ? 4 : kRowRegs; }
bool norm_small_block(int threads) {
  static const bool on = [] {
    const char* v = std::getenv("KILN_CUDA_NORM_SMALL_BLOCK");
    return v == nullptr || std::atoi(v) != 0;
  }();
  return on && threads <= kNormSmallBlock;
}
// A row of at most this many elements is one block's (KILN_CUDA_NORM_ONE_BLOCK=N sets it, for measuring):
// cutting it would pay the cluster's two barriers for a few elements a thread.
int64_t norm_one_block() {
  static const int64_t n = [] {
    const char* v = std::getenv("KILN_CUDA_NORM_ONE_BLOCK");
    return v != nullptr ? std::max<int64_t>(std::atoll(v), 0) : int64_t{1024};
  }();
  return n;
}

// Where a row's slices run: each a block of a cluster (decode: a row spread over multiprocessors), or, for
// many rows (prefill), packed into one block a row, slice j taking threads [j * nt, (j + 1) * nt) with the
// same per-thread elements and the same order of sums as its block would have: the same bits either way.
struct Part {
  int64_t n_parts;  // slices a row
  int64_t rank;     // this thread's slice
  int tid, nt;      // its thread in the slice, the slice's threads
  bool packed;
};
__device__ inline Part part_of(int64_t n, int64_t slice, bool packed) {
  const int64_t n_parts = (n + slice - 1) / slice;
  if (!packed)
    return {n_parts, blockIdx.x % n_parts, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x),
            false};
  const int nt = static_cast<int>(blockDim.x / n_parts);
  return {n_parts, threadIdx.x / nt, static_cast<int>(threadIdx.x % nt), nt, true};
}

// The sum over a row's slices, in rank order, of each slice's sum of v (a block's sum: warp sums, then the
// sum of the warps' in one warp); every thread gets it. `red` holds 32 floats, `part` kNormMaxCluster; the
// block synchronises.
__device__ inline float slices_sum(float v, float* red, float* part, const Part& P) {
  if (P.packed) {
    v = warp_sum(v);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = P.nt / 32;
    __syncthreads();  // red and part may still be read by a previous call
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < warps ? red[P.rank * warps + lane] : 0.0f;
    v = warp_sum(v);
    if (P.tid == 0) part[P.rank] = v;
    __syncthreads();
    float s = 0.0f;
    for (int64_t j = 0; j < P.n_parts; ++j) s += part[j];
    return s;
  }
  v = block_sum(v, red);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
  const unsigned n = cl.num_blocks();
  if (n == 1) return v;
  if (threadIdx.x == 0) *part = v;
  cl.sync();
  float s = 0.0f;
  for (unsigned j = 0; j < n; ++j) s += *cl.map_shared_rank(part, j);
  cl.sync();  // every block has read the others' parts before one overwrites its own or exits
  return s;
#else
  return v;
#endif
}

// The slice [lo, hi) of a row: whose slot k holds element i = lo + tid + k * nt.
struct Slice {
  int64_t lo, hi;
  int tid, nt;
  __device__ int64_t at(int k) const { return lo + tid + int64_t{k} * nt; }
  template <int kSlots>
  __device__ bool in_regs() const {
    return hi - lo <= int64_t{kSlots} * nt;
  }
};
__device__ inline Slice slice_of(int64_t n, int64_t slice, const Part& P) {
  const int64_t lo = P.rank * slice;
  return {lo, min(n, lo + slice), P.tid, P.nt};
}

template <int kSlots>
__device__ inline void load_slice(const float* p, const Slice& s, float (&v)[kSlots]) {
#pragma unroll
  for (int k = 0; k < kSlots; ++k) v[k] = s.at(k) < s.hi ? p[s.at(k)] : 0.0f;
}
template <int kSlots>
__device__ inline void load_norm_weight(const float* w, float w_add, const Slice& s, float (&g)[kSlots]) {
#pragma unroll
  for (int k = 0; k < kSlots; ++k) g[k] = w != nullptr && s.at(k) < s.hi ? w[s.at(k)] + w_add : 1.0f;
}

// dst slice = x * inv_rms * g, the row's sum of squares taken over the cluster. xq / xds (optional; n a
// multiple of 32, st f32): the result also rounded to 8 bits per block of 32 for the integer GEMV, as
// quantize_x_kernel (cuda_matmul.cu) rounds it: a warp holds a block's 32 values. half.row (optional): the
// result also in 16 bits for the GEMM (store_half).
template <int kSlots>
__device__ inline void rms_norm_regs(const float (&x)[kSlots], const float (&g)[kSlots], const Slice& s,
                                     char* yr, Store st, int64_t n, float eps, float* red, float* part,
                                     const Part& P, int8_t* xq, float2* xds, HalfCopy half = {}) {
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kSlots; ++k) ss += x[k] * x[k];  // zero past the slice
  ss = slices_sum(ss, red, part, P);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
    const int64_t i = s.at(k);
    if (i >= s.hi) break;
    const float v = x[k] * inv * g[k];
    store(st, yr, i, v);
    if (xq != nullptr) round_q8(v, xq + i, xds + i / 32);
    if (half.row != nullptr) store_half(half, i, v);
  }
}
// The same for slices longer than the registers hold: x read twice (a caller may have written it just
// before: each thread reads only the elements it wrote).
__device__ inline void rms_norm_loop(const float* xr, const Slice& s, char* yr, Store st, const float* w,
                                     int64_t n, float eps, float w_add, float* red, float* part,
                                     const Part& P, int8_t* xq, float2* xds, HalfCopy half = {}) {
  float ss = 0.0f;
  for (int64_t i = s.lo + s.tid; i < s.hi; i += s.nt) ss += xr[i] * xr[i];
  ss = slices_sum(ss, red, part, P);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  for (int64_t i = s.lo + s.tid; i < s.hi; i += s.nt) {
    const float v = xr[i] * inv * (w != nullptr ? w[i] + w_add : 1.0f);
    store(st, yr, i, v);
    if (xq != nullptr) round_q8(v, xq + i, xds + i / 32);
    if (half.row != nullptr) store_half(half, i, v);
  }
}

// Rows r = blockIdx.x / cluster, ... (every block of a cluster walks the same rows); packed: blockIdx.x, ...
__device__ inline int64_t first_row(const Part& P) { return P.packed ? blockIdx.x : blockIdx.x / P.n_parts; }
__device__ inline int64_t row_step(const Part& P) { return P.packed ? gridDim.x : gridDim.x / P.n_parts; }

template <int kMaxThreads>
__global__ void __launch_bounds__(kMaxThreads)
    rms_norm_kernel(Rows x, Rows dst, Store st, const float* w, int64_t n, float eps, float w_add,
                    int64_t n_rows, int64_t slice, bool packed) {
  constexpr int kSlots = norm_slots(kMaxThreads);
  pdl_begin();
  __shared__ float red[32], part[kNormMaxCluster];
  const Part P = part_of(n, slice, packed);
  const Slice s = slice_of(n, slice, P);
  for (int64_t r = first_row(P); r < n_rows; r += row_step(P)) {
    const float* xr = x.row_as<const float>(r);
    if (s.in_regs<kSlots>()) {
      float v[kSlots], g[kSlots];
      load_slice(xr, s, v);
      load_norm_weight(w, w_add, s, g);
      rms_norm_regs(v, g, s, dst.row(r), st, n, eps, red, part, P, nullptr, nullptr);
    } else {
      rms_norm_loop(xr, s, dst.row(r), st, w, n, eps, w_add, red, part, P, nullptr, nullptr);
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

// Each pair's frequency and magnitude (ops::rope_freq: a double pow, more under YaRN), made on the host as
// the CPU backend makes them and passed by value, when there are at most kRopeArgPairs pairs and no frequency
// factors (a tensor in device memory); else (on = false) each block makes them itself.
// KILN_CUDA_ROPE_HOST_FREQ=0: always on the device (for comparison).
constexpr int kRopeArgPairs = 128;
struct RopeFreqs {
  ops::RopeFreq f[kRopeArgPairs];
  bool on;
};
RopeFreqs host_rope_freqs(const ops::RopeParams& p, const void* factors) {
  static const bool enabled = [] {
    const char* v = std::getenv("KILN_CUDA_ROPE_HOST_FREQ");
    return v == nullptr || std::atoi(v) != 0;
  }();
  RopeFreqs r{};
  r.on = enabled && factors == nullptr && p.n_rot / 2 <= kRopeArgPairs;
  if (r.on) {
    for (int i = 0; i < p.n_rot / 2; ++i) r.f[i] = ops::rope_freq(p, i, 1.0f);
  }
  return r;
}

// The block computes the cos/sin table of position `pos` into cs_sn (n_rot / 2 pairs).
__device__ inline void rope_table(float2* cs_sn, const ops::RopeParams& p, const float* factors,
                                  const RopeFreqs& fr, int32_t pos) {
  for (int i = threadIdx.x; i < p.n_rot / 2; i += blockDim.x) {
    const ops::RopeFreq f = fr.on ? fr.f[i] : ops::rope_freq(p, i, factors != nullptr ? factors[i] : 1.0f);
    const double angle = static_cast<double>(pos) * f.theta_scale;
    cs_sn[i] =
        make_float2(static_cast<float>(cos(angle) * f.mscale), static_cast<float>(sin(angle) * f.mscale));
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
// Pair (xa, xb) rotated by cs_sn = (cos, sin), each product rounded as written (no contraction left to the
// compiler), so that every RoPE kernel, fused or not, gets the same bits whatever code surrounds it.
__device__ inline float2 rope_rotate(float xa, float xb, float2 cs_sn) {
  return make_float2(__fmaf_rn(xa, cs_sn.x, -__fmul_rn(xb, cs_sn.y)),
                     __fmaf_rn(xa, cs_sn.y, __fmul_rn(xb, cs_sn.x)));
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
    // The positions (step metadata) and the factors (a weight) are not written by kernels: the first token's
    // table is made before the wait on the kernel before.
    rope_table(cs_sn, p, factors, fr, positions[t]);
    if (!waited) {
      pdl_begin();
      waited = true;
    }
    __syncthreads();
    for (int64_t c = threadIdx.x; c < per_head * n_heads; c += blockDim.x) {
      const DivMod hi = divmod(c, per_head);
      const int64_t h = hi.q, i = hi.r, row = h + n_heads * t;
      rope_element(x.row_as<const float>(row), dst.row_as<float>(row), i, cs_sn, p, [](int64_t, float) {});
    }
  }
  if (!waited) pdl_begin();
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

// ---- fused sequences (run_fused): one launch, the arithmetic of the ops one by one ----

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
    const int64_t slot_row = int64_t{slots[t]} * n_kv;  // pools: [head_dim, n_kv, block_size, n_blocks]
    __syncthreads();                                    // the previous token's table is no longer read
    // The slots and positions (step metadata) and the factors (a weight) are not written by kernels: the
    // first token's table is made before the wait on the kernel before (decode: the block's only token).
    rope_table(cs_sn, p, factors, fr, positions[t]);
    if (!waited) {
      pdl_begin();
      waited = true;
    }
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
    // The slots and positions (step metadata) and the factors (a weight) are not written by kernels: the
    // first token's table is made before the wait on the kernel before.
    rope_table(cs_sn, p, factors, fr, positions[t]);
    if (!waited) {
      pdl_begin();
      waited = true;
    }
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

// sum = a + b, then dst = rms_norm(sum) as rms_norm_kernel (the same slices and clusters, so the same bits).
// kOut says what the kernel writes beside dst (a template parameter, so that each kernel holds the registers
// of its own copy alone: at 1024 threads, 64 a thread): q8, xq / xds (see rms_norm_regs; row r's at xq + r *
// n and xds + r * n / 32); half, xh the result in 16 bits (f16: as f16, else bf16), row r at xh + r * n.
// kMaxThreads: the block's bound (see norm_shape).
enum class NormOut : uint8_t { plain, q8, half };
template <NormOut kOut, int kMaxThreads>
__global__ void __launch_bounds__(kMaxThreads)
    add_rms_norm_kernel(Rows a, Rows b, Rows sum, Rows dst, Store st, const float* w, int64_t n, float eps,
                        float w_add, int64_t n_rows, int64_t slice, bool packed, int8_t* xq, float2* xds,
                        uint16_t* xh, bool f16) {
  constexpr int kSlots = norm_slots(kMaxThreads);
  pdl_begin();
  __shared__ float red[32], part[kNormMaxCluster];
  const Part P = part_of(n, slice, packed);
  const Slice s = slice_of(n, slice, P);
  for (int64_t r = first_row(P); r < n_rows; r += row_step(P)) {
    const float* ar = a.row_as<const float>(r);
    const float* br = b.row_as<const float>(r);
    float* sr = sum.row_as<float>(r);
    int8_t* q = kOut == NormOut::q8 && xq != nullptr ? xq + r * n : nullptr;
    float2* ds = kOut == NormOut::q8 && xds != nullptr ? xds + r * (n / 32) : nullptr;
    const HalfCopy half{kOut == NormOut::half ? reinterpret_cast<char*>(xh + r * n) : nullptr, f16};
    if (s.in_regs<kSlots>()) {
      float va[kSlots], vb[kSlots], g[kSlots];
      load_slice(ar, s, va);
      load_slice(br, s, vb);
      load_norm_weight(w, w_add, s, g);
#pragma unroll
      for (int k = 0; k < kSlots; ++k) {
        va[k] += vb[k];
        if (s.at(k) < s.hi) sr[s.at(k)] = va[k];
      }
      rms_norm_regs(va, g, s, dst.row(r), st, n, eps, red, part, P, q, ds, half);
    } else {
      for (int64_t i = s.lo + s.tid; i < s.hi; i += s.nt) sr[i] = ar[i] + br[i];
      rms_norm_loop(sr, s, dst.row(r), st, w, n, eps, w_add, red, part, P, q, ds, half);
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
    const DivMod ti = divmod(e, n);
    const int64_t t = ti.q, i = ti.r;
    const float* wt = w.row_as<const float>(t);
    float acc = 0.0f;
    for (int64_t s = 0; s < n_slots; ++s) acc += wt[s] * y.row_as<const float>(s + n_slots * t)[i];
    dst.row_as<float>(t)[i] = acc;
  }
}

// How a norm of rows of n elements is cut (see the norms above): slices of at least kNormMinSlice elements,
// as many as kNormMaxCluster, one block of `threads` each, a cluster a row; one block a row before sm_90.
struct NormShape {
  int64_t slice;
  unsigned cluster;  // blocks a cluster: 1 when packed
  dim3 grid;
  int threads;
  bool packed;  // a row's slices in one block (part_of)
};
NormShape norm_shape(const Context& ctx, int64_t n, int64_t rows) {
  const int64_t want = ctx.clusters && n > norm_one_block()
                           ? std::clamp<int64_t>((n + kNormMinSlice - 1) / kNormMinSlice, 1, kNormMaxCluster)
                           : 1;
  const int64_t slice = want == 1 ? n : ((n + want - 1) / want + 31) / 32 * 32;
  const auto cluster = static_cast<unsigned>((n + slice - 1) / slice);
  // Threads: enough for the slice to fit kRowRegs slots (at least 128, at most 1024).
  const int threads = std::max(128, row_threads((slice + kRowRegs - 1) / kRowRegs));
  // Rows enough to fill the device with whole blocks: a row's slices packed into one block, which spares the
  // cluster's launch and its two barriers across multiprocessors (prefill).
  if (cluster > 1 && int64_t{cluster} * threads <= 1024 && rows >= ctx.n_sms) {
    const auto row_blocks = static_cast<unsigned>(std::min<int64_t>(rows, 0x7fffffff));
    return {slice, 1, dim3(row_blocks), static_cast<int>(cluster) * threads, true};
  }
  const int64_t max_rows = int64_t{0x7fffffff} / cluster;
  const auto row_blocks = static_cast<unsigned>(std::clamp<int64_t>(rows, 1, max_rows));
  return {slice, cluster, dim3(row_blocks * cluster), threads, false};
}

}  // namespace

cudaError_t rms_norm(const Context& ctx, const ops::RmsNorm& op) {
  const int64_t n = op.x.ne[0], rows = op.x.n_rows();
  const NormShape sh = norm_shape(ctx, n, rows);
  (void)launch_kernel_cluster(
      ctx, norm_small_block(sh.threads) ? rms_norm_kernel<kNormSmallBlock> : rms_norm_kernel<1024>, sh.grid,
      sh.threads, 0, sh.cluster, rows_of(op.x), rows_of(op.dst), store_of(op.dst.type),
      static_cast<const float*>(op.w.tensor.data), n, op.eps, op.add_one ? 1.0f : 0.0f, rows, sh.slice,
      sh.packed);
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
                      static_cast<const float*>(op.freq_factors.tensor.data), op.p,
                      host_rope_freqs(op.p, op.freq_factors.tensor.data), head_dim, n_heads, n_tokens);
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

cudaError_t gated_act(const Context& ctx, const ops::GatedAct& op, int* xq, float2* xds, uint16_t* xh,
                      bool f16) {
  const int64_t n = op.up.ne[0], total = n * op.up.n_rows();
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
  with_pool_types(op, [&](auto k_elem, auto v_elem) {
    (void)launch_kernel(ctx, kv_write_kernel<decltype(k_elem), decltype(v_elem)>, grid, kThreads, 0, k, v,
                        op.k_pool.data, op.v_pool.data, slots, head_dim, n_kv, total);
  });
  return launched();
}

bool rope_supported(const ops::RopeParams& p) { return p.n_rot / 2 <= kMaxRopePairs; }

namespace {

// Whether rope_kv_write_vec_kernel takes these operands (KILN_CUDA_ROPE_VEC=0: never, for measuring).
bool rope_vec_ok(const ops::Rope& q, const ops::Rope& k, const ops::KvWrite& kv) {
  static const bool enabled = [] {
    const char* v = std::getenv("KILN_CUDA_ROPE_VEC");
    return v == nullptr || std::atoi(v) != 0;
  }();
  const int64_t head_dim = q.x.ne[0], n_heads = q.x.ne[1], n_kv = k.x.ne[1], n_tokens = q.x.ne[2];
  const auto rows_ok = [&](const Tensor& t, int64_t heads) {
    return t.ne[0] == head_dim && t.ne[1] == heads && t.ne[2] == n_tokens && t.ne[3] == 1 &&
           rows_aligned16(rows_of(t));
  };
  const auto pool_ok = [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data) % 16 == 0; };
  return enabled && q.p.n_rot == head_dim && head_dim % 4 == 0 && head_dim / 2 <= kMaxRopePairs &&
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
  if (!rope_supported(q.p)) return cudaErrorNotSupported;
  if (rope_vec_ok(q, k, kv)) return rope_kv_write_vec(ctx, q, k, kv);
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

namespace {
using AddNormKernel = void (*)(Rows, Rows, Rows, Rows, Store, const float*, int64_t, float, float, int64_t,
                               int64_t, bool, int8_t*, float2*, uint16_t*, bool);
template <int kMaxThreads>
AddNormKernel add_rms_norm_for(NormOut out) {
  switch (out) {
    case NormOut::q8: return add_rms_norm_kernel<NormOut::q8, kMaxThreads>;
    case NormOut::half: return add_rms_norm_kernel<NormOut::half, kMaxThreads>;
    case NormOut::plain: break;
  }
  return add_rms_norm_kernel<NormOut::plain, kMaxThreads>;
}
AddNormKernel add_rms_norm_for(NormOut out, int threads) {
  return norm_small_block(threads) ? add_rms_norm_for<kNormSmallBlock>(out) : add_rms_norm_for<1024>(out);
}
}  // namespace

cudaError_t add_rms_norm(const Context& ctx, const ops::Binary& add, const ops::RmsNorm& norm, int* xq,
                         float2* xds, uint16_t* xh, bool f16) {
  const int64_t n = add.a.ne[0], rows = add.a.n_rows();
  const NormShape sh = norm_shape(ctx, n, rows);
  (void)launch_kernel_cluster(
      ctx,
      add_rms_norm_for(xh != nullptr   ? NormOut::half
                       : xq != nullptr ? NormOut::q8
                                       : NormOut::plain,
                       sh.threads),
      sh.grid, sh.threads, 0, sh.cluster, rows_of(add.a), rows_of(add.b.tensor), rows_of(add.dst),
      rows_of(norm.dst), store_of(norm.dst.type), static_cast<const float*>(norm.w.tensor.data), n, norm.eps,
      norm.add_one ? 1.0f : 0.0f, rows, sh.slice, sh.packed, reinterpret_cast<int8_t*>(xq), xds, xh, f16);
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
