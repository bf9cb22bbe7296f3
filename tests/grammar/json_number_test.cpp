// Integer and number ranges of JSON schemas (json_number.h through json_schema.h): every candidate text in a
// window is accepted exactly when it is a JSON number in the range, by an oracle over doubles (the candidates
// have few digits, so doubles order them exactly).
#include "grammar/json_number.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <regex>
#include <string>
#include <vector>

#include "byte_matcher.h"
#include "grammar/json_schema.h"

namespace kiln::grammar {
namespace {

using test::ByteMatcher;
using Json = nlohmann::ordered_json;

struct Range {
  const char* bounds;  // the schema's bound keywords, as JSON members
  double lo, hi;       // the oracle: lo <= x <= hi (< when exclusive); +-1e300 for none
  bool lo_exclusive, hi_exclusive;
};

bool in_range(const Range& r, double x) {
  const bool above = r.lo_exclusive ? x > r.lo : x >= r.lo;
  const bool below = r.hi_exclusive ? x < r.hi : x <= r.hi;
  return above && below;
}

ByteMatcher matcher_for(const char* type, const char* bounds) {
  const std::string schema = std::string(R"({"type": ")") + type + "\", " + bounds + "}";
  auto gbnf = json_schema_to_gbnf(Json::parse(schema));
  EXPECT_TRUE(gbnf.ok()) << schema << ": " << gbnf.status().to_string();
  return ByteMatcher(gbnf.ok() ? *gbnf : "root ::= \"unused\"");
}

TEST(JsonNumberRange, IntegersExactlyInRange) {
  const double inf = 1e300;
  const std::vector<Range> ranges = {
      {R"("minimum": -12, "maximum": 345)", -12, 345, false, false},
      {R"("minimum": 0)", 0, inf, false, false},
      {R"("minimum": 1, "maximum": 1)", 1, 1, false, false},
      {R"("maximum": 99)", -inf, 99, false, false},
      {R"("maximum": -7)", -inf, -7, false, false},
      {R"("minimum": -1000, "maximum": -10)", -1000, -10, false, false},
      {R"("exclusiveMinimum": 9, "exclusiveMaximum": 101)", 9, 101, true, true},
      {R"("minimum": 9.5, "maximum": 100.5)", 9.5, 100.5, false, false},
      {R"("minimum": -9.5, "exclusiveMaximum": 0)", -9.5, 0, false, true},
      {R"("exclusiveMinimum": -1, "exclusiveMaximum": 1)", -1, 1, true, true},
      {R"("minimum": 5, "exclusiveMinimum": 5)", 5, inf, true, false},
      {R"("minimum": 7, "exclusiveMinimum": true)", 7, inf, true, false},
      {R"("minimum": 190, "maximum": 1099)", 190, 1099, false, false},
      {R"("minimum": 0, "maximum": 1000)", 0, 1000, false, false},
  };
  for (const auto& r : ranges) {
    SCOPED_TRACE(r.bounds);
    ByteMatcher m = matcher_for("integer", r.bounds);
    for (int x = -1100; x <= 1100; ++x) {
      ASSERT_EQ(m.accepts(std::to_string(x)), in_range(r, x)) << x << "\n" << m.gbnf();
    }
    for (const char* bad : {"-0", "007", "1.0", "+1", "1e1", ""}) EXPECT_FALSE(m.accepts(bad)) << bad;
  }
}

TEST(JsonNumberRange, LargeIntegers) {
  ByteMatcher from = matcher_for("integer", R"("minimum": 12345678901234567890)");
  EXPECT_TRUE(from.accepts("12345678901234567890"));
  EXPECT_TRUE(from.accepts("99999999999999999999"));
  EXPECT_FALSE(from.accepts("12345678901234567889"));
  EXPECT_FALSE(from.accepts("100000000000000000000"));  // more digits than the bound and kNumberIntDigits
  ByteMatcher below = matcher_for("integer", R"("maximum": -9223372036854775808)");
  EXPECT_TRUE(below.accepts("-9223372036854775808"));
  EXPECT_FALSE(below.accepts("-9223372036854775807"));
  ByteMatcher any = matcher_for("integer", R"("minimum": 0)");
  EXPECT_TRUE(any.accepts(std::string(kNumberIntDigits, '9')));
  EXPECT_FALSE(any.accepts("1" + std::string(kNumberIntDigits, '0')));
}

TEST(JsonNumberRange, NumbersExactlyInRange) {
  const double inf = 1e300;
  const std::vector<Range> ranges = {
      {R"("minimum": 0, "maximum": 1)", 0, 1, false, false},
      {R"("exclusiveMinimum": 0, "exclusiveMaximum": 1)", 0, 1, true, true},
      {R"("minimum": -1.5, "maximum": 2.25)", -1.5, 2.25, false, false},
      {R"("exclusiveMinimum": -1.5, "maximum": 2.25)", -1.5, 2.25, true, false},
      {R"("minimum": 0.05)", 0.05, inf, false, false},
      {R"("exclusiveMaximum": -0.5)", -inf, -0.5, false, true},
      {R"("minimum": -2.25, "exclusiveMaximum": -0.25)", -2.25, -0.25, false, true},
      {R"("minimum": 3.5, "maximum": 3.75)", 3.5, 3.75, false, false},
      {R"("exclusiveMinimum": 3.5, "exclusiveMaximum": 3.75)", 3.5, 3.75, true, true},
      {R"("minimum": 1.5, "maximum": 1.5)", 1.5, 1.5, false, false},
      {R"("minimum": 0, "exclusiveMaximum": 0.001)", 0, 0.001, false, true},
      {R"("minimum": 10, "maximum": 12.5)", 10, 12.5, false, false},
      {R"("exclusiveMinimum": -0.001, "exclusiveMaximum": 0.001)", -0.001, 0.001, true, true},
      {R"("maximum": 1e1)", -inf, 10, false, false},
      {R"("minimum": -25e-1, "maximum": 0.0)", -2.5, 0, false, false},
  };
  std::vector<std::string> candidates = {"-0", "-0.0", "01", "1.", ".5", "1e0", "+1", "0.5e1", "--1", ""};
  for (int i = -25; i <= 25; ++i) {
    for (const char* frac : {"", ".0", ".5", ".25", ".05", ".50", ".999", ".001", ".0001", ".75", ".251"}) {
      for (const char* sign : {"", "-"}) {
        if (i < 0 && sign[0] == '-') continue;
        candidates.push_back(sign + std::to_string(i) + frac);
      }
    }
  }
  const std::regex json_number(R"(-?(0|[1-9][0-9]*)(\.[0-9]+)?)");
  for (const auto& r : ranges) {
    SCOPED_TRACE(r.bounds);
    ByteMatcher m = matcher_for("number", r.bounds);
    for (const auto& c : candidates) {
      const bool syntax = std::regex_match(c, json_number);
      const double x = syntax ? std::strtod(c.c_str(), nullptr) : 0;
      const bool negative_zero = syntax && c[0] == '-' && x == 0;
      const bool expected = syntax && !negative_zero && in_range(r, x);
      EXPECT_EQ(m.accepts(c), expected) << c << "\n" << m.gbnf();
    }
  }
}

TEST(JsonNumberRange, FractionDigitsAreBounded) {
  ByteMatcher m = matcher_for("number", R"("minimum": 0, "maximum": 1)");
  EXPECT_TRUE(m.accepts("0." + std::string(kNumberFracDigits, '3')));
  EXPECT_FALSE(m.accepts("0." + std::string(kNumberFracDigits + 1, '3')));
  // A bound with more fraction digits than that gets them all.
  ByteMatcher fine = matcher_for("number", R"("exclusiveMinimum": 0.000000000000000000001, "maximum": 1)");
  EXPECT_TRUE(fine.accepts("0.000000000000000000002"));
  EXPECT_FALSE(fine.accepts("0.000000000000000000001"));
  EXPECT_FALSE(fine.accepts("0"));
}

TEST(JsonNumberRange, DecimalParse) {
  auto d = decimal_parse("-12.50e1");
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->negative);
  EXPECT_EQ(d->int_digits, "125");
  EXPECT_EQ(d->frac_digits, "");
  d = decimal_parse("0.00125E+2");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->int_digits, "0");
  EXPECT_EQ(d->frac_digits, "125");
  d = decimal_parse("-0.0");
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->negative);
  EXPECT_EQ(decimal_parse("1e500").status().code(), StatusCode::resource_exhausted);
  EXPECT_EQ(decimal_parse("1.").status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(decimal_parse("abc").status().code(), StatusCode::invalid_argument);
  EXPECT_LT(decimal_compare(*decimal_parse("-2"), *decimal_parse("-1.5")), 0);
  EXPECT_EQ(decimal_compare(*decimal_parse("1.50"), *decimal_parse("15e-1")), 0);
}

}  // namespace
}  // namespace kiln::grammar
