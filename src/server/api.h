// The OpenAI-compatible API of kiln serve over one Engine: /v1/chat/completions, /v1/completions (both
// streaming or not), /v1/models, /tokenize, /detokenize, /health, /metrics and the chat page at /. Requests
// are validated field by field (errors in OpenAI's shape, naming the field), turned into engine requests, and
// answered from the engine's token callbacks; a client that hangs up cancels its requests.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "server/http.h"
#include "server/prometheus.h"

namespace kiln::server {

namespace api_detail {  // api_internal.h
struct ApiError;
struct Parsed;
}  // namespace api_detail

struct ApiOptions {
  std::string model_name;             // what /v1/models lists and requests may name
  std::vector<std::string> api_keys;  // accepted bearer keys; empty: no authentication
  // Generation requests are refused with 503 while this many engine requests wait for admission (0: never).
  // Counted here, not by the engine's max_queued, so that a request of n choices is let in whole or not at
  // all.
  int32_t max_queue = 0;
  // Generation requests are refused with 503 when the charges (queued_charge) of the requests not yet
  // admitted would pass this many tokens (0: never): the memory a burst holds, bounded at max_queued_tokens *
  // kQueuedTokenBytes.
  int64_t max_queued_tokens = 0;
};

// What a request not yet started holds, reckoned in tokens of kQueuedTokenBytes. Per choice: its prompt's
// tokens (an id, 4 bytes, and the allocator's rounding: under 10 bytes a token measured, about 50 with echo
// and logprobs; the request's text and JSON are freed once it is parsed); kQueuedChoiceTokens for what every
// request holds besides (its connection, the engine's request and sampler: under 10 KiB measured); and three
// times the bytes of its logit_bias, stop strings and cache_salt, which the engine and its sampler each copy
// (a logit_bias entry of 8 bytes holds 16 to 24 measured, the copies and the allocator's share of their
// transients). bench/burst_memory.py measures what a queued request holds beside this charge.
inline constexpr int64_t kQueuedTokenBytes = 64;
inline constexpr int64_t kQueuedChoiceTokens = 256;  // 16 KiB
// prompts: the request's tokenized prompts, each sampled n times; base: the fields every choice copies.
int64_t queued_charge(const std::vector<std::vector<int32_t>>& prompts, int32_t n, const Request& base);

class Api {
 public:
  explicit Api(ApiOptions options);
  // The engine, once loaded: until then /health answers 503 and the API 503 "Loading model". Not owned.
  void set_engine(Engine* engine);
  // New generation requests are refused with 503 from now on (a shutdown in progress).
  void stop_admitting() { admitting_ = false; }
  // Generation requests whose answer is not complete yet.
  int64_t in_flight() const { return in_flight_->load(); }
  // Cancels every generation in flight (a shutdown past its grace period): each ends with finish_reason
  // abort.
  void cancel_all();
  void handle(const HttpRequest& request, const std::shared_ptr<Exchange>& exchange);

  struct Generation;

 private:
  void completions(const HttpRequest& req, const std::shared_ptr<Exchange>& ex, bool chat);
  // The parts of completions() after parse and validate (api_internal.h): the generation its choices feed;
  // submit: one engine request a choice (under g->mu), the error when the engine refuses one (those already
  // submitted cancelled); respond: the cancellation on disconnect, and for a stream its head and first
  // chunks.
  std::shared_ptr<Generation> make_generation(api_detail::Parsed& p, const std::shared_ptr<Exchange>& ex,
                                              bool chat, Engine& engine);
  std::optional<api_detail::ApiError> submit(const std::shared_ptr<Generation>& g,
                                             const api_detail::Parsed& p, Engine& engine, bool chat);
  void respond(const std::shared_ptr<Generation>& g, const api_detail::Parsed& p,
               const std::shared_ptr<Exchange>& ex);
  void tokenize(const HttpRequest& req, const std::shared_ptr<Exchange>& ex);
  void detokenize(const HttpRequest& req, const std::shared_ptr<Exchange>& ex);
  std::string metrics_text() const;

  ApiOptions options_;
  std::atomic<Engine*> engine_{nullptr};
  std::atomic<bool> admitting_{true};
  std::shared_ptr<std::atomic<int64_t>> in_flight_ = std::make_shared<std::atomic<int64_t>>(0);
  std::shared_ptr<std::atomic<int64_t>> queued_tokens_ = std::make_shared<std::atomic<int64_t>>(0);
  std::shared_ptr<ServerMetrics> metrics_ = std::make_shared<ServerMetrics>();
  int64_t created_ = 0;  // the Unix time /v1/models reports
  std::mutex live_mu_;
  std::vector<std::weak_ptr<Generation>> live_;  // for cancel_all()
};

// Whether two keys are equal, in time that depends on their lengths only.
bool keys_equal(std::string_view a, std::string_view b);

// The chat page served at / (chat_page.cpp).
const std::string& chat_page();

}  // namespace kiln::server
