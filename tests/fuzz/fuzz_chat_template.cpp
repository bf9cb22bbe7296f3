// libFuzzer target: arbitrary text as a chat template, rendered with a fixed small conversation. Every
// input must end in a prompt or a Status within the step budget — never a crash, a sanitizer report, a
// hang or an unbounded allocation.
#include <cstddef>
#include <cstdint>
#include <string>

#include "tokenizer/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto tmpl = kiln::ChatTemplate::parse(std::string(reinterpret_cast<const char*>(data), size));
  if (!tmpl.ok()) return 0;
  kiln::ChatTemplateInputs in;
  in.messages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi \u00e9\u4e16 <|im_start|>"},
    {"role": "assistant", "content": "", "tool_calls": [
      {"type": "function", "function": {"name": "f", "arguments": {"x": [1, 2.5, null, true]}}}]},
    {"role": "tool", "content": "{\"ok\": 1}"}])");
  in.tools = nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])");
  in.add_generation_prompt = true;
  in.bos_token = "<s>";
  in.eos_token = "</s>";
  in.limits.max_steps = 100'000;  // keeps each input fast; the budget logic is the same at any size
  in.limits.max_output_bytes = 1u << 20;
  (void)tmpl->render(in);
  return 0;
}
