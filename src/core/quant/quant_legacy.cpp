// Legacy block quants (blocks of 32): Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, and IQ4_NL and MXFP4,
// which share their layout. Reference code: one block at a time, one element at a time.
#include "core/quant/fp_contract_off.h"
// (the line above must stay first)
#include <cmath>
#include <cstring>

#include "core/half.h"
#include "core/quant/quant_blocks.h"

namespace kiln::quant {
namespace {

// 4-bit quant of element j (0..31) of a block whose nibbles hold j (low) and j + 16 (high).
int nibble(const uint8_t* qs, int j) { return j < kQK / 2 ? (qs[j] & 0x0F) : (qs[j - kQK / 2] >> 4); }

// Bit 4 of 5-bit quant j, stored as bit j of the little-endian uint32 qh.
int high_bit(const uint8_t* qh, int j) { return (qh[j / 8] >> (j % 8)) & 1; }

// (int)v clamped to [0, hi], truncating toward zero like ggml's (int8_t) casts; NaN gives 0.
// For finite v in [0, 127] this equals ggml's MIN(hi, (int8_t)v).
int trunc_clamped(float v, int hi) {
  if (!(v > 0.0f)) return 0;
  if (v >= static_cast<float>(hi)) return hi;
  return static_cast<int>(v);
}

// roundf(v) (half away from zero) clamped to [-127, 127]; NaN gives 0.
int round_clamped_127(float v) {
  if (!(std::fabs(v) <= 127.0f)) return std::isnan(v) ? 0 : (v > 0 ? 127 : -127);
  return static_cast<int>(std::roundf(v));
}

// The element of largest magnitude (the first one on ties), with its sign.
float signed_absmax(const float* x, int n) {
  float amax = 0.0f;
  float max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

float absmax(const float* x, int n) {
  float amax = 0.0f;
  for (int j = 0; j < n; ++j) amax = std::fmax(amax, std::fabs(x[j]));
  return amax;
}

void min_max(const float* x, int n, float* min, float* max) {
  *min = x[0];
  *max = x[0];
  for (int j = 1; j < n; ++j) {
    if (x[j] < *min) *min = x[j];
    if (x[j] > *max) *max = x[j];
  }
}

// Packs 32 quants (0..15 in the low nibbles) in the Q4_0 nibble layout.
void pack_nibbles(const int* q, uint8_t* qs) {
  for (int j = 0; j < kQK / 2; ++j)
    qs[j] = static_cast<uint8_t>((q[j] & 0x0F) | ((q[j + kQK / 2] & 0x0F) << 4));
}

// Packs bit 4 of 32 quants into qh (bit j = quant j).
void pack_high_bits(const int* q, uint8_t* qh) {
  std::memset(qh, 0, 4);
  for (int j = 0; j < kQK; ++j) qh[j / 8] = static_cast<uint8_t>(qh[j / 8] | (((q[j] >> 4) & 1) << (j % 8)));
}

}  // namespace

void dequantize_row_q4_0(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i) {
    const auto b = load_block<BlockQ4_0>(src, i);
    const float d = f16_to_f32(b.d);
    for (int j = 0; j < kQK; ++j) dst[i * kQK + j] = static_cast<float>(nibble(b.qs, j) - 8) * d;
  }
}

void dequantize_row_q4_1(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i) {
    const auto b = load_block<BlockQ4_1>(src, i);
    const float d = f16_to_f32(b.d);
    const float m = f16_to_f32(b.m);
    for (int j = 0; j < kQK; ++j) dst[i * kQK + j] = static_cast<float>(nibble(b.qs, j)) * d + m;
  }
}

void dequantize_row_q5_0(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i) {
    const auto b = load_block<BlockQ5_0>(src, i);
    const float d = f16_to_f32(b.d);
    for (int j = 0; j < kQK; ++j) {
      const int q = nibble(b.qs, j) | (high_bit(b.qh, j) << 4);
      dst[i * kQK + j] = static_cast<float>(q - 16) * d;
    }
  }
}

void dequantize_row_q5_1(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i) {
    const auto b = load_block<BlockQ5_1>(src, i);
    const float d = f16_to_f32(b.d);
    const float m = f16_to_f32(b.m);
    for (int j = 0; j < kQK; ++j) {
      const int q = nibble(b.qs, j) | (high_bit(b.qh, j) << 4);
      dst[i * kQK + j] = static_cast<float>(q) * d + m;
    }
  }
}

void dequantize_row_q8_0(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i) {
    const auto b = load_block<BlockQ8_0>(src, i);
    const float d = f16_to_f32(b.d);
    for (int j = 0; j < kQK; ++j) dst[i * kQK + j] = static_cast<float>(b.qs[j]) * d;
  }
}

void dequantize_row_q8_1(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i) {
    const auto b = load_block<BlockQ8_1>(src, i);
    const float d = f16_to_f32(b.d);
    for (int j = 0; j < kQK; ++j) dst[i * kQK + j] = static_cast<float>(b.qs[j]) * d;
  }
}

void dequantize_row_iq4_nl(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i) {
    const auto b = load_block<BlockIQ4_NL>(src, i);
    const float d = f16_to_f32(b.d);
    for (int j = 0; j < kQK; ++j) dst[i * kQK + j] = d * static_cast<float>(kIQ4NLValues[nibble(b.qs, j)]);
  }
}

// 2^(e - 128) as f32 bits, exact for every e: 2^-127 and 2^-128 are f32 subnormals.
static float e8m0_to_f32_half(uint8_t e) {
  const uint32_t bits = e < 2 ? (0x00200000u << e) : (static_cast<uint32_t>(e - 1) << 23);
  return fp32_from_bits(bits);
}

void dequantize_row_mxfp4(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i) {
    const auto b = load_block<BlockMXFP4>(src, i);
    const float d = e8m0_to_f32_half(b.e);
    for (int j = 0; j < kQK; ++j) dst[i * kQK + j] = d * static_cast<float>(kMXFP4Values[nibble(b.qs, j)]);
  }
}

// Symmetric 4-bit: d = (signed absmax) / -8, so the largest magnitude maps to q = 0 (-8 * d).
void quantize_row_q4_0(const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float* x = src + i * kQK;
    const float d = signed_absmax(x, kQK) / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int q[kQK];
    for (int j = 0; j < kQK; ++j) q[j] = trunc_clamped(x[j] * id + 8.5f, 15);
    BlockQ4_0 b;
    b.d = f32_to_f16(d);
    pack_nibbles(q, b.qs);
    store_block(dst, i, b);
  }
}

// Asymmetric 4-bit: [min, max] split into 15 steps.
void quantize_row_q4_1(const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float* x = src + i * kQK;
    float min, max;
    min_max(x, kQK, &min, &max);
    const float d = (max - min) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int q[kQK];
    for (int j = 0; j < kQK; ++j) q[j] = trunc_clamped((x[j] - min) * id + 0.5f, 15);
    BlockQ4_1 b;
    b.d = f32_to_f16(d);
    b.m = f32_to_f16(min);
    pack_nibbles(q, b.qs);
    store_block(dst, i, b);
  }
}

// Symmetric 5-bit: d = (signed absmax) / -16.
void quantize_row_q5_0(const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float* x = src + i * kQK;
    const float d = signed_absmax(x, kQK) / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int q[kQK];
    for (int j = 0; j < kQK; ++j) q[j] = trunc_clamped(x[j] * id + 16.5f, 31);
    BlockQ5_0 b;
    b.d = f32_to_f16(d);
    pack_high_bits(q, b.qh);
    pack_nibbles(q, b.qs);
    store_block(dst, i, b);
  }
}

// Asymmetric 5-bit: [min, max] split into 31 steps.
void quantize_row_q5_1(const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float* x = src + i * kQK;
    float min, max;
    min_max(x, kQK, &min, &max);
    const float d = (max - min) / 31.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int q[kQK];
    for (int j = 0; j < kQK; ++j) q[j] = trunc_clamped((x[j] - min) * id + 0.5f, 31);
    BlockQ5_1 b;
    b.d = f32_to_f16(d);
    b.m = f32_to_f16(min);
    pack_high_bits(q, b.qh);
    pack_nibbles(q, b.qs);
    store_block(dst, i, b);
  }
}

// Symmetric 8-bit: d = absmax / 127, q = round(x / d), half away from zero.
void quantize_row_q8_0(const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float* x = src + i * kQK;
    const float d = absmax(x, kQK) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ8_0 b;
    b.d = f32_to_f16(d);
    for (int j = 0; j < kQK; ++j) b.qs[j] = static_cast<int8_t>(round_clamped_127(x[j] * id));
    store_block(dst, i, b);
  }
}

// As Q8_0, plus s = d * sum(q).
void quantize_row_q8_1(const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float* x = src + i * kQK;
    const float d = absmax(x, kQK) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ8_1 b;
    int sum = 0;
    for (int j = 0; j < kQK; ++j) {
      b.qs[j] = static_cast<int8_t>(round_clamped_127(x[j] * id));
      sum += b.qs[j];
    }
    b.d = f32_to_f16(d);
    b.s = f32_to_f16(static_cast<float>(sum) * d);
    store_block(dst, i, b);
  }
}

}  // namespace kiln::quant
