// One schema's conversion to GBNF rules (json_schema.h): the walk over the schema (json_schema.cpp: $ref,
// allOf / anyOf / oneOf, enum / const, type), the rules of each type (json_schema_types.cpp) and oneOf's
// exclusivity (json_schema_oneof.cpp). Internal to grammar/.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/status.h"
#include "grammar/json_schema.h"

namespace kiln::grammar {

using Json = nlohmann::ordered_json;

// Bounds on one conversion; past them, resource_exhausted naming the bound.
struct SchemaLimits {
  int64_t max_repeat = 10'000;  // minLength, maxLength, minItems, maxItems (grammar.h's Limits::max_repeat)
  size_t max_text_bytes = 1u << 20;  // the GBNF written (grammar.h's Limits::max_text_bytes)
  size_t max_rules = 10'000;         // rules written (grammar.h's Limits::max_rules)
  int32_t max_depth = 100;           // schemas nested in schemas, $ref targets included
  int64_t max_visits = 100'000;      // schemas visited (anyOf beside other keywords copies them per branch)
};

// "#/properties/a~1b": the JSON pointer of `token` inside `pointer`, as a URI fragment.
std::string pointer_append(const std::string& pointer, std::string_view token);

// The name hint of a child schema: `hint` and `token` in [a-z0-9-].
std::string child_hint(const std::string& hint, std::string_view token);

// Clears a converter's pending $ref targets for its lifetime, then puts them back: inside an object or an
// array a $ref cycle has consumed a character ("{" or "[") and is no left recursion.
class PendingRefsCleared {
 public:
  explicit PendingRefsCleared(std::vector<const Json*>& pending) : pending_(pending) {
    saved_.swap(pending_);
  }
  ~PendingRefsCleared() { saved_.swap(pending_); }
  PendingRefsCleared(const PendingRefsCleared&) = delete;
  PendingRefsCleared& operator=(const PendingRefsCleared&) = delete;

 private:
  std::vector<const Json*>& pending_;
  std::vector<const Json*> saved_;
};

class SchemaConverter {
 public:
  // taken: every rule name already in use; the conversion adds its own. text_bytes: GBNF already written
  // beside this conversion's (counted against max_text_bytes).
  SchemaConverter(const Json& root, std::string prefix, std::unordered_set<std::string>& taken,
                  size_t text_bytes, const SchemaOptions& options = {}, const SchemaLimits& limits = {});

  // The rule matching the root schema.
  Result<std::string> convert();
  // The rule matching any JSON value (any object when `object_only`).
  Result<std::string> any_json(bool object_only);
  // The rules written, one per line.
  const std::string& rules() const { return rules_; }
  // The rule names taken (to release them when the conversion fails).
  const std::vector<std::string>& new_names() const { return new_names_; }

 private:
  // json_schema.cpp: the walk.
  Result<std::string> visit(const Json& s, const std::string& ptr, const std::string& hint, int depth);
  Status check_keywords(const Json& s, const std::string& ptr) const;
  Result<std::string> visit_ref(const std::string& ref, const std::string& where, int depth);
  Result<const Json*> resolve(const std::string& ref, const std::string& where) const;
  Result<std::string> visit_alternatives(const Json& s, const std::string& ptr, const std::string& hint,
                                         int depth);
  Result<std::string> visit_enum(const Json& s, const std::string& ptr, const std::string& hint);
  // json_schema_oneof.cpp: two of a oneOf's `branches` (its items, each with the oneOf's `siblings` keywords;
  // false and unsatisfiable ones left out) that may both accept one value under JSON Schema's rules (not only
  // the grammar's tighter ones), as their indexes in the oneOf; nothing when no two can.
  std::optional<std::pair<size_t, size_t>> overlapping_branches(
      const Json& siblings, const std::vector<std::pair<size_t, const Json*>>& branches) const;
  Result<std::vector<std::string>> types_of(const Json& s, const std::string& ptr) const;
  // allOf: the members (and `s`'s other keywords) merged into one schema; `unsatisfiable` when their types
  // share nothing.
  Status merge_into(Json& dst, const Json& src, const std::string& ptr, int depth, bool& unsatisfiable) const;

  // json_schema_types.cpp: one rule per type.
  Result<std::string> visit_type(const std::string& type, const Json& s, const std::string& ptr,
                                 const std::string& hint, int depth);
  Result<std::string> visit_object(const Json& s, const std::string& ptr, const std::string& hint, int depth);
  Result<std::string> visit_array(const Json& s, const std::string& ptr, const std::string& hint, int depth);
  Result<std::string> visit_string(const Json& s, const std::string& ptr, const std::string& hint);
  Result<std::string> visit_number(const Json& s, const std::string& ptr, const std::string& hint,
                                   bool integer);
  // "{" the properties "}": kvs[i] is `"name":` and its value, in order, required when req[i]; `extra` (when
  // not empty) one additional key and value, any number of which may follow.
  Result<std::string> object_rule(const std::vector<std::string>& kvs, const std::vector<bool>& req,
                                  const std::string& extra, const std::string& hint);
  Result<std::string> key_not_in(const std::vector<std::string>& names, const std::string& hint);
  Result<int64_t> count_keyword(const Json& s, const char* key, const std::string& ptr,
                                int64_t fallback) const;
  // char, string, integer, number, boolean, null, value, object, array, key-char: written once, on first use.
  Result<std::string> primitive(std::string_view kind);

  // A fresh rule name: prefix-hint, numbered when taken.
  std::string new_name(const std::string& hint);
  Status define(const std::string& name, const std::string& body);
  Result<std::string> rule(const std::string& hint, const std::string& body);

  const Json& root_;
  std::string prefix_;
  std::unordered_set<std::string>& taken_;
  size_t text_bytes_;
  SchemaOptions options_;
  SchemaLimits limits_;
  std::string rules_;
  std::vector<std::string> new_names_;
  int64_t visits_ = 0;
  std::map<const Json*, std::string> refs_;  // $ref target -> its rule
  std::vector<const Json*> pending_refs_;    // $ref targets entered since the last character written
  std::map<std::string, std::string, std::less<>> primitives_;  // kind -> rule
  std::unordered_map<std::string, int> next_number_;            // name base -> the next number to try
};

}  // namespace kiln::grammar
