// The engine: one thread runs steps. Each step admits queued requests while there is room (prefix-cache hits
// skip their cached prompt blocks), builds one Batch — every running decode first, then prefill chunks of the
// others until max_batch_tokens is used — runs Model::forward, samples the sequences whose last known token
// was in the batch, streams their text and retires the finished ones (their KV blocks go back to the pool).
// When the cache has no block for a sequence, the newest other running request is preempted: its blocks are
// freed and it goes back to the front of the queue, to be recomputed from its tokens so far.
#include <openssl/crypto.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "core/log.h"
#include "engine_impl.h"
#include "models/model.h"

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

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

Result<std::unique_ptr<Engine>> Engine::create(const EngineOptions& options) {
  // libcrypto initialises itself on first use, on whichever thread: do it here, on the caller's thread, whose
  // state libcrypto releases at exit, rather than on the engine thread.
  if (OPENSSL_init_crypto(OPENSSL_INIT_LOAD_CONFIG, nullptr) != 1) {
    return make_status(StatusCode::internal, "cannot initialise libcrypto (SHA-256 for the KV cache)");
  }
  auto impl = std::make_unique<Impl>();
  KILN_TRY(impl->load(options));
  auto engine = std::unique_ptr<Engine>(new Engine(std::move(impl)));
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
}

const ModelDescription& Engine::model() const { return impl_->desc; }

Result<std::vector<int32_t>> Engine::tokenize(const std::string& text, bool add_special) const {
  return impl_->tokenizer->encode(text, add_special, /*parse_special=*/true);
}

Result<std::string> Engine::detokenize(const std::vector<int32_t>& ids) const {
  return impl_->tokenizer->decode(ids, /*skip_special=*/false);
}

Result<std::string> Engine::render_chat(const std::vector<ChatMessage>& messages) const {
  return impl_->render_chat(messages);
}

Result<uint64_t> Engine::submit(const Request& request, TokenCallback callback) {
  Impl& e = *impl_;
  auto s = std::make_shared<Impl::Seq>();
  const int n_sources = !request.prompt.empty() + !request.prompt_tokens.empty() + !request.messages.empty();
  if (n_sources != 1) {
    return invalid_argument("request: give exactly one of prompt, prompt_tokens and messages ({} given)",
                            n_sources);
  }
  KILN_TRY(validate(request.sampling, e.desc.n_vocab));
  if (!request.messages.empty()) {
    KILN_ASSIGN_OR_RETURN(std::string text, e.render_chat(request.messages));
    s->tokens = e.tokenizer->encode(text, /*add_special=*/false, /*parse_special=*/true);
  } else if (!request.prompt.empty()) {
    s->tokens = e.tokenizer->encode(request.prompt, /*add_special=*/true, /*parse_special=*/true);
  } else {
    for (size_t i = 0; i < request.prompt_tokens.size(); ++i) {
      const int32_t t = request.prompt_tokens[i];
      if (t < 0 || t >= e.desc.n_vocab) {
        return out_of_range("request: prompt_tokens[{}] = {} is outside the vocabulary of {}", i, t,
                            e.desc.n_vocab);
      }
    }
    s->tokens = request.prompt_tokens;
  }
  if (s->tokens.empty()) return invalid_argument("request: the prompt is empty after tokenization");
  if (static_cast<int32_t>(s->tokens.size()) >= e.desc.n_ctx) {
    return out_of_range("request: the prompt is {} tokens but the context is {} (raise -c / n_ctx)",
                        s->tokens.size(), e.desc.n_ctx);
  }
  s->n_prompt = static_cast<int32_t>(s->tokens.size());
  s->sampler.emplace(request.sampling, e.desc.n_vocab);
  s->decoder.emplace(*e.tokenizer, /*skip_special=*/true);
  s->stop.emplace(request.sampling.stop);
  s->params = request.sampling;
  s->callback = std::move(callback);
  {
    std::lock_guard<std::mutex> lock(e.mu);
    s->id = e.next_id++;
    e.all[s->id] = s;
    e.queue.push_back(s);
  }
  e.work_cv.notify_all();
  return s->id;
}

void Engine::cancel(uint64_t id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->all.find(id);
  if (it != impl_->all.end()) it->second->cancel_requested = true;
  impl_->work_cv.notify_all();
}

Result<RequestStats> Engine::wait(uint64_t id) {
  Impl& e = *impl_;
  std::unique_lock<std::mutex> lock(e.mu);
  auto it = e.all.find(id);
  if (it == e.all.end()) return not_found("request {} is unknown (or was already waited for)", id);
  std::shared_ptr<Impl::Seq> s = it->second;
  e.done_cv.wait(lock, [&] { return s->finished; });
  e.all.erase(id);
  return s->stats;
}

// ---------------------------------------------------------------------------------------------------------------
// The engine thread.

void Engine::Impl::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu);
      work_cv.wait(lock, [&] { return stop || !queue.empty() || !running.empty(); });
      if (stop) break;
    }
    step();
  }
  // Shutting down: every request still open ends as cancelled.
  std::vector<std::shared_ptr<Seq>> open;
  {
    std::lock_guard<std::mutex> lock(mu);
    open.assign(queue.begin(), queue.end());
    queue.clear();
  }
  open.insert(open.end(), running.begin(), running.end());
  for (auto& s : open) finish(*s, FinishReason::cancelled, "");
  running.clear();
  OPENSSL_thread_stop();  // libcrypto's per-thread state of this thread (the KV cache hashes blocks here)
}

void Engine::Impl::admit() {
  std::lock_guard<std::mutex> lock(mu);
  while (!queue.empty() && static_cast<int32_t>(running.size()) < options.n_seq_max) {
    std::shared_ptr<Seq> s = queue.front();
    if (s->cancel_requested) {
      queue.pop_front();
      cancelled_in_queue.push_back(s);
      continue;
    }
    auto cached = kv_cache->add_sequence(static_cast<int64_t>(s->id), s->tokens);
    if (!cached.ok()) break;  // no room now: retry next step
    queue.pop_front();
    s->n_computed = *cached;
    if (!s->admitted) {
      s->admitted = true;
      s->stats.n_cached = *cached;
      s->t_admit = std::chrono::steady_clock::now();
    }
    running.push_back(s);
  }
}

void Engine::Impl::preempt(Seq& s) {
  kv_cache->free_sequence(static_cast<int64_t>(s.id));
  s.n_computed = 0;
  auto it = std::find_if(running.begin(), running.end(), [&](const auto& p) { return p.get() == &s; });
  std::shared_ptr<Seq> keep = *it;
  running.erase(it);
  std::lock_guard<std::mutex> lock(mu);
  queue.push_front(keep);
  log_debug("engine: preempted request {} ({} tokens) for lack of KV blocks", s.id, s.tokens.size());
}

void Engine::Impl::step() {
  admit();
  for (auto& s : cancelled_in_queue) finish(*s, FinishReason::cancelled, "");
  cancelled_in_queue.clear();
  for (size_t i = 0; i < running.size();) {
    if (running[i]->cancel_requested) {
      std::shared_ptr<Seq> s = running[i];
      kv_cache->free_sequence(static_cast<int64_t>(s->id));
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
      finish(*s, FinishReason::cancelled, "");
    } else {
      ++i;
    }
  }
  if (running.empty()) return;

  // Decodes (one pending token) first, then prefills, each group in admission order.
  std::vector<std::shared_ptr<Seq>> order = running;
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return (a->pending() == 1) > (b->pending() == 1); });
  int32_t budget = options.max_batch_tokens;
  struct Part {
    std::shared_ptr<Seq> s;
    int32_t n;  // tokens of this sequence in the batch
  };
  std::vector<Part> parts;
  for (auto& s : order) {
    if (budget == 0) break;
    if (std::find(running.begin(), running.end(), s) == running.end()) continue;  // preempted below
    const int32_t n = std::min(s->pending(), budget);
    Status st = kv_cache->reserve(static_cast<int64_t>(s->id), n);
    while (!st.ok()) {
      // Preempt the newest running request that is not in this batch yet, or give up on this one.
      auto victim = std::find_if(running.rbegin(), running.rend(), [&](const auto& r) {
        return r != s && std::none_of(parts.begin(), parts.end(), [&](const Part& p) { return p.s == r; });
      });
      if (victim == running.rend()) break;
      preempt(**victim);
      st = kv_cache->reserve(static_cast<int64_t>(s->id), n);
    }
    if (!st.ok()) {
      if (parts.empty() && running.size() == 1) {
        // Alone and still no room: the cache is too small for this request.
        kv_cache->free_sequence(static_cast<int64_t>(s->id));
        running.clear();
        finish(*s, FinishReason::error,
               fmt::format("the KV cache ({} blocks) cannot hold this request: {}", kv_cache->n_blocks(),
                           st.message()));
        return;
      }
      continue;
    }
    parts.push_back({s, n});
    budget -= n;
  }
  if (parts.empty()) return;

  batch.clear();
  for (size_t i = 0; i < parts.size(); ++i) {
    Seq& s = *parts[i].s;
    batch.block_tables.push_back(kv_cache->block_table(static_cast<int64_t>(s.id)));
    for (int32_t j = 0; j < parts[i].n; ++j) {
      batch.tokens.push_back(s.tokens[s.n_computed + j]);
      batch.positions.push_back(s.n_computed + j);
      batch.seq.push_back(static_cast<int32_t>(i));
    }
    if (s.n_computed + parts[i].n == static_cast<int32_t>(s.tokens.size())) {
      batch.logit_rows.push_back(batch.n_tokens() - 1);
    }
  }
  // Rows of the model's n_vocab; sampling sees the tokenizer's first desc.n_vocab (HF embeddings are often
  // padded past the vocabulary).
  const size_t stride = static_cast<size_t>(model->info().n_vocab);
  Status st = run_forward();
  if (!st.ok()) {
    log_error("engine: forward failed: {}", st.message());
    for (auto& p : parts) {
      kv_cache->free_sequence(static_cast<int64_t>(p.s->id));
      running.erase(std::find(running.begin(), running.end(), p.s));
      finish(*p.s, FinishReason::error, st.message());
    }
    return;
  }
  size_t row = 0;
  for (auto& p : parts) {
    Seq& s = *p.s;
    kv_cache->commit(static_cast<int64_t>(s.id),
                     std::span<const int32_t>(s.tokens).subspan(static_cast<size_t>(s.n_computed), p.n));
    s.n_computed += p.n;
    if (const int32_t window = model->info().kv_window; window > 0) {
      // Positions below the next token's window are never read again.
      kv_cache->release_before(static_cast<int64_t>(s.id), s.n_computed - window + 1);
    }
    if (s.pending() > 0) continue;  // a prefill chunk: no logits yet
    const std::span<const float> row_logits(logits.data() + row * stride, static_cast<size_t>(desc.n_vocab));
    ++row;
    sample_and_emit(p.s, row_logits);
  }
}

Status Engine::Impl::run_forward() {
  KILN_ASSIGN_OR_RETURN(const Tensor step_logits, model->forward(batch, *kv));
  return read_logits(*backend, step_logits, logits);  // the one point where the engine waits for the backend
}

void Engine::Impl::sample_and_emit(const std::shared_ptr<Seq>& sp, std::span<const float> row_logits) {
  Seq& s = *sp;
  auto retire = [&](FinishReason reason, const std::string& error) {
    kv_cache->free_sequence(static_cast<int64_t>(s.id));
    running.erase(std::find(running.begin(), running.end(), sp));
    finish(s, reason, error);
  };
  if (s.params.max_tokens == 0) return retire(FinishReason::length, "");  // prefill only
  auto sampled = s.sampler->sample(row_logits, s.tokens);
  if (!sampled.ok()) return retire(FinishReason::error, sampled.status().message());
  if (s.stats.n_generated == 0) s.t_first = std::chrono::steady_clock::now();
  const int32_t tok = sampled->token;
  s.tokens.push_back(tok);
  ++s.stats.n_generated;
  if (!s.params.ignore_eos && tokenizer->is_eog(tok)) return retire(FinishReason::stop, "");
  TokenEvent ev;
  ev.token = tok;
  ev.logprob = sampled->logprob;
  ev.top = std::move(sampled->top);
  auto text = s.decoder->feed(tok);
  if (text.ok()) {
    StopMatcher::StopResult r = s.stop->push(*text);
    ev.text = std::move(r.emit);
    if (r.stopped) {
      s.callback(ev);
      return retire(FinishReason::stop, "");
    }
  }
  s.callback(ev);
  if (s.stats.n_generated >= s.params.max_tokens || static_cast<int32_t>(s.tokens.size()) >= desc.n_ctx) {
    return retire(FinishReason::length, "");
  }
}

void Engine::Impl::finish(Seq& s, FinishReason reason, const std::string& error) {
  TokenEvent ev;
  ev.done = true;
  ev.finish = reason;
  ev.error = error;
  if (reason != FinishReason::error && !s.stop->stopped())
    ev.text = s.stop->push(s.decoder->flush()).emit + s.stop->flush();
  const auto now = std::chrono::steady_clock::now();
  if (s.admitted) {
    s.stats.prefill_ms = s.stats.n_generated > 0
                             ? std::chrono::duration<double, std::milli>(s.t_first - s.t_admit).count()
                             : ms_since(s.t_admit);
    s.stats.decode_ms =
        s.stats.n_generated > 0 ? std::chrono::duration<double, std::milli>(now - s.t_first).count() : 0;
  }
  s.stats.n_prompt = s.n_prompt;
  s.stats.finish = reason;
  s.callback(ev);
  {
    std::lock_guard<std::mutex> lock(mu);
    s.finished = true;
  }
  done_cv.notify_all();
}

}  // namespace kiln
