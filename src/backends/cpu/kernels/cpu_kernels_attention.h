// Part of cpu_kernels_impl.h (included from it, once per ISA level): the attention kernels, one tile of query
// rows against one chunk of positions (cpu_kernels.h, AttnChunk: the arithmetic and why a row's bits do not
// depend on its tile). Everything here has internal linkage, as there.
//
// Rows are in lanes: kL of them a vector (16 at the avx512 levels, 8 there for tiles of up to 8 rows and at
// avx2, 1 at scalar), so each K element, broadcast, feeds one FMA per kL rows and the softmax is lanewise.
// - S = Q K^T: per element d, the rows' q[d] from qt and each position's k[d] broadcast; kQkPos positions x
// up
//   to kQkVecs row vectors of accumulators (AVX-512: 8 x 3 = 24).
// - softmax over the chunk, per row vector: mask, scale, softcap, max, exp, sum.
// - O += P V: per position, kPvDim vectors of the V row and kPvRows rows' p broadcast (AVX-512: 6 x 4 = 24
//   accumulators), then merged into the state.
// f16, q8_0 and q8_64 K/V rows are converted once per tile and chunk; f32 rows are read in place.
namespace kiln::cpu {
namespace {
namespace attn {

// A vector policy: a vector type of cpu_kernels_simd.h (V, kL floats, M, a lane mask, and the lanewise
// operations) and the kernels' block sizes. Every vector type computes the same operations per lane, so a
// row's bits do not depend on the policy its tile ran with either.
#if defined(__AVX2__)
// 8 lanes: the avx2 level, and tiles of at most 8 rows (decode) at the avx512 levels, where a 256-bit FMA
// issues at twice the rate of a 512-bit one (Zen 4), so that a decode step's 3 or 4 rows waste less.
struct AttnYmm : Ymm {
#if defined(__AVX512F__)  // 32 registers
  static constexpr int kQkPos = 16, kQkVecs = 1, kPvRows = 4, kPvDim = 4;
#else  // 16 registers: 12 or 9 accumulators
  static constexpr int kQkPos = 4, kQkVecs = 3, kPvRows = 3, kPvDim = 3;
#endif
};
#endif

#if defined(__AVX512F__)
struct AttnZmm : Zmm {
  static constexpr int kQkPos = 8, kQkVecs = 3, kPvRows = 6, kPvDim = 4;  // 24 accumulators of 32 registers
};
using Wide = AttnZmm;    // tiles of more than 8 rows
using Narrow = AttnYmm;  // tiles of at most 8
#elif defined(__AVX2__)
using Wide = AttnYmm;
using Narrow = AttnYmm;
#else
struct AttnScalar : Scalar {
  static constexpr int kQkPos = 4, kQkVecs = 3, kPvRows = 4, kPvDim = 4;
};
using Wide = AttnScalar;
using Narrow = AttnScalar;
#endif

// 16 halves to f32.
KILN_INLINE void f16_to_f32_16(const uint16_t* h, float* f) {
#if defined(__AVX512F__)
  Zmm::store(f, Zmm::load_f16(h));
#elif defined(__AVX2__)
  Ymm::store(f, Ymm::load_f16(h));
  Ymm::store(f + 8, Ymm::load_f16(h + 8));
#else
  for (int i = 0; i < 16; ++i) f[i] = h2f(h[i]);
#endif
}

constexpr float kNegInf = -__builtin_inff();

// exp(x) for x <= 0 (Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2, a degree-6 polynomial, times 2^n); within 2
// ulp; exp(0) = 1 exactly. Below -87.3 it returns ~1e-38, not 0: callers mask what must be 0.
template <class P>
KILN_INLINE typename P::V vexp(typename P::V x) {
  using V = typename P::V;
  x = P::max(x, P::set1(-87.33654f));
  const V n = P::round(P::mul(x, P::set1(1.44269504088896341f)));
  V r = P::fma(n, P::set1(-0.693359375f), x);
  r = P::fma(n, P::set1(2.12194440e-4f), r);
  V p = P::set1(1.9875691500e-4f);
  p = P::fma(p, r, P::set1(1.3981999507e-3f));
  p = P::fma(p, r, P::set1(8.3334519073e-3f));
  p = P::fma(p, r, P::set1(4.1665795894e-2f));
  p = P::fma(p, r, P::set1(1.6666665459e-1f));
  p = P::fma(p, r, P::set1(5.0000001201e-1f));
  p = P::fma(p, P::mul(r, r), P::add(r, P::set1(1.0f)));
  return P::mul(p, P::pow2(n));
}

// c * tanh(x / c): tanh(y) = sign(y) (1 - e) / (1 + e), e = exp(-2 |y|). Absolute error ~1e-7 c.
template <class P>
KILN_INLINE typename P::V vsoftcap(typename P::V x, typename P::V c) {
  using V = typename P::V;
  const V y = P::div(x, c);
  const V e = vexp<P>(P::mul(P::abs(y), P::set1(-2.0f)));
  const V one = P::set1(1.0f);
  return P::mul(c, P::with_sign_of(P::div(P::sub(one, e), P::add(one, e)), y));
}

// The merge factors of rows [r0, r0 + kL): state (m, l) takes in (m2, l2); ao, ac get exp(m - m') and
// exp(m2 - m'), 0 for a side whose max is -inf.
template <class P>
KILN_INLINE void merge_factors(float* m, float* l, const float* m2, const float* l2, float* ao, float* ac,
                               int64_t r0) {
  using V = typename P::V;
  const V ninf = P::set1(kNegInf), zero = P::set1(0.0f);
  const V mo = P::load(m + r0), mc = P::load(m2 + r0);
  const V mn = P::max(mo, mc);
  const V a = P::select(P::gt(mo, ninf), vexp<P>(P::sub(mo, mn)), zero);
  const V c = P::select(P::gt(mc, ninf), vexp<P>(P::sub(mc, mn)), zero);
  P::store(l + r0, P::fma(P::load(l2 + r0), c, P::mul(P::load(l + r0), a)));
  P::store(m + r0, mn);
  P::store(ao + r0, a);
  P::store(ac + r0, c);
}

// s[p][r0 .. r0 + NV kL) = qt rows . k[p] for the NP positions k[0 .. NP).
template <class P, int NP, int NV>
KILN_INLINE void qk_block(const float* qt, int64_t rp, int64_t head_dim, const float* const* k, int64_t r0,
                          float* s) {
  using V = typename P::V;
  constexpr int kL = P::kL;
  V acc[NP][NV];
  KILN_UNROLL
  for (auto& row : acc) KILN_UNROLL
  for (V& a : row) a = P::set1(0.0f);
  const float* kp[NP];
  KILN_UNROLL
  for (int p = 0; p < NP; ++p) kp[p] = k[p];
  for (int64_t d = 0; d < head_dim; ++d) {
    V q[NV];
    KILN_UNROLL
    for (int v = 0; v < NV; ++v) q[v] = P::load(qt + d * rp + r0 + v * kL);
    KILN_UNROLL
    for (int p = 0; p < NP; ++p) {
      const V kb = P::set1(kp[p][d]);
      KILN_UNROLL
      for (int v = 0; v < NV; ++v) acc[p][v] = P::fma(kb, q[v], acc[p][v]);
    }
  }
  KILN_UNROLL
  for (int p = 0; p < NP; ++p) {
    KILN_UNROLL
    for (int v = 0; v < NV; ++v) P::store(s + p * rp + r0 + v * kL, acc[p][v]);
  }
}

// o[r0 + r][d0 ..) = o * ao + (sum over j in [j0, j1) of p[j][r0 + r] v[j][d0 ..]) * ac, for NR rows and ND
// vectors of elements.
template <class P, int NR, int ND>
KILN_INLINE void pv_block(const float* p, int64_t rp, const float* const* v, int j0, int j1, int64_t r0,
                          int64_t d0, float* o, int64_t dp, const float* ao, const float* ac) {
  using V = typename P::V;
  constexpr int kL = P::kL;
  V acc[NR][ND];
  KILN_UNROLL
  for (auto& row : acc) KILN_UNROLL
  for (V& a : row) a = P::set1(0.0f);
  for (int j = j0; j < j1; ++j) {
    V vv[ND];
    KILN_UNROLL
    for (int i = 0; i < ND; ++i) vv[i] = P::load(v[j] + d0 + i * kL);
    KILN_UNROLL
    for (int r = 0; r < NR; ++r) {
      const V pb = P::set1(p[j * rp + r0 + r]);
      KILN_UNROLL
      for (int i = 0; i < ND; ++i) acc[r][i] = P::fma(pb, vv[i], acc[r][i]);
    }
  }
  KILN_UNROLL
  for (int r = 0; r < NR; ++r) {
    float* orow = o + (r0 + r) * dp + d0;
    const V a = P::set1(ao[r0 + r]), c = P::set1(ac[r0 + r]);
    KILN_UNROLL
    for (int i = 0; i < ND; ++i)
      P::store(orow + i * kL, P::fma(acc[r][i], c, P::mul(P::load(orow + i * kL), a)));
  }
}

// An 8-bit block (q8_0's or q8_64's: an f16 scale, N int8 codes q, N a multiple of 8) as N f32: each the
// scale times its code, exactly as the reference dequantizer.
template <int N>
KILN_INLINE void q8_to_f32(uint16_t scale, const int8_t* q, float* f) {
  const float d = h2f(scale);
#if defined(__AVX2__)
  const __m256 dv = _mm256_set1_ps(d);
  KILN_UNROLL
  for (int i = 0; i < N / 8; ++i) {
    const __m128i c8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * i));
    _mm256_storeu_ps(f + 8 * i, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c8)), dv));
  }
#else
  for (int i = 0; i < N; ++i) f[i] = d * static_cast<float>(q[i]);
#endif
}

// K or V rows [j0, j1) as f32 pointers: f32 rows in place unless `padded` asks for rows of `stride` floats
// with zeros past n (a vector load past the end of the row must read zeros); f16, q8_0 and q8_64 rows (n a
// multiple of their blocks) converted into buf.
void rows_f32(const AttnChunk& c, const uint8_t* const* rows, int64_t n, bool padded, int64_t stride,
              float* buf, const float** out) {
  for (int j = c.j0; j < c.j1; ++j) {
    float* dst = buf + j * stride;
    if (c.kv_type == kF32) {
      if (!padded) {
        out[j] = reinterpret_cast<const float*>(rows[j]);
        continue;
      }
      std::memcpy(dst, rows[j], n * sizeof(float));
    } else if (c.kv_type == kQ8_0) {
      const auto* blocks = reinterpret_cast<const BlockQ8_0*>(rows[j]);
      for (int64_t b = 0; b < n / 32; ++b) q8_to_f32<32>(blocks[b].d, blocks[b].qs, dst + 32 * b);
    } else if (c.kv_type == kQ8_64) {
      const auto* blocks = reinterpret_cast<const BlockQ8_64*>(rows[j]);
      for (int64_t b = 0; b < n / 64; ++b) q8_to_f32<64>(blocks[b].d, blocks[b].qs, dst + 64 * b);
    } else {
      const auto* h = reinterpret_cast<const uint16_t*>(rows[j]);
      int64_t i = 0;
      for (; i + 16 <= n; i += 16) f16_to_f32_16(h + i, dst + i);
      for (; i < n; ++i) dst[i] = h2f(h[i]);
    }
    for (int64_t i = n; i < stride; ++i) dst[i] = 0.0f;
    out[j] = dst;
  }
}

template <class P>
void attn_chunk_t(const AttnChunk& c) {
  using V = typename P::V;
  constexpr int kL = P::kL, kQkPos = P::kQkPos, kQkVecs = P::kQkVecs, kPvRows = P::kPvRows,
                kPvDim = P::kPvDim;
  static_assert(kAttnChunk % kQkPos == 0 && kAttnAlign % kL == 0);
  const int64_t rp = c.rp, dp = c.dp, head_dim = c.head_dim;
  const int64_t n_vecs = (c.n_rows + kL - 1) / kL;  // row vectors holding rows
  float* s = c.scratch;                             // [kAttnChunk][rp] scores, then p
  float* mc = s + kAttnChunk * rp;                  // [rp] the chunk's max and sum
  float* lc = mc + rp;
  float* ao = lc + rp;  // [rp] merge factors
  float* ac = ao + rp;
  float* kbuf = ac + rp;                       // [kAttnChunk][head_dim]
  float* vbuf = kbuf + kAttnChunk * head_dim;  // [kAttnChunk][dp]
  float* zero = vbuf + kAttnChunk * dp;        // [dp]
  for (int64_t i = 0; i < dp; ++i) zero[i] = 0.0f;

  // S = Q K^T over whole blocks of kQkPos positions covering [j0, j1); positions outside read zeros.
  const float* k[kAttnChunk];
  rows_f32(c, c.k_rows, head_dim, false, head_dim, kbuf, k);
  const int jb0 = c.j0 / kQkPos * kQkPos, jb1 = (c.j1 + kQkPos - 1) / kQkPos * kQkPos;
  for (int j = jb0; j < c.j0; ++j) k[j] = zero;
  for (int j = c.j1; j < jb1; ++j) k[j] = zero;
  const int64_t n_blocks = (n_vecs + kQkVecs - 1) / kQkVecs;  // row-vector blocks, as even as they go
  for (int j = jb0; j < jb1; j += kQkPos) {
    int64_t v0 = 0;
    for (int64_t b = 0; b < n_blocks; ++b) {
      const int64_t nv = (n_vecs - v0) / (n_blocks - b);
      with_count<kQkVecs>(static_cast<int>(nv), [&]<int NV>() {
        qk_block<P, kQkPos, NV>(c.qt, rp, head_dim, k + j, v0 * kL, s + j * rp);
      });
      v0 += nv;
    }
  }

  // Softmax of the chunk, lanewise: mask, scale, softcap, max; then p = exp(s - max) and its sum.
  const V ninf = P::set1(kNegInf), zerov = P::set1(0.0f), scale = P::set1(c.scale), cap = P::set1(c.softcap);
  for (int64_t v = 0; v < n_vecs; ++v) {
    const int64_t r0 = v * kL;
    const V lo = P::load(c.lo + r0), hi = P::load(c.hi + r0);
    V mx = ninf;
    for (int j = c.j0; j < c.j1; ++j) {
      const V jv = P::set1(static_cast<float>(j));
      V x = P::mul(P::load(s + j * rp + r0), scale);
      if (c.softcap > 0.0f) x = vsoftcap<P>(x, cap);
      x = P::select(P::both(P::le(lo, jv), P::le(jv, hi)), x, ninf);
      P::store(s + j * rp + r0, x);
      mx = P::max(mx, x);
    }
    V sum = zerov;
    for (int j = c.j0; j < c.j1; ++j) {
      const V x = P::load(s + j * rp + r0);
      const V p = P::select(P::gt(x, ninf), vexp<P>(P::sub(x, mx)), zerov);
      P::store(s + j * rp + r0, p);
      sum = P::add(sum, p);
    }
    P::store(mc + r0, mx);
    P::store(lc + r0, sum);
  }
  for (int64_t v = 0; v < n_vecs; ++v) merge_factors<P>(c.m, c.l, mc, lc, ao, ac, v * kL);

  // O = O * ao + (P V) * ac.
  const float* vrows[kAttnChunk];
  rows_f32(c, c.v_rows, head_dim, head_dim % kL != 0, dp, vbuf, vrows);
  const int64_t d_vecs = (head_dim + kL - 1) / kL;
  for (int64_t r0 = 0; r0 < c.n_rows; r0 += kPvRows) {
    const int nr = static_cast<int>(c.n_rows - r0 < kPvRows ? c.n_rows - r0 : kPvRows);
    for (int64_t i0 = 0; i0 < d_vecs; i0 += kPvDim) {
      const int nd = static_cast<int>(d_vecs - i0 < kPvDim ? d_vecs - i0 : kPvDim);
      with_count<kPvRows>(nr, [&]<int NR>() {
        with_count<kPvDim>(nd, [&]<int ND>() {
          pv_block<P, NR, ND>(s, rp, vrows, c.j0, c.j1, r0, i0 * kL, c.o, dp, ao, ac);
        });
      });
    }
  }
}

void attn_chunk(const AttnChunk& c) {
  if (c.n_rows <= Narrow::kL) {
    attn_chunk_t<Narrow>(c);
  } else {
    attn_chunk_t<Wide>(c);
  }
}

void attn_merge(float* m, float* l, float* o, const float* m2, const float* l2, const float* o2,
                int64_t n_rows, int64_t rp, int64_t dp, float* scratch) {
  using P = Wide;
  using V = P::V;
  float* ao = scratch;
  float* ac = scratch + rp;
  for (int64_t r0 = 0; r0 < n_rows; r0 += P::kL) merge_factors<P>(m, l, m2, l2, ao, ac, r0);
  for (int64_t r = 0; r < n_rows; ++r) {
    const V a = P::set1(ao[r]), c = P::set1(ac[r]);
    for (int64_t i = 0; i < dp; i += P::kL) {
      P::store(o + r * dp + i, P::fma(P::load(o2 + r * dp + i), c, P::mul(P::load(o + r * dp + i), a)));
    }
  }
}

}  // namespace attn
}  // namespace
}  // namespace kiln::cpu
