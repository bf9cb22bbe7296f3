// Row quantizers of IQ3_XXS and IQ3_S (ggml: quantize_row_iq3_xxs_impl, quantize_row_iq3_s_impl). Per
// super-block of 256: sub-blocks of 32 (8 groups of 4) get signs, a scale and grid points from the shared
// search (iq_search.h); the sub-block scales are coded in 4 bits against d = max scale / 31, and d is stored
// with ggml's small upward correction.
#include "core/quant/fp_contract_off.h"
// (the line above must stay first)
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/half.h"
#include "core/quant/iq_search.h"
#include "core/quant/quant_blocks.h"

namespace kiln::quant {
namespace {

using iq::max_of;

int scale_nibble(float id, float scale) { return iq::clamp_level(nearest_int(0.5f * (id * scale - 1)), 15); }

// IQ3_XXS: 7-bit sign codes (even parity) and 8-bit grid indices; the scale nibble and the 4 sign codes of a
// sub-block share one uint32. IQ3_S: 8 sign bits per group of 8 and 9-bit grid indices (bit 8 in qh); trial
// scales and the final refit differ as GridSearch records.
template <class Block>
void quantize_row_iq3(const float* x, void* y, int64_t n, const float* qw_row) {
  constexpr bool kXXS = std::is_same_v<Block, BlockIQ3_XXS>;
  const IqLattice& lat = iq_lattice(kXXS ? IqLatticeKind::iq3_xxs : IqLatticeKind::iq3_s);
  constexpr int kMaxQ = 8;
  constexpr iq::GridSearch kSearch = kXXS ? iq::GridSearch{kMaxQ, -15, 15, 0.2f, true, false, false}
                                          : iq::GridSearch{kMaxQ, -9, 9, 0.2f, false, true, false};
  for (int64_t ibl = 0; ibl < n / kQK_K; ++ibl) {
    const float* xbl = x + kQK_K * ibl;
    Block b{};
    uint32_t scales_and_signs[kQK_K / 32] = {};  // IQ3_XXS
    float scales[kQK_K / 32];
    float max_scale = 0;
    const float sigma2 = 2 * iq::sum_squares(xbl, kQK_K) / kQK_K;
    for (int ib = 0; ib < kQK_K / 32; ++ib) {
      const float* xb = xbl + 32 * ib;
      float weight[32], waux[32], xval[32];
      int8_t L[32] = {};
      uint8_t signs[4];
      if (qw_row != nullptr) {
        iq::importance_weights(qw_row + kQK_K * ibl + 32 * ib, xb, sigma2, 32, weight);
      } else {
        for (int i = 0; i < 32; ++i) weight[i] = xb[i] * xb[i];
      }
      for (int i = 0; i < 32; ++i) waux[i] = std::sqrt(weight[i]);
      for (int k = 0; k < 4; ++k) signs[k] = iq::group_signs(xb + 8 * k, weight + 8 * k, xval + 8 * k, kXXS);
      float max = xval[0];
      for (int i = 1; i < 32; ++i) max = max_of(max, xval[i]);
      scales[ib] = 0;
      if (kXXS ? max < 1e-8f : max == 0) continue;
      float scale = iq::grid_search(lat, kSearch, 32, xval, weight, waux, max, max / (2 * kMaxQ - 1), L);
      if (scale < 0) {
        scale = -scale;
        for (auto& s : signs) s = static_cast<uint8_t>(~s & (kXXS ? 127 : 255));
      }
      for (int k = 0; k < 8; ++k) {
        const int g = iq::grid_index_of(lat, L + 4 * k);
        b.qs[8 * ib + k] = static_cast<uint8_t>(g & 255);
        if constexpr (!kXXS) b.qh[ib] |= static_cast<uint8_t>((g >> 8) << k);
      }
      if constexpr (kXXS) {
        scales_and_signs[ib] =
            signs[0] | signs[1] << 7 | signs[2] << 14 | static_cast<uint32_t>(signs[3]) << 21;
      } else {
        std::memcpy(b.signs + 4 * ib, signs, 4);
      }
      scales[ib] = scale;
      max_scale = max_of(max_scale, scale);
    }
    if (max_scale != 0) {
      const float d = max_scale / 31;
      b.d = f32_to_f16(d * (kXXS ? 1.0125f : 1.033f));
      const float id = 1 / d;
      for (int ib = 0; ib < kQK_K / 32; ++ib) {
        const auto l = static_cast<uint32_t>(scale_nibble(id, scales[ib]));
        if constexpr (kXXS) {
          scales_and_signs[ib] |= l << 28;
        } else {
          b.scales[ib / 2] |= static_cast<uint8_t>(l << (4 * (ib % 2)));
        }
      }
      if constexpr (kXXS) std::memcpy(b.qs + kQK_K / 4, scales_and_signs, sizeof(scales_and_signs));
    } else if constexpr (kXXS) {
      std::memset(b.qs, 0, sizeof(b.qs));
    }
    store_block(y, ibl, b);
  }
}

}  // namespace

void quantize_rows_iq3_xxs(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                           const float* importance) {
  iq::quantize_rows_with<BlockIQ3_XXS>(quantize_row_iq3<BlockIQ3_XXS>, src, dst, n_rows, n_per_row,
                                       importance);
}

void quantize_rows_iq3_s(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                         const float* importance) {
  iq::quantize_rows_with<BlockIQ3_S>(quantize_row_iq3<BlockIQ3_S>, src, dst, n_rows, n_per_row, importance);
}

}  // namespace kiln::quant
