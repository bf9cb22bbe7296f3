// Part of cpu_kernels_impl.h (included from it, once per ISA level): the vector types the kernels are written
// over. Each is a struct of static lanewise operations with the same names, so that a kernel is written once,
// as a template over its vector type, and instantiated with the types its level has:
// - Ymm: 8 floats / 32 bytes (AVX2 + FMA + F16C); at the AVX-512 levels too, where a 256-bit FMA issues at
//   twice the rate of a 512-bit one (Zen 4) and the x86 rows of a packed group go in two halves;
// - Zmm: 16 floats / 64 bytes (AVX-512 F/BW; with VNNI, vpdpbusd);
// - Scalar: one float (the portable level; float operations only).
// An operation computes the same bits per lane at every width (FMA where the level has it, round to nearest
// even); only the horizontal sum (hsum) and the integer dot's route differ, and the kernels that use them say
// so. Everything here has internal linkage, as there.
namespace kiln::cpu {
namespace {

// fn.template operator()<N>() for N = n, 1 <= n <= Max: a runtime count as a template argument.
template <int Max, class Fn>
KILN_INLINE void with_count(int n, Fn&& fn) {
  if constexpr (Max > 1) {
    if (n < Max) {
      with_count<Max - 1>(n, fn);
      return;
    }
  }
  fn.template operator()<Max>();
}

// Elements of a float type (GGUF id T) as f32: kL of them from p (f32, f16 or bf16).
template <class S, uint32_t T>
KILN_INLINE typename S::V load_elems(const uint8_t* p) {
  if constexpr (T == kF32) {
    return S::load(reinterpret_cast<const float*>(p));
  } else if constexpr (T == kF16) {
    return S::load_f16(p);
  } else {
    return S::load_bf16(p);
  }
}

#if defined(__AVX2__)
struct Ymm {
  using V = __m256;   // kL floats
  using M = __m256;   // a lane mask
  using I = __m256i;  // 32 bytes / 8 int32
  static constexpr int kL = 8;
  static KILN_INLINE V zero() { return _mm256_setzero_ps(); }
  static KILN_INLINE V set1(float x) { return _mm256_set1_ps(x); }
  static KILN_INLINE V load(const float* p) { return _mm256_loadu_ps(p); }
  static KILN_INLINE void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  // Lanes [0, min(n, kL)) of v to y (none when n <= 0).
  static KILN_INLINE void store_n(float* y, V v, int64_t n) {
    if (n >= kL) {
      _mm256_storeu_ps(y, v);
    } else if (n > 0) {
      alignas(32) float t[kL];
      _mm256_store_ps(t, v);
      for (int64_t l = 0; l < n; ++l) y[l] = t[l];
    }
  }
  static KILN_INLINE V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static KILN_INLINE V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static KILN_INLINE V add(V a, V b) { return _mm256_add_ps(a, b); }
  static KILN_INLINE V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static KILN_INLINE V div(V a, V b) { return _mm256_div_ps(a, b); }
  static KILN_INLINE V max(V a, V b) { return _mm256_max_ps(a, b); }
  static KILN_INLINE M le(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_LE_OQ); }
  static KILN_INLINE M gt(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
  static KILN_INLINE M both(M a, M b) { return _mm256_and_ps(a, b); }
  static KILN_INLINE V select(M m, V a, V b) { return _mm256_blendv_ps(b, a, m); }  // m ? a : b
  static KILN_INLINE V round(V x) {
    return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  // 2^n for integral n in [-126, 127].
  static KILN_INLINE V pow2(V n) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  static KILN_INLINE V abs(V x) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x); }
  static KILN_INLINE V with_sign_of(V mag, V x) {  // |mag| carrying x's sign (mag >= 0)
    return _mm256_or_ps(_mm256_and_ps(_mm256_set1_ps(-0.0f), x), mag);
  }
  // The lanes' sum: the halves added, then pairs within 128 bits.
  static KILN_INLINE float hsum(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // kL elements to f32: f16 / bf16 (2 bytes each), uint8 / int8.
  static KILN_INLINE V load_f16(const void* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static KILN_INLINE V load_bf16(const void* p) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16));
  }
  // kL e4m3fn codes, each as its value / 256: the code's bits moved into an f16's (exponent and mantissa from
  // bit 7: f16's exponent bias is 8 more than e4m3's; sign to bit 15), exact for normal and subnormal codes
  // alike (NaN codes are refused at load). Shifted left by 7, the sign lands on bit 14, the top bit of f16's
  // exponent, which e4m3's never reaches; adding that bit to itself carries it to bit 15.
  static KILN_INLINE V load_e4m3_div256(const void* p) {
    const __m128i t =
        _mm_slli_epi16(_mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))), 7);
    return _mm256_cvtph_ps(_mm_add_epi16(t, _mm_and_si128(t, _mm_set1_epi16(0x4000))));
  }
  static KILN_INLINE V load_u8(const void* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static KILN_INLINE V load_i8(const void* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  // kL uint8 to int32 lanes.
  static KILN_INLINE I load_u8_i32(const void* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  // Integers.
  static KILN_INLINE I izero() { return _mm256_setzero_si256(); }
  static KILN_INLINE I iload(const void* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  static KILN_INLINE I set1_i32(int32_t v) { return _mm256_set1_epi32(v); }
  static KILN_INLINE I set1_i8(int8_t v) { return _mm256_set1_epi8(v); }
  static KILN_INLINE I add_i32(I a, I b) { return _mm256_add_epi32(a, b); }
  static KILN_INLINE V to_float(I a) { return _mm256_cvtepi32_ps(a); }
  static KILN_INLINE I and_(I a, I b) { return _mm256_and_si256(a, b); }
  static KILN_INLINE I xor_(I a, I b) { return _mm256_xor_si256(a, b); }
  static KILN_INLINE I or_and(I a, I b, I m) {
    return _mm256_or_si256(a, _mm256_and_si256(b, m));
  }  // a | b & m
  // v shifted left by S bits (right by -S) in 16-bit lanes.
  template <int S>
  static KILN_INLINE I shift16(I v) {
    if constexpr (S > 0) return _mm256_slli_epi16(v, S);
    if constexpr (S < 0) return _mm256_srli_epi16(v, -S);
    return v;
  }
  // v shifted right by S bits in 32-bit lanes.
  template <int S>
  static KILN_INLINE I shift32_right(I v) {
    return _mm256_srli_epi32(v, S);
  }
  // The 16 bytes at p in each 128-bit lane; byte i of each lane: byte idx[i] & 15 of its lane (idx < 128).
  static KILN_INLINE I broadcast16(const void* p) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static KILN_INLINE I shuffle(I table, I idx) { return _mm256_shuffle_epi8(table, idx); }
  // acc + per int32 lane l the sum of u[4l + t] * s[4l + t] (u unsigned, s signed bytes). vpmaddubsw's int16
  // pair sums saturate past 32767: callers keep u * s pairs below that (quants of at most 6 bits, or |w| and
  // x * sign(w) with |x| <= 127).
  static KILN_INLINE I dot(I acc, I u, I s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
  }
  // Signed bytes w, x as |w| and x * sign(w), for dot (their products are w * x).
  static KILN_INLINE void abs_sign(I& w, I& x) {
    x = _mm256_sign_epi8(x, w);
    w = _mm256_sign_epi8(w, w);
  }
};
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__)
struct Zmm {
  using V = __m512;
  using M = __mmask16;
  using I = __m512i;
  static constexpr int kL = 16;
  static KILN_INLINE V zero() { return _mm512_setzero_ps(); }
  static KILN_INLINE V set1(float x) { return _mm512_set1_ps(x); }
  static KILN_INLINE V load(const float* p) { return _mm512_loadu_ps(p); }
  static KILN_INLINE void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static KILN_INLINE void store_n(float* y, V v, int64_t n) {
    if (n >= kL) {
      _mm512_storeu_ps(y, v);
    } else if (n > 0) {
      _mm512_mask_storeu_ps(y, static_cast<__mmask16>((1u << n) - 1), v);
    }
  }
  static KILN_INLINE V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static KILN_INLINE V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static KILN_INLINE V add(V a, V b) { return _mm512_add_ps(a, b); }
  static KILN_INLINE V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static KILN_INLINE V div(V a, V b) { return _mm512_div_ps(a, b); }
  static KILN_INLINE V max(V a, V b) { return _mm512_max_ps(a, b); }
  static KILN_INLINE M le(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_LE_OQ); }
  static KILN_INLINE M gt(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
  static KILN_INLINE M both(M a, M b) { return static_cast<M>(a & b); }
  static KILN_INLINE V select(M m, V a, V b) { return _mm512_mask_blend_ps(m, b, a); }
  static KILN_INLINE V round(V x) {
    return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static KILN_INLINE V pow2(V n) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
  static KILN_INLINE V abs(V x) { return _mm512_abs_ps(x); }
  static KILN_INLINE V with_sign_of(V mag, V x) {
    const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN));
    return _mm512_castsi512_ps(_mm512_or_si512(sign, _mm512_castps_si512(mag)));
  }
  // The compiler's reduction (halves added, down to one lane).
  static KILN_INLINE float hsum(V v) { return _mm512_reduce_add_ps(v); }
  static KILN_INLINE V load_f16(const void* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static KILN_INLINE V load_bf16(const void* p) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
  }
  static KILN_INLINE V load_e4m3_div256(const void* p) {  // as Ymm's
    const __m256i t =
        _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 7);
    return _mm512_cvtph_ps(_mm256_add_epi16(t, _mm256_and_si256(t, _mm256_set1_epi16(0x4000))));
  }
  static KILN_INLINE V load_u8(const void* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static KILN_INLINE V load_i8(const void* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static KILN_INLINE I load_u8_i32(const void* p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  // The first n < kL lanes of p (the rest zero): floats, or elements of type T as f32.
  static KILN_INLINE __mmask16 first(int64_t n) { return static_cast<__mmask16>((1u << n) - 1); }
  static KILN_INLINE V load_n(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(first(n), p); }
  template <uint32_t T>
  static KILN_INLINE V load_elems_n(const uint8_t* p, int64_t n) {
    if constexpr (T == kF32) {
      return load_n(reinterpret_cast<const float*>(p), n);
    } else {
      const __m256i b = _mm256_maskz_loadu_epi16(first(n), p);
      if constexpr (T == kF16) return _mm512_cvtph_ps(b);
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
    }
  }
  static KILN_INLINE I izero() { return _mm512_setzero_si512(); }
  static KILN_INLINE I iload(const void* p) { return _mm512_loadu_si512(p); }
  static KILN_INLINE I set1_i32(int32_t v) { return _mm512_set1_epi32(v); }
  static KILN_INLINE I set1_i8(int8_t v) { return _mm512_set1_epi8(v); }
  static KILN_INLINE I add_i32(I a, I b) { return _mm512_add_epi32(a, b); }
  static KILN_INLINE V to_float(I a) { return _mm512_cvtepi32_ps(a); }
  static KILN_INLINE I and_(I a, I b) { return _mm512_and_si512(a, b); }
  static KILN_INLINE I xor_(I a, I b) { return _mm512_xor_si512(a, b); }
  static KILN_INLINE I or_and(I a, I b, I m) { return _mm512_ternarylogic_epi32(a, b, m, 0xF8); }
  template <int S>
  static KILN_INLINE I shift16(I v) {
    if constexpr (S > 0) return _mm512_slli_epi16(v, S);
    if constexpr (S < 0) return _mm512_srli_epi16(v, -S);
    return v;
  }
  template <int S>
  static KILN_INLINE I shift32_right(I v) {
    return _mm512_srli_epi32(v, S);
  }
  static KILN_INLINE I broadcast16(const void* p) {
    return _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static KILN_INLINE I shuffle(I table, I idx) { return _mm512_shuffle_epi8(table, idx); }
  static KILN_INLINE I dot(I acc, I u, I s) {
#if defined(__AVX512VNNI__)
    return _mm512_dpbusd_epi32(acc, u, s);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
#endif
  }
  static KILN_INLINE void abs_sign(I& w, I& x) {
    const __mmask64 neg = _mm512_movepi8_mask(w);
    w = _mm512_abs_epi8(w);  // -128 becomes 128 as unsigned
    x = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
  }
};
#endif

// The portable level: a "vector" of one float. No FMA instruction: fma rounds twice (the build does not
// contract, so the product and the sum stay two operations).
struct Scalar {
  using V = float;
  using M = bool;
  static constexpr int kL = 1;
  static KILN_INLINE V set1(float x) { return x; }
  static KILN_INLINE V load(const float* p) { return *p; }
  static KILN_INLINE void store(float* p, V v) { *p = v; }
  static KILN_INLINE V fma(V a, V b, V c) { return a * b + c; }
  static KILN_INLINE V mul(V a, V b) { return a * b; }
  static KILN_INLINE V add(V a, V b) { return a + b; }
  static KILN_INLINE V sub(V a, V b) { return a - b; }
  static KILN_INLINE V div(V a, V b) { return a / b; }
  static KILN_INLINE V max(V a, V b) { return a > b ? a : b; }
  static KILN_INLINE M le(V a, V b) { return a <= b; }
  static KILN_INLINE M gt(V a, V b) { return a > b; }
  static KILN_INLINE M both(M a, M b) { return a && b; }
  static KILN_INLINE V select(M m, V a, V b) { return m ? a : b; }
  // Round to nearest even: |x| < 2^22 here (at most 127 in magnitude).
  static KILN_INLINE V round(V x) { return (x + 12582912.0f) - 12582912.0f; }
  static KILN_INLINE V pow2(V n) {
    const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  static KILN_INLINE V abs(V x) { return x < 0.0f ? -x : x; }
  static KILN_INLINE V with_sign_of(V mag, V x) { return x < 0.0f ? -mag : mag; }
};

}  // namespace
}  // namespace kiln::cpu
