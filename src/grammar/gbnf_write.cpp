#include "grammar/gbnf_write.h"

#include <fmt/format.h>

#include <algorithm>

#include "tokenizer/unicode.h"

namespace kiln::grammar {

namespace {

constexpr std::pair<uint32_t, uint32_t> kSurrogates{0xD800, 0xDFFF};

// \xHH, \uHHHH or \UHHHHHHHH: the shortest that holds cp.
void append_hex_escape(std::string& out, uint32_t cp) {
  if (cp <= 0xFF) {
    out += fmt::format("\\x{:02X}", cp);
  } else if (cp <= 0xFFFF) {
    out += fmt::format("\\u{:04X}", cp);
  } else {
    out += fmt::format("\\U{:08X}", cp);
  }
}

void append_literal_char(std::string& out, uint32_t cp) {
  switch (cp) {
    case '"': out += "\\\""; return;
    case '\\': out += "\\\\"; return;
    case '\n': out += "\\n"; return;
    case '\r': out += "\\r"; return;
    case '\t': out += "\\t"; return;
    default: break;
  }
  if (cp >= 0x20 && cp < 0x7F) {
    out += static_cast<char>(cp);
  } else {
    append_hex_escape(out, cp);
  }
}

// Inside [...]: letters, digits and punctuation that has no meaning there as is; everything else escaped.
void append_class_char(std::string& out, uint32_t cp) {
  const bool plain =
      (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9') ||
      (cp < 0x7F &&
       std::string_view(" !#$%&'()*+,./:;<=>?@_`{|}~").find(static_cast<char>(cp)) != std::string_view::npos);
  if (plain) {
    out += static_cast<char>(cp);
  } else {
    append_hex_escape(out, cp);
  }
}

std::string class_text(const CodeRanges& set, bool negated) {
  std::string out = negated ? "[^" : "[";
  for (const auto& [lo, hi] : set) {
    append_class_char(out, lo);
    if (hi == lo) continue;
    if (hi > lo + 1) out += '-';
    append_class_char(out, hi);
  }
  out += ']';
  return out;
}

}  // namespace

CodeRanges code_ranges_normalize(CodeRanges ranges) {
  std::sort(ranges.begin(), ranges.end());
  CodeRanges out;
  for (const auto& r : ranges) {
    if (!out.empty() && r.first <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, r.second);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

CodeRanges code_ranges_complement(const CodeRanges& set) {
  CodeRanges out;
  uint32_t next = 0;  // the first code point not yet covered
  for (const auto& [lo, hi] : set) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return out;
}

CodeRanges code_ranges_subtract(const CodeRanges& a, const CodeRanges& b) {
  CodeRanges keep = code_ranges_complement(b), out;
  for (const auto& [alo, ahi] : a) {
    for (const auto& [klo, khi] : keep) {
      const uint32_t lo = std::max(alo, klo), hi = std::min(ahi, khi);
      if (lo <= hi) out.emplace_back(lo, hi);
    }
  }
  return out;
}

bool code_ranges_contain(const CodeRanges& set, uint32_t cp) {
  return std::any_of(set.begin(), set.end(), [&](const auto& r) { return r.first <= cp && cp <= r.second; });
}

std::string gbnf_literal(std::string_view utf8) {
  std::string out = "\"";
  for (size_t pos = 0; pos < utf8.size();) {
    uint32_t cp = 0;
    const size_t n = unicode::utf8_decode(utf8, pos, cp);
    if (n == 0) {  // callers pass valid UTF-8; keep the byte's value rather than lose it
      cp = static_cast<uint8_t>(utf8[pos]);
      pos += 1;
    } else {
      pos += n;
    }
    append_literal_char(out, cp);
  }
  out += '"';
  return out;
}

std::string gbnf_literal(const std::vector<uint32_t>& code_points) {
  std::string out = "\"";
  for (uint32_t cp : code_points) append_literal_char(out, cp);
  out += '"';
  return out;
}

std::string gbnf_class(const CodeRanges& any_set) {
  // Surrogates never occur in UTF-8 text (and GBNF cannot name them): add them where that merges ranges (the
  // ends stay outside them), leave them out of complements.
  const CodeRanges set = code_ranges_subtract(any_set, {kSurrogates});
  CodeRanges with_surrogates = set;
  with_surrogates.push_back(kSurrogates);
  with_surrogates = code_ranges_normalize(std::move(with_surrogates));
  const CodeRanges& positive = with_surrogates.size() < set.size() ? with_surrogates : set;
  const CodeRanges negative = code_ranges_complement(with_surrogates);
  std::string pos_text = class_text(positive, false);
  if (negative.empty()) return pos_text;
  std::string neg_text = class_text(negative, true);
  return neg_text.size() < pos_text.size() ? neg_text : pos_text;
}

bool json_needs_escape(uint32_t cp) { return cp < 0x20 || cp == '"' || cp == '\\' || cp == 0x7F; }

std::string json_escape_code_point(uint32_t cp) {
  switch (cp) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\b': return "\\b";
    case '\f': return "\\f";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    default: break;
  }
  if (json_needs_escape(cp)) return fmt::format("\\u{:04x}", cp);
  std::string out;
  unicode::utf8_append(out, cp);
  return out;
}

bool json_escape_string(std::string_view utf8, std::string& out) {
  for (size_t pos = 0; pos < utf8.size();) {
    uint32_t cp = 0;
    const size_t n = unicode::utf8_decode(utf8, pos, cp);
    if (n == 0) return false;
    if (json_needs_escape(cp)) {
      out += json_escape_code_point(cp);
    } else {
      out.append(utf8.substr(pos, n));
    }
    pos += n;
  }
  return true;
}

std::string gbnf_repeat(const std::string& item, int64_t lo, int64_t hi) {
  if (hi == 0) return "";
  if (lo == 1 && hi == 1) return item;
  if (lo == 0 && hi == 1) return item + "?";
  if (lo == 0 && hi < 0) return item + "*";
  if (lo == 1 && hi < 0) return item + "+";
  if (hi < 0) return fmt::format("{}{{{},}}", item, lo);
  if (lo == hi) return fmt::format("{}{{{}}}", item, lo);
  return fmt::format("{}{{{},{}}}", item, lo, hi);
}

std::string gbnf_seq(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  return a + " " + b;
}

}  // namespace kiln::grammar
