#include "grammar/regex.h"

#include <fmt/format.h>

#include "grammar/regex_syntax.h"
#include "tokenizer/unicode.h"

namespace kiln::grammar {

namespace {

// A GBNF expression and whether a quantifier may follow it as is (a literal, a class, a group).
struct Expr {
  std::string text;
  bool atomic = true;
};

std::string group(std::vector<std::string> alternatives) {
  if (alternatives.size() == 1) return alternatives[0];
  std::string out = "(";
  for (size_t i = 0; i < alternatives.size(); ++i) {
    if (i > 0) out += " | ";
    out += alternatives[i];
  }
  return out + ")";
}

// The JSON spellings of the code points of `set`: the ones written as is in one class, the escaped ones
// (`\"`, `\\`, `\n`, `\u001f`, ...) grouped by their shared prefix.
Expr json_set_expr(const CodeRanges& set) {
  static const CodeRanges kEscaped =
      code_ranges_normalize({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}, {0x7F, 0x7F}});
  std::vector<std::string> alternatives;
  const CodeRanges plain = code_ranges_subtract(code_ranges_subtract(set, kEscaped), {{0xD800, 0xDFFF}});
  if (plain.size() == 1 && plain[0].first == plain[0].second) {
    std::string utf8;
    unicode::utf8_append(utf8, plain[0].first);
    alternatives.push_back(gbnf_literal(utf8));
  } else if (!plain.empty()) {
    alternatives.push_back(gbnf_class(plain));
  }
  // After the backslash: one letter (\" \\ \b \f \n \r \t), or u00 and two hex digits.
  CodeRanges short_forms;
  std::vector<std::string> hex_by_first[8];  // [first hex digit] the second digits
  for (const auto& [lo, hi] : code_ranges_subtract(set, code_ranges_subtract(set, kEscaped))) {
    for (uint32_t cp = lo; cp <= hi; ++cp) {
      const std::string esc = json_escape_code_point(cp);  // "\x" or "\u00xy"
      if (esc.size() == 2) {
        short_forms.emplace_back(static_cast<uint8_t>(esc[1]), static_cast<uint8_t>(esc[1]));
      } else {
        hex_by_first[esc[4] - '0'].push_back(esc.substr(5, 1));
      }
    }
  }
  std::vector<std::string> after_backslash;
  if (!short_forms.empty()) after_backslash.push_back(gbnf_class(code_ranges_normalize(short_forms)));
  std::vector<std::string> hex;
  for (int d = 0; d < 8; ++d) {
    if (hex_by_first[d].empty()) continue;
    CodeRanges seconds;
    for (const auto& s : hex_by_first[d])
      seconds.emplace_back(static_cast<uint8_t>(s[0]), static_cast<uint8_t>(s[0]));
    hex.push_back(fmt::format("\"{}\" {}", d, gbnf_class(code_ranges_normalize(seconds))));
  }
  if (!hex.empty()) after_backslash.push_back("\"u00\" " + group(hex));
  if (!after_backslash.empty()) alternatives.push_back("\"\\\\\" " + group(after_backslash));
  return {group(alternatives), alternatives.size() != 1 || after_backslash.empty()};
}

class Writer {
 public:
  explicit Writer(bool json_string) : json_(json_string) {}

  Expr write(const RegexNode& n) const {
    switch (n.kind) {
      case RegexNode::Kind::chars: return chars(n.chars);
      case RegexNode::Kind::concat: return concat(n.items);
      case RegexNode::Kind::alt: {
        if (n.items.size() == 1) return write(n.items[0]);
        std::vector<std::string> alternatives;
        for (const auto& it : n.items) alternatives.push_back(write(it).text);
        return {group(std::move(alternatives)), true};
      }
      case RegexNode::Kind::repeat: return repeat(n);
    }
    return {};
  }

 private:
  static bool single(const RegexNode& n) {
    return n.kind == RegexNode::Kind::chars && n.chars.size() == 1 && n.chars[0].first == n.chars[0].second;
  }

  Expr literal(const std::vector<uint32_t>& cps) const {
    if (!json_) return {gbnf_literal(cps), true};
    std::string spelled;
    for (uint32_t cp : cps) spelled += json_escape_code_point(cp);
    return {gbnf_literal(spelled), true};
  }

  Expr chars(const CodeRanges& set) const {
    if (set.size() == 1 && set[0].first == set[0].second) return literal({set[0].first});
    if (json_) return json_set_expr(set);
    return {gbnf_class(set), true};
  }

  // Runs of single code points become one literal.
  Expr concat(const std::vector<RegexNode>& items) const {
    std::vector<Expr> parts;
    std::vector<uint32_t> run;
    auto flush = [&] {
      if (run.empty()) return;
      parts.push_back(literal(run));
      run.clear();
    };
    for (const auto& it : items) {
      if (single(it)) {
        run.push_back(it.chars[0].first);
        continue;
      }
      flush();
      Expr e = write(it);
      if (e.text != "\"\"") parts.push_back(std::move(e));
    }
    flush();
    if (parts.empty()) return {"\"\"", true};
    if (parts.size() == 1) return parts[0];
    std::string out = parts[0].text;
    for (size_t i = 1; i < parts.size(); ++i) out += " " + parts[i].text;
    return {out, false};
  }

  Expr repeat(const RegexNode& n) const {
    if (n.max == 0) return {"\"\"", true};
    Expr child = write(n.items[0]);
    if (n.min == 1 && n.max == 1) return child;
    if (child.text == "\"\"") return child;
    std::string operand = child.atomic ? child.text : "(" + child.text + ")";
    std::string q;
    if (n.min == 0 && n.max == 1) {
      q = "?";
    } else if (n.min == 0 && n.max == kRegexUnbounded) {
      q = "*";
    } else if (n.min == 1 && n.max == kRegexUnbounded) {
      q = "+";
    } else if (n.max == kRegexUnbounded) {
      q = fmt::format("{{{},}}", n.min);
    } else if (n.min == n.max) {
      q = fmt::format("{{{}}}", n.min);
    } else {
      q = fmt::format("{{{},{}}}", n.min, n.max);
    }
    return {operand + q, false};
  }

  bool json_;
};

bool valid_rule_name(std::string_view name) {
  if (name.empty()) return false;
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-'))
      return false;
  }
  return true;
}

}  // namespace

std::string regex_gbnf_expr(const RegexNode& node, bool json_string) {
  return Writer(json_string).write(node).text;
}

Result<std::string> regex_to_gbnf_rules(std::string_view pattern, std::string_view name) {
  if (!valid_rule_name(name)) return invalid_argument("regex: the rule name '{}' is not [a-zA-Z0-9-]+", name);
  KILN_ASSIGN_OR_RETURN(Regex re, parse_regex(pattern));
  return fmt::format("{} ::= {}\n", name, regex_gbnf_expr(re.root, false));
}

Result<std::string> regex_to_gbnf(std::string_view pattern) { return regex_to_gbnf_rules(pattern, "root"); }

}  // namespace kiln::grammar
