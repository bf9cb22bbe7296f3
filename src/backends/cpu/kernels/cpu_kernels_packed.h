// Part of cpu_kernels_impl.h (included from it, once per ISA level): the products of the packed layout
// (cpu_kernels.h) with quantized x rows. Everything here has internal linkage, as there.
namespace kiln::cpu {
namespace {

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// One group of kPackRows rows against NX x rows. Per sub-block and x row: 8 vpdpbusd (4 quants of 16 rows
// times 4 broadcast x quants each) in two chains (elements 0..15 and 16..31), then the scales: one FMA per
// chain into the 16 rows' f32 accumulators. Each x row's arithmetic is the same whatever NX is, so a token's
// result does not depend on its batch.
template <int NX, bool kQ4, uint32_t kScales>
void packed_group(const PackedMatrix& w, int64_t g, const QRowX* x, float* out) {
  constexpr int64_t kScaleBytes = kScales == kPackDM ? 64 : 32, kQuantBytes = kQ4 ? 256 : 512;
  constexpr bool kHeader = kScales == kPackK32 || kScales == kPackK16;
  const uint8_t* p = w.data + g * w.group_bytes;
  const int64_t n_sub = w.k / kSub;
  const __m512i m4 = _mm512_set1_epi8(0x0F);
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
    const uint8_t* sc = p;
    const uint8_t* qs = p + (ns * kScaleBytes + 63) / 64 * 64;
    p = qs + ns * kQuantBytes;
    for (int64_t i = 0; i < ns; ++i, sc += kScaleBytes, qs += kQuantBytes) {
      const int64_t s = s0 + i;
      __m512i wq[8];
      if constexpr (kQ4) {
        KILN_UNROLL
        for (int pc = 0; pc < 4; ++pc) {
          const __m512i v = _mm512_load_si512(qs + 64 * pc);
          wq[pc] = _mm512_and_si512(v, m4);
          wq[4 + pc] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        }
      } else {
        KILN_UNROLL
        for (int pc = 0; pc < 8; ++pc) wq[pc] = _mm512_load_si512(qs + 64 * pc);
      }
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
        const __m512 dx = _mm512_set1_ps(x[j].d[s * 8]);
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

template <bool kQ4, uint32_t kScales>
void packed_cols(const PackedMatrix& w, int64_t g, const QRowX* x, int n_x, float* out) {
  switch (n_x) {
    case 1: packed_group<1, kQ4, kScales>(w, g, x, out); return;
    case 2: packed_group<2, kQ4, kScales>(w, g, x, out); return;
    case 3: packed_group<3, kQ4, kScales>(w, g, x, out); return;
    default: packed_group<4, kQ4, kScales>(w, g, x, out); return;
  }
}

void qdot_packed(const PackedMatrix& w, int64_t g, const QRowX* x, int n_x, float* out) {
  static_assert(kPackRows == 16 && kPackCols == 4);
  const uint32_t sel = (w.q4 ? 4u : 0u) | w.scales;
  switch (sel) {
    case 4 | kPackD: packed_cols<true, kPackD>(w, g, x, n_x, out); return;
    case 4 | kPackDM: packed_cols<true, kPackDM>(w, g, x, n_x, out); return;
    case 4 | kPackK32: packed_cols<true, kPackK32>(w, g, x, n_x, out); return;
    case 4 | kPackK16: packed_cols<true, kPackK16>(w, g, x, n_x, out); return;
    case kPackD: packed_cols<false, kPackD>(w, g, x, n_x, out); return;
    case kPackDM: packed_cols<false, kPackDM>(w, g, x, n_x, out); return;
    case kPackK32: packed_cols<false, kPackK32>(w, g, x, n_x, out); return;
    default: packed_cols<false, kPackK16>(w, g, x, n_x, out); return;
  }
}
constexpr auto kQdotPacked = qdot_packed;
#else
constexpr void (*kQdotPacked)(const PackedMatrix&, int64_t, const QRowX*, int, float*) = nullptr;
#endif

}  // namespace
}  // namespace kiln::cpu
