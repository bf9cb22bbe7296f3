#include "grammar/json_number.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "grammar/gbnf_write.h"

namespace kiln::grammar {

namespace {

// gbnf_repeat over counts.
std::string repeat_n(const std::string& item, size_t lo, size_t hi) {
  return gbnf_repeat(item, static_cast<int64_t>(lo), static_cast<int64_t>(hi));
}

// ---- Magnitudes: digit strings without leading zeros ("0" for zero).

int mag_compare(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return a.size() < b.size() ? -1 : 1;
  const int c = a.compare(b);
  return c < 0 ? -1 : (c > 0 ? 1 : 0);
}

std::string mag_inc(std::string a) {
  for (size_t i = a.size(); i-- > 0;) {
    if (a[i] != '9') {
      ++a[i];
      return a;
    }
    a[i] = '0';
  }
  return "1" + a;
}

std::string mag_dec(std::string a) {  // a > 0
  for (size_t i = a.size(); i-- > 0;) {
    if (a[i] != '0') {
      --a[i];
      break;
    }
    a[i] = '9';
  }
  const size_t nz = a.find_first_not_of('0');
  return nz == std::string::npos ? "0" : a.substr(nz);
}

std::string nines(size_t n) { return std::string(n, '9'); }
std::string zeros(size_t n) { return std::string(n, '0'); }
bool all_of(std::string_view s, char c) { return s.find_first_not_of(c) == std::string_view::npos; }

// ---- GBNF pieces.

std::string lit(std::string_view digits) { return fmt::format("\"{}\"", digits); }
std::string digit_class(char lo, char hi) {
  return lo == hi ? lit(std::string(1, lo)) : fmt::format("[{}-{}]", lo, hi);
}

// Alternatives (each non-empty) as one expression.
std::string group(const std::vector<std::string>& alternatives) {
  if (alternatives.size() == 1) return alternatives[0];
  std::string out = "(";
  for (size_t i = 0; i < alternatives.size(); ++i) out += (i > 0 ? " | " : "") + alternatives[i];
  return out + ")";
}

// Digit strings of length n between a and b (a <= b, both of length n).
std::string same_length_range(std::string_view a, std::string_view b) {
  size_t p = 0;
  while (p < a.size() && a[p] == b[p]) ++p;
  if (p == a.size()) return lit(a);
  const std::string head = p > 0 ? lit(a.substr(0, p)) : "";
  a = a.substr(p);
  b = b.substr(p);
  const size_t rest = a.size() - 1;
  const bool from_all = all_of(a.substr(1), '0'), to_all = all_of(b.substr(1), '9');
  const char first = from_all ? a[0] : static_cast<char>(a[0] + 1);
  const char last = to_all ? b[0] : static_cast<char>(b[0] - 1);
  std::vector<std::string> alternatives;
  if (!from_all)
    alternatives.push_back(gbnf_seq(lit(a.substr(0, 1)), same_length_range(a.substr(1), nines(rest))));
  if (first <= last)
    alternatives.push_back(gbnf_seq(digit_class(first, last), repeat_n("[0-9]", rest, rest)));
  if (!to_all)
    alternatives.push_back(gbnf_seq(lit(b.substr(0, 1)), same_length_range(zeros(rest), b.substr(1))));
  return gbnf_seq(head, group(alternatives));
}

// Integers in [a, b] written without leading zeros (magnitudes, a <= b).
std::string uint_range(const std::string& a, const std::string& b) {
  if (a.size() == b.size()) return same_length_range(a, b);
  std::vector<std::string> alternatives{same_length_range(a, nines(a.size()))};
  if (b.size() >= a.size() + 2)
    alternatives.push_back(gbnf_seq("[1-9]", repeat_n("[0-9]", a.size(), b.size() - 2)));
  alternatives.push_back(same_length_range("1" + zeros(b.size() - 1), b));
  return group(alternatives);
}

// ---- Signed integers.

struct SInt {
  bool negative = false;
  std::string mag = "0";
};

SInt sint_inc(SInt x) {
  if (!x.negative) return {false, mag_inc(x.mag)};
  x.mag = mag_dec(x.mag);
  x.negative = x.mag != "0";
  return x;
}
SInt sint_dec(SInt x) {
  if (x.negative || x.mag == "0") return {true, mag_inc(x.mag)};
  return {false, mag_dec(x.mag)};
}
int sint_compare(const SInt& a, const SInt& b) {
  if (a.negative != b.negative) return a.negative ? -1 : 1;
  const int c = mag_compare(a.mag, b.mag);
  return a.negative ? -c : c;
}

// The least integer in range above a lower bound, the greatest below an upper bound.
SInt lowest_integer(const NumberBound& b) {
  const Decimal& v = b.value;
  if (v.frac_digits.empty()) {
    const SInt x{v.negative, v.int_digits};
    return b.exclusive ? sint_inc(x) : x;
  }
  if (v.negative) return {v.int_digits != "0", v.int_digits};  // ceil(-3.5) = -3
  return {false, mag_inc(v.int_digits)};
}
SInt highest_integer(const NumberBound& b) {
  const Decimal& v = b.value;
  if (v.frac_digits.empty()) {
    const SInt x{v.negative, v.int_digits};
    return b.exclusive ? sint_dec(x) : x;
  }
  if (v.negative) return {true, mag_inc(v.int_digits)};  // floor(-3.5) = -4
  return {false, v.int_digits};
}

// ---- Fractions: the digit strings d after the point (d may be empty: no point), compared as 0.d.

struct Lang {
  bool empty_ok = false;  // the empty string (no fraction) is in
  std::string nonempty;   // an expression for the non-empty strings in, or "" when there are none
};

// `digit` then a string of `rest`: nullopt when rest holds nothing.
std::optional<std::string> digit_then(const std::string& digit, const Lang& rest) {
  if (rest.nonempty.empty()) return rest.empty_ok ? std::optional<std::string>(digit) : std::nullopt;
  if (rest.empty_ok) return digit + " (" + rest.nonempty + ")?";
  return digit + " " + rest.nonempty;
}

Lang alternatives_lang(bool empty_ok, const std::vector<std::optional<std::string>>& options) {
  std::vector<std::string> kept;
  for (const auto& o : options) {
    if (o) kept.push_back(*o);
  }
  return {empty_ok, kept.empty() ? "" : group(kept)};
}

Lang any_fraction(size_t budget) { return {true, repeat_n("[0-9]", 1, budget)}; }

// Non-empty strings of at most `budget` digits with a digit other than 0.
std::string nonzero_fraction(size_t budget) {
  std::vector<std::string> alternatives{gbnf_seq("[1-9]", repeat_n("[0-9]", 0, budget - 1))};
  if (budget >= 2) alternatives.push_back(gbnf_seq(lit("0"), nonzero_fraction(budget - 1)));
  return group(alternatives);
}

// 0.d >= 0.f (> when strict), |d| <= budget.
Lang fraction_at_least(std::string_view f, bool strict, size_t budget) {
  if (f.empty())
    return strict ? Lang{false, budget > 0 ? nonzero_fraction(budget) : ""} : any_fraction(budget);
  if (budget == 0) return {};
  const char f1 = f[0];
  return alternatives_lang(
      false, {f1 < '9' ? digit_then(digit_class(static_cast<char>(f1 + 1), '9'), any_fraction(budget - 1))
                       : std::nullopt,
              digit_then(lit(f.substr(0, 1)), fraction_at_least(f.substr(1), strict, budget - 1))});
}

// 0.d <= 0.f (< when strict), |d| <= budget.
Lang fraction_at_most(std::string_view f, bool strict, size_t budget) {
  if (f.empty()) return strict ? Lang{} : Lang{true, repeat_n(lit("0"), 1, budget)};
  if (budget == 0) return {true, ""};
  const char f1 = f[0];
  return alternatives_lang(
      true, {f1 > '0' ? digit_then(digit_class('0', static_cast<char>(f1 - 1)), any_fraction(budget - 1))
                      : std::nullopt,
             digit_then(lit(f.substr(0, 1)), fraction_at_most(f.substr(1), strict, budget - 1))});
}

// 0.a <= 0.d <= 0.b (strict ends as said), 0.a <= 0.b.
Lang fraction_between(std::string_view a, std::string_view b, bool a_strict, bool b_strict, size_t budget) {
  if (a.empty() && b.empty()) return a_strict || b_strict ? Lang{} : fraction_at_most("", false, budget);
  const bool empty_ok = a.empty() && !a_strict;  // here b > 0
  if (budget == 0) return {empty_ok, ""};
  const char a1 = a.empty() ? '0' : a[0], b1 = b[0];
  const std::string_view ar = a.empty() ? a : a.substr(1), br = b.substr(1);
  if (a1 == b1) {
    return alternatives_lang(
        empty_ok,
        {digit_then(lit(std::string(1, a1)), fraction_between(ar, br, a_strict, b_strict, budget - 1))});
  }
  return alternatives_lang(
      empty_ok,
      {digit_then(lit(std::string(1, a1)), fraction_at_least(ar, a_strict, budget - 1)),
       a1 + 1 <= b1 - 1 ? digit_then(digit_class(static_cast<char>(a1 + 1), static_cast<char>(b1 - 1)),
                                     any_fraction(budget - 1))
                        : std::nullopt,
       digit_then(lit(std::string(1, b1)), fraction_at_most(br, b_strict, budget - 1))});
}

std::optional<std::string> with_fraction(const std::string& integer, const Lang& f) {
  if (f.nonempty.empty()) return f.empty_ok ? std::optional<std::string>(integer) : std::nullopt;
  if (f.empty_ok) return integer + " (\".\" " + f.nonempty + ")?";
  return integer + " \".\" " + f.nonempty;
}

// Non-negative decimals m with lo <= m (< when strict) and m <= hi when hi is set; the range is not empty.
struct MagBound {
  Decimal value;  // not negative
  bool exclusive = false;
};
std::string magnitude_range(const MagBound& lo, const std::optional<MagBound>& hi, size_t int_cap,
                            size_t frac_cap) {
  std::vector<std::optional<std::string>> options;
  const std::string& li = lo.value.int_digits;
  if (hi && hi->value.int_digits == li) {
    options.push_back(with_fraction(lit(li), fraction_between(lo.value.frac_digits, hi->value.frac_digits,
                                                              lo.exclusive, hi->exclusive, frac_cap)));
  } else {
    options.push_back(
        with_fraction(lit(li), fraction_at_least(lo.value.frac_digits, lo.exclusive, frac_cap)));
    const std::string mid_lo = mag_inc(li), mid_hi = hi ? mag_dec(hi->value.int_digits) : nines(int_cap);
    if (mag_compare(mid_lo, mid_hi) <= 0)
      options.push_back(with_fraction(uint_range(mid_lo, mid_hi), any_fraction(frac_cap)));
    if (hi) {
      options.push_back(with_fraction(lit(hi->value.int_digits),
                                      fraction_at_most(hi->value.frac_digits, hi->exclusive, frac_cap)));
    }
  }
  std::vector<std::string> kept;
  for (const auto& o : options) {
    if (o) kept.push_back(*o);
  }
  return group(kept);
}

bool magnitude_range_empty(const MagBound& lo, const std::optional<MagBound>& hi) {
  if (!hi) return false;
  const int c = decimal_compare(lo.value, hi->value);
  return c > 0 || (c == 0 && (lo.exclusive || hi->exclusive));
}

Decimal absolute(Decimal d) {
  d.negative = false;
  return d;
}

}  // namespace

Result<Decimal> decimal_parse(std::string_view text, int max_digits) {
  size_t i = 0;
  Decimal d;
  const bool negative = i < text.size() && text[i] == '-';
  if (negative) ++i;
  auto digits = [&](std::string& out) {
    const size_t first = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') out += text[i++];
    return i > first;
  };
  std::string int_part, frac_part;
  if (!digits(int_part)) return invalid_argument("'{}' is not a number", text);
  if (i < text.size() && text[i] == '.') {
    ++i;
    if (!digits(frac_part)) return invalid_argument("'{}' is not a number", text);
  }
  int64_t exponent = 0;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    bool exp_negative = false;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) exp_negative = text[i++] == '-';
    const size_t first = i;
    for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
      exponent = std::min<int64_t>(exponent * 10 + (text[i] - '0'), 1'000'000);
    }
    if (i == first) return invalid_argument("'{}' is not a number", text);
    if (exp_negative) exponent = -exponent;
  }
  if (i != text.size()) return invalid_argument("'{}' is not a number", text);
  std::string all = int_part + frac_part;
  int64_t point = static_cast<int64_t>(int_part.size()) + exponent;  // digits of `all` before the point
  const size_t nz = all.find_first_not_of('0');
  if (nz == std::string::npos) return d;  // zero
  all.erase(0, nz);
  point -= static_cast<int64_t>(nz);
  all.erase(all.find_last_not_of('0') + 1);
  const int64_t frac_len = static_cast<int64_t>(all.size()) - point;
  if (point > max_digits || frac_len > max_digits) {
    return resource_exhausted("the number {} needs more than {} digits", text, max_digits);
  }
  d.negative = negative;
  if (point <= 0) {
    d.frac_digits = zeros(static_cast<size_t>(-point)) + all;
  } else if (point >= static_cast<int64_t>(all.size())) {
    d.int_digits = all + zeros(static_cast<size_t>(point) - all.size());
  } else {
    d.int_digits = all.substr(0, static_cast<size_t>(point));
    d.frac_digits = all.substr(static_cast<size_t>(point));
  }
  return d;
}

int decimal_compare(const Decimal& a, const Decimal& b) {
  if (a.negative != b.negative) return a.negative ? -1 : 1;
  int c = mag_compare(a.int_digits, b.int_digits);
  if (c == 0) {
    const int f = a.frac_digits.compare(b.frac_digits);  // no trailing zeros: lexicographic is numeric
    c = f < 0 ? -1 : (f > 0 ? 1 : 0);
  }
  return a.negative ? -c : c;
}

std::string integer_range_gbnf(const NumberBound& lo, const NumberBound& hi) {
  std::optional<SInt> l, h;
  if (lo.set) l = lowest_integer(lo);
  if (hi.set) h = highest_integer(hi);
  if (l && h && sint_compare(*l, *h) > 0) return "";
  const size_t cap = std::max({size_t{kNumberIntDigits}, l ? l->mag.size() : 0, h ? h->mag.size() : 0});
  std::vector<std::string> parts;
  if (!l || l->negative) {  // -top .. -bottom
    const std::string top = l ? l->mag : nines(cap);
    const std::string bottom = h && h->negative ? h->mag : "1";
    parts.push_back(gbnf_seq(lit("-"), uint_range(bottom, top)));
  }
  if (!h || !h->negative) {
    const std::string bottom = l && !l->negative ? l->mag : "0";
    const std::string top = h ? h->mag : nines(cap);
    parts.push_back(uint_range(bottom, top));
  }
  return group(parts);
}

std::string number_range_gbnf(const NumberBound& lo, const NumberBound& hi) {
  if (lo.set && hi.set) {
    const int c = decimal_compare(lo.value, hi.value);
    if (c > 0 || (c == 0 && (lo.exclusive || hi.exclusive))) return "";
  }
  size_t int_cap = kNumberIntDigits, frac_cap = kNumberFracDigits;
  for (const NumberBound* b : {&lo, &hi}) {
    if (!b->set) continue;
    int_cap = std::max(int_cap, b->value.int_digits.size());
    frac_cap = std::max(frac_cap, b->value.frac_digits.size());
  }
  std::vector<std::string> parts;
  if (!lo.set || lo.value.negative) {  // "-" m with m > 0 (no "-0")
    const MagBound m_lo =
        hi.set && hi.value.negative ? MagBound{absolute(hi.value), hi.exclusive} : MagBound{Decimal{}, true};
    std::optional<MagBound> m_hi;
    if (lo.set) m_hi = MagBound{absolute(lo.value), lo.exclusive};
    if (!magnitude_range_empty(m_lo, m_hi)) {
      parts.push_back(gbnf_seq(lit("-"), magnitude_range(m_lo, m_hi, int_cap, frac_cap)));
    }
  }
  if (!hi.set || !hi.value.negative) {
    const MagBound m_lo = lo.set && !lo.value.negative ? MagBound{lo.value, lo.exclusive} : MagBound{};
    std::optional<MagBound> m_hi;
    if (hi.set) m_hi = MagBound{hi.value, hi.exclusive};
    if (!magnitude_range_empty(m_lo, m_hi)) parts.push_back(magnitude_range(m_lo, m_hi, int_cap, frac_cap));
  }
  return parts.empty() ? "" : group(parts);
}

}  // namespace kiln::grammar
