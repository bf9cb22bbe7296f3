#include "grammar/json_schema.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>

#include "grammar/gbnf_write.h"
#include "grammar/json_schema_converter.h"

namespace kiln::grammar {

namespace {

bool is_annotation(std::string_view key) {
  // discriminator: OpenAPI's (pydantic writes it beside a discriminated union's oneOf), a hint to readers
  // that changes no value's validity.
  static const std::set<std::string_view> kKeys{
      "$schema",    "$id",      "$comment",  "title", "description", "default",      "examples",
      "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "discriminator"};
  return kKeys.count(key) != 0;
}

bool is_supported(std::string_view key) {
  static const std::set<std::string_view> kKeys{"$ref",
                                                "allOf",
                                                "anyOf",
                                                "oneOf",
                                                "const",
                                                "enum",
                                                "type",
                                                "properties",
                                                "required",
                                                "additionalProperties",
                                                "items",
                                                "prefixItems",
                                                "minItems",
                                                "maxItems",
                                                "uniqueItems",
                                                "minLength",
                                                "maxLength",
                                                "pattern",
                                                "format",
                                                "minimum",
                                                "maximum",
                                                "exclusiveMinimum",
                                                "exclusiveMaximum"};
  return kKeys.count(key) != 0;
}

const std::set<std::string_view>& type_names() {
  static const std::set<std::string_view> kNames{"null",   "boolean", "object", "array",
                                                 "number", "string",  "integer"};
  return kNames;
}

// [a-z0-9-] of a hint: other characters become '-', runs of '-' one, at most 48 characters.
std::string sanitize(std::string_view hint) {
  std::string out;
  for (char c : hint) {
    const char l = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
    const bool keep = (l >= 'a' && l <= 'z') || (l >= '0' && l <= '9');
    if (keep) {
      out += l;
    } else if (!out.empty() && out.back() != '-') {
      out += '-';
    }
    if (out.size() >= 48) break;
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out;
}

// The compact JSON text of `v` (json_schema.h's layout: no whitespace, strings as json_escape_string writes).
Status serialize(const Json& v, std::string& out, const std::string& ptr, int depth) {
  if (depth > 100) return resource_exhausted("JSON schema: a value nested deeper than 100 at {}", ptr);
  switch (v.type()) {
    case Json::value_t::string:
      out += '"';
      if (!json_escape_string(v.get_ref<const std::string&>(), out)) {
        return invalid_argument("JSON schema: invalid UTF-8 in a string at {}", ptr);
      }
      out += '"';
      return {};
    case Json::value_t::array:
      out += '[';
      for (size_t i = 0; i < v.size(); ++i) {
        if (i > 0) out += ',';
        KILN_TRY(serialize(v[i], out, ptr, depth + 1));
      }
      out += ']';
      return {};
    case Json::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, item] : v.items()) {
        if (!first) out += ',';
        first = false;
        out += '"';
        if (!json_escape_string(key, out))
          return invalid_argument("JSON schema: invalid UTF-8 in a key at {}", ptr);
        out += "\":";
        KILN_TRY(serialize(item, out, ptr, depth + 1));
      }
      out += '}';
      return {};
    }
    case Json::value_t::number_float:
      if (!std::isfinite(v.get<double>()))
        return invalid_argument("JSON schema: a non-finite number at {}", ptr);
      out += v.dump();
      return {};
    default: out += v.dump(); return {};
  }
}

bool has_type(const Json& v, std::string_view type) {
  if (type == "null") return v.is_null();
  if (type == "boolean") return v.is_boolean();
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "string") return v.is_string();
  if (type == "number") return v.is_number();
  if (type == "integer") {
    return v.is_number_integer() || (v.is_number_float() && std::isfinite(v.get<double>()) &&
                                     v.get<double>() == std::floor(v.get<double>()));
  }
  return false;
}

// The names of a `type` keyword at `ptr`, checked, without repeats.
Result<std::vector<std::string>> type_list(const Json& t, const std::string& ptr) {
  const bool ok =
      t.is_string() || (t.is_array() && !t.empty() &&
                        std::all_of(t.begin(), t.end(), [](const Json& x) { return x.is_string(); }));
  const std::string at = pointer_append(ptr, "type");
  if (!ok) return invalid_argument("JSON schema: type at {} is not a type name or a list of them", at);
  std::vector<std::string> out;
  for (const auto& x : t.is_string() ? Json::array({t}) : t) {
    const std::string& name = x.get_ref<const std::string&>();
    if (type_names().count(name) == 0)
      return invalid_argument("JSON schema: \"{}\" at {} is not a type", name, at);
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
  }
  return out;
}

// The types in both lists ("integer" is a "number").
std::vector<std::string> intersect_types(const std::vector<std::string>& a,
                                         const std::vector<std::string>& b) {
  auto in = [](const std::vector<std::string>& l, std::string_view t) {
    return std::find(l.begin(), l.end(), t) != l.end();
  };
  std::vector<std::string> out;
  for (const auto& t : a) {
    if (in(b, t) || (t == "integer" && in(b, "number"))) out.push_back(t);
  }
  if (in(a, "number") && in(b, "integer") && !in(out, "integer")) out.push_back("integer");
  return out;
}

}  // namespace

std::string child_hint(const std::string& hint, std::string_view token) {
  const std::string t = sanitize(token);
  if (t.empty()) return hint.empty() ? "x" : hint;
  return hint.empty() ? t : hint + "-" + t;
}

std::string pointer_append(const std::string& pointer, std::string_view token) {
  std::string out = pointer + "/";
  for (char c : token) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

SchemaConverter::SchemaConverter(const Json& root, std::string prefix, std::unordered_set<std::string>& taken,
                                 size_t text_bytes, const SchemaOptions& options, const SchemaLimits& limits)
    : root_(root),
      prefix_(std::move(prefix)),
      taken_(taken),
      text_bytes_(text_bytes),
      options_(options),
      limits_(limits) {}

Result<std::string> SchemaConverter::convert() { return visit(root_, "#", "", 0); }

std::string SchemaConverter::new_name(const std::string& hint) {
  const std::string base = hint.empty() ? prefix_ : prefix_ + "-" + hint;
  std::string name = base;
  int& k = next_number_[base];  // numbers below it are taken
  k = std::max(k, 2);
  while (taken_.count(name) != 0) name = fmt::format("{}-{}", base, k++);
  taken_.insert(name);
  new_names_.push_back(name);
  return name;
}

Status SchemaConverter::define(const std::string& name, const std::string& body) {
  rules_ += name + " ::= " + body + "\n";
  if (text_bytes_ + rules_.size() > limits_.max_text_bytes) {
    return resource_exhausted("JSON schema: the grammar grows past {} bytes (bound on a schema's size)",
                              limits_.max_text_bytes);
  }
  if (new_names_.size() > limits_.max_rules) {
    return resource_exhausted("JSON schema: the grammar needs more than {} rules (bound on a schema's size)",
                              limits_.max_rules);
  }
  return {};
}

Result<std::string> SchemaConverter::rule(const std::string& hint, const std::string& body) {
  std::string name = new_name(hint);
  KILN_TRY(define(name, body));
  return name;
}

Status SchemaConverter::check_keywords(const Json& s, const std::string& ptr) const {
  for (const auto& [key, value] : s.items()) {
    if (is_annotation(key)) continue;
    if (!is_supported(key) || (key == "uniqueItems" && value != Json(false))) {
      return unimplemented("JSON schema: the keyword \"{}\" at {} is not supported", key,
                           pointer_append(ptr, key));
    }
  }
  return {};
}

Result<std::string> SchemaConverter::visit(const Json& s, const std::string& ptr, const std::string& hint,
                                           int depth) {
  if (++visits_ > limits_.max_visits) {
    return resource_exhausted("JSON schema: more than {} schemas to visit at {} (bound on a schema's size)",
                              limits_.max_visits, ptr);
  }
  if (depth > limits_.max_depth) {
    return resource_exhausted("JSON schema: schemas nested deeper than {} at {}", limits_.max_depth, ptr);
  }
  if (s.is_boolean()) {
    if (s.get<bool>()) return primitive("value");
    return invalid_argument("JSON schema: the schema at {} is false: no value matches it", ptr);
  }
  if (!s.is_object())
    return invalid_argument("JSON schema: the schema at {} is not an object or a boolean", ptr);
  KILN_TRY(check_keywords(s, ptr));

  if (s.contains("$ref")) {
    for (const auto& [key, value] : s.items()) {
      if (key != "$ref" && !is_annotation(key)) {
        return unimplemented("JSON schema: the keyword \"{}\" beside $ref at {} is not supported", key,
                             pointer_append(ptr, key));
      }
    }
    if (!s["$ref"].is_string()) return invalid_argument("JSON schema: $ref at {} is not a string", ptr);
    return visit_ref(s["$ref"].get<std::string>(), pointer_append(ptr, "$ref"), depth);
  }
  if (s.contains("allOf")) {
    Json merged = Json::object();
    bool unsatisfiable = false;
    KILN_TRY(merge_into(merged, s, ptr, depth, unsatisfiable));
    if (unsatisfiable) return invalid_argument("JSON schema: the allOf at {} has no type in common", ptr);
    return visit(merged, ptr, hint, depth + 1);
  }
  if (s.contains("anyOf") || s.contains("oneOf")) return visit_alternatives(s, ptr, hint, depth);
  if (s.contains("const") || s.contains("enum")) return visit_enum(s, ptr, hint);

  KILN_ASSIGN_OR_RETURN(const std::vector<std::string> types, types_of(s, ptr));
  if (types.empty()) return primitive("value");
  std::vector<std::string> alternatives;
  for (const auto& t : types) {
    KILN_ASSIGN_OR_RETURN(std::string e,
                          visit_type(t, s, ptr, types.size() > 1 ? child_hint(hint, t) : hint, depth));
    alternatives.push_back(std::move(e));
  }
  if (alternatives.size() == 1) return alternatives[0];
  return rule(hint, fmt::format("{}", fmt::join(alternatives, " | ")));
}

Result<std::vector<std::string>> SchemaConverter::types_of(const Json& s, const std::string& ptr) const {
  std::vector<std::string> types;
  if (s.contains("type")) return type_list(s["type"], ptr);
  // No type: the types that the keywords present constrain (a tightening: JSON Schema would allow any
  // value of the other types too).
  auto any = [&](std::initializer_list<const char*> keys) {
    return std::any_of(keys.begin(), keys.end(), [&](const char* k) { return s.contains(k); });
  };
  if (any({"properties", "required", "additionalProperties"})) types.push_back("object");
  if (any({"items", "prefixItems", "minItems", "maxItems"})) types.push_back("array");
  if (any({"minLength", "maxLength", "pattern", "format"})) types.push_back("string");
  if (any({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) types.push_back("number");
  return types;
}

Result<const Json*> SchemaConverter::resolve(const std::string& ref, const std::string& where) const {
  if (ref.empty() || ref[0] != '#') {
    return unimplemented("JSON schema: the $ref \"{}\" at {} is not supported (only local #/... references)",
                         ref, where);
  }
  std::string fragment;  // percent-decoded
  for (size_t i = 1; i < ref.size(); ++i) {
    if (ref[i] == '%' && i + 2 < ref.size() && std::isxdigit(static_cast<unsigned char>(ref[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(ref[i + 2]))) {
      fragment += static_cast<char>(std::stoi(ref.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      fragment += ref[i];
    }
  }
  if (fragment.empty()) return &root_;
  if (fragment[0] != '/') {
    return unimplemented(
        "JSON schema: the $ref \"{}\" at {} names an anchor (only JSON pointers are supported)", ref, where);
  }
  const Json* node = &root_;
  size_t pos = 1;
  while (true) {
    const size_t slash = fragment.find('/', pos);
    std::string token = fragment.substr(pos, slash == std::string::npos ? std::string::npos : slash - pos);
    std::string unescaped;
    for (size_t i = 0; i < token.size(); ++i) {
      if (token[i] == '~' && i + 1 < token.size() && (token[i + 1] == '0' || token[i + 1] == '1')) {
        unescaped += token[i + 1] == '0' ? '~' : '/';
        ++i;
      } else {
        unescaped += token[i];
      }
    }
    if (node->is_object() && node->contains(unescaped)) {
      node = &(*node)[unescaped];
    } else if (node->is_array() && !unescaped.empty() && unescaped.size() < 9 &&
               std::all_of(unescaped.begin(), unescaped.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
               std::stoul(unescaped) < node->size()) {
      node = &(*node)[std::stoul(unescaped)];
    } else {
      return invalid_argument("JSON schema: the $ref \"{}\" at {} points to nothing", ref, where);
    }
    if (slash == std::string::npos) return node;
    pos = slash + 1;
  }
}

Result<std::string> SchemaConverter::visit_ref(const std::string& ref, const std::string& where, int depth) {
  KILN_ASSIGN_OR_RETURN(const Json* target, resolve(ref, where));
  if (std::find(pending_refs_.begin(), pending_refs_.end(), target) != pending_refs_.end()) {
    return invalid_argument("JSON schema: the $ref \"{}\" at {} comes back to itself before any value", ref,
                            where);
  }
  if (auto it = refs_.find(target); it != refs_.end()) return it->second;
  const size_t last = ref.rfind('/');
  const std::string name =
      new_name(child_hint("", last == std::string::npos ? "self" : ref.substr(last + 1)));
  refs_[target] = name;
  pending_refs_.push_back(target);
  Result<std::string> body = visit(*target, ref, child_hint("", ref.substr(last + 1)), depth + 1);
  pending_refs_.pop_back();
  if (!body.ok()) return body.status();
  KILN_TRY(define(name, *body));
  return name;
}

Status SchemaConverter::merge_into(Json& dst, const Json& src, const std::string& ptr, int depth,
                                   bool& unsatisfiable) const {
  if (depth > limits_.max_depth) {
    return resource_exhausted("JSON schema: allOf nested deeper than {} at {}", limits_.max_depth, ptr);
  }
  if (src.is_boolean()) {
    if (!src.get<bool>()) unsatisfiable = true;
    return {};
  }
  if (!src.is_object())
    return invalid_argument("JSON schema: the schema at {} is not an object or a boolean", ptr);
  KILN_TRY(check_keywords(src, ptr));
  if (src.contains("$ref")) {
    for (const auto& [key, value] : src.items()) {
      if (key != "$ref" && !is_annotation(key)) {
        return unimplemented("JSON schema: the keyword \"{}\" beside $ref at {} is not supported", key,
                             pointer_append(ptr, key));
      }
    }
    if (!src["$ref"].is_string()) return invalid_argument("JSON schema: $ref at {} is not a string", ptr);
    const std::string ref = src["$ref"].get<std::string>();
    KILN_ASSIGN_OR_RETURN(const Json* target, resolve(ref, pointer_append(ptr, "$ref")));
    return merge_into(dst, *target, ref, depth + 1, unsatisfiable);
  }
  for (const auto& [key, value] : src.items()) {
    const std::string at = pointer_append(ptr, key);
    if (is_annotation(key)) continue;
    if (key == "allOf") {
      if (!value.is_array() || value.empty())
        return invalid_argument("JSON schema: allOf at {} is not a list", at);
      for (size_t i = 0; i < value.size(); ++i) {
        KILN_TRY(merge_into(dst, value[i], pointer_append(at, std::to_string(i)), depth + 1, unsatisfiable));
      }
    } else if (key == "properties" && dst.contains(key)) {
      if (!value.is_object()) return invalid_argument("JSON schema: properties at {} is not an object", at);
      for (const auto& [name, schema] : value.items()) {
        Json& props = dst[key];
        if (props.contains(name) && props[name] != schema) {
          return unimplemented("JSON schema: allOf gives the property \"{}\" two different schemas at {}",
                               name, pointer_append(at, name));
        }
        props[name] = schema;
      }
    } else if (key == "required" && dst.contains(key)) {
      if (!value.is_array()) return invalid_argument("JSON schema: required at {} is not a list", at);
      std::set<Json> have(dst[key].begin(), dst[key].end());
      for (const auto& name : value) {
        if (have.insert(name).second) dst[key].push_back(name);
      }
    } else if (key == "type" && dst.contains(key)) {
      KILN_ASSIGN_OR_RETURN(const auto mine, type_list(dst[key], ptr));
      KILN_ASSIGN_OR_RETURN(const auto theirs, type_list(value, ptr));
      const auto both = intersect_types(mine, theirs);
      if (both.empty()) unsatisfiable = true;
      dst[key] = both.size() == 1 ? Json(both[0]) : Json(both);
    } else if (!dst.contains(key)) {
      dst[key] = value;
    } else if (dst[key] != value) {
      return unimplemented("JSON schema: \"{}\" has two different values in the allOf at {}", key, at);
    }
  }
  return {};
}

Result<std::string> SchemaConverter::visit_alternatives(const Json& s, const std::string& ptr,
                                                        const std::string& hint, int depth) {
  if (s.contains("anyOf") && s.contains("oneOf")) {
    return unimplemented("JSON schema: anyOf beside oneOf at {} is not supported", ptr);
  }
  const char* key = s.contains("anyOf") ? "anyOf" : "oneOf";
  const std::string at = pointer_append(ptr, key);
  const Json& branches = s[key];
  if (!branches.is_array() || branches.empty()) {
    return invalid_argument("JSON schema: {} at {} is not a non-empty list", key, at);
  }
  // The other keywords apply to every branch: each branch is merged with them, as allOf would.
  Json siblings = Json::object();
  for (const auto& [k, v] : s.items()) {
    if (k != key && !is_annotation(k)) siblings[k] = v;
  }
  std::vector<std::string> alternatives;
  std::unordered_set<std::string> seen;
  std::vector<std::pair<size_t, const Json*>> live;  // the branches that some value may match
  for (size_t i = 0; i < branches.size(); ++i) {
    const std::string bptr = pointer_append(at, std::to_string(i));
    const std::string bhint = child_hint(hint, std::to_string(i));
    const Json& branch = branches[i];
    if (branch.is_boolean() && !branch.get<bool>()) continue;
    Result<std::string> e = std::string();
    if (siblings.empty()) {
      e = visit(branch, bptr, bhint, depth + 1);
    } else {
      Json merged = siblings;
      bool unsatisfiable = false;
      KILN_TRY(merge_into(merged, branch, bptr, depth + 1, unsatisfiable));
      if (unsatisfiable) continue;  // no value of this branch meets the other keywords
      e = visit(merged, bptr, bhint, depth + 1);
    }
    if (!e.ok()) return e.status();
    live.emplace_back(i, &branch);
    if (seen.insert(*e).second) alternatives.push_back(*e);
  }
  if (alternatives.empty()) return invalid_argument("JSON schema: no branch of {} at {} can match", key, at);
  // The alternatives are anyOf's: oneOf is exact only when no value can match two branches.
  if (options_.strict && key == std::string_view("oneOf")) {
    if (const auto both = overlapping_branches(siblings, live)) {
      return unimplemented(
          "JSON schema: the oneOf at {} is not shown exclusive (its branches {} and {} may both match one "
          "value), and strict asks that exactly one match: kiln tells branches apart by their types, const / "
          "enum values, and required properties whose values differ or that the other branch does not allow",
          at, both->first, both->second);
    }
  }
  return rule(hint, fmt::format("{}", fmt::join(alternatives, " | ")));
}

Result<std::string> SchemaConverter::visit_enum(const Json& s, const std::string& ptr,
                                                const std::string& hint) {
  for (const auto& [k, v] : s.items()) {
    if (k != "const" && k != "enum" && k != "type" && !is_annotation(k)) {
      return unimplemented("JSON schema: the keyword \"{}\" beside enum or const at {} is not supported", k,
                           pointer_append(ptr, k));
    }
  }
  std::vector<const Json*> values;
  if (s.contains("enum")) {
    const Json& e = s["enum"];
    if (!e.is_array() || e.empty()) {
      return invalid_argument("JSON schema: enum at {} is not a non-empty list", pointer_append(ptr, "enum"));
    }
    for (const auto& v : e) {
      if (!s.contains("const") || v == s["const"]) values.push_back(&v);
    }
  } else {
    values.push_back(&s["const"]);
  }
  std::vector<std::string> types;
  if (s.contains("type")) {
    KILN_ASSIGN_OR_RETURN(types, types_of(s, ptr));
  }
  std::vector<std::string> alternatives;
  std::unordered_set<std::string> seen;
  size_t text_size = 0;
  for (const Json* v : values) {
    if (!types.empty() &&
        std::none_of(types.begin(), types.end(), [&](const std::string& t) { return has_type(*v, t); })) {
      continue;
    }
    std::string text;
    KILN_TRY(serialize(*v, text, ptr, 0));
    std::string lit = gbnf_literal(text);
    text_size += lit.size() + 3;
    if (text_bytes_ + rules_.size() + text_size > limits_.max_text_bytes) {
      return resource_exhausted(
          "JSON schema: the grammar grows past {} bytes (bound on a schema's size) at {}",
          limits_.max_text_bytes, ptr);
    }
    if (seen.insert(lit).second) alternatives.push_back(std::move(lit));
  }
  if (alternatives.empty()) {
    return invalid_argument("JSON schema: no value of enum/const at {} has the schema's type", ptr);
  }
  if (alternatives.size() == 1) return alternatives[0];
  return rule(hint, fmt::format("{}", fmt::join(alternatives, " | ")));
}

Result<std::string> SchemaGrammar::add(const nlohmann::ordered_json& schema, std::string_view name,
                                       const SchemaOptions& options) {
  const bool valid = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
  });
  if (!valid) return invalid_argument("JSON schema: the rule name '{}' is not [a-z0-9-]+", name);
  std::unordered_set<std::string> taken(names_.begin(), names_.end());
  taken.insert("root");
  SchemaConverter converter(schema, std::string(name), taken, rules_.size(), options);
  Result<std::string> converted = std::string();
  try {
    converted = converter.convert();
  } catch (const nlohmann::json::exception& e) {  // a check missed: an error, never a crash
    return make_status(StatusCode::internal, "JSON schema: {}", e.what());
  }
  KILN_ASSIGN_OR_RETURN(std::string rule, std::move(converted));
  if (std::find(converter.new_names().begin(), converter.new_names().end(), rule) ==
      converter.new_names().end()) {
    // The schema is one expression (a primitive or a literal): give it its own rule all the same.
    std::string alias(name);
    for (int k = 2; taken.count(alias) != 0; ++k) alias = fmt::format("{}-{}", name, k);
    names_.push_back(alias);
    rules_ += converter.rules() + alias + " ::= " + rule + "\n";
    names_.insert(names_.end(), converter.new_names().begin(), converter.new_names().end());
    return alias;
  }
  rules_ += converter.rules();
  names_.insert(names_.end(), converter.new_names().begin(), converter.new_names().end());
  return rule;
}

std::string SchemaGrammar::add_any_json(std::string_view name, bool object_only) {
  std::unordered_set<std::string> taken(names_.begin(), names_.end());
  taken.insert("root");
  const Json none;
  SchemaConverter converter(none, std::string(name), taken, 0);
  Result<std::string> rule = converter.any_json(object_only);
  KILN_ASSERT(rule.ok());  // a handful of fixed rules: no bound can be reached
  rules_ += converter.rules();
  names_.insert(names_.end(), converter.new_names().begin(), converter.new_names().end());
  return *rule;
}

std::string SchemaGrammar::rules() const { return rules_; }

Result<std::string> json_schema_to_gbnf(const nlohmann::ordered_json& schema, const SchemaOptions& options) {
  SchemaGrammar g;
  KILN_ASSIGN_OR_RETURN(std::string rule, g.add(schema, "schema", options));
  return "root ::= " + rule + "\n" + g.rules();
}

}  // namespace kiln::grammar
