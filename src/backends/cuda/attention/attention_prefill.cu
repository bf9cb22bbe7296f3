// Paged causal attention of prefill-shaped batches on tensor cores (the fast precision): flash attention with
// mma.sync, or on Hopper with wgmma. attention/attention.cu dispatches here (attention_prefill_mma).
#include <algorithm>
#include <cstdint>

#include "backends/cuda/attention/attention.cuh"
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_launch.cuh"
#include "backends/cuda/cuda_rowmath.cuh"
#include "backends/cuda/mma.cuh"
#include "backends/cuda/wgmma.cuh"

namespace kiln::cuda {

namespace {

// A block of W warps holds 16 query rows a warp (the rows as the tile kernel numbers them: T tokens x
// the query heads of one KV head). Each warp keeps its Q rows (f16, scaled) as mma A fragments in registers,
// and for each chunk of 64 positions of the sequence whose turn it is: S = Q K^T (m16n8k16, f16 inputs, f32
// sums) from the K chunk in shared memory, the causal / window mask and softcap on S in f32, the online
// softmax per row (each row's max and sum across the four lanes that hold it), then O += P V with P rounded
// to f16 straight from the S registers (their layout is the A operand's) and V fed by ldmatrix.trans. O stays
// in registers (f32) until the end. K and V chunks are converted to f16 in shared memory, rows padded by 16
// bytes so that the fragment loads of a warp hit distinct banks.
//
// Chunks start at multiples of 64 positions whatever the tile holds, and a row's state is untouched by chunks
// it sees nothing of (every score masked: scale factor 1, P = 0), so a row's result does not depend on the
// other rows of its batch.
// Warps a block (W): kMmaWarps; a block holds 16 * W query rows.
constexpr int kMmaWarps = 4;
constexpr int kMmaChunk = 64;  // positions a chunk

// 2^x, subnormal results flushed to zero: one MUFU instruction, where exp2f adds a fix-up for them. P is
// rounded to f16 for p.v, whose smallest subnormal is 2^-24, and a row's sum l is at least 1.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Four 8x8 f16 matrices from shared memory, transposed: lane i gives the address of row i % 8 of matrix i
// / 8.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const __half* row) {
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Four 8x8 f16 matrices from shared memory: lane i gives the address of row i % 8 of matrix i / 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const __half* row) {
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// The pool slot (block * block_size + offset) of position p of a sequence, or -1 outside [lo, hi].
__device__ __forceinline__ int32_t chunk_slot(const int32_t* table, int32_t p, int32_t lo, int32_t hi,
                                              const Geometry& g) {
  if (p < lo || p > hi) return -1;
  const auto bs = static_cast<int32_t>(g.block_size);  // 32-bit division: p and the block size are ints
  return table[p / bs] * bs + p % bs;
}

// Where value d of chunk row j lies in a K or V buffer of the tensor-core kernels, in halves. Padded (kSwz
// false): rows of ld halves. Swizzled (the warpgroup kernel's operands): 64 dims of the rows a region (rows
// of 128 bytes, D / 64 regions one after the other), each row's 16-byte pieces in the 128-byte swizzle (piece
// c of row j at c ^ (j % 8)).
template <int D, bool kSwz>
__device__ __forceinline__ int chunk_at(int j, int d, int ld) {
  if constexpr (kSwz) return d / 64 * (kMmaChunk * 64) + j * 64 + ((d % 64 / 8) ^ (j % 8)) * 8 + d % 8;
  return j * ld + d;
}

// The K and V rows of a chunk (slots[j]: position j's pool slot, or -1) into shared memory as f16 (ks / vs at
// chunk_at(j, d), d < D); rows of slot -1 and dims past head_dim are zero (they must not be NaN: P is 0
// there). f16 pools are copied by cp.async (the caller commits and waits): a thread reads its rows' slots
// first, so that their shared-memory loads overlap (a copy is ordered after every load before it), and each
// row's offset serves its K and its V copy. f32 and 8-bit pools are loaded, converted and stored, K then V,
// every load of a batch of rows issued before its first store (8-bit: kv_q8_half_rows, a thread's 8 values
// one block's).
template <int D, int W, bool kSwz, class KV>
__device__ inline void load_chunk(__half* ks, __half* vs, int ld, const KV* k_pool, const KV* v_pool,
                                  const int32_t* slots, int64_t kvh, const Geometry& g) {
  constexpr int kVec = 8;  // elements a store: 16 bytes of f16
  constexpr int kVecs = D / kVec;
  constexpr int kThreads = W * 32;
  constexpr int kStep = kThreads / kVecs;  // rows a pass of the block
  constexpr int kIters = kMmaChunk / kStep;
  // Swizzled rows are 64 halves apart in a region, and rows kStep apart share their swizzle.
  static_assert(!kSwz || kStep % 8 == 0);
  if constexpr (kSwz) ld = 64;
  // A thread takes the same 16 bytes of rows j0, j0 + kStep, ...: row j0 + i kStep at first + i kStep ld.
  const int j0 = threadIdx.x / kVecs, d = (threadIdx.x % kVecs) * kVec;
  const int first = chunk_at<D, kSwz>(j0, d, ld);
  const bool dim_on = d < g.head_dim;
  const auto row_stride = static_cast<uint32_t>(g.n_kv * g.head_dim);
  const int64_t base = kvh * g.head_dim + d;
  if constexpr (sizeof(KV) == 2) {
    int32_t slot[kIters];
#pragma unroll
    for (int i = 0; i < kIters; ++i) slot[i] = dim_on ? slots[j0 + i * kStep] : -1;
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const bool valid = slot[i] >= 0;
      // A slot is at least 0 here: one 32 x 32 -> 64-bit product.
      const int64_t off = valid ? base + int64_t{static_cast<uint32_t>(slot[i])} * int64_t{row_stride} : 0;
      const int at = first + i * kStep * ld;
      cp_async16_zfill(ks + at, k_pool + off, valid);
      cp_async16_zfill(vs + at, v_pool + off, valid);
    }
  } else if constexpr (kKvQ8<KV>) {
    kv_q8_half_rows<kIters, kStep>(ks + first, ld, k_pool, slots, j0, d, dim_on, kvh, g.n_kv, g.head_dim);
    kv_q8_half_rows<kIters, kStep>(vs + first, ld, v_pool, slots, j0, d, dim_on, kvh, g.n_kv, g.head_dim);
  } else {
    constexpr int kBatch = kIters < 4 ? kIters : 4;  // rows in flight a thread
#pragma unroll
    for (int kv = 0; kv < 2; ++kv) {
      const KV* pool = kv == 0 ? k_pool : v_pool;
      __half* out = (kv == 0 ? ks : vs) + first;
#pragma unroll
      for (int i0 = 0; i0 < kIters; i0 += kBatch) {
        float4 a[kBatch], b[kBatch];
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          a[i] = b[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          const int32_t slot = slots[j0 + (i0 + i) * kStep];
          if (slot >= 0 && dim_on) {
            const KV* src = pool + base + static_cast<int64_t>(slot) * int64_t{row_stride};
            a[i] = *reinterpret_cast<const float4*>(src);
            b[i] = *reinterpret_cast<const float4*>(src + 4);
          }
        }
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          __half2 h[4] = {__halves2half2(to_half_sat(a[i].x), to_half_sat(a[i].y)),
                          __halves2half2(to_half_sat(a[i].z), to_half_sat(a[i].w)),
                          __halves2half2(to_half_sat(b[i].x), to_half_sat(b[i].y)),
                          __halves2half2(to_half_sat(b[i].z), to_half_sat(b[i].w))};
          *reinterpret_cast<uint4*>(out + (i0 + i) * kStep * ld) = *reinterpret_cast<const uint4*>(h);
        }
      }
    }
  }
}

// Shared memory of the tensor-core kernels: K and V of two chunks (the one being multiplied and the next, in
// flight); mma.sync's rows padded by 16 bytes, the warpgroup kernel's swizzled (chunk_at) with 1 KB to align
// them.
template <int D, int kWg>
constexpr size_t mma_shared_bytes() {
  return kWg ? sizeof(__half) * 2 * 2 * kMmaChunk * D + 1024 : sizeof(__half) * 2 * 2 * kMmaChunk * (D + 8);
}

// The shared row length of a chunk buffer, in halves: rows padded by 16 bytes (mma.sync), or swizzled rows of
// 64 halves (the warpgroup kernel, chunk_at).
template <int D, int kWg>
constexpr int kMmaLd = kWg ? 64 : D + 8;

// S = Q K^T of one chunk: sc[nb] holds positions 8nb + 2tq (+1) of the warp's rows gr (0, 1) and gr + 8 (2,
// 3). mma.sync: K's B fragments by ldmatrix (matrix i holds positions 8nb .., dims 16kk + 8i ..: two kk a
// load); the warpgroup: m64n64k16 on the swizzled chunk (dims 64 r .. 64 r + 63 of the rows are region r; a
// k16 step is 32 bytes of a row).
template <int D, int kWg>
__device__ __forceinline__ void chunk_scores(float (&sc)[kMmaChunk / 8][4], const uint32_t (&qa)[D / 16][4],
                                             const __half* kc, int lane) {
  constexpr int kLd = kMmaLd<D, kWg>;
#ifdef KILN_WGMMA
  if constexpr (kWg) {
    static_assert(kMmaChunk == 64);
    auto& s_acc = reinterpret_cast<float(&)[kMmaChunk / 2]>(sc);
#pragma unroll
    for (int e = 0; e < kMmaChunk / 2; ++e) s_acc[e] = 0.0f;
    const auto k_addr = static_cast<uint32_t>(__cvta_generic_to_shared(kc));
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      wgmma_f16_m64n64k16<0>(s_acc, qa[kk],
                             smem_desc_sw128(k_addr + kk / 4 * (kMmaChunk * 128) + kk % 4 * 32));
    }
    wgmma_commit_and_wait();
    wgmma_pin(s_acc);
  }
#endif
#pragma unroll
  for (int nb = 0; nb < kMmaChunk / 8 && !kWg; ++nb) {
    sc[nb][0] = sc[nb][1] = sc[nb][2] = sc[nb][3] = 0.0f;
    const __half* kr = kc + (8 * nb + lane % 8) * kLd + 8 * (lane / 8);
#pragma unroll
    for (int kk = 0; kk < D / 16; kk += 2) {
      uint32_t kb[4];
      ldmatrix_x4(kb, kr + 16 * kk);
      mma_f16(sc[nb], qa[kk], kb[0], kb[1]);
      mma_f16(sc[nb], qa[kk + 1], kb[2], kb[3]);
    }
  }
}

// Softcap, mask, and the online softmax of each of the warp's rows (row_seq, row_pos, row_lo: its two rows'
// sequence, position and first position seen) over chunk c0 of sequence s: sc becomes P, m and l (the rows'
// maxima and this lane's share of their sums) move on, and O is rescaled to the new maxima. A chunk that
// every row of the warp sees whole (most of a causal prefill's) needs no mask.
template <int D, bool kCap>
__device__ __forceinline__ void chunk_softmax(float (&sc)[kMmaChunk / 8][4], float (&o)[D / 8][4],
                                              float (&m)[2], float (&l)[2], const int32_t (&row_seq)[2],
                                              const int32_t (&row_pos)[2], const int32_t (&row_lo)[2],
                                              int32_t s, int32_t c0, float cap2, int tq) {
  if constexpr (kCap) {
#pragma unroll
    for (int nb = 0; nb < kMmaChunk / 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[nb][e] = cap2 * tanhf(sc[nb][e] / cap2);
    }
  }
  bool whole = true;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    whole = whole && row_seq[i] == s && c0 >= row_lo[i] && c0 + kMmaChunk - 1 <= row_pos[i];
  }
  if (!__all_sync(0xffffffffu, whole)) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int nb = 0; nb < kMmaChunk / 8; ++nb) {
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
          const int32_t p = c0 + 8 * nb + 2 * tq + cc;
          const bool on = row_seq[i] == s && p >= row_lo[i] && p <= row_pos[i];
          if (!on) sc[nb][2 * i + cc] = -INFINITY;
        }
      }
    }
  }
  float scale_o[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float mx = -INFINITY;
#pragma unroll
    for (int nb = 0; nb < kMmaChunk / 8; ++nb) mx = fmaxf(mx, fmaxf(sc[nb][2 * i], sc[nb][2 * i + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mm = fmaxf(m[i], mx);
    // Nothing seen yet (mm = -inf): P is 0 and the state stays as it is.
    scale_o[i] = mm == -INFINITY ? 1.0f : exp2_ftz(m[i] - mm);
    const float sub = mm == -INFINITY ? 0.0f : mm;  // exp2(-inf - 0) = 0
    float sum = 0.0f;
#pragma unroll
    for (int nb = 0; nb < kMmaChunk / 8; ++nb) {
#pragma unroll
      for (int cc = 0; cc < 2; ++cc) {
        const float e = exp2_ftz(sc[nb][2 * i + cc] - sub);
        sc[nb][2 * i + cc] = e;
        sum += e;
      }
    }
    l[i] = l[i] * scale_o[i] + sum;
    m[i] = mm;
  }
  // O times 1 is O: a warp none of whose rows' maxima moved (most chunks past a row's first few) skips it.
  if (__any_sync(0xffffffffu, scale_o[0] != 1.0f || scale_o[1] != 1.0f)) {
#pragma unroll
    for (int nb = 0; nb < D / 8; ++nb) {
      o[nb][0] *= scale_o[0], o[nb][1] *= scale_o[0];
      o[nb][2] *= scale_o[1], o[nb][3] *= scale_o[1];
    }
  }
}

// O += P V over one chunk, 16 positions a step, P's A fragments from the S registers: mma.sync with V's B
// fragments by ldmatrix.trans (matrix i: positions 16kk + 8(i % 2) .., dims 16 db + 8(i / 2) ..); the
// warpgroup with V's rows as an N-major operand of m64n128k16 (dims along the rows, 64-dim regions kMmaChunk
// rows apart).
template <int D, int kWg>
__device__ __forceinline__ void chunk_pv(float (&o)[D / 8][4], const float (&sc)[kMmaChunk / 8][4],
                                         const __half* vc, int lane) {
  constexpr int kLd = kMmaLd<D, kWg>;
#ifdef KILN_WGMMA
  if constexpr (kWg) {
    uint32_t pa[kMmaChunk / 16][4];
#pragma unroll
    for (int kk = 0; kk < kMmaChunk / 16; ++kk) {
      pa[kk][0] = pack_half2(sc[2 * kk][0], sc[2 * kk][1]);
      pa[kk][1] = pack_half2(sc[2 * kk][2], sc[2 * kk][3]);
      pa[kk][2] = pack_half2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
      pa[kk][3] = pack_half2(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
    }
    auto& o_acc = reinterpret_cast<float(&)[D / 2]>(o);
    const auto v_addr = static_cast<uint32_t>(__cvta_generic_to_shared(vc));
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kMmaChunk / 16; ++kk) {
      wgmma_f16_m64n128k16<1>(o_acc, pa[kk], smem_desc_sw128(v_addr + kk * 16 * 128, kMmaChunk * 128));
    }
    wgmma_commit_and_wait();
    wgmma_pin(o_acc);
  }
#endif
#pragma unroll
  for (int kk = 0; kk < kMmaChunk / 16 && !kWg; ++kk) {
    const uint32_t pa[4] = {
        pack_half2(sc[2 * kk][0], sc[2 * kk][1]), pack_half2(sc[2 * kk][2], sc[2 * kk][3]),
        pack_half2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]), pack_half2(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
    const int mat = lane / 8, r8 = lane % 8;
    const __half* vrow = vc + (16 * kk + 8 * (mat % 2) + r8) * kLd + 8 * (mat / 2);
#pragma unroll
    for (int db = 0; db < D / 16; ++db) {
      uint32_t vb[4];
      ldmatrix_x4_trans(vb, vrow + 16 * db);
      mma_f16(o[2 * db], pa, vb[0], vb[1]);
      mma_f16(o[2 * db + 1], pa, vb[2], vb[3]);
    }
  }
}

// kCap: the softcap applies (a template parameter, so that the kernel without it is that much shorter).
// kWg 0: mma.sync, as above. kWg 2 or 3 (D = 128, W = 4; Hopper, sm_90a): the block is one warpgroup whose
// products are wgmma, with the registers of kWg blocks an SM: S = Q K^T as m64n64k16 and O += P V as
// m64n128k16, Q and P from the same registers as mma.sync's A fragments, K and V from swizzled chunks
// (chunk_at). S, P and O keep mma.sync's fragment layout, so all else is the same code.
template <int D, int W, class KV, bool kCap, int kWg>
__global__ void __launch_bounds__(W * 32, kWg ? kWg : 1)
    attention_mma_kernel(Rows q, const KV* k_pool, const KV* v_pool, const int32_t* positions,
                         const int32_t* seq, const int32_t* bt_indptr, const int32_t* bt_indices, Rows dst,
                         Geometry g, int64_t tile_tokens, int64_t heads_per_tile, uint16_t* xh, bool f16) {
  static_assert(!kWg || (W == 4 && D == 128), "the warpgroup kernel: one warpgroup, head dims up to 128");
#if !defined(KILN_WGMMA)
  if constexpr (kWg) {
    __trap();  // built without sm_90a: attention() never launches this
    return;
  }
#endif
  pdl_begin();
  constexpr int kLd = kMmaLd<D, kWg>;
  constexpr int kBuf = kWg ? kMmaChunk * D : kMmaChunk * kLd;
  extern __shared__ __align__(16) unsigned char mma_shm[];
  // [2][kBuf] each; the swizzled chunks 1 KB aligned.
  __half* ks = reinterpret_cast<__half*>(
      mma_shm + (kWg ? (1024 - static_cast<uint32_t>(__cvta_generic_to_shared(mma_shm)) % 1024) % 1024 : 0));
  __half* vs = ks + 2 * kBuf;
  __shared__ int32_t slots[2][kMmaChunk];  // the pool slots of the chunks in ks / vs
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int gr = lane / 4, tq = lane % 4;  // the fragment row and column pair of this lane
  const int64_t tiles_per_kv = (g.group + heads_per_tile - 1) / heads_per_tile;
  const int64_t n_tiles = (g.n_tokens + tile_tokens - 1) / tile_tokens;
  const int64_t b = blockIdx.x;
  // The last tiles first: in a causal prefill they see the most positions, so the grid ends on short blocks.
  const int64_t tile = n_tiles - 1 - b / (g.n_kv * tiles_per_kv), kvh = (b / tiles_per_kv) % g.n_kv;
  const int64_t h0 = kvh * g.group + (b % tiles_per_kv) * heads_per_tile;
  const int64_t n_q = min(heads_per_tile, kvh * g.group + g.group - h0);
  const int64_t t0 = tile * tile_tokens, t1 = min(t0 + tile_tokens, g.n_tokens);

  // This lane's two rows (gr and gr + 8 of its warp's 16): token, head, sequence, position, first position.
  // Rows past the tile's have sequence -1 and take part in nothing.
  int32_t row_q[2], row_seq[2], row_pos[2], row_lo[2];  // row_q: the row of q and dst
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const auto r = static_cast<int32_t>(warp * 16 + gr + 8 * i);
    const bool on = r < (t1 - t0) * n_q;
    const auto t = static_cast<int32_t>(t0 + r / n_q);
    row_q[i] = static_cast<int32_t>(h0 + r % n_q + g.n_heads * t);
    row_seq[i] = on ? seq[t] : -1;
    row_pos[i] = on ? positions[t] : -1;
    row_lo[i] = g.window > 0 ? max(0, row_pos[i] - g.window + 1) : 0;
  }
  // Scores are kept in base-2 units (times log2(e)), so that P is one exp2 a score: q is scaled by
  // scale * log2(e), and the softcap c * tanh(s / c) becomes c2 * tanh(s2 / c2) with c2 = c * log2(e).
  constexpr float kLog2e = 1.4426950408889634f;
  const float q_scale = g.scale * kLog2e, cap2 = g.softcap * kLog2e;
  // Q as A fragments: qa[kk] holds dims 16kk .. 16kk+15 of the two rows (pairs 2tq, 2tq+1 and +8).
  const float* q_row[2];  // found once: a row of a 3-D view takes two 64-bit divisions
#pragma unroll
  for (int i = 0; i < 2; ++i) q_row[i] = row_seq[i] >= 0 ? q.row_as<const float>(row_q[i]) : nullptr;
  uint32_t qa[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // dims 16kk + 2tq (+ 8)
      const int64_t d = 16 * kk + 2 * tq + 8 * half;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float x0 = 0.0f, x1 = 0.0f;
        if (row_seq[i] >= 0 && d < g.head_dim) {
          const float* qr = q_row[i];
          x0 = qr[d] * q_scale;
          x1 = d + 1 < g.head_dim ? qr[d + 1] * q_scale : 0.0f;
        }
        qa[kk][i + 2 * half] =
            pack_half2(fminf(fmaxf(x0, -65504.0f), 65504.0f), fminf(fmaxf(x1, -65504.0f), 65504.0f));
      }
    }
  }
  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // l: this lane's share of the row sum

  for (int64_t f = t0; f < t1; ++f) {  // one sequence of the tile at a time
    const int32_t s = seq[f];
    int32_t lo, hi;
    if (!opens_turn(seq, positions, t0, f, t1, g, lo, hi)) continue;
    const int32_t* table = bt_indices + bt_indptr[s];
    const bool mine = row_seq[0] == s || row_seq[1] == s;
    // The warpgroup's products take all of its warps: it skips a sequence none of its rows is of.
    const bool warp_in = kWg ? __syncthreads_or(mine) != 0 : __any_sync(0xffffffffu, mine);
    const int32_t c_first = lo / kMmaChunk * kMmaChunk;
    const int32_t n_c = (hi - c_first) / kMmaChunk + 1;
    // The chunks are a two-stage pipeline: while chunk c is multiplied, chunk c + 1's K and V are in flight
    // (cp.async) and chunk c + 2's pool slots are being read from the block table (threads 0-63, a position
    // each).
    int32_t next_slot = -1;
    __syncthreads();  // the previous sequence's chunks are no longer read
    if (threadIdx.x < kMmaChunk) {
      slots[0][threadIdx.x] = chunk_slot(table, c_first + threadIdx.x, lo, hi, g);
      if (n_c > 1) next_slot = chunk_slot(table, c_first + kMmaChunk + threadIdx.x, lo, hi, g);
    }
    __syncthreads();
    load_chunk<D, W, kWg>(ks, vs, kLd, k_pool, v_pool, slots[0], kvh, g);
    cp_async_commit();
    for (int32_t c = 0; c < n_c; ++c) {
      const int32_t c0 = c_first + c * kMmaChunk;
      const int nb_ = (c + 1) & 1;
      if (threadIdx.x < kMmaChunk && c + 1 < n_c) {
        slots[nb_][threadIdx.x] = next_slot;
        next_slot = c + 2 < n_c ? chunk_slot(table, c0 + 2 * kMmaChunk + threadIdx.x, lo, hi, g) : -1;
      }
      __syncthreads();  // slots[nb_] written; buffer nb_ (chunk c - 1) no longer read
      if (c + 1 < n_c) {
        load_chunk<D, W, kWg>(ks + nb_ * kBuf, vs + nb_ * kBuf, kLd, k_pool, v_pool, slots[nb_], kvh, g);
      }
      cp_async_commit();
      cp_async_wait<1>();  // chunk c's copies have landed
#ifdef KILN_WGMMA
      if constexpr (kWg) fence_proxy_async_shared();  // ... where the products read them
#endif
      __syncthreads();
      if (!warp_in) continue;
      const __half* kc = ks + (c & 1) * kBuf;
      const __half* vc = vs + (c & 1) * kBuf;
      float sc[kMmaChunk / 8][4];
      chunk_scores<D, kWg>(sc, qa, kc, lane);
      chunk_softmax<D, kCap>(sc, o, m, l, row_seq, row_pos, row_lo, s, c0, cap2, tq);
      chunk_pv<D, kWg>(o, sc, vc, lane);
    }
  }
  // Each row's sum over its four lanes, then dst = O / l; with xh, dst also in 16 bits for the GEMM after
  // (store_half2: as the GEMM's conversion of dst rounds it), row r at xh + r * head_dim.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (row_seq[i] < 0) continue;
    float* y = dst.row_as<float>(row_q[i]);
    const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
    const HalfCopy half{
        xh != nullptr ? reinterpret_cast<char*>(xh + int64_t{row_q[i]} * g.head_dim) : nullptr, f16};
#pragma unroll
    for (int nb = 0; nb < D / 8; ++nb) {
      const int64_t d = 8 * nb + 2 * tq;  // head_dim is a multiple of 8: d and d + 1 are both in or out
      if (d >= g.head_dim) continue;
      const float y0 = o[nb][2 * i] * inv, y1 = o[nb][2 * i + 1] * inv;
      *reinterpret_cast<float2*>(y + d) = make_float2(y0, y1);
      if (half.row != nullptr) store_half2(half, d, y0, y1);
    }
  }
}

// The tensor-core kernels' tiles of `rows` query rows (consecutive tokens x query heads of one KV head) and
// their blocks.
struct MmaGrid {
  int64_t heads_per_tile, tile_tokens, blocks;
};
MmaGrid mma_grid(const Geometry& g, int64_t rows) {
  MmaGrid m{};
  m.heads_per_tile = std::min<int64_t>(g.group, rows);
  m.tile_tokens = std::max<int64_t>(1, rows / m.heads_per_tile);
  const int64_t tiles = (g.n_tokens + m.tile_tokens - 1) / m.tile_tokens;
  m.blocks = tiles * g.n_kv * ((g.group + m.heads_per_tile - 1) / m.heads_per_tile);
  return m;
}

template <int D, int W, class KV, int kWg>
cudaError_t launch_mma(const Context& ctx, const ops::Attention& op, const Geometry& g, uint16_t* xh,
                       bool f16) {
  const MmaGrid grid = mma_grid(g, 16 * W);
  auto* kernel = g.softcap > 0.0f ? attention_mma_kernel<D, W, KV, true, kWg>
                                  : attention_mma_kernel<D, W, KV, false, kWg>;
  constexpr size_t shm = mma_shared_bytes<D, kWg>();
  if (const cudaError_t e = allow_dynamic_shared(reinterpret_cast<const void*>(kernel), shm);
      e != cudaSuccess) {
    return e;
  }
  (void)launch_kernel(
      ctx, kernel, static_cast<unsigned>(grid.blocks), W * 32, shm, rows_of(op.q),
      static_cast<const KV*>(op.k_pool.data), static_cast<const KV*>(op.v_pool.data),
      static_cast<const int32_t*>(op.positions.data), static_cast<const int32_t*>(op.seq.data),
      static_cast<const int32_t*>(op.bt_indptr.data), static_cast<const int32_t*>(op.bt_indices.data),
      rows_of(op.dst), g, grid.tile_tokens, grid.heads_per_tile, xh, f16);
  return cudaGetLastError();
}

// Whether the warpgroup kernel runs here: on Hopper (ctx.wgmma) from a build for sm_90a, unless
// CudaOptions::wgmma is off.
bool wgmma_applies(const Context& ctx) {
  if (!ctx.wgmma || !ctx.options.wgmma) return false;
  static const bool built = [] {
    cudaFuncAttributes attr{};
    const bool ok =
        cudaFuncGetAttributes(&attr, attention_mma_kernel<128, 4, __half, false, 3>) == cudaSuccess &&
        attr.binaryVersion == 90;
    cudaGetLastError();
    return ok;
  }();
  return built;
}

// Head dims up to 64 take mma.sync's kernel of 64 dims (a 64-dim warpgroup build missed the reference on long
// contexts over f32 and 8-bit pools, cause not found: not built); larger ones, on Hopper, the warpgroup
// kernel: with the registers of 3 blocks an SM (168) where the grid is more than 2 blocks an SM, else of 2
// (no spills). H100, the 8B's heads (attention_bench), us: 512 tokens (256 blocks) 26.8 at 2 blocks an
// SM, 33.8 at 3 (mma.sync 32.2); 2,048 tokens 176.6 and 164.0 (mma.sync 215.6).
template <class KV>
cudaError_t launch_mma_for_head_dim(const Context& ctx, const ops::Attention& op, const Geometry& g,
                                    uint16_t* xh, bool f16) {
  if (g.head_dim <= 64) return launch_mma<64, kMmaWarps, KV, 0>(ctx, op, g, xh, f16);
  if (!wgmma_applies(ctx)) return launch_mma<128, kMmaWarps, KV, 0>(ctx, op, g, xh, f16);
  return mma_grid(g, 64).blocks > 2 * ctx.n_sms ? launch_mma<128, 4, KV, 3>(ctx, op, g, xh, f16)
                                                : launch_mma<128, 4, KV, 2>(ctx, op, g, xh, f16);
}

}  // namespace

// The tensor-core kernel takes head dims that are whole 16-byte vectors of the pool, up to 128, from
// 16-byte-aligned pools (8-bit: whole blocks, read 2 bytes a load from 2-byte-aligned pools), into
// 8-byte-aligned rows.
bool mma_eligible(const Context& ctx, const ops::Attention& op, const Geometry& g) {
  const int64_t q8_block = kv_q8_block(op.k_pool.type);
  const bool q8 = q8_block > 0;
  const int64_t vec = q8 ? q8_block : op.k_pool.type == DType::f16 ? 8 : 4;
  const auto aligned = [&](const Tensor& t) {
    return reinterpret_cast<uintptr_t>(t.data) % (q8 ? 2 : 16) == 0;
  };
  const Tensor& y = op.dst;  // written two floats a store
  const bool y8 = reinterpret_cast<uintptr_t>(y.data) % 8 == 0 && y.nb[1] % 8 == 0 && y.nb[2] % 8 == 0 &&
                  y.nb[3] % 8 == 0;
  return ctx.fast && g.head_dim % 8 == 0 && g.head_dim % vec == 0 && g.head_dim <= 128 &&
         aligned(op.k_pool) && aligned(op.v_pool) && y8;
}

cudaError_t attention_prefill_mma(const Context& ctx, const ops::Attention& op, const Geometry& g,
                                  uint16_t* xh, bool f16) {
  const DType pool = op.k_pool.type;
  return pool == DType::f16     ? launch_mma_for_head_dim<__half>(ctx, op, g, xh, f16)
         : pool == DType::q8_0  ? launch_mma_for_head_dim<KvQ8>(ctx, op, g, xh, f16)
         : pool == DType::q8_64 ? launch_mma_for_head_dim<KvQ8x64>(ctx, op, g, xh, f16)
                                : launch_mma_for_head_dim<float>(ctx, op, g, xh, f16);
}

}  // namespace kiln::cuda
