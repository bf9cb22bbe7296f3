// GBNF as parsed, before it becomes automata (gbnf_parse.cpp -> automaton.cpp). Internal to grammar/.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kiln::grammar {

// A set of Unicode scalar values: sorted, disjoint, non-adjacent closed ranges [first, second], no
// surrogates.
using CodePointSet = std::vector<std::pair<uint32_t, uint32_t>>;

enum class ExprKind : uint8_t {
  expr_alt,     // items: the alternatives (at least one)
  expr_seq,     // items: in order (none: the empty string)
  expr_class,   // chars: one code point of the set
  expr_ref,     // rule: a reference to rule `rule`
  expr_repeat,  // items[0] repeated min..max times (max -1: unbounded)
};

struct Expr {
  ExprKind kind = ExprKind::expr_seq;
  std::vector<Expr> items;
  CodePointSet chars;
  int32_t rule = -1;
  int32_t min = 0, max = 0;
};

struct RuleDef {
  std::string name;
  Expr body;
  int32_t line = 0;  // 1-based line of the definition (0: used, never defined)
};

struct GbnfAst {
  std::vector<RuleDef> rules;  // [n_rules], by first mention
  int32_t root = -1;
};

// The largest Unicode scalar value and the surrogate block that UTF-8 cannot encode.
constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr uint32_t kSurrogateFirst = 0xD800, kSurrogateLast = 0xDFFF;

// Sorts, merges and removes surrogates; `negate` complements over [0, kMaxCodePoint].
CodePointSet normalize_code_points(CodePointSet ranges, bool negate);

}  // namespace kiln::grammar
