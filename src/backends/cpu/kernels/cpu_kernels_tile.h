// Part of cpu_kernels_impl.h (included from it, once per ISA level): the products of unpacked weight tiles
// (QTileW) with quantized x rows, and of float weight rows with f32 x rows, over the level's widest vector
// (cpu_kernels_simd.h). Everything here has internal linkage, as there.
namespace kiln::cpu {
namespace {

// ---- integer products --------------------------------------------------------------------------------

// ---- integer products --------------------------------------------------------------------------------

// The offsets' part of the products of kTileRows weight rows with one x row: sum over the ng groups of 16 of
// m_r[g] * s[g], in 4 lanes in a fixed order. The direct and the tile kernels both call it, so that a token's
// result does not depend on how many share its batch. ng is a multiple of 4 (rows are padded to kKPad).
[[maybe_unused]] void offsets4(const float* const* m, const float* s, int64_t ng, float* out) {
#if defined(__AVX2__)
  __m128 acc[kTileRows];
  KILN_UNROLL
  for (int r = 0; r < kTileRows; ++r) acc[r] = _mm_setzero_ps();
  for (int64_t g = 0; g < ng; g += 4) {
    const __m128 sv = _mm_loadu_ps(s + g);
    KILN_UNROLL
    for (int r = 0; r < kTileRows; ++r) acc[r] = _mm_fmadd_ps(_mm_loadu_ps(m[r] + g), sv, acc[r]);
  }
  KILN_UNROLL
  for (int r = 0; r < kTileRows; ++r) {
    __m128 v = _mm_add_ps(acc[r], _mm_movehl_ps(acc[r], acc[r]));
    v = _mm_add_ss(v, _mm_movehdup_ps(v));
    out[r] = _mm_cvtss_f32(v);
  }
#else
  for (int r = 0; r < kTileRows; ++r) {
    float acc[4] = {0, 0, 0, 0};
    for (int64_t g = 0; g < ng; g += 4) {
      for (int l = 0; l < 4; ++l) acc[l] += m[r][g + l] * s[g + l];
    }
    out[r] = (acc[0] + acc[2]) + (acc[1] + acc[3]);
  }
#endif
}

// offsets4 for the rows of an unpacked tile.
[[maybe_unused]] void tile_offsets(const QTileW& w, const QRowX& x, float* out) {
  const float* m[kTileRows];
  for (int r = 0; r < kTileRows; ++r) m[r] = w.m + r * w.kp / 16;
  offsets4(m, x.s, w.kp / 16, out);
}

// Element i of a float row of type T (f32, f16, bf16) as f32.
template <uint32_t T>
float w_at(const uint8_t* row, int64_t i) {
  if constexpr (T == kF32) return reinterpret_cast<const float*>(row)[i];
  uint16_t h;
  std::memcpy(&h, row + 2 * i, 2);
  return T == kF16 ? h2f(h) : bf2f(h);
}

#if defined(__AVX2__)
// The tiles' vector: 4 * kL quants a step (Zmm: two sub-blocks, Ymm: one); int32 lane l sums quants
// 4l .. 4l + 3.
#if defined(__AVX512BW__)
using TileVec = Zmm;
constexpr int kColsPerCall = 4;  // 16 accumulators of 32 registers
#else
using TileVec = Ymm;
constexpr int kColsPerCall = 2;  // 8 accumulators of 16 registers
#endif

// kTileRows unpacked rows times NX x rows over [w.kb, w.ke): per step, row and x row, the exact int32 dot
// products times the x and the w lane scales into one f32 accumulator; then the lanes' sum (S::hsum) plus the
// offsets' part (offsets4).
template <int NX, bool kSigned, bool kHasM>
void qdot_tile(const QTileW& w, const QRowX* x, float* out) {
  using S = TileVec;
  const int64_t kp = w.kp;
  typename S::V acc[kTileRows][NX];
  KILN_UNROLL
  for (auto& row : acc) KILN_UNROLL
  for (auto& a : row) a = S::zero();
  for (int64_t i = w.kb; i < w.ke; i += 4 * S::kL) {
    KILN_UNROLL
    for (int r = 0; r < kTileRows; ++r) {
      const auto wq = S::iload(w.q + r * kp + i);
      const auto wd = S::load(w.d + r * kp / 4 + i / 4);
      KILN_UNROLL
      for (int c = 0; c < NX; ++c) {
        auto wu = wq;
        auto xs = S::iload(x[c].q + i);
        if constexpr (kSigned) S::abs_sign(wu, xs);
        const auto p = S::mul(S::to_float(S::dot(S::izero(), wu, xs)), S::load(x[c].d + i / 4));
        acc[r][c] = S::fma(p, wd, acc[r][c]);
      }
    }
  }
  KILN_UNROLL
  for (int c = 0; c < NX; ++c) {
    float accm[kTileRows] = {0, 0, 0, 0};
    if constexpr (kHasM) tile_offsets(w, x[c], accm);
    KILN_UNROLL
    for (int r = 0; r < kTileRows; ++r) out[c * kTileRows + r] = S::hsum(acc[r][c]) + accm[r];
  }
}

// acc[r][c] += element i .. i + kL of row r times x row c's (kFull; else only the first n, the rest zero).
template <class S, uint32_t T, int NX, bool kFull>
KILN_INLINE void fdot_step(typename S::V (&acc)[kTileRows][NX], const uint8_t* const* rows,
                           const float* const* x, int64_t i, int64_t n) {
  constexpr int64_t kElem = T == kF32 ? 4 : 2;
  typename S::V xv[NX];
  KILN_UNROLL
  for (int c = 0; c < NX; ++c) {
    if constexpr (kFull) {
      xv[c] = S::load(x[c] + i);
    } else {
      xv[c] = S::load_n(x[c] + i, n);
    }
  }
  KILN_UNROLL
  for (int r = 0; r < kTileRows; ++r) {
    typename S::V wv;
    if constexpr (kFull) {
      wv = load_elems<S, T>(rows[r] + i * kElem);
    } else {
      wv = S::template load_elems_n<T>(rows[r] + i * kElem, n);
    }
    KILN_UNROLL
    for (int c = 0; c < NX; ++c) acc[r][c] = S::fma(wv, xv[c], acc[r][c]);
  }
}

// kTileRows float rows times NX x rows over k elements: one f32 FMA chain per lane, then the lanes' sum. The
// last k % kL elements: Zmm takes them in a masked step, Ymm adds them one at a time after the sum.
template <uint32_t T, int NX>
void fdot_tile(const uint8_t* const* rows, const float* const* x, int64_t k, float* out) {
  using S = TileVec;
  typename S::V acc[kTileRows][NX];
  KILN_UNROLL
  for (auto& row : acc) KILN_UNROLL
  for (auto& a : row) a = S::zero();
  int64_t i = 0;
  for (; i + S::kL <= k; i += S::kL) fdot_step<S, T, NX, true>(acc, rows, x, i, S::kL);
  constexpr bool kMasked = S::kL == 16;
  if constexpr (kMasked) {
    if (i < k) fdot_step<S, T, NX, false>(acc, rows, x, i, k - i);
  }
  KILN_UNROLL
  for (int c = 0; c < NX; ++c) {
    KILN_UNROLL
    for (int r = 0; r < kTileRows; ++r) {
      if constexpr (kMasked) {
        out[c * kTileRows + r] = S::hsum(acc[r][c]);
      } else {
        float tail = 0.0f;
        for (int64_t j = i; j < k; ++j) tail += w_at<T>(rows[r], j) * x[c][j];
        out[c * kTileRows + r] = S::hsum(acc[r][c]) + tail;
      }
    }
  }
}
#else
constexpr int kColsPerCall = 4;

template <int NX, bool kSigned, bool kHasM>
void qdot_tile(const QTileW& w, const QRowX* x, float* out) {
  const int64_t kp = w.kp;
  KILN_UNROLL
  for (int c = 0; c < NX; ++c) {
    KILN_UNROLL
    for (int r = 0; r < kTileRows; ++r) {
      const uint8_t* wq = w.q + r * kp;
      const float* wd = w.d + r * kp / 4;
      float acc = 0.0f;
      for (int64_t g = w.kb / 16; g < w.ke / 16; ++g) {  // one int32 sum per 16 quants, exact
        int32_t sum = 0;
        for (int j = 0; j < 16; ++j) {
          const int32_t wv = kSigned ? static_cast<int8_t>(wq[g * 16 + j]) : wq[g * 16 + j];
          sum += wv * x[c].q[g * 16 + j];
        }
        acc += static_cast<float>(sum) * x[c].d[g * 4] * wd[g * 4];
        if constexpr (kHasM) acc += w.m[r * kp / 16 + g] * x[c].s[g];
      }
      out[c * kTileRows + r] = acc;
    }
  }
}

// Eight interleaved partial sums per product (vectorisable without reassociation flags).
template <uint32_t T, int NX>
void fdot_tile(const uint8_t* const* rows, const float* const* x, int64_t k, float* out) {
  KILN_UNROLL
  for (int c = 0; c < NX; ++c) {
    KILN_UNROLL
    for (int r = 0; r < kTileRows; ++r) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t i = 0;
      for (; i + 8 <= k; i += 8) {
        for (int l = 0; l < 8; ++l) acc[l] += w_at<T>(rows[r], i + l) * x[c][i + l];
      }
      for (; i < k; ++i) acc[0] += w_at<T>(rows[r], i) * x[c][i];
      out[c * kTileRows + r] =
          ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    }
  }
}
#endif

// The x rows in calls of at most kColsPerCall.
template <class Fn>
KILN_INLINE void for_col_calls(int n_x, Fn&& fn) {
  for (int c0 = 0; c0 < n_x; c0 += kColsPerCall) {
    const int nc = n_x - c0 < kColsPerCall ? n_x - c0 : kColsPerCall;
    with_count<kColsPerCall>(nc, [&]<int NX>() { fn.template operator()<NX>(c0); });
  }
}

void qdot(const QTileW& w, const QRowX* x, int n_x, bool is_signed, bool has_m, float* out) {
  auto cols = [&]<bool kSigned, bool kHasM>() {
    for_col_calls(n_x,
                  [&]<int NX>(int c0) { qdot_tile<NX, kSigned, kHasM>(w, x + c0, out + c0 * kTileRows); });
  };
  if (is_signed) {
    has_m ? cols.template operator()<true, true>() : cols.template operator()<true, false>();
  } else {
    has_m ? cols.template operator()<false, true>() : cols.template operator()<false, false>();
  }
}

// ---- float products ----------------------------------------------------------------------------------

void fdot(uint32_t t, const uint8_t* const* rows, const float* const* x, int n_x, int64_t k, float* out) {
  auto cols = [&]<uint32_t T>() {
    for_col_calls(n_x, [&]<int NX>(int c0) { fdot_tile<T, NX>(rows, x + c0, k, out + c0 * kTileRows); });
  };
  if (t == kF16) {
    cols.template operator()<kF16>();
  } else if (t == kBF16) {
    cols.template operator()<kBF16>();
  } else {
    cols.template operator()<kF32>();
  }
}

}  // namespace
}  // namespace kiln::cpu
