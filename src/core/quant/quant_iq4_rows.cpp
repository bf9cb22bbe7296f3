// Model rows of IQ4_NL (blocks of 32, one f16 scale) and IQ4_XS (super-blocks of 256: an f16 scale and a
// 6-bit code per block of 32), byte-identical with ggml_quantize_chunk (ggml: quantize_row_iq4_nl_impl with
// ntry 7, the path of llama-quantize with and without importance).
//
// Per block of 32: weights importance * sqrt(sigma2 + x^2) (sigma2 = 2 * the super-block's mean square), or
// x^2 without importance. The scale search starts at max / -127 (max: the signed value of largest magnitude),
// maps each x to its nearest level, and tries the 15 scales max / (l0 + t), t = -7..7, keeping the weighted
// least-squares scale of the best fit. IQ4_XS then codes each block scale as d * (code - 32) with
// d = -max_scale / 32 and re-maps x to levels with the coded scale; IQ4_NL stores its scale as f16 and
// re-maps with the unrounded one.
#include "core/quant/fp_contract_off.h"
// (the line above must stay first)
#include <cmath>
#include <cstring>

#include "core/half.h"
#include "core/quant/quant_blocks.h"
#include "core/quant/quant_k_search.h"

namespace kiln::quant {
namespace {

constexpr int kTries = 7;

// Weighted least-squares scale of one block of 32 (0 when the block is all zero or weightless).
float iq4_block_scale(const float* xb, const float* weight) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < kQK; ++j) {
    const float ax = std::fabs(xb[j]);
    if (ax > amax) {
      amax = ax;
      max = xb[j];
    }
  }
  if (amax < kGroupMaxEps) return 0.0f;
  const float l0 = static_cast<float>(kIQ4NLValues[0]);
  // The sums of the fit of levels chosen with inverse scale id.
  auto fit = [&](float id, float* sumqx, float* sumq2) {
    *sumqx = 0.0f;
    *sumq2 = 0.0f;
    for (int j = 0; j < kQK; ++j) {
      const auto q = static_cast<float>(kIQ4NLValues[iq4nl_index(id * xb[j])]);
      *sumqx += weight[j] * q * xb[j];
      *sumq2 += weight[j] * q * q;
    }
  };
  float sumqx, sumq2;
  fit(1.0f / (-max / l0), &sumqx, &sumq2);
  float d = sumq2 > 0.0f ? sumqx / sumq2 : 0.0f;
  float best = d * sumqx;
  for (int t = -kTries; t <= kTries; ++t) {
    fit(static_cast<float>(t + kIQ4NLValues[0]) / max, &sumqx, &sumq2);
    if (sumq2 > 0.0f && sumqx * sumqx > best * sumq2) {
      d = sumqx / sumq2;
      best = d * sumqx;
    }
  }
  return d;
}

// One super-block of kSuper values (32: IQ4_NL, 256: IQ4_XS); qw: its importance or null. Writes the f16
// scale, the nibbles (IQ4_NL layout per block of 32) and, for IQ4_XS, the block scale codes.
template <int kSuper>
void quantize_iq4(const float* x, const float* qw, uint16_t* d_bits, uint8_t* qs, uint16_t* scales_h,
                  uint8_t* scales_l) {
  constexpr int kBlocks = kSuper / kQK;
  float sigma2 = 0.0f;
  for (int j = 0; j < kSuper; ++j) sigma2 += x[j] * x[j];
  sigma2 *= 2.0f / static_cast<float>(kSuper);

  float scales[kBlocks];
  float max_scale = 0.0f, amax_scale = 0.0f;
  for (int ib = 0; ib < kBlocks; ++ib) {
    const float* xb = x + ib * kQK;
    float weight[kQK];
    for (int j = 0; j < kQK; ++j)
      weight[j] = qw != nullptr ? qw[ib * kQK + j] * std::sqrt(sigma2 + xb[j] * xb[j]) : xb[j] * xb[j];
    scales[ib] = iq4_block_scale(xb, weight);
    if (std::fabs(scales[ib]) > amax_scale) {
      amax_scale = std::fabs(scales[ib]);
      max_scale = scales[ib];
    }
  }

  uint8_t L[kSuper];
  if constexpr (kBlocks > 1) {
    *scales_h = 0;
    const float d = -max_scale / 32.0f;
    *d_bits = f32_to_f16(d);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int ib = 0; ib < kBlocks; ++ib) {
      int l = nearest_int(id * scales[ib]);
      l = l < -32 ? -32 : (l > 31 ? 31 : l);
      const float dl = d * static_cast<float>(l);
      const float idl = dl != 0.0f ? 1.0f / dl : 0.0f;
      for (int j = 0; j < kQK; ++j)
        L[ib * kQK + j] = static_cast<uint8_t>(iq4nl_index(idl * x[ib * kQK + j]));
      l += 32;
      if (ib % 2 == 0) {
        scales_l[ib / 2] = static_cast<uint8_t>(l & 0x0F);
      } else {
        scales_l[ib / 2] = static_cast<uint8_t>(scales_l[ib / 2] | ((l & 0x0F) << 4));
      }
      *scales_h = static_cast<uint16_t>(*scales_h | ((l >> 4) << (2 * ib)));
    }
  } else {
    *d_bits = f32_to_f16(scales[0]);
    const float id = scales[0] != 0.0f ? 1.0f / scales[0] : 0.0f;
    for (int j = 0; j < kQK; ++j) L[j] = static_cast<uint8_t>(iq4nl_index(id * x[j]));
  }
  for (int ib = 0; ib < kBlocks; ++ib) {
    for (int j = 0; j < kQK / 2; ++j)
      qs[ib * 16 + j] = static_cast<uint8_t>(L[ib * kQK + j] | (L[ib * kQK + 16 + j] << 4));
  }
}

}  // namespace

void quantize_rows_iq4_nl(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                          const float* importance) {
  const int64_t nb = n_per_row / kQK;
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t i = 0; i < nb; ++i) {
      BlockIQ4_NL b{};
      quantize_iq4<kQK>(src + (r * nb + i) * kQK, importance != nullptr ? importance + i * kQK : nullptr,
                        &b.d, b.qs, nullptr, nullptr);
      store_block(dst, r * nb + i, b);
    }
  }
}

void quantize_rows_iq4_xs(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                          const float* importance) {
  const int64_t nb = n_per_row / kQK_K;
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t i = 0; i < nb; ++i) {
      BlockIQ4_XS b{};
      quantize_iq4<kQK_K>(src + (r * nb + i) * kQK_K,
                          importance != nullptr ? importance + i * kQK_K : nullptr, &b.d, b.qs, &b.scales_h,
                          b.scales_l);
      store_block(dst, r * nb + i, b);
    }
  }
}

}  // namespace kiln::quant
