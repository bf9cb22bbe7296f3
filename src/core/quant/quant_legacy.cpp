// Legacy block quants (blocks of 32): Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, and IQ4_NL and MXFP4,
// which share their layout. Reference code: one block at a time, one element at a time.
#include "core/quant/fp_contract_off.h"
// (the line above must stay first)
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/half.h"
#include "core/quant/quant_blocks.h"
#include "core/quant/quant_k_search.h"

namespace kiln::quant {
namespace {

// 4-bit quant of element j (0..31) of a block whose nibbles hold j (low) and j + 16 (high).
int nibble(const uint8_t* qs, int j) { return j < kQK / 2 ? (qs[j] & 0x0F) : (qs[j - kQK / 2] >> 4); }

// Bit 4 of 5-bit quant j, stored as bit j of the little-endian uint32 qh.
int high_bit(const uint8_t* qh, int j) { return (qh[j / 8] >> (j % 8)) & 1; }

// C's conversion of a float to a narrower integer ((int8_t)v, (uint8_t)v) as x86 compiles it: a truncating
// conversion to int32 (cvttss2si, INT32_MIN for NaN and out-of-range v), then the low byte. Returns the
// int32. The conversion is undefined in C for such v; ggml's quantizers reach it when a block's scale d is
// subnormal and 1 / d overflows to inf, and their bytes there are x86's (AArch64 saturates instead).
int32_t c_float_to_int_x86(float v) {
  const bool in_range = v >= -2147483648.0f && v < 2147483648.0f;
  const int32_t t =
      static_cast<int32_t>(in_range ? v : 0.0f);  // selects, not branches: a row loop vectorises
  return in_range ? t : INT32_MIN;
}

// ggml's MIN(hi, (int8_t)v) (Q5_1: (uint8_t)v, the same on its range). v is NaN, +-inf or finite in
// [0, hi + 1.5] (the block's largest magnitude maps to 0 or hi + 0.5 within rounding): NaN and inf give 0.
int trunc_clamped(float v, int hi) {
  const int t = static_cast<int8_t>(c_float_to_int_x86(v));
  return hi < t ? hi : t;
}

// ggml's (int8_t)roundf(v) (half away from zero): v is NaN, +-inf or finite in [-127.5, 127.5).
int round_to_int8(float v) { return static_cast<int8_t>(c_float_to_int_x86(std::roundf(v))); }

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

// max |x| as ggml's MAX(amax, |x|) computes it (a NaN is kept only until a later comparison replaces it).
float absmax(const float* x, int n) {
  float amax = 0.0f;
  for (int j = 0; j < n; ++j) amax = amax > std::fabs(x[j]) ? amax : std::fabs(x[j]);
  return amax;
}

// Smallest and largest element from (FLT_MAX, -FLT_MAX), as ggml starts (NaN elements are skipped).
void min_max(const float* x, int n, float* min, float* max) {
  *min = FLT_MAX;
  *max = -FLT_MAX;
  for (int j = 0; j < n; ++j) {
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

// Quant j of a legacy block: its nibble (with the fifth bit where the block has one), or its int8.
template <class Block>
int legacy_quant(const Block& b, int j) {
  if constexpr (requires { b.qh; }) {
    return nibble(b.qs, j) | (high_bit(b.qh, j) << 4);
  } else if constexpr (sizeof(b.qs) == kQK) {
    return b.qs[j];
  } else {
    return nibble(b.qs, j);
  }
}

// The largest quant of a 4- or 5-bit block: kMax + 1 levels.
template <class Block>
constexpr int kNibbleMax = std::is_same_v<Block, BlockQ5_0> || std::is_same_v<Block, BlockQ5_1> ? 31 : 15;

// The quant that stands for 0 in a symmetric block (Q4_0: 8, Q5_0: 16); 0 for the 8-bit blocks.
template <class Block>
constexpr int kZeroQuant = sizeof(Block::qs) == kQK ? 0 : (kNibbleMax<Block> + 1) / 2;

}  // namespace

// y = (q - kZero) * d, or y = q * d + m for the blocks with a minimum m.
template <class Block>
void LegacyRow<Block>::dequantize(const void* src, float* dst, int64_t n) {
  constexpr int kZero = kZeroQuant<Block>;
  for (int64_t i = 0; i < n / kQK; ++i) {
    const auto b = load_block<Block>(src, i);
    const float d = f16_to_f32(b.d);
    if constexpr (requires { b.m; }) {
      const float m = f16_to_f32(b.m);
      for (int j = 0; j < kQK; ++j) dst[i * kQK + j] = static_cast<float>(legacy_quant(b, j)) * d + m;
    } else {
      for (int j = 0; j < kQK; ++j) dst[i * kQK + j] = static_cast<float>(legacy_quant(b, j) - kZero) * d;
    }
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

namespace {

// The 4- and 5-bit quantizers: kMax + 1 levels. Symmetric blocks (Q4_0, Q5_0): d = (signed absmax) /
// -(kMax + 1) / 2, so that the largest magnitude maps to q = 0; blocks with a minimum m (Q4_1, Q5_1): [min,
// max] split into kMax steps.
template <class Block>
void quantize_row_nibbles(const float* src, void* dst, int64_t n) {
  constexpr int kMax = kNibbleMax<Block>;
  constexpr int kZero = kZeroQuant<Block>;
  constexpr float kZeroHalf = static_cast<float>(kZero) + 0.5f;
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float* x = src + i * kQK;
    Block b;
    float min = 0.0f, d;
    if constexpr (requires { b.m; }) {
      float max;
      min_max(x, kQK, &min, &max);
      d = (max - min) / static_cast<float>(kMax);
    } else {
      d = signed_absmax(x, kQK) / -static_cast<float>(kZero);
    }
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int q[kQK];
    for (int j = 0; j < kQK; ++j) {
      if constexpr (requires { b.m; }) {
        q[j] = trunc_clamped((x[j] - min) * id + 0.5f, kMax);
      } else {
        q[j] = trunc_clamped(x[j] * id + kZeroHalf, kMax);
      }
    }
    b.d = f32_to_f16(d);
    if constexpr (requires { b.m; }) b.m = f32_to_f16(min);
    if constexpr (requires { b.qh; }) pack_high_bits(q, b.qh);
    pack_nibbles(q, b.qs);
    store_block(dst, i, b);
  }
}

// Symmetric 8-bit over a block's kN = sizeof(qs) values (Q8_0, Q8_1: 32; Q8_64: 64): d = absmax / 127, q =
// round(x / d), half away from zero; Q8_1 adds s = d * sum(q).
template <class Block>
void quantize_row_q8(const float* src, void* dst, int64_t n) {
  constexpr int kN = sizeof(Block::qs);
  for (int64_t i = 0; i < n / kN; ++i) {
    const float* x = src + i * kN;
    Block b;
    const float d = absmax(x, kN) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < kN; ++j) b.qs[j] = static_cast<int8_t>(round_to_int8(x[j] * id));
    b.d = f32_to_f16(d);
    if constexpr (requires { b.s; }) {
      int sum = 0;
      for (int j = 0; j < kN; ++j) sum += b.qs[j];
      b.s = f32_to_f16(static_cast<float>(sum) * d);
    }
    store_block(dst, i, b);
  }
}

}  // namespace

template <class Block>
void LegacyRow<Block>::quantize(const float* src, void* dst, int64_t n) {
  if constexpr (sizeof(Block::qs) == kQK) {
    quantize_row_q8<Block>(src, dst, n);
  } else {
    quantize_row_nibbles<Block>(src, dst, n);
  }
}

namespace {

// One row with importance weights (ggml: quantize_row_q4_0_impl and its Q4_1, Q5_0, Q5_1 siblings). Each
// block's weight is importance * sqrt(sigma2 + x^2), sigma2 the row's mean square; the symmetric blocks take
// the weighted symmetric search, the blocks with a minimum the weighted scale-and-minimum search.
template <class Block>
void quantize_row_weighted(const float* x, void* dst, int64_t n_per_row, const float* importance) {
  constexpr int kMax = kNibbleMax<Block>;
  constexpr int kGroup = 8;  // blocks searched side by side (search_scale_min's lanes)
  float sum_x2 = 0.0f;
  for (int64_t j = 0; j < n_per_row; ++j) sum_x2 += x[j] * x[j];
  const float sigma2 = sum_x2 / static_cast<float>(n_per_row);
  const int64_t nb = n_per_row / kQK;
  for (int64_t g = 0; g < nb; g += kGroup) {
    // [kGroup][kQK] values and weights of blocks g.. (lanes past the row's end repeat block g, unused)
    float xg[kGroup * kQK], weight[kGroup * kQK];
    for (int k = 0; k < kGroup; ++k) {
      const int64_t i = g + k < nb ? g + k : g;
      for (int j = 0; j < kQK; ++j) {
        xg[k * kQK + j] = x[i * kQK + j];
        weight[k * kQK + j] = importance[i * kQK + j] * std::sqrt(sigma2 + x[i * kQK + j] * x[i * kQK + j]);
      }
    }
    uint8_t L[kGroup * kQK];
    float d[kGroup], neg_min[kGroup];
    if constexpr (requires { Block::m; }) {
      search_scale_min<kGroup, kQK>(kMax, xg, weight, -0.9f, 0.05f, 36, false, L, d, neg_min);
    } else {
      for (int k = 0; k < kGroup && g + k < nb; ++k) {
        int8_t Ls[kQK];
        d[k] = search_scale_symmetric(kQK, kZeroQuant<Block>, xg + k * kQK, weight + k * kQK, Ls);
        for (int j = 0; j < kQK; ++j) L[k * kQK + j] = static_cast<uint8_t>(Ls[j]);
      }
    }
    for (int k = 0; k < kGroup && g + k < nb; ++k) {
      Block b;
      b.d = f32_to_f16(d[k]);
      if constexpr (requires { b.m; }) b.m = f32_to_f16(-neg_min[k]);
      int q[kQK];
      for (int j = 0; j < kQK; ++j) q[j] = L[k * kQK + j];
      if constexpr (requires { b.qh; }) pack_high_bits(q, b.qh);
      pack_nibbles(q, b.qs);
      store_block(dst, g + k, b);
    }
  }
}

// Model rows: without importance the whole span is one reference row (blocks are independent); with it,
// row by row (the weights' sigma2 is per row). Q8_0 ignores importance, as ggml does.
template <class Block>
void quantize_rows_legacy(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                          const float* importance) {
  if constexpr (!std::is_same_v<Block, BlockQ8_0>) {
    if (importance != nullptr) {
      const int64_t row_bytes = n_per_row / kQK * static_cast<int64_t>(sizeof(Block));
      for (int64_t r = 0; r < n_rows; ++r) {
        quantize_row_weighted<Block>(src + r * n_per_row, static_cast<uint8_t*>(dst) + r * row_bytes,
                                     n_per_row, importance);
      }
      return;
    }
  }
  LegacyRow<Block>::quantize(src, dst, n_rows * n_per_row);
}

}  // namespace

void quantize_rows_q4_0(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                        const float* importance) {
  quantize_rows_legacy<BlockQ4_0>(src, dst, n_rows, n_per_row, importance);
}
void quantize_rows_q4_1(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                        const float* importance) {
  quantize_rows_legacy<BlockQ4_1>(src, dst, n_rows, n_per_row, importance);
}
void quantize_rows_q5_0(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                        const float* importance) {
  quantize_rows_legacy<BlockQ5_0>(src, dst, n_rows, n_per_row, importance);
}
void quantize_rows_q5_1(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                        const float* importance) {
  quantize_rows_legacy<BlockQ5_1>(src, dst, n_rows, n_per_row, importance);
}
void quantize_rows_q8_0(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                        const float* importance) {
  quantize_rows_legacy<BlockQ8_0>(src, dst, n_rows, n_per_row, importance);
}

void dequantize_row_q8_64(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / 64; ++i) {
    const BlockQ8_64 b = load_block<BlockQ8_64>(src, i);
    const float d = f16_to_f32(b.d);
    for (int j = 0; j < 64; ++j) dst[i * 64 + j] = static_cast<float>(b.qs[j]) * d;
  }
}

void quantize_row_q8_64(const float* src, void* dst, int64_t n) { quantize_row_q8<BlockQ8_64>(src, dst, n); }

template struct LegacyRow<BlockQ4_0>;
template struct LegacyRow<BlockQ4_1>;
template struct LegacyRow<BlockQ5_0>;
template struct LegacyRow<BlockQ5_1>;
template struct LegacyRow<BlockQ8_0>;
template struct LegacyRow<BlockQ8_1>;

}  // namespace kiln::quant
