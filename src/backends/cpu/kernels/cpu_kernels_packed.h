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
#else
constexpr void (*kQdotPacked)(const PackedMatrix&, int64_t, const QRowX*, int, float*) = nullptr;
#endif

}  // namespace
}  // namespace kiln::cpu
