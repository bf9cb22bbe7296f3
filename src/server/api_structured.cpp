// Structured output (api_internal.h: read_constraint): the request fields of OpenAI, llama.cpp and vLLM that
// constrain a generation, read into one OutputConstraint and compiled (through the engine's cache) before the
// request is queued, so that a bad grammar is a 400 naming its field.
#include <fmt/format.h>

#include <string>
#include <utility>
#include <vector>

#include "grammar/json_schema.h"
#include "server/api_internal.h"

namespace kiln::server::api_detail {

namespace {

constexpr size_t kMaxChoices = 1024;  // guided_choice entries at most

// A GBNF string literal matching `s` exactly.
std::string gbnf_literal(const std::string& s) {
  std::string out = "\"";
  for (const unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02X}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// One source of a constraint: the field it came from (for errors) and what it asks.
struct Source {
  std::string param;
  OutputConstraint constraint;
  bool strict = false;  // json_schema: grammar::SchemaOptions::strict
};

std::optional<ApiError> schema_source(const std::string& param, const json& schema, Source& out) {
  if (schema.is_string()) {  // vLLM's guided_json also takes the schema as JSON text
    const json parsed = json::parse(schema.get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded()) return bad(param, fmt::format("'{}' is a string but not JSON", param));
    return schema_source(param, parsed, out);
  }
  if (!schema.is_object() && !schema.is_boolean())
    return bad(param, fmt::format("'{}' must be a JSON schema (an object)", param));
  out = {param, {OutputConstraint::Kind::json_schema, dump(schema)}};
  return std::nullopt;
}

std::optional<ApiError> text_source(const std::string& param, const json& v, OutputConstraint::Kind kind,
                                    Source& out) {
  if (!v.is_string() || v.get<std::string>().empty())
    return bad(param, fmt::format("'{}' must be a non-empty string", param));
  out = {param, {kind, v.get<std::string>()}};
  return std::nullopt;
}

std::optional<ApiError> choice_source(const std::string& param, const json& v, Source& out) {
  if (!v.is_array() || v.empty() || v.size() > kMaxChoices)
    return bad(param, fmt::format("'{}' must be a list of 1 to {} strings", param, kMaxChoices));
  std::string g = "root ::= ";
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string() || v[i].get<std::string>().empty())
      return bad(param, fmt::format("'{}[{}]' must be a non-empty string", param, i));
    g += (i ? " | " : "") + gbnf_literal(v[i].get<std::string>());
  }
  out = {param, {OutputConstraint::Kind::gbnf, std::move(g) + "\n"}};
  return std::nullopt;
}

// OpenAI's response_format: text (nothing), json_object (any JSON object), json_schema {name, schema,
// strict}. The schema is always enforced; strict also refuses what kiln would enforce more loosely than the
// schema says (a oneOf whose branches may overlap, enforced as anyOf).
std::optional<ApiError> response_format(const json& rf, std::vector<Source>& out) {
  const json* type = rf.is_object() ? field(rf, "type") : nullptr;
  if (type == nullptr || !type->is_string())
    return bad("response_format", "'response_format' must be an object with a 'type'");
  const std::string t = type->get<std::string>();
  if (t == "text") return std::nullopt;
  Source s;
  if (t == "json_object") {
    s = {"response_format", {OutputConstraint::Kind::json_schema, R"({"type":"object"})"}};
  } else if (t == "json_schema") {
    const json* js = field(rf, "json_schema");
    if (js == nullptr || !js->is_object())
      return bad("response_format.json_schema", "'response_format.json_schema' must be an object");
    if (const json* name = field(*js, "name"); name != nullptr && !name->is_string())
      return bad("response_format.json_schema.name", "'response_format.json_schema.name' must be a string");
    const json* strict = field(*js, "strict");
    if (strict != nullptr && !strict->is_boolean())
      return bad("response_format.json_schema.strict",
                 "'response_format.json_schema.strict' must be a boolean");
    const json* schema = field(*js, "schema");
    if (schema == nullptr)
      return bad("response_format.json_schema.schema", "'response_format.json_schema.schema' is required");
    if (auto e = schema_source("response_format.json_schema.schema", *schema, s)) return e;
    s.strict = strict != nullptr && strict->get<bool>();
  } else {
    return bad("response_format",
               fmt::format("'response_format.type' = '{}' must be text, json_object or json_schema", t));
  }
  out.push_back(std::move(s));
  return std::nullopt;
}

// vLLM's structured_outputs {json, regex, choice, grammar, json_object}.
std::optional<ApiError> structured_outputs(const json& so, std::vector<Source>& out) {
  if (!so.is_object()) return bad("structured_outputs", "'structured_outputs' must be an object");
  for (const auto& [key, v] : so.items()) {
    if (v.is_null()) continue;
    const std::string param = "structured_outputs." + key;
    Source s;
    std::optional<ApiError> e;
    if (key == "json") {
      e = schema_source(param, v, s);
    } else if (key == "regex") {
      e = text_source(param, v, OutputConstraint::Kind::regex, s);
    } else if (key == "grammar") {
      e = text_source(param, v, OutputConstraint::Kind::gbnf, s);
    } else if (key == "choice") {
      e = choice_source(param, v, s);
    } else if (key == "json_object") {
      if (!v.is_boolean()) return bad(param, fmt::format("'{}' must be a boolean", param));
      if (!v.get<bool>()) continue;
      s = {param, {OutputConstraint::Kind::json_schema, R"({"type":"object"})"}};
    } else if (key == "whitespace_pattern" || key == "disable_any_whitespace" ||
               key == "disable_additional_properties" || key == "structural_tag" || key == "backend") {
      return bad(param, fmt::format("'{}' is not supported", param));
    } else {
      return bad(param, fmt::format("'{}' is not a field of structured_outputs (json, regex, choice, "
                                    "grammar, json_object)",
                                    param));
    }
    if (e) return e;
    out.push_back(std::move(s));
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> read_constraint(const json& body, Engine& engine, Parsed& p) {
  std::vector<Source> sources;
  if (const json* rf = field(body, "response_format")) {
    if (auto e = response_format(*rf, sources)) return e;
  }
  if (const json* so = field(body, "structured_outputs")) {
    if (auto e = structured_outputs(*so, sources)) return e;
  }
  const std::pair<const char*, OutputConstraint::Kind> texts[] = {
      {"grammar", OutputConstraint::Kind::gbnf},         // llama.cpp
      {"guided_grammar", OutputConstraint::Kind::gbnf},  // vLLM (GBNF only)
      {"guided_regex", OutputConstraint::Kind::regex},
  };
  for (const auto& [key, kind] : texts) {
    if (const json* v = field(body, key)) {
      Source s;
      if (auto e = text_source(key, *v, kind, s)) return e;
      sources.push_back(std::move(s));
    }
  }
  for (const char* key : {"json_schema", "guided_json"}) {  // llama.cpp's, vLLM's
    if (const json* v = field(body, key)) {
      Source s;
      if (auto e = schema_source(key, *v, s)) return e;
      sources.push_back(std::move(s));
    }
  }
  if (const json* v = field(body, "guided_choice")) {
    Source s;
    if (auto e = choice_source("guided_choice", *v, s)) return e;
    sources.push_back(std::move(s));
  }
  if (sources.empty()) return std::nullopt;
  if (sources.size() > 1) {
    return bad(sources[1].param, fmt::format("'{}' and '{}' both constrain the output: give one",
                                             sources[0].param, sources[1].param));
  }
  if (Status st = engine.check_constraint(sources[0].constraint); !st.ok())
    return bad(sources[0].param, fmt::format("'{}': {}", sources[0].param, st.message()));
  if (sources[0].strict) {
    // The engine converts the schema without strict; strict only adds refusals, so a schema it passes gets
    // the same grammar.
    const auto schema = nlohmann::ordered_json::parse(sources[0].constraint.text, nullptr, false);
    Result<std::string> g = grammar::json_schema_to_gbnf(schema, {.strict = true});
    if (!g.ok())
      return bad(sources[0].param, fmt::format("'{}': strict: {}", sources[0].param, g.status().message()));
  }
  p.base.constraint = std::move(sources[0].constraint);
  return std::nullopt;
}

}  // namespace kiln::server::api_detail
