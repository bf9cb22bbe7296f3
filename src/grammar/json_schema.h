// JSON Schema (draft 2020-12's subset that constrains generated text) to GBNF, and the grammar of any JSON
// value (response_format json_object).
//
// Supported: type (one or a list; without it, the types that the keywords present constrain), properties /
// required / additionalProperties (false, true or a schema; absent: no keys beyond properties when properties
// is given), items / prefixItems / minItems / maxItems, enum, const (with type: the values of that type),
// anyOf / oneOf (as alternatives; other keywords beside them apply to each branch; oneOf is exact when its
// branches are shown to exclude each other, else it is anyOf, or refused under SchemaOptions::strict), allOf
// (members merged: properties, required and type combined, any other keyword must agree), minimum / maximum /
// exclusiveMinimum / exclusiveMaximum for integers and numbers (exact to the digit, the draft-4 boolean
// exclusive forms too), string minLength / maxLength / pattern (regex.h; JSON Schema's search semantics: a
// side without ^ or $ may have more text) / format (date with real month lengths and leap years, time,
// date-time, uuid, email), $ref to any local JSON pointer (#, #/$defs/..., #/definitions/...; recursion
// allowed), nesting. Annotations (title, description, default, examples, deprecated, readOnly, writeOnly,
// $schema, $id, $comment, OpenAPI's discriminator) are ignored; uniqueItems false is accepted. Any other
// keyword is unimplemented: the message names it and its JSON pointer (`#/properties/age/multipleOf`), so
// that a schema is never silently loosened. Also unimplemented: pattern beside format, minLength/maxLength
// beside a pattern whose length varies in more than one place, keywords beside $ref, enum/const beside
// keywords other than type, remote $refs.
//
// Output layout: compact, no whitespace anywhere (`{"a":1,"b":[true,null]}`), so that generations stay short.
// Properties come in the schema's order; any subset of the optional ones may be left out; additional
// properties (keys other than the declared ones, each character spelt as gbnf_write.h's json_escape_string
// does) follow the declared ones. Strings never hold raw control characters (U+0000..U+001F, DEL): JSON's
// escapes instead. Numbers: no leading zeros, no "-0", an exponent only when no bound is set, at most 16
// integer and 16 fraction digits unless a bound needs more (json_number.h). Values of enum and const are
// written the same way. A schema whose required recursion never ends has no instance: parse_gbnf refuses its
// grammar.
//
// Bounds (resource_exhausted naming the bound): repetition counts (minLength, maxLength, minItems, maxItems)
// up to 10,000, 1 MiB of GBNF and 10,000 rules, schemas nested 100 deep (json_schema_converter.h).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace kiln::grammar {

struct SchemaOptions {
  // A oneOf whose branches are not shown to exclude each other (json_schema_oneof.cpp: different types,
  // disjoint const / enum values, a required property whose values differ or that the other branch does not
  // allow) is refused (unimplemented, naming its JSON pointer) instead of being enforced as anyOf, which lets
  // a value match two branches. OpenAI's json_schema `strict`.
  bool strict = false;
};

// Collects the rules of one or more schemas into one GBNF text: each add() returns the name of the rule that
// matches its schema, so that callers can embed schemas in a larger grammar (tool calls).
class SchemaGrammar {
 public:
  // name: a prefix for this schema's rules ([a-z0-9-]+); a rule name already used gets a number. Errors name
  // the keyword and the JSON pointer: invalid_argument for an invalid schema (or one no value matches),
  // unimplemented for an unsupported keyword, resource_exhausted past a size bound. Nothing is added on
  // error.
  Result<std::string> add(const nlohmann::ordered_json& schema, std::string_view name,
                          const SchemaOptions& options = {});
  // The rule matching any JSON value (json_object's grammar), written compactly; an object when
  // `object_only`.
  std::string add_any_json(std::string_view name, bool object_only);
  // Every rule added so far, one per line (no root rule: the caller writes `root ::= ...`).
  std::string rules() const;

 private:
  std::string rules_;               // every rule added, one per line
  std::vector<std::string> names_;  // the names of those rules
};

// A whole grammar: `root` matches the schema.
Result<std::string> json_schema_to_gbnf(const nlohmann::ordered_json& schema,
                                        const SchemaOptions& options = {});

}  // namespace kiln::grammar
