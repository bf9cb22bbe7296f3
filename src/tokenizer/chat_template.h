// Chat templates: render a conversation into a prompt string the way Hugging Face's apply_chat_template
// does (Jinja with trim_blocks, lstrip_blocks, loop controls, raise_exception, tojson, strftime_now), with
// a Jinja-subset interpreter (jinja/) that runs under a step budget, a call-depth limit and an output cap.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"

namespace kiln {

namespace jinja {
struct Template;
}

struct ChatTemplateLimits {
  int64_t max_steps = 1'000'000;        // expression evaluations + statements + loop iterations
  int max_call_depth = 64;              // nested macro calls (recursion limit)
  int max_depth = 512;                  // nested expressions + statements across macro calls (stack guard)
  size_t max_output_bytes = 16u << 20;  // the prompt and any intermediate string
};

struct ChatTemplateInputs {
  // ordered_json: object keys keep their order, as Python dicts do (tojson prints them in that order).
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // [{role, content, tool_calls?, ...}]
  nlohmann::ordered_json tools;  // null if none, else a list of JSON schemas
  bool add_generation_prompt = false;
  std::string bos_token, eos_token;
  nlohmann::ordered_json extra_context =
      nlohmann::ordered_json::object();  // more variables, e.g. enable_thinking
  ChatTemplateLimits limits;
};

class ChatTemplate {
 public:
  // Parse errors name the line and column; unsupported statements are `unimplemented`.
  static Result<ChatTemplate> parse(std::string source);
  // resource_exhausted when a budget is exceeded; raise_exception() in the template is invalid_argument.
  Result<std::string> render(const ChatTemplateInputs& inputs) const;
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::shared_ptr<const jinja::Template> tmpl_;
};

}  // namespace kiln
