#include "grammar/regex_syntax.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace kiln::grammar {

namespace {

const CodeRanges& digit_set() {
  static const CodeRanges s{{'0', '9'}};
  return s;
}
const CodeRanges& word_set() {
  static const CodeRanges s{{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
  return s;
}
// ECMAScript's WhiteSpace and LineTerminator code points.
const CodeRanges& space_set() {
  static const CodeRanges s = code_ranges_normalize({{'\t', '\r'},
                                                     {' ', ' '},
                                                     {0xA0, 0xA0},
                                                     {0x1680, 0x1680},
                                                     {0x2000, 0x200A},
                                                     {0x2028, 0x2029},
                                                     {0x202F, 0x202F},
                                                     {0x205F, 0x205F},
                                                     {0x3000, 0x3000},
                                                     {0xFEFF, 0xFEFF}});
  return s;
}
// `.`: everything but the line terminators.
const CodeRanges& dot_set() {
  static const CodeRanges s = code_ranges_complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}});
  return s;
}

int hex_value(uint32_t c) {
  if (c >= '0' && c <= '9') return static_cast<int>(c - '0');
  if (c >= 'a' && c <= 'f') return static_cast<int>(c - 'a' + 10);
  if (c >= 'A' && c <= 'F') return static_cast<int>(c - 'A' + 10);
  return -1;
}

int64_t sat_mul(int64_t a, int64_t b, int64_t cap) {
  if (a == 0 || b == 0) return 0;
  return a > cap / b ? cap + 1 : std::min(a * b, cap + 1);
}

class Parser {
 public:
  Parser(const RegexLimits& limits) : limits_(limits) {}

  Result<Regex> run(std::string_view pattern) {
    if (pattern.size() > limits_.max_pattern_bytes) {
      return resource_exhausted("regex: the pattern has {} bytes, past the bound {}", pattern.size(),
                                limits_.max_pattern_bytes);
    }
    for (size_t pos = 0; pos < pattern.size();) {
      uint32_t cp = 0;
      const size_t n = unicode::utf8_decode(pattern, pos, cp);
      if (n == 0) return invalid_argument("regex: invalid UTF-8 at byte offset {}", pos);
      cps_.push_back(cp);
      offsets_.push_back(pos);
      pos += n;
    }
    offsets_.push_back(pattern.size());
    Regex re;
    re.root.kind = RegexNode::Kind::alt;
    while (true) {
      RegexNode branch;
      uint8_t start = 0, end = 0;
      KILN_TRY(parse_concat(branch, 0, &start, &end));
      re.root.items.push_back(std::move(branch));
      re.anchored_start.push_back(start);
      re.anchored_end.push_back(end);
      if (at_end()) break;
      if (peek() == ')') return error_at(i_, "a ')' without its '('");
      ++i_;  // '|'
    }
    if (expanded(re.root) > limits_.max_expanded) {
      return resource_exhausted("regex: the pattern expands to more than {} characters (bound on repetition)",
                                limits_.max_expanded);
    }
    return re;
  }

 private:
  bool at_end() const { return i_ >= cps_.size(); }
  uint32_t peek(size_t ahead = 0) const { return i_ + ahead < cps_.size() ? cps_[i_ + ahead] : 0; }
  Status error_at(size_t i, std::string_view what) const {
    return invalid_argument("regex: {} at offset {}", what, offsets_[std::min(i, cps_.size())]);
  }
  Status unsupported_at(size_t i, std::string_view what) const {
    return unimplemented("regex: {} at offset {} is not supported", what, offsets_[std::min(i, cps_.size())]);
  }

  // A sequence up to '|', ')' or the end. `start`/`end` are set for a top-level branch (else null).
  Status parse_concat(RegexNode& out, int depth, uint8_t* start, uint8_t* end) {
    out.kind = RegexNode::Kind::concat;
    while (!at_end() && peek() != '|' && peek() != ')') {
      const uint32_t c = peek();
      if (c == '^') {
        if (start == nullptr || !out.items.empty())
          return unsupported_at(i_, "the anchor ^ inside the pattern");
        *start = 1;
        ++i_;
        continue;
      }
      if (c == '$') {
        const bool last = i_ + 1 >= cps_.size() || cps_[i_ + 1] == '|';
        if (end == nullptr || !last) return unsupported_at(i_, "the anchor $ inside the pattern");
        *end = 1;
        ++i_;
        continue;
      }
      RegexNode atom;
      KILN_TRY(parse_atom(atom, depth));
      KILN_TRY(parse_quantifiers(atom));
      out.items.push_back(std::move(atom));
    }
    return {};
  }

  // An atom; its code points never include surrogates (no UTF-8 text holds them).
  Status parse_atom(RegexNode& out, int depth) {
    const size_t at = i_;
    KILN_TRY(parse_atom_inner(out, depth));
    if (out.kind != RegexNode::Kind::chars) return {};
    out.chars = code_ranges_subtract(out.chars, {{0xD800, 0xDFFF}});
    if (out.chars.empty()) return error_at(at, "an escape or class of surrogates only");
    return {};
  }

  Status parse_atom_inner(RegexNode& out, int depth) {
    const size_t at = i_;
    const uint32_t c = cps_[i_++];
    out.kind = RegexNode::Kind::chars;
    switch (c) {
      case '(': return parse_group(out, depth, at);
      case '[': return parse_class(out, at);
      case '.': out.chars = dot_set(); return {};
      case '\\': {
        bool in_set = false;
        return parse_escape(out.chars, false, in_set);
      }
      case '*':
      case '+':
      case '?': return error_at(at, "nothing to repeat");
      case '{': {
        int64_t lo = 0, hi = 0;
        size_t j = at;
        if (quantifier_braces(j, lo, hi)) return error_at(at, "nothing to repeat");
        break;
      }
      default: break;
    }
    out.chars = {{c, c}};
    return {};
  }

  Status parse_group(RegexNode& out, int depth, size_t at) {
    if (depth + 1 > limits_.max_depth) {
      return resource_exhausted("regex: groups nested deeper than {} at offset {}", limits_.max_depth,
                                offsets_[at]);
    }
    if (peek() == '?') {
      const uint32_t k = peek(1);
      if (k == ':') {
        i_ += 2;
      } else if (k == '=' || k == '!' || (k == '<' && (peek(2) == '=' || peek(2) == '!'))) {
        return unsupported_at(at, "lookaround");
      } else if (k == '<' || (k == 'P' && peek(2) == '<')) {
        i_ += k == '<' ? 2 : 3;
        const size_t name_at = i_;
        while (!at_end() && peek() != '>') ++i_;
        if (at_end() || i_ == name_at) return error_at(at, "a group name without its '>'");
        ++i_;
      } else if (k == 'P' && peek(2) == '=') {
        return unsupported_at(at, "a backreference");
      } else {
        return unsupported_at(at, "an inline flag or extension group (?...)");
      }
    }
    out.kind = RegexNode::Kind::alt;
    while (true) {
      RegexNode branch;
      KILN_TRY(parse_concat(branch, depth + 1, nullptr, nullptr));
      out.items.push_back(std::move(branch));
      if (at_end()) return error_at(at, "a '(' without its ')'");
      if (cps_[i_++] == ')') break;
    }
    if (out.items.size() == 1) {
      RegexNode only = std::move(out.items[0]);
      out = std::move(only);
    }
    return {};
  }

  Status parse_class(RegexNode& out, size_t at) {
    bool negated = false;
    if (peek() == '^') {
      negated = true;
      ++i_;
    }
    CodeRanges set;
    if (peek() == ']' && !at_end()) {  // ECMAScript: [] matches nothing, [^] anything
      ++i_;
      if (!negated) return error_at(at, "an empty character class");
      out.chars = {{0, kMaxCodePoint}};
      return {};
    }
    while (true) {
      if (at_end()) return error_at(at, "a '[' without its ']'");
      if (peek() == ']') break;
      const size_t item_at = i_;
      CodeRanges lo_set;
      bool lo_is_set = false;
      KILN_TRY(class_atom(lo_set, lo_is_set));
      if (peek() == '-' && i_ + 1 < cps_.size() && cps_[i_ + 1] != ']') {
        ++i_;
        CodeRanges hi_set;
        bool hi_is_set = false;
        KILN_TRY(class_atom(hi_set, hi_is_set));
        if (lo_is_set || hi_is_set) return error_at(item_at, "a class escape as a range's end");
        const uint32_t lo = lo_set[0].first, hi = hi_set[0].first;
        if (lo > hi) return error_at(item_at, "a range out of order");
        set.emplace_back(lo, hi);
      } else {
        set.insert(set.end(), lo_set.begin(), lo_set.end());
      }
    }
    ++i_;  // ']'
    set = code_ranges_normalize(std::move(set));
    out.chars = negated ? code_ranges_complement(set) : set;
    if (out.chars.empty()) return error_at(at, "a character class that matches nothing");
    return {};
  }

  // One member of a class: a code point (`is_set` false, set = {{c, c}}) or a class escape such as \d.
  Status class_atom(CodeRanges& set, bool& is_set) {
    const uint32_t c = cps_[i_++];
    if (c == '\\') return parse_escape(set, true, is_set);
    is_set = false;
    set = {{c, c}};
    return {};
  }

  // After a backslash. Sets `set` to the escape's code points; `is_set` when it is a class (\d, \w, ...).
  Status parse_escape(CodeRanges& set, bool in_class, bool& is_set) {
    const size_t at = i_ - 1;
    if (at_end()) return error_at(at, "a trailing backslash");
    const uint32_t c = cps_[i_++];
    is_set = true;
    switch (c) {
      case 'd': set = digit_set(); return {};
      case 'D': set = code_ranges_complement(digit_set()); return {};
      case 'w': set = word_set(); return {};
      case 'W': set = code_ranges_complement(word_set()); return {};
      case 's': set = space_set(); return {};
      case 'S': set = code_ranges_complement(space_set()); return {};
      default: break;
    }
    is_set = false;
    uint32_t cp = c;
    switch (c) {
      case 't': cp = '\t'; break;
      case 'n': cp = '\n'; break;
      case 'r': cp = '\r'; break;
      case 'f': cp = '\f'; break;
      case 'v': cp = '\v'; break;
      case 'b':
        if (!in_class) return unsupported_at(at, "the word boundary \\b");
        cp = '\b';
        break;
      case 'B': return unsupported_at(at, "the word boundary \\B");
      case 'A':
      case 'z':
      case 'Z':
      case 'G': return unsupported_at(at, "an anchor escape");
      case 'k': return unsupported_at(at, "a backreference");
      case 'p':
      case 'P': return unsupported_at(at, "a Unicode property escape");
      case '0':
        if (peek() >= '0' && peek() <= '9') return unsupported_at(at, "an octal escape");
        cp = 0;
        break;
      case 'c': {
        const uint32_t l = peek();
        if (!((l >= 'a' && l <= 'z') || (l >= 'A' && l <= 'Z'))) return error_at(at, "\\c without a letter");
        ++i_;
        cp = l % 32;
        break;
      }
      case 'x': {
        const int h = hex_value(peek()), l = hex_value(peek(1));
        if (h < 0 || l < 0) return error_at(at, "\\x without two hex digits");
        i_ += 2;
        cp = static_cast<uint32_t>(h * 16 + l);
        break;
      }
      case 'u': KILN_TRY(unicode_escape(at, cp)); break;
      default:
        if (c >= '1' && c <= '9') {
          return in_class ? unsupported_at(at, "an octal escape") : unsupported_at(at, "a backreference");
        }
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return error_at(at, "an unknown escape");
        break;  // escaped punctuation or any other character: itself
    }
    set = {{cp, cp}};
    return {};
  }

  // \uHHHH or \u{H...}; i_ is past the 'u'.
  Status unicode_escape(size_t at, uint32_t& cp) {
    cp = 0;
    if (peek() == '{') {
      size_t j = i_ + 1, digits = 0;
      for (; j < cps_.size() && hex_value(cps_[j]) >= 0 && digits < 7; ++j, ++digits) {
        cp = cp * 16 + static_cast<uint32_t>(hex_value(cps_[j]));
      }
      if (digits == 0 || j >= cps_.size() || cps_[j] != '}' || cp > kMaxCodePoint) {
        return error_at(at, "a bad \\u{...} escape");
      }
      i_ = j + 1;
      return {};
    }
    for (int k = 0; k < 4; ++k) {
      const int h = hex_value(peek(static_cast<size_t>(k)));
      if (h < 0) return error_at(at, "\\u without four hex digits");
      cp = cp * 16 + static_cast<uint32_t>(h);
    }
    i_ += 4;
    // A UTF-16 surrogate pair written as two escapes is one code point.
    if (cp >= 0xD800 && cp <= 0xDBFF && peek() == '\\' && peek(1) == 'u') {
      uint32_t low = 0;
      bool four = true;
      for (size_t k = 2; k < 6; ++k) {
        const int h = hex_value(peek(k));
        four = four && h >= 0;
        if (four) low = low * 16 + static_cast<uint32_t>(h);
      }
      if (four && low >= 0xDC00 && low <= 0xDFFF) {
        cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
        i_ += 6;
      }
    }
    return {};
  }

  // {m}, {m,}, {m,n} starting at cps_[j] == '{': true (and j past the '}') when well formed.
  bool quantifier_braces(size_t& j, int64_t& lo, int64_t& hi) const {
    if (j >= cps_.size() || cps_[j] != '{') return false;
    size_t k = j + 1;
    auto number = [&](int64_t& v) {
      const size_t first = k;
      v = 0;
      for (; k < cps_.size() && cps_[k] >= '0' && cps_[k] <= '9'; ++k) {
        v = std::min<int64_t>(v * 10 + (cps_[k] - '0'), int64_t{1} << 40);
      }
      return k > first;
    };
    if (!number(lo)) return false;
    hi = lo;
    if (k < cps_.size() && cps_[k] == ',') {
      ++k;
      if (!number(hi)) hi = kRegexUnbounded;
    }
    if (k >= cps_.size() || cps_[k] != '}') return false;
    j = k + 1;
    return true;
  }

  Status parse_quantifiers(RegexNode& atom) {
    bool quantified = false;
    while (!at_end()) {
      const size_t at = i_;
      int64_t lo = 0, hi = 0;
      const uint32_t c = peek();
      if (c == '*' || c == '+' || c == '?') {
        lo = c == '+' ? 1 : 0;
        hi = c == '?' ? 1 : kRegexUnbounded;
        ++i_;
      } else if (c == '{') {
        size_t j = i_;
        if (!quantifier_braces(j, lo, hi)) return {};  // a literal '{'
        i_ = j;
      } else {
        return {};
      }
      if (quantified) return error_at(at, "nothing to repeat");
      quantified = true;
      if (lo > limits_.max_repeat || hi > limits_.max_repeat) {
        return resource_exhausted("regex: a repetition count at offset {} is past the bound {}", offsets_[at],
                                  limits_.max_repeat);
      }
      if (hi != kRegexUnbounded && hi < lo) return error_at(at, "a repetition {m,n} with n < m");
      if (peek() == '?') ++i_;  // lazy: the same language
      RegexNode rep;
      rep.kind = RegexNode::Kind::repeat;
      rep.min = lo;
      rep.max = hi;
      rep.items.push_back(std::move(atom));
      atom = std::move(rep);
    }
    return {};
  }

  // The number of code-point sets once repetitions are written out, saturated past the limit.
  int64_t expanded(const RegexNode& n) const {
    const int64_t cap = limits_.max_expanded;
    switch (n.kind) {
      case RegexNode::Kind::chars: return 1;
      case RegexNode::Kind::concat:
      case RegexNode::Kind::alt: {
        int64_t sum = 0;
        for (const auto& it : n.items) sum = std::min(sum + expanded(it), cap + 1);
        return sum;
      }
      case RegexNode::Kind::repeat: {
        const int64_t copies = n.max == kRegexUnbounded ? n.min + 1 : std::max<int64_t>(n.max, 1);
        return sat_mul(expanded(n.items[0]), copies, cap);
      }
    }
    return 0;
  }

  const RegexLimits& limits_;
  std::vector<uint32_t> cps_;    // the pattern's code points
  std::vector<size_t> offsets_;  // [cps_.size() + 1] byte offset of each code point, then the length
  size_t i_ = 0;                 // the next code point
};

// Lengths saturate here (parse_regex's bounds keep them far below).
constexpr int64_t kCap = int64_t{1} << 50;

bool within(const LengthRange& r, int64_t lo, int64_t hi) {
  return r.min >= lo && (hi == kRegexUnbounded || (r.max != kRegexUnbounded && r.max <= hi));
}
bool disjoint(const LengthRange& r, int64_t lo, int64_t hi) {
  return (r.max != kRegexUnbounded && r.max < lo) || (hi != kRegexUnbounded && r.min > hi);
}

}  // namespace

Result<Regex> parse_regex(std::string_view pattern, const RegexLimits& limits) {
  Parser parser(limits);
  return parser.run(pattern);
}

LengthRange regex_length_range(const RegexNode& node) {
  auto add = [](int64_t a, int64_t b) {
    return a == kRegexUnbounded || b == kRegexUnbounded ? kRegexUnbounded : std::min(a + b, kCap);
  };
  switch (node.kind) {
    case RegexNode::Kind::chars: return {1, 1};
    case RegexNode::Kind::concat: {
      LengthRange r{0, 0};
      for (const auto& it : node.items) {
        const LengthRange c = regex_length_range(it);
        r.min = std::min(r.min + c.min, kCap);
        r.max = add(r.max, c.max);
      }
      return r;
    }
    case RegexNode::Kind::alt: {
      LengthRange r{kCap, 0};
      for (const auto& it : node.items) {
        const LengthRange c = regex_length_range(it);
        r.min = std::min(r.min, c.min);
        r.max =
            (r.max == kRegexUnbounded || c.max == kRegexUnbounded) ? kRegexUnbounded : std::max(r.max, c.max);
      }
      return r;
    }
    case RegexNode::Kind::repeat: {
      const LengthRange c = regex_length_range(node.items[0]);
      LengthRange r{sat_mul(c.min, node.min, kCap), 0};
      if (c.max == 0) return {0, 0};
      r.max = (c.max == kRegexUnbounded || node.max == kRegexUnbounded) ? kRegexUnbounded
                                                                        : sat_mul(c.max, node.max, kCap);
      return r;
    }
  }
  return {};
}

Status regex_restrict_length(RegexNode& node, int64_t min_len, int64_t max_len, bool& empty) {
  empty = false;
  const LengthRange r = regex_length_range(node);
  if (within(r, min_len, max_len)) return {};
  if (disjoint(r, min_len, max_len)) {
    empty = true;
    return {};
  }
  const Status varies =
      unimplemented("not supported: the pattern's length varies in more than one place of a sequence");
  switch (node.kind) {
    case RegexNode::Kind::chars: return {};  // length 1: within or disjoint
    case RegexNode::Kind::alt: {
      std::vector<RegexNode> kept;
      for (auto& it : node.items) {
        bool gone = false;
        KILN_TRY(regex_restrict_length(it, min_len, max_len, gone));
        if (!gone) kept.push_back(std::move(it));
      }
      node.items = std::move(kept);
      empty = node.items.empty();
      return {};
    }
    case RegexNode::Kind::concat: {
      int64_t fixed = 0;
      RegexNode* variable = nullptr;
      for (auto& it : node.items) {
        const LengthRange c = regex_length_range(it);
        if (c.min == c.max) {
          fixed += c.min;
        } else if (variable != nullptr) {
          return varies;
        } else {
          variable = &it;
        }
      }
      if (variable == nullptr) return {};  // a fixed length: within or disjoint
      return regex_restrict_length(*variable, std::max<int64_t>(0, min_len - fixed),
                                   max_len == kRegexUnbounded ? kRegexUnbounded : max_len - fixed, empty);
    }
    case RegexNode::Kind::repeat: {
      const LengthRange c = regex_length_range(node.items[0]);
      if (node.min == 1 && node.max == 1)
        return regex_restrict_length(node.items[0], min_len, max_len, empty);
      if (c.min != c.max) return varies;
      const int64_t k = c.min;  // > 0: a zero length would be within
      const int64_t lo = std::max(node.min, (min_len + k - 1) / k);
      int64_t hi = max_len == kRegexUnbounded ? node.max : max_len / k;
      if (node.max != kRegexUnbounded && hi != kRegexUnbounded) hi = std::min(hi, node.max);
      if (hi != kRegexUnbounded && lo > hi) {
        empty = true;
        return {};
      }
      node.min = lo;
      node.max = hi;
      return {};
    }
  }
  return {};
}

void regex_make_search(Regex& re) {
  RegexNode any;
  any.kind = RegexNode::Kind::repeat;
  any.max = kRegexUnbounded;
  any.items.push_back(RegexNode{RegexNode::Kind::chars, {{0, kMaxCodePoint}}, {}, 0, 0});
  // Alternatives grouped by their anchors, so that each group gets one leading / trailing any*:
  // [2 * anchored_start + anchored_end].
  std::vector<RegexNode> groups[4];
  for (size_t i = 0; i < re.root.items.size(); ++i) {
    groups[2 * re.anchored_start[i] + re.anchored_end[i]].push_back(std::move(re.root.items[i]));
  }
  std::vector<RegexNode> branches;
  for (int g = 0; g < 4; ++g) {
    if (groups[g].empty()) continue;
    const bool start = g >= 2, end = g % 2 == 1;
    RegexNode body{RegexNode::Kind::alt, {}, std::move(groups[g]), 0, 0};
    if (!start && !end && regex_length_range(body).min == 0) {  // any* "" any*: every string
      branches.assign(1, RegexNode{RegexNode::Kind::concat, {}, {any}, 0, 0});
      break;
    }
    RegexNode branch{RegexNode::Kind::concat, {}, {}, 0, 0};
    if (!start) branch.items.push_back(any);
    branch.items.push_back(std::move(body));
    if (!end) branch.items.push_back(any);
    branches.push_back(std::move(branch));
  }
  re.root.items = std::move(branches);
  re.anchored_start.assign(re.root.items.size(), 1);
  re.anchored_end.assign(re.root.items.size(), 1);
}

}  // namespace kiln::grammar
