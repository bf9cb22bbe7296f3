// Regular expressions (ECMAScript / Python syntax, as JSON Schema's `pattern` and vLLM's guided_regex use) to
// GBNF. A regex matches the whole output (anchors ^ $ at the ends of top-level alternatives are accepted and
// ignored).
//
// Supported: literals (UTF-8) and escapes (\t \n \r \f \v \0 \xHH \uHHHH \u{H...} \cX, escaped punctuation),
// `.` (anything but \n \r U+2028 U+2029), character classes with ranges and negation ([^] is anything), \d \w
// \s \D \W \S (ECMAScript's sets), alternation, groups (capturing, named (?<n>...) / (?P<n>...), (?:...)),
// * + ? {m} {m,} {m,n} and their lazy forms (same language); `{` that does not start a quantifier is a
// literal. Unimplemented (the message names the construct and its offset): backreferences, lookaround, word
// boundaries, \A \z \Z, inline flags, Unicode property escapes, octal escapes, anchors inside the pattern.
// Bounds (resource_exhausted): 64 KiB of pattern, counts up to 10,000, 200,000 characters once repetitions
// are written out, groups nested 100 deep (regex_syntax.h).
#pragma once

#include <string>
#include <string_view>

#include "core/status.h"

namespace kiln::grammar {

// The GBNF of rule `name` (and helper rules prefixed with it) matching `pattern`. Errors: invalid_argument
// with the offset of a syntax error, unimplemented for an unsupported construct, resource_exhausted past a
// size bound.
Result<std::string> regex_to_gbnf_rules(std::string_view pattern, std::string_view name);
// A whole grammar: `root` matches the pattern.
Result<std::string> regex_to_gbnf(std::string_view pattern);

}  // namespace kiln::grammar
