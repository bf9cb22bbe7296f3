// The engine thread. Each step hands new requests and cancels to the scheduler, takes its plan (the rule is
// at the top of runtime/scheduler/scheduler.h), ends what the plan ended, builds one Batch from the plan's
// chunks, runs the model (run_forward: the one call into it), commits the written K/V, samples every chunk
// that reached its request's last token, streams the text and finishes the requests that are done (their
// blocks go back to the pool at once).
#include <fmt/format.h>
#include <openssl/crypto.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <iterator>
#include <utility>

#include "core/log.h"
#include "engine_impl.h"

namespace kiln {

namespace {
double ms_between(Clock::time_point t0, Clock::time_point t1) {
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}
}  // namespace

void Engine::Impl::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu);
      work_cv.wait(lock,
                   [&] { return stop || !incoming.empty() || !cancels.empty() || scheduler->has_work(); });
      if (stop) break;
    }
    step();
    hand_over_events();
  }
  // Shutting down: every request still open ends as cancelled, oldest first.
  take_incoming();
  std::vector<uint64_t> open;
  for (const auto& [id, s] : live) open.push_back(id);
  std::sort(open.begin(), open.end());
  for (uint64_t id : open) finish(id, FinishReason::cancelled, "");
  {
    std::lock_guard<std::mutex> lock(mu);
    publish_locked();
  }
  hand_over_events();
  if (profile.on) {
    profile.print();
    if (const std::string how = backend->profile_summary(); !how.empty())
      fmt::print(stderr, "engine {}\n", how);
  }
  OPENSSL_thread_stop();  // libcrypto's per-thread state of this thread (the KV cache hashes blocks here)
}

void Engine::Impl::StepProfile::print() const {
  for (const auto& [name, p] : {std::pair{"decode", &decode}, {"prefill", &prefill}}) {
    if (p->steps == 0) continue;
    const double n = static_cast<double>(p->steps);
    const double total = p->plan_ms + p->batch_ms + p->launch_ms + p->wait_ms + p->emit_ms;
    fmt::print(
        stderr,
        "engine {} steps: {} steps, {:.1f} tokens and {:.1f} sampled rows a step; per step {:.3f} ms = "
        "plan {:.3f} + batch {:.3f} + launch {:.3f} + wait {:.3f} + emit {:.3f}\n",
        name, p->steps, static_cast<double>(p->tokens) / n, static_cast<double>(p->rows) / n, total / n,
        p->plan_ms / n, p->batch_ms / n, p->launch_ms / n, p->wait_ms / n, p->emit_ms / n);
  }
}

void Engine::Impl::take_incoming() {
  std::lock_guard<std::mutex> lock(mu);
  while (!incoming.empty()) {
    std::unique_ptr<Seq> s = std::move(incoming.front());
    incoming.pop_front();
    Status st =
        scheduler->add(s->id, std::move(s->prompt), s->cache_salt,
                       /*reuse_prefix=*/s->params.prompt_logprobs < 0 && !s->prompt_logits, s->priority);
    KILN_ASSERT(st.ok());  // ids are unique and submit() refused empty prompts
    s->prompt = {};
    live.emplace(s->id, std::move(s));
  }
  // Queued or running, a cancelled request ends in this step's plan: it waits for no free slot.
  for (uint64_t id : cancels) scheduler->cancel(id);
  cancels.clear();
  publish_locked();
}

void Engine::Impl::expire_queued() {
  if (options.queue_timeout_ms <= 0) return;
  const auto now = Clock::now();
  std::vector<uint64_t> late;
  for (const auto& [id, s] : live) {
    if (!s->admitted && ms_between(s->t_submit, now) > static_cast<double>(options.queue_timeout_ms))
      late.push_back(id);
  }
  std::sort(late.begin(), late.end());
  for (const uint64_t id : late) {
    ++delta.n_queue_timeouts;
    live.at(id)->stats.timed_out = true;
    finish(
        id, FinishReason::error,
        fmt::format("waited {} ms for admission (queue_timeout_ms = {})",
                    static_cast<int64_t>(ms_between(live.at(id)->t_submit, now)), options.queue_timeout_ms));
  }
}

void Engine::Impl::step() {
  const auto t0 = Clock::now();
  take_incoming();
  expire_queued();
  // Speculation drafts in decode steps where it has paid (SpecControl), and prompt lookup in steps that
  // compute prompts too where it pays in the decode steps (its drafts ride along a large step; a draft
  // model's passes would not). Under a steady stream of admissions most steps compute a prompt, so drafts
  // that rode along whatever the decode steps measured were never held back (a GPU serving 64 requests ran
  // 16% slower with prompt lookup than without).
  const int32_t n_running = scheduler->n_running();
  const bool decode_step = decode_step_next();
  const bool drafted =
      speculate && (!options.speculation_adaptive ||
                    (decode_step ? spec_control.choose(n_running)
                                 : draft_model == nullptr && spec_control.favours(n_running)));
  if (drafted) propose_drafts(decode_step);
  const uint64_t generated_before = totals.n_generated_tokens + delta.n_generated_tokens;
  const StepPlan plan = scheduler->schedule();
  on_plan(plan);
  {
    std::lock_guard<std::mutex> lock(mu);
    publish_locked();  // the plan's admissions, before any callback of this step can observe the gauges
  }
  if (!plan.chunks.empty()) {
    const auto t1 = Clock::now();
    build_batch(plan);
    const auto t2 = Clock::now();
    Clock::time_point t3;
    Status st = run_forward(t3);
    const auto t4 = Clock::now();
    if (profile.on) {
      const bool decode_only = std::all_of(plan.chunks.begin(), plan.chunks.end(),
                                           [](const ScheduledChunk& c) { return c.n_tokens == 1; });
      StepProfile::Phases& p = decode_only ? profile.decode : profile.prefill;
      ++p.steps;
      p.tokens += batch.n_tokens();
      p.rows += static_cast<int64_t>(batch.logit_rows.size());
      p.plan_ms += ms_between(t0, t1);
      p.batch_ms += ms_between(t1, t2);
      p.launch_ms += ms_between(t2, t3);
      p.wait_ms += ms_between(t3, t4);
    }
    if (!st.ok()) {
      log_error("engine: forward failed: {}", st.message());
      for (const ScheduledChunk& c : plan.chunks) finish(c.id, FinishReason::error, st.message());
    } else {
      scheduler->commit(plan);
      const auto stride = static_cast<size_t>(model->info().n_vocab);
      size_t row = 0;
      for (const ScheduledChunk& c : plan.chunks) {
        Seq& s = *live.at(c.id);
        const auto [lo, hi] = scored_positions(s, c);
        Status scored = Status::ok_status();
        const bool score = s.params.prompt_logprobs >= 0 && !s.prompt_lp_sent;
        for (int32_t p = lo; p < hi; ++p, ++row) {
          const std::span<const float> row_logits(logits.data() + row * stride,
                                                  static_cast<size_t>(desc.n_vocab));
          if (score && scored.ok()) scored = score_prompt(s, p, row_logits);
          hand_over_prompt_logits(s, p, row_logits);
        }
        if (!scored.ok()) {
          if (c.sample) ++row;
          finish(c.id, FinishReason::error, scored.message());
          continue;
        }
        if (!c.sample) continue;  // a prefill chunk short of the last prompt token: no token to sample yet
        if (s.params.max_tokens == 0) {
          finish(c.id, FinishReason::length, "");  // prefill only
        } else if (c.n_draft > 0) {
          verify_drafts(c, row);
          row += static_cast<size_t>(c.n_draft);
        } else if (batch.sample_vocab > 0) {
          emit(s, s.sampler->take(sampled_row(row)));
        } else {
          emit(s, host_token(s, row));
        }
        ++row;
      }
    }
    if (profile.on) {
      const bool decode_only = std::all_of(plan.chunks.begin(), plan.chunks.end(),
                                           [](const ScheduledChunk& c) { return c.n_tokens == 1; });
      (decode_only ? profile.decode : profile.prefill).emit_ms += ms_between(t4, Clock::now());
    }
    const bool decoding = std::all_of(plan.chunks.begin(), plan.chunks.end(), [](const ScheduledChunk& c) {
      return c.sample && c.n_tokens - c.n_draft == 1;
    });
    // Prompt lookup that found no draft made a step without drafts (looking costs next to nothing); a draft
    // model's passes cost whatever they drafted.
    const bool verified = drafted && (draft_model != nullptr ||
                                      std::any_of(plan.chunks.begin(), plan.chunks.end(),
                                                  [](const ScheduledChunk& c) { return c.n_draft > 0; }));
    if (speculate && decoding && st.ok()) {
      const uint64_t generated = totals.n_generated_tokens + delta.n_generated_tokens - generated_before;
      spec_control.record(n_running, verified, static_cast<int64_t>(generated),
                          ms_between(t0, Clock::now()) / 1e3);
    }
  }
  std::lock_guard<std::mutex> lock(mu);
  publish_locked();
}

bool Engine::Impl::decode_step_next() const {
  if (scheduler->n_waiting() > 0 && scheduler->n_running() < options.n_seq_max) return false;  // admissions
  for (const auto& [id, s] : live) {
    if (scheduler->running(id) &&
        scheduler->n_computed(id) != static_cast<int32_t>(scheduler->tokens(id).size()) - 1)
      return false;  // a prompt (or a preempted request's tokens) to compute
  }
  return true;
}

void Engine::Impl::on_plan(const StepPlan& plan) {
  const auto now = Clock::now();
  for (const AdmittedRequest& a : plan.admitted) {
    Seq& s = *live.at(a.id);
    delta.prefix_cache_queries += static_cast<uint64_t>(a.n_looked_up);
    delta.prefix_cache_hits += static_cast<uint64_t>(a.n_cached);
    if (!a.first_time) continue;
    s.admitted = true;
    s.t_admit = now;
    s.stats.n_cached = a.n_cached;
    s.stats.queue_ms = ms_between(s.t_submit, now);
    delta.n_prompt_tokens += static_cast<uint64_t>(s.stats.n_prompt);
    delta.n_cached_tokens += static_cast<uint64_t>(a.n_cached);
    if (s.on_admitted) s.on_admitted();
  }
  for (uint64_t id : plan.preempted) {
    Seq& s = *live.at(id);
    ++s.stats.n_preemptions;
    ++delta.n_preemptions;
    log_debug("engine: preempted request {} ({} tokens) for lack of KV blocks", id,
              scheduler->tokens(id).size());
  }
  for (const EndedRequest& e : plan.ended) {
    if (e.reason == EndReason::end_reason_cancelled) {
      finish(e.id, FinishReason::cancelled, "");
    } else {
      finish(e.id, FinishReason::error, fmt::format("{} (raise --kv-memory / kv_memory_bytes)", e.message));
    }
  }
}

void Engine::Impl::build_batch(const StepPlan& plan) {
  batch.clear();
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const ScheduledChunk& c = plan.chunks[i];
    batch.block_tables.push_back(scheduler->block_table(c.id));
    const std::span<const int32_t> tokens = scheduler->tokens(c.id);
    const Seq& s = *live.at(c.id);
    const int32_t first_draft = c.start + c.n_tokens - c.n_draft;  // drafts: Seq::draft, after the own tokens
    for (int32_t p = c.start; p < c.start + c.n_tokens; ++p) {
      batch.tokens.push_back(p < first_draft ? tokens[static_cast<size_t>(p)]
                                             : s.draft[static_cast<size_t>(p - first_draft)]);
      batch.positions.push_back(p);
      batch.seq.push_back(static_cast<int32_t>(i));
    }
    const auto [lo, hi] = scored_positions(s, c);
    for (int32_t p = lo; p < hi; ++p)
      batch.logit_rows.push_back(batch.n_tokens() - c.n_tokens + (p - c.start));
    if (c.sample) {
      // The own token's row, then each draft's (the token after it, to compare with the next draft).
      for (int32_t k = c.n_draft; k >= 0; --k) batch.logit_rows.push_back(batch.n_tokens() - 1 - k);
    }
  }
  // Greedy requests take their tokens from an argmax on the backend, when every row of the step can.
  const bool all_greedy = std::all_of(plan.chunks.begin(), plan.chunks.end(), [&](const ScheduledChunk& c) {
    const auto [lo, hi] = scored_positions(*live.at(c.id), c);
    return lo == hi && (!c.sample || live.at(c.id)->sampler->plain_greedy());
  });
  if (batch.logit_rows.empty()) return;
  if (all_greedy) {
    batch.argmax_vocab = desc.n_vocab;
    pad();
    return;
  }
  // Otherwise, with no prompt scored this step (its rows need every logit), every row is drawn where the
  // logits are (ops::Sample): the step downloads tokens, not logits.
  if (!backend_samples || batch.logit_rows.size() != static_cast<size_t>(std::count_if(
                                                         plan.chunks.begin(), plan.chunks.end(),
                                                         [](const ScheduledChunk& c) { return c.sample; })))
    return;
  std::vector<Sampler*> constrained;  // the rows with a mask, in mask row order
  for (const ScheduledChunk& c : plan.chunks) {
    if (!c.sample) continue;
    Sampler& sampler = *live.at(c.id)->sampler;
    const int32_t mask_row = sampler.constrained() ? static_cast<int32_t>(constrained.size()) : -1;
    ops::SampleRow& row = batch.sample_rows.emplace_back();
    if (!sampler.next_row(scheduler->tokens(c.id), row, batch.sample_adjust, mask_row).ok()) {
      // A request whose row cannot be made: the step's logits come back, and sample() names its error.
      batch.sample_rows.clear();
      batch.sample_adjust.clear();
      return;
    }
    if (mask_row >= 0) constrained.push_back(&sampler);
    batch.sample_n_top = std::max(batch.sample_n_top, row.n_top);
  }
  batch.sample_vocab = desc.n_vocab;
  fill_masks(constrained);
  pad();
}

void Engine::Impl::pad() {
  if (spare_block < 0) return;  // a host backend, or layers on the host, which would compute the pads too
  // A verifying step (drafts beside the own tokens) too: it then replays the decode step of its padded size.
  const int32_t rows = backend->padded_rows(batch.n_tokens());
  if (rows > batch.n_tokens()) pad_decode(batch, rows, {&spare_block, 1});
}

void Engine::Impl::fill_masks(std::span<Sampler* const> samplers) {
  const size_t words = grammar::mask_words(desc.n_vocab);
  batch.sample_mask.resize(words * samplers.size());
  const auto fill = [&](size_t i) { samplers[i]->fill_mask({batch.sample_mask.data() + words * i, words}); };
  if (samplers.size() < 2) {
    for (size_t i = 0; i < samplers.size(); ++i) fill(i);
    return;
  }
  // A mask costs from microseconds to milliseconds (grammar::Matcher), and the rows of a step differ: the
  // threads take them one at a time.
  // At most kMaskThreads: a JSON grammar's mask takes about a microsecond, so more threads buy little and
  // their spinning after each step takes cores from the server's and the backend's threads.
  if (mask_pool == nullptr) mask_pool = std::make_unique<ThreadPool>(std::min(desc.n_threads, kMaskThreads));
  mask_pool->parallel_dynamic(static_cast<int64_t>(samplers.size()), 1, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) fill(static_cast<size_t>(i));
  });
}

ops::SampleOut Engine::Impl::sampled_row(size_t row) const {
  const size_t width = 2 + 2 * static_cast<size_t>(batch.sample_n_top);
  const int32_t* w = token_ids.data() + row * width;
  ops::SampleOut out;
  out.token = w[0];
  out.logprob = std::bit_cast<float>(w[1]);
  out.n_top = batch.sample_rows[row].n_top;
  for (int32_t j = 0; j < out.n_top; ++j) {
    out.top_id[j] = w[2 + 2 * j];
    out.top_logprob[j] = std::bit_cast<float>(w[3 + 2 * j]);
  }
  return out;
}

std::pair<int32_t, int32_t> Engine::Impl::scored_positions(const Seq& s, const ScheduledChunk& c) {
  const int32_t hi = std::min(c.start + c.n_tokens, s.n_prompt - 1);
  int32_t lo = hi;  // nothing asked for
  if (s.params.prompt_logprobs >= 0 && !s.prompt_lp_sent) {
    lo = c.start;
  } else if (s.prompt_logits) {
    lo = std::max(c.start, s.prompt_logits_next);
  }
  return {lo, std::max(lo, hi)};
}

Status Engine::Impl::score_prompt(Seq& s, int32_t position, std::span<const float> row_logits) {
  const int32_t next = scheduler->tokens(s.id)[static_cast<size_t>(position + 1)];
  KILN_ASSIGN_OR_RETURN(SampleResult r, score_token(row_logits, next, s.params.prompt_logprobs));
  s.prompt_lp[static_cast<size_t>(position)] = PromptLogprob{next, r.logprob, std::move(r.top)};
  return Status::ok_status();
}

void Engine::Impl::hand_over_prompt_logits(Seq& s, int32_t position, std::span<const float> row_logits) {
  if (!s.prompt_logits || position < s.prompt_logits_next) return;
  s.prompt_logits(position, row_logits);
  s.prompt_logits_next = position + 1;
}

void Engine::Impl::hand_over_prompt_logprobs(Seq& s, TokenEvent& ev) {
  if (s.params.prompt_logprobs < 0 || s.prompt_lp_sent) return;
  s.prompt_lp_sent = true;
  ev.prompt_logprobs = std::move(s.prompt_lp);
}

Status Engine::Impl::run_forward(Clock::time_point& launched) {
  // Rows of the model's n_vocab; sampling sees the tokenizer's first desc.n_vocab (HF embeddings are often
  // padded past the vocabulary). The logits stay in backend memory until read here: the step's one wait.
  auto out = model->forward(batch, *kv);
  launched = Clock::now();
  if (!out.ok()) return out.status();
  Backend& where = model->output_backend();
  if (batch.argmax_vocab > 0 || batch.sample_vocab > 0) return read_token_ids(where, *out, token_ids);
  return read_logits(where, *out, logits);
}

Result<SampleResult> Engine::Impl::host_token(Seq& s, size_t row) {
  if (batch.argmax_vocab > 0) {
    if (token_ids[row] < 0) return invalid_argument("the logits hold a NaN or +inf, or only -inf");
    return Sampler::greedy_result(token_ids[row]);
  }
  const auto stride = static_cast<size_t>(model->info().n_vocab);
  const std::span<const float> row_logits(logits.data() + row * stride, static_cast<size_t>(desc.n_vocab));
  return s.sampler->sample(row_logits, scheduler->tokens(s.id));
}

namespace {

// Prompt lookup: the tokens that followed the latest earlier occurrence of the last n tokens, for the largest
// n in [kNgramMin, kNgramMax] that occurred before; at most `max` of them. Where that occurrence is too
// recent for `max` tokens to follow it and `full`, the text is taken to repeat from it (the draft continues
// with its own first tokens): a draft is then `max` tokens or none, so that verifying steps come in few
// sizes (for a backend that replays steps, whose rows past a draft would be pads).
constexpr int32_t kNgramMin = 2, kNgramMax = 8;
std::vector<int32_t> ngram_draft(std::span<const int32_t> tokens, int32_t max, bool full) {
  const auto n_tokens = static_cast<int64_t>(tokens.size());
  for (int32_t n = kNgramMax; n >= kNgramMin; --n) {
    if (n_tokens <= n) continue;
    const auto suffix = tokens.subspan(static_cast<size_t>(n_tokens - n));
    for (int64_t i = n_tokens - n - 1; i >= 0; --i) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + i)) continue;
      const int64_t from = i + n, period = n_tokens - from;
      std::vector<int32_t> draft(static_cast<size_t>(full ? max : std::min<int64_t>(max, period)));
      const auto p = static_cast<size_t>(period);
      for (size_t k = 0; k < draft.size(); ++k)
        draft[k] = k < p ? tokens[static_cast<size_t>(from) + k] : draft[k - p];
      return draft;
    }
  }
  return {};
}

}  // namespace

void Engine::Impl::propose_drafts(bool decode_only) {
  std::vector<Seq*> seqs;
  for (auto& [id, s] : live) {
    s->draft.clear();
    seqs.push_back(s.get());
  }
  std::sort(seqs.begin(), seqs.end(), [](const Seq* a, const Seq* b) { return a->id < b->id; });
  const auto decoding = [&](const Seq& s) {
    return s.admitted && scheduler->contains(s.id) &&
           scheduler->n_computed(s.id) == static_cast<int32_t>(scheduler->tokens(s.id).size()) - 1;
  };
  // Who drafts, and how many tokens at most: the oldest decoding requests first, within the step's budget.
  // A decode step that the backend replays (a CUDA graph) up to some size keeps within it: past it the step
  // is launched op by op, which costs more than its drafts save.
  int32_t budget = Engine::kSpeculativeStepTokens;
  const int32_t replayed = backend->replayed_rows_max();
  if (decode_only && replayed > 0) {
    const auto n_decoding = static_cast<int32_t>(
        std::count_if(seqs.begin(), seqs.end(), [&](const Seq* s) { return decoding(*s); }));
    budget = std::clamp(replayed - n_decoding, 0, budget);
  }
  std::vector<DraftModel::Request> asks;
  std::vector<Seq*> askers;
  for (Seq* s : seqs) {
    if (budget == 0) break;
    // Any sampling: a row's token is drawn as without drafts (the same logits, history and draw index), so
    // keeping a draft only when the draw gives it keeps the request's tokens. Not for prompt scoring.
    if (!decoding(*s) || s->prompt_logits || (s->params.prompt_logprobs >= 0 && !s->prompt_lp_sent)) continue;
    const std::span<const int32_t> tokens = scheduler->tokens(s->id);
    const auto n_tokens = static_cast<int32_t>(tokens.size());
    // A draft never runs past the request's last token: its max_tokens, the context.
    const int32_t max = std::min(
        {options.draft_max, budget, s->params.max_tokens - s->stats.n_generated - 1, desc.n_ctx - n_tokens});
    if (max <= 0) continue;
    DraftModel::Request& a =
        asks.emplace_back(DraftModel::Request{.id = s->id, .tokens = tokens, .max = max, .draft = {}});
    askers.push_back(s);
    if (draft_model == nullptr)
      a.draft = ngram_draft(tokens, max, replayed > 0);  // costs nothing when it finds none
    budget -= draft_model == nullptr ? static_cast<int32_t>(a.draft.size()) : max;
  }
  if (draft_model != nullptr) {
    if (Status st = draft_model->propose(asks); !st.ok()) {
      log_error("engine: the draft model failed, no drafts this step: {}", st.message());
      return;
    }
  }
  for (size_t i = 0; i < asks.size(); ++i) {
    if (asks[i].draft.empty()) continue;
    askers[i]->draft = std::move(asks[i].draft);
    scheduler->set_draft(askers[i]->id, static_cast<int32_t>(askers[i]->draft.size()));
  }
}

void Engine::Impl::verify_drafts(const ScheduledChunk& c, size_t row) {
  Seq& s = *live.at(c.id);
  const std::vector<int32_t> draft(s.draft.begin(), s.draft.begin() + c.n_draft);
  delta.n_draft_tokens += static_cast<uint64_t>(c.n_draft);
  ++delta.n_drafts;
  for (int32_t k = 0; k <= c.n_draft; ++k) {
    Result<SampleResult> r = host_token(s, row + static_cast<size_t>(k));
    const bool kept = k < c.n_draft && r.ok() && r->token == draft[static_cast<size_t>(k)];
    delta.n_accepted_tokens += kept ? 1 : 0;
    emit(s, std::move(r), kept);  // may end the request
    if (!kept || !live.contains(c.id)) return;
  }
}

void Engine::Impl::emit(Seq& s, Result<SampleResult> sampled, bool drafted) {
  const uint64_t id = s.id;
  if (!sampled.ok()) return finish(id, FinishReason::error, sampled.status().message());
  const std::span<const int32_t> history = scheduler->tokens(id);
  const auto now = Clock::now();
  if (s.stats.n_generated == 0) {
    s.t_first = now;
    delta.ttft_ms.push_back(ms_between(s.t_submit, now));
  } else {
    delta.itl_ms.push_back(ms_between(s.t_last, now));
  }
  s.t_last = now;
  const int32_t tok = sampled->token;
  const auto n_tokens = static_cast<int32_t>(history.size()) + 1;  // with tok
  ++s.stats.n_generated;
  ++delta.n_generated_tokens;
  if (!s.params.ignore_eos && tokenizer->is_eog(tok)) return finish(id, FinishReason::stop, "");
  const std::vector<int32_t>& stop_ids = s.params.stop_token_ids;
  if (std::find(stop_ids.begin(), stop_ids.end(), tok) != stop_ids.end())
    return finish(id, FinishReason::stop, "");
  // A grammar's end ends the request, ignore_eos or not: an end token it accepted (not streamed), or a token
  // after which only an end token may follow (streamed, then the end; the draw of that end is saved).
  const bool grammar_end = s.sampler->grammar_done();
  if (grammar_end && tokenizer->is_eog(tok)) return finish(id, FinishReason::stop, "");
  auto text = s.decoder->feed(tok);
  if (!text.ok()) {
    // As vLLM does when detokenizing fails, the request ends with an error rather than streaming on with a
    // hole in its text: a client told finish_reason "error" knows the text is incomplete, a skipped token
    // would go unnoticed. (The sampler draws from the tokenizer's vocabulary, so this is a bug surfacing.)
    return finish(id, FinishReason::error,
                  fmt::format("sampled token {} cannot be decoded: {}", tok, text.status().message()));
  }
  TokenEvent ev;
  ev.token = tok;
  ev.logprob = sampled->logprob;
  ev.top = std::move(sampled->top);
  StopMatcher::StopResult r = s.stop->push(*text);
  ev.text = std::move(r.emit);
  hand_over_prompt_logprobs(s, ev);
  post(s, std::move(ev));
  if (r.stopped || grammar_end) return finish(id, FinishReason::stop, "");
  if (s.stats.n_generated >= s.params.max_tokens || n_tokens >= desc.n_ctx) {
    return finish(id, FinishReason::length, "");
  }
  if (drafted) {
    scheduler->accept_draft(id, tok);
  } else {
    scheduler->append_token(id, tok);
  }
}

void Engine::Impl::finish(uint64_t id, FinishReason reason, const std::string& error) {
  auto node = live.extract(id);
  KILN_ASSERT(!node.empty());
  Seq& s = *node.mapped();
  scheduler->finish(id);  // false when the plan ended it already
  if (draft_model != nullptr) draft_model->forget(id);
  TokenEvent ev;
  ev.done = true;
  ev.finish = reason;
  ev.error = error;
  if (reason != FinishReason::error && !s.stop->stopped())
    ev.text = s.stop->push(s.decoder->flush()).emit + s.stop->flush();
  const auto now = Clock::now();
  if (s.admitted) {
    s.stats.prefill_ms = ms_between(s.t_admit, s.stats.n_generated > 0 ? s.t_first : now);
    s.stats.decode_ms = s.stats.n_generated > 0 ? ms_between(s.t_first, now) : 0;
  }
  s.stats.finish = reason;
  ev.stats = s.stats;
  if (reason != FinishReason::error && reason != FinishReason::cancelled) hand_over_prompt_logprobs(s, ev);
  ++delta.n_finished;
  if (reason == FinishReason::stop || reason == FinishReason::length) {
    delta.e2e_ms.push_back(ms_between(s.t_submit, now));
  }
  post(s, std::move(ev));
  // `node` goes out of scope here: the request's sampler and decoder are released, its callback once the
  // delivery thread has run it for the last time.
}

void Engine::Impl::post(const Seq& s, TokenEvent ev) {
  Delivery& d = outbox.emplace_back();
  d.callback = s.callback;
  d.id = s.id;
  if (ev.done) d.outcome = s.outcome;
  d.event = std::move(ev);
}

void Engine::Impl::hand_over_events() {
  if (outbox.empty()) return;
  {
    std::lock_guard<std::mutex> lock(delivery_mu);
    if (deliveries.empty()) {
      deliveries.swap(outbox);
    } else {
      std::move(outbox.begin(), outbox.end(), std::back_inserter(deliveries));
      outbox.clear();
    }
  }
  delivery_cv.notify_one();
}

void Engine::Impl::deliver_loop() {
  std::vector<Delivery> batch_of_events;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(delivery_mu);
      delivery_cv.wait(lock, [&] { return delivery_stop || !deliveries.empty(); });
      if (deliveries.empty()) break;  // stopped, and nothing left
      batch_of_events.swap(deliveries);
    }
    for (Delivery& d : batch_of_events) {
      (*d.callback)(d.event);
      d.callback.reset();  // the final event's reset releases the request's callback
      if (!d.event.done) continue;
      {
        std::lock_guard<std::mutex> lock(mu);
        d.outcome->stats = d.event.stats;
        d.outcome->finished = true;
        --n_open;
        // Keep the stats of the last keep_finished finished requests for wait(); older ones are dropped.
        finished_ids.push_back(d.id);
        while (finished_ids.size() > static_cast<size_t>(options.keep_finished)) {
          auto old = outcomes.find(finished_ids.front());
          if (old != outcomes.end() && old->second->finished) outcomes.erase(old);
          finished_ids.pop_front();
        }
      }
      done_cv.notify_all();
    }
    batch_of_events.clear();
  }
}

bool Engine::Impl::on_engine_threads() const {
  const std::thread::id self = std::this_thread::get_id();
  return self == thread.get_id() || self == delivery_thread.get_id();
}

void Engine::Impl::publish_locked() {
  const BlockPool& pool = scheduler->kv_cache().pool();
  totals.n_running = scheduler->n_running();
  totals.n_waiting = scheduler->n_waiting();
  totals.kv_block_size = scheduler->kv_cache().block_size();
  totals.kv_blocks_total = pool.n_blocks();
  totals.kv_blocks_used = pool.n_used();
  totals.kv_blocks_cached = pool.n_cached();
  totals.kv_bytes_total = kv->bytes();
  totals.kv_bytes_used = static_cast<uint64_t>(pool.n_used()) * kv_block_bytes;
  totals.scratch_bytes = model->peak_scratch_bytes() + backend->scratch_bytes() +
                         (host_backend != nullptr ? host_backend->scratch_bytes() : 0);
  totals.prefix_cache_queries += delta.prefix_cache_queries;
  totals.prefix_cache_hits += delta.prefix_cache_hits;
  totals.n_prompt_tokens += delta.n_prompt_tokens;
  totals.n_cached_tokens += delta.n_cached_tokens;
  totals.n_generated_tokens += delta.n_generated_tokens;
  totals.n_preemptions += delta.n_preemptions;
  totals.n_queue_timeouts += delta.n_queue_timeouts;
  totals.n_draft_tokens += delta.n_draft_tokens;
  totals.n_accepted_tokens += delta.n_accepted_tokens;
  totals.n_drafts += delta.n_drafts;
  totals.n_finished += delta.n_finished;
  for (double v : delta.ttft_ms) ttft.push(v);
  for (double v : delta.itl_ms) itl.push(v);
  for (double v : delta.e2e_ms) e2e.push(v);
  delta = Delta{};
}

}  // namespace kiln
