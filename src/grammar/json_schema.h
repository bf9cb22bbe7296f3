// JSON Schema (draft 2020-12's subset that constrains generated text) to GBNF, and the grammar of any JSON
// value (response_format json_object).
//
// Supported: type (one or a list), properties / required / additionalProperties (false, true or a schema),
// items / prefixItems / minItems / maxItems, enum, const, anyOf / oneOf (as alternatives), allOf of objects
// (merged), minimum / maximum / exclusiveMinimum / exclusiveMaximum for integers, string minLength /
// maxLength / pattern (regex.h) / format (date, time, date-time, uuid, email), $ref to #/$defs/... and
// #/definitions/... (recursive allowed), nesting. Annotations (title, description, default, examples,
// $schema, $id, $comment) are ignored. Any other keyword is unimplemented (the message names it and its JSON
// pointer), so that a schema is never silently loosened.
//
// Output layout: objects print their properties in the schema's order with `", "` and `": "` separators, no
// newlines (compact, as OpenAI's strict mode produces); optional properties may be skipped.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace kiln::grammar {

// Collects the rules of one or more schemas into one GBNF text: each add() returns the name of the rule that
// matches its schema, so that callers can embed schemas in a larger grammar (tool calls).
class SchemaGrammar {
 public:
  // name: a prefix for this schema's rules ([a-z0-9-]+). Errors name the keyword and the JSON pointer:
  // invalid_argument for an invalid schema, unimplemented for an unsupported keyword, resource_exhausted past
  // a size bound.
  Result<std::string> add(const nlohmann::ordered_json& schema, std::string_view name);
  // Any JSON value (json_object's grammar); an object when `object_only`.
  std::string add_any_json(std::string_view name, bool object_only);
  // Every rule added so far, one per line (no root rule: the caller writes `root ::= ...`).
  std::string rules() const;

 private:
  std::string rules_;
  std::vector<std::string> names_;
};

// A whole grammar: `root` matches the schema.
Result<std::string> json_schema_to_gbnf(const nlohmann::ordered_json& schema);

}  // namespace kiln::grammar
