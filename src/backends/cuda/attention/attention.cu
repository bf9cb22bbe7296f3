// Paged causal attention on CUDA: the op's dispatch, and the exact prefill kernel. Prefill-shaped batches
// (many tokens, several a sequence) take a tiled kernel: on tensor cores at the fast precision
// (attention/attention_prefill.cu), else the exact one here on CUDA cores; decode-shaped ones the split-KV
// kernels of attention/attention_decode.cu.
#include <algorithm>
#include <cstdint>

#include "backends/cuda/attention/attention.cuh"
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_launch.cuh"

namespace kiln::cuda {

namespace {

constexpr int kMaxHeadDim = 256;
constexpr int64_t kTileMinTokens = 32;       // batches from this size take the tiled (prefill) kernel ...
constexpr int64_t kTileMinTokensPerSeq = 4;  // ... when they hold this many tokens a sequence on average

// ---- prefill: a tile of query rows shares every K/V position it reads ----
//
// A block holds up to kTileRows query rows: T consecutive tokens of the batch x the query heads of one KV
// head (up to kTileRows of them), kTpr threads a row, each thread kDpt of the row's dims (dims s, s + kTpr,
// ...: the threads of a row read different shared-memory banks). The block walks the positions of the tile's
// sequence in chunks (64 KiB of K and V): the chunk's K and V rows go to shared memory once (as f32) and
// serve every row of the tile; each row takes the positions its token may see (causal, window), the scores a
// sum over its kTpr threads, the softmax online. Tokens of different sequences in one tile take turns, one
// sequence at a time. Exact f32 arithmetic, as the decode kernel; bound by the FMAs, not by K/V traffic (the
// decode kernel would read K/V once per token).
constexpr int kTileThreads = 256;

// K/V rows p0 .. p0+n-1 of a sequence into shared memory as f32 (chunk[j * head_dim + d]), 16 bytes a load
// where the row length allows. Rows of blocks given back (kFreedBlock) are skipped: no token reads them.
template <class KV>
__device__ inline void load_chunk(float* chunk, const KV* pool, const int32_t* table, int32_t p0, int32_t n,
                                  int64_t kvh, const Geometry& g) {
  constexpr int kVec = 16 / sizeof(KV);  // elements a 16-byte load
  const int64_t row_stride = g.n_kv * g.head_dim;
  if (g.head_dim % kVec == 0 && reinterpret_cast<uintptr_t>(pool) % 16 == 0) {
    const int64_t vecs = g.head_dim / kVec;
    for (int64_t e = threadIdx.x; e < int64_t{n} * vecs; e += blockDim.x) {
      const DivMod jd = divmod(e, vecs);
      const int64_t j = jd.q, d = jd.r * kVec, p = p0 + j;
      const DivMod pb = divmod(p, g.block_size);
      const int32_t blk = table[pb.q];
      if (blk < 0) continue;
      const KV* src = pool + (int64_t{blk} * g.block_size + pb.r) * row_stride + kvh * g.head_dim + d;
      const uint4 v = *reinterpret_cast<const uint4*>(src);
      const KV* vals = reinterpret_cast<const KV*>(&v);
#pragma unroll
      for (int i = 0; i < kVec; ++i) chunk[j * g.head_dim + d + i] = kv_value(vals, i);
    }
    return;
  }
  for (int64_t e = threadIdx.x; e < int64_t{n} * g.head_dim; e += blockDim.x) {
    const DivMod jd = divmod(e, g.head_dim);
    const int64_t j = jd.q, d = jd.r, p = p0 + j;
    const DivMod pb = divmod(p, g.block_size);
    const int32_t blk = table[pb.q];
    if (blk < 0) continue;
    chunk[e] = kv_value(pool + (int64_t{blk} * g.block_size + pb.r) * row_stride + kvh * g.head_dim, d);
  }
}
// The same of an 8-bit pool: 8 values of a block a load (kv_pool.cuh's kv_q8_chunk).
template <int B>
__device__ inline void load_chunk(float* chunk, const KvQ8B<B>* pool, const int32_t* table, int32_t p0,
                                  int32_t n, int64_t kvh, const Geometry& g) {
  kv_q8_chunk(chunk, pool, table, p0, n, kvh, g.n_kv, g.head_dim, g.block_size);
}

template <int kTpr, class KV>
__global__ void __launch_bounds__(kTileThreads)
    attention_tile_kernel(Rows q, const KV* k_pool, const KV* v_pool, const int32_t* positions,
                          const int32_t* seq, const int32_t* bt_indptr, const int32_t* bt_indices, Rows dst,
                          Geometry g, int64_t tile_tokens, int64_t heads_per_tile, int32_t chunk_len) {
  pdl_begin();
  constexpr int kDpt = 32;          // dims a thread, at most: head_dim <= kTpr * 32
  extern __shared__ float chunk[];  // K then V: chunk_len x head_dim each
  const int64_t tiles_per_kv = (g.group + heads_per_tile - 1) / heads_per_tile;
  const int64_t b = blockIdx.x;
  const int64_t tile = b / (g.n_kv * tiles_per_kv), kvh = (b / tiles_per_kv) % g.n_kv;
  const int64_t h0 = kvh * g.group + (b % tiles_per_kv) * heads_per_tile;
  const int64_t n_q = min(heads_per_tile, kvh * g.group + g.group - h0);
  const int64_t t0 = tile * tile_tokens, t1 = min(t0 + tile_tokens, g.n_tokens);
  const int row = threadIdx.x / kTpr, sub = threadIdx.x % kTpr;
  // The lanes of this row: the rows of a warp walk different position ranges, so a shuffle names only its
  // own.
  const unsigned row_mask = (kTpr == 32 ? 0xffffffffu : (1u << kTpr) - 1u)
                            << (threadIdx.x % 32 / kTpr * kTpr);
  const int64_t my_t = t0 + row / n_q, my_h = h0 + row % n_q;
  const bool active = row < (t1 - t0) * n_q;
  const int32_t my_seq = active ? seq[my_t] : -1, my_pos = active ? positions[my_t] : -1;
  const int32_t my_lo = g.window > 0 ? max(0, my_pos - g.window + 1) : 0;

  float qv[kDpt], acc[kDpt];
  const float* qr = active ? q.row_as<const float>(my_h + g.n_heads * my_t) : nullptr;
#pragma unroll
  for (int i = 0; i < kDpt; ++i) {
    const int64_t d = sub + int64_t{kTpr} * i;
    qv[i] = (qr != nullptr && d < g.head_dim) ? qr[d] * g.scale : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  float* kc = chunk;
  float* vc = chunk + chunk_len * g.head_dim;

  // One sequence of the tile at a time: the first token of each sequence in the tile opens its turn.
  for (int64_t f = t0; f < t1; ++f) {
    const int32_t s = seq[f];
    int32_t lo, hi;
    if (!opens_turn(seq, positions, t0, f, t1, g, lo, hi)) continue;
    const int32_t* table = bt_indices + bt_indptr[s];
    for (int32_t c0 = lo; c0 <= hi; c0 += chunk_len) {
      const int32_t n_c = min(chunk_len, hi - c0 + 1);
      __syncthreads();  // the previous chunk is no longer read
      load_chunk(kc, k_pool, table, c0, n_c, kvh, g);
      load_chunk(vc, v_pool, table, c0, n_c, kvh, g);
      __syncthreads();
      if (my_seq != s) continue;
      const int32_t j0 = max(0, my_lo - c0), j1 = min(n_c, my_pos - c0 + 1);
      for (int32_t j = j0; j < j1; ++j) {
        const float* kr = kc + int64_t{j} * g.head_dim;
        float sc = 0.0f;
#pragma unroll
        for (int i = 0; i < kDpt; ++i) {
          const int64_t d = sub + int64_t{kTpr} * i;
          if (d < g.head_dim) sc += qv[i] * kr[d];
        }
#pragma unroll
        for (int o = kTpr / 2; o > 0; o >>= 1) sc += __shfl_xor_sync(row_mask, sc, o);
        if (g.softcap > 0.0f) sc = g.softcap * tanhf(sc / g.softcap);
        const float mm = fmaxf(m, sc);
        const float ca = expf(m - mm), pe = expf(sc - mm);
        l = l * ca + pe;
        const float* vr = vc + int64_t{j} * g.head_dim;
#pragma unroll
        for (int i = 0; i < kDpt; ++i) {
          const int64_t d = sub + int64_t{kTpr} * i;
          acc[i] = acc[i] * ca + pe * (d < g.head_dim ? vr[d] : 0.0f);
        }
        m = mm;
      }
    }
  }
  if (!active) return;
  float* y = dst.row_as<float>(my_h + g.n_heads * my_t);
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
  for (int i = 0; i < kDpt; ++i) {
    const int64_t d = sub + int64_t{kTpr} * i;
    if (d < g.head_dim) y[d] = acc[i] * inv;
  }
}

template <int kTpr, class KV>
cudaError_t launch_tile(const Context& ctx, const ops::Attention& op, const Geometry& g) {
  constexpr int64_t rows = kTileThreads / kTpr;
  const int64_t heads_per_tile = std::min<int64_t>(g.group, rows);
  const int64_t tile_tokens = std::max<int64_t>(1, rows / heads_per_tile);
  const int64_t tiles = (g.n_tokens + tile_tokens - 1) / tile_tokens;
  const int64_t tiles_per_kv = (g.group + heads_per_tile - 1) / heads_per_tile;
  // 64 KiB of K and V a chunk: 64 positions of 128 dims.
  const auto chunk_len = static_cast<int32_t>(std::max<int64_t>(16, 8192 / g.head_dim));
  const size_t shm = sizeof(float) * 2 * chunk_len * g.head_dim;
  auto* kernel = attention_tile_kernel<kTpr, KV>;
  if (const cudaError_t e = allow_dynamic_shared(reinterpret_cast<const void*>(kernel), shm);
      e != cudaSuccess) {
    return e;
  }
  (void)launch_kernel(
      ctx, kernel, static_cast<unsigned>(tiles * g.n_kv * tiles_per_kv), kTileThreads, shm, rows_of(op.q),
      static_cast<const KV*>(op.k_pool.data), static_cast<const KV*>(op.v_pool.data),
      static_cast<const int32_t*>(op.positions.data), static_cast<const int32_t*>(op.seq.data),
      static_cast<const int32_t*>(op.bt_indptr.data), static_cast<const int32_t*>(op.bt_indices.data),
      rows_of(op.dst), g, tile_tokens, heads_per_tile, chunk_len);
  return cudaGetLastError();
}

template <class KV>
cudaError_t launch_tile_for_head_dim(const Context& ctx, const ops::Attention& op, const Geometry& g) {
  if (g.head_dim <= 4 * 32) return launch_tile<4, KV>(ctx, op, g);
  return launch_tile<8, KV>(ctx, op, g);
}

Geometry geometry_of(const ops::Attention& op) {
  Geometry g{};
  g.head_dim = op.q.ne[0];
  g.n_heads = op.q.ne[1];
  g.n_tokens = op.q.ne[2];
  g.n_kv = op.k_pool.ne[1];
  g.group = g.n_heads / g.n_kv;
  g.block_size = op.k_pool.ne[2];
  g.scale = op.scale;
  g.softcap = op.softcap;
  g.window = op.window;
  return g;
}

// A batch of many tokens, several a sequence on average (prefill), is mostly tokens of the same sequences:
// tiles of them share K/V reads. A batch of one token a sequence (batched decode) takes the split-KV kernel,
// whose blocks each serve one token. Under CudaOptions::batch_invariant every batch takes the split-KV
// kernel (its chunks then chosen by the token's span alone: attention_decode): a token's kernel must not
// depend on the tokens beside it, and a prefill chunk alone and among decodes would take different ones
// here.
bool takes_tiles(const Context& ctx, const ops::Attention& op, const Geometry& g) {
  const int64_t n_seqs = std::max<int64_t>(1, op.bt_indptr.ne[0] - 1);
  return !ctx.options.batch_invariant && g.n_tokens >= kTileMinTokens &&
         g.n_tokens >= kTileMinTokensPerSeq * n_seqs;
}

}  // namespace

bool attention_supported(const ops::Attention& op) { return op.q.ne[0] <= kMaxHeadDim; }

bool attention_writes_half(const Context& ctx, const ops::Attention& op) {
  const Geometry g = geometry_of(op);
  const Tensor& y = op.dst;
  return g.head_dim <= kMaxHeadDim && takes_tiles(ctx, op, g) && mma_eligible(ctx, op, g) &&
         y.type == DType::f32 && y.ne[3] == 1 && y.nb[1] == g.head_dim * 4 &&
         y.nb[2] == g.n_heads * g.head_dim * 4;
}

bool attention_rounds_q8(const Context& ctx, const ops::Attention& op) {
  const Geometry g = geometry_of(op);
  const Tensor& y = op.dst;
  return g.head_dim <= kMaxHeadDim && !takes_tiles(ctx, op, g) && g.head_dim % 32 == 0 &&
         y.type == DType::f32 && y.ne[3] == 1 && y.nb[1] == g.head_dim * 4 &&
         y.nb[2] == g.n_heads * g.head_dim * 4;
}

cudaError_t attention(const Context& ctx, const ops::Attention& op, uint16_t* xh, bool f16, int8_t* xq,
                      float2* xds) {
  Geometry g = geometry_of(op);
  if (g.head_dim > kMaxHeadDim) return cudaErrorNotSupported;
  if (xh != nullptr && !attention_writes_half(ctx, op)) return cudaErrorInvalidValue;
  if (xq != nullptr) {
    if (!attention_rounds_q8(ctx, op)) return cudaErrorInvalidValue;
    g.xq = xq, g.xds = xds;
  }
  if (takes_tiles(ctx, op, g)) {
    const DType pool = op.k_pool.type;
    if (mma_eligible(ctx, op, g)) return attention_prefill_mma(ctx, op, g, xh, f16);
    return pool == DType::f16     ? launch_tile_for_head_dim<__half>(ctx, op, g)
           : pool == DType::q8_0  ? launch_tile_for_head_dim<KvQ8>(ctx, op, g)
           : pool == DType::q8_64 ? launch_tile_for_head_dim<KvQ8x64>(ctx, op, g)
                                  : launch_tile_for_head_dim<float>(ctx, op, g);
  }
  return attention_decode(ctx, op, g);
}

}  // namespace kiln::cuda
