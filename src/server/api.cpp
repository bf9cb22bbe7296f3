#include "server/api.h"

#include <fmt/format.h>
#include <openssl/crypto.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

namespace kiln::server {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr size_t kMaxStopTokens = 64;  // the sampler's limit (kSamplerMaxStopTokens)

// An answer that is not a success: OpenAI's error shape, with the HTTP status.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the request field at fault, if one is
  std::string code;
};

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

ApiError unsupported(const std::string& param, const std::string& what) {
  return bad(param, fmt::format("{} is not supported yet", what));
}

HttpResponse json_response(const json& j) { return {200, "application/json", {}, dump(j)}; }

std::string random_id(const char* prefix) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return fmt::format("{}{:016x}{:08x}", prefix, rng(), static_cast<uint32_t>(rng()));
}

const json* field(const json& body, const char* key) {
  const auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
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

std::optional<ApiError> read_bool(const json& body, const char* key, bool& out) {
  const json* v = field(body, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) return bad(key, fmt::format("'{}' must be a boolean, got {}", key, v->type_name()));
  out = v->get<bool>();
  return std::nullopt;
}

std::string finish_name(FinishReason r) {
  switch (r) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::cancelled: return "abort";
    default: return "error";
  }
}

// A parsed generation request: everything but the engine's answer.
struct Parsed {
  Request base;                               // sampling; the prompt is set per prompt below
  std::vector<std::vector<int32_t>> prompts;  // tokenized, one choice group each
  std::vector<std::string> prompt_texts;      // for echo
  int64_t n = 1;
  bool stream = false, include_usage = false, logprobs = false, echo = false;
  int64_t top_logprobs = 0;
  bool seeded = false;
};

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
    if (r != "system" && r != "user" && r != "assistant") {
      return r == "tool" || r == "function"
                 ? unsupported(param + ".role", fmt::format("the role '{}'", r))
                 : bad(param + ".role",
                       fmt::format("'{}.role' = '{}' must be system, user or assistant", param, r));
    }
    ChatMessage cm;
    cm.role = r;
    if (auto e = read_content(m, i, cm.content)) return e;
    out.push_back(std::move(cm));
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
  if (auto e = read_bool(body, "stream", p.stream)) return e;
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) return bad("stream_options", "'stream_options' must be an object");
    if (!p.stream) return bad("stream_options", "'stream_options' is only allowed with 'stream': true");
    if (auto e = read_bool(*so, "include_usage", p.include_usage)) return e;
  }
  if (const json* rf = field(body, "response_format")) {
    const json* type = rf->is_object() ? field(*rf, "type") : nullptr;
    if (type == nullptr || !type->is_string())
      return bad("response_format", "'response_format' must have a 'type'");
    if (*type != "text") {
      return unsupported("response_format", fmt::format("'response_format' of type '{}' (structured output)",
                                                        type->get<std::string>()));
    }
  }
  if (const json* tools = field(body, "tools"); tools != nullptr && !(tools->is_array() && tools->empty())) {
    return unsupported("tools", "tool calling");
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

json usage_json(int64_t prompt, int64_t completion, int64_t cached) {
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

std::vector<int> token_bytes(const std::string& s) {
  std::vector<int> b;
  for (const char c : s) b.push_back(static_cast<unsigned char>(c));
  return b;
}

// Characters (code points) of UTF-8 text, as text_offset counts them: every byte but continuation bytes.
int64_t utf8_chars(const std::string& s) {
  return std::count_if(s.begin(), s.end(),
                       [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
}

}  // namespace

bool keys_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) {
    (void)CRYPTO_memcmp(a.data(), a.data(), a.size());  // the same work as a comparison of equal lengths
    return false;
  }
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

// One generation request's answer: its choices as the engine's callbacks fill them (on the engine thread),
// streamed or answered whole. Every call on the exchange is made under mu, so they reach it in order.
struct Api::Generation {
  struct Choice {
    size_t prompt = 0;  // which prompt
    std::string text;
    json lp = json::array();  // chat: logprobs.content entries
    json lp_tokens = json::array(), lp_values = json::array(), lp_top = json::array();  // completions
    json lp_offsets = json::array();  // completions: each token's offset in the text, in characters
    int64_t n_chars = 0;              // characters of the text that the logprobs cover so far
    std::string finish;
    std::string error;
    RequestStats stats;
    bool first = true, role_sent = false, echoed = false;
    Clock::time_point last;
  };
  std::shared_ptr<Exchange> ex;
  std::shared_ptr<ServerMetrics> metrics;
  std::shared_ptr<std::atomic<int64_t>> in_flight;
  Engine* engine = nullptr;
  bool chat = false, stream = false, include_usage = false, logprobs = false;
  bool echo_logprobs = false;  // completions with echo and logprobs: the prompt comes scored, first event
  std::vector<std::vector<int32_t>> prompts;
  int64_t top_logprobs = 0;
  std::string id, model;
  int64_t created = 0;
  Clock::time_point t0;
  std::mutex mu;
  std::vector<Choice> choices;
  std::vector<uint64_t> ids;
  size_t remaining = 0;
  bool started = false;              // stream: the head is sent; before that, chunks wait in `pending`
  bool failed = false;               // answered with an error already: events are dropped
  std::vector<std::string> pending;  // stream chunks made before `started`

  json chunk_base() const {
    return {{"id", id},
            {"object", chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created},
            {"model", model}};
  }
  void emit(std::string chunk) {  // under mu
    if (started) {
      ex->send(std::move(chunk));
    } else {
      pending.push_back(std::move(chunk));
    }
  }
  void emit_json(json j) {
    if (include_usage) j["usage"] = nullptr;
    emit("data: " + dump(j) + "\n\n");
  }

  void on_event(size_t i, const TokenEvent& ev) {
    std::lock_guard<std::mutex> lock(mu);
    if (failed) return;
    Choice& c = choices[i];
    const auto now = Clock::now();
    if (echo_logprobs && !c.echoed) {  // the first event (a one-token prompt has no scored tokens)
      c.echoed = true;
      json echoed = prompt_logprobs(ev, c);
      if (stream) {
        json j = chunk_base();
        j["choices"] =
            json::array({{{"index", i}, {"text", c.text}, {"logprobs", echoed}, {"finish_reason", nullptr}}});
        emit_json(std::move(j));
      }
    }
    json lp_entry;
    if (ev.token >= 0) {
      const std::chrono::duration<double> since = now - (c.first ? t0 : c.last);
      (c.first ? metrics->ttft : metrics->itl).observe(since.count());
      c.first = false;
      c.last = now;
      if (logprobs) lp_entry = logprob_entry(ev, c);
    }
    c.text += ev.text;
    if (stream && (!ev.text.empty() || !lp_entry.is_null() || (chat && !c.role_sent))) {
      json j = chunk_base();
      json choice = {{"index", i}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
      if (chat) {
        json delta = {{"content", ev.text}};
        if (!c.role_sent) delta["role"] = "assistant";
        c.role_sent = true;
        choice["delta"] = delta;
        if (!lp_entry.is_null()) choice["logprobs"] = {{"content", json::array({lp_entry})}};
      } else {
        choice["text"] = ev.text;
        if (!lp_entry.is_null()) choice["logprobs"] = lp_entry;
      }
      j["choices"] = json::array({choice});
      emit_json(std::move(j));
    }
    if (!ev.done) return;
    c.finish = finish_name(ev.finish);
    c.error = ev.error;
    c.stats = ev.stats;
    metrics->count_finished(c.finish);
    metrics->queue.observe(ev.stats.queue_ms / 1000.0);
    if (ev.stats.n_generated > 0) {
      metrics->prefill.observe(ev.stats.prefill_ms / 1000.0);
      metrics->decode.observe(ev.stats.decode_ms / 1000.0);
    }
    if (ev.finish == FinishReason::stop || ev.finish == FinishReason::length) {
      metrics->e2e.observe(std::chrono::duration<double>(now - t0).count());
    }
    if (stream && ev.finish != FinishReason::error) {
      json j = chunk_base();
      json choice = {{"index", i}, {"logprobs", nullptr}, {"finish_reason", c.finish}};
      choice[chat ? "delta" : "text"] = chat ? json::object() : json("");
      j["choices"] = json::array({choice});
      emit_json(std::move(j));
    }
    if (--remaining == 0) finish_all();
  }

  json logprob_entry(const TokenEvent& ev, Choice& c) const {
    const auto piece = [&](int32_t t) {
      auto s = engine->detokenize({t});
      return s.ok() ? *s : std::string();
    };
    const std::string tok = piece(ev.token);
    if (chat) {
      json top = json::array();
      for (const TokenLogprob& t : ev.top) {
        const std::string s = piece(t.token);
        top.push_back({{"token", s}, {"logprob", t.logprob}, {"bytes", token_bytes(s)}});
      }
      json e = {{"token", tok}, {"logprob", ev.logprob}, {"bytes", token_bytes(tok)}, {"top_logprobs", top}};
      c.lp.push_back(e);
      return e;
    }
    json top = json::object();
    for (const TokenLogprob& t : ev.top) top[piece(t.token)] = t.logprob;
    const int64_t offset = c.n_chars;
    c.n_chars += utf8_chars(tok);
    c.lp_tokens.push_back(tok);
    c.lp_values.push_back(ev.logprob);
    c.lp_top.push_back(top);
    c.lp_offsets.push_back(offset);
    return {{"tokens", {tok}},
            {"token_logprobs", {ev.logprob}},
            {"top_logprobs", {top}},
            {"text_offset", {offset}}};
  }

  // echo with logprobs: the prompt's tokens lead the choice's logprobs, the first one unscored (null), as
  // OpenAI's legacy completions give them. Returns them as one logprobs object (a stream's echo chunk).
  json prompt_logprobs(const TokenEvent& ev, Choice& c) const {
    const auto piece = [&](int32_t t) {
      auto s = engine->detokenize({t});
      return s.ok() ? *s : std::string();
    };
    json tokens = json::array(), values = json::array(), tops = json::array(), offsets = json::array();
    const auto add = [&](const std::string& tok, json value, json top) {
      offsets.push_back(c.n_chars);
      c.n_chars += utf8_chars(tok);
      tokens.push_back(tok);
      values.push_back(std::move(value));
      tops.push_back(std::move(top));
    };
    add(piece(prompts[c.prompt].front()), nullptr, nullptr);
    for (const PromptLogprob& lp : ev.prompt_logprobs) {
      json top = json::object();
      for (const TokenLogprob& t : lp.top) top[piece(t.token)] = t.logprob;
      add(piece(lp.token), lp.logprob, std::move(top));
    }
    for (size_t k = 0; k < tokens.size(); ++k) {
      c.lp_tokens.push_back(tokens[k]);
      c.lp_values.push_back(values[k]);
      c.lp_top.push_back(tops[k]);
      c.lp_offsets.push_back(offsets[k]);
    }
    return {{"tokens", tokens}, {"token_logprobs", values}, {"top_logprobs", tops}, {"text_offset", offsets}};
  }

  json usage() const {
    int64_t prompt = 0, cached = 0, completion = 0;
    std::vector<bool> seen;
    for (const Choice& c : choices) {
      completion += c.stats.n_generated;
      if (seen.size() <= c.prompt) seen.resize(c.prompt + 1);
      if (!seen[c.prompt]) {  // n choices of one prompt count it once
        seen[c.prompt] = true;
        prompt += c.stats.n_prompt;
        cached += c.stats.n_cached;
      }
    }
    return usage_json(prompt, completion, cached);
  }

  void finish_all() {  // under mu
    in_flight->fetch_sub(1);
    const Choice* err = nullptr;
    for (const Choice& c : choices) {
      if (c.finish == "error") err = &c;
    }
    if (stream) {
      if (err != nullptr) {
        emit("data: " +
             dump(json{{"error",
                        {{"message", err->error},
                         {"type", "server_error"},
                         {"param", nullptr},
                         {"code", nullptr}}}}) +
             "\n\n");
      } else if (include_usage) {
        json j = chunk_base();
        j["choices"] = json::array();
        j["usage"] = usage();
        emit("data: " + dump(j) + "\n\n");
      }
      emit("data: [DONE]\n\n");
      if (started) ex->end_stream();
      return;
    }
    if (err != nullptr) {
      ex->respond(error_response({500, err->error, "server_error", "", ""}));
      return;
    }
    json out = {{"id", id},
                {"object", chat ? "chat.completion" : "text_completion"},
                {"created", created},
                {"model", model}};
    json cs = json::array();
    for (size_t i = 0; i < choices.size(); ++i) {
      const Choice& c = choices[i];
      json choice = {{"index", i}, {"finish_reason", c.finish}, {"logprobs", nullptr}};
      if (chat) {
        choice["message"] = {{"role", "assistant"}, {"content", c.text}};
        if (logprobs) choice["logprobs"] = {{"content", c.lp}};
      } else {
        choice["text"] = c.text;
        if (logprobs) {
          choice["logprobs"] = {{"tokens", c.lp_tokens},
                                {"token_logprobs", c.lp_values},
                                {"top_logprobs", c.lp_top},
                                {"text_offset", c.lp_offsets}};
        }
      }
      cs.push_back(choice);
    }
    out["choices"] = cs;
    out["usage"] = usage();
    ex->respond(json_response(out));
  }
};

Api::Api(ApiOptions options)
    : options_(std::move(options)), created_(static_cast<int64_t>(std::time(nullptr))) {}

void Api::set_engine(Engine* engine) { engine_ = engine; }

void Api::cancel_all() {
  std::vector<std::shared_ptr<Generation>> gens;
  {
    std::lock_guard<std::mutex> lock(live_mu_);
    for (const auto& w : live_) {
      if (auto g = w.lock()) gens.push_back(std::move(g));
    }
  }
  for (const auto& g : gens) {
    std::vector<uint64_t> ids;
    {
      std::lock_guard<std::mutex> lock(g->mu);
      ids = g->ids;
    }
    for (uint64_t id : ids) g->engine->cancel(id);
  }
}

void Api::handle(const HttpRequest& req, const std::shared_ptr<Exchange>& ex) {
  struct Route {
    const char* path;
    const char* method;
    bool auth;
  };
  static constexpr Route kRoutes[] = {
      {"/", "GET", false},
      {"/health", "GET", false},
      {"/metrics", "GET", false},
      {"/v1/models", "GET", true},
      {"/v1/chat/completions", "POST", true},
      {"/v1/completions", "POST", true},
      {"/tokenize", "POST", true},
      {"/detokenize", "POST", true},
  };
  const Route* route = nullptr;
  for (const Route& r : kRoutes) {
    if (req.path == r.path) route = &r;
  }
  if (route == nullptr) {
    return ex->respond(error_response({404, fmt::format("no such path: {} {}", req.method, req.path),
                                       "invalid_request_error", "", "not_found"}));
  }
  if (req.method != route->method) {
    HttpResponse r =
        error_response({405, fmt::format("{} does not take {}: use {}", req.path, req.method, route->method),
                        "invalid_request_error", "", "method_not_allowed"});
    r.headers.emplace_back("Allow", route->method);
    return ex->respond(r);
  }
  if (route->auth && !options_.api_keys.empty()) {
    const std::string_view auth = req.header("Authorization");
    const std::string_view prefix = "Bearer ";
    bool ok = false;
    if (auth.size() > prefix.size() && auth.substr(0, prefix.size()) == prefix) {
      for (const std::string& k : options_.api_keys) ok = keys_equal(auth.substr(prefix.size()), k) || ok;
    }
    if (!ok) {
      return ex->respond(error_response(
          {401, auth.empty() ? "no API key: send 'Authorization: Bearer <key>'" : "the API key is not valid",
           "authentication_error", "", "invalid_api_key"}));
    }
  }
  if (req.path == "/") return ex->respond({200, "text/html; charset=utf-8", {}, chat_page()});
  Engine* engine = engine_.load();
  if (req.path == "/health") {
    return ex->respond(engine != nullptr
                           ? json_response({{"status", "ok"}})
                           : error_response({503, "Loading model", "unavailable_error", "", ""}));
  }
  if (engine == nullptr)
    return ex->respond(error_response({503, "Loading model", "unavailable_error", "", ""}));
  if (req.path == "/metrics") {
    return ex->respond({200, "text/plain; version=0.0.4; charset=utf-8", {}, metrics_text()});
  }
  if (req.path == "/v1/models") {
    const ModelDescription& d = engine->model();
    return ex->respond(json_response({{"object", "list"},
                                      {"data", json::array({{{"id", options_.model_name},
                                                             {"object", "model"},
                                                             {"created", created_},
                                                             {"owned_by", "kiln"},
                                                             {"max_model_len", d.n_ctx}}})}}));
  }
  const std::string_view type = req.header("Content-Type");
  if (type.substr(0, type.find(';')) != "application/json") {
    return ex->respond(
        error_response({415, fmt::format("Content-Type must be application/json, not '{}'", type),
                        "invalid_request_error", "", "unsupported_media_type"}));
  }
  if (req.path == "/tokenize") return tokenize(req, ex);
  if (req.path == "/detokenize") return detokenize(req, ex);
  completions(req, ex, req.path == "/v1/chat/completions");
}

std::string Api::metrics_text() const {
  Engine* engine = engine_.load();
  return metrics_->text(engine->metrics(), options_.model_name);
}

namespace {

std::optional<ApiError> parse_body(const std::string& body, json& out) {
  out = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (out.is_discarded()) return bad("", "the request body is not valid JSON");
  if (!out.is_object()) return bad("", "the request body must be a JSON object");
  return std::nullopt;
}

}  // namespace

void Api::completions(const HttpRequest& req, const std::shared_ptr<Exchange>& ex, bool chat) {
  Engine& engine = *engine_.load();
  const ModelDescription& model = engine.model();
  const auto fail = [&](const ApiError& e) { ex->respond(error_response(e)); };
  json body;
  if (auto e = parse_body(req.body, body)) return fail(*e);
  if (const json* m = field(body, "model")) {
    if (!m->is_string()) return fail(bad("model", "'model' must be a string"));
    if (*m != options_.model_name) {
      return fail({404,
                   fmt::format("The model '{}' does not exist: this server serves '{}'",
                               m->get<std::string>(), options_.model_name),
                   "invalid_request_error", "model", "model_not_found"});
    }
  }
  Parsed p;
  if (auto e = read_sampling(body, model, p)) return fail(*e);
  int64_t max_tokens = -1;
  // max_tokens 0 only scores an echoed prompt (completions with echo): read as >= 0, checked below.
  if (auto e = read_int(body, "max_tokens", chat ? 1 : 0, int64_t{1} << 30, max_tokens)) return fail(*e);
  if (auto e = read_int(body, "max_completion_tokens", 1, int64_t{1} << 30, max_tokens)) return fail(*e);
  if (chat) {
    if (auto e = read_bool(body, "logprobs", p.logprobs)) return fail(*e);
    if (auto e = read_int(body, "top_logprobs", 0, 20, p.top_logprobs)) return fail(*e);
    if (p.top_logprobs > 0 && !p.logprobs)
      return fail(bad("top_logprobs", "'top_logprobs' needs 'logprobs': true"));
    std::vector<ChatMessage> messages;
    if (auto e = read_messages(body, messages)) return fail(*e);
    auto text = engine.render_chat(messages);
    if (!text.ok()) return fail(bad("messages", text.status().message()));
    auto tokens = engine.tokenize(*text, /*add_special=*/false);
    if (!tokens.ok()) return fail(bad("messages", tokens.status().message()));
    p.prompts.push_back(std::move(*tokens));
  } else {
    if (const json* lp = field(body, "logprobs")) {
      if (lp->is_boolean()) {
        p.logprobs = lp->get<bool>();
      } else if (auto e = read_int(body, "logprobs", 0, 20, p.top_logprobs)) {
        return fail(*e);
      } else {
        p.logprobs = true;
      }
    }
    if (auto e = read_bool(body, "echo", p.echo)) return fail(*e);
    if (max_tokens == 0 && !p.echo) {
      return fail(bad("max_tokens", "'max_tokens' must be >= 1 (0 only with 'echo', to score the prompt)"));
    }
    if (p.echo && p.logprobs) p.base.sampling.prompt_logprobs = static_cast<int32_t>(p.top_logprobs);
    const json* prompt = field(body, "prompt");
    const auto bad_prompt = [] {
      return bad("prompt",
                 "'prompt' must be a string, a list of strings, a list of token ids or a list of those");
    };
    if (prompt == nullptr) return fail(bad("prompt", "'prompt' is required"));
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
    if (e) return fail(*e);
    if (p.prompts.size() > 16)
      return fail(bad("prompt", fmt::format("{} prompts: at most 16", p.prompts.size())));
  }
  p.base.sampling.logprobs = p.logprobs;
  p.base.sampling.n_logprobs = static_cast<int32_t>(p.top_logprobs);
  // The context: each prompt and its completion must fit.
  for (const auto& t : p.prompts) {
    if (t.empty()) return fail(bad(chat ? "messages" : "prompt", "the prompt is empty"));
    const int64_t room = model.n_ctx - static_cast<int64_t>(t.size());
    const int64_t want = max_tokens >= 0 ? max_tokens : room;
    if (room <= 0 || want > room) {
      return fail(
          {400,
           fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens "
                       "({} in the {}, {} in the completion). Please reduce the length of the {} or the "
                       "completion.",
                       model.n_ctx, static_cast<int64_t>(t.size()) + std::max<int64_t>(want, 1), t.size(),
                       chat ? "messages" : "prompt", std::max<int64_t>(want, 1),
                       chat ? "messages" : "prompt"),
           "invalid_request_error", chat ? "messages" : "prompt", "context_length_exceeded"});
    }
  }
  if (!admitting_) return fail({503, "the server is shutting down", "unavailable_error", "", ""});
  if (options_.max_queue > 0) {
    const int32_t waiting = engine.metrics().n_waiting;
    if (waiting >= options_.max_queue) {
      return fail({503,
                   fmt::format("the queue is full: {} requests wait for admission (--max-queue {})", waiting,
                               options_.max_queue),
                   "unavailable_error", "", "server_busy"});
    }
  }

  auto g = std::make_shared<Generation>();
  g->ex = ex;
  g->metrics = metrics_;
  g->in_flight = in_flight_;
  g->engine = &engine;
  g->chat = chat;
  g->stream = p.stream;
  g->include_usage = p.include_usage;
  g->logprobs = p.logprobs;
  g->top_logprobs = p.top_logprobs;
  g->echo_logprobs = p.echo && p.logprobs;
  if (g->echo_logprobs) g->prompts = p.prompts;
  g->id = random_id(chat ? "chatcmpl-" : "cmpl-");
  g->model = options_.model_name;
  g->created = static_cast<int64_t>(std::time(nullptr));
  g->t0 = Clock::now();
  const auto n_choices = p.prompts.size() * static_cast<size_t>(p.n);
  g->choices.resize(n_choices);
  g->remaining = n_choices;
  if (!p.seeded) p.base.sampling.seed = std::random_device{}() * uint64_t{0x9E3779B97F4A7C15};
  in_flight_->fetch_add(1);
  std::lock_guard<std::mutex> lock(
      g->mu);  // callbacks wait until every choice is submitted and the head sent
  for (size_t i = 0; i < n_choices; ++i) {
    const size_t prompt = i / static_cast<size_t>(p.n);
    g->choices[i].prompt = prompt;
    Request r = p.base;
    r.prompt_tokens = p.prompts[prompt];
    r.sampling.seed = p.base.sampling.seed + i % static_cast<size_t>(p.n);
    r.sampling.max_tokens = static_cast<int32_t>(
        max_tokens >= 0 ? max_tokens : model.n_ctx - static_cast<int64_t>(r.prompt_tokens.size()));
    if (p.echo) g->choices[i].text = p.prompt_texts[prompt];
    auto id = engine.submit(r, [g, i](const TokenEvent& ev) { g->on_event(i, ev); });
    if (!id.ok()) {
      g->failed = true;
      for (uint64_t done : g->ids) engine.cancel(done);
      in_flight_->fetch_sub(1);
      const bool busy = id.status().code() == StatusCode::resource_exhausted;
      return fail(busy ? ApiError{503, id.status().message(), "unavailable_error", "", "server_busy"}
                       : bad(chat ? "messages" : "prompt", id.status().message()));
    }
    g->ids.push_back(*id);
  }
  ex->on_disconnect([g] {
    for (uint64_t id : g->ids) g->engine->cancel(id);
  });
  {
    std::lock_guard<std::mutex> live_lock(live_mu_);
    std::erase_if(live_, [](const std::weak_ptr<Generation>& w) { return w.expired(); });
    live_.push_back(g);
  }
  if (!p.stream) return;
  ex->begin_stream(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
  g->started = true;
  if (p.echo && !p.logprobs) {  // with logprobs, the echo waits for the scored prompt (on_event)
    for (size_t i = 0; i < n_choices; ++i) {
      json j = g->chunk_base();
      j["choices"] = json::array(
          {{{"index", i}, {"text", g->choices[i].text}, {"logprobs", nullptr}, {"finish_reason", nullptr}}});
      if (g->include_usage) j["usage"] = nullptr;
      ex->send("data: " + dump(j) + "\n\n");
    }
  }
  for (std::string& c : g->pending) ex->send(std::move(c));  // none yet: the callbacks wait for the lock
  g->pending.clear();
}

void Api::tokenize(const HttpRequest& req, const std::shared_ptr<Exchange>& ex) {
  Engine& engine = *engine_.load();
  json body;
  if (auto e = parse_body(req.body, body)) return ex->respond(error_response(*e));
  bool add_special = true;
  if (auto e = read_bool(body, "add_special_tokens", add_special)) return ex->respond(error_response(*e));
  std::string text;
  if (field(body, "messages") != nullptr) {
    std::vector<ChatMessage> messages;
    if (auto e = read_messages(body, messages)) return ex->respond(error_response(*e));
    auto t = engine.render_chat(messages);
    if (!t.ok()) return ex->respond(error_response(bad("messages", t.status().message())));
    text = *t;
    add_special = false;
  } else {
    const json* prompt = field(body, "prompt");
    if (prompt == nullptr) prompt = field(body, "content");
    if (prompt == nullptr || !prompt->is_string()) {
      return ex->respond(error_response(bad("prompt", "'prompt' (or 'content') must be a string")));
    }
    text = prompt->get<std::string>();
  }
  auto tokens = engine.tokenize(text, add_special);
  if (!tokens.ok()) return ex->respond(error_response(bad("prompt", tokens.status().message())));
  ex->respond(json_response(
      {{"tokens", *tokens}, {"count", tokens->size()}, {"max_model_len", engine.model().n_ctx}}));
}

void Api::detokenize(const HttpRequest& req, const std::shared_ptr<Exchange>& ex) {
  Engine& engine = *engine_.load();
  json body;
  if (auto e = parse_body(req.body, body)) return ex->respond(error_response(*e));
  const json* tokens = field(body, "tokens");
  if (tokens == nullptr || !tokens->is_array()) {
    return ex->respond(error_response(bad("tokens", "'tokens' must be a list of token ids")));
  }
  std::vector<int32_t> ids;
  const int32_t n_vocab = engine.model().n_vocab;
  for (size_t i = 0; i < tokens->size(); ++i) {
    const json& t = (*tokens)[i];
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= n_vocab) {
      return ex->respond(
          error_response(bad("tokens", fmt::format("tokens[{}] is not a token id in [0, {})", i, n_vocab))));
    }
    ids.push_back(t.get<int32_t>());
  }
  auto text = engine.detokenize(ids);
  if (!text.ok()) return ex->respond(error_response(bad("tokens", text.status().message())));
  ex->respond(json_response({{"prompt", *text}}));
}

}  // namespace kiln::server
