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

#if defined(__AVX2__)
// The products over a vector type S, written once: S::kL = 16 (Zmm, with vpdpbusd: the avx512vnni and amx
// levels) takes a group's 16 rows at once; S::kL = 8 (Ymm: the avx2 and avx512 levels, no vpdpbusd) each half
// of the group in turn, h = 0, 1 (rows 8h .. 8h + 7: 32 bytes of every 64-byte piece), a piece's products by
// vpmaddubsw + vpmaddwd. There signed quants (stored + 128, kSigned) go back to int8 and multiply as |w|
// times x * sign(w), so that no int16 sum saturates; with vpdpbusd they multiply as stored, and c puts the
// offset on.
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
using PackedVec = Zmm;
#else
using PackedVec = Ymm;
#endif
constexpr bool kPackedSigned = PackedVec::kL < kPackRows;  // the signed types' kSigned (8 bits, 4-bit levels)

// The 8 pieces of packed sub-block `qs` (kBits-bit quants) as bytes, rows h kL .. h kL + kL - 1: wq[c]
// elements 4c .. 4c + 3 (c < 4) or 16 + 4(c - 4) .. (c >= 4).
// kLevels: the 4-bit quants are level indices, looked up as the 8-bit layout's bytes (kSigned: the levels).
template <class S, int kBits, bool kSigned, bool kLevels = false>
KILN_INLINE void packed_quants(const uint8_t* qs, int h, typename S::I* wq) {
  const auto at = [&](int64_t off) { return S::iload(qs + off + 4 * S::kL * h); };
  if constexpr (kBits == 8) {
    KILN_UNROLL
    for (int pc = 0; pc < 8; ++pc) {
      wq[pc] = at(64 * pc);
      if constexpr (kSigned) wq[pc] = S::xor_(wq[pc], S::set1_i8(-128));
    }
  } else if constexpr (kBits == 2) {  // piece 2t + p: bits 2t, 2t + 1 of piece p
    const auto m2 = S::set1_i8(0x03), v0 = at(0), v1 = at(64);
    [&]<int... T>(std::integer_sequence<int, T...>) {
      ((wq[2 * T] = S::and_(S::template shift16<-2 * T>(v0), m2)), ...);
      ((wq[2 * T + 1] = S::and_(S::template shift16<-2 * T>(v1), m2)), ...);
    }
    (std::make_integer_sequence<int, 4>{});
  } else {
    const auto m4 = S::set1_i8(0x0F);
    KILN_UNROLL
    for (int pc = 0; pc < 4; ++pc) {
      const auto v = at(64 * pc);
      wq[pc] = S::and_(v, m4);
      wq[4 + pc] = S::and_(S::template shift16<-4>(v), m4);
    }
    if constexpr (kLevels) {
      static_assert(kBits == 4);
      const auto levels = S::xor_(S::broadcast16(kIQ4NLValues), S::set1_i8(kSigned ? 0 : -128));
      KILN_UNROLL
      for (int pc = 0; pc < 8; ++pc) wq[pc] = S::shuffle(levels, wq[pc]);
    }
    // wq | (plane shifted & mask): shifting moves bit t of each byte to the quant's bit 4 (5) or 4, 5 (6).
    if constexpr (kBits == 5) {
      const auto pl = at(256), m = S::set1_i8(0x10);
      [&]<int... T>(std::integer_sequence<int, T...>) {
        ((wq[T] = S::or_and(wq[T], S::template shift16<4 - T>(pl), m)), ...);
      }
      (std::make_integer_sequence<int, 8>{});
    } else if constexpr (kBits == 6) {
      const auto p0 = at(256), p1 = at(320), m = S::set1_i8(0x30);
      [&]<int... T>(std::integer_sequence<int, T...>) {
        ((wq[T] = S::or_and(wq[T], S::template shift16<4 - 2 * T>(p0), m)), ...);
        ((wq[4 + T] = S::or_and(wq[4 + T], S::template shift16<4 - 2 * T>(p1), m)), ...);
      }
      (std::make_integer_sequence<int, 4>{});
    }
  }
}

// Whether a form's scales differ between a sub-block's halves (its products then summed per half).
constexpr bool packed_halves(uint32_t scales) { return scales == kPackK16 || scales == kPackKM16; }

// A chunk's header at p (K scales): rows h kL ..'s D, and M (kPackK32, kPackKM16), as f32.
template <class S, uint32_t kScales>
KILN_INLINE void packed_header(const uint8_t* p, int h, typename S::V& hd, typename S::V& hm) {
  hd = S::load_f16(p + 2 * S::kL * h);
  if constexpr (kScales == kPackK32 || kScales == kPackKM16) hm = S::load_f16(p + 32 + 2 * S::kL * h);
}

// A sub-block's scales at sc as the rows' f32 factors: w = d_lo * q + m_lo (elements 0..15), d_hi * q + m_hi
// (16..31); m_hi is m_lo but for kPackKM16.
template <class S, uint32_t kScales>
KILN_INLINE void packed_scales(const uint8_t* sc, int h, typename S::V hd, typename S::V hm,
                               typename S::V& d_lo, typename S::V& d_hi, typename S::V& m_lo,
                               typename S::V& m_hi) {
  m_lo = m_hi = S::zero();
  if constexpr (kScales == kPackD || kScales == kPackDM) {
    d_lo = d_hi = S::load_f16(sc + 2 * S::kL * h);
    if constexpr (kScales == kPackDM) m_lo = m_hi = S::load_f16(sc + 32 + 2 * S::kL * h);
  } else if constexpr (kScales == kPackK32) {
    d_lo = d_hi = S::mul(hd, S::load_u8(sc + S::kL * h));
    m_lo = m_hi = S::mul(hm, S::load_u8(sc + 16 + S::kL * h));
  } else if constexpr (kScales == kPackKM16) {
    const auto lo = S::load_u8_i32(sc + S::kL * h), hi = S::load_u8_i32(sc + 16 + S::kL * h);
    const auto m4 = S::set1_i32(0x0F);
    d_lo = S::mul(hd, S::to_float(S::and_(lo, m4)));
    d_hi = S::mul(hd, S::to_float(S::and_(hi, m4)));
    m_lo = S::mul(hm, S::to_float(S::template shift32_right<4>(lo)));
    m_hi = S::mul(hm, S::to_float(S::template shift32_right<4>(hi)));
  } else {
    d_lo = S::mul(hd, S::load_i8(sc + S::kL * h));
    d_hi = S::mul(hd, S::load_i8(sc + 16 + S::kL * h));
  }
}

// acc + one sub-block's products with one x row, scaled. lo: the integer products of its elements 0..15 as
// f32 (packed_halves; else of all 32), hi: of 16..31 (packed_halves; else unused); dx: the x row's scale;
// o0, o1: its offsets' scalars (kPackK16: c s_lo, c s_hi; kPackKM16: s_lo, s_hi; kPackD: c (s_lo + s_hi);
// else s_lo + s_hi, for m).
template <class S, uint32_t kScales>
KILN_INLINE typename S::V packed_fma(typename S::V acc, typename S::V lo, typename S::V hi, typename S::V dx,
                                     float o0, float o1, typename S::V d_lo, typename S::V d_hi,
                                     typename S::V m_lo, typename S::V m_hi) {
  if constexpr (kScales == kPackK16) {
    const auto t_lo = S::fma(lo, dx, S::set1(o0));
    const auto t_hi = S::fma(hi, dx, S::set1(o1));
    acc = S::fma(d_lo, t_lo, acc);
    return S::fma(d_hi, t_hi, acc);
  } else if constexpr (kScales == kPackKM16) {
    acc = S::fma(d_lo, S::mul(lo, dx), acc);
    acc = S::fma(d_hi, S::mul(hi, dx), acc);
    acc = S::fma(m_lo, S::set1(o0), acc);
    return S::fma(m_hi, S::set1(o1), acc);
  } else if constexpr (kScales == kPackD) {
    return S::fma(d_lo, S::fma(lo, dx, S::set1(o0)), acc);
  } else {
    acc = S::fma(d_lo, S::mul(lo, dx), acc);
    return S::fma(m_lo, S::set1(o0), acc);
  }
}

// acc + the products of 4 quants of each row (w) with the 4 x quants at xq, broadcast.
template <class S, bool kSigned>
KILN_INLINE typename S::I dot_x4(typename S::I acc, typename S::I w, const int8_t* xq) {
  int32_t a;
  std::memcpy(&a, xq, 4);
  auto xs = S::set1_i32(a);
  if constexpr (kSigned) S::abs_sign(w, xs);
  return S::dot(acc, w, xs);
}

// Rows h kL .. h kL + kL - 1 of group g against NX x rows. Per sub-block and x row: 8 dot products (4 quants
// of the rows times 4 broadcast x quants each) in two chains (elements 0..15 and 16..31), then the scales:
// one FMA per chain into the rows' f32 accumulators. Each x row's arithmetic is the same whatever NX is, so a
// token's result does not depend on its batch.
template <class S, int NX, int kBits, uint32_t kScales, bool kSigned, bool kLevels>
void packed_group(const PackedMatrix& w, int64_t g, int h, const QRowX* x, float* out) {
  using V = typename S::V;
  constexpr int64_t kScaleBytes = kScales == kPackDM ? 64 : 32, kQuantBytes = packed_quant_bytes(kBits);
  constexpr bool kHeader = packed_has_header(kScales);
  const uint8_t* p = w.data + g * w.group_bytes;
  const int64_t n_sub = w.k / kSub;
  const float c = kSigned ? 0.0f : w.c;
  V acc[NX];
  KILN_UNROLL
  for (int j = 0; j < NX; ++j) acc[j] = S::zero();
  V hd = S::zero(), hm = S::zero();
  for (int64_t s0 = 0; s0 < n_sub; s0 += kPackChunk) {
    const int64_t ns = n_sub - s0 < kPackChunk ? n_sub - s0 : kPackChunk;
    if constexpr (kHeader) {
      packed_header<S, kScales>(p, h, hd, hm);
      p += 64;
    }
    const uint8_t* base = p;
    p += (ns * kScaleBytes + 63) / 64 * 64 + ns * kQuantBytes;
    for (int64_t i = 0; i < ns; ++i) {
      const int64_t s = s0 + i;
      const uint8_t* sc = base + packed_scale_offset(i, kScaleBytes, kQuantBytes);
      const uint8_t* qs = base + packed_quant_offset(i, kScaleBytes, kQuantBytes);
      if (S::kL == kPackRows || h == 0) {  // once per sub-block
        KILN_UNROLL
        for (int l = 0; l <= kQuantBytes / 64; ++l) {
          _mm_prefetch(reinterpret_cast<const char*>(qs) + kPackPrefetch + 64 * l, _MM_HINT_T0);
        }
      }
      typename S::I wq[8];
      packed_quants<S, kBits, kSigned, kLevels>(qs, h, wq);
      V d_lo, d_hi, m_lo, m_hi;
      packed_scales<S, kScales>(sc, h, hd, hm, d_lo, d_hi, m_lo, m_hi);
      KILN_UNROLL
      for (int j = 0; j < NX; ++j) {
        const int8_t* xq = x[j].q + s * kSub;
        auto lo = S::izero(), hi = S::izero();
        KILN_UNROLL
        for (int pc = 0; pc < 4; ++pc) {
          lo = dot_x4<S, kSigned>(lo, wq[pc], xq + 4 * pc);
          hi = dot_x4<S, kSigned>(hi, wq[4 + pc], xq + 16 + 4 * pc);
        }
        const V dx = S::set1(x[j].d1[s]);
        const float s_lo = x[j].s[2 * s], s_hi = x[j].s[2 * s + 1];
        if constexpr (packed_halves(kScales)) {
          const float o0 = kScales == kPackK16 ? c * s_lo : s_lo, o1 = kScales == kPackK16 ? c * s_hi : s_hi;
          acc[j] = packed_fma<S, kScales>(acc[j], S::to_float(lo), S::to_float(hi), dx, o0, o1, d_lo, d_hi,
                                          m_lo, m_hi);
        } else {
          const float o = kScales == kPackD ? c * (s_lo + s_hi) : s_lo + s_hi;
          const V sum = S::to_float(S::add_i32(lo, hi));
          acc[j] = packed_fma<S, kScales>(acc[j], sum, sum, dx, o, o, d_lo, d_hi, m_lo, m_hi);
        }
      }
    }
  }
  KILN_UNROLL
  for (int j = 0; j < NX; ++j) S::store(out + j * kPackRows + S::kL * h, S::mul(acc[j], S::set1(w.unit)));
}

// fn.template operator()<kBits, kScales, kLevels>() for w's form (pack_weight makes no other).
template <class Fn>
KILN_INLINE void with_packed_form(const PackedMatrix& w, Fn&& fn) {
  static_assert(kPackRows == 16 && kPackCols == 4 && kPackTileCols == 16);
  switch (packed_form(w.bits, w.scales, w.levels)) {
    case packed_form(4, kPackD): fn.template operator()<4, kPackD, false>(); return;
    case packed_form(4, kPackDM): fn.template operator()<4, kPackDM, false>(); return;
    case packed_form(4, kPackK32): fn.template operator()<4, kPackK32, false>(); return;
    case packed_form(4, kPackK16): fn.template operator()<4, kPackK16, false>(); return;
    case packed_form(5, kPackD): fn.template operator()<5, kPackD, false>(); return;
    case packed_form(5, kPackDM): fn.template operator()<5, kPackDM, false>(); return;
    case packed_form(5, kPackK32): fn.template operator()<5, kPackK32, false>(); return;
    case packed_form(6, kPackK16): fn.template operator()<6, kPackK16, false>(); return;
    case packed_form(2, kPackKM16): fn.template operator()<2, kPackKM16, false>(); return;     // q2_K
    case packed_form(4, kPackD, true): fn.template operator()<4, kPackD, true>(); return;      // iq4_nl
    case packed_form(4, kPackK16, true): fn.template operator()<4, kPackK16, true>(); return;  // iq4_xs
    case packed_form(8, kPackK16): fn.template operator()<8, kPackK16, false>(); return;  // grid i-quants
    default: fn.template operator()<8, kPackD, false>(); return;  // q8_0: signed, stored + 128
  }
}

void qdot_packed(const PackedMatrix& w, int64_t g, const QRowX* x, int n_x, float* out) {
  with_packed_form(w, [&]<int kBits, uint32_t kScales, bool kLevels>() {
    constexpr bool kSigned = (kBits == 8 || kLevels) && kPackedSigned;
    for (int h = 0; h < kPackRows / PackedVec::kL; ++h) {
      with_count<kPackCols>(n_x, [&]<int NX>() {
        packed_group<PackedVec, NX, kBits, kScales, kSigned, kLevels>(w, g, h, x, out);
      });
    }
  });
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

// The tiles: C (n_x rows of 16 int32) in 0 and 1, alternately by sub-block (2 and 3: the second halves of
// the packed_halves forms); A (n_x x rows' quants) in 4 and 6, B (16 weight rows) in 5 and 7: a sub-block's
// 32 quants (B of 8 rows), or with `halves` each half's 16 (4, 5 the first, 6, 7 the second; B of 4 rows).
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

template <int kBits, uint32_t kScales, bool kLevels>
void packed_tiles(const PackedMatrix& w, int64_t g, const QTilesX& x, int64_t n_x, uint8_t* scratch,
                  float* out) {
  constexpr int64_t kScaleBytes = kScales == kPackDM ? 64 : 32, kQuantBytes = packed_quant_bytes(kBits);
  constexpr bool kHeader = packed_has_header(kScales), kHalves = packed_halves(kScales);
  const uint8_t* group = w.data + g * w.group_bytes;
  const int64_t n_sub = w.k / kSub, kp = x.kp;
  // Chunk s0's first sub-block: its header's place (K scales) and its sub-blocks' base.
  auto chunk_base = [&](const uint8_t*& p, int64_t ns, __m512& hd, __m512& hm) {
    if constexpr (kHeader) {
      packed_header<Zmm, kScales>(p, 0, hd, hm);
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
        packed_quants<Zmm, kBits, false, kLevels>(base + packed_quant_offset(i, kScaleBytes, kQuantBytes), 0,
                                                  wq);
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
        __m512 d_lo, d_hi, m_lo, m_hi;
        packed_scales<Zmm, kScales>(sc, 0, hd, hm, d_lo, d_hi, m_lo, m_hi);
        const float* dx = xd + s * kPackTileCols;
        const float* x0 = xs0 + s * kPackTileCols;
        const float* x1 = xs1 + s * kPackTileCols;
        // All 16 rows: those past `rows` (stale sums, zero scalars) are never stored.
        KILN_UNROLL
        for (int j = 0; j < kPackTileCols; ++j) {
          const __m512 sum = _mm512_cvtepi32_ps(_mm512_load_si512(ci[0][j]));  // lo + hi; halves: lo
          const __m512 hi = kHalves ? _mm512_cvtepi32_ps(_mm512_load_si512(ci[1][j])) : sum;
          acc[j] = packed_fma<Zmm, kScales>(acc[j], sum, hi, _mm512_set1_ps(dx[j]), x0[j], x1[j], d_lo, d_hi,
                                            m_lo, m_hi);
        }
      }
    }
    KILN_UNROLL
    for (int j = 0; j < kPackTileCols; ++j) {
      if (j < rows)
        _mm512_storeu_ps(out + (c0 + j) * kPackRows, _mm512_mul_ps(acc[j], _mm512_set1_ps(w.unit)));
    }
  }
}

void qdot_packed_tiles(const PackedMatrix& w, int64_t g, const QTilesX& x, int64_t n_x, uint8_t* scratch,
                       float* out) {
  with_packed_form(w, [&]<int kBits, uint32_t kScales, bool kLevels>() {
    packed_tiles<kBits, kScales, kLevels>(w, g, x, n_x, scratch, out);
  });
}
constexpr auto kQdotPackedTiles = qdot_packed_tiles;
#else
constexpr void (*kQdotPackedTiles)(const PackedMatrix&, int64_t, const QTilesX&, int64_t, uint8_t*,
                                   float*) = nullptr;
#endif

#else
constexpr void (*kQdotPacked)(const PackedMatrix&, int64_t, const QRowX*, int, float*) = nullptr;
constexpr void (*kQdotPackedTiles)(const PackedMatrix&, int64_t, const QTilesX&, int64_t, uint8_t*,
                                   float*) = nullptr;
#endif

}  // namespace
}  // namespace kiln::cpu
