// Plain float types as rows: F32 (a copy), F16 and BF16 (IEEE round to nearest even, core/half.h), and kiln's
// FP8 blocks (BlockF8E4M3).
#include "core/quant/fp_contract_off.h"
// (the line above must stay first)
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "core/half.h"
#include "core/quant/quant_blocks.h"

namespace kiln::quant {

void dequantize_row_f32(const void* src, float* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void quantize_row_f32(const float* src, void* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

namespace {

// F16 and BF16: 2-byte elements, converted one at a time by kToF32 / kFromF32.
template <float (*kToF32)(uint16_t)>
void dequant_16(const void* src, float* dst, int64_t n) {
  const auto* bytes = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, bytes + 2 * i, 2);
    dst[i] = kToF32(h);
  }
}

template <uint16_t (*kFromF32)(float)>
void quant_16(const float* src, void* dst, int64_t n) {
  auto* bytes = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = kFromF32(src[i]);
    std::memcpy(bytes + 2 * i, &h, 2);
  }
}

}  // namespace

void dequantize_row_f16(const void* src, float* dst, int64_t n) { dequant_16<f16_to_f32>(src, dst, n); }
void quantize_row_f16(const float* src, void* dst, int64_t n) { quant_16<f32_to_f16>(src, dst, n); }
void dequantize_row_bf16(const void* src, float* dst, int64_t n) { dequant_16<bf16_to_f32>(src, dst, n); }
void quantize_row_bf16(const float* src, void* dst, int64_t n) { quant_16<f32_to_bf16>(src, dst, n); }

void quantize_rows_f32(const float* src, void* dst, int64_t n_rows, int64_t n_per_row, const float*) {
  quantize_row_f32(src, dst, n_rows * n_per_row);
}
void quantize_rows_f16(const float* src, void* dst, int64_t n_rows, int64_t n_per_row, const float*) {
  quantize_row_f16(src, dst, n_rows * n_per_row);
}
void quantize_rows_bf16(const float* src, void* dst, int64_t n_rows, int64_t n_per_row, const float*) {
  quantize_row_bf16(src, dst, n_rows * n_per_row);
}

namespace {

// The 256 e4m3fn values: a lookup per element keeps the CPU's dequantize-then-multiply path (the only one FP8
// weights take for now) as cheap as the other block types'.
constexpr std::array<float, 256> make_f8_e4m3_values() {
  std::array<float, 256> v{};
  for (int i = 0; i < 256; ++i) v[static_cast<size_t>(i)] = f8_e4m3_to_f32(static_cast<uint8_t>(i));
  return v;
}
constexpr std::array<float, 256> kF8E4M3Values = make_f8_e4m3_values();

}  // namespace

void dequantize_row_f8_e4m3(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i) {
    const auto b = load_block<BlockF8E4M3>(src, i);
    for (int j = 0; j < kQK; ++j) dst[i * kQK + j] = b.d * kF8E4M3Values[b.q[j]];
  }
}

void quantize_row_f8_e4m3(const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float* x = src + i * kQK;
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));  // a NaN is skipped
    BlockF8E4M3 b{};
    b.d = amax / kF8E4M3Max;
    for (int j = 0; j < kQK; ++j) {
      const float v = b.d != 0.0f ? x[j] / b.d : 0.0f;
      b.q[j] = std::isnan(v) ? uint8_t{0} : f32_to_f8_e4m3(v);
    }
    store_block(dst, i, b);
  }
}

}  // namespace kiln::quant
