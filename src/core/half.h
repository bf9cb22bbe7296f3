// IEEE half (f16) and bfloat16 conversions, bit-exact with numpy / ggml (round to nearest even), and the
// float8_e4m3fn conversions of FP8 checkpoints.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

namespace kiln {

inline float fp32_from_bits(uint32_t w) {
  float f;
  std::memcpy(&f, &w, sizeof f);
  return f;
}
inline uint32_t fp32_to_bits(float f) {
  uint32_t w;
  std::memcpy(&w, &f, sizeof w);
  return w;
}

// f16 bits -> f32 (exact, including subnormals, inf and NaN).
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return fp32_from_bits(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp == 0) {
    if (mant == 0) return fp32_from_bits(sign);
    // subnormal: normalize
    exp = 127 - 15 + 1;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    mant &= 0x3ffu;
    return fp32_from_bits(sign | (exp << 23) | (mant << 13));
  }
  return fp32_from_bits(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

// The same value as f16_to_f32, computed without branches so that a loop over a row vectorises: the f16
// exponent and mantissa moved to f32's places read as an f32 112 binades too small, and multiplying by 2^112
// is exact for normals and subnormals alike (with subnormal inputs not flushed to zero, the default);
// exponent 0x1f (inf, NaN) becomes f32's 0xff. The select is a mask: GCC does not if-convert around the
// multiply under the default -ftrapping-math, and a branch would keep the loop scalar.
inline float f16_to_f32_branchless(uint16_t h) {
  const uint32_t em = static_cast<uint32_t>(h & 0x7fffu) << 13;
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t mag = fp32_to_bits(fp32_from_bits(em) * 0x1p112f);
  const uint32_t inf_nan = 0u - static_cast<uint32_t>(em >= 0x0f800000u);  // all ones for exponent 0x1f
  return fp32_from_bits(sign | (mag & ~inf_nan) | ((em | 0x7f800000u) & inf_nan));
}

// f32 -> f16 bits, round to nearest even; overflow -> inf; NaN stays NaN.
inline uint16_t f32_to_f16(float f) {
  const uint32_t x = fp32_to_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {                                               // result is subnormal or zero
    // value * 2^24 rounded to nearest even, as an integer mantissa
    const float scaled = fp32_from_bits(abs) * 16777216.0f;  // exact for the range involved
    uint32_t m = static_cast<uint32_t>(scaled);
    const float rem = scaled - static_cast<float>(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u) - 0x38000000u;  // rebias 127->15, round to even
  return static_cast<uint16_t>(sign | (r >> 13));
}

inline float bf16_to_f32(uint16_t b) { return fp32_from_bits(static_cast<uint32_t>(b) << 16); }

// f32 -> bf16 bits, round to nearest even; NaN stays quiet NaN.
inline uint16_t f32_to_bf16(float f) {
  const uint32_t x = fp32_to_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// float8_e4m3fn (the OCP FP8 E4M3 format as PyTorch and safetensors' F8_E4M3 define it): 1 sign bit, 4
// exponent bits (bias 7), 3 mantissa bits. It has no infinities: S.1111.111 is NaN, and S.1111.110 = +-448 is
// the largest magnitude. Exponent 0 holds the subnormals m/8 * 2^-6 (and the two zeros).

// The largest e4m3fn magnitude: a scale of max |x| / kF8E4M3Max maps a block or row onto the whole range.
inline constexpr float kF8E4M3Max = 448.0f;

// e4m3fn bits -> f32 (exact: every e4m3fn value is an f32). constexpr so that a table of all 256 values can
// be built at compile time.
constexpr float f8_e4m3_to_f32(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exp = (b >> 3) & 0xfu, mant = b & 0x7u;
  if (exp == 0xf && mant == 0x7) return std::bit_cast<float>(sign | 0x7fc00000u);  // NaN
  if (exp == 0) {
    // Subnormal (or zero): m * 2^-9, exact in f32.
    const float mag = static_cast<float>(mant) * 0x1p-9f;
    return sign != 0 ? -mag : mag;
  }
  return std::bit_cast<float>(sign | ((exp + 127 - 7) << 23) | (mant << 20));
}

// f32 -> e4m3fn bits, round to nearest even. Magnitudes beyond 448 (infinities included) saturate to +-448,
// since the format has no infinity and a weight that overflows is better held at the largest value than
// turned into NaN; a NaN stays NaN (0x7f with its sign).
constexpr uint8_t f32_to_f8_e4m3(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint8_t>((x >> 24) & 0x80u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);   // NaN
  if (abs >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7eu);  // >= 448: saturate
  if (abs < 0x3c800000u) {  // below 2^-6, the smallest normal: a multiple of 2^-9 (8 of them is 2^-6)
    const float scaled = std::bit_cast<float>(abs) * 512.0f;  // exact: a power of two
    auto m = static_cast<uint32_t>(scaled);
    const float rem = scaled - static_cast<float>(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return static_cast<uint8_t>(sign | m);  // m = 8 is exponent 1, mantissa 0: 2^-6, as it should be
  }
  // Drop 20 of f32's 23 mantissa bits rounding to even, then rebias the exponent from 127 to 7. A carry out
  // of the mantissa moves to the next binade, which stays within 448 since the input is below it.
  const uint32_t r = abs + 0x7ffffu + ((abs >> 20) & 1u) - ((127u - 7u) << 23);
  return static_cast<uint8_t>(sign | (r >> 20));
}

}  // namespace kiln
