// Parse and validate (api_internal.h): a request body field by field into a Parsed, each error in OpenAI's
// shape naming its field.
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "server/api_internal.h"

namespace kiln::server::api_detail {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

HttpResponse error_response(const ApiError& e) {
  json err = {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}};
  HttpResponse r{e.status, "application/json", {}, dump(json{{"error", err}})};
  if (e.status == 503) r.headers.emplace_back("Retry-After", "1");
  if (e.status == 401) r.headers.emplace_back("WWW-Authenticate", "Bearer");
  return r;
}

ApiError bad(const std::string& param, std::string message) {
  return {400, std::move(message), "invalid_request_error", param, ""};
}

HttpResponse json_response(const json& j) { return {200, "application/json", {}, dump(j)}; }

const json* field(const json& body, const char* key) {
  const auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

std::optional<ApiError> read_bool(const json& body, const char* key, bool& out) {
  const json* v = field(body, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) return bad(key, fmt::format("'{}' must be a boolean, got {}", key, v->type_name()));
  out = v->get<bool>();
  return std::nullopt;
}

namespace {

constexpr size_t kMaxStopTokens = 64;  // the sampler's limit (kSamplerMaxStopTokens)

ApiError unsupported(const std::string& param, const std::string& what) {
  return bad(param, fmt::format("{} is not supported yet", what));
}

// Readers of optional fields: nothing when absent or null; an error naming the field when present and wrong.
std::optional<ApiError> read_number(const json& body, const char* key, double lo, double hi, float& out,
                                    bool lo_open = false) {
  const json* v = field(body, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) return bad(key, fmt::format("'{}' must be a number, got {}", key, v->type_name()));
  const double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi || (lo_open && d == lo)) {
    return bad(key, fmt::format("'{}' = {} is out of range: it must be in {}{}, {}]", key, d,
                                lo_open ? "(" : "[", lo, hi));
  }
  out = static_cast<float>(d);
  return std::nullopt;
}

std::optional<ApiError> read_int(const json& body, const char* key, int64_t lo, int64_t hi, int64_t& out) {
  const json* v = field(body, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number_integer())
    return bad(key, fmt::format("'{}' must be an integer, got {}", key, v->type_name()));
  const auto i = v->get<int64_t>();
  if (i < lo || i > hi)
    return bad(key, fmt::format("'{}' = {} is out of range: it must be in [{}, {}]", key, i, lo, hi));
  out = i;
  return std::nullopt;
}

// Message content: a string, or a list of text parts (other part types are not supported yet).
std::optional<ApiError> read_content(const json& m, size_t i, std::string& out) {
  const std::string param = fmt::format("messages[{}].content", i);
  const json* c = field(m, "content");
  if (c == nullptr) return std::nullopt;
  if (c->is_string()) {
    out = c->get<std::string>();
    return std::nullopt;
  }
  if (!c->is_array()) return bad(param, fmt::format("'{}' must be a string or a list of parts", param));
  for (size_t k = 0; k < c->size(); ++k) {
    const json& part = (*c)[k];
    const json* type = part.is_object() ? field(part, "type") : nullptr;
    if (type == nullptr || !type->is_string()) {
      return bad(param, fmt::format("'{}[{}]' must be an object with a 'type'", param, k));
    }
    if (*type != "text")
      return unsupported(param, fmt::format("content of type '{}'", type->get<std::string>()));
    const json* text = field(part, "text");
    if (text == nullptr || !text->is_string()) {
      return bad(param, fmt::format("'{}[{}].text' must be a string", param, k));
    }
    out += text->get<std::string>();
  }
  return std::nullopt;
}

// The sampling fields both endpoints share, and the ones that are refused until they are supported.
std::optional<ApiError> read_sampling(const json& body, const ModelDescription& model, Parsed& p) {
  SamplingParams& s = p.base.sampling;
  // OpenAI's defaults, not the CLI's: temperature 1, no top-k, top-p or min-p unless asked for.
  s.temperature = 1.0f;
  s.top_k = 0;
  s.top_p = 1.0f;
  s.min_p = 0.0f;
  if (auto e = read_number(body, "temperature", 0, 2, s.temperature)) return e;
  if (auto e = read_number(body, "top_p", 0, 1, s.top_p, /*lo_open=*/true)) return e;
  if (auto e = read_number(body, "min_p", 0, 1, s.min_p)) return e;
  int64_t top_k = 0;
  if (auto e = read_int(body, "top_k", -1, model.n_vocab, top_k)) return e;
  s.top_k = top_k > 0 ? static_cast<int32_t>(top_k) : 0;
  if (auto e = read_number(body, "presence_penalty", -2, 2, s.presence_penalty)) return e;
  if (auto e = read_number(body, "frequency_penalty", -2, 2, s.frequency_penalty)) return e;
  if (auto e = read_number(body, "repetition_penalty", 0, 10, s.repeat_penalty, /*lo_open=*/true)) return e;
  int64_t last_n = s.repeat_last_n;
  if (auto e = read_int(body, "repeat_last_n", -1, int64_t{1} << 30, last_n)) return e;
  s.repeat_last_n = static_cast<int32_t>(last_n);
  if (const json* seed = field(body, "seed")) {
    if (!seed->is_number_integer())
      return bad("seed", fmt::format("'seed' must be an integer, got {}", seed->type_name()));
    s.seed = seed->is_number_unsigned() ? seed->get<uint64_t>() : static_cast<uint64_t>(seed->get<int64_t>());
    p.seeded = true;
  }
  if (const json* lb = field(body, "logit_bias")) {
    if (!lb->is_object()) return bad("logit_bias", "'logit_bias' must be an object of token id -> bias");
    for (const auto& [k, v] : lb->items()) {
      char* end = nullptr;
      const long id = std::strtol(k.c_str(), &end, 10);
      if (k.empty() || *end != '\0' || id < 0 || id >= model.n_vocab) {
        return bad("logit_bias",
                   fmt::format("logit_bias: '{}' is not a token id in [0, {})", k, model.n_vocab));
      }
      if (!v.is_number() || !std::isfinite(v.get<double>()) || std::fabs(v.get<double>()) > 100) {
        return bad("logit_bias", fmt::format("logit_bias['{}'] must be a number in [-100, 100]", k));
      }
      s.logit_bias.emplace_back(static_cast<int32_t>(id), v.get<float>());
    }
  }
  if (const json* stop = field(body, "stop")) {
    std::vector<std::string> stops;
    if (stop->is_string()) {
      stops.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const json& x : *stop) {
        if (!x.is_string()) return bad("stop", "'stop' must be a string or a list of strings");
        stops.push_back(x.get<std::string>());
      }
    } else {
      return bad("stop", "'stop' must be a string or a list of strings");
    }
    if (stops.size() > 16) return bad("stop", fmt::format("'stop' has {} strings: at most 16", stops.size()));
    for (const std::string& x : stops) {
      if (x.empty()) return bad("stop", "'stop' strings must not be empty");
    }
    s.stop = std::move(stops);
  }
  if (auto e = read_bool(body, "ignore_eos", s.ignore_eos)) return e;
  if (auto e = read_int(body, "n", 1, 16, p.n)) return e;
  int64_t priority = 0;  // vLLM's extension: lower is admitted first
  if (auto e = read_int(body, "priority", INT32_MIN, INT32_MAX, priority)) return e;
  p.base.priority = static_cast<int32_t>(priority);
  if (auto e = read_bool(body, "stream", p.stream)) return e;
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) return bad("stream_options", "'stream_options' must be an object");
    if (!p.stream) return bad("stream_options", "'stream_options' is only allowed with 'stream': true");
    if (auto e = read_bool(*so, "include_usage", p.include_usage)) return e;
  }
  if (const json* ids = field(body, "stop_token_ids")) {
    if (!ids->is_array() || ids->size() > kMaxStopTokens) {
      return bad("stop_token_ids",
                 fmt::format("'stop_token_ids' must be a list of at most {} token ids", kMaxStopTokens));
    }
    for (const json& t : *ids) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= model.n_vocab) {
        return bad("stop_token_ids",
                   fmt::format("'stop_token_ids' must hold token ids in [0, {})", model.n_vocab));
      }
      s.stop_token_ids.push_back(t.get<int32_t>());
    }
  }
  int64_t min_tokens = 0;
  if (auto e = read_int(body, "min_tokens", 0, int64_t{1} << 30, min_tokens)) return e;
  s.min_tokens = static_cast<int32_t>(min_tokens);
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> read_messages(const json& body, std::vector<ChatMessage>& out) {
  const json* ms = field(body, "messages");
  if (ms == nullptr || !ms->is_array() || ms->empty()) {
    return bad("messages", "'messages' must be a non-empty list of messages");
  }
  for (size_t i = 0; i < ms->size(); ++i) {
    const json& m = (*ms)[i];
    const std::string param = fmt::format("messages[{}]", i);
    if (!m.is_object()) return bad(param, fmt::format("'{}' must be an object", param));
    const json* role = field(m, "role");
    if (role == nullptr || !role->is_string())
      return bad(param + ".role", fmt::format("'{}.role' must be a string", param));
    std::string r = role->get<std::string>();
    if (r == "developer") r = "system";
    if (r != "system" && r != "user" && r != "assistant" && r != "tool") {
      return r == "function"
                 ? unsupported(param + ".role", "the role 'function' (deprecated: use 'tool')")
                 : bad(param + ".role",
                       fmt::format("'{}.role' = '{}' must be system, user, assistant or tool", param, r));
    }
    ChatMessage cm;
    cm.role = r;
    if (auto e = read_content(m, i, cm.content)) return e;
    if (auto e = read_message_tool_fields(m, i, cm)) return e;
    out.push_back(std::move(cm));
  }
  return std::nullopt;
}

std::optional<ApiError> parse_body(const std::string& body, json& out) {
  out = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (out.is_discarded()) return bad("", "the request body is not valid JSON");
  if (!out.is_object()) return bad("", "the request body must be a JSON object");
  return std::nullopt;
}

std::optional<ApiError> parse_completion(const std::string& body_text, bool chat, Engine& engine,
                                         const std::string& model_name, Parsed& p) {
  const ModelDescription& model = engine.model();
  json body;
  if (auto e = parse_body(body_text, body)) return e;
  if (const json* m = field(body, "model")) {
    if (!m->is_string()) return bad("model", "'model' must be a string");
    if (*m != model_name) {
      return ApiError{404,
                      fmt::format("The model '{}' does not exist: this server serves '{}'",
                                  m->get<std::string>(), model_name),
                      "invalid_request_error", "model", "model_not_found"};
    }
  }
  if (auto e = read_sampling(body, model, p)) return e;
  if (auto e = read_constraint(body, engine, p)) return e;
  // max_tokens 0 only scores an echoed prompt (completions with echo): read as >= 0, checked below.
  if (auto e = read_int(body, "max_tokens", chat ? 1 : 0, int64_t{1} << 30, p.max_tokens)) return e;
  if (auto e = read_int(body, "max_completion_tokens", 1, int64_t{1} << 30, p.max_tokens)) return e;
  if (chat) {
    if (auto e = read_bool(body, "logprobs", p.logprobs)) return e;
    if (auto e = read_int(body, "top_logprobs", 0, 20, p.top_logprobs)) return e;
    if (p.top_logprobs > 0 && !p.logprobs)
      return bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    std::vector<ChatMessage> messages;
    if (auto e = read_messages(body, messages)) return e;
    if (auto e = read_tools(body_text, body, model, p)) return e;
    if (!p.tools.empty()) {  // a forced call's grammar, compiled here so that its errors are 400s too
      if (Status st = engine.check_constraint(p.base.constraint); !st.ok())
        return bad("tools", fmt::format("'tools': {}", st.message()));
    }
    auto text = engine.render_chat(messages, p.tools);
    if (!text.ok()) return bad("messages", text.status().message());
    auto tokens = engine.tokenize(*text + p.prompt_suffix, /*add_special=*/false);
    if (!tokens.ok()) return bad("messages", tokens.status().message());
    p.prompts.push_back(std::move(*tokens));
  } else {
    for (const char* key : {"tools", "tool_choice"}) {
      if (field(body, key) != nullptr)
        return bad(key, fmt::format("'{}' is only for /v1/chat/completions", key));
    }
    if (const json* lp = field(body, "logprobs")) {
      if (lp->is_boolean()) {
        p.logprobs = lp->get<bool>();
      } else if (auto e = read_int(body, "logprobs", 0, 20, p.top_logprobs)) {
        return e;
      } else {
        p.logprobs = true;
      }
    }
    if (auto e = read_bool(body, "echo", p.echo)) return e;
    if (p.max_tokens == 0 && !p.echo) {
      return bad("max_tokens", "'max_tokens' must be >= 1 (0 only with 'echo', to score the prompt)");
    }
    if (p.echo && p.logprobs) p.base.sampling.prompt_logprobs = static_cast<int32_t>(p.top_logprobs);
    const json* prompt = field(body, "prompt");
    const auto bad_prompt = [] {
      return bad("prompt",
                 "'prompt' must be a string, a list of strings, a list of token ids or a list of those");
    };
    if (prompt == nullptr) return bad("prompt", "'prompt' is required");
    const auto add_text = [&](const std::string& s) -> std::optional<ApiError> {
      auto t = engine.tokenize(s, /*add_special=*/true);
      if (!t.ok()) return bad("prompt", t.status().message());
      p.prompts.push_back(std::move(*t));
      p.prompt_texts.push_back(s);
      return std::nullopt;
    };
    const auto add_ids = [&](const json& ids) -> std::optional<ApiError> {
      std::vector<int32_t> t;
      for (const json& x : ids) {
        if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= model.n_vocab) {
          return bad("prompt", fmt::format("'prompt' token ids must be integers in [0, {})", model.n_vocab));
        }
        t.push_back(x.get<int32_t>());
      }
      auto s = engine.detokenize(t);
      p.prompt_texts.push_back(s.ok() ? *s : std::string());
      p.prompts.push_back(std::move(t));
      return std::nullopt;
    };
    std::optional<ApiError> e;
    if (prompt->is_string()) {
      e = add_text(prompt->get<std::string>());
    } else if (prompt->is_array() && !prompt->empty() && (*prompt)[0].is_number()) {
      e = add_ids(*prompt);
    } else if (prompt->is_array() && !prompt->empty()) {
      for (const json& x : *prompt) {
        if (x.is_string()) {
          e = add_text(x.get<std::string>());
        } else if (x.is_array()) {
          e = add_ids(x);
        } else {
          e = bad_prompt();
        }
        if (e) break;
      }
    } else {
      e = bad_prompt();
    }
    if (e) return e;
    if (p.prompts.size() > 16) return bad("prompt", fmt::format("{} prompts: at most 16", p.prompts.size()));
  }
  p.base.sampling.logprobs = p.logprobs;
  p.base.sampling.n_logprobs = static_cast<int32_t>(p.top_logprobs);
  return std::nullopt;
}

std::optional<ApiError> validate_completion(const Parsed& p, const ModelDescription& model, bool chat) {
  // The context: each prompt and its completion must fit.
  for (const auto& t : p.prompts) {
    if (t.empty()) return bad(chat ? "messages" : "prompt", "the prompt is empty");
    const int64_t room = model.n_ctx - static_cast<int64_t>(t.size());
    const int64_t want = p.max_tokens >= 0 ? p.max_tokens : room;
    if (room <= 0 || want > room) {
      return ApiError{
          400,
          fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens "
                      "({} in the {}, {} in the completion). Please reduce the length of the {} or the "
                      "completion.",
                      model.n_ctx, static_cast<int64_t>(t.size()) + std::max<int64_t>(want, 1), t.size(),
                      chat ? "messages" : "prompt", std::max<int64_t>(want, 1), chat ? "messages" : "prompt"),
          "invalid_request_error", chat ? "messages" : "prompt", "context_length_exceeded"};
    }
  }
  return std::nullopt;
}

}  // namespace kiln::server::api_detail
