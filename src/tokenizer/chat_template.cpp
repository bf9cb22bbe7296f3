#include "tokenizer/chat_template.h"

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/interp.h"

namespace kiln {

Result<ChatTemplate> ChatTemplate::parse(std::string source) {
  KILN_ASSIGN_OR_RETURN(auto tmpl, jinja::parse_template(source));
  ChatTemplate t;
  t.source_ = std::move(source);
  t.tmpl_ = std::move(tmpl);
  return t;
}

Result<std::string> ChatTemplate::render(const ChatTemplateInputs& in) const {
  if (!in.messages.is_array()) return invalid_argument("chat template: messages must be a JSON array");
  if (!in.extra_context.is_null() && !in.extra_context.is_object()) {
    return invalid_argument("chat template: extra_context must be a JSON object");
  }
  jinja::Frame globals;
  jinja::add_global_functions(globals);
  if (in.extra_context.is_object()) {
    for (auto it = in.extra_context.begin(); it != in.extra_context.end(); ++it) {
      globals[it.key()] = jinja::from_json(it.value());
    }
  }
  globals["messages"] = jinja::from_json(in.messages);
  globals["tools"] = jinja::from_json(in.tools);
  globals["add_generation_prompt"] = jinja::Value::boolean(in.add_generation_prompt);
  globals["bos_token"] = jinja::Value::string(in.bos_token);
  globals["eos_token"] = jinja::Value::string(in.eos_token);
  jinja::Limits limits;
  limits.max_steps = in.limits.max_steps;
  limits.max_call_depth = in.limits.max_call_depth;
  limits.max_depth = in.limits.max_depth;
  limits.max_output_bytes = in.limits.max_output_bytes;
  jinja::Interp interp(limits, std::move(globals));
  return interp.render(*tmpl_);
}

}  // namespace kiln
