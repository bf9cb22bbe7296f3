// The grammar of a forced tool call (tool_calls.h: tool_call_grammar), run by the matcher over a byte
// vocabulary: it accepts a valid call in each syntax, and rejects a wrong name, key, argument or count; what
// it accepts, the parser reads back as the same call.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "server/tool_calls.h"

namespace kiln::server {
namespace {

constexpr int32_t kEnd = 256;  // the byte vocabulary's end token

std::shared_ptr<const grammar::Vocabulary> byte_vocabulary() {
  auto v = std::make_shared<grammar::Vocabulary>();
  for (int b = 0; b < 256; ++b) v->bytes.emplace_back(1, static_cast<char>(b));
  v->bytes.emplace_back();
  v->end_ids = {kEnd};
  v->excluded.assign(v->bytes.size(), 0);
  v->excluded[kEnd] = 1;
  return v;
}

const std::vector<ToolDefinition> kTools = {
    {"get_weather", "The weather in a city.",
     R"({"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"type": "string",
         "enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"], "additionalProperties": false})"},
    {"add", "",
     R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a",
         "b"], "additionalProperties": false})"},
    {"ping", "", ""},
};

std::string grammar_of(ToolCallFormat f, bool parallel, const std::vector<ToolDefinition>& tools = kTools) {
  auto g = tool_call_grammar(f, tools, parallel);
  EXPECT_TRUE(g.ok()) << g.status().message();
  return g.ok() ? *g : std::string();
}

// `text` with the JSON after each "arguments": / "parameters": written without the spaces after ':' and ','
// (outside strings): the other layout a schema grammar may choose.
std::string compact_arguments(const std::string& text) {
  std::string out;
  size_t i = 0;
  for (;;) {
    const size_t at = std::min(text.find("\"arguments\": ", i), text.find("\"parameters\": ", i));
    if (at == std::string::npos) return out + text.substr(i);
    const size_t from = text.find(": ", at) + 2;
    out += text.substr(i, from - i);
    int depth = 0;
    bool in_string = false, escaped = false;
    size_t k = from;
    for (; k < text.size(); ++k) {
      const char c = text[k];
      out += c;
      if (in_string) {
        if (escaped) {
          escaped = false;
        } else if (c == '\\') {
          escaped = true;
        } else if (c == '"') {
          in_string = false;
        }
      } else if (c == '"') {
        in_string = true;
      } else if ((c == ':' || c == ',') && k + 1 < text.size() && text[k + 1] == ' ') {
        ++k;
      } else if (c == '{' || c == '[') {
        ++depth;
      } else if ((c == '}' || c == ']') && --depth == 0) {
        break;
      }
    }
    if (k >= text.size()) return out;
    i = k + 1;
  }
}

// Whether the grammar's matcher takes `text` whole, byte by byte (each byte in the mask first), and then
// ends.
bool accepts_exactly(const std::string& gbnf, const std::string& text) {
  auto parsed = grammar::parse_gbnf(gbnf);
  EXPECT_TRUE(parsed.ok()) << parsed.status().message() << "\n" << gbnf;
  if (!parsed.ok()) return false;
  auto compiled = grammar::compile(*parsed, byte_vocabulary());
  EXPECT_TRUE(compiled.ok()) << compiled.status().message();
  if (!compiled.ok()) return false;
  grammar::Matcher m(*compiled);
  std::vector<uint32_t> mask(grammar::mask_words(kEnd + 1));
  for (const char c : text) {
    const auto t = static_cast<int32_t>(static_cast<unsigned char>(c));
    m.fill_mask(mask);
    if ((mask[static_cast<size_t>(t) / 32] >> (t % 32) & 1u) == 0) return false;
    if (!m.accept(t)) return false;
  }
  m.fill_mask(mask);
  return (mask[kEnd / 32] >> (kEnd % 32) & 1u) != 0 && m.accept(kEnd);
}

// ... with its arguments in either layout.
bool accepts(const std::string& gbnf, const std::string& text) {
  return accepts_exactly(gbnf, text) || accepts_exactly(gbnf, compact_arguments(text));
}

TEST(ToolCallGrammar, CompactArgumentsOfTheTests) {
  EXPECT_EQ(compact_arguments(R"(x {"name": "f", "arguments": {"a": [1, "b: c", {"d": ""}"}]}, "e": 1} y)"),
            R"(x {"name": "f", "arguments": {"a":[1,"b: c",{"d":""}"}]}, "e": 1} y)");
}

const std::string kWeather =
    R"(<tool_call>
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
</tool_call>)";
const std::string kAdd = R"(<tool_call>
{"name": "add", "arguments": {"a": 1, "b": 2}}
</tool_call>)";

TEST(ToolCallGrammar, HermesAcceptsValidCalls) {
  const std::string g = grammar_of(ToolCallFormat::hermes, /*parallel=*/true);
  EXPECT_TRUE(accepts(g, kWeather));
  EXPECT_TRUE(accepts(g, kAdd + "\n" + kWeather));
  EXPECT_TRUE(accepts(
      g, "<tool_call>\n{\"name\": \"ping\", \"arguments\": {\"x\": [1, {\"y\": null}]}}\n</tool_call>"));
  EXPECT_FALSE(accepts(g, ""));  // a call is required
  EXPECT_FALSE(accepts(g, "Sure. " + kWeather));
}

TEST(ToolCallGrammar, HermesRejectsWrongCalls) {
  const std::string g = grammar_of(ToolCallFormat::hermes, /*parallel=*/true);
  EXPECT_FALSE(accepts(g, R"(<tool_call>
{"name": "get_wether", "arguments": {"city": "Paris", "unit": "celsius"}}
</tool_call>)"));
  EXPECT_FALSE(accepts(g, R"(<tool_call>
{"name": "add", "arguments": {"a": "1", "b": 2}}
</tool_call>)"));
  EXPECT_FALSE(accepts(g, R"(<tool_call>
{"name": "add", "arguments": {"a": 1}}
</tool_call>)"));
  EXPECT_FALSE(accepts(g, R"(<tool_call>
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "kelvin"}}
</tool_call>)"));
  EXPECT_FALSE(accepts(g, R"(<tool_call>
{"name": "get_weather", "arguments": {"city": "Llanfairpwllgwyngyll", "unit": "celsius"}}
</tool_call>)"));
  EXPECT_FALSE(accepts(g, R"(<tool_call>
{"name": "add", "parameters": {"a": 1, "b": 2}}
</tool_call>)"));
}

TEST(ToolCallGrammar, OneCallWithoutParallel) {
  const std::string g = grammar_of(ToolCallFormat::hermes, /*parallel=*/false);
  EXPECT_TRUE(accepts(g, kAdd));
  EXPECT_FALSE(accepts(g, kAdd + "\n" + kWeather));
}

TEST(ToolCallGrammar, NamedFunctionOnly) {
  const std::string g = grammar_of(ToolCallFormat::hermes, /*parallel=*/false, {kTools[1]});
  EXPECT_TRUE(accepts(g, kAdd));
  EXPECT_FALSE(accepts(g, kWeather));
}

TEST(ToolCallGrammar, Llama3AndMistral) {
  const std::string llama = grammar_of(ToolCallFormat::llama3, /*parallel=*/true);
  EXPECT_TRUE(accepts(llama, R"({"name": "add", "parameters": {"a": 1, "b": 2}})"));
  EXPECT_FALSE(accepts(llama, R"({"name": "add", "arguments": {"a": 1, "b": 2}})"));
  // Several calls separated by "; " (parallel_tool_calls true), exactly one without parallel.
  const std::string two =
      R"({"name": "add", "parameters": {"a": 1, "b": 2}}; {"name": "ping", "parameters": {}})";
  EXPECT_TRUE(accepts(llama, two));
  EXPECT_FALSE(accepts(
      llama, R"({"name": "add", "parameters": {"a": 1, "b": 2}} {"name": "ping", "parameters": {}})"));
  const std::string llama_one = grammar_of(ToolCallFormat::llama3, /*parallel=*/false);
  EXPECT_TRUE(accepts(llama_one, R"({"name": "add", "parameters": {"a": 1, "b": 2}})"));
  EXPECT_FALSE(accepts(llama_one, two));
  const std::string mistral = grammar_of(ToolCallFormat::mistral, /*parallel=*/true);
  EXPECT_TRUE(accepts(mistral, R"([{"name": "add", "arguments": {"a": 1, "b": 2}}])"));
  EXPECT_TRUE(accepts(
      mistral, R"([{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "ping", "arguments": {}}])"));
  EXPECT_FALSE(accepts(mistral, R"({"name": "add", "arguments": {"a": 1, "b": 2}})"));
}

TEST(ToolCallGrammar, WhatItAcceptsParsesAsTheSameCalls) {
  const std::vector<std::string> names = {"get_weather", "add", "ping"};
  const struct {
    ToolCallFormat format;
    std::string text;
  } outputs[] = {
      {ToolCallFormat::hermes, kAdd + "\n" + kWeather},
      {ToolCallFormat::llama3,
       R"({"name": "add", "parameters": {"a": 1, "b": 2}}; {"name": "ping", "parameters": {}})"},
      {ToolCallFormat::mistral,
       R"([{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "ping", "arguments": {}}])"},
  };
  for (const auto& o : outputs) {
    const std::string g = grammar_of(o.format, true);
    ASSERT_TRUE(accepts(g, o.text)) << o.text;
    const std::string accepted = accepts_exactly(g, o.text) ? o.text : compact_arguments(o.text);
    const ParsedOutput p = parse_tool_calls(o.format, names, accepted);
    EXPECT_EQ(p.content, "") << o.text;
    ASSERT_EQ(p.calls.size(), 2u) << o.text;
    EXPECT_EQ(p.calls[0].name, "add");
    EXPECT_EQ(nlohmann::json::parse(p.calls[0].arguments), nlohmann::json::parse(R"({"a": 1, "b": 2})"));
  }
}

// Mistral's [TOOL_CALLS] is a control token: the prompt of a forced call ends with it, and the grammar writes
// the list after it. The output parses as calls whether the decoder writes the token or leaves it out.
TEST(ToolCallGrammar, ForcedCallPrefixIsTheControlTokenTheGrammarCannotWrite) {
  EXPECT_EQ(forced_call_prefix(ToolCallFormat::mistral), "[TOOL_CALLS]");
  EXPECT_EQ(forced_call_prefix(ToolCallFormat::hermes), "");
  EXPECT_EQ(forced_call_prefix(ToolCallFormat::llama3), "");
  const std::string g = grammar_of(ToolCallFormat::mistral, /*parallel=*/false);
  const std::string out = R"([{"name": "add", "arguments": {"a": 1, "b": 2}}])";
  EXPECT_TRUE(accepts(g, out));
  EXPECT_FALSE(accepts(g, "[TOOL_CALLS]" + out));
  for (const std::string& text : {out, "[TOOL_CALLS]" + out}) {
    const std::string accepted = accepts_exactly(g, out) ? text : compact_arguments(text);
    const ParsedOutput p = parse_tool_calls(ToolCallFormat::mistral, {"add"}, accepted);
    EXPECT_EQ(p.content, "") << text;
    ASSERT_EQ(p.calls.size(), 1u) << text;
    EXPECT_EQ(nlohmann::json::parse(p.calls[0].arguments), nlohmann::json::parse(R"({"a": 1, "b": 2})"));
  }
}

TEST(ToolCallGrammar, NamesAreEscaped) {
  const std::vector<ToolDefinition> tools = {{"we\"ird\\name", "", ""}};
  const std::string g = grammar_of(ToolCallFormat::hermes, false, tools);
  EXPECT_TRUE(accepts(g, "<tool_call>\n{\"name\": \"we\\\"ird\\\\name\", \"arguments\": {}}\n</tool_call>"));
}

TEST(ToolCallGrammar, SchemaErrorsNameTheTool) {
  auto g = tool_call_grammar(
      ToolCallFormat::hermes,
      {{"f", "", R"({"type": "object", "properties": {"x": {"contentMediaType": "a/b"}}})"}}, true);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("tool 'f'"), std::string::npos) << g.status().message();
  EXPECT_NE(g.status().message().find("contentMediaType"), std::string::npos) << g.status().message();
  g = tool_call_grammar(ToolCallFormat::hermes, {{"f", "", R"({"type": "string"})"}}, true);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::invalid_argument);
  EXPECT_FALSE(tool_call_grammar(ToolCallFormat::none, kTools, true).ok());
  EXPECT_FALSE(tool_call_grammar(ToolCallFormat::hermes, {}, true).ok());
}

}  // namespace
}  // namespace kiln::server
