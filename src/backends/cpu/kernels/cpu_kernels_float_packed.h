// Part of cpu_kernels_impl.h (included from it, once per ISA level): the products of the packed float layout
// (cpu_kernels.h: f32 / f16 / bf16 rows 16 to a group, element i of the 16 rows side by side) with f32 x
// rows. Everything here has internal linkage, as there.
//
// Per element i of k: one load gives element i of the group's 16 rows, converted to f32 (f16: vcvtph2ps;
// bf16: widened and shifted left 16; f32: as is), and each x row's element i, broadcast, goes into one FMA
// per 16 rows. Output (x row c, weight row r) is thus one f32 FMA chain over i = 0 .. k - 1 in order, in lane
// r of one accumulator, whatever the tile: the same bits for any number of x rows or groups per call, at the
// avx2 and the avx512 levels alike, and no horizontal sums.
// - Batches (prefill): tiles of kFTileCols x rows by kBatchGroups groups, every x row of the call through
//   each run of groups in turn, whose weights stay in L1 / L2 while the x rows pass. AVX-512: 8 x rows by 3
//   groups, 24 accumulators of 32 registers; a weight load feeds 8 FMAs, a broadcast 3. This runs at the
//   FMA rate (~220 GFLOP/s on 2 Zen 4 cores, all of what a loop of independent FMAs reaches).
// - Decode (1 or 2 x rows): up to kDecodeGroups groups at once, independent chains while the weights
//   stream from memory at its read bandwidth.
namespace kiln::cpu {
namespace {

#if defined(__AVX2__)
#if defined(__AVX512F__)
using VecF = __m512;
constexpr int kVecLanes = 16;
constexpr int kFTileCols = 8;     // x rows of a batch tile
constexpr int kBatchGroups = 3;   // groups of a batch tile: 24 accumulators + 3 weight vectors
constexpr int kFDecodeCols = 2;   // up to this many x rows take the decode tile
constexpr int kDecodeGroups = 6;  // groups of a decode tile: up to 12 accumulators + 6 weight vectors
KILN_INLINE VecF vset1(float v) { return _mm512_set1_ps(v); }
KILN_INLINE VecF vzero() { return _mm512_setzero_ps(); }
KILN_INLINE VecF vfma(VecF a, VecF b, VecF c) { return _mm512_fmadd_ps(a, b, c); }
// Elements [0, min(n, 16)) of v to y (none when n <= 0).
KILN_INLINE void vstore(float* y, VecF v, int64_t n) {
  if (n >= kVecLanes) {
    _mm512_storeu_ps(y, v);
  } else if (n > 0) {
    _mm512_mask_storeu_ps(y, static_cast<__mmask16>((1u << n) - 1), v);
  }
}
// Element i of 16 rows at p (16 elements of type T, 64-byte aligned for f32, 32 for the 16-bit types).
template <uint32_t T>
KILN_INLINE VecF load_rows(const uint8_t* p) {
  if constexpr (T == kF32) {
    return _mm512_load_ps(reinterpret_cast<const float*>(p));
  } else if constexpr (T == kF16) {
    return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p)));
  } else {
    const __m256i b = _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
  }
}
#else
using VecF = __m256;
constexpr int kVecLanes = 8;
constexpr int kFTileCols = 6;  // 12 accumulators + 2 weight vectors + a broadcast of 16 registers
constexpr int kBatchGroups = 1;
constexpr int kFDecodeCols = 2;
constexpr int kDecodeGroups = 2;  // 16 registers hold no more
KILN_INLINE VecF vset1(float v) { return _mm256_set1_ps(v); }
KILN_INLINE VecF vzero() { return _mm256_setzero_ps(); }
KILN_INLINE VecF vfma(VecF a, VecF b, VecF c) { return _mm256_fmadd_ps(a, b, c); }
KILN_INLINE void vstore(float* y, VecF v, int64_t n) {
  if (n >= kVecLanes) {
    _mm256_storeu_ps(y, v);
  } else if (n > 0) {
    alignas(32) float t[kVecLanes];
    _mm256_store_ps(t, v);
    for (int64_t l = 0; l < n; ++l) y[l] = t[l];
  }
}
template <uint32_t T>
KILN_INLINE VecF load_rows(const uint8_t* p) {
  if constexpr (T == kF32) {
    return _mm256_load_ps(reinterpret_cast<const float*>(p));
  } else if constexpr (T == kF16) {
    return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(p)));
  } else {
    const __m128i b = _mm_load_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16));
  }
}
#endif

// Vectors per group of kPackRows rows; bytes per element of type T.
constexpr int kGroupVecs = kPackRows / kVecLanes;
template <uint32_t T>
constexpr int64_t kElemBytes = T == kF32 ? 4 : 2;

// NX x rows times NG consecutive groups from g0, all of k; y[c] + 16 * g0 gets rows 16 * g0 .. (at most
// ny of them).
template <uint32_t T, int NX, int NG>
void fpacked_tile(const PackedFloatMatrix& w, int64_t g0, const float* const* x, float* const* y,
                  int64_t ny) {
  constexpr int kV = NG * kGroupVecs;                       // accumulators per x row
  constexpr int64_t kStep = kPackRows * kElemBytes<T>;      // bytes per element of a group
  constexpr int64_t kVecBytes = kVecLanes * kElemBytes<T>;  // bytes per vector
  const uint8_t* p[NG];
  KILN_UNROLL
  for (int g = 0; g < NG; ++g) p[g] = w.data + (g0 + g) * w.group_bytes;
  const float* xr[NX];
  KILN_UNROLL
  for (int c = 0; c < NX; ++c) xr[c] = x[c];
  VecF acc[NX][kV];
  KILN_UNROLL
  for (auto& row : acc) KILN_UNROLL
  for (VecF& a : row) a = vzero();
  const int64_t k = w.k;
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC unroll 2
#endif
  for (int64_t i = 0; i < k; ++i) {
    VecF wv[kV];
    KILN_UNROLL
    for (int g = 0; g < NG; ++g) {
      KILN_UNROLL
      for (int v = 0; v < kGroupVecs; ++v)
        wv[g * kGroupVecs + v] = load_rows<T>(p[g] + i * kStep + v * kVecBytes);
    }
    KILN_UNROLL
    for (int c = 0; c < NX; ++c) {
      const VecF xb = vset1(xr[c][i]);
      KILN_UNROLL
      for (int v = 0; v < kV; ++v) acc[c][v] = vfma(wv[v], xb, acc[c][v]);
    }
  }
  KILN_UNROLL
  for (int c = 0; c < NX; ++c) {
    float* out = y[c] + g0 * kPackRows;
    KILN_UNROLL
    for (int v = 0; v < kV; ++v) vstore(out + v * kVecLanes, acc[c][v], ny - v * kVecLanes);
  }
}

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

// n_x x rows times nt (1..NGMax) groups from g0, NXMax x rows a tile; ny as in fpacked_tile.
template <uint32_t T, int NGMax, int NXMax>
void fpacked_cols(const PackedFloatMatrix& w, int64_t g0, int nt, const float* const* x, float* const* y,
                  int n_x, int64_t ny) {
  for (int c0 = 0; c0 < n_x; c0 += NXMax) {
    const int nc = n_x - c0 < NXMax ? n_x - c0 : NXMax;
    with_count<NGMax>(nt, [&]<int NG>() {
      with_count<NXMax>(nc, [&]<int NX>() { fpacked_tile<T, NX, NG>(w, g0, x + c0, y + c0, ny); });
    });
  }
}

template <uint32_t T>
void fdot_packed_t(const PackedFloatMatrix& w, int64_t g0, int ng, const float* const* x, float* const* y,
                   int n_x) {
  const bool decode = n_x <= kFDecodeCols;
  const int step = decode ? kDecodeGroups : kBatchGroups;
  for (int g = 0; g < ng; g += step) {
    const int nt = ng - g < step ? ng - g : step;
    const int64_t ny = w.n - (g0 + g) * kPackRows;  // rows from group g0 + g to the end of the matrix (> 0)
    if (decode) {
      fpacked_cols<T, kDecodeGroups, kFDecodeCols>(w, g0 + g, nt, x, y, n_x, ny);
    } else {
      fpacked_cols<T, kBatchGroups, kFTileCols>(w, g0 + g, nt, x, y, n_x, ny);
    }
  }
}

void fdot_packed(const PackedFloatMatrix& w, int64_t g0, int ng, const float* const* x, float* const* y,
                 int n_x) {
  static_assert(kPackRows % kVecLanes == 0 && kDecodeGroups <= kFPackGroups && kBatchGroups <= kFPackGroups);
  if (w.type == kF16) {
    fdot_packed_t<kF16>(w, g0, ng, x, y, n_x);
  } else if (w.type == kBF16) {
    fdot_packed_t<kBF16>(w, g0, ng, x, y, n_x);
  } else {
    fdot_packed_t<kF32>(w, g0, ng, x, y, n_x);
  }
}
constexpr auto kFdotPacked = fdot_packed;
#else
constexpr void (*kFdotPacked)(const PackedFloatMatrix&, int64_t, int, const float* const*, float* const*,
                              int) = nullptr;
#endif

}  // namespace
}  // namespace kiln::cpu
