// Regular expressions (ECMAScript / Python syntax, as JSON Schema's `pattern` and vLLM's guided_regex use) to
// GBNF. A regex matches the whole output (anchors ^ $ at its ends are accepted and ignored).
//
// Supported: literals and escapes, ., character classes with ranges and negation, \d \w \s \D \W \S,
// alternation, groups (capturing, (?:...)), * + ? {m} {m,} {m,n} and their lazy forms (same language).
// Backreferences, lookaround and anchors inside the pattern are unimplemented (the message names them).
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
