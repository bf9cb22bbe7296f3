// RMSNorm, LayerNorm and the residual add fused with the RMSNorm of its sum (run_fused's add + norm) on CUDA.
// Bound by memory traffic: one pass over their operands, f32 arithmetic, rows addressed through their views'
// strides.
#include <cooperative_groups.h>
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
// The fewest elements a slice (a 4096-wide row: 8 blocks) and the fewest threads a slice's block.
constexpr int64_t kNormMinSlice = 512;
constexpr int kNormMinThreads = 128;
// The norm kernels are compiled twice: bounded at 1024 threads a block (a prefill's packed rows), where ptxas
// gives a thread 64 registers and the fused add + norm spills its slice, and at kNormSmallBlock, which the
// blocks of a row cut into slices (decode) fit, with room to hold the slice in registers.
constexpr int kNormSmallBlock = 256;
// The slots a thread holds in a kernel bounded at `max_threads`: kRowRegs, but 4 at 1024 threads, whose 64
// registers a thread held 8 slots of a, b and the weight only by spilling them (524 bytes of local loads a
// thread, 153 us for the 8B's 2048 x 4096 add + norm, 4.6 times its bytes at the copy bandwidth). A packed
// row's slices are of 128 threads (norm_shape), so 4 slots hold rows of up to 4096; longer ones read x twice
// (rms_norm_loop: the same sums in the same order as the registers' slots, whose empty ones add zeros).
__host__ __device__ constexpr int norm_slots(int max_threads) { return max_threads >= 1024 ? 4 : kRowRegs; }
bool norm_small_block(int threads) { return threads <= kNormSmallBlock; }
// A row of at most this many elements is one block's: cutting it would pay the cluster's two barriers for a
// few elements a thread.
constexpr int64_t kNormOneBlock = 1024;

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
// sum of the warps' in one warp); every thread gets it. kMax: the largest v instead. `red` holds 32 floats,
// `part` 2 * kNormMaxCluster (cluster: the slices' sums, by the parity of the exchange `turn`: consecutive
// exchanges of a block, one or two a row, take alternate halves); the block synchronises.
//
// In a cluster (all of whose blocks have started: cluster_started) each block writes its sum into every
// block's `part` (st.shared::cluster), then one cluster barrier (release / acquire) makes them visible, and
// each block adds its own copy: after the barrier no block reads another's shared memory, so none waits for
// the others to have read before it exits. A block can be one row ahead of another (it passes the next
// barrier only once all have arrived at it, after their reads of this exchange), hence the two halves of
// `part`.
template <bool kMax = false>
__device__ inline float slices_sum(float v, float* red, float* part, const Part& P, int64_t turn = 0) {
  const auto op = [](float a, float b) { return kMax ? fmaxf(a, b) : a + b; };
  const float none = kMax ? -INFINITY : 0.0f;
  if (P.packed) {
    v = kMax ? warp_max(v) : warp_sum(v);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = P.nt / 32;
    __syncthreads();  // red and part may still be read by a previous call
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < warps ? red[P.rank * warps + lane] : none;
    v = kMax ? warp_max(v) : warp_sum(v);
    if (P.tid == 0) part[P.rank] = v;
    __syncthreads();
    float s = none;
    for (int64_t j = 0; j < P.n_parts; ++j) s = op(s, part[j]);
    return s;
  }
  v = kMax ? block_max(v, red) : block_sum(v, red);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
  const unsigned n = cl.num_blocks();
  if (n == 1) return v;
  float* mine = part + (turn % 2) * kNormMaxCluster;
  if (threadIdx.x < n) {
    const auto local = static_cast<unsigned>(__cvta_generic_to_shared(mine + cl.block_rank()));
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(threadIdx.x));
    asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(remote), "f"(v) : "memory");
  }
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
  float s = none;
  for (unsigned j = 0; j < n; ++j) s = op(s, mine[j]);
  return s;
#else
  return v;
#endif
}

// In a cluster (a row's slices over blocks), every block waits until all of its cluster's have started: a
// block may write into another's shared memory (slices_sum) only once that one runs (the rule of distributed
// shared memory; compute-sanitizer's racecheck flags the writes otherwise). Called before the PDL wait, so
// that under programmatic launch the barrier overlaps the kernel before.
__device__ inline void cluster_started(const Part& P) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (!P.packed && cooperative_groups::this_cluster().num_blocks() > 1)
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;" ::: "memory");
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

// A row's result also rounded to e4m3 for the FP8 GEMM (E4m3Out's row r): codes[i] for element i, *scale
// the row's scale; codes null: none.
struct E4m3Row {
  uint8_t* codes;
  float* scale;
  float fixed;
};
// The exchange numbers of a row's turn: one a row (its sum of squares), or two with an e4m3 row rounded by
// its largest value (the sum, then the largest value).
__device__ inline int64_t sum_turn(const E4m3Row& e4, int64_t turn) {
  return e4.codes != nullptr && e4.fixed <= 0.0f ? 2 * turn : turn;
}
// The scale of an e4m3 row from this thread's largest |v| (the row's, taken over the slices when it is not
// static), written by the row's first thread.
__device__ inline float e4m3_row_scale(const E4m3Row& e4, float amax, float* red, float* part, const Part& P,
                                       int64_t turn) {
  if (e4.fixed <= 0.0f) amax = slices_sum<true>(amax, red, part, P, 2 * turn + 1);
  const float sc = fp8_row_scale(amax, e4.fixed);
  if (P.rank == 0 && P.tid == 0) *e4.scale = sc;
  return sc;
}

// dst slice = x * inv_rms * g, the row's sum of squares taken over the cluster. xq / xds (optional; n a
// multiple of 32, st f32): the result also rounded to 8 bits per block of 32 for the integer GEMV, as
// quantize_x_kernel (matmul/matmul.cu) rounds it: a warp holds a block's 32 values. half.row (optional): the
// result also in 16 bits for the GEMM (store_half). e4.codes (optional; st f32): the result also rounded to
// e4m3 as fp8_x_rows (matmul/fp8_gemm.cu) rounds it, each value computed again for its code. sum_row
// (optional): x is also stored there, after the sums (a cluster's barrier then waits for no global store of
// this thread). turn: the row's turn in the block.
template <int kSlots>
__device__ inline void rms_norm_regs(const float (&x)[kSlots], const float (&g)[kSlots], const Slice& s,
                                     char* yr, Store st, int64_t n, float eps, float* red, float* part,
                                     const Part& P, int8_t* xq, float2* xds, HalfCopy half, E4m3Row e4,
                                     float* sum_row, int64_t turn) {
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kSlots; ++k) ss += x[k] * x[k];  // zero past the slice
  ss = slices_sum(ss, red, part, P, sum_turn(e4, turn));
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  float amax = 0.0f;
#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
    const int64_t i = s.at(k);
    if (i >= s.hi) break;
    if (sum_row != nullptr) sum_row[i] = x[k];
    const float v = x[k] * inv * g[k];
    store(st, yr, i, v);
    if (xq != nullptr) round_q8(v, xq + i, xds + i / 32);
    if (half.row != nullptr) store_half(half, i, v);
    amax = fmaxf(amax, fabsf(v));
  }
  if (e4.codes == nullptr) return;
  const float sc = e4m3_row_scale(e4, amax, red, part, P, turn);
#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
    const int64_t i = s.at(k);
    if (i >= s.hi) break;
    e4.codes[i] = fp8_code(x[k] * inv * g[k], sc);
  }
}
// The same for slices longer than the registers hold: x read twice (a caller may have written it just
// before: each thread reads only the elements it wrote).
__device__ inline void rms_norm_loop(const float* xr, const Slice& s, char* yr, Store st, const float* w,
                                     int64_t n, float eps, float w_add, float* red, float* part,
                                     const Part& P, int8_t* xq, float2* xds, HalfCopy half, E4m3Row e4,
                                     int64_t turn) {
  float ss = 0.0f;
  for (int64_t i = s.lo + s.tid; i < s.hi; i += s.nt) ss += xr[i] * xr[i];
  ss = slices_sum(ss, red, part, P, sum_turn(e4, turn));
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  const auto value = [&](int64_t i) { return xr[i] * inv * (w != nullptr ? w[i] + w_add : 1.0f); };
  float amax = 0.0f;
  for (int64_t i = s.lo + s.tid; i < s.hi; i += s.nt) {
    const float v = value(i);
    store(st, yr, i, v);
    if (xq != nullptr) round_q8(v, xq + i, xds + i / 32);
    if (half.row != nullptr) store_half(half, i, v);
    amax = fmaxf(amax, fabsf(v));
  }
  if (e4.codes == nullptr) return;
  const float sc = e4m3_row_scale(e4, amax, red, part, P, turn);
  for (int64_t i = s.lo + s.tid; i < s.hi; i += s.nt) e4.codes[i] = fp8_code(value(i), sc);
}

// Rows r = blockIdx.x / cluster, ... (every block of a cluster walks the same rows); packed: blockIdx.x, ...
__device__ inline int64_t first_row(const Part& P) { return P.packed ? blockIdx.x : blockIdx.x / P.n_parts; }
__device__ inline int64_t row_step(const Part& P) { return P.packed ? gridDim.x : gridDim.x / P.n_parts; }

template <int kMaxThreads>
__global__ void __launch_bounds__(kMaxThreads)
    rms_norm_kernel(Rows x, Rows dst, Store st, const float* w, int64_t n, float eps, float w_add,
                    int64_t n_rows, int64_t slice, bool packed) {
  constexpr int kSlots = norm_slots(kMaxThreads);
  __shared__ float red[32], part[2 * kNormMaxCluster];
  // Before the wait: the shape and, in the small-block kernel (a row's slices spread over blocks: decode),
  // the norm's weights (constant), which every row of a thread shares. (The 1024-thread kernel of packed rows
  // holding them across rows would spill.)
  constexpr bool kEarly = kMaxThreads <= kNormSmallBlock;
  const Part P = part_of(n, slice, packed);
  const Slice s = slice_of(n, slice, P);
  const bool regs = s.in_regs<kSlots>();
  float g[kSlots];
  if (kEarly && regs) load_norm_weight(w, w_add, s, g);
  cluster_started(P);
  pdl_begin();
  int64_t turn = 0;
  for (int64_t r = first_row(P); r < n_rows; r += row_step(P), ++turn) {
    const float* xr = x.row_as<const float>(r);
    if (regs) {
      float v[kSlots];
      load_slice(xr, s, v);
      if (!kEarly) load_norm_weight(w, w_add, s, g);
      rms_norm_regs(v, g, s, dst.row(r), st, n, eps, red, part, P, nullptr, nullptr, {}, {}, nullptr, turn);
    } else {
      rms_norm_loop(xr, s, dst.row(r), st, w, n, eps, w_add, red, part, P, nullptr, nullptr, {}, {}, turn);
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

// ---- fused sequences (run_fused): one launch, the arithmetic of the ops one by one ----

// sum = a + b, then dst = rms_norm(sum) as rms_norm_kernel (the same slices and clusters, so the same bits).
// kOut says what the kernel writes beside dst (a template parameter, so that each kernel holds the registers
// of its own copy alone: at 1024 threads, 64 a thread): q8, xq / xds (see rms_norm_regs; row r's at xq + r *
// n and xds + r * n / 32); half, xh the result in 16 bits (f16: as f16, else bf16), row r at xh + r * n;
// e4m3, e4 the result rounded for the FP8 GEMM (row r's codes at e4.codes + r * n, its scale e4.scales[r]).
// kMaxThreads: the block's bound (see norm_shape).
enum class NormOut : uint8_t { plain, q8, half, e4m3 };
template <NormOut kOut, int kMaxThreads>
__global__ void __launch_bounds__(kMaxThreads)
    add_rms_norm_kernel(Rows a, Rows b, Rows sum, Rows dst, Store st, const float* w, int64_t n, float eps,
                        float w_add, int64_t n_rows, int64_t slice, bool packed, int8_t* xq, float2* xds,
                        uint16_t* xh, bool f16, E4m3Out e4) {
  constexpr int kSlots = norm_slots(kMaxThreads);
  __shared__ float red[32], part[2 * kNormMaxCluster];
  // Before the wait: as rms_norm_kernel's.
  constexpr bool kEarly = kMaxThreads <= kNormSmallBlock;
  const Part P = part_of(n, slice, packed);
  const Slice s = slice_of(n, slice, P);
  const bool regs = s.in_regs<kSlots>();
  float g[kSlots];
  if (kEarly && regs) load_norm_weight(w, w_add, s, g);
  cluster_started(P);
  pdl_begin();
  int64_t turn = 0;
  for (int64_t r = first_row(P); r < n_rows; r += row_step(P), ++turn) {
    const float* ar = a.row_as<const float>(r);
    const float* br = b.row_as<const float>(r);
    float* sr = sum.row_as<float>(r);
    int8_t* q = kOut == NormOut::q8 && xq != nullptr ? xq + r * n : nullptr;
    float2* ds = kOut == NormOut::q8 && xds != nullptr ? xds + r * (n / 32) : nullptr;
    const HalfCopy half{kOut == NormOut::half ? reinterpret_cast<char*>(xh + r * n) : nullptr, f16};
    const E4m3Row row_e4 = kOut == NormOut::e4m3 ? E4m3Row{e4.codes + r * n, e4.scales + r, e4.fixed}
                                                 : E4m3Row{nullptr, nullptr, 0.0f};
    if (regs) {
      float va[kSlots], vb[kSlots];
      load_slice(ar, s, va);
      load_slice(br, s, vb);
      if (!kEarly) load_norm_weight(w, w_add, s, g);
#pragma unroll
      for (int k = 0; k < kSlots; ++k) {
        va[k] += vb[k];
        if (!kEarly && s.at(k) < s.hi) sr[s.at(k)] = va[k];
      }
      // The small-block kernel stores the sum as the norm's results, after the row's sum of squares.
      rms_norm_regs(va, g, s, dst.row(r), st, n, eps, red, part, P, q, ds, half, row_e4,
                    kEarly ? sr : nullptr, turn);
    } else {
      for (int64_t i = s.lo + s.tid; i < s.hi; i += s.nt) sr[i] = ar[i] + br[i];
      rms_norm_loop(sr, s, dst.row(r), st, w, n, eps, w_add, red, part, P, q, ds, half, row_e4, turn);
    }
  }
}

// How a norm of rows of n elements is cut (see the norms above): slices of at least kNormMinSlice
// elements, as many as kNormMaxCluster, one block of `threads` each, a cluster a row; one block a row before
// sm_90.
struct NormShape {
  int64_t slice;
  unsigned cluster;  // blocks a cluster: 1 when packed
  dim3 grid;
  int threads;
  bool packed;  // a row's slices in one block (part_of)
};
NormShape norm_shape(const Context& ctx, int64_t n, int64_t rows) {
  const int64_t want = ctx.clusters && n > kNormOneBlock
                           ? std::clamp<int64_t>((n + kNormMinSlice - 1) / kNormMinSlice, 1, kNormMaxCluster)
                           : 1;
  const int64_t slice = want == 1 ? n : ((n + want - 1) / want + 31) / 32 * 32;
  const auto cluster = static_cast<unsigned>((n + slice - 1) / slice);
  // Threads: enough for the slice to fit kRowRegs slots (at least kNormMinThreads, at most 1024).
  const int threads = std::max(kNormMinThreads, row_threads((slice + kRowRegs - 1) / kRowRegs));
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

namespace {
using AddNormKernel = void (*)(Rows, Rows, Rows, Rows, Store, const float*, int64_t, float, float, int64_t,
                               int64_t, bool, int8_t*, float2*, uint16_t*, bool, E4m3Out);
template <int kMaxThreads>
AddNormKernel add_rms_norm_for(NormOut out) {
  switch (out) {
    case NormOut::q8: return add_rms_norm_kernel<NormOut::q8, kMaxThreads>;
    case NormOut::half: return add_rms_norm_kernel<NormOut::half, kMaxThreads>;
    case NormOut::e4m3: return add_rms_norm_kernel<NormOut::e4m3, kMaxThreads>;
    case NormOut::plain: break;
  }
  return add_rms_norm_kernel<NormOut::plain, kMaxThreads>;
}
AddNormKernel add_rms_norm_for(NormOut out, int threads) {
  return norm_small_block(threads) ? add_rms_norm_for<kNormSmallBlock>(out) : add_rms_norm_for<1024>(out);
}
}  // namespace

cudaError_t add_rms_norm(const Context& ctx, const ops::Binary& add, const ops::RmsNorm& norm, int* xq,
                         float2* xds, uint16_t* xh, bool f16, const E4m3Out* e4) {
  const int64_t n = add.a.ne[0], rows = add.a.n_rows();
  if (e4 != nullptr && norm.dst.type != DType::f32) return cudaErrorInvalidValue;
  const NormShape sh = norm_shape(ctx, n, rows);
  (void)launch_kernel_cluster(ctx,
                              add_rms_norm_for(e4 != nullptr   ? NormOut::e4m3
                                               : xh != nullptr ? NormOut::half
                                               : xq != nullptr ? NormOut::q8
                                                               : NormOut::plain,
                                               sh.threads),
                              sh.grid, sh.threads, 0, sh.cluster, rows_of(add.a), rows_of(add.b.tensor),
                              rows_of(add.dst), rows_of(norm.dst), store_of(norm.dst.type),
                              static_cast<const float*>(norm.w.tensor.data), n, norm.eps,
                              norm.add_one ? 1.0f : 0.0f, rows, sh.slice, sh.packed,
                              reinterpret_cast<int8_t*>(xq), xds, xh, f16, e4 != nullptr ? *e4 : E4m3Out{});
  return launched();
}

}  // namespace kiln::cuda
