// Part of cpu_kernels_impl.h (included from it, once per ISA level): x rows quantized and weight rows
// unpacked into the layouts of cpu_kernels.h (QRowX, QTileW). Everything here has internal linkage, as there.
namespace kiln::cpu {
namespace {

// ---- x quantization: bit-exact with core/quant's quantize_row_q8_0 / q8_1 / q8_k ----------------------

// Sets the 8 lane scales of sub-block `sub`.
void set_lanes(float* d, int64_t sub, float lo, float hi) {
  for (int l = 0; l < 4; ++l) {
    d[sub * 8 + l] = lo;
    d[sub * 8 + 4 + l] = hi;
  }
}

// q8_0 / q8_1 of one 32-block: d = absmax / 127 (NaN ignored), q = roundf(x / d) clamped to +-127, NaN -> 0;
// returns the f16-rounded d, the scale the reference dequantizes with.
float quantize_block_q8(const float* x, int8_t* q) {
#if defined(__AVX2__)
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  __m256 amax = _mm256_setzero_ps();
  __m256 v[4];
  for (int j = 0; j < 4; ++j) {
    v[j] = _mm256_loadu_ps(x + 8 * j);
    amax = _mm256_max_ps(_mm256_andnot_ps(sign_mask, v[j]), amax);  // NaN in the first operand: keeps amax
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float d = _mm_cvtss_f32(m4) / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const __m256 vid = _mm256_set1_ps(id), half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
  const __m256 lim = _mm256_set1_ps(127.0f), nlim = _mm256_set1_ps(-127.0f);
  __m256i qi[4];
  for (int j = 0; j < 4; ++j) {
    const __m256 s = _mm256_mul_ps(v[j], vid);
    // roundf: truncate, then step away from zero when the (exact) fraction is at least one half.
    const __m256 t = _mm256_round_ps(s, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_andnot_ps(sign_mask, _mm256_sub_ps(s, t));
    const __m256 step = _mm256_or_ps(_mm256_and_ps(s, sign_mask), one);
    __m256 r = _mm256_add_ps(t, _mm256_and_ps(_mm256_cmp_ps(frac, half, _CMP_GE_OQ), step));
    r = _mm256_min_ps(_mm256_max_ps(r, nlim), lim);
    r = _mm256_and_ps(r, _mm256_cmp_ps(s, s, _CMP_ORD_Q));  // NaN -> 0
    qi[j] = _mm256_cvtps_epi32(r);
  }
  const __m256i p16a = _mm256_packs_epi32(qi[0], qi[1]), p16b = _mm256_packs_epi32(qi[2], qi[3]);
  const __m256i p8 =
      _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), p8);
  return h2f(f2h(d));
#else
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = __builtin_fmaxf(amax, __builtin_fabsf(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < 32; ++j) {
    const float v = x[j] * id;
    int r;
    if (!(__builtin_fabsf(v) <= 127.0f)) {
      r = v != v ? 0 : (v > 0 ? 127 : -127);
    } else {
      r = static_cast<int>(__builtin_roundf(v));
    }
    q[j] = static_cast<int8_t>(r);
  }
  return h2f(f2h(d));
#endif
}

// q8_K of one 256-block: iscale = -127 / (signed absmax, the first on ties), q = nearbyint(iscale * x) in
// [-128, 127], NaN -> 0, d = 1 / iscale; an all-zero block has d = 0.
float quantize_block_q8k(const float* x, int8_t* q) {
  float amax = 0.0f, max = 0.0f;
  for (int e = 0; e < kQK_K; ++e) {
    if (__builtin_fabsf(x[e]) > amax) {
      amax = __builtin_fabsf(x[e]);
      max = x[e];
    }
  }
  if (amax == 0.0f) {
    std::memset(q, 0, kQK_K);
    return 0.0f;
  }
  const float iscale = -127.0f / max;
  int e = 0;
#if defined(__AVX2__)
  const __m256 vs = _mm256_set1_ps(iscale), lo = _mm256_set1_ps(-128.0f), hi = _mm256_set1_ps(127.0f);
  for (; e < kQK_K; e += 32) {
    __m256i qi[4];
    for (int j = 0; j < 4; ++j) {
      const __m256 s = _mm256_mul_ps(_mm256_loadu_ps(x + e + 8 * j), vs);
      __m256 r = _mm256_round_ps(s, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      r = _mm256_min_ps(_mm256_max_ps(r, lo), hi);
      r = _mm256_and_ps(r, _mm256_cmp_ps(s, s, _CMP_ORD_Q));
      qi[j] = _mm256_cvtps_epi32(r);
    }
    const __m256i p16a = _mm256_packs_epi32(qi[0], qi[1]), p16b = _mm256_packs_epi32(qi[2], qi[3]);
    const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b),
                                                   _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + e), p8);
  }
#endif
  for (; e < kQK_K; ++e) {
    const float v = __builtin_nearbyintf(iscale * x[e]);
    q[e] = static_cast<int8_t>(
        v != v ? 0 : static_cast<int>(__builtin_fminf(127.0f, __builtin_fmaxf(-128.0f, v))));
  }
  return 1.0f / iscale;
}

void quantize_x(uint32_t act, const float* x, int64_t k, int8_t* q, float* d, float* s) {
  const int64_t kp = pad_k(k);
  if (act == kQ8_K) {
    for (int64_t b = 0; b < k / kQK_K; ++b) {
      const float dk = quantize_block_q8k(x + b * kQK_K, q + b * kQK_K);
      for (int64_t sub = b * 8; sub < b * 8 + 8; ++sub) set_lanes(d, sub, dk, dk);
    }
  } else {  // q8_0 and q8_1 round alike (q8_1's sum is not used: the sums below are exact)
    for (int64_t b = 0; b < k / kQK; ++b) {
      const float db = quantize_block_q8(x + b * kQK, q + b * kQK);
      set_lanes(d, b, db, db);
    }
  }
  std::memset(q + k, 0, static_cast<size_t>(kp - k));
  for (int64_t sub = k / kSub; sub < kp / kSub; ++sub) set_lanes(d, sub, 0.0f, 0.0f);
  for (int64_t g = 0; g < kp / 16; ++g) {
    int32_t sum = 0;
    for (int j = 0; j < 16; ++j) sum += q[g * 16 + j];
    s[g] = d[g / 2 * 8] * static_cast<float>(sum);
  }
}

// ---- weight unpacking: one row of k elements -> q [kp], d [kp / 4], m [kp / 16] ------------------------

// Legacy nibble layout: qs[j] holds element j (low) and j + 16 (high).
void nibbles16(const uint8_t* qs, uint8_t* out) {
#if defined(__AVX2__)
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)), m = _mm_set1_epi8(0x0F);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_and_si128(v, m));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16), _mm_and_si128(_mm_srli_epi16(v, 4), m));
#else
  for (int j = 0; j < 16; ++j) {
    out[j] = qs[j] & 0x0F;
    out[j + 16] = qs[j] >> 4;
  }
#endif
}

// K-quant nibble layout: 32 bytes hold sub-block 2i (low nibbles) and 2i + 1 (high).
void nibbles32(const uint8_t* qs, uint8_t* lo, uint8_t* hi) {
#if defined(__AVX2__)
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs)), m = _mm256_set1_epi8(0x0F);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo), _mm256_and_si256(v, m));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi), _mm256_and_si256(_mm256_srli_epi16(v, 4), m));
#else
  for (int j = 0; j < 32; ++j) {
    lo[j] = qs[j] & 0x0F;
    hi[j] = qs[j] >> 4;
  }
#endif
}

// Q5_0 / Q5_1: adds 16 to element j where bit j of the little-endian uint32 qh is set.
void add_high_bits(const uint8_t* qh, uint8_t* q) {
  uint32_t bits;
  std::memcpy(&bits, qh, 4);
#if defined(__AVX2__)
  const __m256i spread =
      _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)),
                          _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2,
                                           2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i sel = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, sel), sel);
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                      _mm256_or_si256(v, _mm256_and_si256(set, _mm256_set1_epi8(0x10))));
#else
  for (int j = 0; j < 32; ++j) q[j] = static_cast<uint8_t>(q[j] | (((bits >> j) & 1) << 4));
#endif
}

// Q5_K: adds 16 to element l of sub-block `sub` where bit `sub` of qh[l] is set.
void add_mask_bits(const uint8_t* qh, int sub, uint8_t* q) {
#if defined(__AVX2__)
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
  const __m256i bit = _mm256_and_si256(_mm256_slli_epi16(_mm256_srl_epi16(h, _mm_cvtsi32_si128(sub)), 4),
                                       _mm256_set1_epi8(0x10));
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm256_or_si256(v, bit));
#else
  for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(q[l] | (((qh[l] >> sub) & 1) << 4));
#endif
}

// Q4_K / Q5_K: 6-bit scale and min of sub-block s (see core/quant/quant_k.cpp).
void k_scale_min(const uint8_t* scales, int s, int* scale, int* min) {
  if (s < 4) {
    *scale = scales[s] & 63;
    *min = scales[s + 4] & 63;
  } else {
    *scale = (scales[s + 4] & 0x0F) | ((scales[s - 4] >> 6) << 4);
    *min = (scales[s + 4] >> 4) | ((scales[s] >> 6) << 4);
  }
}

// IQ4_NL / IQ4_XS: 16 bytes of nibbles (element j low, j + 16 high) as the signed levels they index.
void iq4_levels(const uint8_t* qs, uint8_t* out) {
#if defined(__AVX2__)
  const __m128i levels = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4NLValues));
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)), lo4 = _mm_set1_epi8(0x0F);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_shuffle_epi8(levels, _mm_and_si128(v, lo4)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16),
                   _mm_shuffle_epi8(levels, _mm_and_si128(_mm_srli_epi16(v, 4), lo4)));
#else
  for (int j = 0; j < 16; ++j) {
    out[j] = static_cast<uint8_t>(kIQ4NLValues[qs[j] & 0x0F]);
    out[j + 16] = static_cast<uint8_t>(kIQ4NLValues[qs[j] >> 4]);
  }
#endif
}

void unpack_legacy(uint32_t t, const uint8_t* row, int64_t nb, uint8_t* q, float* d, float* m) {
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* qb = q + b * kQK;
    float dw = 0.0f, mw = 0.0f;
    if (t == kQ4_0) {
      const auto* blk = block_at<BlockQ4_0>(row, b);
      nibbles16(blk->qs, qb);
      dw = h2f(blk->d);
      mw = -8.0f * dw;
    } else if (t == kQ4_1) {
      const auto* blk = block_at<BlockQ4_1>(row, b);
      nibbles16(blk->qs, qb);
      dw = h2f(blk->d);
      mw = h2f(blk->m);
    } else if (t == kQ5_0) {
      const auto* blk = block_at<BlockQ5_0>(row, b);
      nibbles16(blk->qs, qb);
      add_high_bits(blk->qh, qb);
      dw = h2f(blk->d);
      mw = -16.0f * dw;
    } else if (t == kQ5_1) {
      const auto* blk = block_at<BlockQ5_1>(row, b);
      nibbles16(blk->qs, qb);
      add_high_bits(blk->qh, qb);
      dw = h2f(blk->d);
      mw = h2f(blk->m);
    } else if (t == kQ8_0) {
      const auto* blk = block_at<BlockQ8_0>(row, b);
      std::memcpy(qb, blk->qs, kQK);
      dw = h2f(blk->d);
    } else {  // iq4_nl: the nibbles index the signed levels
      const auto* blk = block_at<BlockIQ4_NL>(row, b);
      iq4_levels(blk->qs, qb);
      dw = h2f(blk->d);
    }
    set_lanes(d, b, dw, dw);
    m[2 * b] = m[2 * b + 1] = mw;
  }
}

void unpack_k(uint32_t t, const uint8_t* row, int64_t nb, uint8_t* q, float* d, float* m) {
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* qb = q + b * kQK_K;
    float* db = d + b * 64;  // 8 sub-blocks x 8 lanes
    float* mb = m + b * 16;  // 16 groups of 16
    if (t == kQ4_K || t == kQ5_K) {
      const uint8_t *scales, *qs, *qh = nullptr;
      float dd, dmin;
      if (t == kQ4_K) {
        const auto* blk = block_at<BlockQ4_K>(row, b);
        scales = blk->scales, qs = blk->qs, dd = h2f(blk->d), dmin = h2f(blk->dmin);
      } else {
        const auto* blk = block_at<BlockQ5_K>(row, b);
        scales = blk->scales, qs = blk->qs, qh = blk->qh, dd = h2f(blk->d), dmin = h2f(blk->dmin);
      }
      for (int i = 0; i < 4; ++i) nibbles32(qs + 32 * i, qb + 64 * i, qb + 64 * i + 32);
      for (int s = 0; s < 8; ++s) {
        if (qh != nullptr) add_mask_bits(qh, s, qb + 32 * s);
        int sc, mn;
        k_scale_min(scales, s, &sc, &mn);
        const float dl = dd * static_cast<float>(sc), ml = dmin * static_cast<float>(mn);
        set_lanes(db, s, dl, dl);
        mb[2 * s] = mb[2 * s + 1] = -ml;
      }
    } else if (t == kQ6_K) {
      const auto* blk = block_at<BlockQ6_K>(row, b);
      for (int h = 0; h < 2; ++h) {
        for (int kk = 0; kk < 4; ++kk) {
          uint8_t* out = qb + h * 128 + kk * 32;
          const uint8_t* ql = blk->ql + h * 64 + (kk % 2) * 32;
          const uint8_t* qh = blk->qh + h * 32;
#if defined(__AVX2__)
          const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03);
          const __m256i lo =
              _mm256_and_si256(_mm256_srl_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql)),
                                                _mm_cvtsi32_si128(4 * (kk / 2))),
                               m4);
          const __m256i hi =
              _mm256_and_si256(_mm256_srl_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh)),
                                                _mm_cvtsi32_si128(2 * kk)),
                               m2);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)));
#else
          for (int l = 0; l < 32; ++l) {
            const int low = (ql[l] >> (4 * (kk / 2))) & 0x0F, high = (qh[l] >> (2 * kk)) & 3;
            out[l] = static_cast<uint8_t>(low | (high << 4));
          }
#endif
        }
      }
      const float dd = h2f(blk->d);
      for (int s = 0; s < 8; ++s) {
        const float lo = dd * static_cast<float>(blk->scales[2 * s]);
        const float hi = dd * static_cast<float>(blk->scales[2 * s + 1]);
        set_lanes(db, s, lo, hi);
        mb[2 * s] = -32.0f * lo;
        mb[2 * s + 1] = -32.0f * hi;
      }
    } else if (t == kQ2_K) {
      const auto* blk = block_at<BlockQ2_K>(row, b);
      for (int e = 0; e < kQK_K; ++e) {
        qb[e] = static_cast<uint8_t>((blk->qs[(e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3);
      }
      const float dd = h2f(blk->d), dmin = h2f(blk->dmin);
      float dl[16];
      for (int g = 0; g < 16; ++g) {
        dl[g] = dd * static_cast<float>(blk->scales[g] & 0x0F);
        mb[g] = -(dmin * static_cast<float>(blk->scales[g] >> 4));
      }
      for (int s = 0; s < 8; ++s) set_lanes(db, s, dl[2 * s], dl[2 * s + 1]);
    } else {  // q3_k: q = low 2 bits + 4 * high bit, so that q - 4 is the signed quant
      const auto* blk = block_at<BlockQ3_K>(row, b);
      for (int e = 0; e < kQK_K; ++e) {
        const int low = (blk->qs[(e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3;
        const int high = (blk->hmask[e % 32] >> (e / 32)) & 1;
        qb[e] = static_cast<uint8_t>(low + 4 * high);
      }
      const float dd = h2f(blk->d);
      float dl[16];
      for (int g = 0; g < 16; ++g) {
        const int low = (blk->scales[g % 8] >> (4 * (g / 8))) & 0x0F;
        const int high = (blk->scales[8 + g % 4] >> (2 * (g / 4))) & 0x03;
        dl[g] = dd * static_cast<float>((low | (high << 4)) - 32);
        mb[g] = -4.0f * dl[g];
      }
      for (int s = 0; s < 8; ++s) set_lanes(db, s, dl[2 * s], dl[2 * s + 1]);
    }
  }
}

// ---- the grid i-quants: quants as signed values (grid magnitude times sign; IQ1: 8 (v + shift))
// -------------

// The 8 sign bits of a 7-bit IQ2_XXS / IQ2_XS / IQ3_XXS sign code: bit 7 makes the count of set bits even.
uint8_t iq_sign_bits(uint32_t code) {
  return static_cast<uint8_t>(code | (static_cast<uint32_t>(__builtin_popcount(code)) & 1) << 7);
}

// 8 elements from magnitudes (byte j of `grid`, never 0) and sign bits, 8 bytes at once: the sign bits
// spread to one a byte, each byte made 0x00 or 0xFF (s), then q = (g ^ s) + (s & 1): the byte's negation
// where s is set (no carry leaves a byte: g ^ 0xFF < 0xFF for g > 0).
void iq_put8(uint64_t grid, uint8_t signs, uint8_t* out) {
  constexpr uint64_t kLow7 = 0x7F7F7F7F7F7F7F7Full, kHigh = 0x8080808080808080ull,
                     kOnes = 0x0101010101010101ull;
  const uint64_t m = static_cast<uint64_t>(signs) * kOnes & 0x8040201008040201ull;  // byte j: bit j only
  const uint64_t s = (((((m & kLow7) + kLow7) | m) & kHigh) >> 7) * 0xFF;
  const uint64_t q = (grid ^ s) + (s & kOnes);
  std::memcpy(out, &q, 8);
}

// 8 elements of an IQ1 group: 8 v + 1 (or 8 v - 1 when minus) for the grid's signed bytes v in {-1, 0, 1};
// the block's scale is then dl / 8 (exact: dl * (v + shift) = dl / 8 * (8 v + 8 shift), 8 shift = +-1).
// Bytewise without carries: 8 v + 1 = (8 v) | 1; 8 v - 1 = ~(8 (-v)), -v = v ^ 0xFE where v is odd.
void iq1_put8(uint64_t grid, bool minus, uint8_t* out) {
  constexpr uint64_t kTimes8 = 0xF8F8F8F8F8F8F8F8ull, kOnes = 0x0101010101010101ull;
  uint64_t q;
  if (minus) {
    const uint64_t neg = grid ^ (grid & kOnes) * 0xFE;
    q = ~(neg << 3 & kTimes8);
  } else {
    q = (grid << 3 & kTimes8) | kOnes;
  }
  std::memcpy(out, &q, 8);
}

uint32_t load_u32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// One row's blocks of a grid i-quant (see core/quant/quant_blocks.h for the layouts); offsets m stay 0.
void unpack_iq(uint32_t t, const uint8_t* row, int64_t nb, uint8_t* q, float* d) {
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* qb = q + b * kQK_K;
    float* db = d + b * 64;  // 8 sub-blocks x 8 lanes
    for (int ib = 0; ib < 8; ++ib) {
      uint8_t* o = qb + 32 * ib;
      float lo, hi;
      if (t == kIQ2_XXS) {
        const auto* blk = block_at<BlockIQ2_XXS>(row, b);
        const uint32_t a = load_u32(blk->qs + 4 * ib), s = load_u32(blk->qs + 4 * ib + 2);
        for (int l = 0; l < 4; ++l)
          iq_put8(kIQ2XXSGrid[a >> 8 * l & 0xFF], iq_sign_bits(s >> 7 * l & 127), o + 8 * l);
        lo = hi = h2f(blk->d) * (0.5f + static_cast<float>(s >> 28)) * 0.25f;
      } else if (t == kIQ2_XS || t == kIQ2_S) {
        float dd;
        uint8_t sc;
        if (t == kIQ2_XS) {
          const auto* blk = block_at<BlockIQ2_XS>(row, b);
          for (int l = 0; l < 4; ++l) {
            const uint16_t v = blk->qs[4 * ib + l];
            iq_put8(kIQ2XSGrid[v & 511], iq_sign_bits(v >> 9), o + 8 * l);
          }
          dd = h2f(blk->d), sc = blk->scales[ib];
        } else {
          const auto* blk = block_at<BlockIQ2_S>(row, b);
          for (int l = 0; l < 4; ++l) {
            const int g = 4 * ib + l;
            iq_put8(kIQ2SGrid[blk->qs[g] | (blk->qh[ib] >> 2 * l & 3) << 8], blk->qs[kQK_K / 8 + g],
                    o + 8 * l);
          }
          dd = h2f(blk->d), sc = blk->scales[ib];
        }
        lo = dd * (0.5f + static_cast<float>(sc & 0x0F)) * 0.25f;
        hi = dd * (0.5f + static_cast<float>(sc >> 4)) * 0.25f;
      } else if (t == kIQ3_XXS) {
        const auto* blk = block_at<BlockIQ3_XXS>(row, b);
        const uint32_t s = load_u32(blk->qs + kQK_K / 4 + 4 * ib);
        const uint8_t* qs = blk->qs + 8 * ib;
        for (int l = 0; l < 4; ++l) {
          const uint64_t grid = kIQ3XXSGrid[qs[2 * l]] | static_cast<uint64_t>(kIQ3XXSGrid[qs[2 * l + 1]])
                                                             << 32;
          iq_put8(grid, iq_sign_bits(s >> 7 * l & 127), o + 8 * l);
        }
        lo = hi = h2f(blk->d) * (0.5f + static_cast<float>(s >> 28)) * 0.5f;
      } else if (t == kIQ3_S) {
        const auto* blk = block_at<BlockIQ3_S>(row, b);
        for (int l = 0; l < 4; ++l) {
          const int q0 = 8 * ib + 2 * l;
          const uint32_t g0 = kIQ3SGrid[blk->qs[q0] | (blk->qh[ib] >> 2 * l & 1) << 8];
          const uint32_t g1 = kIQ3SGrid[blk->qs[q0 + 1] | (blk->qh[ib] >> (2 * l + 1) & 1) << 8];
          iq_put8(g0 | static_cast<uint64_t>(g1) << 32, blk->signs[4 * ib + l], o + 8 * l);
        }
        lo = hi = h2f(blk->d) * static_cast<float>(1 + 2 * (blk->scales[ib / 2] >> 4 * (ib % 2) & 0x0F));
      } else if (t == kIQ1_S) {
        const auto* blk = block_at<BlockIQ1_S>(row, b);
        const int h = blk->qh[ib];
        for (int l = 0; l < 4; ++l) {
          iq1_put8(kIQ1SGrid[blk->qs[4 * ib + l] | (h >> 3 * l & 7) << 8], (h & 0x8000) != 0, o + 8 * l);
        }
        lo = hi = h2f(blk->d) * static_cast<float>(2 * (h >> 12 & 7) + 1) * 0.125f;
      } else {  // iq1_m
        const auto* blk = block_at<BlockIQ1_M>(row, b);
        uint16_t sc[4];
        std::memcpy(sc, blk->scales, sizeof(sc));
        const float dd = h2f(static_cast<uint16_t>((sc[0] >> 12) | (sc[1] >> 8 & 0x00F0) |
                                                   (sc[2] >> 4 & 0x0F00) | (sc[3] & 0xF000)));
        for (int l = 0; l < 4; ++l) {
          const int g = 4 * ib + l, h = blk->qh[g / 2] >> 4 * (g % 2) & 0x0F;
          iq1_put8(kIQ1SGrid[blk->qs[g] | (h & 7) << 8], (h & 8) != 0, o + 8 * l);
        }
        lo = dd * static_cast<float>(2 * (sc[ib / 2] >> 6 * (ib % 2) & 7) + 1) * 0.125f;
        hi = dd * static_cast<float>(2 * (sc[ib / 2] >> (6 * (ib % 2) + 3) & 7) + 1) * 0.125f;
      }
      set_lanes(db, ib, lo, hi);
    }
  }
}

// IQ4_XS: IQ4_NL's levels under a 6-bit scale per 32, d * (s - 32); offsets m stay 0.
void unpack_iq4_xs(const uint8_t* row, int64_t nb, uint8_t* q, float* d) {
  for (int64_t b = 0; b < nb; ++b) {
    const auto* blk = block_at<BlockIQ4_XS>(row, b);
    const float dd = h2f(blk->d);
    for (int ib = 0; ib < 8; ++ib) {
      iq4_levels(blk->qs + 16 * ib, q + b * kQK_K + 32 * ib);
      const int s = (blk->scales_l[ib / 2] >> 4 * (ib % 2) & 0x0F) | (blk->scales_h >> 2 * ib & 3) << 4;
      const float dl = dd * static_cast<float>(s - 32);
      set_lanes(d + b * 64, ib, dl, dl);
    }
  }
}

bool is_grid_iquant(uint32_t t) {
  return t == kIQ2_XXS || t == kIQ2_XS || t == kIQ2_S || t == kIQ3_XXS || t == kIQ3_S || t == kIQ1_S ||
         t == kIQ1_M;
}

void unpack_w(uint32_t t, const uint8_t* const* rows, int64_t k, uint8_t* q, float* d, float* m) {
  const int64_t kp = pad_k(k);
  const bool k_quant = t == kQ2_K || t == kQ3_K || t == kQ4_K || t == kQ5_K || t == kQ6_K;
  KILN_UNROLL
  for (int r = 0; r < kTileRows; ++r) {
    uint8_t* qr = q + r * kp;
    float* dr = d + r * kp / 4;
    float* mr = m + r * kp / 16;
    if (is_grid_iquant(t) || t == kIQ4_XS) {
      if (t == kIQ4_XS) {
        unpack_iq4_xs(rows[r], k / kQK_K, qr, dr);
      } else {
        unpack_iq(t, rows[r], k / kQK_K, qr, dr);
      }
      std::memset(mr, 0, static_cast<size_t>(k / 16) * sizeof(float));
    } else if (k_quant) {
      unpack_k(t, rows[r], k / kQK_K, qr, dr, mr);
    } else {
      unpack_legacy(t, rows[r], k / kQK, qr, dr, mr);
    }
    std::memset(qr + k, 0, static_cast<size_t>(kp - k));
    for (int64_t sub = k / kSub; sub < kp / kSub; ++sub) set_lanes(dr, sub, 0.0f, 0.0f);
    for (int64_t g = k / 16; g < kp / 16; ++g) mr[g] = 0.0f;
  }
}

}  // namespace
}  // namespace kiln::cpu
