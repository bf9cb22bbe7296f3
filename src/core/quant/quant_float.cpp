// Plain float types as rows: F32 (a copy), F16 and BF16 (IEEE round to nearest even, core/half.h).
#include "core/quant/fp_contract_off.h"
// (the line above must stay first)
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

}  // namespace kiln::quant
