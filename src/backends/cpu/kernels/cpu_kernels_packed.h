// Part of cpu_kernels_impl.h (included from it, once per ISA level): the products of the packed layout
// (cpu_kernels.h) with quantized x rows. Everything here has internal linkage, as there.
namespace kiln::cpu {
namespace {

// Each sub-block asks for the lines kPackPrefetch bytes ahead of its quants, and one more for the scales
// between them (the 256-bit kernels in their first half's pass). The hardware prefetchers alone left a
// decode's stream of 4- and 6-bit weights at ~11 GB/s on the 2-core Intel Xeon whose read bandwidth is
// ~19 GB/s, the cores busy unpacking between loads (`tests/matmul_bench --m 1`, [1536, 8960] and
// [8960, 1536]: q4_K 10-12 -> 14-20 GB/s, q6_K 10-12 -> 16-18, q8_0 16 -> 18-20; 8 and 16 KiB ahead measured
// as 4 did). Past a group's end it reads the next group, which the same thread usually takes next.
constexpr int64_t kPackPrefetch = 4096;

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// v shifted left by S bits (right by -S) in 16-bit lanes: moves bit t of each byte to t + S, whatever the
// masks after it keep.
template <int S>
KILN_INLINE __m512i shift_bits(__m512i v) {
  if constexpr (S > 0) return _mm512_slli_epi16(v, S);
  if constexpr (S < 0) return _mm512_srli_epi16(v, -S);
  return v;
}

// The 8 pieces of packed sub-block `qs` (kBits-bit quants) as bytes: wq[c] elements 4c .. 4c + 3 (c < 4) or
// 16 + 4(c - 4) .. (c >= 4) of the 16 rows.
template <int kBits>
KILN_INLINE void packed_quants(const uint8_t* qs, __m512i* wq) {
  if constexpr (kBits == 8) {
    KILN_UNROLL
    for (int pc = 0; pc < 8; ++pc) wq[pc] = _mm512_load_si512(qs + 64 * pc);
  } else {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    KILN_UNROLL
    for (int pc = 0; pc < 4; ++pc) {
      const __m512i v = _mm512_load_si512(qs + 64 * pc);
      wq[pc] = _mm512_and_si512(v, m4);
      wq[4 + pc] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    }
    // wq | (plane shifted & mask), in one ternary-logic op (A | (B & C): 0xF8).
    if constexpr (kBits == 5) {
      const __m512i h = _mm512_load_si512(qs + 256), m = _mm512_set1_epi8(0x10);
      [&]<int... T>(std::integer_sequence<int, T...>) {
        ((wq[T] = _mm512_ternarylogic_epi32(wq[T], shift_bits<4 - T>(h), m, 0xF8)), ...);
      }
      (std::make_integer_sequence<int, 8>{});
    } else if constexpr (kBits == 6) {
      const __m512i h0 = _mm512_load_si512(qs + 256), h1 = _mm512_load_si512(qs + 320);
      const __m512i m = _mm512_set1_epi8(0x30);
      [&]<int... T>(std::integer_sequence<int, T...>) {
        ((wq[T] = _mm512_ternarylogic_epi32(wq[T], shift_bits<4 - 2 * T>(h0), m, 0xF8)), ...);
        ((wq[4 + T] = _mm512_ternarylogic_epi32(wq[4 + T], shift_bits<4 - 2 * T>(h1), m, 0xF8)), ...);
      }
      (std::make_integer_sequence<int, 4>{});
    }
  }
}

// One group of kPackRows rows against NX x rows. Per sub-block and x row: 8 vpdpbusd (4 quants of 16 rows
// times 4 broadcast x quants each) in two chains (elements 0..15 and 16..31), then the scales: one FMA per
// chain into the 16 rows' f32 accumulators. Each x row's arithmetic is the same whatever NX is, so a token's
// result does not depend on its batch.
template <int NX, int kBits, uint32_t kScales>
void packed_group(const PackedMatrix& w, int64_t g, const QRowX* x, float* out) {
  constexpr int64_t kScaleBytes = kScales == kPackDM ? 64 : 32, kQuantBytes = packed_quant_bytes(kBits);
  constexpr bool kHeader = kScales == kPackK32 || kScales == kPackK16;
  const uint8_t* p = w.data + g * w.group_bytes;
  const int64_t n_sub = w.k / kSub;
  const float c = w.c;
  __m512 acc[NX];
  KILN_UNROLL
  for (int j = 0; j < NX; ++j) acc[j] = _mm512_setzero_ps();
  __m512 hd = _mm512_setzero_ps(), hm = _mm512_setzero_ps();
  for (int64_t s0 = 0; s0 < n_sub; s0 += kPackChunk) {
    const int64_t ns = n_sub - s0 < kPackChunk ? n_sub - s0 : kPackChunk;
    if constexpr (kHeader) {
      hd = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p)));
      if constexpr (kScales == kPackK32) {
        hm = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p + 32)));
      }
      p += 64;
    }
    const uint8_t* base = p;
    p += (ns * kScaleBytes + 63) / 64 * 64 + ns * kQuantBytes;
    for (int64_t i = 0; i < ns; ++i) {
      const int64_t s = s0 + i;
      const uint8_t* sc = base + packed_scale_offset(i, kScaleBytes, kQuantBytes);
      const uint8_t* qs = base + packed_quant_offset(i, kScaleBytes, kQuantBytes);
      KILN_UNROLL
      for (int l = 0; l <= kQuantBytes / 64; ++l) {
        _mm_prefetch(reinterpret_cast<const char*>(qs) + kPackPrefetch + 64 * l, _MM_HINT_T0);
      }
      __m512i wq[8];
      packed_quants<kBits>(qs, wq);
      __m512 d_lo, d_hi, m = _mm512_setzero_ps();
      if constexpr (kScales == kPackD || kScales == kPackDM) {
        d_lo = d_hi = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(sc)));
        if constexpr (kScales == kPackDM) {
          m = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(sc + 32)));
        }
      } else if constexpr (kScales == kPackK32) {
        const __m128i v = _mm_load_si128(reinterpret_cast<const __m128i*>(sc));
        const __m128i u = _mm_load_si128(reinterpret_cast<const __m128i*>(sc + 16));
        d_lo = d_hi = _mm512_mul_ps(hd, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v)));
        m = _mm512_mul_ps(hm, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(u)));
      } else {
        const __m128i v = _mm_load_si128(reinterpret_cast<const __m128i*>(sc));
        const __m128i u = _mm_load_si128(reinterpret_cast<const __m128i*>(sc + 16));
        d_lo = _mm512_mul_ps(hd, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)));
        d_hi = _mm512_mul_ps(hd, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(u)));
      }
      KILN_UNROLL
      for (int j = 0; j < NX; ++j) {
        const int8_t* xq = x[j].q + s * kSub;
        __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
        KILN_UNROLL
        for (int pc = 0; pc < 4; ++pc) {
          int32_t a, b;
          std::memcpy(&a, xq + 4 * pc, 4);
          std::memcpy(&b, xq + 16 + 4 * pc, 4);
          lo = _mm512_dpbusd_epi32(lo, wq[pc], _mm512_set1_epi32(a));
          hi = _mm512_dpbusd_epi32(hi, wq[4 + pc], _mm512_set1_epi32(b));
        }
        const __m512 dx = _mm512_set1_ps(x[j].d1[s]);
        const float s_lo = x[j].s[2 * s], s_hi = x[j].s[2 * s + 1];
        if constexpr (kScales == kPackK16) {
          const __m512 t_lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), dx, _mm512_set1_ps(c * s_lo));
          const __m512 t_hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), dx, _mm512_set1_ps(c * s_hi));
          acc[j] = _mm512_fmadd_ps(d_lo, t_lo, acc[j]);
          acc[j] = _mm512_fmadd_ps(d_hi, t_hi, acc[j]);
        } else if constexpr (kScales == kPackD) {
          const __m512 t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi)), dx,
                                           _mm512_set1_ps(c * (s_lo + s_hi)));
          acc[j] = _mm512_fmadd_ps(d_lo, t, acc[j]);
        } else {
          const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi)), dx);
          acc[j] = _mm512_fmadd_ps(d_lo, t, acc[j]);
          acc[j] = _mm512_fmadd_ps(m, _mm512_set1_ps(s_lo + s_hi), acc[j]);
        }
      }
    }
  }
  KILN_UNROLL
  for (int j = 0; j < NX; ++j) _mm512_storeu_ps(out + j * kPackRows, acc[j]);
}

template <int kBits, uint32_t kScales>
void packed_cols(const PackedMatrix& w, int64_t g, const QRowX* x, int n_x, float* out) {
  switch (n_x) {
    case 1: packed_group<1, kBits, kScales>(w, g, x, out); return;
    case 2: packed_group<2, kBits, kScales>(w, g, x, out); return;
    case 3: packed_group<3, kBits, kScales>(w, g, x, out); return;
    default: packed_group<4, kBits, kScales>(w, g, x, out); return;
  }
}

void qdot_packed(const PackedMatrix& w, int64_t g, const QRowX* x, int n_x, float* out) {
  static_assert(kPackRows == 16 && kPackCols == 4);
  switch (packed_form(w.bits, w.scales)) {
    case packed_form(4, kPackD): packed_cols<4, kPackD>(w, g, x, n_x, out); return;
    case packed_form(4, kPackDM): packed_cols<4, kPackDM>(w, g, x, n_x, out); return;
    case packed_form(4, kPackK32): packed_cols<4, kPackK32>(w, g, x, n_x, out); return;
    case packed_form(4, kPackK16): packed_cols<4, kPackK16>(w, g, x, n_x, out); return;
    case packed_form(5, kPackD): packed_cols<5, kPackD>(w, g, x, n_x, out); return;
    case packed_form(5, kPackDM): packed_cols<5, kPackDM>(w, g, x, n_x, out); return;
    case packed_form(5, kPackK32): packed_cols<5, kPackK32>(w, g, x, n_x, out); return;
    case packed_form(6, kPackK16): packed_cols<6, kPackK16>(w, g, x, n_x, out); return;
    default: packed_cols<8, kPackD>(w, g, x, n_x, out); return;  // q8_0, iq4_nl (pack_weight makes no other)
  }
}
constexpr auto kQdotPacked = qdot_packed;

#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
// ---- AMX: the integer products in tiles ----------------------------------------------------------------
// A packed sub-block's 8 pieces, unpacked as packed_group unpacks them, are an AMX B tile as they stand
// ([K / 4 rows][16 rows][4 bytes]: 4 consecutive quants of each of the 16 weight rows a tile row), and up to
// 16 x rows' quants at a common stride are an A tile: one tdpbsud (x signed, weights unsigned) makes every
// int32 product packed_group makes with 8 vpdpbusd per x row, exact. The scales then go on as packed_group
// puts them on, the same f32 operations in the same order, so each result is the same bits as qdot_packed's
// (and a token's result still does not depend on its batch).
//
// A group is unpacked once per call into the caller's scratch (512 bytes a sub-block). Then for each 16 x
// rows the tile products of a sub-block run kTileAhead sub-blocks ahead of its scales, into memory (a ring of
// C sums, C tiles alternating), so that the tile unit works while the vector units finish those before.
struct TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// The tiles: C (n_x rows of 16 int32) in 0 and 1, alternately by sub-block (2 and 3: kPackK16's second
// halves); A (n_x x rows' quants) in 4 and 6, B (16 weight rows) in 5 and 7: a sub-block's 32 quants (B of 8
// rows), or with `halves` each half's 16 (4, 5 the first, 6, 7 the second; B of 4 rows).
KILN_INLINE void tiles_configure(int n_x, bool halves) {
  thread_local int configured = -1;  // the key of this thread's configuration; -1: none
  const int key = n_x * 2 + (halves ? 1 : 0);
  if (configured == key) return;
  alignas(64) TileConfig c;
  const auto r = static_cast<uint8_t>(n_x);
  for (int t = 0; t < 4; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = r;
  }
  c.colsb[4] = c.colsb[6] = halves ? 16 : 32;
  c.rows[4] = c.rows[6] = r;
  c.colsb[5] = c.colsb[7] = 64;
  c.rows[5] = c.rows[7] = halves ? 4 : 8;
  _tile_loadconfig(&c);
  configured = key;
}

using TileSums = int32_t[2][kPackTileCols][kPackRows];  // a sub-block's C: [half][x row][weight row]

// Sub-block products of the x rows at xq (x_stride apart) and the unpacked B at b into cs, through C tile T
// (the tile intrinsics take their tile numbers as literals).
template <int T, bool kHalves>
KILN_INLINE void tile_products(const int8_t* xq, int64_t x_stride, const uint8_t* b, TileSums& cs) {
  if constexpr (kHalves && T == 0) {
    _tile_zero(0);
    _tile_zero(2);
    _tile_loadd(4, xq, x_stride);
    _tile_loadd(5, b, 64);
    _tile_loadd(6, xq + 16, x_stride);
    _tile_loadd(7, b + 256, 64);
    _tile_dpbsud(0, 4, 5);
    _tile_dpbsud(2, 6, 7);
    _tile_stored(0, cs[0], 64);
    _tile_stored(2, cs[1], 64);
  } else if constexpr (kHalves) {
    _tile_zero(1);
    _tile_zero(3);
    _tile_loadd(4, xq, x_stride);
    _tile_loadd(5, b, 64);
    _tile_loadd(6, xq + 16, x_stride);
    _tile_loadd(7, b + 256, 64);
    _tile_dpbsud(1, 4, 5);
    _tile_dpbsud(3, 6, 7);
    _tile_stored(1, cs[0], 64);
    _tile_stored(3, cs[1], 64);
  } else if constexpr (T == 0) {
    _tile_zero(0);
    _tile_loadd(4, xq, x_stride);
    _tile_loadd(5, b, 64);
    _tile_dpbsud(0, 4, 5);
    _tile_stored(0, cs[0], 64);
  } else {
    _tile_zero(1);
    _tile_loadd(6, xq, x_stride);
    _tile_loadd(7, b, 64);
    _tile_dpbsud(1, 6, 7);
    _tile_stored(1, cs[0], 64);
  }
}

template <int kBits, uint32_t kScales>
void packed_tiles(const PackedMatrix& w, int64_t g, const QTilesX& x, int64_t n_x, uint8_t* scratch,
                  float* out) {
  constexpr int64_t kScaleBytes = kScales == kPackDM ? 64 : 32, kQuantBytes = packed_quant_bytes(kBits);
  constexpr bool kHeader = kScales == kPackK32 || kScales == kPackK16, kHalves = kScales == kPackK16;
  const uint8_t* group = w.data + g * w.group_bytes;
  const int64_t n_sub = w.k / kSub, kp = x.kp;
  // Chunk s0's first sub-block: its header's place (K scales) and its sub-blocks' base.
  auto chunk_base = [&](const uint8_t*& p, int64_t ns, __m512& hd, __m512& hm) {
    if constexpr (kHeader) {
      hd = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p)));
      if constexpr (kScales == kPackK32) {
        hm = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p + 32)));
      }
      p += 64;
    }
    const uint8_t* base = p;
    p += (ns * kScaleBytes + 63) / 64 * 64 + ns * kQuantBytes;
    return base;
  };
  auto* bt = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(scratch) + 63) & ~uintptr_t{63});
  {
    const uint8_t* p = group;
    __m512 hd, hm;
    for (int64_t s0 = 0; s0 < n_sub; s0 += kPackChunk) {
      const int64_t ns = n_sub - s0 < kPackChunk ? n_sub - s0 : kPackChunk;
      const uint8_t* base = chunk_base(p, ns, hd, hm);
      for (int64_t i = 0; i < ns; ++i) {
        __m512i wq[8];
        packed_quants<kBits>(base + packed_quant_offset(i, kScaleBytes, kQuantBytes), wq);
        KILN_UNROLL
        for (int pc = 0; pc < 8; ++pc) _mm512_store_si512(bt + (s0 + i) * 512 + 64 * pc, wq[pc]);
      }
    }
  }
  constexpr int64_t kTileAhead = 2, kTileRing = 4;
  // Zeroed once: the rows of a last tile of fewer than 16 x rows are read (and never stored) as sums.
  alignas(64) TileSums cs[kTileRing] = {};
  for (int64_t c0 = 0; c0 < n_x; c0 += kPackTileCols) {
    const int rows = static_cast<int>(n_x - c0 < kPackTileCols ? n_x - c0 : kPackTileCols);
    tiles_configure(rows, kHalves);
    const int8_t* xq = x.q + c0 * kp;
    // This tile's per-row scalars, [sub-block][16 rows] (rows past n_x zero).
    const float* xd = x.dx + c0 * (kp / kSub);
    const float* xs0 = x.s0 + c0 * (kp / kSub);
    const float* xs1 = x.s1 + c0 * (kp / kSub);
    __m512 acc[kPackTileCols];
    KILN_UNROLL
    for (int j = 0; j < kPackTileCols; ++j) acc[j] = _mm512_setzero_ps();
    // Sub-block s's products, kTileAhead sub-blocks ahead of its scales: the tile unit works while the vector
    // units put the scales on those before.
    auto products = [&](int64_t s) {
      if (s % 2 == 0) {
        tile_products<0, kHalves>(xq + s * kSub, kp, bt + s * 512, cs[s % kTileRing]);
      } else {
        tile_products<1, kHalves>(xq + s * kSub, kp, bt + s * 512, cs[s % kTileRing]);
      }
    };
    for (int64_t s = 0; s < kTileAhead && s < n_sub; ++s) products(s);
    __m512 hd = _mm512_setzero_ps(), hm = _mm512_setzero_ps();
    const uint8_t* p = group;
    for (int64_t s0 = 0; s0 < n_sub; s0 += kPackChunk) {
      const int64_t ns = n_sub - s0 < kPackChunk ? n_sub - s0 : kPackChunk;
      const uint8_t* base = chunk_base(p, ns, hd, hm);
      for (int64_t i = 0; i < ns; ++i) {
        const int64_t s = s0 + i;
        if (s + kTileAhead < n_sub) products(s + kTileAhead);
        const TileSums& ci = cs[s % kTileRing];
        const uint8_t* sc = base + packed_scale_offset(i, kScaleBytes, kQuantBytes);
        __m512 d_lo, d_hi, m = _mm512_setzero_ps();
        if constexpr (kScales == kPackD || kScales == kPackDM) {
          d_lo = d_hi = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(sc)));
          if constexpr (kScales == kPackDM) {
            m = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(sc + 32)));
          }
        } else if constexpr (kScales == kPackK32) {
          const __m128i v = _mm_load_si128(reinterpret_cast<const __m128i*>(sc));
          const __m128i u = _mm_load_si128(reinterpret_cast<const __m128i*>(sc + 16));
          d_lo = d_hi = _mm512_mul_ps(hd, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v)));
          m = _mm512_mul_ps(hm, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(u)));
        } else {
          const __m128i v = _mm_load_si128(reinterpret_cast<const __m128i*>(sc));
          const __m128i u = _mm_load_si128(reinterpret_cast<const __m128i*>(sc + 16));
          d_lo = _mm512_mul_ps(hd, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)));
          d_hi = _mm512_mul_ps(hd, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(u)));
        }
        const float* dx = xd + s * kPackTileCols;
        const float* x0 = xs0 + s * kPackTileCols;
        const float* x1 = xs1 + s * kPackTileCols;
        // All 16 rows: those past `rows` (stale sums, zero scalars) are never stored.
        KILN_UNROLL
        for (int j = 0; j < kPackTileCols; ++j) {
          const __m512 sum = _mm512_cvtepi32_ps(_mm512_load_si512(ci[0][j]));  // lo + hi; halves: lo
          if constexpr (kScales == kPackK16) {
            const __m512 hi = _mm512_cvtepi32_ps(_mm512_load_si512(ci[1][j]));
            const __m512 t_lo = _mm512_fmadd_ps(sum, _mm512_set1_ps(dx[j]), _mm512_set1_ps(x0[j]));
            const __m512 t_hi = _mm512_fmadd_ps(hi, _mm512_set1_ps(dx[j]), _mm512_set1_ps(x1[j]));
            acc[j] = _mm512_fmadd_ps(d_lo, t_lo, acc[j]);
            acc[j] = _mm512_fmadd_ps(d_hi, t_hi, acc[j]);
          } else if constexpr (kScales == kPackD) {
            const __m512 t = _mm512_fmadd_ps(sum, _mm512_set1_ps(dx[j]), _mm512_set1_ps(x0[j]));
            acc[j] = _mm512_fmadd_ps(d_lo, t, acc[j]);
          } else {
            const __m512 t = _mm512_mul_ps(sum, _mm512_set1_ps(dx[j]));
            acc[j] = _mm512_fmadd_ps(d_lo, t, acc[j]);
            acc[j] = _mm512_fmadd_ps(m, _mm512_set1_ps(x0[j]), acc[j]);
          }
        }
      }
    }
    KILN_UNROLL
    for (int j = 0; j < kPackTileCols; ++j) {
      if (j < rows) _mm512_storeu_ps(out + (c0 + j) * kPackRows, acc[j]);
    }
  }
}

void qdot_packed_tiles(const PackedMatrix& w, int64_t g, const QTilesX& x, int64_t n_x, uint8_t* scratch,
                       float* out) {
  static_assert(kPackRows == 16 && kPackTileCols == 16);
  switch (packed_form(w.bits, w.scales)) {
    case packed_form(4, kPackD): packed_tiles<4, kPackD>(w, g, x, n_x, scratch, out); return;
    case packed_form(4, kPackDM): packed_tiles<4, kPackDM>(w, g, x, n_x, scratch, out); return;
    case packed_form(4, kPackK32): packed_tiles<4, kPackK32>(w, g, x, n_x, scratch, out); return;
    case packed_form(4, kPackK16): packed_tiles<4, kPackK16>(w, g, x, n_x, scratch, out); return;
    case packed_form(5, kPackD): packed_tiles<5, kPackD>(w, g, x, n_x, scratch, out); return;
    case packed_form(5, kPackDM): packed_tiles<5, kPackDM>(w, g, x, n_x, scratch, out); return;
    case packed_form(5, kPackK32): packed_tiles<5, kPackK32>(w, g, x, n_x, scratch, out); return;
    case packed_form(6, kPackK16): packed_tiles<6, kPackK16>(w, g, x, n_x, scratch, out); return;
    default: packed_tiles<8, kPackD>(w, g, x, n_x, scratch, out); return;
  }
}
constexpr auto kQdotPackedTiles = qdot_packed_tiles;
#else
constexpr void (*kQdotPackedTiles)(const PackedMatrix&, int64_t, const QTilesX&, int64_t, uint8_t*,
                                   float*) = nullptr;
#endif

#elif defined(__AVX2__)
template <int S>
KILN_INLINE __m256i shift_bits(__m256i v) {
  if constexpr (S > 0) return _mm256_slli_epi16(v, S);
  if constexpr (S < 0) return _mm256_srli_epi16(v, -S);
  return v;
}

// Half h (rows 8h .. 8h + 7) of the 8 pieces of packed sub-block `qs` as bytes (as the AVX-512 form).
template <int kBits, bool kSigned>
KILN_INLINE void packed_quants(const uint8_t* qs, int h, __m256i* wq) {
  const auto at = [&](int64_t off) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + off + 32 * h));
  };
  if constexpr (kBits == 8) {
    KILN_UNROLL
    for (int pc = 0; pc < 8; ++pc) {
      wq[pc] = at(64 * pc);
      if constexpr (kSigned) wq[pc] = _mm256_xor_si256(wq[pc], _mm256_set1_epi8(-128));
    }
  } else {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    KILN_UNROLL
    for (int pc = 0; pc < 4; ++pc) {
      const __m256i v = at(64 * pc);
      wq[pc] = _mm256_and_si256(v, m4);
      wq[4 + pc] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    }
    if constexpr (kBits == 5) {
      const __m256i p = at(256), m = _mm256_set1_epi8(0x10);
      [&]<int... T>(std::integer_sequence<int, T...>) {
        ((wq[T] = _mm256_or_si256(wq[T], _mm256_and_si256(shift_bits<4 - T>(p), m))), ...);
      }
      (std::make_integer_sequence<int, 8>{});
    } else if constexpr (kBits == 6) {
      const __m256i p0 = at(256), p1 = at(320), m = _mm256_set1_epi8(0x30);
      [&]<int... T>(std::integer_sequence<int, T...>) {
        ((wq[T] = _mm256_or_si256(wq[T], _mm256_and_si256(shift_bits<4 - 2 * T>(p0), m))), ...);
        ((wq[4 + T] = _mm256_or_si256(wq[4 + T], _mm256_and_si256(shift_bits<4 - 2 * T>(p1), m))), ...);
      }
      (std::make_integer_sequence<int, 4>{});
    }
  }
}

// The same products with 256-bit vectors and no vpdpbusd: each half of a group (8 rows, 32 bytes of every
// 64-byte piece) in turn; a piece's products by vpmaddubsw + vpmaddwd. Signed quants (stored + 128) go back
// to int8 and multiply as |w| times x * sign(w), so that no int16 sum saturates.
template <int NX, int kBits, uint32_t kScales, bool kSigned>
void packed_half(const PackedMatrix& w, int64_t g, int h, const QRowX* x, float* out) {
  constexpr int64_t kScaleBytes = kScales == kPackDM ? 64 : 32, kQuantBytes = packed_quant_bytes(kBits);
  constexpr bool kHeader = kScales == kPackK32 || kScales == kPackK16;
  const uint8_t* p = w.data + g * w.group_bytes;
  const int64_t n_sub = w.k / kSub;
  const __m256i ones = _mm256_set1_epi16(1);
  const float c = kSigned ? 0.0f : w.c;
  __m256 acc[NX];
  KILN_UNROLL
  for (int j = 0; j < NX; ++j) acc[j] = _mm256_setzero_ps();
  __m256 hd = _mm256_setzero_ps(), hm = _mm256_setzero_ps();
  for (int64_t s0 = 0; s0 < n_sub; s0 += kPackChunk) {
    const int64_t ns = n_sub - s0 < kPackChunk ? n_sub - s0 : kPackChunk;
    if constexpr (kHeader) {
      hd = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * h)));
      if constexpr (kScales == kPackK32) {
        hm = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 32 + 16 * h)));
      }
      p += 64;
    }
    const uint8_t* base = p;
    p += (ns * kScaleBytes + 63) / 64 * 64 + ns * kQuantBytes;
    for (int64_t i = 0; i < ns; ++i) {
      const int64_t s = s0 + i;
      const uint8_t* sc = base + packed_scale_offset(i, kScaleBytes, kQuantBytes);
      const uint8_t* qs = base + packed_quant_offset(i, kScaleBytes, kQuantBytes);
      if (h == 0) {
        KILN_UNROLL
        for (int l = 0; l <= kQuantBytes / 64; ++l) {
          _mm_prefetch(reinterpret_cast<const char*>(qs) + kPackPrefetch + 64 * l, _MM_HINT_T0);
        }
      }
      __m256i wq[8];
      packed_quants<kBits, kSigned>(qs, h, wq);
      __m256 d_lo, d_hi, m = _mm256_setzero_ps();
      if constexpr (kScales == kPackD || kScales == kPackDM) {
        d_lo = d_hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + 16 * h)));
        if constexpr (kScales == kPackDM) {
          m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + 32 + 16 * h)));
        }
      } else if constexpr (kScales == kPackK32) {
        const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 8 * h));
        const __m128i u = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 16 + 8 * h));
        d_lo = d_hi = _mm256_mul_ps(hd, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)));
        m = _mm256_mul_ps(hm, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(u)));
      } else {
        const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 8 * h));
        const __m128i u = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 16 + 8 * h));
        d_lo = _mm256_mul_ps(hd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)));
        d_hi = _mm256_mul_ps(hd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(u)));
      }
      KILN_UNROLL
      for (int j = 0; j < NX; ++j) {
        const int8_t* xq = x[j].q + s * kSub;
        __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
        KILN_UNROLL
        for (int pc = 0; pc < 8; ++pc) {
          int32_t a;
          std::memcpy(&a, xq + 4 * pc, 4);  // pieces 0..3: elements 0..15, 4..7: 16..31 (q4: high nibbles)
          __m256i xs = _mm256_set1_epi32(a), wu = wq[pc];
          if constexpr (kSigned) {
            xs = _mm256_sign_epi8(xs, wq[pc]);
            wu = _mm256_sign_epi8(wq[pc], wq[pc]);
          }
          const __m256i prod = _mm256_madd_epi16(_mm256_maddubs_epi16(wu, xs), ones);
          if (pc < 4) {
            lo = _mm256_add_epi32(lo, prod);
          } else {
            hi = _mm256_add_epi32(hi, prod);
          }
        }
        const __m256 dx = _mm256_set1_ps(x[j].d1[s]);
        const float s_lo = x[j].s[2 * s], s_hi = x[j].s[2 * s + 1];
        if constexpr (kScales == kPackK16) {
          const __m256 t_lo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo), dx, _mm256_set1_ps(c * s_lo));
          const __m256 t_hi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi), dx, _mm256_set1_ps(c * s_hi));
          acc[j] = _mm256_fmadd_ps(d_lo, t_lo, acc[j]);
          acc[j] = _mm256_fmadd_ps(d_hi, t_hi, acc[j]);
        } else if constexpr (kScales == kPackD) {
          const __m256 t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(lo, hi)), dx,
                                           _mm256_set1_ps(c * (s_lo + s_hi)));
          acc[j] = _mm256_fmadd_ps(d_lo, t, acc[j]);
        } else {
          const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(lo, hi)), dx);
          acc[j] = _mm256_fmadd_ps(d_lo, t, acc[j]);
          acc[j] = _mm256_fmadd_ps(m, _mm256_set1_ps(s_lo + s_hi), acc[j]);
        }
      }
    }
  }
  KILN_UNROLL
  for (int j = 0; j < NX; ++j) _mm256_storeu_ps(out + j * kPackRows + 8 * h, acc[j]);
}

template <int kBits, uint32_t kScales, bool kSigned>
void packed_cols(const PackedMatrix& w, int64_t g, const QRowX* x, int n_x, float* out) {
  for (int h = 0; h < 2; ++h) {
    switch (n_x) {
      case 1: packed_half<1, kBits, kScales, kSigned>(w, g, h, x, out); break;
      case 2: packed_half<2, kBits, kScales, kSigned>(w, g, h, x, out); break;
      case 3: packed_half<3, kBits, kScales, kSigned>(w, g, h, x, out); break;
      default: packed_half<4, kBits, kScales, kSigned>(w, g, h, x, out); break;
    }
  }
}

void qdot_packed(const PackedMatrix& w, int64_t g, const QRowX* x, int n_x, float* out) {
  static_assert(kPackRows == 16 && kPackCols == 4);
  switch (packed_form(w.bits, w.scales)) {
    case packed_form(4, kPackD): packed_cols<4, kPackD, false>(w, g, x, n_x, out); return;
    case packed_form(4, kPackDM): packed_cols<4, kPackDM, false>(w, g, x, n_x, out); return;
    case packed_form(4, kPackK32): packed_cols<4, kPackK32, false>(w, g, x, n_x, out); return;
    case packed_form(4, kPackK16): packed_cols<4, kPackK16, false>(w, g, x, n_x, out); return;
    case packed_form(5, kPackD): packed_cols<5, kPackD, false>(w, g, x, n_x, out); return;
    case packed_form(5, kPackDM): packed_cols<5, kPackDM, false>(w, g, x, n_x, out); return;
    case packed_form(5, kPackK32): packed_cols<5, kPackK32, false>(w, g, x, n_x, out); return;
    case packed_form(6, kPackK16): packed_cols<6, kPackK16, false>(w, g, x, n_x, out); return;
    default: packed_cols<8, kPackD, true>(w, g, x, n_x, out); return;  // q8_0, iq4_nl: signed, stored + 128
  }
}
constexpr auto kQdotPacked = qdot_packed;
constexpr void (*kQdotPackedTiles)(const PackedMatrix&, int64_t, const QTilesX&, int64_t, uint8_t*,
                                   float*) = nullptr;
#else
constexpr void (*kQdotPacked)(const PackedMatrix&, int64_t, const QRowX*, int, float*) = nullptr;
constexpr void (*kQdotPackedTiles)(const PackedMatrix&, int64_t, const QTilesX&, int64_t, uint8_t*,
                                   float*) = nullptr;
#endif

}  // namespace
}  // namespace kiln::cpu
