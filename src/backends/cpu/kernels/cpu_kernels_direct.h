// Part of cpu_kernels_impl.h (included from it, once per ISA level, after the integer products): the decode
// kernels, straight from the packed blocks. Everything here has internal linkage, as there.
namespace kiln::cpu {
namespace {

// ---- direct products for few x rows: weight blocks decoded in registers, no tile buffer ----------------
// Decode (one or two tokens) reads each weight once and uses it once or twice: writing it unpacked to a
// buffer and reading it back cost as much as the products. The common types are decoded here in registers;
// the others (and the portable level) take the tile path.

#if defined(__AVX2__)
// Legacy nibbles in a register: element j (low nibble of byte j) and j + 16 (high nibble).
KILN_INLINE __m256i nibbles_reg(const uint8_t* qs) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)), m = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}

// Q5_0 / Q5_1: 16 where bit j of qh is set.
KILN_INLINE __m256i high_bits_reg(const uint8_t* qh) {
  uint32_t bits;
  std::memcpy(&bits, qh, 4);
  const __m256i spread =
      _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)),
                          _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2,
                                           2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i sel = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, sel), sel), _mm256_set1_epi8(0x10));
}

// Accumulates one weight row's products with NX x rows, a sub-block at a time.
template <int NX, bool kSigned, bool kHasM>
struct DirectRow {
  const QRowX* x;
  float* mb;  // [kp / 16] the row's offsets, for offsets4
  __m256 acc[NX];
  DirectRow(const QRowX* xr, float* m) : x(xr), mb(m) {
    for (int c = 0; c < NX; ++c) acc[c] = _mm256_setzero_ps();
  }
  // Sub-block `sub` of the row: quants q, lane scales dl, offsets m_lo / m_hi of its two halves.
  KILN_INLINE void add(int64_t sub, __m256i q, __m256 dl, float m_lo, float m_hi) {
    if constexpr (kHasM) mb[2 * sub] = m_lo, mb[2 * sub + 1] = m_hi;
    const __m256i wu = kSigned ? _mm256_sign_epi8(q, q) : q;
    for (int c = 0; c < NX; ++c) {
      __m256i xs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[c].q + sub * 32));
      if constexpr (kSigned) xs = _mm256_sign_epi8(xs, q);
      const __m256 p = _mm256_mul_ps(_mm256_cvtepi32_ps(Ymm::dot(Ymm::izero(), wu, xs)),
                                     _mm256_loadu_ps(x[c].d + sub * 8));
      acc[c] = _mm256_fmadd_ps(p, dl, acc[c]);
    }
  }
  // accm[c][r]: the offsets' part (offsets4).
  void store(float* out, int r, const float (*accm)[kTileRows]) {
    for (int c = 0; c < NX; ++c) out[c * kTileRows + r] = Ymm::hsum(acc[c]) + accm[c][r];
  }
};

#if defined(__AVX512BW__)
// As DirectRow, in the AVX-512 tile's order: sub-blocks 2j and 2j + 1 share one 512-bit product, the first
// waiting in `pending` for the second (x's padding is zero, so a lone last sub-block pairs with zeros).
template <int NX, bool kSigned, bool kHasM>
struct DirectRow512 {
  const QRowX* x;
  float* mb;  // [kp / 16] the row's offsets, for offsets4
  __m512 acc[NX];
  __m256i pq = _mm256_setzero_si256();
  __m256 pd = _mm256_setzero_ps();
  int64_t psub = -1;  // the pending sub-block, or -1
  DirectRow512(const QRowX* xr, float* m) : x(xr), mb(m) {
    for (int c = 0; c < NX; ++c) acc[c] = _mm512_setzero_ps();
  }
  KILN_INLINE void pair(__m512i q, __m512 dl) {
    __mmask64 neg = 0;
    if constexpr (kSigned) {
      neg = _mm512_movepi8_mask(q);
      q = _mm512_abs_epi8(q);
    }
    for (int c = 0; c < NX; ++c) {
      __m512i xs = _mm512_loadu_si512(x[c].q + psub * 32);
      if constexpr (kSigned) xs = _mm512_mask_sub_epi8(xs, neg, _mm512_setzero_si512(), xs);
      const __m512 p = _mm512_mul_ps(_mm512_cvtepi32_ps(Zmm::dot(Zmm::izero(), q, xs)),
                                     _mm512_loadu_ps(x[c].d + psub * 8));
      acc[c] = _mm512_fmadd_ps(p, dl, acc[c]);
    }
  }
  KILN_INLINE void add(int64_t sub, __m256i q, __m256 dl, float m_lo, float m_hi) {
    if constexpr (kHasM) mb[2 * sub] = m_lo, mb[2 * sub + 1] = m_hi;
    if (psub < 0) {
      psub = sub, pq = q, pd = dl;
      return;
    }
    pair(_mm512_inserti64x4(_mm512_castsi256_si512(pq), q, 1),
         _mm512_insertf32x8(_mm512_castps256_ps512(pd), dl, 1));
    psub = -1;
  }
  void store(float* out, int r, const float (*accm)[kTileRows]) {
    if (psub >= 0) pair(_mm512_zextsi256_si512(pq), _mm512_zextps256_ps512(pd));
    for (int c = 0; c < NX; ++c) out[c * kTileRows + r] = _mm512_reduce_add_ps(acc[c]) + accm[c][r];
  }
};
template <int NX, bool kSigned, bool kHasM>
using DirectAcc = DirectRow512<NX, kSigned, kHasM>;
#else
template <int NX, bool kSigned, bool kHasM>
using DirectAcc = DirectRow<NX, kSigned, kHasM>;
#endif

template <uint32_t T, class F>
KILN_INLINE void decode_block(const uint8_t* row, int64_t b, F&& f) {
  if constexpr (T == kQ4_0) {
    const auto* blk = block_at<BlockQ4_0>(row, b);
    const float d = h2f(blk->d);
    f(b, nibbles_reg(blk->qs), _mm256_set1_ps(d), -8.0f * d, -8.0f * d);
  } else if constexpr (T == kQ4_1) {
    const auto* blk = block_at<BlockQ4_1>(row, b);
    const float m = h2f(blk->m);
    f(b, nibbles_reg(blk->qs), _mm256_set1_ps(h2f(blk->d)), m, m);
  } else if constexpr (T == kQ5_0) {
    const auto* blk = block_at<BlockQ5_0>(row, b);
    const float d = h2f(blk->d);
    f(b, _mm256_or_si256(nibbles_reg(blk->qs), high_bits_reg(blk->qh)), _mm256_set1_ps(d), -16.0f * d,
      -16.0f * d);
  } else if constexpr (T == kQ5_1) {
    const auto* blk = block_at<BlockQ5_1>(row, b);
    const float m = h2f(blk->m);
    f(b, _mm256_or_si256(nibbles_reg(blk->qs), high_bits_reg(blk->qh)), _mm256_set1_ps(h2f(blk->d)), m, m);
  } else if constexpr (T == kQ8_0) {
    const auto* blk = block_at<BlockQ8_0>(row, b);
    f(b, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qs)), _mm256_set1_ps(h2f(blk->d)), 0.0f,
      0.0f);
  } else if constexpr (T == kQ4_K || T == kQ5_K) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const uint8_t *scales, *qs, *qh = nullptr;
    float dd, dmin;
    if constexpr (T == kQ4_K) {
      const auto* blk = block_at<BlockQ4_K>(row, b);
      scales = blk->scales, qs = blk->qs, dd = h2f(blk->d), dmin = h2f(blk->dmin);
    } else {
      const auto* blk = block_at<BlockQ5_K>(row, b);
      scales = blk->scales, qs = blk->qs, qh = blk->qh, dd = h2f(blk->d), dmin = h2f(blk->dmin);
    }
    __m256i hbits = _mm256_setzero_si256();
    if constexpr (T == kQ5_K) hbits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
    for (int i = 0; i < 4; ++i) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * i));
      __m256i q[2] = {_mm256_and_si256(v, m4), _mm256_and_si256(_mm256_srli_epi16(v, 4), m4)};
      for (int h = 0; h < 2; ++h) {
        const int s = 2 * i + h;
        if constexpr (T == kQ5_K) {
          const __m256i bit = _mm256_and_si256(
              _mm256_slli_epi16(_mm256_srl_epi16(hbits, _mm_cvtsi32_si128(s)), 4), _mm256_set1_epi8(0x10));
          q[h] = _mm256_or_si256(q[h], bit);
        }
        int sc, mn;
        k_scale_min(scales, s, &sc, &mn);
        const float ml = -(dmin * static_cast<float>(mn));
        f(b * 8 + s, q[h], _mm256_set1_ps(dd * static_cast<float>(sc)), ml, ml);
      }
    }
  } else {
    static_assert(T == kQ6_K);
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03);
    const auto* blk = block_at<BlockQ6_K>(row, b);
    const float dd = h2f(blk->d);
    for (int h = 0; h < 2; ++h) {
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qh + h * 32));
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->ql + h * 64));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->ql + h * 64 + 32));
      for (int kk = 0; kk < 4; ++kk) {
        const __m256i ql = kk % 2 == 0 ? ql0 : ql1;
        const __m256i lo = _mm256_and_si256(kk < 2 ? ql : _mm256_srli_epi16(ql, 4), m4);
        const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * kk)), m2);
        const int s = h * 4 + kk;
        const float lo_d = dd * static_cast<float>(blk->scales[2 * s]);
        const float hi_d = dd * static_cast<float>(blk->scales[2 * s + 1]);
        f(b * 8 + s, _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)),
          _mm256_setr_m128(_mm_set1_ps(lo_d), _mm_set1_ps(hi_d)), -32.0f * lo_d, -32.0f * hi_d);
      }
    }
  }
}

// The kTileRows rows advance together, block by block: independent accumulation chains, x read once.
// mb: [kTileRows][kp / 16] scratch for the rows' offsets.
template <uint32_t T, int NX>
void direct_tile(const uint8_t* const* rows, int64_t k, const QRowX* x, float* mb, float* out) {
  constexpr bool kSigned = T == kQ8_0;
  constexpr int64_t kBlock = T == kQ4_K || T == kQ5_K || T == kQ6_K ? kQK_K : kQK;
  const int64_t ng = pad_k(k) / 16;
  // Four named accumulators, not an array indexed in a loop, so that they stay in registers.
  static_assert(kTileRows == 4);
  using Acc = DirectAcc<NX, kSigned, !kSigned>;
  Acc a0(x, mb), a1(x, mb + ng), a2(x, mb + 2 * ng), a3(x, mb + 3 * ng);
  for (int64_t b = 0; b < k / kBlock; ++b) {
    auto step = [&](Acc& a, const uint8_t* row) {
      decode_block<T>(row, b, [&](int64_t sub, __m256i q, __m256 dl, float m_lo, float m_hi) {
        a.add(sub, q, dl, m_lo, m_hi);
      });
    };
    step(a0, rows[0]);
    step(a1, rows[1]);
    step(a2, rows[2]);
    step(a3, rows[3]);
  }
  float accm[NX][kTileRows] = {};
  if constexpr (!kSigned) {
    const float* m[kTileRows];
    for (int r = 0; r < kTileRows; ++r) {
      for (int64_t g = k / 16; g < ng; ++g) mb[r * ng + g] = 0.0f;
      m[r] = mb + r * ng;
    }
    for (int c = 0; c < NX; ++c) offsets4(m, x[c].s, ng, accm[c]);
  }
  a0.store(out, 0, accm);
  a1.store(out, 1, accm);
  a2.store(out, 2, accm);
  a3.store(out, 3, accm);
}

template <uint32_t T>
void direct_tile(const uint8_t* const* rows, int64_t k, const QRowX* x, int n_x, float* mb, float* out) {
  if (n_x == 1) {
    direct_tile<T, 1>(rows, k, x, mb, out);
  } else {
    direct_tile<T, 2>(rows, k, x, mb, out);
  }
}

bool qdot_direct(uint32_t t, const uint8_t* const* rows, int64_t k, const QRowX* x, int n_x, float* mb,
                 float* out) {
  if (n_x > 2) return false;
  switch (t) {
    case kQ4_0: direct_tile<kQ4_0>(rows, k, x, n_x, mb, out); return true;
    case kQ4_1: direct_tile<kQ4_1>(rows, k, x, n_x, mb, out); return true;
    case kQ5_0: direct_tile<kQ5_0>(rows, k, x, n_x, mb, out); return true;
    case kQ5_1: direct_tile<kQ5_1>(rows, k, x, n_x, mb, out); return true;
    case kQ8_0: direct_tile<kQ8_0>(rows, k, x, n_x, mb, out); return true;
    case kQ4_K: direct_tile<kQ4_K>(rows, k, x, n_x, mb, out); return true;
    case kQ5_K: direct_tile<kQ5_K>(rows, k, x, n_x, mb, out); return true;
    case kQ6_K: direct_tile<kQ6_K>(rows, k, x, n_x, mb, out); return true;
    default: return false;
  }
}
#else
bool qdot_direct(uint32_t, const uint8_t* const*, int64_t, const QRowX*, int, float*, float*) {
  return false;
}
#endif

}  // namespace
}  // namespace kiln::cpu
