// tool_call_grammar and forced_call_prefix (tool_calls.h): the GBNF of a forced call in the model's own
// syntax, each function's arguments from its parameters schema (grammar/json_schema.h). The output is written
// as the chat templates render a call back into the prompt: `{"name": "f", "arguments": {...}}` with ", " and
// ": " separators.
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <string>

#include "grammar/json_schema.h"
#include "server/tool_calls.h"

namespace kiln::server {

namespace {

// `s` as a GBNF string literal.
std::string gbnf_literal(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (u < 0x20 || u == 0x7f) {
      out += fmt::format("\\x{:02X}", u);
    } else {
      out += c;  // UTF-8 passes as it is
    }
  }
  return out + "\"";
}

}  // namespace

std::string_view forced_call_prefix(ToolCallFormat format) {
  return format == ToolCallFormat::mistral ? "[TOOL_CALLS]" : "";
}

Result<std::string> tool_call_grammar(ToolCallFormat format, const std::vector<ToolDefinition>& tools,
                                      bool parallel) {
  if (format == ToolCallFormat::none) return invalid_argument("tool calls: the model has no call syntax");
  if (tools.empty()) return invalid_argument("tool calls: no function to call");
  const char* args_key = format == ToolCallFormat::llama3 ? "parameters" : "arguments";
  grammar::SchemaGrammar schemas;
  std::string functions;  // the alternatives of tool-call-function
  std::string rules;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ToolDefinition& t = tools[i];
    std::string args;
    const std::string prefix = fmt::format("tool-args-{}", i);
    if (t.parameters.empty()) {
      args = schemas.add_any_json(prefix, /*object_only=*/true);
    } else {
      const auto schema = nlohmann::ordered_json::parse(t.parameters, nullptr, /*allow_exceptions=*/false);
      if (!schema.is_object()) return invalid_argument("tool '{}': parameters: not a JSON object", t.name);
      if (const auto type = schema.find("type"); type != schema.end() && *type != "object") {
        return invalid_argument("tool '{}': parameters: the schema must describe an object, not {}", t.name,
                                type->dump());
      }
      auto rule = schemas.add(schema, prefix);
      if (!rule.ok()) {
        return Status(rule.status().code(),
                      fmt::format("tool '{}': parameters: {}", t.name, rule.status().message()));
      }
      args = *rule;
    }
    const std::string name =
        nlohmann::json(t.name).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    rules += fmt::format("tool-call-{} ::= {} {}\n", i,
                         gbnf_literal(fmt::format("{}, \"{}\": ", name, args_key)), args);
    functions += fmt::format("{}tool-call-{}", i == 0 ? "" : " | ", i);
  }
  std::string root;
  switch (format) {
    case ToolCallFormat::hermes:
      root = "root ::= tool-call" + std::string(parallel ? " (\"\\n\" tool-call)*" : "") +
             "\ntool-call ::= \"<tool_call>\\n{\\\"name\\\": \" tool-call-function \"}\\n</tool_call>\"\n";
      break;
    case ToolCallFormat::llama3:  // several calls separated by "; ", as vLLM's llama3_json parser reads them
      root = "root ::= tool-call" + std::string(parallel ? " (\"; \" tool-call)*" : "") +
             "\ntool-call ::= \"{\\\"name\\\": \" tool-call-function \"}\"\n";
      break;
    case ToolCallFormat::mistral:  // after [TOOL_CALLS], which ends the prompt (forced_call_prefix)
      root = "root ::= \"[\" tool-call" + std::string(parallel ? " (\", \" tool-call)*" : "") +
             " \"]\"\ntool-call ::= \"{\\\"name\\\": \" tool-call-function \"}\"\n";
      break;
    case ToolCallFormat::none: break;
  }
  return root + "tool-call-function ::= " + functions + "\n" + rules + schemas.rules();
}

}  // namespace kiln::server
