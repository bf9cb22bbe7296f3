// ChatTemplate: the HF variables, real templates from tests/data/templates, and the budgets.
#include "tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

namespace kiln {
namespace {

std::string read_template(const std::string& name) {
  std::ifstream f(std::string(KILN_TEST_DATA_DIR) + "/templates/" + name);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(ChatTemplate, RendersSmolLM2) {
  auto t = ChatTemplate::parse(read_template("smollm2.jinja"));
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ChatTemplateInputs in;
  in.messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "Hi"}])");
  in.add_generation_prompt = true;
  auto r = t->render(in);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(
      *r,
      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, GemmaRejectsNonAlternatingRoles) {
  auto t = ChatTemplate::parse(read_template("gemma3.jinja"));
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ChatTemplateInputs in;
  in.bos_token = "<bos>";
  in.messages = nlohmann::ordered_json::parse(
      R"([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])");
  auto r = t->render(in);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("Conversation roles must alternate"), std::string::npos);
  in.messages = nlohmann::ordered_json::parse(
      R"([{"role": "system", "content": "S"}, {"role": "user", "content": " a "}])");
  r = t->render(in);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r, "<bos><start_of_turn>user\nS\n\na<end_of_turn>\n");
}

TEST(ChatTemplate, QwenToolsAndThinkingSwitch) {
  auto t = ChatTemplate::parse(read_template("qwen3.jinja"));
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ChatTemplateInputs in;
  in.messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "2+2?"}])");
  in.tools =
      nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {}}}])");
  in.add_generation_prompt = true;
  in.extra_context = {{"enable_thinking", false}};
  auto r = t->render(in);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_NE(r->find("{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {}}}"),
            std::string::npos);
  EXPECT_NE(r->find("<|im_start|>assistant\n<think>\n\n</think>\n\n"), std::string::npos) << *r;
}

Status render_status(const std::string& src, ChatTemplateLimits limits = {}) {
  auto t = ChatTemplate::parse(src);
  if (!t.ok()) return t.status();
  ChatTemplateInputs in;
  in.limits = limits;
  auto r = t->render(in);
  return r.ok() ? Status() : r.status();
}

// Each ends in resource_exhausted: the step budget, call depth, nesting depth or output cap stops it (a
// hang would instead hit the test's ctest timeout).
TEST(ChatTemplate, HostileTemplatesHitTheBudgets) {
  const char* hostile[] = {
      "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
      "{% for i in range(10**9) %}{% endfor %}",
      "{% for a in range(1000) %}{% for b in range(1000) %}{% for c in range(1000) %}{% endfor %}{% endfor %}"
      "{% endfor %}",
      "{{ 'a' * 10**9 }}",
      "{% set ns = namespace(s='a') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
      "{% set ns = namespace(s='a') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
      "{% for i in range(900000) %}{{ 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx' }}{% endfor %}",
      "{{ ('a' * 1000000).replace('a', 'bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb') }}",
      // Recursion inside a deeply nested expression: the nesting limit guards the C++ stack.
      "{% macro f(n) %}{{ [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[f(n + "
      "1)]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]] }}"
      "{% endmacro %}{{ f(0) }}",
      // Few steps, each touching 16 MB: the budget charges the bytes an operation touches.
      "{% set s = 'a' * 16000000 %}{% for i in range(100000) %}{% if s|length > 0 %}{% endif %}{% endfor %}",
      "{% set s = 'a' * 16000000 %}{% for i in range(100000) %}{% if 'b' in s %}{% endif %}{% endfor %}",
      "{% set s = 'a' * 16000000 %}{% set t = 'a' * 16000000 %}{% for i in range(100000) %}{% if s == t %}"
      "{% endif %}{% endfor %}",
      "{% set s = 'a' * 16000000 %}{% for i in range(100000) %}{% if s.startswith('b') %}{% endif %}{% "
      "endfor %}",
      // Outputs that would be built before the output cap was checked (std::bad_alloc, SIGABRT).
      "{{ ('\n' * 300)|indent('a' * 10000000, blank=true) }}",
      "{% set s = 'a' * 16000000 %}{{ s|list|length }}{{ s|list|length }}{{ s|list|length }}{{ s|list|length "
      "}}"
      "{{ s|list|length }}",
      "{% set s = 'a' * 16000000 %}{% for c in s %}{% endfor %}",
  };
  for (const char* src : hostile) {
    Status s = render_status(src);
    EXPECT_EQ(s.code(), StatusCode::resource_exhausted) << src << ": " << s.to_string();
  }
}

TEST(ChatTemplate, LimitsAreConfigurable) {
  ChatTemplateLimits small;
  small.max_steps = 100;
  EXPECT_EQ(render_status("{% for i in range(50) %}{{ i }}{% endfor %}", small).code(),
            StatusCode::resource_exhausted);
  EXPECT_TRUE(render_status("{% for i in range(50) %}{{ i }}{% endfor %}").ok());
  small = {};
  small.max_call_depth = 3;
  const char* rec = "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(N) }}";
  EXPECT_TRUE(render_status(std::string(rec).replace(std::string(rec).find('N'), 1, "2"), small).ok());
  EXPECT_EQ(render_status(std::string(rec).replace(std::string(rec).find('N'), 1, "5"), small).code(),
            StatusCode::resource_exhausted);
  small = {};
  small.max_output_bytes = 10;
  EXPECT_EQ(render_status("{{ 'x' * 11 }}", small).code(), StatusCode::resource_exhausted);
  EXPECT_EQ(render_status("0123456789{{ 'x' }}", small).code(), StatusCode::resource_exhausted);
}

TEST(ChatTemplate, BadInputsAreErrors) {
  auto t = ChatTemplate::parse("{{ messages }}");
  ASSERT_TRUE(t.ok());
  ChatTemplateInputs in;
  in.messages = "not a list";
  EXPECT_EQ(t->render(in).status().code(), StatusCode::invalid_argument);
  in.messages = nlohmann::ordered_json::array();
  in.extra_context = 5;
  EXPECT_EQ(t->render(in).status().code(), StatusCode::invalid_argument);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// Every prefix of a real template and a few thousand byte mutations must parse or fail cleanly, and render
// or fail cleanly: never crash, hang or abort (run under the sanitizers too).
TEST(ChatTemplate, TruncatedAndMutatedTemplatesFailCleanly) {
  const std::string src = read_template("qwen3.jinja");
  ASSERT_FALSE(src.empty());
  ChatTemplateInputs in;
  in.messages = nlohmann::ordered_json::parse(
      R"([{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
          {"role": "assistant", "content": "a", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]},
          {"role": "tool", "content": "t"}])");
  in.limits.max_steps = 20000;
  size_t parsed = 0;
  for (size_t n = 0; n <= src.size(); n += 7) {
    auto t = ChatTemplate::parse(src.substr(0, n));
    if (!t.ok()) continue;
    ++parsed;
    (void)t->render(in);
  }
  EXPECT_GT(parsed, 0u);
  uint32_t seed = 12345;
  auto next = [&seed]() { return seed = seed * 1664525u + 1013904223u; };
  const char alphabet[] = "{}%#-+()[]'\".,|:~*/ \nabcxyz0123456789";
  for (int k = 0; k < 2000; ++k) {
    std::string m = src;
    for (int j = 0; j < 3; ++j) m[next() % m.size()] = alphabet[next() % (sizeof(alphabet) - 1)];
    auto t = ChatTemplate::parse(m);
    if (t.ok()) (void)t->render(in);
  }
}

}  // namespace
}  // namespace kiln
