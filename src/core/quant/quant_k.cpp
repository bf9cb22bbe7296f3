// K-quants (super-blocks of 256): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, and IQ4_XS, TQ1_0 and TQ2_0,
// which share the super-block shape. Reference code: each element's bits are located by the formulas written
// next to its block struct in quant_blocks.h.
#include "core/quant/fp_contract_off.h"
// (the line above must stay first)
#include <cmath>
#include <type_traits>
#include <utility>

#include "core/half.h"
#include "core/quant/quant_blocks.h"

namespace kiln::quant {
namespace {

// Q4_K / Q5_K: 6-bit scale and min of sub-block s (0..7) from the 12 packed bytes.
// Bytes 0-3: scales 0-3 (low 6 bits); bytes 4-7: mins 0-3 (low 6 bits); bytes 8-11: low 4 bits
// of scales 4-7 (low nibble) and mins 4-7 (high nibble), whose high 2 bits are the top bits of
// bytes 0-3 (scales) and 4-7 (mins).
void k_scale_min(const uint8_t* scales, int s, int* scale, int* min) {
  if (s < 4) {
    *scale = scales[s] & 63;
    *min = scales[s + 4] & 63;
  } else {
    *scale = (scales[s + 4] & 0x0F) | ((scales[s - 4] >> 6) << 4);
    *min = (scales[s + 4] >> 4) | ((scales[s] >> 6) << 4);
  }
}

// Q3_K: signed scale of sub-block s (0..15), 6 bits stored with a bias of 32.
int q3_k_scale(const uint8_t* scales, int s) {
  const int low = (scales[s % 8] >> (4 * (s / 8))) & 0x0F;
  const int high = (scales[8 + s % 4] >> (2 * (s / 4))) & 0x03;
  return (low | (high << 4)) - 32;
}

// 2-bit field of element e (0..255) in the Q2_K / Q3_K qs layout.
int two_bit_quant(const uint8_t* qs, int e) {
  const int byte = (e / 128) * 32 + e % 32;
  const int shift = 2 * ((e % 128) / 32);
  return (qs[byte] >> shift) & 3;
}

// 4-bit field of element e (0..255) in the Q4_K / Q5_K qs layout.
int four_bit_quant(const uint8_t* qs, int e) {
  const int byte = (e / 64) * 32 + e % 32;
  return (e / 32) % 2 == 0 ? (qs[byte] & 0x0F) : (qs[byte] >> 4);
}

// Bit e / 32 of mask[e % 32]: the extra bit of element e in Q3_K (hmask) and Q5_K (qh).
int mask_bit(const uint8_t* mask, int e) { return (mask[e % 32] >> (e / 32)) & 1; }

// Trit k (0..4) of a TQ1_0 byte: the byte is a base-3 fraction; multiplying by 3^k (mod 256)
// shifts trit k to the top, and * 3 >> 8 reads it. Returns -1, 0 or 1.
int tq1_trit(uint8_t byte, int k) {
  static constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
  const auto shifted = static_cast<uint8_t>(byte * kPow3[k]);
  return ((shifted * 3) >> 8) - 1;
}

}  // namespace

namespace {

// y[e] = dl * q(e) - ml over a super-block's sub-blocks of kLen elements, (dl, ml) = scale_min(s) for
// sub-block s.
template <int kLen, class ScaleMin, class Quant>
void dequantize_sub_blocks(float* y, ScaleMin&& scale_min, Quant&& quant) {
  for (int s = 0; s < kQK_K / kLen; ++s) {
    const auto [dl, ml] = scale_min(s);
    for (int e = s * kLen; e < s * kLen + kLen; ++e) y[e] = dl * static_cast<float>(quant(e)) - ml;
  }
}

// The K-quants with scales and mins, y = d * scale * q - dmin * min: Q2_K (16 sub-blocks of 16, 4-bit scale
// and min, 2-bit quants), Q4_K and Q5_K (8 sub-blocks of 32, 6-bit scales and mins; Q5_K's fifth bit in qh).
template <class Block>
void dequant_dmin_k(const void* src, float* dst, int64_t n) {
  constexpr bool kQ2 = std::is_same_v<Block, BlockQ2_K>;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const auto b = load_block<Block>(src, i);
    const float d = f16_to_f32(b.d);
    const float dmin = f16_to_f32(b.dmin);
    auto scale_min = [&](int s) {
      int scale, min;
      if constexpr (kQ2) {
        scale = b.scales[s] & 0x0F;
        min = b.scales[s] >> 4;
      } else {
        k_scale_min(b.scales, s, &scale, &min);
      }
      return std::pair{d * static_cast<float>(scale), dmin * static_cast<float>(min)};
    };
    dequantize_sub_blocks<kQ2 ? 16 : 32>(dst + i * kQK_K, scale_min, [&](int e) {
      if constexpr (kQ2) {
        return two_bit_quant(b.qs, e);
      } else if constexpr (requires { b.qh; }) {
        return four_bit_quant(b.qs, e) | (mask_bit(b.qh, e) << 4);
      } else {
        return four_bit_quant(b.qs, e);
      }
    });
  }
}

}  // namespace

void dequantize_row_q2_k(const void* src, float* dst, int64_t n) { dequant_dmin_k<BlockQ2_K>(src, dst, n); }
void dequantize_row_q4_k(const void* src, float* dst, int64_t n) { dequant_dmin_k<BlockQ4_K>(src, dst, n); }
void dequantize_row_q5_k(const void* src, float* dst, int64_t n) { dequant_dmin_k<BlockQ5_K>(src, dst, n); }

void dequantize_row_q3_k(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const auto b = load_block<BlockQ3_K>(src, i);
    const float d = f16_to_f32(b.d);
    for (int s = 0; s < kQK_K / 16; ++s) {
      const float dl = d * static_cast<float>(q3_k_scale(b.scales, s));
      for (int e = s * 16; e < s * 16 + 16; ++e) {
        const int q = two_bit_quant(b.qs, e) - (mask_bit(b.hmask, e) ? 0 : 4);
        dst[i * kQK_K + e] = dl * static_cast<float>(q);
      }
    }
  }
}

void dequantize_row_q6_k(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const auto b = load_block<BlockQ6_K>(src, i);
    const float d = f16_to_f32(b.d);
    for (int e = 0; e < kQK_K; ++e) {
      const int h = e / 128, k = (e % 128) / 32, l = e % 32;
      const uint8_t ql = b.ql[h * 64 + (k % 2) * 32 + l];
      const int low = k / 2 == 0 ? (ql & 0x0F) : (ql >> 4);
      const int high = (b.qh[h * 32 + l] >> (2 * k)) & 3;
      const float dl = d * static_cast<float>(b.scales[e / 16]);
      dst[i * kQK_K + e] = dl * static_cast<float>((low | (high << 4)) - 32);
    }
  }
}

void dequantize_row_q8_k(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const auto b = load_block<BlockQ8_K>(src, i);
    for (int e = 0; e < kQK_K; ++e) dst[i * kQK_K + e] = b.d * static_cast<float>(b.qs[e]);
  }
}

// ggml's reference: iscale = -127 / (signed absmax), q = round-half-even(iscale * x) capped at
// 127, d = 1 / iscale; an all-zero block gives d = 0 and q = 0.
void quantize_row_q8_k(const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* x = src + i * kQK_K;
    float amax = 0.0f, max = 0.0f;
    for (int e = 0; e < kQK_K; ++e) {
      if (std::fabs(x[e]) > amax) {
        amax = std::fabs(x[e]);
        max = x[e];
      }
    }
    BlockQ8_K b{};
    if (amax != 0.0f) {
      const float iscale = -127.0f / max;
      for (int e = 0; e < kQK_K; ++e) {
        const float v = std::nearbyint(iscale * x[e]);  // in [-127, 127] for finite x; NaN -> 0
        b.qs[e] = static_cast<int8_t>(
            std::isnan(v) ? 0 : static_cast<int>(std::fmin(127.0f, std::fmax(-128.0f, v))));
      }
      for (int e = 0; e < kQK_K; ++e) b.bsums[e / 16] = static_cast<int16_t>(b.bsums[e / 16] + b.qs[e]);
      b.d = 1.0f / iscale;
    }
    store_block(dst, i, b);
  }
}

void dequantize_row_iq4_xs(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const auto b = load_block<BlockIQ4_XS>(src, i);
    const float d = f16_to_f32(b.d);
    for (int s = 0; s < kQK_K / 32; ++s) {
      const int low = (b.scales_l[s / 2] >> (4 * (s % 2))) & 0x0F;
      const int high = (b.scales_h >> (2 * s)) & 0x03;
      const float dl = d * static_cast<float>((low | (high << 4)) - 32);
      const uint8_t* qs = b.qs + s * 16;
      for (int j = 0; j < 32; ++j) {
        const int q = j < 16 ? (qs[j] & 0x0F) : (qs[j - 16] >> 4);
        dst[i * kQK_K + s * 32 + j] = dl * static_cast<float>(kIQ4NLValues[q]);
      }
    }
  }
}

void dequantize_row_tq1_0(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const auto b = load_block<BlockTQ1_0>(src, i);
    const float d = f16_to_f32(b.d);
    float* y = dst + i * kQK_K;
    for (int k = 0; k < 5; ++k) {
      for (int m = 0; m < 32; ++m) y[32 * k + m] = static_cast<float>(tq1_trit(b.qs[m], k)) * d;
      for (int m = 0; m < 16; ++m) y[160 + 16 * k + m] = static_cast<float>(tq1_trit(b.qs[32 + m], k)) * d;
    }
    for (int k = 0; k < 4; ++k) {
      for (int j = 0; j < 4; ++j) y[240 + 4 * k + j] = static_cast<float>(tq1_trit(b.qh[j], k)) * d;
    }
  }
}

void dequantize_row_tq2_0(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const auto b = load_block<BlockTQ2_0>(src, i);
    const float d = f16_to_f32(b.d);
    for (int e = 0; e < kQK_K; ++e) dst[i * kQK_K + e] = static_cast<float>(two_bit_quant(b.qs, e) - 1) * d;
  }
}

}  // namespace kiln::quant
