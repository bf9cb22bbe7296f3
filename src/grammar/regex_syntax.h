// A regular expression parsed into a tree over code points (regex.h's syntax), for the GBNF writers of
// regex.cpp and json_schema.cpp. Internal to grammar/.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "grammar/gbnf_write.h"

namespace kiln::grammar {

constexpr int64_t kRegexUnbounded = -1;

struct RegexNode {
  enum class Kind : uint8_t { chars, concat, alt, repeat };
  Kind kind = Kind::concat;      // an empty concat matches the empty string
  CodeRanges chars;              // chars: the set one code point comes from (normalized, not empty)
  std::vector<RegexNode> items;  // concat, alt: the members in order; repeat: the one repeated node
  int64_t min = 0;               // repeat: the least count
  int64_t max = 0;               // repeat: the most count, or kRegexUnbounded
};

struct Regex {
  RegexNode root;                       // kind alt: the top-level alternatives
  std::vector<uint8_t> anchored_start;  // [root.items.size()] 1: the alternative began with ^
  std::vector<uint8_t> anchored_end;    // [root.items.size()] 1: the alternative ended with $
};

// Bounds on a pattern: beyond them parse_regex fails with resource_exhausted naming the bound.
struct RegexLimits {
  size_t max_pattern_bytes = 64u << 10;
  int64_t max_repeat = 10'000;     // m and n of {m,n}
  int64_t max_expanded = 200'000;  // code-point sets once every repetition is written out
  int32_t max_depth = 100;         // nested groups
};

// Errors: invalid_argument with the byte offset of a syntax error; unimplemented for backreferences,
// lookaround, word boundaries, flags, Unicode properties and anchors other than a leading ^ / trailing $ of
// a top-level alternative; resource_exhausted past a limit.
Result<Regex> parse_regex(std::string_view pattern, const RegexLimits& limits = {});

// The lengths in code points that the strings of `node` have: [min, max], max kRegexUnbounded if unbounded.
struct LengthRange {
  int64_t min = 0;
  int64_t max = 0;
};
LengthRange regex_length_range(const RegexNode& node);

// Restricts `node` to the strings whose length is in [min_len, max_len] (max_len kRegexUnbounded: none).
// `empty` is set when no string is left. unimplemented when the restriction cannot be written as a regular
// expression tree of the same shape: the length must vary in at most one place of each concatenation, and a
// repeated node whose count changes must have a fixed length.
Status regex_restrict_length(RegexNode& node, int64_t min_len, int64_t max_len, bool& empty);

// Search semantics (JSON Schema's `pattern`): the top-level alternatives without ^ get a leading
// `[\x00-\U0010FFFF]*`, those without $ a trailing one (one for each group of alternatives anchored alike);
// all are then anchored.
void regex_make_search(Regex& re);

// A GBNF expression matching `node` (regex.cpp). With `json_string`, the expression matches the JSON
// spelling of the strings inside the quotes (gbnf_write.h: json_escape_string), not the strings themselves.
std::string regex_gbnf_expr(const RegexNode& node, bool json_string);

}  // namespace kiln::grammar
