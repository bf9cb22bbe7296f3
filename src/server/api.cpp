#include "server/api.h"

#include <fmt/format.h>
#include <openssl/crypto.h>

#include <chrono>
#include <ctime>
#include <mutex>
#include <optional>
#include <random>

#include "server/api_internal.h"

namespace kiln::server {

using api_detail::ApiError;
using api_detail::bad;
using api_detail::dump;
using api_detail::error_response;
using api_detail::field;
using api_detail::json_response;
using api_detail::parse_body;
using api_detail::parse_completion;
using api_detail::Parsed;
using api_detail::read_bool;
using api_detail::read_messages;
using api_detail::read_tool_definitions;
using api_detail::validate_completion;

namespace {

std::string random_id(const char* prefix) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return fmt::format("{}{:016x}{:08x}", prefix, rng(), static_cast<uint32_t>(rng()));
}

}  // namespace

int64_t queued_charge(const std::vector<std::vector<int32_t>>& prompts, int32_t n, const Request& base) {
  int64_t bytes = static_cast<int64_t>(base.cache_salt.size());
  bytes += static_cast<int64_t>(base.sampling.logit_bias.size() * sizeof(base.sampling.logit_bias[0]));
  for (const std::string& stop : base.sampling.stop) bytes += static_cast<int64_t>(stop.size());
  const int64_t per_choice = kQueuedChoiceTokens + (3 * bytes + kQueuedTokenBytes - 1) / kQueuedTokenBytes;
  int64_t tokens = 0;
  for (const auto& prompt : prompts) tokens += (static_cast<int64_t>(prompt.size()) + per_choice) * n;
  return tokens;
}

bool keys_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) {
    (void)CRYPTO_memcmp(a.data(), a.data(), a.size());  // the same work as a comparison of equal lengths
    return false;
  }
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

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

// A generation request: parse -> validate -> (admission) -> submit -> respond.
void Api::completions(const HttpRequest& req, const std::shared_ptr<Exchange>& ex, bool chat) {
  Engine& engine = *engine_.load();
  const ModelDescription& model = engine.model();
  const auto fail = [&](const ApiError& e) { ex->respond(error_response(e)); };
  Parsed p;
  if (auto e = parse_completion(req.body, chat, engine, options_.model_name, p)) return fail(*e);
  if (auto e = validate_completion(p, model, chat)) return fail(*e);
  if (!admitting_) return fail({503, "the server is shutting down", "unavailable_error", "", ""});
  // Load shedding, only past the operator's bounds: 503 with Retry-After (the server is busy, as OpenAI's
  // "overloaded" and vLLM's own), not 429 (a client's rate limit), so that clients retry after a pause.
  if (options_.max_queue > 0) {
    const int32_t waiting = engine.metrics().n_waiting;
    if (waiting >= options_.max_queue) {
      metrics_->rejected.fetch_add(1);
      return fail({503,
                   fmt::format("the queue is full: {} requests wait for admission (--max-queue {})", waiting,
                               options_.max_queue),
                   "unavailable_error", "", "server_busy"});
    }
  }
  const int64_t tokens = queued_charge(p.prompts, p.n, p.base);
  if (options_.max_queued_tokens > 0) {
    const int64_t queued = queued_tokens_->load();
    if (queued + tokens > options_.max_queued_tokens) {
      metrics_->rejected.fetch_add(1);
      return fail({503,
                   fmt::format("the queue is full: the requests waiting count {} tokens, this one {} (its "
                               "prompt tokens and {} a choice) (--max-queued-tokens {})",
                               queued, tokens, kQueuedChoiceTokens, options_.max_queued_tokens),
                   "unavailable_error", "", "server_busy"});
    }
  }

  std::shared_ptr<Generation> g = make_generation(p, ex, chat, engine);
  in_flight_->fetch_add(1);
  std::lock_guard<std::mutex> lock(
      g->mu);  // callbacks wait until every choice is submitted and the head sent
  g->queue_counter = queued_tokens_;
  if (auto e = submit(g, p, engine, chat)) {
    for (size_t i = 0; i < g->choices.size(); ++i) g->leave_queue(i);
    return fail(*e);
  }
  respond(g, p, ex);
}

std::shared_ptr<Api::Generation> Api::make_generation(Parsed& p, const std::shared_ptr<Exchange>& ex,
                                                      bool chat, Engine& engine) {
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
  g->tool_format = p.tool_format;
  if (g->echo_logprobs) g->prompts = p.prompts;
  g->id = random_id(chat ? "chatcmpl-" : "cmpl-");
  g->model = options_.model_name;
  g->created = static_cast<int64_t>(std::time(nullptr));
  g->t0 = Clock::now();
  const auto n_choices = p.prompts.size() * static_cast<size_t>(p.n);
  g->choices.resize(n_choices);
  if (p.tool_format != ToolCallFormat::none) {
    for (Generation::Choice& c : g->choices)
      c.tool_parser.emplace(p.tool_format, p.tool_names, p.max_tool_calls);
  }
  g->remaining = n_choices;
  if (!p.seeded) p.base.sampling.seed = std::random_device{}() * uint64_t{0x9E3779B97F4A7C15};
  return g;
}

std::optional<ApiError> Api::submit(const std::shared_ptr<Generation>& g, const Parsed& p, Engine& engine,
                                    bool chat) {
  const ModelDescription& model = engine.model();
  for (size_t i = 0; i < g->choices.size(); ++i) {
    const size_t prompt = i / static_cast<size_t>(p.n);
    g->choices[i].prompt = prompt;
    Request r = p.base;
    r.prompt_tokens = p.prompts[prompt];
    r.sampling.seed = p.base.sampling.seed + i % static_cast<size_t>(p.n);
    r.sampling.max_tokens = static_cast<int32_t>(
        p.max_tokens >= 0 ? p.max_tokens : model.n_ctx - static_cast<int64_t>(r.prompt_tokens.size()));
    if (p.echo) g->choices[i].text = p.prompt_texts[prompt];
    // Charged while it waits: released when the engine admits it (or on its first event, the final one of a
    // request that ends unadmitted).
    g->choices[i].queued = queued_charge({p.prompts[prompt]}, 1, p.base);
    g->queue_counter->fetch_add(g->choices[i].queued);
    r.on_admitted = [g, i] {
      std::lock_guard<std::mutex> lock(g->mu);
      g->leave_queue(i);
    };
    auto id = engine.submit(r, [g, i](const TokenEvent& ev) { g->on_event(i, ev); });
    if (!id.ok()) {
      g->failed = true;
      for (uint64_t done : g->ids) engine.cancel(done);
      in_flight_->fetch_sub(1);
      const bool busy = id.status().code() == StatusCode::resource_exhausted;
      return busy ? ApiError{503, id.status().message(), "unavailable_error", "", "server_busy"}
                  : bad(chat ? "messages" : "prompt", id.status().message());
    }
    g->ids.push_back(*id);
  }
  return std::nullopt;
}

void Api::respond(const std::shared_ptr<Generation>& g, const Parsed& p,
                  const std::shared_ptr<Exchange>& ex) {
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
    for (size_t i = 0; i < g->choices.size(); ++i) {
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
    std::vector<ToolDefinition> tools;
    if (auto e = read_tool_definitions(req.body, body, tools)) return ex->respond(error_response(*e));
    auto t = engine.render_chat(messages, tools);
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
