// Writing GBNF text (grammar.h's syntax) from the converters: literals, character classes, and JSON's
// canonical spelling of strings. Internal to grammar/.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln::grammar {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// A set of code points: inclusive ranges [first, second], sorted, disjoint and not adjacent (normalized).
using CodeRanges = std::vector<std::pair<uint32_t, uint32_t>>;

// Sorts and merges overlapping or adjacent ranges.
CodeRanges code_ranges_normalize(CodeRanges ranges);
// Every code point (surrogates included, so that complements stay short) not in `set` (normalized).
CodeRanges code_ranges_complement(const CodeRanges& set);
// The code points of `a` not in `b` (both normalized).
CodeRanges code_ranges_subtract(const CodeRanges& a, const CodeRanges& b);
bool code_ranges_contain(const CodeRanges& set, uint32_t cp);

// A GBNF string literal matching exactly the code points of `utf8` (valid UTF-8): `"..."` with printable
// ASCII as is, \" \\ \n \r \t, and \xHH / \uHHHH / \UHHHHHHHH for everything else.
std::string gbnf_literal(std::string_view utf8);
// The same for a sequence of code points.
std::string gbnf_literal(const std::vector<uint32_t>& code_points);
// A GBNF character class matching `set` (normalized, not empty once surrogates are left out): `[...]` or
// `[^...]`, whichever is shorter. Surrogates (which no UTF-8 text holds and GBNF cannot name) in `set` are
// ignored, and counted in or out to shorten the class.
std::string gbnf_class(const CodeRanges& set);
// `item` repeated lo..hi times (hi < 0: no bound) in GBNF's shortest spelling; "" when hi is 0.
std::string gbnf_repeat(const std::string& item, int64_t lo, int64_t hi);
// `a` then `b`; either may be empty.
std::string gbnf_seq(const std::string& a, const std::string& b);

// JSON's canonical spelling of a string's contents, without the quotes: `"` and `\` escaped, \b \f \n \r \t,
// the other C0 controls and DEL as \u00xx (lowercase hex); everything else as is. False when `utf8` is not
// valid UTF-8.
bool json_escape_string(std::string_view utf8, std::string& out);
// The JSON spelling of one code point inside a string (as json_escape_string writes it).
std::string json_escape_code_point(uint32_t cp);
// True for the code points that JSON strings spell with an escape: `"`, `\`, U+0000..U+001F and DEL.
bool json_needs_escape(uint32_t cp);

}  // namespace kiln::grammar
