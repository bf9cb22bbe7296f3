// Paged causal attention on the CPU, two paths.
//
// Exact (ops::Precision::precision_exact, `--exact`): threads split the (token, head) pairs; each computes
// the scores of its query against the positions it may see (read through the block table), a softmax in f32
// with the max subtracted, and the weighted sum of the V rows. K/V rows are f32 or f16 (converted per row).
// The loop is compiled twice: for the baseline ISA and, on x86-64, for AVX2 without FMA, picked at run time.
// The arithmetic is written once (attend_range) and holds no fused multiply-add and no reassociation, so the
// wider vectors compute the same bits: each of dot_f32's 8 sums is one lane, each output element its own.
//
// Tiled (precision_fast, the default of run / bench / serve): online softmax over chunks of kAttnChunk
// positions, in the level's kernels (kernels/cpu_kernels.h, AttnChunk; docs/cpu-kernels.md). A tile is up to
// kTileRows query rows: consecutive tokens of one sequence (consecutive positions) x the query heads of one
// KV head, so each K/V row read serves the GQA group and the tile's tokens. Positions go in segments of
// kAttnSegment (at multiples of it): a row's state takes in its chunks in order, each segment from a fresh
// state, and the segments in order. Where the merges happen is thus fixed by position alone, so a tile of few
// tokens over a long context (decode) may run its segments on several threads and merge them after, with the
// same bits as one thread walking them. Work units (tile x KV head, or x segment when split) go to threads
// largest first.
#include <algorithm>
#include <atomic>
#include <cassert>
#include <cmath>
#include <numeric>
#include <vector>

#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/kernels/cpu_kernels.h"
#include "core/half.h"

namespace kiln::cpu {

namespace {

// Pool row (kv_head, slot) as f32: in place for f32, converted into `tmp` for f16, dequantized into it for
// q8_0 and q8_64.
const float* pool_row(const Tensor& pool, int64_t kv_head, int64_t slot, float* tmp) {
  const int64_t block_size = pool.ne[2];
  const uint8_t* row = pool.row(kv_head, slot % block_size, slot / block_size);
  if (pool.type == DType::f32) return reinterpret_cast<const float*>(row);
  if (pool.type == DType::q8_0 || pool.type == DType::q8_64) {
    dtype_info(pool.type).dequantize_row(row, tmp, pool.ne[0]);
    return tmp;
  }
  const auto* h = reinterpret_cast<const uint16_t*>(row);
  for (int64_t i = 0; i < pool.ne[0]; ++i) tmp[i] = f16_to_f32(h[i]);
  return tmp;
}

// The (token, head) pairs [begin, end).
[[gnu::always_inline]] inline void attend_range(const ops::Attention& op, int64_t begin, int64_t end) {
  const int64_t head_dim = op.q.ne[0], n_heads = op.q.ne[1];
  const int64_t group = n_heads / op.k_pool.ne[1], block_size = op.k_pool.ne[2];
  const auto positions = op.positions.span_as<const int32_t>(), seq = op.seq.span_as<const int32_t>();
  const auto indptr = op.bt_indptr.span_as<const int32_t>(), indices = op.bt_indices.span_as<const int32_t>();
  std::vector<float> scores, out(head_dim), tmp(head_dim);
  for (int64_t th = begin; th < end; ++th) {
    const int64_t t = th / n_heads, h = th % n_heads, kv_head = h / group;
    const auto table = indices.subspan(indptr[seq[t]], indptr[seq[t] + 1] - indptr[seq[t]]);
    const int64_t last = positions[t];
    const int64_t first = op.window > 0 ? std::max<int64_t>(0, last - op.window + 1) : 0;
    const auto* q = op.q.row_as<const float>(h, t);
    scores.resize(last - first + 1);
    float mx = -INFINITY;
    for (int64_t p = first; p <= last; ++p) {
      const int64_t slot = table[p / block_size] * block_size + p % block_size;
      float s = dot_f32(q, pool_row(op.k_pool, kv_head, slot, tmp.data()), head_dim) * op.scale;
      if (op.softcap > 0.0f) s = op.softcap * std::tanh(s / op.softcap);
      scores[p - first] = s;
      mx = std::max(mx, s);
    }
    float sum = 0.0f;
    for (float& s : scores) sum += s = std::exp(s - mx);
    const float inv = 1.0f / sum;
    std::fill(out.begin(), out.end(), 0.0f);
    for (int64_t p = first; p <= last; ++p) {
      const int64_t slot = table[p / block_size] * block_size + p % block_size;
      const float* v = pool_row(op.v_pool, kv_head, slot, tmp.data());
      const float w = scores[p - first] * inv;
      for (int64_t i = 0; i < head_dim; ++i) out[i] += w * v[i];
    }
    std::copy(out.begin(), out.end(), op.dst.row_as<float>(h, t));
  }
}

void attend_baseline(const ops::Attention& op, int64_t begin, int64_t end) { attend_range(op, begin, end); }

#if defined(__x86_64__)
// AVX2 alone: no FMA, so the compiler cannot contract a product and a sum into one rounding.
[[gnu::target("avx2")]] void attend_avx2(const ops::Attention& op, int64_t begin, int64_t end) {
  attend_range(op, begin, end);
}
#endif

// ---- the tiled path ----

constexpr int64_t kTileRows = 64;      // query rows a tile aims at (tokens x the GQA group)
constexpr int64_t kAttnSegment = 512;  // positions a segment, a multiple of kAttnChunk
constexpr int64_t kSplitTokens = 2;    // tiles of at most this many tokens split their segments among threads
static_assert(kAttnSegment % kAttnChunk == 0);

struct Tile {
  int32_t seq;
  int64_t t0, n_tok;    // tokens t0 .. t0 + n_tok - 1, at consecutive positions
  int64_t first, last;  // the lowest and highest position any of its rows sees
  int64_t g0, ng;       // the query heads [g0, g0 + ng) of the GQA group (all but for a split decode step)
};

struct Unit {
  int32_t tile, kv_head;
  int64_t seg0, seg1;  // segments [seg0, seg1]
  int64_t cost;        // rows x chunks: the order in which threads take units
  int64_t state;       // -1: the unit writes dst; else the index of its segment state (split tiles)
};

// Floats of one state of rows [rp]: m [rp], l [rp], o [n_rows][dp].
int64_t state_floats(int64_t rp, int64_t n_rows, int64_t dp) { return 2 * rp + n_rows * dp; }

void state_reset(float* st, int64_t rp, int64_t n_rows, int64_t dp) {
  std::fill(st, st + rp, -INFINITY);
  std::fill(st + rp, st + 2 * rp + n_rows * dp, 0.0f);
}

struct TiledAttention {
  const ops::Attention& op;
  const CpuKernels& kern;
  int64_t head_dim = 0, n_heads = 0, group = 0, block_size = 0, dp = 0;  // dp: head_dim padded (o's stride)
  std::span<const int32_t> positions{}, seq{}, indptr{}, indices{};
  std::vector<Tile> tiles{};
  std::vector<Unit> units{};
  std::vector<float> states{};  // the split units' segment states

  int64_t first_of(int64_t t) const {
    return op.window > 0 ? std::max<int64_t>(0, positions[t] - op.window + 1) : 0;
  }
  int64_t n_rows(const Tile& tl) const { return tl.n_tok * tl.ng; }

  // Rows of tile `tl` for KV head `kv`, segments [seg0, seg1], into state `out` (state_floats of the tile).
  void run(const Tile& tl, int64_t kv, int64_t seg0, int64_t seg1, float* out,
           std::vector<float>& buf) const {
    const int64_t rows = n_rows(tl), rp = attn_pad(rows), sf = state_floats(rp, rows, dp);
    buf.resize(head_dim * rp + 4 * rp + sf + attn_scratch_floats(head_dim, rp));
    float* qt = buf.data();             // [head_dim][rp]
    float* first = qt + head_dim * rp;  // [rp] each row's positions, absolute
    float* last = first + rp;
    float* lo = last + rp;  // [rp] chunk-relative
    float* hi = lo + rp;
    float* seg = hi + rp;  // the segment's state
    float* scratch = seg + sf;
    std::fill(qt, qt + head_dim * rp, 0.0f);
    for (int64_t r = 0; r < rp; ++r) first[r] = 1.0f, last[r] = 0.0f;  // padding rows see nothing
    for (int64_t i = 0; i < tl.n_tok; ++i) {
      const int64_t t = tl.t0 + i;
      for (int64_t g = 0; g < tl.ng; ++g) {
        const int64_t r = i * tl.ng + g;
        const auto* q = op.q.row_as<const float>(kv * group + tl.g0 + g, t);
        for (int64_t d = 0; d < head_dim; ++d) qt[d * rp + r] = q[d];
        first[r] = static_cast<float>(first_of(t));
        last[r] = static_cast<float>(positions[t]);
      }
    }
    const auto table = indices.subspan(indptr[tl.seq], indptr[tl.seq + 1] - indptr[tl.seq]);
    const uint8_t* k_rows[kAttnChunk];
    const uint8_t* v_rows[kAttnChunk];
    const uint8_t* k_next[kAttnChunk];
    const uint8_t* v_next[kAttnChunk];
    state_reset(out, rp, rows, dp);
    for (int64_t sg = seg0; sg <= seg1; ++sg) {
      state_reset(seg, rp, rows, dp);
      const int64_t c_begin = std::max(sg * kAttnSegment, tl.first / kAttnChunk * kAttnChunk);
      const int64_t c_end = std::min((sg + 1) * kAttnSegment, tl.last + 1);
      for (int64_t c0 = c_begin; c0 < c_end; c0 += kAttnChunk) {
        int64_t j0 = kAttnChunk, j1 = 0;
        for (int64_t r = 0; r < rp; ++r) {
          const int64_t a = std::max<int64_t>(static_cast<int64_t>(first[r]) - c0, 0);
          const int64_t b = std::min<int64_t>(static_cast<int64_t>(last[r]) - c0, kAttnChunk - 1);
          lo[r] = static_cast<float>(a), hi[r] = static_cast<float>(b);
          if (r < rows && a <= b) j0 = std::min(j0, a), j1 = std::max(j1, b + 1);
        }
        if (j0 >= j1) continue;
        pool_rows(table, kv, c0 + j0, c0 + j1, k_rows + j0, v_rows + j0);
        // The next chunk's rows, asked for ahead of their use: a decode step reads them from memory, once
        // each, and the kernel's walk over 8 or 16 rows at a time, 4 bytes of each, leaves the hardware
        // prefetchers behind (SmolLM2 at 3,300 positions: ~1.5 ms of attention a layer without this).
        const int64_t n0 = std::max(c0 + kAttnChunk, tl.first),
                      n1 = std::min(c0 + 2 * kAttnChunk, tl.last + 1);
        if (n0 < n1) {
          pool_rows(table, kv, n0, n1, k_next, v_next);
          const int64_t bytes = op.k_pool.nb[1];  // a row (both pools)
          for (int64_t i = 0; i < n1 - n0; ++i) {
            for (int64_t off = 0; off < bytes; off += 64) {
              __builtin_prefetch(k_next[i] + off, 0, 2);
              __builtin_prefetch(v_next[i] + off, 0, 2);
            }
          }
        }
        const AttnChunk c{qt,
                          head_dim,
                          rows,
                          rp,
                          dp,
                          static_cast<uint32_t>(op.k_pool.type),
                          k_rows,
                          v_rows,
                          static_cast<int>(j0),
                          static_cast<int>(j1),
                          lo,
                          hi,
                          op.scale,
                          op.softcap,
                          seg,
                          seg + rp,
                          seg + 2 * rp,
                          scratch};
        kern.attn_chunk(c);
      }
      kern.attn_merge(out, out + rp, out + 2 * rp, seg, seg + rp, seg + 2 * rp, rows, rp, dp, scratch);
    }
  }

  // The K and V rows (KV head kv) of positions [p0, p1) into k[p - p0], v[p - p0], a block at a time (no
  // division a position).
  void pool_rows(std::span<const int32_t> table, int64_t kv, int64_t p0, int64_t p1, const uint8_t** k,
                 const uint8_t** v) const {
    const int64_t k_step = op.k_pool.nb[2], v_step = op.v_pool.nb[2];  // bytes between positions of a block
    for (int64_t p = p0; p < p1;) {
      const int64_t block = table[p / block_size], off = p % block_size;
      assert(block >= 0 && "a position some row sees is in a freed block");
      const uint8_t* kb = op.k_pool.row(kv, off, block);
      const uint8_t* vb = op.v_pool.row(kv, off, block);
      const int64_t n = std::min(block_size - off, p1 - p);
      for (int64_t i = 0; i < n; ++i) k[p - p0 + i] = kb + i * k_step, v[p - p0 + i] = vb + i * v_step;
      p += n;
    }
  }

  // dst rows of tile `tl`, KV head `kv`, from state `st`: o / l.
  void write(const Tile& tl, int64_t kv, const float* st) const {
    const int64_t rows = n_rows(tl), rp = attn_pad(rows);
    for (int64_t r = 0; r < rows; ++r) {
      const float inv = 1.0f / st[rp + r];
      const float* o = st + 2 * rp + r * dp;
      float* y = op.dst.row_as<float>(kv * group + tl.g0 + r % tl.ng, tl.t0 + r / tl.ng);
      for (int64_t d = 0; d < head_dim; ++d) y[d] = o[d] * inv;
    }
  }
};

void attention_tiled(ThreadPool& pool, const CpuKernels& kern, const ops::Attention& op) {
  TiledAttention ta{op, kern};
  ta.head_dim = op.q.ne[0], ta.n_heads = op.q.ne[1];
  ta.group = ta.n_heads / op.k_pool.ne[1], ta.block_size = op.k_pool.ne[2], ta.dp = attn_pad(ta.head_dim);
  ta.positions = op.positions.span_as<const int32_t>(), ta.seq = op.seq.span_as<const int32_t>();
  ta.indptr = op.bt_indptr.span_as<const int32_t>(), ta.indices = op.bt_indices.span_as<const int32_t>();
  const int64_t n_tokens = op.q.ne[2], n_kv = op.k_pool.ne[1];
  const int64_t tile_tokens = std::max<int64_t>(1, kTileRows / ta.group);

  // Tiles: runs of consecutive tokens of one sequence at consecutive positions.
  for (int64_t t = 0; t < n_tokens; ++t) {
    Tile* last = ta.tiles.empty() ? nullptr : &ta.tiles.back();
    if (last != nullptr && last->seq == ta.seq[t] && last->n_tok < tile_tokens &&
        ta.positions[t] == last->last + 1) {
      ++last->n_tok, last->last = ta.positions[t];
    } else {
      ta.tiles.push_back({ta.seq[t], t, 1, ta.first_of(t), ta.positions[t], 0, ta.group});
    }
  }
  // Too few tiles to keep the threads busy (a decode step of one or two sequences): single tokens within one
  // segment are split by query heads. A row's bits do not depend on the rows beside it, so this changes none.
  const auto want = static_cast<int64_t>(2 * pool.n_threads());
  if (static_cast<int64_t>(ta.tiles.size()) * n_kv < want && ta.group > 1) {
    const int64_t parts =
        std::min<int64_t>(ta.group, (want + static_cast<int64_t>(ta.tiles.size()) * n_kv - 1) /
                                        (static_cast<int64_t>(ta.tiles.size()) * n_kv));
    std::vector<Tile> split;
    for (const Tile& tl : ta.tiles) {
      if (tl.n_tok > 1 || tl.first / kAttnSegment != tl.last / kAttnSegment) {
        split.push_back(tl);
        continue;
      }
      for (int64_t p = 0; p < parts; ++p) {
        Tile part = tl;
        part.g0 = ta.group * p / parts, part.ng = ta.group * (p + 1) / parts - part.g0;
        split.push_back(part);
      }
    }
    ta.tiles = std::move(split);
  }
  // Units, and the split tiles' state slots.
  int64_t n_states = 0;
  std::vector<int64_t> state_at(ta.tiles.size(),
                                -1);  // first state of a split tile (KV head 0, first segment)
  for (size_t i = 0; i < ta.tiles.size(); ++i) {
    const Tile& tl = ta.tiles[i];
    const int64_t seg0 = tl.first / kAttnSegment, seg1 = tl.last / kAttnSegment, rows = ta.n_rows(tl);
    const bool split = seg1 > seg0 && tl.n_tok <= kSplitTokens;
    if (split) state_at[i] = n_states, n_states += n_kv * (seg1 - seg0 + 1);
    for (int64_t kv = 0; kv < n_kv; ++kv) {
      if (!split) {
        const int64_t chunks = tl.last / kAttnChunk - tl.first / kAttnChunk + 1;
        ta.units.push_back(
            {static_cast<int32_t>(i), static_cast<int32_t>(kv), seg0, seg1, rows * chunks, -1});
        continue;
      }
      for (int64_t sg = seg0; sg <= seg1; ++sg) {
        const int64_t state = state_at[i] + kv * (seg1 - seg0 + 1) + (sg - seg0);
        ta.units.push_back({static_cast<int32_t>(i), static_cast<int32_t>(kv), sg, sg,
                            rows * (kAttnSegment / kAttnChunk), state});
      }
    }
  }
  const int64_t max_rows = attn_pad(tile_tokens * ta.group);
  const int64_t slot = state_floats(std::max<int64_t>(max_rows, kAttnAlign), tile_tokens * ta.group, ta.dp);
  ta.states.resize(n_states * slot);

  std::vector<int64_t> order(ta.units.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return ta.units[a].cost > ta.units[b].cost; });
  std::atomic<int64_t> next{0};
  pool.parallel_for(pool.n_threads(), [&](int64_t, int64_t, int) {
    thread_local std::vector<float> buf, own;
    for (int64_t i; (i = next.fetch_add(1)) < static_cast<int64_t>(order.size());) {
      const Unit& u = ta.units[order[i]];
      const Tile& tl = ta.tiles[u.tile];
      if (u.state >= 0) {
        ta.run(tl, u.kv_head, u.seg0, u.seg1, ta.states.data() + u.state * slot, buf);
        continue;
      }
      const int64_t rp = attn_pad(ta.n_rows(tl));
      own.resize(state_floats(rp, ta.n_rows(tl), ta.dp));
      ta.run(tl, u.kv_head, u.seg0, u.seg1, own.data(), buf);
      ta.write(tl, u.kv_head, own.data());
    }
  });
  if (n_states == 0) return;
  // The split tiles: their segments' states merged in order (from a fresh state, as run() merges them).
  std::vector<std::pair<int64_t, int64_t>> merges;  // (tile, KV head)
  for (size_t i = 0; i < ta.tiles.size(); ++i) {
    if (state_at[i] >= 0) {
      for (int64_t kv = 0; kv < n_kv; ++kv) merges.emplace_back(i, kv);
    }
  }
  pool.parallel_for(static_cast<int64_t>(merges.size()), [&](int64_t begin, int64_t end, int) {
    thread_local std::vector<float> total, scratch;
    for (int64_t i = begin; i < end; ++i) {
      const auto [ti, kv] = merges[i];
      const Tile& tl = ta.tiles[ti];
      const int64_t rows = ta.n_rows(tl), rp = attn_pad(rows);
      const int64_t n_seg = tl.last / kAttnSegment - tl.first / kAttnSegment + 1;
      total.resize(state_floats(rp, rows, ta.dp));
      scratch.resize(2 * rp);
      state_reset(total.data(), rp, rows, ta.dp);
      float* st = total.data();
      for (int64_t sg = 0; sg < n_seg; ++sg) {
        const float* s = ta.states.data() + (state_at[ti] + kv * n_seg + sg) * slot;
        kern.attn_merge(st, st + rp, st + 2 * rp, s, s + rp, s + 2 * rp, rows, rp, ta.dp, scratch.data());
      }
      ta.write(tl, kv, st);
    }
  });
}

}  // namespace

void attention(ThreadPool& pool, const CpuKernels& kern, const ops::Attention& op, ops::Precision precision) {
  if (precision == ops::Precision::precision_fast) {
    attention_tiled(pool, kern, op);
    return;
  }
  const int64_t n_heads = op.q.ne[1], n_tokens = op.q.ne[2];
  auto* attend = &attend_baseline;
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) attend = &attend_avx2;
#endif
  pool.parallel_for(n_tokens * n_heads, [&](int64_t begin, int64_t end, int) { attend(op, begin, end); });
}

}  // namespace kiln::cpu
