// Part of cpu_kernels_impl.h (included from it, once per ISA level): the products of the packed float layout
// (cpu_kernels.h: f32 / f16 / bf16 rows 16 to a group, element i of the 16 rows side by side; f8_e4m3 codes
// so, with their block scales after them) with f32 x rows. Everything here has internal linkage, as there.
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
using FVec = Zmm;
constexpr int kFTileCols = 8;     // x rows of a batch tile
constexpr int kBatchGroups = 3;   // groups of a batch tile: 24 accumulators + 3 weight vectors
constexpr int kFDecodeCols = 2;   // up to this many x rows take the decode tile
constexpr int kDecodeGroups = 6;  // groups of a decode tile: up to 12 accumulators + 6 weight vectors
#else
using FVec = Ymm;
constexpr int kFTileCols = 6;  // 12 accumulators + 2 weight vectors + a broadcast of 16 registers
constexpr int kBatchGroups = 1;
constexpr int kFDecodeCols = 2;
constexpr int kDecodeGroups = 2;  // 16 registers hold no more
#endif
using VecF = FVec::V;
constexpr int kVecLanes = FVec::kL;

// Vectors per group of kPackRows rows; bytes per element of type T.
constexpr int kGroupVecs = kPackRows / kVecLanes;
template <uint32_t T>
constexpr int64_t kElemBytes = T == kF32 ? 4 : 2;

// acc[c][v] += w(g, v, i) * x[c][i] for i in [i0, i1), x rows xr, w's 16-row vectors from load(g, v, i).
template <int NX, int NG, class Load>
KILN_INLINE void fma_run(VecF (&acc)[NX][NG * kGroupVecs], const float* const* xr, int64_t i0, int64_t i1,
                         Load&& load) {
  constexpr int kV = NG * kGroupVecs;
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC unroll 2
#endif
  for (int64_t i = i0; i < i1; ++i) {
    VecF wv[kV];
    KILN_UNROLL
    for (int g = 0; g < NG; ++g) {
      KILN_UNROLL
      for (int v = 0; v < kGroupVecs; ++v) wv[g * kGroupVecs + v] = load(g, v, i);
    }
    KILN_UNROLL
    for (int c = 0; c < NX; ++c) {
      const VecF xb = FVec::set1(xr[c][i]);
      KILN_UNROLL
      for (int v = 0; v < kV; ++v) acc[c][v] = FVec::fma(wv[v], xb, acc[c][v]);
    }
  }
}

// NX x rows times NG consecutive groups from g0, all of k; y[c] + 16 * g0 gets rows 16 * g0 .. (at most
// ny of them). f8_e4m3 (packed_f8_group_bytes): each block of 32 elements summed apart (codes as value / 256
// times x), then added into the accumulators times the 16 rows' block scales (times 256). Either way a fixed
// order per output, whatever the tile. conv (f8_e4m3, not null): the codes' values / 256 already in f32,
// [NG][k][kPackRows] (a batch converts a group's codes once for all its x tiles): the same values and bits.
template <uint32_t T, int NX, int NG>
void fpacked_tile(const PackedFloatMatrix& w, int64_t g0, const float* const* x, float* const* y, int64_t ny,
                  const float* conv) {
  constexpr int kV = NG * kGroupVecs;  // accumulators per x row
  const int64_t k = w.k;
  const uint8_t* p[NG];
  KILN_UNROLL
  for (int g = 0; g < NG; ++g) p[g] = w.data + (g0 + g) * w.group_bytes;
  VecF acc[NX][kV];
  KILN_UNROLL
  for (auto& row : acc) KILN_UNROLL
  for (VecF& a : row) a = FVec::zero();
  if constexpr (T == kF8E4M3) {
    for (int64_t b = 0; b < k; b += 32) {
      VecF blk[NX][kV];
      KILN_UNROLL
      for (auto& row : blk) KILN_UNROLL
      for (VecF& a : row) a = FVec::zero();
      if (conv != nullptr) {
        fma_run<NX, NG>(blk, x, b, b + 32, [&](int g, int v, int64_t i) {
          return FVec::load(conv + (g * k + i) * kPackRows + v * kVecLanes);
        });
      } else {
        fma_run<NX, NG>(blk, x, b, b + 32, [&](int g, int v, int64_t i) {
          return FVec::load_e4m3_div256(p[g] + i * kPackRows + v * kVecLanes);
        });
      }
      VecF sv[kV];
      KILN_UNROLL
      for (int g = 0; g < NG; ++g) {
        const auto* scales =
            reinterpret_cast<const float*>(p[g] + packed_f8_scales_offset(k)) + b / 32 * kPackRows;
        KILN_UNROLL
        for (int v = 0; v < kGroupVecs; ++v) sv[g * kGroupVecs + v] = FVec::load(scales + v * kVecLanes);
      }
      KILN_UNROLL
      for (int c = 0; c < NX; ++c) {
        KILN_UNROLL
        for (int v = 0; v < kV; ++v) acc[c][v] = FVec::fma(blk[c][v], sv[v], acc[c][v]);
      }
    }
  } else {
    constexpr int64_t kStep = kPackRows * kElemBytes<T>;      // bytes per element of a group
    constexpr int64_t kVecBytes = kVecLanes * kElemBytes<T>;  // bytes per vector
    fma_run<NX, NG>(acc, x, 0, k, [&](int g, int v, int64_t i) {
      return load_elems<FVec, T>(p[g] + i * kStep + v * kVecBytes);
    });
  }
  KILN_UNROLL
  for (int c = 0; c < NX; ++c) {
    float* out = y[c] + g0 * kPackRows;
    KILN_UNROLL
    for (int v = 0; v < kV; ++v) FVec::store_n(out + v * kVecLanes, acc[c][v], ny - v * kVecLanes);
  }
}

// n_x x rows times nt (1..NGMax) groups from g0, NXMax x rows a tile; ny as in fpacked_tile.
template <uint32_t T, int NGMax, int NXMax>
void fpacked_cols(const PackedFloatMatrix& w, int64_t g0, int nt, const float* const* x, float* const* y,
                  int n_x, int64_t ny, const float* conv = nullptr) {
  for (int c0 = 0; c0 < n_x; c0 += NXMax) {
    const int nc = n_x - c0 < NXMax ? n_x - c0 : NXMax;
    with_count<NGMax>(nt, [&]<int NG>() {
      with_count<NXMax>(nc, [&]<int NX>() { fpacked_tile<T, NX, NG>(w, g0, x + c0, y + c0, ny, conv); });
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
    } else if constexpr (T == kF8E4M3) {
      // The batch's x tiles all read the groups' codes: converted once, here.
      thread_local std::vector<float> conv;
      conv.resize(static_cast<size_t>(nt * w.k * kPackRows));
      for (int t = 0; t < nt; ++t) {
        const uint8_t* codes = w.data + (g0 + g + t) * w.group_bytes;
        for (int64_t i = 0; i < w.k * kPackRows; i += kVecLanes)
          FVec::store(conv.data() + t * w.k * kPackRows + i, FVec::load_e4m3_div256(codes + i));
      }
      fpacked_cols<T, kBatchGroups, kFTileCols>(w, g0 + g, nt, x, y, n_x, ny, conv.data());
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
  } else if (w.type == kF8E4M3) {
    fdot_packed_t<kF8E4M3>(w, g0, ng, x, y, n_x);
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
