// Paged causal attention on the CPU, in the style of flash attention: an online softmax over tiles of K/V.
//
// Work is cut into items. A query tile is up to kTileTokens consecutive tokens of the batch from one sequence
// (a prefill chunk makes several, a decode token is one of its own); an item is (tile, KV head, split). Its
// rows are the tile's tokens x the query heads that share the KV head (GQA), and it walks the positions they
// may see in chunks of kChunk: each chunk's K and V rows are read from the pools once (f16 converted to f32,
// K transposed) and used by every row of the item. Per row the softmax is online (running max m, running sum
// l, unnormalised output acc; both rescaled by exp(m_old - m_new) when the max grows), so scores are never
// held for more than one chunk.
//
// When there are few items for the threads (decode) and the contexts are long, an item's positions are split
// into ranges of at least kMinSplit; each range leaves its (m, l, acc) per row, and the thread that finishes
// the last range of a (tile, KV head) merges them: out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s,
// M = max_s m_s.
//
// Threads take items from a shared counter, the costliest first (in a causal prefill the last tile sees the
// whole prompt, the first only itself).
//
// Measured (op harness perf, 9 query / 3 KV heads x 64, 512 positions, 2 threads of a loaded 2-core Zen 4,
// against the per-(token, head) loop this replaced): a 512-token causal prefill 7.7 ms (was 30.7), f16 pools
// 7.9 ms (was 222: f16 rows were converted one value at a time); one decode token 96 us (132), f16 100 us
// (846). The loops are plain f32 multiplies and adds (no FMA in the AVX2 clone); the prefill is
// compute-bound.
//
// Rounding: scores and the output accumulate in f32 (the reference: f64); summation order differs from the
// reference (per-chunk softmax sums, rescaling), within the op harness's 1e-5 relative budget.
#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "backends/cpu/cpu_ops.h"
#include "core/half.h"

namespace kiln::cpu {

namespace {

constexpr int64_t kChunk = 64;       // K/V positions per chunk
constexpr int64_t kLanes = 8;        // independent partial maxima / sums over a row (kChunk is a multiple)
constexpr int64_t kTileTokens = 32;  // query tokens per tile
constexpr int64_t kMinSplit = 128;   // positions per split range, at least
static_assert(kChunk % 8 == 0 && kChunk % kLanes == 0);  // the kernels' tiles are 8 wide

// exp(x) for x <= 0 (a score less its row's running max), within 1.5 ulp of the true value; 0 for x < -87
// (e^-87 is near FLT_MIN) and for -inf (a masked score). Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2, e^r by
// a polynomial, 2^n put in the exponent bits (n read from the rounding addition's low bits: no float -> int
// conversion). Written so that a loop over a row vectorises without -ffast-math, which std::exp does not: the
// arithmetic runs for every x and the two selects compare bits as integers (for x <= 0, a larger magnitude is
// a larger unsigned pattern): GCC does not if-convert floating-point compares under the default
// -ftrapping-math.
inline float exp_nonpositive(float x) {
  constexpr uint32_t kMinus88 = 0xc2b00000u, kMinus87 = 0xc2ae0000u;  // fp32_to_bits(-88.0f), (-87.0f)
  const uint32_t xb = fp32_to_bits(x);
  const float xc = fp32_from_bits(xb > kMinus88 ? kMinus88 : xb);  // max(x, -88)
  const float t =
      xc * 1.44269504088896341f + 0x1.8p23f;  // n + 1.5 * 2^23: n = round(x / ln2) in the low bits
  const float n = t - 0x1.8p23f;
  const float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;  // ln2 in two parts: n * hi is exact
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const uint32_t biased = fp32_to_bits(t) - fp32_to_bits(0x1.8p23f) + 127u;  // n + 127, in [0, 127]
  const uint32_t keep = xb > kMinus87 ? 0u : 0xffffffffu;                    // x >= -87
  return fp32_from_bits(fp32_to_bits(p * fp32_from_bits(biased << 23)) & keep);
}

// n f16 values as f32 (a loop that vectorises: see f16_to_f32_branchless).
KILN_CPU_CLONES void f16_row_to_f32(const uint16_t* h, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32_branchless(h[i]);
}

// The register tiles below are written with GCC/Clang generic vectors of 8 floats (compiled per ISA by
// KILN_CPU_CLONES: one ymm under AVX2, two xmm otherwise): plain loops over 4 x 16 accumulators were not kept
// in registers by GCC, and ran ten times slower.
using f32x8 = float __attribute__((vector_size(32)));
// The same, at any float's address: loads and stores through it are unaligned. (No helper function takes or
// returns a vector: that would change the ABI between the clones.)
using f32x8_unaligned = float __attribute__((vector_size(32), aligned(4), may_alias));
#define KILN_LOAD8(p) (*reinterpret_cast<const f32x8_unaligned*>(p))
#define KILN_STORE8(p, v) (*reinterpret_cast<f32x8_unaligned*>(p) = (v))

// s[r, j] = sum_d q[r, d] * kt[d, j] for r < n_rows (a multiple of 4), j < kChunk.   q: [hd, n_rows] (rows
// contiguous); kt: the chunk's K transposed, [kChunk, hd]; s: [kChunk, n_rows]. Register tile: 4 rows x 16
// columns; each pair of kt loads serves four rows, and no lane is reduced across.
KILN_CPU_CLONES void chunk_scores(const float* q, int64_t n_rows, const float* kt, int64_t hd, float* s) {
  for (int64_t r = 0; r < n_rows; r += 4) {
    const float *q0 = q + r * hd, *q1 = q0 + hd, *q2 = q1 + hd, *q3 = q2 + hd;
    for (int64_t c0 = 0; c0 < kChunk; c0 += 16) {
      f32x8 a0{}, a1{}, a2{}, a3{}, b0{}, b1{}, b2{}, b3{};  // columns c0..c0+7 (a), c0+8..c0+15 (b)
      for (int64_t d = 0; d < hd; ++d) {
        const f32x8 ka = KILN_LOAD8(kt + d * kChunk + c0), kb = KILN_LOAD8(kt + d * kChunk + c0 + 8);
        const f32x8 x0 = f32x8{} + q0[d], x1 = f32x8{} + q1[d], x2 = f32x8{} + q2[d], x3 = f32x8{} + q3[d];
        a0 += x0 * ka, b0 += x0 * kb;
        a1 += x1 * ka, b1 += x1 * kb;
        a2 += x2 * ka, b2 += x2 * kb;
        a3 += x3 * ka, b3 += x3 * kb;
      }
      float* out = s + r * kChunk + c0;
      KILN_STORE8(out, a0), KILN_STORE8(out + 8, b0);
      KILN_STORE8(out + kChunk, a1), KILN_STORE8(out + kChunk + 8, b1);
      KILN_STORE8(out + 2 * kChunk, a2), KILN_STORE8(out + 2 * kChunk + 8, b2);
      KILN_STORE8(out + 3 * kChunk, a3), KILN_STORE8(out + 3 * kChunk + 8, b3);
    }
  }
}

// o[r, d] += sum_j p[r, j] * v[j, d] for r < n_rows (a multiple of 4), j < nc.   p: [kChunk, n_rows];
// v: [hd, kChunk] (rows contiguous); o: [hd, n_rows]. Register tile: 4 rows x 16 of d (then 8, then one), the
// accumulators held across the chunk's positions.
KILN_CPU_CLONES void chunk_pv(const float* p, int64_t n_rows, const float* v, int64_t nc, int64_t hd,
                              float* o) {
  const int64_t hd8 = hd / 8 * 8;
  for (int64_t r = 0; r < n_rows; r += 4) {
    const float *p0 = p + r * kChunk, *p1 = p0 + kChunk, *p2 = p1 + kChunk, *p3 = p2 + kChunk;
    float *o0 = o + r * hd, *o1 = o0 + hd, *o2 = o1 + hd, *o3 = o2 + hd;
    int64_t d0 = 0;
    for (; d0 + 16 <= hd; d0 += 16) {  // 4 rows x 16 of d: each broadcast of p serves two V loads
      f32x8 a0 = KILN_LOAD8(o0 + d0), a1 = KILN_LOAD8(o1 + d0), a2 = KILN_LOAD8(o2 + d0),
            a3 = KILN_LOAD8(o3 + d0);
      f32x8 b0 = KILN_LOAD8(o0 + d0 + 8), b1 = KILN_LOAD8(o1 + d0 + 8), b2 = KILN_LOAD8(o2 + d0 + 8);
      f32x8 b3 = KILN_LOAD8(o3 + d0 + 8);
      for (int64_t j = 0; j < nc; ++j) {
        const f32x8 va = KILN_LOAD8(v + j * hd + d0), vb = KILN_LOAD8(v + j * hd + d0 + 8);
        const f32x8 x0 = f32x8{} + p0[j], x1 = f32x8{} + p1[j], x2 = f32x8{} + p2[j], x3 = f32x8{} + p3[j];
        a0 += x0 * va, b0 += x0 * vb;
        a1 += x1 * va, b1 += x1 * vb;
        a2 += x2 * va, b2 += x2 * vb;
        a3 += x3 * va, b3 += x3 * vb;
      }
      KILN_STORE8(o0 + d0, a0), KILN_STORE8(o1 + d0, a1), KILN_STORE8(o2 + d0, a2), KILN_STORE8(o3 + d0, a3);
      KILN_STORE8(o0 + d0 + 8, b0), KILN_STORE8(o1 + d0 + 8, b1), KILN_STORE8(o2 + d0 + 8, b2);
      KILN_STORE8(o3 + d0 + 8, b3);
    }
    for (; d0 < hd8; d0 += 8) {
      f32x8 a0 = KILN_LOAD8(o0 + d0), a1 = KILN_LOAD8(o1 + d0), a2 = KILN_LOAD8(o2 + d0),
            a3 = KILN_LOAD8(o3 + d0);
      for (int64_t j = 0; j < nc; ++j) {
        const f32x8 vj = KILN_LOAD8(v + j * hd + d0);
        const f32x8 x0 = f32x8{} + p0[j], x1 = f32x8{} + p1[j], x2 = f32x8{} + p2[j], x3 = f32x8{} + p3[j];
        a0 += x0 * vj;
        a1 += x1 * vj;
        a2 += x2 * vj;
        a3 += x3 * vj;
      }
      KILN_STORE8(o0 + d0, a0), KILN_STORE8(o1 + d0, a1), KILN_STORE8(o2 + d0, a2), KILN_STORE8(o3 + d0, a3);
    }
    for (int64_t d = hd8; d < hd; ++d) {  // head sizes that are not a multiple of 8
      for (int64_t j = 0; j < nc; ++j) {
        const float vj = v[j * hd + d];
        o0[d] += p0[j] * vj;
        o1[d] += p1[j] * vj;
        o2[d] += p2[j] * vj;
        o3[d] += p3[j] * vj;
      }
    }
  }
}

#undef KILN_LOAD8
#undef KILN_STORE8

// The bits of a float (not NaN) as an int32 that orders as the float does: a negative float's magnitude
// bits are flipped. Its own inverse. Integer max vectorises under -ftrapping-math; float max does not.
inline int32_t float_order(int32_t bits) { return bits ^ ((bits >> 31) & 0x7fffffff); }

// One row's softmax step over a chunk: scores s (masked ones -inf, at least one not) -> p = e^(s - m_new),
// m_new = max(m, max s). Returns m_new; adds sum p to *sum.   s, p: [kChunk].
KILN_CPU_CLONES float chunk_softmax(const float* s, float m, float* p, float* sum) {
  int32_t mx[kLanes];
  float acc[kLanes];
  for (int64_t l = 0; l < kLanes; ++l) mx[l] = float_order(std::bit_cast<int32_t>(m));
  for (int64_t j = 0; j < kChunk; j += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l)
      mx[l] = std::max(mx[l], float_order(std::bit_cast<int32_t>(s[j + l])));
  }
  int32_t top = mx[0];
  for (int64_t l = 1; l < kLanes; ++l) top = std::max(top, mx[l]);
  const float m_new = std::bit_cast<float>(float_order(top));
  for (int64_t j = 0; j < kChunk; ++j) p[j] = exp_nonpositive(s[j] - m_new);
  for (int64_t l = 0; l < kLanes; ++l) acc[l] = 0.0f;
  for (int64_t j = 0; j < kChunk; j += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) acc[l] += p[j + l];
  }
  float total = 0.0f;
  for (int64_t l = 0; l < kLanes; ++l) total += acc[l];
  *sum += total;
  return m_new;
}

// x[d] *= f for d < n.
KILN_CPU_CLONES void scale_row(float* x, float f, int64_t n) {
  for (int64_t d = 0; d < n; ++d) x[d] *= f;
}

// Up to kTileTokens consecutive batch tokens of one sequence.
struct Tile {
  int64_t t0 = 0, n = 0;   // batch tokens t0 .. t0 + n - 1
  int32_t seq = 0;         // their sequence
  int64_t lo = 0, hi = 0;  // the positions any of them sees: [lo, hi]
};

// One unit of work: a tile's rows for one KV head over positions [begin, end).
struct Item {
  int32_t tile = 0;
  int32_t kv_head = 0;
  int64_t begin = 0, end = 0;
  int64_t partial = -1;  // split ranges: its first row in the partial results; -1: writes dst directly
  int32_t set = 0;       // its (tile, KV head): the split ranges merged together
  int64_t cost = 0;      // rows x positions
};

// Per-thread scratch, reused across calls (grown on demand).
struct Scratch {
  // rows: padded to a multiple of 4 (the kernels' register tile); padding rows have q = 0 and p = 0.
  // q, acc: [hd, rows]; kt: [kChunk, hd]; v: [hd, kChunk]; s, p: [kChunk, rows]; m, l: [rows]; row: [hd].
  std::vector<float> q, kt, v, s, p, acc, m, l, row;
  void fit(int64_t rows, int64_t hd) {
    auto grow = [](std::vector<float>& b, int64_t n) {
      if (static_cast<int64_t>(b.size()) < n) b.resize(static_cast<size_t>(n));
    };
    grow(q, rows * hd);
    grow(kt, kChunk * hd);
    grow(v, kChunk * hd);
    grow(s, rows * kChunk);
    grow(p, rows * kChunk);
    grow(acc, rows * hd);
    grow(m, rows);
    grow(l, rows);
    grow(row, hd);
  }
};

// The (m, l, acc) per row that split ranges leave for the merge.   m, l: [n_partial rows]; acc: [hd, rows].
struct Partials {
  std::vector<float> m, l, acc;
};

// The op's operands, as the item loop reads them.
struct Ctx {
  const ops::Attention& op;
  int64_t hd, group, block_size;
  std::span<const int32_t> positions, seq, indptr, indices;
  std::vector<int64_t> first;  // [n_tokens]: the first position token t sees (last: positions[t])
};

// Gathers pool rows [c, c + nc) of one KV head into `out` as f32: transposed ([kChunk, hd]: out[d * kChunk +
// j]) for K, row-major ([hd, kChunk]) for V. Positions whose block was freed (below every window of the
// batch, so no row reads them) and j >= nc read as 0.
void load_chunk(const Ctx& c, const Tensor& pool, std::span<const int32_t> table, int64_t kv_head,
                int64_t pos0, int64_t nc, bool transpose, float* out, float* row) {
  for (int64_t j = 0; j < kChunk; ++j) {
    const int64_t p = pos0 + j;
    const int32_t block = j < nc ? table[p / c.block_size] : ops::kFreedBlock;
    float* dst = transpose ? row : out + j * c.hd;
    if (block == ops::kFreedBlock) {
      std::fill(dst, dst + c.hd, 0.0f);
    } else {
      const uint8_t* src = pool.row(kv_head, p % c.block_size, block);
      if (pool.type == DType::f32) {
        std::memcpy(dst, src, static_cast<size_t>(c.hd) * sizeof(float));
      } else {
        f16_row_to_f32(reinterpret_cast<const uint16_t*>(src), dst, c.hd);
      }
    }
    if (transpose) {
      for (int64_t d = 0; d < c.hd; ++d) out[d * kChunk + j] = row[d];
    }
  }
}

// Runs one item: the online softmax of its rows over its positions. Rows are r = i * group + g: token
// tile.t0 + i, query head kv_head * group + g.
void run_item(const Ctx& c, const Tile& tile, const Item& it, Scratch& w, Partials& part) {
  const ops::Attention& op = c.op;
  const int64_t hd = c.hd, group = c.group, rows = tile.n * group, padded = (rows + 3) / 4 * 4;
  const auto table =
      c.indices.subspan(c.indptr[tile.seq], static_cast<size_t>(c.indptr[tile.seq + 1] - c.indptr[tile.seq]));
  for (int64_t r = 0; r < rows; ++r) {  // q rows, scaled, contiguous
    const float* q = op.q.row_as<const float>(it.kv_head * group + r % group, tile.t0 + r / group);
    for (int64_t d = 0; d < hd; ++d) w.q[r * hd + d] = q[d] * op.scale;
  }
  std::fill(w.q.begin() + rows * hd, w.q.begin() + padded * hd, 0.0f);
  std::fill(w.m.begin(), w.m.begin() + rows, -INFINITY);
  std::fill(w.l.begin(), w.l.begin() + rows, 0.0f);
  std::fill(w.acc.begin(), w.acc.begin() + padded * hd, 0.0f);
  std::fill(w.p.begin(), w.p.begin() + padded * kChunk, 0.0f);
  for (int64_t pos0 = it.begin; pos0 < it.end; pos0 += kChunk) {
    const int64_t nc = std::min(kChunk, it.end - pos0);
    load_chunk(c, op.k_pool, table, it.kv_head, pos0, nc, true, w.kt.data(), w.row.data());
    load_chunk(c, op.v_pool, table, it.kv_head, pos0, nc, false, w.v.data(), w.row.data());
    chunk_scores(w.q.data(), padded, w.kt.data(), hd, w.s.data());
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = tile.t0 + r / group;
      float* p = w.p.data() + r * kChunk;
      // The chunk's positions this row sees: j in [j0, j1).
      const int64_t j0 = std::max<int64_t>(c.first[t] - pos0, 0);
      const int64_t j1 = std::min<int64_t>(c.positions[t] - pos0 + 1, nc);
      if (j0 >= j1) {
        std::fill(p, p + kChunk, 0.0f);
        continue;
      }
      float* s = w.s.data() + r * kChunk;
      if (op.softcap > 0.0f) {
        for (int64_t j = j0; j < j1; ++j) s[j] = op.softcap * std::tanh(s[j] / op.softcap);
      }
      for (int64_t j = 0; j < j0; ++j) s[j] = -INFINITY;
      for (int64_t j = j1; j < kChunk; ++j) s[j] = -INFINITY;
      float sum = 0.0f;
      const float m_new = chunk_softmax(s, w.m[r], p, &sum);
      const float corr = exp_nonpositive(w.m[r] - m_new);  // 0 on the row's first chunk (m = -inf)
      w.l[r] = w.l[r] * corr + sum;
      w.m[r] = m_new;
      if (corr != 1.0f) scale_row(w.acc.data() + r * hd, corr, hd);
    }
    chunk_pv(w.p.data(), padded, w.v.data(), nc, hd, w.acc.data());
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float* acc = w.acc.data() + r * hd;
    if (it.partial >= 0) {
      part.m[it.partial + r] = w.m[r];
      part.l[it.partial + r] = w.l[r];
      std::copy(acc, acc + hd, part.acc.data() + (it.partial + r) * hd);
    } else {
      float* y = op.dst.row_as<float>(it.kv_head * group + r % group, tile.t0 + r / group);
      const float inv = 1.0f / w.l[r];
      for (int64_t d = 0; d < hd; ++d) y[d] = acc[d] * inv;
    }
  }
}

// Merges the split ranges of one (tile, KV head), `items`, into dst.   out: [hd] scratch.
void merge_partials(const Ctx& c, const Tile& tile, std::span<const Item> items, const Partials& part,
                    float* out) {
  const int64_t hd = c.hd;
  for (int64_t r = 0; r < tile.n * c.group; ++r) {
    float mx = -INFINITY, l = 0.0f;
    for (const Item& it : items) mx = std::max(mx, part.m[it.partial + r]);
    std::fill(out, out + hd, 0.0f);
    for (const Item& it : items) {
      const int64_t pr = it.partial + r;
      const float f = exp_nonpositive(part.m[pr] - mx);  // 0 for a range this row sees none of (m = -inf)
      l += f * part.l[pr];
      const float* acc = part.acc.data() + pr * hd;
      for (int64_t d = 0; d < hd; ++d) out[d] += f * acc[d];
    }
    float* y = c.op.dst.row_as<float>(items[0].kv_head * c.group + r % c.group, tile.t0 + r / c.group);
    const float inv = 1.0f / l;
    for (int64_t d = 0; d < hd; ++d) y[d] = out[d] * inv;
  }
}

// The batch's tokens cut into tiles: a new tile where the sequence changes or a tile is full.
std::vector<Tile> make_tiles(const Ctx& c, int64_t n_tokens) {
  std::vector<Tile> tiles;
  for (int64_t t = 0; t < n_tokens; ++t) {
    if (tiles.empty() || tiles.back().seq != c.seq[t] || tiles.back().n == kTileTokens) {
      tiles.push_back({t, 0, c.seq[t], c.first[t], c.positions[t]});
    }
    Tile& tile = tiles.back();
    ++tile.n;
    tile.lo = std::min(tile.lo, c.first[t]);
    tile.hi = std::max<int64_t>(tile.hi, c.positions[t]);
  }
  return tiles;
}

// The items of a call and the sets of split ranges to merge.
struct Plan {
  std::vector<Item> items;
  std::vector<int64_t> set_first;  // per (tile, KV head): the index of its first item; then items.size()
  int64_t n_partial = 0;           // rows of partial results
};

// One item per (tile, KV head), or several split ranges where the threads would otherwise idle (fewer than
// 4 items a thread) and a tile sees at least 2 * kMinSplit positions.
Plan make_plan(const std::vector<Tile>& tiles, int64_t n_kv, int64_t group, int64_t n_threads) {
  Plan plan;
  const auto n_sets = static_cast<int64_t>(tiles.size()) * n_kv;
  const int64_t want = 4 * n_threads;
  const int64_t splits = n_sets >= want ? 1 : (want + n_sets - 1) / n_sets;
  for (size_t ti = 0; ti < tiles.size(); ++ti) {
    const Tile& tile = tiles[ti];
    const int64_t span = tile.hi - tile.lo + 1, rows = tile.n * group;
    const int64_t n_split = std::clamp<int64_t>(span / kMinSplit, 1, splits);
    // Split ranges start on chunk boundaries (counted from lo), so that no chunk is read twice.
    const int64_t chunks = (span + kChunk - 1) / kChunk;
    for (int64_t kv = 0; kv < n_kv; ++kv) {
      const auto set = static_cast<int32_t>(plan.set_first.size());
      plan.set_first.push_back(static_cast<int64_t>(plan.items.size()));
      for (int64_t s = 0; s < n_split; ++s) {
        Item it;
        it.tile = static_cast<int32_t>(ti);
        it.kv_head = static_cast<int32_t>(kv);
        it.set = set;
        it.begin = tile.lo + chunks * s / n_split * kChunk;
        it.end = std::min(tile.hi + 1, tile.lo + chunks * (s + 1) / n_split * kChunk);
        it.cost = rows * (it.end - it.begin);
        if (n_split > 1) {
          it.partial = plan.n_partial;
          plan.n_partial += rows;
        }
        plan.items.push_back(it);
      }
    }
  }
  plan.set_first.push_back(static_cast<int64_t>(plan.items.size()));
  return plan;
}

}  // namespace

void attention(ThreadPool& pool, const ops::Attention& op) {
  const int64_t hd = op.q.ne[0], n_heads = op.q.ne[1], n_tokens = op.q.ne[2];
  const int64_t n_kv = op.k_pool.ne[1];
  Ctx c{op,
        hd,
        n_heads / n_kv,
        op.k_pool.ne[2],
        op.positions.span_as<const int32_t>(),
        op.seq.span_as<const int32_t>(),
        op.bt_indptr.span_as<const int32_t>(),
        op.bt_indices.span_as<const int32_t>(),
        std::vector<int64_t>(static_cast<size_t>(n_tokens))};
  for (int64_t t = 0; t < n_tokens; ++t) {
    c.first[t] = op.window > 0 ? std::max<int64_t>(0, c.positions[t] - op.window + 1) : 0;
  }
  const std::vector<Tile> tiles = make_tiles(c, n_tokens);
  const Plan plan = make_plan(tiles, n_kv, c.group, pool.n_threads());
  const std::vector<Item>& items = plan.items;
  if (items.empty()) return;
  Partials part{std::vector<float>(plan.n_partial), std::vector<float>(plan.n_partial),
                std::vector<float>(plan.n_partial * hd)};
  // Split ranges still running per set: the thread that finishes a set's last one merges it.
  const auto n_sets = static_cast<int64_t>(plan.set_first.size()) - 1;
  auto remaining = std::make_unique<std::atomic<int64_t>[]>(n_sets);
  for (int64_t g = 0; g < n_sets; ++g) remaining[g].store(plan.set_first[g + 1] - plan.set_first[g]);
  std::vector<int32_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return items[a].cost > items[b].cost; });
  std::atomic<size_t> next{0};
  const auto n_workers = std::min<int64_t>(pool.n_threads(), static_cast<int64_t>(items.size()));
  pool.parallel_for(n_workers, [&](int64_t, int64_t, int) {
    thread_local Scratch w;
    w.fit((kTileTokens * c.group + 3) / 4 * 4, hd);
    for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < order.size();) {
      const Item& it = items[order[i]];
      run_item(c, tiles[it.tile], it, w, part);
      // acq_rel: the merging thread sees the partial results of the set's other ranges.
      if (it.partial >= 0 && remaining[it.set].fetch_sub(1, std::memory_order_acq_rel) == 1) {
        const int64_t first = plan.set_first[it.set], count = plan.set_first[it.set + 1] - first;
        merge_partials(c, tiles[it.tile],
                       std::span<const Item>(items.data() + first, static_cast<size_t>(count)), part,
                       w.row.data());
      }
    }
  });
}

}  // namespace kiln::cpu
