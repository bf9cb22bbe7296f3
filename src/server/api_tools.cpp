// Tool calling's part of parse and validate (api_internal.h): a chat request's tools, tool_choice and
// parallel_tool_calls, and the tool fields of its messages.
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "server/api_internal.h"

namespace kiln::server::api_detail {

namespace {

constexpr size_t kMaxTools = 128;

// A field that must be a string when present.
std::optional<ApiError> read_string(const json& j, const char* key, const std::string& param,
                                    std::string& out) {
  const json* v = field(j, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) return bad(param, fmt::format("'{}' must be a string, got {}", param, v->type_name()));
  out = v->get<std::string>();
  return std::nullopt;
}

// An assistant message's tool_calls: [{id, type: "function", function: {name, arguments}}].
std::optional<ApiError> read_tool_calls(const json& calls, const std::string& param, ChatMessage& cm) {
  if (!calls.is_array()) return bad(param, fmt::format("'{}' must be a list of tool calls", param));
  for (size_t k = 0; k < calls.size(); ++k) {
    const json& c = calls[k];
    const std::string at = fmt::format("{}[{}]", param, k);
    if (!c.is_object()) return bad(at, fmt::format("'{}' must be an object", at));
    ToolCall call;
    if (auto e = read_string(c, "id", at + ".id", call.id)) return e;
    const json* type = field(c, "type");
    if (type != nullptr && *type != "function") {
      return bad(at + ".type", fmt::format("'{}.type' must be 'function'", at));
    }
    const json* fn = field(c, "function");
    if (fn == nullptr || !fn->is_object()) {
      return bad(at + ".function", fmt::format("'{}.function' must be an object", at));
    }
    if (auto e = read_string(*fn, "name", at + ".function.name", call.name)) return e;
    if (call.name.empty()) {
      return bad(at + ".function.name", fmt::format("'{}.function.name' is required", at));
    }
    if (auto e = read_string(*fn, "arguments", at + ".function.arguments", call.arguments)) return e;
    if (!call.arguments.empty()) {
      const json args = json::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
      if (!args.is_object()) {
        return bad(at + ".function.arguments",
                   fmt::format("'{}.function.arguments' must be a JSON object, as text", at));
      }
    }
    cm.tool_calls.push_back(std::move(call));
  }
  return std::nullopt;
}

// tools[i].function.parameters as JSON text, its keys in the order the request wrote them (`ordered`: the
// body parsed again keeping the order; `params`: the same value, keys sorted, for a body whose repeated keys
// made the two differ).
std::string ordered_parameters(const nlohmann::ordered_json& ordered, size_t i, const json& params) {
  const auto child = [](const nlohmann::ordered_json* j, const char* key) -> const nlohmann::ordered_json* {
    if (j == nullptr || !j->is_object()) return nullptr;
    const auto it = j->find(key);
    return it == j->end() ? nullptr : &*it;
  };
  const nlohmann::ordered_json* tools = child(&ordered, "tools");
  const nlohmann::ordered_json* tool =
      tools != nullptr && tools->is_array() && i < tools->size() ? &(*tools)[i] : nullptr;
  const nlohmann::ordered_json* p = child(child(tool, "function"), "parameters");
  if (p != nullptr && p->is_object())
    return p->dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  return dump(params);
}

}  // namespace

std::optional<ApiError> read_message_tool_fields(const json& m, size_t i, ChatMessage& cm) {
  const std::string param = fmt::format("messages[{}]", i);
  if (auto e = read_string(m, "name", param + ".name", cm.name)) return e;
  if (const json* calls = field(m, "tool_calls")) {
    if (cm.role != "assistant") {
      return bad(param + ".tool_calls", fmt::format("'{}.tool_calls' is only for assistant messages", param));
    }
    if (auto e = read_tool_calls(*calls, param + ".tool_calls", cm)) return e;
  }
  if (cm.role == "tool") {
    if (auto e = read_string(m, "tool_call_id", param + ".tool_call_id", cm.tool_call_id)) return e;
    if (cm.tool_call_id.empty()) {
      return bad(
          param + ".tool_call_id",
          fmt::format("'{}.tool_call_id' is required: the id of the call this message answers", param));
    }
  }
  return std::nullopt;
}

std::optional<ApiError> read_tool_definitions(const std::string& body_text, const json& body,
                                              std::vector<ToolDefinition>& out) {
  const json* tools = field(body, "tools");
  if (tools == nullptr) return std::nullopt;
  if (!tools->is_array()) return bad("tools", "'tools' must be a list of tools");
  if (tools->size() > kMaxTools) {
    return bad("tools", fmt::format("'tools' has {} tools: at most {}", tools->size(), kMaxTools));
  }
  // The parameters schemas keep their keys' order (the prompt shows them, the grammar follows them).
  const auto ordered = nlohmann::ordered_json::parse(body_text, nullptr, /*allow_exceptions=*/false);
  for (size_t i = 0; i < tools->size(); ++i) {
    const json& t = (*tools)[i];
    const std::string param = fmt::format("tools[{}]", i);
    if (!t.is_object()) return bad(param, fmt::format("'{}' must be an object", param));
    const json* type = field(t, "type");
    if (type != nullptr && *type != "function") {
      return bad(param + ".type", fmt::format("'{}.type' must be 'function' (the only kind of tool)", param));
    }
    const json* fn = field(t, "function");
    if (fn == nullptr || !fn->is_object()) {
      return bad(param + ".function", fmt::format("'{}.function' must be an object", param));
    }
    ToolDefinition d;
    if (auto e = read_string(*fn, "name", param + ".function.name", d.name)) return e;
    if (d.name.empty()) {
      return bad(param + ".function.name", fmt::format("'{}.function.name' is required", param));
    }
    for (const ToolDefinition& other : out) {
      if (other.name == d.name) {
        return bad(param + ".function.name",
                   fmt::format("'{}.function.name': '{}' is defined twice", param, d.name));
      }
    }
    if (auto e = read_string(*fn, "description", param + ".function.description", d.description)) return e;
    if (const json* params = field(*fn, "parameters")) {
      if (!params->is_object()) {
        return bad(param + ".function.parameters",
                   fmt::format("'{}.function.parameters' must be a JSON schema object", param));
      }
      d.parameters = ordered_parameters(ordered, i, *params);
    }
    out.push_back(std::move(d));
  }
  return std::nullopt;
}

std::optional<ApiError> read_tools(const std::string& body_text, const json& body,
                                   const ModelDescription& model, Parsed& p) {
  if (auto e = read_tool_definitions(body_text, body, p.tools)) return e;
  bool parallel = true;
  if (auto e = read_bool(body, "parallel_tool_calls", parallel)) return e;
  // tool_choice: "auto" (the default with tools), "none" (the default without), "required", or a function.
  std::string mode = p.tools.empty() ? "none" : "auto";
  std::string forced;  // the named function
  if (const json* choice = field(body, "tool_choice"); choice != nullptr && choice->is_string()) {
    mode = choice->get<std::string>();
    if (mode != "auto" && mode != "none" && mode != "required") {
      return bad("tool_choice",
                 fmt::format("'tool_choice' = '{}' must be auto, none, required or a function", mode));
    }
  } else if (choice != nullptr) {
    const json* type = choice->is_object() ? field(*choice, "type") : nullptr;
    const json* fn = choice->is_object() ? field(*choice, "function") : nullptr;
    const json* name = fn != nullptr && fn->is_object() ? field(*fn, "name") : nullptr;
    if (type == nullptr || *type != "function" || name == nullptr || !name->is_string()) {
      return bad("tool_choice",
                 "'tool_choice' must be a string or {\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    mode = "function";
    forced = name->get<std::string>();
  }
  const std::string choice_text = mode == "function" ? forced : mode;
  if (p.tools.empty()) {
    if (mode == "auto" || mode == "none") return std::nullopt;
    return bad("tool_choice", fmt::format("'tool_choice' = '{}' needs 'tools'", choice_text));
  }
  if (mode == "function" && std::none_of(p.tools.begin(), p.tools.end(),
                                         [&](const ToolDefinition& d) { return d.name == forced; })) {
    return bad("tool_choice",
               fmt::format("'tool_choice' names the function '{}', which is not in 'tools'", forced));
  }
  // As vLLM by default: with "none" the template still shows the tools, and the output is not parsed.
  if (mode == "none") return std::nullopt;
  const ToolCallFormat format = tool_call_format(model.chat_template);
  if (format == ToolCallFormat::none) {
    return bad("tools",
               "this model's chat template shows no tool call syntax kiln knows (Hermes <tool_call>, Llama 3 "
               "JSON, Mistral [TOOL_CALLS]): its calls could not be read; use 'tool_choice': 'none'");
  }
  p.tool_format = format;
  for (const ToolDefinition& d : p.tools) p.tool_names.push_back(d.name);
  // A template that refuses several calls in one assistant message (Meta's Llama 3.1 and 3.2 templates raise
  // "only supports single tool-calls at once") gets one: a second could not be sent back to it.
  if (model.chat_template.find("only supports single tool-call") != std::string_view::npos) parallel = false;
  p.max_tool_calls = parallel ? std::numeric_limits<int32_t>::max() : 1;
  if (mode == "auto") return std::nullopt;
  if (p.base.constraint.kind != OutputConstraint::Kind::none) {
    return bad("tool_choice",
               fmt::format("'tool_choice' = '{}' cannot be combined with another output constraint "
                           "(response_format, grammar, json_schema, structured_outputs, guided_*)",
                           choice_text));
  }
  std::vector<ToolDefinition> callable;
  for (const ToolDefinition& d : p.tools) {
    if (mode == "required" || d.name == forced) callable.push_back(d);
  }
  auto grammar = tool_call_grammar(format, callable, parallel && mode == "required");
  if (!grammar.ok()) return bad("tools", grammar.status().message());
  p.base.constraint = {OutputConstraint::Kind::gbnf, std::move(*grammar)};
  p.prompt_suffix = forced_call_prefix(format);
  return std::nullopt;
}

}  // namespace kiln::server::api_detail
