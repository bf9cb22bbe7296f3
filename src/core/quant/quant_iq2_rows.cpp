// Row quantizers of IQ2_XXS, IQ2_XS and IQ2_S (ggml: quantize_row_iq2_xxs_impl, quantize_row_iq2_xs_impl,
// quantize_row_iq2_s_impl). Per super-block of 256: each sub-block gets signs, a scale and grid points from
// the shared search (iq_search.h); the sub-block scales are then coded in 4 bits against d = max scale / 31.
#include "core/quant/fp_contract_off.h"
// (the line above must stay first)
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/half.h"
#include "core/quant/iq_search.h"
#include "core/quant/quant_blocks.h"
#include "core/status.h"

namespace kiln::quant {
namespace {

using iq::max_of;

// The 4-bit code of a sub-block scale against the super-block inverse scale id.
int scale_nibble(float id, float scale) { return iq::clamp_level(nearest_int(0.5f * (id * scale - 1)), 15); }

// The sign step of a sub-block of n (a multiple of 8): xval = |x| and one sign byte per group of 8.
void sub_block_signs(int n, const float* x, const float* weight, bool even_parity, float* xval,
                     uint8_t* signs) {
  for (int k = 0; k < n / 8; ++k)
    signs[k] = iq::group_signs(x + 8 * k, weight + 8 * k, xval + 8 * k, even_parity);
}

// A negative least-squares scale (which ggml notes should not happen) is made positive by flipping signs.
void make_scale_positive(float* scale, int n_groups, uint8_t code_mask, uint8_t* signs) {
  if (*scale < 0) {
    *scale = -*scale;
    for (int k = 0; k < n_groups; ++k) signs[k] = static_cast<uint8_t>(~signs[k] & code_mask);
  }
}

void quantize_row_iq2_xxs(const float* x, void* y, int64_t n, const float* qw_row) {
  const IqLattice& lat = iq_lattice(IqLatticeKind::iq2_xxs);
  constexpr int kMaxQ = 3;
  constexpr iq::GridSearch kSearch{kMaxQ, -6, 6, 0.1f, false, true, true};
  for (int64_t ibl = 0; ibl < n / kQK_K; ++ibl) {
    const float* xbl = x + kQK_K * ibl;
    uint32_t q2[2 * (kQK_K / 32)] = {};
    float scales[kQK_K / 32];
    float max_scale = 0;
    const float sigma2 = iq::sum_squares(xbl, kQK_K) / kQK_K;
    for (int ib = 0; ib < kQK_K / 32; ++ib) {
      const float* xb = xbl + 32 * ib;
      float weight[32], waux[32], xval[32];
      int8_t L[32];
      uint8_t signs[4];
      iq::importance_weights(qw_row + kQK_K * ibl + 32 * ib, xb, sigma2, 32, weight);
      for (int i = 0; i < 32; ++i) waux[i] = std::sqrt(weight[i]);
      sub_block_signs(32, xb, weight, true, xval, signs);
      float max = xval[0];
      for (int i = 1; i < 32; ++i) max = max_of(max, xval[i]);
      scales[ib] = 0;
      if (max < 1e-15f) continue;
      float scale = search_scale_positive(32, kMaxQ + 1, xval, weight, reinterpret_cast<uint8_t*>(L));
      const float eff_max = scale * kMaxQ;
      if (eff_max <= 0) continue;
      scale = iq::grid_search(lat, kSearch, 32, xval, weight, waux, eff_max, scale, L);
      make_scale_positive(&scale, 4, 127, signs);
      for (int k = 0; k < 4; ++k) {
        q2[2 * ib] |= static_cast<uint32_t>(iq::grid_index_of(lat, L + 8 * k)) << (8 * k);
        q2[2 * ib + 1] |= static_cast<uint32_t>(signs[k]) << (7 * k);
      }
      scales[ib] = scale;
      max_scale = max_of(max_scale, scale);
    }
    BlockIQ2_XXS b{};
    if (max_scale != 0) {
      const float d = max_scale / 31;
      b.d = f32_to_f16(d);
      const float id = 1 / d;
      for (int ib = 0; ib < kQK_K / 32; ++ib)
        q2[2 * ib + 1] |= static_cast<uint32_t>(scale_nibble(id, scales[ib])) << 28;
      std::memcpy(b.qs, q2, sizeof(b.qs));
    }
    store_block(y, ibl, b);
  }
}

// IQ2_XS and IQ2_S: sub-blocks of 16 (two groups of 8), the same search; IQ2_XS codes 7-bit signs with a
// 9-bit grid index in one uint16, IQ2_S stores 8 sign bits and a 10-bit index split over qs and qh.
template <class Block>
void quantize_row_iq2_16(const float* x, void* y, int64_t n, const float* qw_row) {
  constexpr bool kXS = std::is_same_v<Block, BlockIQ2_XS>;
  const IqLattice& lat = iq_lattice(kXS ? IqLatticeKind::iq2_xs : IqLatticeKind::iq2_s);
  constexpr int kMaxQ = 3;
  constexpr iq::GridSearch kSearch{kMaxQ, -9, 9, 0.1f, true, false, false};
  for (int64_t ibl = 0; ibl < n / kQK_K; ++ibl) {
    const float* xbl = x + kQK_K * ibl;
    Block b{};
    float scales[kQK_K / 16];
    float max_scale = 0;
    const float sum_x2 = iq::sum_squares(xbl, kQK_K);
    const float sigma2 = kXS ? sum_x2 / kQK_K : 2 * sum_x2 / kQK_K;
    for (int ib = 0; ib < kQK_K / 16; ++ib) {
      const float* xb = xbl + 16 * ib;
      float weight[16], waux[16], xval[16];
      int8_t L[16] = {};
      uint8_t signs[2];
      if (qw_row != nullptr) {
        iq::importance_weights(qw_row + kQK_K * ibl + 16 * ib, xb, sigma2, 16, weight);
      } else {
        for (int i = 0; i < 16; ++i) weight[i] = 0.25f * sigma2 + xb[i] * xb[i];  // IQ2_S only
      }
      for (int i = 0; i < 16; ++i) waux[i] = std::sqrt(weight[i]);
      sub_block_signs(16, xb, weight, kXS, xval, signs);
      float max = xval[0];
      for (int i = 1; i < 16; ++i) max = max_of(max, xval[i]);
      scales[ib] = 0;
      if (max < (kXS ? 1e-15f : 1e-8f)) continue;
      float scale = iq::grid_search(lat, kSearch, 16, xval, weight, waux, max, max / (2 * kMaxQ - 1), L);
      make_scale_positive(&scale, 2, kXS ? 127 : 255, signs);
      for (int k = 0; k < 2; ++k) {
        const int g = iq::grid_index_of(lat, L + 8 * k);
        const int i8 = 2 * ib + k;
        if constexpr (kXS) {
          b.qs[i8] = static_cast<uint16_t>(g | signs[k] << 9);
        } else {
          b.qs[i8] = static_cast<uint8_t>(g & 255);
          b.qh[i8 / 4] |= static_cast<uint8_t>((g >> 8) << (2 * (i8 % 4)));
          b.qs[kQK_K / 8 + i8] = signs[k];
        }
      }
      scales[ib] = scale;
      max_scale = max_of(max_scale, scale);
    }
    if (max_scale != 0) {
      const float d = max_scale / 31;
      b.d = f32_to_f16(kXS ? d : d * 0.9875f);
      const float id = 1 / d;
      for (int ib = 0; ib < kQK_K / 16; ++ib) {
        b.scales[ib / 2] |= static_cast<uint8_t>(scale_nibble(id, scales[ib]) << (4 * (ib % 2)));
      }
    } else if constexpr (kXS) {
      std::memset(b.qs, 0, sizeof(b.qs));
    }
    store_block(y, ibl, b);
  }
}

}  // namespace

void quantize_rows_iq2_xxs(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                           const float* importance) {
  KILN_ASSERT(importance != nullptr);
  iq::quantize_rows_with<BlockIQ2_XXS>(quantize_row_iq2_xxs, src, dst, n_rows, n_per_row, importance);
}

void quantize_rows_iq2_xs(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                          const float* importance) {
  KILN_ASSERT(importance != nullptr);
  iq::quantize_rows_with<BlockIQ2_XS>(quantize_row_iq2_16<BlockIQ2_XS>, src, dst, n_rows, n_per_row,
                                      importance);
}

void quantize_rows_iq2_s(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                         const float* importance) {
  iq::quantize_rows_with<BlockIQ2_S>(quantize_row_iq2_16<BlockIQ2_S>, src, dst, n_rows, n_per_row,
                                     importance);
}

}  // namespace kiln::quant
