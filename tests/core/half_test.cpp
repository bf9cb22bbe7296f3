// f16 / bf16 / float8_e4m3fn conversions (core/half.h) against independent definitions: the value of every
// f16 and e4m3fn bit pattern, and "nearest representable, ties to even" checked by distance in double.
#include "core/half.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

namespace kiln {
namespace {

// The IEEE binary16 value of `h` (not NaN), computed in double from its fields.
double f16_value(uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  if (exp == 0x1f) return sign * std::numeric_limits<double>::infinity();
  if (exp == 0) return sign * std::ldexp(mant, -24);
  return sign * std::ldexp(1024 + mant, exp - 25);
}

bool f16_is_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }

TEST(Half, F16ToF32EveryBitPattern) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (f16_is_nan(static_cast<uint16_t>(h))) {
      ASSERT_TRUE(std::isnan(f)) << h;
      // sign and payload kept: the 10 mantissa bits become the top of the f32 mantissa
      ASSERT_EQ(fp32_to_bits(f), ((h & 0x8000u) << 16) | 0x7f800000u | ((h & 0x3ffu) << 13)) << h;
    } else {
      ASSERT_EQ(static_cast<double>(f), f16_value(static_cast<uint16_t>(h))) << h;
      ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << h;
    }
  }
}

TEST(Half, F16ToF32BranchlessIsBitExact) {
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    const auto b = static_cast<uint16_t>(h);
    ASSERT_EQ(fp32_to_bits(f16_to_f32_branchless(b)), fp32_to_bits(f16_to_f32(b))) << std::hex << h;
  }
}

TEST(Half, F16RoundTripsThroughF32) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const uint16_t back = f32_to_f16(f16_to_f32(static_cast<uint16_t>(h)));
    if (f16_is_nan(static_cast<uint16_t>(h))) {
      ASSERT_TRUE(f16_is_nan(back)) << h;
      ASSERT_EQ(back & 0x8000, h & 0x8000) << h;
      ASSERT_TRUE(back & 0x200) << "NaN is quiet: " << h;
    } else {
      ASSERT_EQ(back, h);
    }
  }
}

// Every midpoint between adjacent f16 values (subnormals included) rounds to the even neighbour;
// one f32 ulp either side rounds to the nearer one.
TEST(Half, F32ToF16TiesToEven) {
  for (uint16_t h = 0; h < 0x7bff; ++h) {
    for (const uint16_t sign : {uint16_t{0}, uint16_t{0x8000}}) {
      const uint16_t lo = static_cast<uint16_t>(sign | h), hi = static_cast<uint16_t>(sign | (h + 1));
      const float mid = static_cast<float>((f16_value(lo) + f16_value(hi)) / 2);  // exact in f32
      ASSERT_EQ(static_cast<double>(mid), (f16_value(lo) + f16_value(hi)) / 2);
      ASSERT_EQ(f32_to_f16(mid), (h % 2 == 0) ? lo : hi) << h;
      ASSERT_EQ(f32_to_f16(std::nextafter(mid, 0.0f)), lo) << h;
      ASSERT_EQ(f32_to_f16(std::nextafter(mid, sign ? -INFINITY : INFINITY)), hi) << h;
    }
  }
}

TEST(Half, F32ToF16Edges) {
  EXPECT_EQ(f32_to_f16(0.0f), 0x0000);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);  // largest finite
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // halfway to 2^16: to even = inf
  EXPECT_EQ(f32_to_f16(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_EQ(f32_to_f16(1e10f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-1e10f), 0xfc00);
  EXPECT_EQ(f32_to_f16(INFINITY), 0x7c00);
  EXPECT_EQ(f32_to_f16(-INFINITY), 0xfc00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // half of it: tie to even (0)
  EXPECT_EQ(f32_to_f16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_f16(-std::ldexp(1.0f, -26)), 0x8000);  // underflow keeps the sign
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -14)), 0x0400);     // smallest normal
  EXPECT_EQ(f32_to_f16(std::ldexp(1023.5f, -24)), 0x0400);  // subnormal rounding up to normal
  const uint16_t nan = f32_to_f16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(f16_is_nan(nan));
  EXPECT_TRUE(f16_is_nan(f32_to_f16(fp32_from_bits(0x7f800001u))));  // signalling NaN, low payload
  EXPECT_EQ(f32_to_f16(fp32_from_bits(0xff800001u)) & 0x8000, 0x8000);
}

// Random f32 values in and around the f16 range: the result is a nearest f16, ties to even.
TEST(Half, F32ToF16IsNearestOnRandomValues) {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<uint32_t> bits(0x2f000000u, 0x47900000u);  // 2^-33 .. past 65536
  for (int i = 0; i < 200000; ++i) {
    const float x = fp32_from_bits(bits(rng));
    const uint16_t h = f32_to_f16(x);
    const double err = std::fabs(f16_value(h) - x);
    if (h == 0x7c00) {
      ASSERT_GE(x, 65520.0f);
      continue;
    }
    ASSERT_LE(err, std::fabs(f16_value(static_cast<uint16_t>(h + 1)) - x)) << x;
    if (h > 0) {
      ASSERT_LE(err, std::fabs(f16_value(static_cast<uint16_t>(h - 1)) - x)) << x;
    }
  }
}

TEST(Half, Bf16) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    ASSERT_EQ(fp32_to_bits(bf16_to_f32(static_cast<uint16_t>(b))), b << 16);
    const bool nan = (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0;
    const uint16_t back = f32_to_bf16(bf16_to_f32(static_cast<uint16_t>(b)));
    if (nan) {
      ASSERT_EQ(back, b | 0x40) << "NaN made quiet, payload kept: " << b;
    } else {
      ASSERT_EQ(back, b);
    }
  }
  // ties to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(f32_to_bf16(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to inf
  EXPECT_EQ(f32_to_bf16(-INFINITY), 0xff80);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(f32_to_bf16(fp32_from_bits(0x0000ffffu)), 0x0001);  // subnormals round like normals
  EXPECT_EQ(f32_to_bf16(fp32_from_bits(0x7f800001u)), 0x7fc0);  // signalling NaN -> quiet
}

TEST(Half, Bf16IsNearestOnRandomValues) {
  std::mt19937 rng(99);
  for (int i = 0; i < 200000; ++i) {
    const float x = fp32_from_bits(rng() & 0x7f7fffffu);  // finite, positive
    const uint16_t b = f32_to_bf16(x);
    const double v = bf16_to_f32(b), err = std::fabs(v - x);
    if (b == 0x7f80) {
      ASSERT_GE(x, 3.3895e38f);
      continue;
    }
    ASSERT_LE(err, std::fabs(static_cast<double>(bf16_to_f32(static_cast<uint16_t>(b + 1))) - x)) << x;
    if (b > 0) {
      ASSERT_LE(err, std::fabs(static_cast<double>(bf16_to_f32(static_cast<uint16_t>(b - 1))) - x));
    }
    if (err == std::fabs(static_cast<double>(bf16_to_f32(static_cast<uint16_t>(b + 1))) - x)) {
      ASSERT_EQ(b % 2, 0) << "tie not to even: " << x;
    }
  }
}

// The float8_e4m3fn value of `b` as torch defines the format, computed in double from its fields: sign,
// exponent (bias 7), mantissa; exponent 0 is subnormal; S.1111.111 is NaN (and there is no infinity).
double e4m3_value(uint8_t b) {
  const int sign = (b >> 7) ? -1 : 1;
  const int exp = (b >> 3) & 0xf, mant = b & 0x7;
  if (exp == 0xf && mant == 0x7) return std::numeric_limits<double>::quiet_NaN();
  if (exp == 0) return sign * std::ldexp(mant, -9);  // m/8 * 2^-6
  return sign * std::ldexp(8 + mant, exp - 10);      // (1 + m/8) * 2^(e-7)
}

TEST(Half, F8E4M3ToF32EveryBitPattern) {
  for (uint32_t b = 0; b < 256; ++b) {
    const float f = f8_e4m3_to_f32(static_cast<uint8_t>(b));
    const double want = e4m3_value(static_cast<uint8_t>(b));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(f)) << b;
      EXPECT_EQ(std::signbit(f), (b & 0x80) != 0) << b;
      continue;
    }
    EXPECT_EQ(static_cast<double>(f), want) << b;
    EXPECT_EQ(std::signbit(f), (b & 0x80) != 0) << b;  // 0x80 is -0
  }
  // Landmarks of the format.
  EXPECT_EQ(f8_e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(f8_e4m3_to_f32(0xfe), -448.0f);
  EXPECT_EQ(f8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // the smallest subnormal
  EXPECT_EQ(f8_e4m3_to_f32(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(f8_e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // the smallest normal
  EXPECT_EQ(f8_e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(f8_e4m3_to_f32(0x78), 256.0f);
  EXPECT_EQ(f8_e4m3_to_f32(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(f8_e4m3_to_f32(0x80)) && f8_e4m3_to_f32(0x80) == 0.0f);
  EXPECT_TRUE(std::isnan(f8_e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(f8_e4m3_to_f32(0xff)));
  static_assert(f8_e4m3_to_f32(0x7e) == 448.0f, "usable at compile time");
}

TEST(Half, F8E4M3RoundTripsEveryFiniteCode) {
  for (uint32_t b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;  // NaN
    EXPECT_EQ(f32_to_f8_e4m3(f8_e4m3_to_f32(static_cast<uint8_t>(b))), b) << b;
  }
  EXPECT_EQ(f32_to_f8_e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(f32_to_f8_e4m3(-std::numeric_limits<float>::quiet_NaN()), 0xff);
}

TEST(Half, F8E4M3TiesToEven) {
  // Midpoints between neighbours round to the code with an even mantissa.
  EXPECT_EQ(f32_to_f8_e4m3(1.0625f), 0x38);  // between 1 (0x38) and 1.125 (0x39)
  EXPECT_EQ(f32_to_f8_e4m3(1.1875f), 0x3a);  // between 1.125 (0x39) and 1.25 (0x3a)
  EXPECT_EQ(f32_to_f8_e4m3(-1.1875f), 0xba);
  EXPECT_EQ(f32_to_f8_e4m3(432.0f), 0x7e);                      // between 416 (0x7d) and 448 (0x7e)
  EXPECT_EQ(f32_to_f8_e4m3(248.0f), 0x78);                      // between 240 (0x77) and 256 (0x78)
  EXPECT_EQ(f32_to_f8_e4m3(std::ldexp(1.0f, -10)), 0x00);       // between 0 and the smallest subnormal
  EXPECT_EQ(f32_to_f8_e4m3(3 * std::ldexp(1.0f, -10)), 0x02);   // between 0x01 and 0x02
  EXPECT_EQ(f32_to_f8_e4m3(15 * std::ldexp(1.0f, -10)), 0x08);  // between 7 * 2^-9 (0x07) and 2^-6 (0x08)
  // Just off the midpoints: the nearer one.
  EXPECT_EQ(f32_to_f8_e4m3(std::nextafter(1.0625f, 2.0f)), 0x39);
  EXPECT_EQ(f32_to_f8_e4m3(std::nextafter(1.1875f, 0.0f)), 0x39);
  EXPECT_EQ(f32_to_f8_e4m3(std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01);
}

TEST(Half, F8E4M3Saturates) {
  EXPECT_EQ(f32_to_f8_e4m3(448.0f), 0x7e);
  EXPECT_EQ(f32_to_f8_e4m3(449.0f), 0x7e);
  EXPECT_EQ(f32_to_f8_e4m3(464.0f), 0x7e);  // would round to 480, which the format lacks
  EXPECT_EQ(f32_to_f8_e4m3(1e30f), 0x7e);
  EXPECT_EQ(f32_to_f8_e4m3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(f32_to_f8_e4m3(-1e30f), 0xfe);
  EXPECT_EQ(f32_to_f8_e4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(f32_to_f8_e4m3(1e-30f), 0x00);
  EXPECT_EQ(f32_to_f8_e4m3(-1e-30f), 0x80);
}

TEST(Half, F8E4M3IsNearestOnRandomValues) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> exponent(-12.0, 9.5);
  for (int i = 0; i < 200000; ++i) {
    const auto x = static_cast<float>(std::exp2(exponent(rng)) * ((rng() & 1) ? -1.0 : 1.0));
    const uint8_t b = f32_to_f8_e4m3(x);
    const double err = std::fabs(e4m3_value(b) - x);
    if (std::fabs(x) >= 448.0f) {
      ASSERT_EQ(b & 0x7f, 0x7e) << x;
      continue;
    }
    // No finite code of the same sign is nearer, and a tie goes to the even mantissa.
    const uint32_t first = b & 0x80u;
    for (uint32_t c = first; c < first + 0x7f; ++c) {
      const double other = std::fabs(e4m3_value(static_cast<uint8_t>(c)) - x);
      ASSERT_LE(err, other) << x << " -> " << int{b} << ", code " << c << " is nearer";
      if (other == err && c != b) {
        ASSERT_EQ(b & 1, 0) << "tie not to even: " << x;
      }
    }
  }
}

}  // namespace
}  // namespace kiln
