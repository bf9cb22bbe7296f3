// Renders batches of chat-template cases for tests/python/test_chat_template.py, in one process.
// stdin:  {"jobs": [{"template": "<jinja source>", "cases": [{"messages": [...], "tools": null|[...],
//          "add_generation_prompt": bool, "bos_token": "", "eos_token": "", "extra_context": {...},
//          "max_steps": int?, "max_call_depth": int?, "max_output_bytes": int?}]}]}
// stdout: {"results": [[{"ok": true, "text": "..."} | {"ok": false, "code": "...", "error": "..."}, ...],
// ...]}
#include <chrono>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "tokenizer/chat_template.h"

namespace {

nlohmann::ordered_json error_json(const kiln::Status& st) {
  return {{"ok", false}, {"code", kiln::status_code_name(st.code())}, {"error", st.message()}};
}

nlohmann::ordered_json render_case(const kiln::ChatTemplate& tmpl, const nlohmann::ordered_json& c) {
  kiln::ChatTemplateInputs in;
  in.messages = c.value("messages", nlohmann::ordered_json::array());
  in.tools = c.value("tools", nlohmann::ordered_json());
  in.add_generation_prompt = c.value("add_generation_prompt", false);
  in.bos_token = c.value("bos_token", std::string());
  in.eos_token = c.value("eos_token", std::string());
  in.extra_context = c.value("extra_context", nlohmann::ordered_json::object());
  in.limits.max_steps = c.value("max_steps", in.limits.max_steps);
  in.limits.max_call_depth = c.value("max_call_depth", in.limits.max_call_depth);
  in.limits.max_output_bytes = c.value("max_output_bytes", in.limits.max_output_bytes);
  auto t0 = std::chrono::steady_clock::now();
  auto r = tmpl.render(in);
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  nlohmann::ordered_json out =
      r.ok() ? nlohmann::ordered_json{{"ok", true}, {"text", *r}} : error_json(r.status());
  out["ms"] = ms;
  return out;
}

}  // namespace

int main() {
  std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  nlohmann::ordered_json req = nlohmann::ordered_json::parse(input, nullptr, /*allow_exceptions=*/false);
  if (req.is_discarded() || !req.contains("jobs") || !req["jobs"].is_array()) {
    std::cerr << "template_driver: stdin must be a JSON object with a \"jobs\" array\n";
    return 2;
  }
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  for (const auto& job : req["jobs"]) {
    nlohmann::ordered_json rs = nlohmann::ordered_json::array();
    auto tmpl = kiln::ChatTemplate::parse(job.value("template", std::string()));
    for (const auto& c : job.value("cases", nlohmann::ordered_json::array())) {
      rs.push_back(tmpl.ok() ? render_case(*tmpl, c) : error_json(tmpl.status()));
    }
    results.push_back(std::move(rs));
  }
  // Invalid UTF-8 in a rendered prompt is replaced rather than failing the dump.
  std::cout << nlohmann::ordered_json{{"results", results}}.dump(
                   -1, ' ', false, nlohmann::ordered_json::error_handler_t::replace)
            << "\n";
  return 0;
}
