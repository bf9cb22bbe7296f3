// The dtype table (core/dtype.h): sizes as ggml defines them, name and id lookups, row sizes.
#include "core/dtype.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "core/half.h"

namespace kiln {
namespace {

TEST(DType, TableIsCompleteAndConsistent) {
  int count = 0;
  const DTypeInfo* table = dtype_table(&count);
  ASSERT_EQ(count, 34);  // every enumerator of DType
  std::set<std::string> names;
  for (int i = 0; i < count; ++i) {
    const DTypeInfo& t = table[i];
    SCOPED_TRACE(t.name);
    if (i > 0) {
      EXPECT_LT(static_cast<uint32_t>(table[i - 1].type), static_cast<uint32_t>(t.type));
    }
    EXPECT_EQ(&dtype_info(t.type), &t);
    EXPECT_TRUE(names.insert(t.name).second);
    for (const char* c = t.name; *c; ++c) EXPECT_FALSE(std::isupper(static_cast<unsigned char>(*c)));
    EXPECT_TRUE(t.block_size == 1 || t.block_size == 32 || t.block_size == 64 || t.block_size == 256);
    EXPECT_GT(t.type_size, 0);
    EXPECT_EQ(t.is_quantized, t.block_size > 1);
    EXPECT_EQ(t.gguf, t.type != DType::f8_e4m3 && t.type != DType::q8_64);  // the in-memory forms
    if (t.quantize_row != nullptr) {
      EXPECT_NE(t.dequantize_row, nullptr);
    }
  }
}

// Sizes as ggml defines them (f8_e4m3, kiln's own: 32 e4m3fn bytes and an f32 scale; q8_64, kiln's own: 64
// int8 codes and an f16 scale).
TEST(DType, SizesAreGgmls) {
  struct Want {
    DType type;
    int64_t block_size, type_size;
  };
  const Want wants[] = {
      {DType::f32, 1, 4},        {DType::f16, 1, 2},        {DType::bf16, 1, 2},
      {DType::q4_0, 32, 18},     {DType::q4_1, 32, 20},     {DType::q5_0, 32, 22},
      {DType::q5_1, 32, 24},     {DType::q8_0, 32, 34},     {DType::q8_1, 32, 36},
      {DType::q2_k, 256, 84},    {DType::q3_k, 256, 110},   {DType::q4_k, 256, 144},
      {DType::q5_k, 256, 176},   {DType::q6_k, 256, 210},   {DType::q8_k, 256, 292},
      {DType::iq2_xxs, 256, 66}, {DType::iq2_xs, 256, 74},  {DType::iq3_xxs, 256, 98},
      {DType::iq1_s, 256, 50},   {DType::iq4_nl, 32, 18},   {DType::iq3_s, 256, 110},
      {DType::iq2_s, 256, 82},   {DType::iq4_xs, 256, 136}, {DType::i8, 1, 1},
      {DType::i16, 1, 2},        {DType::i32, 1, 4},        {DType::i64, 1, 8},
      {DType::f64, 1, 8},        {DType::iq1_m, 256, 56},   {DType::tq1_0, 256, 54},
      {DType::tq2_0, 256, 66},   {DType::mxfp4, 32, 17},    {DType::f8_e4m3, 32, 36},
      {DType::q8_64, 64, 66},
  };
  for (const Want& w : wants) {
    SCOPED_TRACE(dtype_name(w.type));
    EXPECT_EQ(dtype_info(w.type).block_size, w.block_size);
    EXPECT_EQ(dtype_info(w.type).type_size, w.type_size);
  }
}

TEST(DType, FromGgufId) {
  int count = 0;
  const DTypeInfo* table = dtype_table(&count);
  for (int i = 0; i < count; ++i) {
    if (!table[i].gguf) continue;
    auto r = dtype_from_gguf_id(static_cast<uint32_t>(table[i].type));
    ASSERT_TRUE(r.ok()) << table[i].name;
    EXPECT_EQ(*r, table[i].type);
  }
  for (uint32_t id :
       {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 40u, 63u, 64u, 99u, 101u, 127u, 128u, 1000u, 0xffffffffu}) {
    auto r = dtype_from_gguf_id(id);
    ASSERT_FALSE(r.ok()) << id;
    EXPECT_EQ(r.status().code(), StatusCode::invalid_argument);
    EXPECT_NE(r.status().message().find(std::to_string(id)), std::string::npos) << r.status().message();
  }
}

// kiln's FP8 form has an id (100) that a GGUF file could claim: reading one is refused, by name.
TEST(DType, F8E4M3IsNotAGgufType) {
  EXPECT_EQ(static_cast<uint32_t>(DType::f8_e4m3), 100u);
  const DTypeInfo& t = dtype_info(DType::f8_e4m3);
  EXPECT_STREQ(t.name, "f8_e4m3");
  EXPECT_TRUE(t.is_quantized);
  EXPECT_FALSE(t.gguf);
  EXPECT_NE(t.dequantize_row, nullptr);
  EXPECT_NE(t.quantize_row, nullptr);
  EXPECT_EQ(t.quantize_rows, nullptr);  // no model file holds it
  auto r = dtype_from_gguf_id(100);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(r.status().message().find("100"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("kiln's in-memory forms, not a GGUF type"), std::string::npos)
      << r.status().message();
  EXPECT_EQ(dtype_from_name("F8_E4M3"), DType::f8_e4m3);
  EXPECT_EQ(*dtype_row_bytes(DType::f8_e4m3, 4096), 128 * 36);
  EXPECT_FALSE(dtype_row_bytes(DType::f8_e4m3, 48).ok());
}

// kiln's 8-bit KV cache form: q8_0's reference rounding over 64 values a scale. A block whose two halves
// differ in magnitude gives both halves the larger one's scale, where q8_0 gives each its own.
TEST(DType, Q8_64IsQ8_0OverTwiceTheValues) {
  EXPECT_EQ(static_cast<uint32_t>(DType::q8_64), 101u);
  const DTypeInfo& t = dtype_info(DType::q8_64);
  EXPECT_STREQ(t.name, "q8_64");
  EXPECT_FALSE(t.gguf);
  EXPECT_EQ(t.quantize_rows, nullptr);  // a KV cache type: no model file holds it
  EXPECT_FALSE(dtype_from_gguf_id(101).ok());
  EXPECT_EQ(*dtype_row_bytes(DType::q8_64, 128), 132);
  EXPECT_FALSE(dtype_row_bytes(DType::q8_64, 96).ok());
  std::vector<float> x(128);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = std::sin(0.37f * static_cast<float>(i)) * (i < 96 ? 0.1f : 3.0f);
  std::vector<uint8_t> q64(132), q32(4 * 34);
  t.quantize_row(x.data(), q64.data(), 128);
  dtype_info(DType::q8_0).quantize_row(x.data(), q32.data(), 128);
  // Block 0 (values 0-63, all small) as q8_0's blocks 0 and 1 would be with one scale: the larger of theirs.
  uint16_t d64 = 0, d32a = 0, d32b = 0;
  std::memcpy(&d64, q64.data(), 2);
  std::memcpy(&d32a, q32.data(), 2);
  std::memcpy(&d32b, q32.data() + 34, 2);
  EXPECT_EQ(f16_to_f32(d64), std::max(f16_to_f32(d32a), f16_to_f32(d32b)));
  std::vector<float> y(128);
  t.dequantize_row(q64.data(), y.data(), 128);
  float amax[2] = {0.0f, 0.0f};
  for (int i = 0; i < 128; ++i) amax[i / 64] = std::max(amax[i / 64], std::fabs(x[i]));
  for (int i = 0; i < 128; ++i) {
    // Within half a step of the block's scale, the f16 rounding of the scale aside.
    EXPECT_LE(std::fabs(y[i] - x[i]), amax[i / 64] / 127.0f * 0.502f + amax[i / 64] * 0x1p-10f) << i;
    int8_t code = 0;
    std::memcpy(&code, q64.data() + (i / 64) * 66 + 2 + i % 64, 1);
    uint16_t d = 0;
    std::memcpy(&d, q64.data() + (i / 64) * 66, 2);
    EXPECT_EQ(y[i], static_cast<float>(code) * f16_to_f32(d)) << i;
  }
}

TEST(DType, FromName) {
  int count = 0;
  const DTypeInfo* table = dtype_table(&count);
  for (int i = 0; i < count; ++i) {
    EXPECT_EQ(dtype_from_name(table[i].name), table[i].type);
    std::string upper = table[i].name;
    for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    EXPECT_EQ(dtype_from_name(upper), table[i].type) << upper;
    EXPECT_STREQ(dtype_name(table[i].type), table[i].name);
  }
  EXPECT_EQ(dtype_from_name("Q4_k"), DType::q4_k);
  EXPECT_EQ(dtype_from_name(""), std::nullopt);
  EXPECT_EQ(dtype_from_name("q4"), std::nullopt);
  EXPECT_EQ(dtype_from_name("q4_k "), std::nullopt);
  EXPECT_EQ(dtype_from_name("q4_kk"), std::nullopt);
  EXPECT_EQ(dtype_from_name(std::string_view("f32\0", 4)), std::nullopt);
}

TEST(DType, RowBytes) {
  EXPECT_EQ(*dtype_row_bytes(DType::f32, 0), 0);
  EXPECT_EQ(*dtype_row_bytes(DType::f32, 10), 40);
  EXPECT_EQ(*dtype_row_bytes(DType::bf16, 7), 14);
  EXPECT_EQ(*dtype_row_bytes(DType::q4_0, 64), 36);
  EXPECT_EQ(*dtype_row_bytes(DType::q4_k, 768), 432);
  EXPECT_EQ(*dtype_row_bytes(DType::mxfp4, 2880), 90 * 17);

  auto r = dtype_row_bytes(DType::q4_0, 33);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(r.status().message().find("33"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("q4_0"), std::string::npos) << r.status().message();
  EXPECT_FALSE(dtype_row_bytes(DType::q6_k, 128).ok());

  r = dtype_row_bytes(DType::f16, -1);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("-1"), std::string::npos) << r.status().message();
  EXPECT_FALSE(dtype_row_bytes(DType::q4_k, std::numeric_limits<int64_t>::min()).ok());

  // overflow: the largest counts that fit, and the next valid ones that do not
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(*dtype_row_bytes(DType::f32, kMax / 4), kMax / 4 * 4);
  EXPECT_EQ(dtype_row_bytes(DType::f32, kMax / 4 + 1).status().code(), StatusCode::out_of_range);
  EXPECT_EQ(*dtype_row_bytes(DType::q8_k, kMax / 292 * 256), kMax / 292 * 292);
  EXPECT_FALSE(dtype_row_bytes(DType::q8_k, (kMax / 292 + 1) * 256).ok());
  EXPECT_EQ(*dtype_row_bytes(DType::i8, kMax), kMax);
  EXPECT_FALSE(dtype_row_bytes(DType::f64, kMax).ok());
}

}  // namespace
}  // namespace kiln
