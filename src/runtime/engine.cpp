// The engine's API side: submit (validate, tokenize, queue), cancel, wait, drain, metrics. The engine thread
// and its step are in engine_step.cpp, setup in engine_load.cpp.
#include <openssl/crypto.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>

#include "engine_impl.h"

namespace kiln {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::none: return "none";
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::cancelled: return "cancelled";
    case FinishReason::error: return "error";
  }
  return "none";
}

void SampleRing::push(double v) {
  if (data_.size() < capacity_) {
    data_.push_back(v);
    return;
  }
  data_[next_] = v;
  next_ = (next_ + 1) % capacity_;
}

std::vector<double> SampleRing::ordered() const {
  std::vector<double> out(data_.begin() + static_cast<std::ptrdiff_t>(next_), data_.end());
  out.insert(out.end(), data_.begin(), data_.begin() + static_cast<std::ptrdiff_t>(next_));
  return out;
}

Result<std::unique_ptr<Engine>> Engine::create(const EngineOptions& options) {
  // libcrypto initialises itself on first use, on whichever thread: do it here, on the caller's thread, whose
  // state libcrypto releases at exit, rather than on the engine thread.
  if (OPENSSL_init_crypto(OPENSSL_INIT_LOAD_CONFIG, nullptr) != 1) {
    return make_status(StatusCode::internal, "cannot initialise libcrypto (SHA-256 for the KV cache)");
  }
  auto impl = std::make_unique<Impl>();
  KILN_TRY(impl->load(options));
  auto engine = std::unique_ptr<Engine>(new Engine(std::move(impl)));
  engine->impl_->delivery_thread = std::thread([e = engine->impl_.get()] { e->deliver_loop(); });
  engine->impl_->thread = std::thread([e = engine->impl_.get()] { e->loop(); });
  return engine;
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->work_cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
  {
    std::lock_guard<std::mutex> lock(impl_->delivery_mu);
    impl_->delivery_stop = true;
  }
  impl_->delivery_cv.notify_all();
  if (impl_->delivery_thread.joinable()) impl_->delivery_thread.join();
}

const ModelDescription& Engine::model() const { return impl_->desc; }

Result<std::vector<int32_t>> Engine::tokenize(const std::string& text, bool add_special) const {
  return impl_->tokenizer->encode(text, add_special, /*parse_special=*/true);
}

Result<std::string> Engine::detokenize(const std::vector<int32_t>& ids) const {
  return impl_->tokenizer->decode(ids, /*skip_special=*/false);
}

Result<std::string> Engine::render_chat(const std::vector<ChatMessage>& messages,
                                        const std::vector<ToolDefinition>& tools) const {
  return impl_->render_chat(messages, tools);
}

Status Engine::check_constraint(const OutputConstraint& constraint) {
  if (constraint.kind == OutputConstraint::Kind::none) return Status::ok_status();
  return impl_->grammars->get(constraint).status();
}

Result<uint64_t> Engine::submit(const Request& request, TokenCallback callback) {
  Impl& e = *impl_;
  auto s = std::make_unique<Impl::Seq>();
  s->t_submit = Clock::now();
  const int n_sources = !request.prompt.empty() + !request.prompt_tokens.empty() + !request.messages.empty();
  if (n_sources != 1) {
    return invalid_argument("request: give exactly one of prompt, prompt_tokens and messages ({} given)",
                            n_sources);
  }
  KILN_TRY(validate(request.sampling, e.desc.n_vocab));
  if (!request.tools.empty() && request.messages.empty()) {
    return invalid_argument("request: tools are only rendered with chat messages ({} tools, no messages)",
                            request.tools.size());
  }
  if (!request.messages.empty()) {
    KILN_ASSIGN_OR_RETURN(std::string text, e.render_chat(request.messages, request.tools));
    s->prompt = e.tokenizer->encode(text, /*add_special=*/false, /*parse_special=*/true);
  } else if (!request.prompt.empty()) {
    s->prompt = e.tokenizer->encode(request.prompt, /*add_special=*/true, /*parse_special=*/true);
  } else {
    for (size_t i = 0; i < request.prompt_tokens.size(); ++i) {
      const int32_t t = request.prompt_tokens[i];
      if (t < 0 || t >= e.desc.n_vocab) {
        return out_of_range("request: prompt_tokens[{}] = {} is outside the vocabulary of {}", i, t,
                            e.desc.n_vocab);
      }
    }
    s->prompt = request.prompt_tokens;
  }
  if (s->prompt.empty()) return invalid_argument("request: the prompt is empty after tokenization");
  const auto n_prompt = static_cast<int32_t>(s->prompt.size());
  if (n_prompt >= e.desc.n_ctx) {
    return out_of_range("request: the prompt is {} tokens but the context is {} (raise -c / n_ctx)", n_prompt,
                        e.desc.n_ctx);
  }
  // With a sliding window, blocks below it are given back as the prompt is computed: any length may fit.
  const int64_t pool_tokens = int64_t{e.desc.kv_blocks} * e.desc.kv_block_size;
  if (!e.kv_windowed && n_prompt > pool_tokens) {
    return out_of_range(
        "request: the prompt is {} tokens but the KV cache holds {} (raise --kv-memory / kv_memory_bytes)",
        n_prompt, pool_tokens);
  }
  s->stats.n_prompt = n_prompt;
  s->n_prompt = n_prompt;
  if (request.sampling.prompt_logprobs >= 0) {
    s->prompt_lp.resize(static_cast<size_t>(n_prompt - 1));
  }
  if (request.prompt_logits) {
    if (request.prompt_logits_from < 0 || request.prompt_logits_from > n_prompt - 1) {
      return out_of_range("request: prompt_logits_from = {} is outside [0, {}] (the prompt is {} tokens)",
                          request.prompt_logits_from, n_prompt - 1, n_prompt);
    }
    s->prompt_logits = request.prompt_logits;
    s->prompt_logits_next = request.prompt_logits_from;
  }
  // The grammar last: compiling it (on this thread, through the cache) is the costly check.
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
  if (request.constraint.kind != OutputConstraint::Kind::none) {
    KILN_ASSIGN_OR_RETURN(grammar, e.grammars->get(request.constraint));
  }
  s->sampler.emplace(request.sampling, e.desc.n_vocab);
  s->sampler->set_end_tokens(e.tokenizer->eog_ids());
  if (grammar != nullptr) s->sampler->set_grammar(std::move(grammar));
  s->decoder.emplace(*e.tokenizer, /*skip_special=*/true);
  s->stop.emplace(request.sampling.stop);
  s->params = request.sampling;
  s->cache_salt = request.cache_salt;
  s->priority = request.priority;
  if (!callback) callback = [](const TokenEvent&) {};  // no streaming: the caller only wait()s
  s->callback = std::make_shared<const TokenCallback>(std::move(callback));
  s->on_admitted = request.on_admitted;
  s->outcome = std::make_shared<Impl::Outcome>();
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(e.mu);
    if (e.draining) {
      ++e.totals.n_rejected;
      return resource_exhausted(
          "the engine is draining: it finishes the requests it has and takes no new ones");
    }
    const int64_t n_queued = static_cast<int64_t>(e.incoming.size()) + e.totals.n_waiting;
    if (e.options.max_queued > 0 && n_queued >= e.options.max_queued) {
      ++e.totals.n_rejected;
      return resource_exhausted("the queue is full: {} requests wait for admission (max_queued = {})",
                                n_queued, e.options.max_queued);
    }
    id = s->id = e.next_id++;
    e.outcomes[id] = s->outcome;
    ++e.n_open;
    e.incoming.push_back(std::move(s));
  }
  e.work_cv.notify_all();
  return id;
}

void Engine::cancel(uint64_t id) {
  Impl& e = *impl_;
  {
    std::lock_guard<std::mutex> lock(e.mu);
    auto it = e.outcomes.find(id);
    if (it == e.outcomes.end() || it->second->finished) return;
    e.cancels.push_back(id);
  }
  e.work_cv.notify_all();
}

Result<RequestStats> Engine::wait(uint64_t id) {
  Impl& e = *impl_;
  std::unique_lock<std::mutex> lock(e.mu);
  auto it = e.outcomes.find(id);
  if (it == e.outcomes.end()) {
    return not_found(
        "request {} is unknown, was already waited for, or finished before the last {} finished requests "
        "(keep_finished)",
        id, e.options.keep_finished);
  }
  std::shared_ptr<Impl::Outcome> o = it->second;  // kept alive even if dropped from `outcomes` meanwhile
  if (!o->finished && e.on_engine_threads()) {
    return invalid_argument(
        "wait({}) was called from a callback before the request finished: the thread that delivers its "
        "events cannot wait for them",
        id);
  }
  e.done_cv.wait(lock, [&] { return o->finished; });
  e.outcomes.erase(id);
  return o->stats;
}

Status Engine::drain() {
  Impl& e = *impl_;
  if (e.on_engine_threads()) {
    return invalid_argument(
        "drain() was called from a callback: the engine's threads cannot wait for themselves");
  }
  std::unique_lock<std::mutex> lock(e.mu);
  e.draining = true;
  e.done_cv.wait(lock, [&] { return e.n_open == 0; });
  return Status::ok_status();
}

EngineMetrics Engine::metrics() const {
  const Impl& e = *impl_;
  std::lock_guard<std::mutex> lock(e.mu);
  EngineMetrics m = e.totals;
  m.n_waiting += static_cast<int32_t>(e.incoming.size());
  m.draining = e.draining;
  m.ttft_ms = e.ttft.ordered();
  m.itl_ms = e.itl.ordered();
  m.e2e_ms = e.e2e.ordered();
  return m;
}

}  // namespace kiln
