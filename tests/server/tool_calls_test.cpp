// The tool call parser (server/tool_calls.h): whole outputs, the same outputs fed in every split, streaming
// order and hold-back, and the JSON scanner under it.
#include "server/tool_calls.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "server/json_scan.h"

namespace kiln::server {
namespace {

using Kind = ToolCallEvent::Kind;

const std::vector<std::string> kNames = {"get_weather", "add"};

std::string read_template(const std::string& name) {
  std::ifstream f(std::string(KILN_TEST_DATA_DIR) + "/templates/" + name + ".jinja");
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

ParsedOutput parse(ToolCallFormat f, std::string_view text, int32_t max_calls = 100) {
  return parse_tool_calls(f, kNames, text, max_calls);
}

// The output fed in the given pieces, the events merged.
ParsedOutput parse_pieces(ToolCallFormat f, const std::vector<std::string>& pieces, int32_t max_calls = 100) {
  ToolCallParser p(f, kNames, max_calls);
  std::vector<ToolCallEvent> events;
  for (const std::string& s : pieces) p.feed(s, events);
  p.finish(events);
  ParsedOutput out;
  merge_events(events, out);
  return out;
}

void expect_same(const ParsedOutput& a, const ParsedOutput& b, const std::string& where) {
  EXPECT_EQ(a.content, b.content) << where;
  ASSERT_EQ(a.calls.size(), b.calls.size()) << where;
  for (size_t i = 0; i < a.calls.size(); ++i) {
    EXPECT_EQ(a.calls[i].name, b.calls[i].name) << where;
    EXPECT_EQ(a.calls[i].arguments, b.calls[i].arguments) << where;
  }
}

struct Case {
  ToolCallFormat format;
  std::string text;
  std::string content;
  std::vector<ParsedToolCall> calls;
};

const std::vector<Case>& cases() {
  using F = ToolCallFormat;
  static const std::vector<Case> kCases = {
      // Hermes (Qwen)
      {F::hermes,
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
       "",
       {{"get_weather", "{\"city\": \"Paris\"}"}}},
      {F::hermes,
       "Let me check.\n\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1.5e3, \"b\": "
       "-2}}\n</tool_call>\n"
       "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Z\\u00fcrich "
       "\\\"}\\\"\",\"d\":[true,"
       "null,{}]}}\n</tool_call>",
       "Let me check.",
       {{"add", "{\"a\": 1.5e3, \"b\": -2}"},
        {"get_weather", "{\"city\":\"Z\\u00fcrich \\\"}\\\"\",\"d\":[true,null,{}]}"}}},
      {F::hermes, "<tool_call>\nnot json\n</tool_call>", "<tool_call>\nnot json\n</tool_call>", {}},
      {F::hermes,
       "<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>",
       "<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>",
       {}},
      {F::hermes,
       "<tool_call>\n{\"arguments\": {}, \"name\": \"add\"}\n</tool_call>",
       "<tool_call>\n{\"arguments\": {}, \"name\": \"add\"}\n</tool_call>",
       {}},
      {F::hermes,
       "<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": [1, 2",
       "",
       {{"add", "{\"a\": [1, 2"}}},
      {F::hermes,
       "<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": tru x}}</tool_call>",
       "x}}</tool_call>",
       {{"add", "{\"a\": tru"}}},
      {F::hermes, "<tool_call>{\"name\": \"add\", \"arguments\": {}} oops", "} oops", {{"add", "{}"}}},
      {F::hermes, "Plain text <tool and <tool_c\n\n", "Plain text <tool and <tool_c\n\n", {}},
      {F::hermes, "  leading and trailing  \n", "  leading and trailing  \n", {}},
      {F::hermes, "<<tool_call>{\"name\": \"add\", \"arguments\": {}}</tool_call>", "<", {{"add", "{}"}}},
      {F::hermes,
       "<tool_call>\n{\"name\": \"add\", \"arguments\": {}}\n</tool_call>\nDone.",
       "Done.",
       {{"add", "{}"}}},
      {F::hermes,
       "```json\n{\n  \"name\": \"add\",\n  \"arguments\": {\n    \"a\": 17\n  }\n}\n```",
       "",
       {{"add", "{\n    \"a\": 17\n  }"}}},
      {F::hermes,
       "Calling:\n```\n{\"name\": \"add\", \"arguments\": {}}```\n```python\nprint(1)\n```",
       "Calling:```python\nprint(1)\n```",
       {{"add", "{}"}}},
      {F::hermes, "{\"name\": \"add\", \"arguments\": {\"b\": 2}}", "", {{"add", "{\"b\": 2}"}}},
      {F::hermes, "{\"a\": 1} and ```json\n[1]\n```", "{\"a\": 1} and ```json\n[1]\n```", {}},
      {F::hermes,
       "```json\n{\"name\": \"add\", \"arguments\": {\"a\": 1},\n \"response\": {\"sum\": [3, \"}\"]}}\n```",
       "",
       {{"add", "{\"a\": 1}"}}},
      {F::hermes,
       "<tool_call>{\"name\": \"add\", \"arguments\": {}, \"n\": 5}</tool_call>",
       ", \"n\": 5}</tool_call>",
       {{"add", "{}"}}},
      // Llama 3.x JSON
      {F::llama3,
       "{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}",
       "",
       {{"add", "{\"a\": 1, \"b\": 2}"}}},
      {F::llama3,
       "<|python_tag|>{\"type\": \"function\", \"name\": \"get_weather\", \"parameters\": {\"city\": "
       "\"Oslo\"}}",
       "",
       {{"get_weather", "{\"city\": \"Oslo\"}"}}},
      {F::llama3,
       "\n{\"name\": \"add\", \"parameters\": {}}; {\"name\": \"add\", \"arguments\": {\"a\": 0}}",
       "",
       {{"add", "{}"}, {"add", "{\"a\": 0}"}}},
      {F::llama3, "{\"a\": 1}", "{\"a\": 1}", {}},
      {F::llama3, "{\"name\": \"add\", \"parameters\": 5}", "{\"name\": \"add\", \"parameters\": 5}", {}},
      {F::llama3,
       "Sure: {\"name\": \"add\", \"parameters\": {}}",
       "Sure: {\"name\": \"add\", \"parameters\": {}}",
       {}},
      // Mistral
      {F::mistral,
       "[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 1}, \"id\": \"abcDEF123\"}, {\"name\": "
       "\"get_weather\", \"arguments\": {\"city\": \"Rome\"}}]",
       "",
       {{"add", "{\"a\": 1}"}, {"get_weather", "{\"city\": \"Rome\"}"}}},
      {F::mistral, "[{\"name\": \"add\", \"arguments\": {}}]", "", {{"add", "{}"}}},
      {F::mistral, "[1, 2, 3]", "[1, 2, 3]", {}},
      {F::mistral, "[[TOOL_CALLS]]", "[[TOOL_CALLS]]", {}},
      {F::mistral,
       "Here: [TOOL_CALLS][{\"name\": \"add\", \"arguments\": {}}] and more",
       "Here:and more",
       {{"add", "{}"}}},
  };
  return kCases;
}

TEST(ToolCallFormat, PickedFromTheTemplate) {
  EXPECT_EQ(tool_call_format(read_template("qwen2.5")), ToolCallFormat::hermes);
  EXPECT_EQ(tool_call_format(read_template("qwen3")), ToolCallFormat::hermes);
  EXPECT_EQ(tool_call_format(read_template("llama3.1")), ToolCallFormat::llama3);
  EXPECT_EQ(tool_call_format(read_template("llama3.2")), ToolCallFormat::llama3);
  EXPECT_EQ(tool_call_format(read_template("mistral-nemo")), ToolCallFormat::mistral);
  EXPECT_EQ(tool_call_format(read_template("smollm2")), ToolCallFormat::none);
  EXPECT_EQ(tool_call_format(read_template("gemma3")), ToolCallFormat::none);
  EXPECT_EQ(tool_call_format(""), ToolCallFormat::none);
}

TEST(ToolCallParser, WholeOutputs) {
  for (const Case& c : cases()) {
    const ParsedOutput got = parse(c.format, c.text);
    expect_same(got, ParsedOutput{c.content, c.calls}, c.text);
  }
}

TEST(ToolCallParser, EverySplitGivesTheSameResult) {
  for (const Case& c : cases()) {
    const ParsedOutput whole = parse(c.format, c.text);
    for (size_t i = 0; i <= c.text.size(); ++i) {
      expect_same(parse_pieces(c.format, {c.text.substr(0, i), c.text.substr(i)}), whole,
                  c.text + " split at " + std::to_string(i));
    }
    std::vector<std::string> bytes;
    for (const char ch : c.text) bytes.emplace_back(1, ch);
    expect_same(parse_pieces(c.format, bytes), whole, c.text + " byte by byte");
    for (size_t i = 0; i < c.text.size(); i += 3) {  // three pieces, the middle one of every length
      for (size_t j = i; j <= c.text.size(); j += 2) {
        expect_same(parse_pieces(c.format, {c.text.substr(0, i), c.text.substr(i, j - i), c.text.substr(j)}),
                    whole, c.text + " split at " + std::to_string(i) + ", " + std::to_string(j));
      }
    }
  }
}

// Outputs made of pieces of the syntaxes, valid and broken, around one whole call, in random order (a fixed
// seed): whatever they are, feeding them byte by byte, or in two pieces, gives what the whole gives.
TEST(ToolCallParser, RandomOutputsGiveTheSameResultWhateverTheSplit) {
  // clang-format off
  const std::vector<std::string> pieces = {
      "<tool_call>", "</tool_call>", "<tool_", "```json", "```", "[TOOL_CALLS]", "<|python_tag|>", "{", "}", "[", "]",
      ",", ";", ":", "\n", " ", "\"name\"", "\"arguments\"", "\"parameters\"", "\"add\"", "\"get_weather\"",
      "\"nope\"", "\"type\": \"function\", ", "\"a\": 1", "tru", "e", "-", "0.5", "\"x\\\"", "text", "é",
      "{\"name\": \"add\", \"arguments\": {"};
  const std::vector<std::string> calls = {
      "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": [1, {}]}}\n</tool_call>",
      "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"\\\"}\"}}",
      "[{\"name\": \"add\", \"arguments\": {}, \"id\": \"abc\"}, {\"name\": \"add\", \"arguments\": {\"b\": 2}}]",
      "```json\n{\"name\": \"add\", \"arguments\": {\"x\": null}}\n```"};
  // clang-format on
  uint64_t state = 12345;
  const auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(state >> 33);
  };
  int with_calls = 0;
  for (int n = 0; n < 300; ++n) {
    std::string text;
    const uint32_t len = 1 + next() % 12, call_at = next() % len;
    for (uint32_t k = 0; k < len; ++k) {
      text += k == call_at ? calls[next() % calls.size()] : pieces[next() % pieces.size()];
    }
    const int32_t max_calls = 1 + n % 3;
    for (const ToolCallFormat f : {ToolCallFormat::hermes, ToolCallFormat::llama3, ToolCallFormat::mistral}) {
      const ParsedOutput whole = parse(f, text, max_calls);
      std::vector<std::string> bytes;
      for (const char ch : text) bytes.emplace_back(1, ch);
      expect_same(parse_pieces(f, bytes, max_calls), whole, text);
      const size_t cut = next() % (text.size() + 1);
      expect_same(parse_pieces(f, {text.substr(0, cut), text.substr(cut)}, max_calls), whole, text);
      if (whole.calls.empty()) {
        EXPECT_EQ(whole.content, text);  // no call: the output as it was written
      }
      EXPECT_LE(whole.calls.size(), static_cast<size_t>(max_calls));
      with_calls += !whole.calls.empty();
    }
  }
  EXPECT_GT(with_calls, 200);  // of 900: the outputs make calls often enough to test them
}

TEST(ToolCallParser, AtMostMaxCalls) {
  const std::string two =
      "<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 1}}</tool_call>\n<tool_call>{\"name\": "
      "\"get_weather\", \"arguments\": {}}</tool_call>";
  const ParsedOutput one = parse(ToolCallFormat::hermes, two, 1);
  ASSERT_EQ(one.calls.size(), 1u);
  EXPECT_EQ(one.calls[0].name, "add");
  EXPECT_EQ(one.content, "");
  std::vector<std::string> bytes;
  for (const char ch : two) bytes.emplace_back(1, ch);
  expect_same(parse_pieces(ToolCallFormat::hermes, bytes, 1), one, "byte by byte");
}

TEST(ToolCallParser, StreamsContentThenTheCallThenArgumentPieces) {
  ToolCallParser p(ToolCallFormat::hermes, kNames);
  std::vector<ToolCallEvent> ev;
  p.feed("I will look. <tool", ev);  // the space and the marker's prefix wait
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, Kind::content);
  EXPECT_EQ(ev[0].text, "I will look.");
  ev.clear();
  p.feed("_call>\n{\"name\": \"get_wea", ev);
  EXPECT_TRUE(ev.empty());
  p.feed("ther\", \"arguments\": {\"ci", ev);
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].kind, Kind::call);
  EXPECT_EQ(ev[0].text, "get_weather");
  EXPECT_EQ(ev[1].kind, Kind::arguments);
  EXPECT_EQ(ev[1].text, "{\"ci");
  ev.clear();
  p.feed("ty\": \"Paris\"}}\n</tool_", ev);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, Kind::arguments);
  EXPECT_EQ(ev[0].text, "ty\": \"Paris\"}");
  ev.clear();
  p.feed("call>", ev);
  p.finish(ev);
  EXPECT_TRUE(ev.empty());
  EXPECT_EQ(p.n_calls(), 1);
}

TEST(ToolCallParser, HeldTextThatIsNotACallIsContentAtTheEnd) {
  ToolCallParser p(ToolCallFormat::hermes, kNames);
  std::vector<ToolCallEvent> ev;
  p.feed("x <tool_call>{\"name\": \"add\"", ev);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].text, "x");
  ev.clear();
  p.finish(ev);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, Kind::content);
  EXPECT_EQ(ev[0].text, " <tool_call>{\"name\": \"add\"");
  EXPECT_EQ(p.n_calls(), 0);
}

TEST(JsonScanner, ValidObjectsEndAtTheirLastByte) {
  for (const std::string s :
       {"{}", "{\"a\": 1}", "{\"a\":[1,-0.5e+3,\"x\\n\\u00e9\",true,false,null,{}],\"b\":{}}",
        "{ \"k\" : [ ] , \"l\" : 0 }", "{\"a\": 1E5}", "{\"\\\\\": \"]}\"}"}) {
    JsonScanner j;
    j.start_object();
    for (size_t i = 1; i < s.size(); ++i) {
      const auto r = j.feed(s[i]);
      ASSERT_EQ(r, i + 1 == s.size() ? JsonScanner::Step::done : JsonScanner::Step::more) << s << " at " << i;
    }
  }
}

TEST(JsonScanner, InvalidBytesAreErrors) {
  for (const std::string s : {"{a", "{\"a\" 1", "{\"a\": 01", "{\"a\": -}", "{\"a\": 1.}", "{\"a\": tru}",
                              "{\"a\": [1,]", "{\"a\": \"\\x\"}", "{\"a\": \"\\u12g4\"}", "{\"a\": 1]", "{,",
                              "{\"a\": \"\n\"}", "{\"a\": 1 2}", "{\"a\": +1}", "{\"a\": 1e}"}) {
    JsonScanner j;
    j.start_object();
    bool error = false;
    for (size_t i = 1; i < s.size() && !error; ++i) {
      const auto r = j.feed(s[i]);
      ASSERT_NE(r, JsonScanner::Step::done) << s;
      error = r == JsonScanner::Step::error;
    }
    EXPECT_TRUE(error) << s;
  }
}

TEST(JsonScanner, DepthIsBounded) {
  JsonScanner j;
  j.start_object();
  for (const char c : std::string("\"a\":")) ASSERT_EQ(j.feed(c), JsonScanner::Step::more);
  size_t depth = 1;
  while (j.feed('[') == JsonScanner::Step::more) ASSERT_LT(++depth, 10'000u);
  EXPECT_EQ(depth, JsonScanner::kMaxDepth);
}

}  // namespace
}  // namespace kiln::server
