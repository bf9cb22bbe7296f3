// Reference quantizers (core/quant): quantize -> dequantize error bounds on random data, the
// auxiliary fields of Q8_1 / Q8_K, and hand-built K-quant blocks. Bit-exactness against ggml's
// numbers is tests/python/test_dequant.py's job.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/half.h"
#include "core/quant/quant_blocks.h"

namespace kiln {
namespace {

constexpr int64_t kBlocks = 37;         // per test row, in units of 256 elements
constexpr double kF16Eps = 1.0 / 2048;  // f16 relative rounding error bound (2^-11)

// kBlocks * 256 values: Gaussian groups of 32 whose scales span 10^-2 .. 10^2, with some
// one-signed groups and outliers.
std::vector<float> random_row(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-2.0f, 2.0f);
  std::vector<float> x(kBlocks * 256);
  for (size_t g = 0; g < x.size() / 32; ++g) {
    const float scale = std::pow(10.0f, exponent(rng));
    for (size_t j = 0; j < 32; ++j) {
      float v = normal(rng) * scale;
      if (g % 5 == 1) v = std::fabs(v);
      if (g % 5 == 2) v = -std::fabs(v);
      if (g % 5 == 3 && j == 7) v *= 30.0f;
      x[g * 32 + j] = v;
    }
  }
  return x;
}

std::vector<float> round_trip(DType type, const std::vector<float>& x) {
  const DTypeInfo& info = dtype_info(type);
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> q(static_cast<size_t>(*dtype_row_bytes(type, n)));
  info.quantize_row(x.data(), q.data(), n);
  std::vector<float> y(x.size());
  info.dequantize_row(q.data(), y.data(), n);
  return y;
}

// The largest error element x may get from quantizing its block `b` (n elements) of `type`.
double error_bound(DType type, const float* b, int n, float x) {
  float amax = 0.0f, min = b[0], max = b[0], signed_max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (std::fabs(b[j]) > amax) {
      amax = std::fabs(b[j]);
      signed_max = b[j];
    }
    min = std::min(min, b[j]);
    max = std::max(max, b[j]);
  }
  const double slack = 1e-6 * amax;  // f32 arithmetic
  auto symmetric = [&](double levels) {
    // d = signed_max / -levels; elements at or beyond (levels - 0.5) steps on the far side clip.
    const double d = amax / levels;
    const double steps = x / (signed_max / -levels);
    return (steps < levels - 0.5 ? 0.5 * d : d) + levels * d * kF16Eps + slack;
  };
  auto asymmetric = [&](double levels) {
    const double d = (static_cast<double>(max) - min) / levels;
    return 0.5 * d + levels * d * kF16Eps + std::fabs(min) * kF16Eps + slack;
  };
  switch (type) {
    case DType::q4_0: return symmetric(8);
    case DType::q5_0: return symmetric(16);
    case DType::q4_1: return asymmetric(15);
    case DType::q5_1: return asymmetric(31);
    case DType::q8_0:
    case DType::q8_1:
    case DType::q8_64: return 0.5 * amax / 127 + amax * kF16Eps + slack;
    case DType::q8_k: return 0.5 * amax / 127 + slack;
    case DType::f16:
      return std::max(std::fabs(x) * kF16Eps, std::ldexp(1.0, -25));  // 2^-25: subnormal half-step
    case DType::bf16: return std::fabs(x) / 256;
    case DType::f32: return 0.0;
    case DType::f8_e4m3: {
      // Half a step of e4m3fn's 3-bit mantissa (1/16 of the value) for normals; below 2^-6 (in units of the
      // scale d = amax / 448) the subnormals' fixed half step, 2^-10 d.
      const double d = amax / 448.0;
      return std::max(std::fabs(static_cast<double>(x)) / 16, d * std::ldexp(1.0, -10)) + slack;
    }
    default: ADD_FAILURE() << "no bound for " << dtype_name(type); return 0.0;
  }
}

class QuantRoundTrip : public ::testing::TestWithParam<DType> {};

TEST_P(QuantRoundTrip, ErrorWithinBound) {
  const DType type = GetParam();
  const int bs = static_cast<int>(std::max<int64_t>(32, dtype_info(type).block_size));
  const std::vector<float> x = random_row(static_cast<uint32_t>(type) + 17);
  const std::vector<float> y = round_trip(type, x);
  double err2 = 0.0, x2 = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float* block = x.data() + i / bs * bs;
    ASSERT_LE(std::fabs(static_cast<double>(y[i]) - x[i]), error_bound(type, block, bs, x[i]))
        << dtype_name(type) << " element " << i << ": " << x[i] << " -> " << y[i];
    err2 += (static_cast<double>(y[i]) - x[i]) * (static_cast<double>(y[i]) - x[i]);
    x2 += static_cast<double>(x[i]) * x[i];
  }
  // a collapsed quantizer (all zeros, constant) would pass per-element bounds on tiny blocks only
  EXPECT_LT(std::sqrt(err2 / x2), 0.2) << dtype_name(type);
}

INSTANTIATE_TEST_SUITE_P(Quant, QuantRoundTrip,
                         ::testing::Values(DType::f32, DType::f16, DType::bf16, DType::q4_0, DType::q4_1,
                                           DType::q5_0, DType::q5_1, DType::q8_0, DType::q8_1, DType::q8_k,
                                           DType::f8_e4m3, DType::q8_64),
                         [](const auto& param_info) { return std::string(dtype_name(param_info.param)); });

TEST(Quant, EveryQuantizerHasRoundTripCoverage) {
  int count = 0;
  const DTypeInfo* table = dtype_table(&count);
  int with_quantizer = 0;
  for (int i = 0; i < count; ++i) with_quantizer += table[i].quantize_row != nullptr;
  EXPECT_EQ(with_quantizer, 12) << "add the new quantizer to QuantRoundTrip";
}

TEST(Quant, ZeroBlocksStayZero) {
  int count = 0;
  const DTypeInfo* table = dtype_table(&count);
  const std::vector<float> zeros(512, 0.0f);
  for (int i = 0; i < count; ++i) {
    if (table[i].quantize_row == nullptr) continue;
    const std::vector<float> y = round_trip(table[i].type, zeros);
    for (float v : y) ASSERT_EQ(v, 0.0f) << table[i].name;
  }
}

TEST(Quant, Q8AuxiliaryFields) {
  const std::vector<float> x = random_row(5);
  std::vector<uint8_t> q(static_cast<size_t>(*dtype_row_bytes(DType::q8_1, 256)));
  quant::LegacyRow<quant::BlockQ8_1>::quantize(x.data(), q.data(), 256);
  for (int64_t i = 0; i < 256 / 32; ++i) {
    const auto b = quant::load_block<quant::BlockQ8_1>(q.data(), i);
    int sum = 0;
    for (int8_t v : b.qs) sum += v;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[i * 32 + j]));
    EXPECT_EQ(b.d, f32_to_f16(amax / 127.0f));
    EXPECT_EQ(b.s, f32_to_f16(static_cast<float>(sum) * (amax / 127.0f)));  // s = d * sum(q), d unrounded
  }
  std::vector<uint8_t> k(static_cast<size_t>(*dtype_row_bytes(DType::q8_k, 512)));
  quant::quantize_row_q8_k(x.data(), k.data(), 512);
  for (int64_t i = 0; i < 2; ++i) {
    const auto b = quant::load_block<quant::BlockQ8_K>(k.data(), i);
    bool has_127 = false;
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) {
        sum += b.qs[g * 16 + j];
        has_127 |= std::abs(b.qs[g * 16 + j]) == 127;
      }
      EXPECT_EQ(b.bsums[g], sum);
    }
    EXPECT_TRUE(has_127) << "the largest magnitude maps to +-127";
  }
}

// FP8 blocks: d = max |x| / 448, the largest element at +-448 exactly, an all-zero block d = 0, and never a
// NaN code, whatever the input.
TEST(Quant, F8E4M3Blocks) {
  std::vector<float> x = random_row(23);
  x.resize(96);
  for (int j = 32; j < 64; ++j) x[j] = 0.0f;        // block 1: all zero
  x[64] = std::numeric_limits<float>::quiet_NaN();  // block 2: a NaN among finite values
  std::vector<uint8_t> q(static_cast<size_t>(*dtype_row_bytes(DType::f8_e4m3, 96)));
  quant::quantize_row_f8_e4m3(x.data(), q.data(), 96);
  for (int64_t i = 0; i < 3; ++i) {
    const auto b = quant::load_block<quant::BlockF8E4M3>(q.data(), i);
    float amax = 0.0f;
    int at = 0;
    for (int j = 0; j < 32; ++j) {
      if (std::fabs(x[i * 32 + j]) > amax) {
        amax = std::fabs(x[i * 32 + j]);
        at = j;
      }
    }
    EXPECT_EQ(b.d, amax / 448.0f) << "block " << i;
    for (int j = 0; j < 32; ++j) EXPECT_NE(b.q[j] & 0x7f, 0x7f) << "NaN code in block " << i;
    if (amax > 0) {
      EXPECT_EQ(b.q[at], x[i * 32 + at] > 0 ? 0x7e : 0xfe) << "block " << i;
    } else {
      for (int j = 0; j < 32; ++j) EXPECT_EQ(b.q[j], 0) << "block " << i;
    }
  }
  EXPECT_EQ(quant::load_block<quant::BlockF8E4M3>(q.data(), 2).q[0], 0);  // the NaN became 0
  std::vector<float> y(96);
  quant::dequantize_row_f8_e4m3(q.data(), y.data(), 96);
  for (float v : y) EXPECT_FALSE(std::isnan(v));
}

// Rows are only byte-aligned: a row at an odd address dequantizes like an aligned copy.
TEST(Quant, UnalignedRows) {
  int count = 0;
  const DTypeInfo* table = dtype_table(&count);
  std::mt19937 rng(3);
  for (int i = 0; i < count; ++i) {
    const DTypeInfo& t = table[i];
    if (t.dequantize_row == nullptr) continue;
    const int64_t n = 512;
    const size_t bytes = static_cast<size_t>(*dtype_row_bytes(t.type, n));
    std::vector<uint8_t> aligned(bytes), shifted(bytes + 1);
    for (auto& v : aligned) v = static_cast<uint8_t>(rng() & 0x3f);  // small bytes: finite f16 scales
    std::memcpy(shifted.data() + 1, aligned.data(), bytes);
    std::vector<float> a(n), b(n);
    t.dequantize_row(aligned.data(), a.data(), n);
    t.dequantize_row(shifted.data() + 1, b.data(), n);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), n * sizeof(float)), 0) << t.name;
  }
}

// Q4_K with scale s + 1, min s and quant e % 16 for element e: y = (s + 1) * (e % 16) - 0.5 * s.
// Packs the 6-bit fields as ggml lays them out (scales 4-7 split over three bytes).
TEST(Quant, Q4KHandBuilt) {
  quant::BlockQ4_K b{};
  b.d = f32_to_f16(1.0f);
  b.dmin = f32_to_f16(0.5f);
  for (int s = 0; s < 8; ++s) {
    const int sc = s + 1 + 48 * (s >= 4), mn = s + 32 * (s >= 4);  // use the high bits for s >= 4
    if (s < 4) {
      b.scales[s] = static_cast<uint8_t>(sc);
      b.scales[s + 4] = static_cast<uint8_t>(mn);
    } else {
      b.scales[s + 4] = static_cast<uint8_t>((sc & 0x0f) | ((mn & 0x0f) << 4));
      b.scales[s - 4] = static_cast<uint8_t>(b.scales[s - 4] | ((sc >> 4) << 6));
      b.scales[s] = static_cast<uint8_t>(b.scales[s] | ((mn >> 4) << 6));
    }
  }
  for (int e = 0; e < 256; ++e) {
    const int byte = (e / 64) * 32 + e % 32;
    b.qs[byte] = static_cast<uint8_t>(b.qs[byte] | ((e % 16) << ((e / 32) % 2 ? 4 : 0)));
  }
  float y[256];
  quant::dequantize_row_q4_k(&b, y, 256);
  for (int e = 0; e < 256; ++e) {
    const int s = e / 32;
    const int sc = s + 1 + 48 * (s >= 4), mn = s + 32 * (s >= 4);
    EXPECT_EQ(y[e], static_cast<float>(sc * (e % 16)) - 0.5f * static_cast<float>(mn)) << e;
  }
}

// Q6_K with scale (s - 8) for sub-block s and quant e % 64: y = 0.25 * (s - 8) * (e % 64 - 32).
TEST(Quant, Q6KHandBuilt) {
  quant::BlockQ6_K b{};
  b.d = f32_to_f16(0.25f);
  for (int s = 0; s < 16; ++s) b.scales[s] = static_cast<int8_t>(s - 8);
  for (int e = 0; e < 256; ++e) {
    const int q = e % 64, h = e / 128, k = (e % 128) / 32, l = e % 32;
    uint8_t& ql = b.ql[h * 64 + (k % 2) * 32 + l];
    ql = static_cast<uint8_t>(ql | ((q & 0x0f) << (k / 2 ? 4 : 0)));
    b.qh[h * 32 + l] = static_cast<uint8_t>(b.qh[h * 32 + l] | ((q >> 4) << (2 * k)));
  }
  float y[256];
  quant::dequantize_row_q6_k(&b, y, 256);
  for (int e = 0; e < 256; ++e)
    EXPECT_EQ(y[e], 0.25f * static_cast<float>((e / 16 - 8) * (e % 64 - 32))) << e;
}

}  // namespace
}  // namespace kiln
