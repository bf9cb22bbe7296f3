// JSON numbers in a range as GBNF, exact to the digit (json_schema.cpp's minimum / maximum /
// exclusiveMinimum / exclusiveMaximum). Internal to grammar/.
//
// The numbers written: an optional "-", an integer part without leading zeros, and (for `number`) an optional
// fraction "." [0-9]+; never "-0", no exponent once a bound is set. A side without a bound allows at most
// kNumberIntDigits integer digits (or as many as the other bound has); fractions have at most
// kNumberFracDigits digits (or as many as a bound's fraction has), so that generation cannot run on forever.
#pragma once

#include <string>
#include <string_view>

#include "core/status.h"

namespace kiln::grammar {

constexpr int kNumberIntDigits = 16;
constexpr int kNumberFracDigits = 16;

// A decimal number: digits without leading zeros in the integer part ("0" for none) and without trailing
// zeros in the fraction; zero is never negative.
struct Decimal {
  bool negative = false;
  std::string int_digits = "0";
  std::string frac_digits;
};

// Parses a JSON number's text ("-12.5e3"). invalid_argument when malformed; resource_exhausted when the value
// needs more than `max_digits` digits on either side of the point.
Result<Decimal> decimal_parse(std::string_view text, int max_digits = 400);
// -1, 0, 1 as a < b, a == b, a > b.
int decimal_compare(const Decimal& a, const Decimal& b);

struct NumberBound {
  bool set = false;        // false: no bound on this side
  Decimal value;           // set: the bound
  bool exclusive = false;  // set: the bound itself is out of range
};

// A GBNF expression for the JSON integers in the range, or "" when there is none.
std::string integer_range_gbnf(const NumberBound& lo, const NumberBound& hi);
// A GBNF expression for the JSON numbers (integers and decimal fractions) in the range, or "" when there is
// none. At least one side must be set (the unbounded number is json_schema.cpp's primitive).
std::string number_range_gbnf(const NumberBound& lo, const NumberBound& hi);

}  // namespace kiln::grammar
