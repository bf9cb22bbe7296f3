// libFuzzer target: arbitrary bytes as a JSON schema (when they parse as JSON) or else as a regular
// expression (regex_to_gbnf, and a string schema with that pattern). Every input must end in a Status or in
// GBNF that parse_gbnf accepts, the same with SchemaOptions::strict when that accepts the schema (a converter
// that writes GBNF the engine refuses is a bug: abort) — never a crash, a sanitizer report, a hang or an
// unbounded allocation. Compiling and matching GBNF is fuzz_gbnf's.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"

namespace {

void check(const kiln::Result<std::string>& gbnf) {
  if (!gbnf.ok()) return;
  kiln::grammar::Limits limits;  // small, so that each input stays cheap (a bound reached is a Status)
  limits.max_states = 20'000;
  limits.max_repeat = 1'000;
  auto g = kiln::grammar::parse_gbnf(*gbnf, limits);
  if (!g.ok()) {
    if (g.status().code() == kiln::StatusCode::resource_exhausted) return;
    // A schema whose required recursion never ends ({"properties": {"a": {"$ref": "#"}}, "required": ["a"]})
    // has no instance: the engine says so.
    if (g.status().message().find("matches no finite text") != std::string::npos) return;
    std::fprintf(stderr, "written GBNF does not parse: %s\n%s\n", g.status().to_string().c_str(),
                 gbnf->c_str());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto schema = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!schema.is_discarded()) {
    const auto loose = kiln::grammar::json_schema_to_gbnf(schema);
    check(loose);
    // strict only refuses (a oneOf not shown exclusive): what it passes has the grammar it has without it.
    const auto strict = kiln::grammar::json_schema_to_gbnf(schema, {.strict = true});
    if (strict.ok() && (!loose.ok() || *strict != *loose)) {
      std::fprintf(stderr, "strict changed the grammar of a schema it accepts\n");
      std::abort();
    }
    return 0;
  }
  check(kiln::grammar::regex_to_gbnf(text));
  nlohmann::ordered_json s = {{"type", "string"}, {"pattern", std::string(text)}};
  check(kiln::grammar::json_schema_to_gbnf(s));
  return 0;
}
