// Paged causal attention on CUDA for decode-shaped batches, split-KV ("flash-decoding"): a block serves one
// token and one KV head, for up to kDecodeGroup of the query heads that share that KV head (GQA: each K/V row
// is read once per group), over one chunk of the token's positions. The staged kernel copies a chunk's K/V
// rows to shared memory a stage at a time (8-bit ones as they are, or as f32); the unstaged one (head dims
// that are not whole 16-byte vectors) walks them a warp a position. With one chunk the block writes dst, with
// several each writes its state and the last of them to finish merges the chunks in order.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backends/cuda/attention/attention.cuh"
#include "backends/cuda/attention/decode_merge.cuh"
#include "backends/cuda/attention/decode_staged.cuh"
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_launch.cuh"
#include "backends/cuda/cuda_round_q8.cuh"

namespace kiln::cuda {

namespace {

constexpr int kWarps = 4;  // warps per block of the unstaged kernel

// What block (blockIdx.x, blockIdx.y) of a decode kernel of G heads a block serves: token t, KV head kvh, its
// query heads h0 .. h0 + n_q - 1, and chunk `chunk` of the token's n_chunks live ones, positions [c0, c1) of
// its span, read through its block table `table`; past: the chunk is past the token's (the step metadata,
// which no kernel writes), and the block returns at once.
struct BlockWork {
  int64_t t, kvh, h0;
  int n_q;
  int64_t chunk, n_chunks, c0, c1;
  const int32_t* table;
  bool past;
};
template <int G>
__device__ inline BlockWork block_work(const int32_t* positions, const int32_t* seq, const int32_t* bt_indptr,
                                       const int32_t* bt_indices, const Geometry& g) {
  BlockWork w{};
  const int64_t groups_per_kv = (g.group + G - 1) / G;
  const DivMod bg = divmod(blockIdx.x, groups_per_kv), tk = divmod(bg.q, g.n_kv);
  w.t = tk.q, w.kvh = tk.r;
  w.h0 = w.kvh * g.group + bg.r * G;
  const int64_t left = w.kvh * g.group + g.group - w.h0;  // query heads of this KV head from h0 on
  w.n_q = static_cast<int>(left < G ? left : G);
  w.chunk = blockIdx.y;
  const int32_t pos = positions[w.t];
  w.table = bt_indices + bt_indptr[seq[w.t]];
  const int32_t lo = g.window > 0 ? max(0, pos - g.window + 1) : 0;
  const int64_t span = int64_t{pos} - lo + 1;
  w.n_chunks = live_chunks(span, g);
  w.past = w.chunk >= w.n_chunks;
  if (!w.past) w.c0 = lo + span * w.chunk / w.n_chunks, w.c1 = lo + span * (w.chunk + 1) / w.n_chunks;
  return w;
}

// partial (live chunks > 1): [n_tokens * n_heads, g.n_chunks] records of head_dim + 2 floats (acc, m, l);
// done[blockIdx.x] counts the chunks of its heads whose records are written (zero before the launch, and
// again after it: the block that finds itself last resets it, then merges).
template <int DPL, int G, class KV>
__global__ void __launch_bounds__(kWarps * 32, 1)
    attention_kernel(Rows q, const KV* k_pool, const KV* v_pool, const int32_t* positions, const int32_t* seq,
                     const int32_t* bt_indptr, const int32_t* bt_indices, Rows dst, float* partial,
                     unsigned* done, Geometry g) {
  extern __shared__ float shm[];  // kWarps x G x (head_dim + 2)
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const BlockWork w = block_work<G>(positions, seq, bt_indptr, bt_indices, g);
  if (w.past) return;
  const int64_t t = w.t, kvh = w.kvh, h0 = w.h0, chunk = w.chunk, n_chunks = w.n_chunks, c0 = w.c0, c1 = w.c1;
  const int n_q = w.n_q;
  const int32_t* table = w.table;
  pdl_wait();  // q, and the K/V rows of this step, come from the kernels before

  // The loops over the G heads unroll fully (heads past n_q are predicated off), so that the states stay in
  // registers: a loop that breaks at n_q indexes them at run time, which puts them in local memory.
  float qv[G][DPL];
#pragma unroll
  for (int h = 0; h < G; ++h) {
    const float* qr = h < n_q ? q.row_as<const float>(h0 + h + g.n_heads * t) : nullptr;
    for (int j = 0; j < DPL; ++j) {
      const int64_t d = lane + 32 * j;
      qv[h][j] = (qr != nullptr && d < g.head_dim) ? qr[d] * g.scale : 0.0f;
    }
  }
  State<DPL> st[G];
  // A warp's positions go kPipe at a time: their block-table entries, then all their K/V rows, are loaded
  // before the first is used, so the walk waits on memory once per kPipe positions. They are folded in
  // increasing order, as one at a time.
  constexpr int kPipe = DPL <= 2 ? 4 : DPL <= 4 ? 2 : 1;
  for (int64_t p0 = c0 + warp; p0 < c1; p0 += kWarps * kPipe) {
    float kv[kPipe][DPL], vv[kPipe][DPL];
#pragma unroll
    for (int i = 0; i < kPipe; ++i) {
      const int64_t p = p0 + kWarps * i;
      const DivMod pb = divmod(p, g.block_size);
      const int64_t slot = p < c1 ? int64_t{table[pb.q]} * g.block_size + pb.r : 0;
      const KV* kr = kv_row(k_pool, slot, kvh, g.n_kv, g.head_dim);
      const KV* vr = kv_row(v_pool, slot, kvh, g.n_kv, g.head_dim);
#pragma unroll
      for (int j = 0; j < DPL; ++j) {  // 8-bit: code `lane` of block j, a warp's loads 32 consecutive bytes
        const int64_t d = lane + 32 * j;
        const bool in = p < c1 && d < g.head_dim;
        kv[i][j] = in ? kv_value(kr, d) : 0.0f;
        vv[i][j] = in ? kv_value(vr, d) : 0.0f;
      }
    }
#pragma unroll
    for (int i = 0; i < kPipe; ++i) {
      if (p0 + kWarps * i >= c1) break;
#pragma unroll
      for (int h = 0; h < G; ++h) {
        if (h >= n_q) continue;
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < DPL; ++j) s += qv[h][j] * kv[i][j];
        s = warp_sum(s);
        if (g.softcap > 0.0f) s = g.softcap * tanhf(s / g.softcap);
        State<DPL>& a = st[h];
        const float mm = fmaxf(a.m, s);
        const float ca = expf(a.m - mm), e = expf(s - mm);
        a.l = a.l * ca + e;
#pragma unroll
        for (int j = 0; j < DPL; ++j) a.acc[j] = a.acc[j] * ca + e * vv[i][j];
        a.m = mm;
      }
    }
  }
  pdl_trigger();  // K and V are read: the next kernel may be scheduled
  // Merge the warps: each writes its states, warp 0 folds them in order.
  const int64_t rec = g.head_dim + 2;
#pragma unroll
  for (int h = 0; h < G; ++h) {
    if (h >= n_q) continue;
    float* r = shm + (warp * G + h) * rec;
    for (int j = 0; j < DPL; ++j) {
      const int64_t d = lane + 32 * j;
      if (d < g.head_dim) r[d] = st[h].acc[j];
    }
    if (lane == 0) r[g.head_dim] = st[h].m, r[g.head_dim + 1] = st[h].l;
  }
  __syncthreads();
  for (int h = 0; h < n_q && warp == 0; ++h) {
    State<DPL> a;
    for (int w = 0; w < kWarps; ++w) {
      const float* r = shm + (w * G + h) * rec;
      float acc[DPL];
      for (int j = 0; j < DPL; ++j) {
        const int64_t d = lane + 32 * j;
        acc[j] = d < g.head_dim ? r[d] : 0.0f;
      }
      merge(a, r[g.head_dim], r[g.head_dim + 1], acc);
    }
    const int64_t row = h0 + h + g.n_heads * t;
    if (n_chunks == 1) {
      const float inv = a.l > 0.0f ? 1.0f / a.l : 0.0f;
      float y[DPL];
#pragma unroll
      for (int j = 0; j < DPL; ++j) y[j] = a.acc[j] * inv;
      store_row<DPL>(dst.row_as<float>(row), row, y, g, lane);
    } else {
      float* r = partial + (row * g.n_chunks + chunk) * rec;
      for (int j = 0; j < DPL; ++j) {
        const int64_t d = lane + 32 * j;
        if (d < g.head_dim) r[d] = a.acc[j];
      }
      if (lane == 0) r[g.head_dim] = a.m, r[g.head_dim + 1] = a.l;
    }
  }
  if (n_chunks > 1) merge_if_last<DPL>(partial, done, dst, g, h0 + g.n_heads * t, n_q, n_chunks);
}

// A decode kernel of G query heads a block (attention_kernel, attention_staged_kernel: the same parameters)
// on `threads` threads and `shm` bytes of dynamic shared memory: a block a (token, KV head, head group) and
// chunk.
template <int G, class KV, class Kernel>
cudaError_t launch_decode(const Context& ctx, Kernel kernel, int threads, size_t shm,
                          const ops::Attention& op, const Geometry& g, float* partial, unsigned* done) {
  const int64_t groups_per_kv = (g.group + G - 1) / G;
  const dim3 grid(static_cast<unsigned>(g.n_tokens * g.n_kv * groups_per_kv),
                  static_cast<unsigned>(g.n_chunks));
  if (const cudaError_t e = allow_dynamic_shared(reinterpret_cast<const void*>(kernel), shm);
      e != cudaSuccess) {
    return e;
  }
  (void)launch_kernel(ctx, kernel, grid, threads, shm, rows_of(op.q), static_cast<const KV*>(op.k_pool.data),
                      static_cast<const KV*>(op.v_pool.data), static_cast<const int32_t*>(op.positions.data),
                      static_cast<const int32_t*>(op.seq.data),
                      static_cast<const int32_t*>(op.bt_indptr.data),
                      static_cast<const int32_t*>(op.bt_indices.data), rows_of(op.dst), partial, done, g);
  return cudaGetLastError();
}

template <int DPL, int G, class KV>
cudaError_t launch(const Context& ctx, const ops::Attention& op, const Geometry& g, float* partial,
                   unsigned* done) {
  return launch_decode<G, KV>(ctx, attention_kernel<DPL, G, KV>, kWarps * 32,
                              sizeof(float) * kWarps * G * (g.head_dim + 2), op, g, partial, done);
}

// Query heads a block: the group's, rounded up to a power of two, at most kDecodeGroup.
inline int heads_per_block(int64_t group) {
  return group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : kDecodeGroup;
}

template <int DPL, class KV>
cudaError_t launch_for_group(const Context& ctx, const ops::Attention& op, const Geometry& g, float* partial,
                             unsigned* done) {
  switch (heads_per_block(g.group)) {
    case 1: return launch<DPL, 1, KV>(ctx, op, g, partial, done);
    case 2: return launch<DPL, 2, KV>(ctx, op, g, partial, done);
    case 4: return launch<DPL, 4, KV>(ctx, op, g, partial, done);
    default: return launch<DPL, kDecodeGroup, KV>(ctx, op, g, partial, done);
  }
}

template <class KV>
cudaError_t launch_for_head_dim(const Context& ctx, const ops::Attention& op, const Geometry& g,
                                float* partial, unsigned* done) {
  if (g.head_dim <= 32) return launch_for_group<1, KV>(ctx, op, g, partial, done);
  if (g.head_dim <= 64) return launch_for_group<2, KV>(ctx, op, g, partial, done);
  if (g.head_dim <= 128) return launch_for_group<4, KV>(ctx, op, g, partial, done);
  return launch_for_group<8, KV>(ctx, op, g, partial, done);
}

// ---- decode, staged: a chunk's K/V rows go to shared memory in one wait ----
//
// The same blocks as attention_kernel (one token, one KV head, up to G of its query heads, one chunk of the
// positions), but a block copies the K and V rows of kStage positions at a time into shared memory
// (cp.async, 16 bytes a copy, the next stage's rows in flight while this one is used), so its walk waits on
// memory once a stage instead of once per few positions a warp. 8-bit rows that are whole 4-byte words (q8_0
// rows of 64, 128 or 256 values, q8_64 rows of 128 or 256) are staged as they are (4 bytes a copy) and their
// codes read with their block's scale; those of other head dims are staged as f32: a stage's values are
// loaded into registers, 4 a copy, while the stage before is used, and stored after it.
// The step metadata and the block-table entries of the first stage are read before the wait on the kernel
// before (no kernel writes them). Per stage:
//   A. scores: kTpp threads a position, each a slice of its dims, every head of the block (q, scaled, from
//      shared memory); staged rows are padded by 16 bytes so that 8 consecutive positions hit distinct banks;
//   B. softmax: a warp a head takes the stage's scores, its running max and sum;
//   C. p.v: a thread two adjacent dims of every head, over every kPg-th position of the stage.
// f32 arithmetic, the same sums as the unstaged kernel up to their order. Rows whose head_dim is not a whole
// number of 16-byte vectors take attention_kernel.
// The element type SA of a pool's staged rows: its own; for 8-bit blocks, the blocks as they are where
// staged_raw, else f32.
template <int D, int G, class KV, class SA>
__global__ void __launch_bounds__(Staged<D, SA>::kThreads, 1)
    attention_staged_kernel(Rows q, const KV* k_pool, const KV* v_pool, const int32_t* positions,
                            const int32_t* seq, const int32_t* bt_indptr, const int32_t* bt_indices, Rows dst,
                            float* partial, unsigned* done, Geometry g) {
  using S = Staged<D, SA>;
  constexpr bool kRaw = kKvQ8<SA>;
  extern __shared__ __align__(16) unsigned char smem[];
  float* qs = reinterpret_cast<float*>(smem + S::kKvBytes);  // [G][D], scaled
  float* part = qs + G * D;                                  // [kTpp][G][kStage] slices' partial scores
  float* es = part + S::kTpp * G * S::kStage;                // [G][kStage] exp(s - m)
  float* corr = es + G * S::kStage;                          // [G] this stage's rescale of acc
  float* ms = corr + G;                                      // [G] running max, at the end
  float* ls = ms + G;                                        // [G] running sum, at the end
  // Raw 8-bit rows: [2][kStage] the pool rows (slot * n_kv + kvh) of the positions of the stage each KV
  // buffer takes next, ~0u past the chunk: one block-table read a position rather than one a copy.
  auto* stage_rows = reinterpret_cast<uint32_t*>(ls + G);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const BlockWork w = block_work<G>(positions, seq, bt_indptr, bt_indices, g);
  if (w.past) return;
  const int64_t t = w.t, kvh = w.kvh, h0 = w.h0, chunk = w.chunk, n_chunks = w.n_chunks, c0 = w.c0, c1 = w.c1;
  const int n_q = w.n_q;
  const int32_t* table = w.table;

  // This thread's copies: 16 bytes at vector cv of rows cr, cr + kRows, ... of a stage; of raw 8-bit rows,
  // whose words a row do not divide the threads, word e % kRowVecs of row e / kRowVecs for e = tid, tid +
  // kThreads, ... below a stage's words.
  constexpr int kRows = S::kThreads / S::kRowVecs;
  const int cr = tid / S::kRowVecs, cv = tid % S::kRowVecs;
  // Pool elements a row, and this thread's copies' element of a row (8-bit in registers: blocks of kB values,
  // of which a copy's 4 values share one).
  constexpr int kB = kKvBlock<KV>;
  bool dim_on = true;
  int64_t row_stride = 0, col = 0;
  if constexpr (!kRaw) {
    const int64_t row_elems = g.head_dim / kB;
    dim_on = cv * S::kVec < g.head_dim;
    row_stride = g.n_kv * row_elems;
    col = kvh * row_elems + cv * S::kVec / kB;
  }
  int64_t src[kRaw ? 1 : S::kCopies];  // element offsets in the pools of this thread's copies, or -1
  // The copies of the stage of positions from s0, for KV buffer `buf`: raw rows into stage_rows (a thread a
  // position; read by issue after a barrier), the others' offsets into src.
  auto find = [&](int64_t s0, int buf) {
    if constexpr (kRaw) {
      for (int r = tid; r < S::kStage; r += S::kThreads) {
        const int64_t p = s0 + r;
        uint32_t row = ~0u;
        if (p < c1) {
          const DivMod pb = divmod(p, g.block_size);
          row = static_cast<uint32_t>((int64_t{table[pb.q]} * g.block_size + pb.r) * g.n_kv + kvh);
        }
        stage_rows[buf * S::kStage + r] = row;
      }
    } else {
#pragma unroll
      for (int i = 0; i < S::kCopies; ++i) {
        const int64_t p = s0 + cr + kRows * i;
        if (p < c1 && dim_on) {
          const DivMod pb = divmod(p, g.block_size);
          src[i] = (int64_t{table[pb.q]} * g.block_size + pb.r) * row_stride + col;
        } else {
          src[i] = -1;
        }
      }
    }
  };
  // 8-bit: the values of this thread's copies, from issue (a load into registers) until land stores them.
  constexpr bool kInRegs = kKvQ8<KV> && !kRaw;
  KvQ8Run<4> kq[kInRegs ? S::kCopies : 1], vq[kInRegs ? S::kCopies : 1];
  auto issue = [&](int stage) {
    unsigned char* kb = smem + stage * 2 * S::kStage * S::kRowBytes;
    unsigned char* vb = kb + S::kStage * S::kRowBytes;
#pragma unroll
    for (int i = 0; i < S::kCopies; ++i) {
      if constexpr (kRaw) {
        const int e = tid + S::kThreads * i, r = e / S::kRowVecs;
        if (r >= S::kStage) continue;  // the last round's threads past the stage
        const uint32_t row = stage_rows[stage * S::kStage + r];
        const bool on = row != ~0u;
        const int word = 4 * (e % S::kRowVecs);  // the copy's byte in the row
        const int64_t at = int64_t{row} * S::kPoolRowBytes + word;
        const int off = r * S::kRowBytes + word;
        const auto* kp = reinterpret_cast<const unsigned char*>(k_pool);
        const auto* vp = reinterpret_cast<const unsigned char*>(v_pool);
        cp_async4_zfill(kb + off, on ? kp + at : kp, on);
        cp_async4_zfill(vb + off, on ? vp + at : vp, on);
      } else {
        const bool on = src[i] >= 0;
        const int off = (cr + kRows * i) * S::kRowBytes + cv * 16;
        if constexpr (kInRegs) {
          kq[i] = vq[i] = KvQ8Run<4>{};
          if (on) {
            kq[i] = kv_load_run<4>(k_pool + src[i], cv * S::kVec % kB);
            vq[i] = kv_load_run<4>(v_pool + src[i], cv * S::kVec % kB);
          }
        } else {
          cp_async16_zfill(kb + off, on ? k_pool + src[i] : k_pool, on);
          cp_async16_zfill(vb + off, on ? v_pool + src[i] : v_pool, on);
        }
      }
    }
    cp_async_commit();
  };
  auto land = [&](int stage) {
    if constexpr (kInRegs) {
      unsigned char* kb = smem + stage * 2 * S::kStage * S::kRowBytes;
      unsigned char* vb = kb + S::kStage * S::kRowBytes;
#pragma unroll
      for (int i = 0; i < S::kCopies; ++i) {
        const int off = (cr + kRows * i) * S::kRowBytes + cv * 16;
        const auto f4 = [](const KvQ8Run<4>& x) {
          return make_float4(kv_run_value(x, 0), kv_run_value(x, 1), kv_run_value(x, 2), kv_run_value(x, 3));
        };
        *reinterpret_cast<float4*>(kb + off) = f4(kq[i]);
        *reinterpret_cast<float4*>(vb + off) = f4(vq[i]);
      }
    }
  };
  find(c0, 0);
  pdl_wait();
  if constexpr (kRaw) __syncthreads();  // stage_rows[0] is written
  issue(0);
  land(0);
  if (c0 + S::kStage < c1) find(c0 + S::kStage, 1);
  for (int e = tid; e < G * D; e += S::kThreads) {
    const int h = e / D, d = e % D;
    qs[e] = h < n_q && d < g.head_dim ? q.row_as<const float>(h0 + h + g.n_heads * t)[d] * g.scale : 0.0f;
  }
  if constexpr (kRaw) __syncthreads();  // stage_rows[1] is written

  // Step B's state: warp w holds heads w, w + S::kWarps, ...
  float m_run[S::kHeadsAWarp], l_run[S::kHeadsAWarp];
#pragma unroll
  for (int k = 0; k < S::kHeadsAWarp; ++k) m_run[k] = -INFINITY, l_run[k] = 0.0f;
  // Step C's: dims 2 * dp, 2 * dp + 1 of every head, positions pg, pg + kPg, ...
  const int dp = tid % (D / 2), pg = tid / (D / 2);
  float acc[G][2] = {};
  int stage = 0;
  for (int64_t s0 = c0; s0 < c1; s0 += S::kStage, stage ^= 1) {
    const int n = static_cast<int>(min(int64_t{S::kStage}, c1 - s0));
    if (s0 + S::kStage < c1) {
      issue(stage ^ 1);
      if (s0 + 2 * S::kStage < c1) find(s0 + 2 * S::kStage, stage);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // the stage's rows, and q, are in
    const unsigned char* kb = smem + stage * 2 * S::kStage * S::kRowBytes;
    const unsigned char* vb = kb + S::kStage * S::kRowBytes;
    if constexpr (kRaw) {  // A, from one block of an 8-bit row: q . codes, times the block's scale
      constexpr int kSB = kKvBlock<SA>;
      const int p = tid % S::kStage, j = tid / S::kStage, d0 = j * S::kSlice;
      const int blk =
          static_cast<int>(kb - smem) + p * S::kRowBytes + (d0 / kSB) * static_cast<int>(sizeof(SA));
      const float scale = __half2float(*reinterpret_cast<const __half*>(smem + blk));
      // The slice's codes, 4 a word, by 4-byte loads from the word they start in (they start 0 or 2 bytes
      // into it: a row is whole words, a block an even number of bytes), shifted into place.
      const int c0 = blk + 2 + d0 % kSB;
      const auto* words = reinterpret_cast<const uint32_t*>(smem + (c0 & ~3));
      const uint32_t shift = 8 * (c0 & 3);
      uint32_t codes[S::kSlice / 4 + 1];
#pragma unroll
      for (int i = 0; i <= S::kSlice / 4; ++i) codes[i] = words[i];
#pragma unroll
      for (int i = 0; i < S::kSlice / 4; ++i) codes[i] = __funnelshift_r(codes[i], codes[i + 1], shift);
      float s[G] = {};
      const float* qj = qs + d0;
#pragma unroll
      for (int i = 0; i < S::kSlice / 4; ++i) {
        const float2 lo = q8_pair(codes[i]), hi = q8_pair(codes[i] >> 16);
#pragma unroll
        for (int h = 0; h < G; ++h) {
          const float4 x = reinterpret_cast<const float4*>(qj + h * D)[i];
          s[h] += x.x * lo.x + x.y * lo.y + x.z * hi.x + x.w * hi.y;
        }
      }
#pragma unroll
      for (int h = 0; h < G; ++h) part[(j * G + h) * S::kStage + p] = scale * s[h];
    } else {  // A
      const int p = tid % S::kStage, j = tid / S::kStage;
      float s[G] = {};
      const unsigned char* kr = kb + p * S::kRowBytes + j * S::kSliceVecs * 16;
      const float* qj = qs + j * S::kSliceVecs * S::kVec;
#pragma unroll
      for (int i = 0; i < S::kSliceVecs; ++i) {
        float kf[S::kVec];
        unpack(kr + i * 16, kf);
#pragma unroll
        for (int h = 0; h < G; ++h) {
          const float4* qv = reinterpret_cast<const float4*>(qj + h * D + i * S::kVec);
#pragma unroll
          for (int c = 0; c < S::kVec / 4; ++c) {
            const float4 x = qv[c];
            s[h] += x.x * kf[4 * c] + x.y * kf[4 * c + 1] + x.z * kf[4 * c + 2] + x.w * kf[4 * c + 3];
          }
        }
      }
#pragma unroll
      for (int h = 0; h < G; ++h) part[(j * G + h) * S::kStage + p] = s[h];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < S::kHeadsAWarp; ++k) {  // B
      const int h = warp + S::kWarps * k;
      if (h >= G) break;
      constexpr int kR = S::kStage > 32 ? S::kStage / 32 : 1;  // a lane's positions of the stage
      float x[kR];
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        const int p = lane + 32 * r;
        x[r] = -INFINITY;
        if (p < n) {
          float v = 0.0f;
#pragma unroll
          for (int j = 0; j < S::kTpp; ++j) v += part[(j * G + h) * S::kStage + p];
          x[r] = g.softcap > 0.0f ? g.softcap * tanhf(v / g.softcap) : v;
        }
      }
      float xm = x[0];
#pragma unroll
      for (int r = 1; r < kR; ++r) xm = fmaxf(xm, x[r]);
      const float mm = fmaxf(m_run[k], warp_max(xm));
      float sum = 0.0f;
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        const int p = lane + 32 * r;
        const float e = x[r] == -INFINITY ? 0.0f : expf(x[r] - mm);
        if (p < S::kStage) es[h * S::kStage + p] = e;
        sum += e;
      }
      const float c = m_run[k] == -INFINITY ? 0.0f : expf(m_run[k] - mm);
      l_run[k] = l_run[k] * c + warp_sum(sum);
      m_run[k] = mm;
      if (lane == 0) corr[h] = c;
    }
    __syncthreads();
    {  // C
#pragma unroll
      for (int h = 0; h < G; ++h) {
        const float c = corr[h];
        acc[h][0] *= c, acc[h][1] *= c;
      }
      for (int p = pg; p < n; p += S::kPg) {
        float2 v;
        if constexpr (kRaw) {
          v = q8_staged_pair<kKvBlock<SA>>(vb + p * S::kRowBytes, 2 * dp);
        } else {
          v = load_pair(vb + p * S::kRowBytes + dp * 2 * sizeof(SA), SA{});
        }
#pragma unroll
        for (int h = 0; h < G; ++h) {
          const float e = es[h * S::kStage + p];
          acc[h][0] += e * v.x, acc[h][1] += e * v.y;
        }
      }
    }
    if (s0 + S::kStage < c1) land(stage ^ 1);  // 8-bit: the next stage's values, loaded at the top
    __syncthreads();                           // before the next stage's copies land in this one's buffers
  }
  // An empty chunk's copies (zeros) must land before the buffers are reused below: every thread's, so a
  // barrier after the waits when the loop, whose barriers would have ordered them, did not run (c0 >= c1 for
  // the whole block).
  cp_async_wait<0>();
  if (c0 >= c1) __syncthreads();
  pdl_trigger();  // K and V are read: the next kernel may be scheduled
#pragma unroll
  for (int k = 0; k < S::kHeadsAWarp; ++k) {
    const int h = warp + S::kWarps * k;
    if (h < G && lane == 0) ms[h] = m_run[k], ls[h] = l_run[k];
  }
  // The position groups' sums, in group order, into group 0 (the stages' buffers are free).
  float* red = reinterpret_cast<float*>(smem);  // [kPg - 1][G][D]
  if constexpr (S::kPg > 1) {
    if (pg > 0) {
#pragma unroll
      for (int h = 0; h < G; ++h) {
        red[((pg - 1) * G + h) * D + 2 * dp] = acc[h][0];
        red[((pg - 1) * G + h) * D + 2 * dp + 1] = acc[h][1];
      }
    }
  }
  __syncthreads();
  if (pg == 0) {
    if constexpr (S::kPg > 1) {
      for (int r = 0; r < S::kPg - 1; ++r) {
#pragma unroll
        for (int h = 0; h < G; ++h) {
          acc[h][0] += red[(r * G + h) * D + 2 * dp];
          acc[h][1] += red[(r * G + h) * D + 2 * dp + 1];
        }
      }
    }
    const int64_t rec = g.head_dim + 2;
#pragma unroll
    for (int h = 0; h < G; ++h) {
      if (h >= n_q) break;
      const int64_t row = h0 + h + g.n_heads * t;
      const int64_t d = 2 * dp;
      if (n_chunks == 1) {
        float* y = dst.row_as<float>(row);
        const float inv = ls[h] > 0.0f ? 1.0f / ls[h] : 0.0f;
        if (d < g.head_dim) y[d] = acc[h][0] * inv;
        if (d + 1 < g.head_dim) y[d + 1] = acc[h][1] * inv;
      } else {
        float* r = partial + (row * g.n_chunks + chunk) * rec;
        if (d < g.head_dim) r[d] = acc[h][0];
        if (d + 1 < g.head_dim) r[d + 1] = acc[h][1];
        if (dp == 0) r[g.head_dim] = ms[h], r[g.head_dim + 1] = ls[h];
      }
    }
  }
  if (n_chunks == 1 && g.xq != nullptr) {
    __syncthreads();  // the rows are written (two adjacent dims a thread): read back a warp a row
    round_rows(dst, h0 + g.n_heads * t, n_q, g);
  }
  if (n_chunks > 1) merge_if_last<D / 32>(partial, done, dst, g, h0 + g.n_heads * t, n_q, n_chunks);
}

template <int D, int G, class KV, class SA>
cudaError_t launch_staged(const Context& ctx, const ops::Attention& op, const Geometry& g, float* partial,
                          unsigned* done) {
  using S = Staged<D, SA>;
  return launch_decode<G, KV>(ctx, attention_staged_kernel<D, G, KV, SA>, S::kThreads, S::shared_bytes(G), op,
                              g, partial, done);
}

template <int D, class KV, class SA>
cudaError_t launch_staged_for_group(const Context& ctx, const ops::Attention& op, const Geometry& g,
                                    float* partial, unsigned* done) {
  switch (heads_per_block(g.group)) {
    case 1: return launch_staged<D, 1, KV, SA>(ctx, op, g, partial, done);
    case 2: return launch_staged<D, 2, KV, SA>(ctx, op, g, partial, done);
    case 4: return launch_staged<D, 4, KV, SA>(ctx, op, g, partial, done);
    default: return launch_staged<D, kDecodeGroup, KV, SA>(ctx, op, g, partial, done);
  }
}

// The staged kernel takes head dims of 33 to 256 that are whole 16-byte vectors of 16-byte-aligned pools;
// 8-bit pools (whole blocks, 2-byte aligned: cuda::supports) all of 33 to 256, loaded 2 bytes a load.
bool staged_eligible(const ops::Attention& op, const Geometry& g) {
  if (kv_q8_block(op.k_pool.type) > 0) return g.head_dim > 32 && g.head_dim <= 256;
  const int64_t esize = op.k_pool.type == DType::f16 ? 2 : 4;
  return g.head_dim > 32 && g.head_dim <= 256 && (g.head_dim * esize) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(op.k_pool.data) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(op.v_pool.data) % 16 == 0;
}

// Whether the staged kernel of head dim D stages rows of SA as they are: every type but the 8-bit blocks,
// and those whose rows of D values are whole 4-byte words (q8_0: D of 64, 128 or 256; q8_64: 128 or 256).
template <int D, class SA>
inline constexpr bool kStagedAsIs = !kKvQ8<SA> || (D / kKvBlock<SA> * sizeof(SA)) % 4 == 0;

// 8-bit pools are staged as they are (Staged<D, KvQ8B<B>>) where a row is D = 64, 128 or 256 values and
// kStagedAsIs (whole 4-byte words of 4-byte-aligned pools), and the pool's rows fit the kernel's 32-bit row
// numbers (stage_rows); other head dims stage f32 values.
bool staged_raw(const ops::Attention& op, const Geometry& g) {
  const int64_t block = kv_q8_block(op.k_pool.type);
  const int64_t rows = op.k_pool.ne[1] * op.k_pool.ne[2] * op.k_pool.ne[3];
  return block > 0 && (g.head_dim == 64 || g.head_dim == 128 || g.head_dim == 256) && rows < 0xffffffffLL &&
         g.head_dim / block * (block + 2) % 4 == 0 && reinterpret_cast<uintptr_t>(op.k_pool.data) % 4 == 0 &&
         reinterpret_cast<uintptr_t>(op.v_pool.data) % 4 == 0;
}

// The fewest positions a chunk of the staged kernel that takes these rows, staged as SA.
template <class SA>
int64_t staged_min_chunk(int64_t head_dim) {
  if constexpr (kStagedAsIs<64, SA>) {
    if (head_dim <= 64) return Staged<64, SA>::kMinChunk;
  }  // else rows of 64 are not staged so (staged_raw)
  return head_dim <= 128 ? Staged<128, SA>::kMinChunk : Staged<256, SA>::kMinChunk;
}

template <class KV, class SA>
cudaError_t launch_staged_for_head_dim(const Context& ctx, const ops::Attention& op, const Geometry& g,
                                       float* partial, unsigned* done) {
  if (g.head_dim <= 64) {
    if constexpr (kStagedAsIs<64, SA>) return launch_staged_for_group<64, KV, SA>(ctx, op, g, partial, done);
    return cudaErrorNotSupported;  // not staged so (staged_raw)
  }
  if (g.head_dim <= 128) return launch_staged_for_group<128, KV, SA>(ctx, op, g, partial, done);
  return launch_staged_for_group<256, KV, SA>(ctx, op, g, partial, done);
}

}  // namespace

cudaError_t attention_decode(const Context& ctx, const ops::Attention& op, Geometry g) {
  // Split the positions when the blocks alone would not fill the device: decode is bound by the latency of
  // each block's walk over its positions more than by bytes. The staged kernel (one block a multiprocessor:
  // its registers and shared memory) aims at two waves: a block's fixed costs (the step metadata, the first
  // stage's wait, the merge) favour fewer, longer chunks, and at 32,768 positions of the 8B shape 33 chunks
  // (two full waves of 264 blocks) took 103.6 us (f16) and 94.2 (q8_64) where 64 (3.9 waves) took 124.4
  // and 110.6, and 17 (a wave and 4 blocks) 164.0 and 140.8. The unstaged kernel, of small blocks, many a
  // multiprocessor, aims at four times the multiprocessors. The longest context a token may see bounds the
  // useful split: the positions live on the device (a recorded step replays with others), so the block
  // tables' total length bounds the grid, and each token splits its own span into as many chunks of at
  // least min_chunk positions as fit (live_chunks), the grid's other blocks returning at once. A short span
  // thus takes one chunk and writes its result without the merge.
  // The staged kernel's chunks hold at least Staged::kMinChunk positions (four stages; 256 positions of f16
  // rows of up to 128 dims, and of 8-bit ones, whose stages are 128 positions), the unstaged kernel's 16
  // (four a warp). Under CudaOptions::batch_invariant the split ignores how many blocks the batch has: a
  // token's chunks are then as many as its own span fills, up to kMaxChunks (the block tables' length bounds
  // every token's span, so the capacity below never clamps a token's live_chunks), and its sums are the same
  // alone or among any others.
  const bool staged = staged_eligible(op, g), raw = staged_raw(op, g);
  const bool f16 = op.k_pool.type == DType::f16, q8_64 = op.k_pool.type == DType::q8_64;
  const bool q8 = kv_q8_block(op.k_pool.type) > 0;
  const int64_t min_chunk = !staged        ? 16
                            : f16          ? staged_min_chunk<__half>(g.head_dim)
                            : raw && q8_64 ? staged_min_chunk<KvQ8x64>(g.head_dim)
                            : raw          ? staged_min_chunk<KvQ8>(g.head_dim)
                                           : staged_min_chunk<float>(g.head_dim);
  const int64_t hpb = heads_per_block(g.group);
  const int64_t blocks = g.n_tokens * g.n_kv * ((g.group + hpb - 1) / hpb);
  const int64_t capacity = std::max<int64_t>(1, op.bt_indices.ne[0]) * g.block_size;
  const int64_t per_sm = staged ? 2 : 4;  // blocks a multiprocessor the split aims at
  const int64_t want =
      ctx.options.batch_invariant ? kMaxChunks : (per_sm * int64_t{ctx.n_sms} + blocks - 1) / blocks;
  g.n_chunks =
      std::max<int64_t>(1, std::min<int64_t>({want, (capacity + min_chunk - 1) / min_chunk, kMaxChunks}));
  g.min_chunk = min_chunk;
  float* partial = nullptr;
  unsigned* done = nullptr;
  if (g.n_chunks > 1) {
    const size_t bytes = sizeof(float) * g.n_tokens * g.n_heads * g.n_chunks * (g.head_dim + 2);
    partial = static_cast<float*>(ctx.scratch(kSlotPartial, bytes));
    done = static_cast<unsigned*>(ctx.scratch(kSlotCounters, sizeof(unsigned) * blocks));
    if (partial == nullptr || done == nullptr) return cudaErrorMemoryAllocation;
  }
  if (staged) {
    if (q8_64) {
      return raw ? launch_staged_for_head_dim<KvQ8x64, KvQ8x64>(ctx, op, g, partial, done)
                 : launch_staged_for_head_dim<KvQ8x64, float>(ctx, op, g, partial, done);
    }
    return f16   ? launch_staged_for_head_dim<__half, __half>(ctx, op, g, partial, done)
           : raw ? launch_staged_for_head_dim<KvQ8, KvQ8>(ctx, op, g, partial, done)
           : q8  ? launch_staged_for_head_dim<KvQ8, float>(ctx, op, g, partial, done)
                 : launch_staged_for_head_dim<float, float>(ctx, op, g, partial, done);
  }
  // 8-bit pools past 32 dims take the staged kernel: the unstaged one only q8_0 rows of 32.
  if (q8) {
    return !q8_64 && g.head_dim <= 32 ? launch_for_group<1, KvQ8>(ctx, op, g, partial, done)
                                      : cudaErrorNotSupported;
  }
  return f16 ? launch_for_head_dim<__half>(ctx, op, g, partial, done)
             : launch_for_head_dim<float>(ctx, op, g, partial, done);
}

}  // namespace kiln::cuda
