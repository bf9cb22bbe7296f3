// Model rows of the K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), byte-identical with ggml_quantize_chunk.
//
// One super-block of 256 values at a time, in two steps: (1) a scale search per sub-block
// (quant_k_search.h) gives sub-block scales (and minimums); (2) those are quantized to the block's 4-, 6- or
// 8-bit scale codes under an f16 super-block scale, and every value is re-quantized with the scale it will
// be decoded with (the f16 scale times the code). Without importance each type follows ggml's reference
// quantizer (quantize_row_*_ref); with importance w (n_per_row values, the same for every row) ggml's
// quantize_row_*_impl: sub-block weights w * sqrt(sigma2 + x^2), sigma2 from the super-block's mean square
// (Q6_K takes w as is), and step (1)'s results quantized by a weighted search of their own. No state crosses
// super-blocks.
#include "core/quant/fp_contract_off.h"
// (the line above must stay first)
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/half.h"
#include "core/quant/quant_blocks.h"
#include "core/quant/quant_k_search.h"

namespace kiln::quant {
namespace {

int clamp_int(int v, int lo, int hi) { return std::max(lo, std::min(hi, v)); }

// Sum of x^2 over n values, in order.
float sum_squares(const float* x, int n) {
  float s = 0.0f;
  for (int j = 0; j < n; ++j) s += x[j] * x[j];
  return s;
}

// Sub-block weights from importance: w[j] = qw[j] * sqrt(sigma2 + x[j]^2); returns their sum.
float importance_weights(const float* qw, const float* x, float sigma2, int n, float* w) {
  for (int j = 0; j < n; ++j) w[j] = qw[j] * std::sqrt(sigma2 + x[j] * x[j]);
  float sum = 0.0f;
  for (int j = 0; j < n; ++j) sum += w[j];
  return sum;
}

// The Q2_K / Q3_K quants layout: level L[e] (0..3) of element e goes to bits 2 * ((e % 128) / 32) of
// qs[(e / 128) * 32 + e % 32].
template <class Level>
void pack_2bit(const Level* L, uint8_t* qs) {
  for (int h = 0; h < kQK_K; h += 128) {
    for (int l = 0; l < 32; ++l) {
      qs[h / 4 + l] =
          static_cast<uint8_t>(L[h + l] | (L[h + l + 32] << 2) | (L[h + l + 64] << 4) | (L[h + l + 96] << 6));
    }
  }
}

// --- Q2_K: 16 sub-blocks of 16, 2-bit levels, 4-bit scale and min codes ------------------------------

// Levels of every sub-block whose decoded scale is non-zero, from the stored codes (d, dmin already f16
// round-tripped); the others keep the search's levels.
void q2_k_requantize(const float* x, const BlockQ2_K& b, float d_all, float m_all, uint8_t* L) {
  for (int j = 0; j < kQK_K / 16; ++j) {
    const float d = d_all * static_cast<float>(b.scales[j] & 0x0F);
    if (d == 0.0f) continue;
    const float m = m_all * static_cast<float>(b.scales[j] >> 4);
    for (int i = 16 * j; i < 16 * j + 16; ++i)
      L[i] = static_cast<uint8_t>(clamp_int(nearest_int((x[i] + m) / d), 0, 3));
  }
}

BlockQ2_K quantize_block_q2_k(const float* x, const float* qw) {
  BlockQ2_K b{};
  uint8_t L[kQK_K];
  float scales[kQK_K / 16], mins[kQK_K / 16], weights[kQK_K];
  if (qw == nullptr) {
    // Reference: weights |x|, the scale and min codes linear in [0, max] with 15 steps.
    for (int e = 0; e < kQK_K; ++e) weights[e] = std::fabs(x[e]);
    search_scale_min<16, 16>(3, x, weights, -0.5f, 0.1f, 15, true, L, scales, mins);
    float max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < kQK_K / 16; ++j) {
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    if (max_scale > 0.0f) {
      const float iscale = 15.0f / max_scale;
      for (int j = 0; j < kQK_K / 16; ++j)
        b.scales[j] = static_cast<uint8_t>(nearest_int(iscale * scales[j]));
      b.d = f32_to_f16(max_scale / 15.0f);
    } else {
      b.d = f32_to_f16(0.0f);
    }
    if (max_min > 0.0f) {
      const float iscale = 15.0f / max_min;
      for (int j = 0; j < kQK_K / 16; ++j)
        b.scales[j] = static_cast<uint8_t>(b.scales[j] | (nearest_int(iscale * mins[j]) << 4));
      b.dmin = f32_to_f16(max_min / 15.0f);
    } else {
      b.dmin = f32_to_f16(0.0f);
    }
  } else {
    const float sigma2 = sum_squares(x, kQK_K) / static_cast<float>(kQK_K);
    float sw[kQK_K / 16];
    for (int j = 0; j < kQK_K / 16; ++j)
      sw[j] = importance_weights(qw + 16 * j, x + 16 * j, sigma2, 16, weights + 16 * j);
    search_scale_min<16, 16>(3, x, weights, -0.9f, 0.05f, 36, false, L, scales, mins);
    uint8_t Ls[kQK_K / 16], Lm[kQK_K / 16];
    b.d = f32_to_f16(search_scale_positive(kQK_K / 16, 15, scales, sw, Ls));
    b.dmin = f32_to_f16(search_scale_positive(kQK_K / 16, 15, mins, sw, Lm));
    for (int j = 0; j < kQK_K / 16; ++j) b.scales[j] = static_cast<uint8_t>(Ls[j] | (Lm[j] << 4));
  }
  q2_k_requantize(x, b, f16_to_f32(b.d), f16_to_f32(b.dmin), L);
  pack_2bit(L, b.qs);
  return b;
}

// --- Q3_K: 16 sub-blocks of 16, levels -4..3, 6-bit signed scale codes -------------------------------

// Stores the 6-bit code l (0..63, scale + 32) of sub-block j; scales[] starts zeroed.
void q3_k_pack_scale(uint8_t* scales, int j, int l) {
  if (j < 8) {
    scales[j] = static_cast<uint8_t>(l & 0x0F);
  } else {
    scales[j - 8] = static_cast<uint8_t>(scales[j - 8] | ((l & 0x0F) << 4));
  }
  l >>= 4;
  scales[j % 4 + 8] = static_cast<uint8_t>(scales[j % 4 + 8] | (l << (2 * (j / 4))));
}

// Levels (0..7, value + 4) from the stored codes; the high bit goes to hmask, the low 2 bits to qs.
void q3_k_requantize_and_pack(const float* x, BlockQ3_K* b, int8_t* L) {
  const float d_all = f16_to_f32(b->d);
  for (int j = 0; j < kQK_K / 16; ++j) {
    int8_t sc = static_cast<int8_t>(j < 8 ? b->scales[j] & 0x0F : b->scales[j - 8] >> 4);
    sc = static_cast<int8_t>((sc | (((b->scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32);
    const float d = d_all * static_cast<float>(sc);
    if (d == 0.0f) continue;
    for (int i = 16 * j; i < 16 * j + 16; ++i)
      L[i] = static_cast<int8_t>(clamp_int(nearest_int(x[i] / d), -4, 3) + 4);
  }
  std::memset(b->hmask, 0, sizeof b->hmask);
  for (int e = 0; e < kQK_K; ++e) {
    if (L[e] > 3) {
      b->hmask[e % 32] = static_cast<uint8_t>(b->hmask[e % 32] | (1 << (e / 32)));
      L[e] = static_cast<int8_t>(L[e] - 4);
    }
  }
  pack_2bit(L, b->qs);
}

BlockQ3_K quantize_block_q3_k(const float* x, const float* qw) {
  BlockQ3_K b{};
  int8_t L[kQK_K];
  float scales[kQK_K / 16];
  if (qw == nullptr) {
    // Reference: x^2-weighted levels per sub-block, then the scales linear in [-max, max] (max signed).
    float max_scale = 0.0f, amax = 0.0f;
    for (int j = 0; j < kQK_K / 16; ++j) {
      scales[j] = search_scale_q3(16, 4, x + 16 * j, L + 16 * j);
      if (std::fabs(scales[j]) > amax) {
        amax = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    if (max_scale != 0.0f) {
      const float iscale = -32.0f / max_scale;
      for (int j = 0; j < kQK_K / 16; ++j) {
        const auto l = static_cast<int8_t>(nearest_int(iscale * scales[j]));
        q3_k_pack_scale(b.scales, j, clamp_int(l, -32, 31) + 32);
      }
      b.d = f32_to_f16(1.0f / iscale);
    } else {
      b.d = f32_to_f16(0.0f);
    }
  } else {
    const float sigma2 = 2.0f * sum_squares(x, kQK_K) / static_cast<float>(kQK_K);
    float weights[16], sw[kQK_K / 16];
    for (int j = 0; j < kQK_K / 16; ++j) {
      sw[j] = importance_weights(qw + 16 * j, x + 16 * j, sigma2, 16, weights);
      scales[j] = search_scale_symmetric(16, 4, x + 16 * j, weights, L + 16 * j);
    }
    int8_t Ls[kQK_K / 16];
    const float d_block = search_scale_symmetric(kQK_K / 16, 32, scales, sw, Ls);
    for (int j = 0; j < kQK_K / 16; ++j) q3_k_pack_scale(b.scales, j, Ls[j]);
    b.d = f32_to_f16(d_block);
  }
  q3_k_requantize_and_pack(x, &b, L);
  return b;
}

// --- Q4_K and Q5_K: 8 sub-blocks of 32, 4- or 5-bit levels, 6-bit scale and min codes ----------------

// Stores the codes of sub-block j (see k_scale_min in quant_k.cpp for the layout); scales[] starts zeroed.
void q45_k_pack_scale_min(uint8_t* scales, int j, uint8_t ls, uint8_t lm) {
  if (j < 4) {
    scales[j] = ls;
    scales[j + 4] = lm;
  } else {
    scales[j + 4] = static_cast<uint8_t>((ls & 0x0F) | ((lm & 0x0F) << 4));
    scales[j - 4] = static_cast<uint8_t>(scales[j - 4] | ((ls >> 4) << 6));
    scales[j] = static_cast<uint8_t>(scales[j] | ((lm >> 4) << 6));
  }
}

// The codes of sub-block j as the dequantizer reads them.
void q45_k_scale_min(const uint8_t* scales, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *m = scales[j + 4] & 63;
  } else {
    *sc = (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4);
    *m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
  }
}

template <class Block>
constexpr int kQ45Max = std::is_same_v<Block, BlockQ5_K> ? 31 : 15;

template <class Block>
Block quantize_block_q45_k(const float* x, const float* qw) {
  constexpr bool kQ5 = std::is_same_v<Block, BlockQ5_K>;
  constexpr int kMax = kQ45Max<Block>;
  Block b{};
  uint8_t L[kQK_K];
  float scales[kQK_K / 32], mins[kQK_K / 32], weights[kQK_K];
  if (qw == nullptr) {
    // Reference: weights sqrt(mean x^2) + |x| per sub-block, codes linear in [0, max] with 63 steps.
    for (int j = 0; j < kQK_K / 32; ++j) {
      const float av_x = std::sqrt(sum_squares(x + 32 * j, 32) / 32.0f);
      for (int e = 32 * j; e < 32 * j + 32; ++e) weights[e] = av_x + std::fabs(x[e]);
    }
    if constexpr (kQ5) {
      search_scale_min<8, 32>(kMax, x, weights, -0.5f, 0.1f, 15, false, L, scales, mins);
    } else {
      search_scale_min<8, 32>(kMax, x, weights, -1.0f, 0.1f, 20, false, L, scales, mins);
    }
    float max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < kQK_K / 32; ++j) {
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
    for (int j = 0; j < kQK_K / 32; ++j) {
      auto ls = static_cast<uint8_t>(nearest_int(inv_scale * scales[j]));
      auto lm = static_cast<uint8_t>(nearest_int(inv_min * mins[j]));
      q45_k_pack_scale_min(b.scales, j, ls < 63 ? ls : uint8_t{63}, lm < 63 ? lm : uint8_t{63});
    }
    b.d = f32_to_f16(max_scale / 63.0f);
    b.dmin = f32_to_f16(max_min / 63.0f);
  } else {
    const float sigma2 = 2.0f * sum_squares(x, kQK_K) / static_cast<float>(kQK_K);
    float sw[kQK_K / 32];
    for (int j = 0; j < kQK_K / 32; ++j)
      sw[j] = importance_weights(qw + 32 * j, x + 32 * j, sigma2, 32, weights + 32 * j);
    search_scale_min<8, 32>(kMax, x, weights, -0.9f, 0.05f, 36, false, L, scales, mins);
    uint8_t Ls[kQK_K / 32], Lm[kQK_K / 32];
    const float d_block = search_scale_positive(kQK_K / 32, 63, scales, sw, Ls);
    const float m_block = search_scale_positive(kQK_K / 32, 63, mins, sw, Lm);
    for (int j = 0; j < kQK_K / 32; ++j) {
      uint8_t ls = Ls[j], lm = Lm[j];
      if constexpr (kQ5) {  // ggml caps the codes for Q5_K only; a wrapped code reaches Q4_K's bytes as is
        ls = ls < 63 ? ls : uint8_t{63};
        lm = lm < 63 ? lm : uint8_t{63};
      }
      q45_k_pack_scale_min(b.scales, j, ls, lm);
    }
    b.d = f32_to_f16(d_block);
    b.dmin = f32_to_f16(m_block);
  }
  // Re-quantize with the decoded scales, then pack (Q5_K: bit 4 of element e to bit e / 32 of qh[e % 32]).
  for (int j = 0; j < kQK_K / 32; ++j) {
    int sc, m;
    q45_k_scale_min(b.scales, j, &sc, &m);
    const float d = f16_to_f32(b.d) * static_cast<float>(sc);
    if (d == 0.0f) continue;
    const float dm = f16_to_f32(b.dmin) * static_cast<float>(m);
    for (int i = 32 * j; i < 32 * j + 32; ++i)
      L[i] = static_cast<uint8_t>(clamp_int(nearest_int((x[i] + dm) / d), 0, kMax));
  }
  for (int e = 0; e < kQK_K; ++e) {
    const int byte = (e / 64) * 32 + e % 32;
    const int shift = (e / 32) % 2 == 0 ? 0 : 4;
    b.qs[byte] = static_cast<uint8_t>(b.qs[byte] | ((L[e] & 0x0F) << shift));
    if constexpr (kQ5) b.qh[e % 32] = static_cast<uint8_t>(b.qh[e % 32] | (((L[e] >> 4) & 1) << (e / 32)));
  }
  return b;
}

// --- Q6_K: 16 sub-blocks of 16, levels -32..31, 8-bit signed scale codes -----------------------------

// Reference and importance paths differ only in the search's weights (x^2, or the importance as is).
BlockQ6_K quantize_block_q6_k(const float* x, const float* qw) {
  int8_t L[kQK_K];
  float scales[kQK_K / 16];
  float max_scale = 0.0f, max_abs_scale = 0.0f;
  for (int j = 0; j < kQK_K / 16; ++j) {
    scales[j] = search_scale_symmetric(16, 32, x + 16 * j, qw != nullptr ? qw + 16 * j : nullptr, L + 16 * j);
    if (std::fabs(scales[j]) > max_abs_scale) {
      max_abs_scale = std::fabs(scales[j]);
      max_scale = scales[j];
    }
  }
  BlockQ6_K b{};
  if (max_abs_scale < kGroupMaxEps) return b;  // all zero, d = +0
  const float iscale = -128.0f / max_scale;
  b.d = f32_to_f16(1.0f / iscale);
  for (int j = 0; j < kQK_K / 16; ++j) {
    const int code = nearest_int(iscale * scales[j]);
    b.scales[j] = static_cast<int8_t>(code < 127 ? code : 127);
  }
  for (int j = 0; j < kQK_K / 16; ++j) {
    const float d = f16_to_f32(b.d) * static_cast<float>(b.scales[j]);
    if (d == 0.0f) continue;
    for (int i = 16 * j; i < 16 * j + 16; ++i)
      L[i] = static_cast<int8_t>(clamp_int(nearest_int(x[i] / d), -32, 31) + 32);
  }
  // Layout of quant_blocks.h: element e = 128 h + 32 k + l.
  for (int e = 0; e < kQK_K; ++e) {
    const int h = e / 128, k = (e % 128) / 32, l = e % 32;
    uint8_t& ql = b.ql[h * 64 + (k % 2) * 32 + l];
    ql = static_cast<uint8_t>(ql | ((L[e] & 0x0F) << (4 * (k / 2))));
    uint8_t& qh = b.qh[h * 32 + l];
    qh = static_cast<uint8_t>(qh | (((L[e] >> 4) & 3) << (2 * k)));
  }
  return b;
}

// Rows of super-blocks, each quantized independently by kQuantize (importance offset to the super-block).
template <class Block, Block (*kQuantize)(const float* x, const float* qw)>
void quantize_rows_k(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                     const float* importance) {
  const int64_t nb = n_per_row / kQK_K;
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t i = 0; i < nb; ++i) {
      const float* qw = importance != nullptr ? importance + i * kQK_K : nullptr;
      store_block(dst, r * nb + i, kQuantize(src + (r * nb + i) * kQK_K, qw));
    }
  }
}

}  // namespace

void quantize_rows_q2_k(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                        const float* importance) {
  quantize_rows_k<BlockQ2_K, quantize_block_q2_k>(src, dst, n_rows, n_per_row, importance);
}
void quantize_rows_q3_k(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                        const float* importance) {
  quantize_rows_k<BlockQ3_K, quantize_block_q3_k>(src, dst, n_rows, n_per_row, importance);
}
void quantize_rows_q4_k(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                        const float* importance) {
  quantize_rows_k<BlockQ4_K, quantize_block_q45_k<BlockQ4_K>>(src, dst, n_rows, n_per_row, importance);
}
void quantize_rows_q5_k(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                        const float* importance) {
  quantize_rows_k<BlockQ5_K, quantize_block_q45_k<BlockQ5_K>>(src, dst, n_rows, n_per_row, importance);
}
void quantize_rows_q6_k(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                        const float* importance) {
  quantize_rows_k<BlockQ6_K, quantize_block_q6_k>(src, dst, n_rows, n_per_row, importance);
}

}  // namespace kiln::quant
