// GBNF text -> GbnfAst -> automata (build_automaton). A recursive-descent parser over bytes; positions in
// errors are 1-based lines and byte columns.
#include <algorithm>
#include <string>
#include <unordered_map>

#include "grammar/automaton.h"
#include "grammar/gbnf_ast.h"
#include "grammar/grammar.h"

namespace kiln::grammar {

CodePointSet normalize_code_points(CodePointSet ranges, bool negate) {
  std::sort(ranges.begin(), ranges.end());
  CodePointSet merged;
  for (auto [lo, hi] : ranges) {
    if (!merged.empty() && lo <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, hi);
    } else {
      merged.emplace_back(lo, hi);
    }
  }
  if (negate) {
    CodePointSet out;
    uint32_t next = 0;
    for (auto [lo, hi] : merged) {
      if (lo > next) out.emplace_back(next, lo - 1);
      next = hi + 1;
    }
    if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
    merged = std::move(out);
  }
  CodePointSet out;  // without the surrogates
  for (auto [lo, hi] : merged) {
    if (hi < kSurrogateFirst || lo > kSurrogateLast) {
      out.emplace_back(lo, hi);
      continue;
    }
    if (lo < kSurrogateFirst) out.emplace_back(lo, kSurrogateFirst - 1);
    if (hi > kSurrogateLast) out.emplace_back(kSurrogateLast + 1, hi);
  }
  return out;
}

namespace {

constexpr int32_t kMaxNesting = 256;  // parentheses and repetitions inside one another

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

class Parser {
 public:
  Parser(std::string_view text, const Limits& limits) : text_(text), limits_(limits) {}

  Result<GbnfAst> parse() {
    skip_space(true);
    while (!at_end()) {
      KILN_TRY(parse_rule());
      skip_space(true);
    }
    for (size_t r = 0; r < ast_.rules.size(); ++r) {
      if (ast_.rules[r].line == 0) {
        return error_at(first_use_[r],
                        fmt::format("rule '{}' is used but never defined", ast_.rules[r].name));
      }
    }
    auto root = ids_.find("root");
    if (root == ids_.end() || ast_.rules[static_cast<size_t>(root->second)].line == 0) {
      return invalid_argument("GBNF: no 'root' rule (the start rule must be named root)");
    }
    ast_.root = root->second;
    return std::move(ast_);
  }

 private:
  bool at_end() const { return pos_ >= text_.size(); }
  char peek(size_t ahead = 0) const { return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0'; }

  Status error_at(size_t at, std::string_view what) const {
    int32_t line = 1;
    size_t line_start = 0;
    for (size_t i = 0; i < at && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        line_start = i + 1;
      }
    }
    return invalid_argument("GBNF line {}, column {}: {}", line, at - line_start + 1, what);
  }
  Status error(std::string_view what) const { return error_at(pos_, what); }
  std::string found() const {
    if (at_end()) return "the end of the text";
    const char c = peek();
    if (c == '\n' || c == '\r') return "the end of the line";
    return fmt::format("'{}'", c);
  }

  // Spaces, tabs and # comments; newlines too when `newlines`.
  void skip_space(bool newlines) {
    while (!at_end()) {
      const char c = peek();
      if (c == ' ' || c == '\t') {
        ++pos_;
      } else if (c == '#') {
        while (!at_end() && peek() != '\n' && peek() != '\r') ++pos_;
      } else if (newlines && (c == '\n' || c == '\r')) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  int32_t rule_id(std::string_view name, size_t at) {
    auto it = ids_.find(std::string(name));
    if (it != ids_.end()) return it->second;
    const auto id = static_cast<int32_t>(ast_.rules.size());
    ids_.emplace(std::string(name), id);
    ast_.rules.push_back(RuleDef{std::string(name), Expr{}, 0});
    first_use_.push_back(at);
    return id;
  }

  Status parse_rule() {
    const size_t start = pos_;
    while (!at_end() && is_name_char(peek())) ++pos_;
    if (pos_ == start) return error(fmt::format("expected a rule name, found {}", found()));
    const std::string_view name = text_.substr(start, pos_ - start);
    skip_space(false);
    if (text_.substr(pos_, 3) != "::=") {
      return error(fmt::format("expected '::=' after the rule name '{}', found {}", name, found()));
    }
    pos_ += 3;
    const int32_t id = rule_id(name, start);
    RuleDef& def = ast_.rules[static_cast<size_t>(id)];
    if (def.line != 0) {
      return error_at(start, fmt::format("rule '{}' is defined twice (first on line {})", name, def.line));
    }
    if (ast_.rules.size() > static_cast<size_t>(limits_.max_rules)) {
      return resource_exhausted("GBNF: more than max_rules = {} rules", limits_.max_rules);
    }
    def.line = line_of(start);
    skip_space(true);
    Expr body;
    KILN_TRY(parse_alternates(/*nested=*/false, 0, body));
    ast_.rules[static_cast<size_t>(id)].body = std::move(body);
    if (!at_end() && peek() != '\n' && peek() != '\r') {
      return error(fmt::format("expected the end of the line after rule '{}', found {}", name, found()));
    }
    return {};
  }

  int32_t line_of(size_t at) const {
    return 1 +
           static_cast<int32_t>(std::count(text_.begin(), text_.begin() + static_cast<ptrdiff_t>(at), '\n'));
  }

  // At the top level a rule ends at the end of its line, unless the next line continues it with '|'.
  bool continues_with_bar() {
    const size_t save = pos_;
    skip_space(true);
    if (peek() == '|') return true;
    pos_ = save;
    return false;
  }

  Status parse_alternates(bool nested, int32_t depth, Expr& out) {
    if (depth > kMaxNesting) {
      return resource_exhausted("GBNF: groups and repetitions nested deeper than {}", kMaxNesting);
    }
    out = Expr{ExprKind::expr_alt, {}, {}, -1, 0, 0};
    while (true) {
      Expr seq;
      KILN_TRY(parse_sequence(nested, depth, seq));
      out.items.push_back(std::move(seq));
      if (peek() != '|' && (nested || !continues_with_bar())) break;
      ++pos_;
      skip_space(true);
    }
    if (out.items.size() == 1) {
      Expr only = std::move(out.items[0]);
      out = std::move(only);
    }
    return {};
  }

  Status parse_sequence(bool nested, int32_t depth, Expr& out) {
    out = Expr{ExprKind::expr_seq, {}, {}, -1, 0, 0};
    while (!at_end()) {
      const char c = peek();
      Expr item;
      if (c == '"') {
        KILN_TRY(parse_literal(item));
      } else if (c == '[') {
        KILN_TRY(parse_class(item));
      } else if (c == '.') {
        ++pos_;
        item = Expr{ExprKind::expr_class, {}, normalize_code_points({{0, kMaxCodePoint}}, false), -1, 0, 0};
      } else if (is_name_char(c)) {
        const size_t start = pos_;
        while (!at_end() && is_name_char(peek())) ++pos_;
        const int32_t id = rule_id(text_.substr(start, pos_ - start), start);
        if (ast_.rules.size() > static_cast<size_t>(limits_.max_rules)) {
          return resource_exhausted("GBNF: more than max_rules = {} rules", limits_.max_rules);
        }
        item = Expr{ExprKind::expr_ref, {}, {}, id, 0, 0};
      } else if (c == '(') {
        ++pos_;
        skip_space(true);
        KILN_TRY(parse_alternates(/*nested=*/true, depth + 1, item));
        if (peek() != ')') return error(fmt::format("expected ')' or '|', found {}", found()));
        ++pos_;
      } else if (c == '<' || c == '!') {
        return error("token references (<...>, !<...>) are not supported; write the text as a literal");
      } else {
        break;
      }
      skip_space(nested);
      KILN_TRY(parse_postfix(nested, depth, item));
      out.items.push_back(std::move(item));
    }
    if (out.items.size() == 1) {
      Expr only = std::move(out.items[0]);
      out = std::move(only);
    }
    return {};
  }

  // * + ? {m} {m,} {m,n} after an item, any number of them.
  Status parse_postfix(bool nested, int32_t depth, Expr& item) {
    while (!at_end()) {
      int64_t min = 0, max = -1;
      const char c = peek();
      if (c == '*') {
        ++pos_;
      } else if (c == '+') {
        ++pos_;
        min = 1;
      } else if (c == '?') {
        ++pos_;
        max = 1;
      } else if (c == '{') {
        ++pos_;
        skip_space(nested);
        KILN_TRY(parse_count(min));
        skip_space(nested);
        if (peek() == '}') {
          max = min;
        } else if (peek() == ',') {
          ++pos_;
          skip_space(nested);
          if (peek() >= '0' && peek() <= '9') {
            KILN_TRY(parse_count(max));
            skip_space(nested);
            if (max < min)
              return error(fmt::format("repetition {{{},{}}}: the maximum is below the minimum", min, max));
          }
          if (peek() != '}')
            return error(fmt::format("expected '}}' after the repetition count, found {}", found()));
        } else {
          return error(fmt::format("expected ',' or '}}' in the repetition, found {}", found()));
        }
        ++pos_;
      } else {
        break;
      }
      if (++depth > kMaxNesting) {
        return resource_exhausted("GBNF: groups and repetitions nested deeper than {}", kMaxNesting);
      }
      Expr rep{ExprKind::expr_repeat, {}, {}, -1, static_cast<int32_t>(min), static_cast<int32_t>(max)};
      rep.items.push_back(std::move(item));
      item = std::move(rep);
      skip_space(nested);
    }
    return {};
  }

  Status parse_count(int64_t& out) {
    if (!(peek() >= '0' && peek() <= '9'))
      return error(fmt::format("expected a repetition count, found {}", found()));
    const size_t start = pos_;
    out = 0;
    while (peek() >= '0' && peek() <= '9') {
      out = std::min<int64_t>(out * 10 + (peek() - '0'), int64_t{1} << 40);
      ++pos_;
    }
    if (out > limits_.max_repeat) {
      return resource_exhausted("GBNF line {}: repetition count {} exceeds max_repeat = {}", line_of(start),
                                text_.substr(start, pos_ - start), limits_.max_repeat);
    }
    return {};
  }

  // One character of a literal or a class: an escape or one UTF-8 encoded code point.
  Status parse_char(uint32_t& out) {
    const size_t start = pos_;
    const auto c = static_cast<unsigned char>(peek());
    if (c == '\\') {
      const char e = peek(1);
      pos_ += 2;
      int digits = 0;
      switch (e) {
        case 'n': out = '\n'; return {};
        case 'r': out = '\r'; return {};
        case 't': out = '\t'; return {};
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
        case '/': out = static_cast<uint32_t>(e); return {};
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default:
          pos_ = start;
          return error(at_end() || e == '\0' ? "unfinished escape" : fmt::format("unknown escape '\\{}'", e));
      }
      out = 0;
      for (int i = 0; i < digits; ++i) {
        const char h = peek();
        uint32_t v = 0;
        if (h >= '0' && h <= '9') {
          v = static_cast<uint32_t>(h - '0');
        } else if (h >= 'a' && h <= 'f') {
          v = static_cast<uint32_t>(h - 'a' + 10);
        } else if (h >= 'A' && h <= 'F') {
          v = static_cast<uint32_t>(h - 'A' + 10);
        } else {
          return error(fmt::format("expected {} hex digits after '\\{}', found {}", digits, e, found()));
        }
        out = out * 16 + v;
        ++pos_;
      }
      if (out > kMaxCodePoint || (out >= kSurrogateFirst && out <= kSurrogateLast)) {
        return error_at(start, fmt::format("escape U+{:X} is not a Unicode scalar value", out));
      }
      return {};
    }
    // UTF-8: the lead byte gives the length; continuation bytes 10xxxxxx; shortest form only.
    int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (len == 0 || pos_ + static_cast<size_t>(len) > text_.size()) return error("invalid UTF-8");
    out = len == 1 ? c : len == 2 ? (c & 0x1Fu) : len == 3 ? (c & 0x0Fu) : (c & 0x07u);
    for (int i = 1; i < len; ++i) {
      const auto cc = static_cast<unsigned char>(text_[pos_ + static_cast<size_t>(i)]);
      if ((cc & 0xC0) != 0x80) return error("invalid UTF-8");
      out = (out << 6) | (cc & 0x3Fu);
    }
    const uint32_t min_for_len[] = {0, 0, 0x80, 0x800, 0x10000};
    if (out < min_for_len[len] || out > kMaxCodePoint || (out >= kSurrogateFirst && out <= kSurrogateLast)) {
      return error("invalid UTF-8");
    }
    pos_ += static_cast<size_t>(len);
    return {};
  }

  Status parse_literal(Expr& out) {
    ++pos_;  // "
    out = Expr{ExprKind::expr_seq, {}, {}, -1, 0, 0};
    while (true) {
      if (at_end()) return error("unterminated string literal");
      if (peek() == '"') break;
      uint32_t cp = 0;
      KILN_TRY(parse_char(cp));
      out.items.push_back(Expr{ExprKind::expr_class, {}, {{cp, cp}}, -1, 0, 0});
    }
    ++pos_;
    if (out.items.size() == 1) {
      Expr only = std::move(out.items[0]);
      out = std::move(only);
    }
    return {};
  }

  Status parse_class(Expr& out) {
    const size_t start = pos_;
    ++pos_;  // [
    bool negate = false;
    if (peek() == '^') {
      negate = true;
      ++pos_;
    }
    CodePointSet ranges;
    while (true) {
      if (at_end()) return error_at(start, "unterminated character class");
      if (peek() == ']') break;
      uint32_t lo = 0, hi = 0;
      KILN_TRY(parse_char(lo));
      hi = lo;
      if (peek() == '-' && peek(1) != ']' && pos_ + 1 < text_.size()) {
        ++pos_;
        const size_t at = pos_;
        KILN_TRY(parse_char(hi));
        if (hi < lo) return error_at(at, fmt::format("character range U+{:X}-U+{:X} is reversed", lo, hi));
      }
      ranges.emplace_back(lo, hi);
    }
    ++pos_;
    if (ranges.empty()) return error_at(start, "empty character class");
    out = Expr{ExprKind::expr_class, {}, normalize_code_points(std::move(ranges), negate), -1, 0, 0};
    if (out.chars.empty()) return error_at(start, "character class matches no character");
    return {};
  }

  std::string_view text_;
  const Limits& limits_;
  size_t pos_ = 0;
  GbnfAst ast_;
  std::unordered_map<std::string, int32_t> ids_;
  std::vector<size_t> first_use_;  // [n_rules] byte offset of the first mention
};

}  // namespace

Result<std::shared_ptr<const Grammar>> parse_gbnf(std::string_view text, const Limits& limits) {
  if (text.size() > limits.max_text_bytes) {
    return resource_exhausted("GBNF: {} bytes of text exceed max_text_bytes = {}", text.size(),
                              limits.max_text_bytes);
  }
  KILN_ASSIGN_OR_RETURN(GbnfAst ast, Parser(text, limits).parse());
  return build_automaton(ast, limits);
}

}  // namespace kiln::grammar
