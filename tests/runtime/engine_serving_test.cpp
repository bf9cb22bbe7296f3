// The Engine as a serving core, on the default model: a KV pool smaller than the requests need forces
// preemption, and every preempted request still gives the output it gives alone (prompt logits once per
// position, recomputed ones not repeated); a queued cancel does not
// wait for a slot; the queue limit and drain() refuse new work with resource_exhausted; metrics() counts
// tokens, preemptions, prefix-cache hits and latencies; cache salts separate prefix-cache namespaces;
// finished requests are released whether or not anyone waits for them; a callback that blocks does not hold
// up the engine's steps.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine_test_util.h"

namespace kiln {
namespace {

using test::collect;
using test::Collected;
using test::greedy;
using test::make_engine;

// Bytes of one KV block for these options (block size, type), from an engine that reports its pool.
uint64_t block_bytes(EngineOptions o) {
  auto probe = make_engine(o);
  return probe ? probe->model().kv_bytes / static_cast<uint64_t>(probe->model().kv_blocks) : 0;
}

// Spins until `cond` holds, or fails the test after 60 s.
template <class F>
void wait_until(F cond) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!cond()) {
    ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60));
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

TEST(EngineServing, PreemptedRequestsGiveTheirOutputAlone) {
  EngineOptions o;
  o.n_ctx = 32;
  o.n_seq_max = 3;
  o.kv_block_size = 4;
  const uint64_t bb = block_bytes(o);
  ASSERT_GT(bb, 0u);
  o.kv_memory_bytes = 12 * bb + bb / 2;  // 12 blocks (the half block is floored): 1.5 sequences of 32 tokens
  auto e = make_engine(o);
  ASSERT_NE(e, nullptr);
  ASSERT_EQ(e->model().kv_blocks, 12);
  const std::vector<std::string> prompts = {"Once upon a time", "The three primary colours are",
                                            "def fibonacci(n):"};
  constexpr int32_t kNew = 14;  // ~20 tokens = 5 blocks each: 15 blocks together
  std::vector<Collected> alone(prompts.size()), together(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto id = e->submit(greedy(prompts[i], kNew), collect(alone[i]));
    ASSERT_TRUE(id.ok()) << id.status().message();
    auto st = e->wait(*id);
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->n_preemptions, 0);
  }
  EXPECT_EQ(e->metrics().n_preemptions, 0u);
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto id = e->submit(greedy(prompts[i], kNew), collect(together[i]));
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  int n_preempted = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    auto st = e->wait(ids[i]);
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->finish, FinishReason::length) << together[i].error;
    EXPECT_EQ(together[i].tokens.size(), static_cast<size_t>(kNew));
    EXPECT_EQ(together[i].tokens, alone[i].tokens)
        << prompts[i] << " (preempted " << st->n_preemptions << "x)";
    EXPECT_EQ(together[i].text, alone[i].text);
    n_preempted += st->n_preemptions > 0 ? 1 : 0;
  }
  EXPECT_GT(n_preempted, 0);
  EXPECT_GE(e->metrics().n_preemptions, 1u);
  EXPECT_EQ(e->metrics().kv_blocks_used, 0);
}

TEST(EngineServing, PreemptedRequestsGiveEachPromptLogitOnce) {
  EngineOptions o;
  o.n_ctx = 32;
  o.n_seq_max = 3;
  o.kv_block_size = 4;
  const uint64_t bb = block_bytes(o);
  ASSERT_GT(bb, 0u);
  o.kv_memory_bytes = 12 * bb;  // 1.5 sequences of 32 tokens: the three requests below preempt one another
  auto e = make_engine(o);
  ASSERT_NE(e, nullptr);
  const std::vector<std::string> prompts = {"Once upon a time", "The three primary colours are",
                                            "def fibonacci(n):"};
  struct Seen {
    std::vector<int32_t> positions;
    std::vector<float> first_logit;  // logits[0] of each
    Collected events;
  };
  const auto submit = [&](size_t i, Seen& seen) {
    Request r = greedy(prompts[i], 14);  // ~20 tokens = 5 blocks each
    r.prompt_logits = [&seen](int32_t p, std::span<const float> logits) {
      seen.positions.push_back(p);
      seen.first_logit.push_back(logits[0]);
    };
    r.prompt_logits_from = 1;
    auto id = e->submit(r, collect(seen.events));
    EXPECT_TRUE(id.ok()) << id.status().message();
    return *id;
  };
  std::vector<Seen> alone(prompts.size()), together(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) ASSERT_TRUE(e->wait(submit(i, alone[i])).ok());
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < prompts.size(); ++i) ids.push_back(submit(i, together[i]));
  int n_preempted = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto st = e->wait(ids[i]);
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->finish, FinishReason::length) << together[i].events.error;
    n_preempted += st->n_preemptions > 0 ? 1 : 0;
    std::vector<int32_t> expected;
    for (int32_t p = 1; p < st->n_prompt - 1; ++p) expected.push_back(p);
    EXPECT_EQ(together[i].positions, expected) << i;
    EXPECT_EQ(together[i].first_logit, alone[i].first_logit) << i;  // the CPU is batch-invariant
    EXPECT_EQ(together[i].events.tokens, alone[i].events.tokens) << i;
  }
  EXPECT_GT(n_preempted, 0);
}

TEST(EngineServing, RequestsLargerThanThePoolAreErrors) {
  EngineOptions o;
  o.n_ctx = 64;
  o.kv_block_size = 4;
  o.kv_memory_bytes = 2 * block_bytes(o);  // 8 tokens
  auto e = make_engine(o);
  ASSERT_NE(e, nullptr);
  auto refused = e->submit(greedy("one two three four five six seven eight nine ten", 4), nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("the KV cache holds 8"), std::string::npos)
      << refused.status().message();
  Collected c;
  auto id = e->submit(greedy("Hello there", 20), collect(c));  // fits, then outgrows the pool
  ASSERT_TRUE(id.ok()) << id.status().message();
  auto st = e->wait(*id);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->finish, FinishReason::error);
  EXPECT_NE(c.error.find("holds 8 tokens (2 x 4-token blocks)"), std::string::npos) << c.error;
  EXPECT_NE(c.error.find("--kv-memory"), std::string::npos) << c.error;
  EXPECT_GT(st->n_generated, 0);
  // Too small for a single block is an error at creation.
  o.kv_memory_bytes = 100;
  o.model_path = test::model_path();
  auto none = Engine::create(o);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("kv_memory_bytes = 100 (--kv-memory) holds no KV block"),
            std::string::npos);
}

// Two long requests fill both slots; one long request behind them.
struct Busy {
  std::atomic<int> tokens[2] = {0, 0};
  std::atomic<int> done{0};
  std::vector<uint64_t> ids;
  void start(Engine& e, int n) {
    for (int i = 0; i < n; ++i) {
      auto id = e.submit(greedy("Count from one to one hundred:", 200), [this, i](const TokenEvent& ev) {
        if (ev.token >= 0) ++tokens[i];
        if (ev.done) ++done;
      });
      ASSERT_TRUE(id.ok());
      ids.push_back(*id);
    }
    wait_until([&] { return tokens[0] > 0 && (n < 2 || tokens[1] > 0); });
  }
  void stop(Engine& e) {
    for (uint64_t id : ids) e.cancel(id);
    for (uint64_t id : ids) EXPECT_EQ(e.wait(id)->finish, FinishReason::cancelled);
  }
};

TEST(EngineServing, QueuedCancelDoesNotWaitForASlot) {
  EngineOptions o;
  o.n_ctx = 256;
  o.n_seq_max = 2;
  auto e = make_engine(o);
  ASSERT_NE(e, nullptr);
  Busy busy;
  busy.start(*e, 2);
  Collected q;
  auto id = e->submit(greedy("Hello", 5), collect(q));
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(e->metrics().n_waiting, 1);
  e->cancel(*id);
  auto st = e->wait(*id);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(busy.done.load(), 0);  // both slots are still taken: the cancel did not wait for one
  EXPECT_EQ(st->finish, FinishReason::cancelled);
  EXPECT_EQ(st->n_generated, 0);
  EXPECT_EQ(q.finals, 1);
  EXPECT_TRUE(q.tokens.empty());
  EXPECT_EQ(e->metrics().n_running, 2);
  EXPECT_EQ(e->metrics().n_waiting, 0);
  busy.stop(*e);
}

TEST(EngineServing, QueueLimitRejectsWithResourceExhausted) {
  EngineOptions o;
  o.n_ctx = 256;
  o.max_queued = 1;
  auto e = make_engine(o);
  ASSERT_NE(e, nullptr);
  Busy busy;
  busy.start(*e, 1);  // running: not queued
  auto queued = e->submit(greedy("Hello", 4), nullptr);
  ASSERT_TRUE(queued.ok()) << queued.status().message();
  auto full = e->submit(greedy("Hello", 4), nullptr);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), StatusCode::resource_exhausted);
  EXPECT_NE(full.status().message().find("max_queued = 1"), std::string::npos) << full.status().message();
  EngineMetrics m = e->metrics();
  EXPECT_EQ(m.n_waiting, 1);
  EXPECT_EQ(m.n_running, 1);
  EXPECT_EQ(m.n_rejected, 1u);
  // Room again once the queued one is gone.
  e->cancel(*queued);
  EXPECT_EQ(e->wait(*queued)->finish, FinishReason::cancelled);
  auto again = e->submit(greedy("Hello", 4), nullptr);
  ASSERT_TRUE(again.ok()) << again.status().message();
  e->cancel(*again);
  busy.stop(*e);
  EngineOptions bad = o;
  bad.max_queued = -1;
  bad.model_path = test::model_path();
  EXPECT_NE(Engine::create(bad).status().message().find("max_queued = -1"), std::string::npos);
}

// Request::on_admitted: once, at the first admission and before the first event; never for a request that
// ends in the queue. (The server releases a request's queue charge with it.)
TEST(EngineServing, OnAdmittedComesOnceBeforeTheFirstEventAndNotForAQueuedCancel) {
  EngineOptions o;
  o.n_ctx = 256;
  o.n_seq_max = 1;
  auto e = make_engine(o);
  ASSERT_NE(e, nullptr);
  Busy busy;
  busy.start(*e, 1);
  std::atomic<int> admitted_queued{0}, admitted{0}, events_before{0};
  Request queued = greedy("Hello", 4);
  queued.on_admitted = [&] { ++admitted_queued; };
  auto qid = e->submit(queued, nullptr);
  ASSERT_TRUE(qid.ok());
  e->cancel(*qid);
  EXPECT_EQ(e->wait(*qid)->finish, FinishReason::cancelled);
  EXPECT_EQ(admitted_queued.load(), 0);
  int events = 0;
  Request r = greedy("Once upon a time", 3);
  r.on_admitted = [&] {
    events_before = events;
    ++admitted;
  };
  auto id = e->submit(r, [&](const TokenEvent&) { ++events; });
  ASSERT_TRUE(id.ok());
  busy.stop(*e);
  EXPECT_EQ(e->wait(*id)->finish, FinishReason::length);
  EXPECT_EQ(admitted.load(), 1);
  EXPECT_EQ(events_before.load(), 0);
  EXPECT_EQ(events, 4);  // 3 tokens and the final event
}

// The gauges max_queued counts are published as soon as a plan is made: a request admitted by this step no
// longer counts as waiting when its own first token arrives, so the one slot of the queue is free.
TEST(EngineServing, AnAdmittedRequestLeavesTheQueueBeforeItsFirstToken) {
  EngineOptions o;
  o.n_ctx = 128;
  o.max_queued = 1;
  auto e = make_engine(o);
  ASSERT_NE(e, nullptr);
  Result<uint64_t> from_callback = Status(StatusCode::internal, "not called");
  EngineMetrics seen;
  bool asked = false;
  auto first = e->submit(greedy("Once upon a time", 12), [&](const TokenEvent& ev) {
    if (asked || ev.token < 0) return;
    asked = true;
    seen = e->metrics();
    from_callback = e->submit(greedy("Hello", 2), nullptr);  // while `first` runs
  });
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(e->wait(*first)->finish, FinishReason::length);
  EXPECT_EQ(seen.n_running, 1);
  EXPECT_EQ(seen.n_waiting, 0);
  ASSERT_TRUE(from_callback.ok()) << from_callback.status().message();
  EXPECT_EQ(e->wait(*from_callback)->finish, FinishReason::length);
  EXPECT_EQ(e->metrics().n_rejected, 0u);
}

// The final event carries what wait() returns, so a caller that only streams (a server) needs no wait().
TEST(EngineServing, TheFinalEventCarriesTheRequestStats) {
  EngineOptions o;
  o.n_ctx = 128;
  auto e = make_engine(o);
  ASSERT_NE(e, nullptr);
  RequestStats from_event;
  int finals = 0;
  auto id = e->submit(greedy("Once upon a time", 5), [&](const TokenEvent& ev) {
    if (!ev.done) {
      EXPECT_EQ(ev.stats.n_generated, 0);  // only the final event has them
      return;
    }
    ++finals;
    from_event = ev.stats;
  });
  ASSERT_TRUE(id.ok());
  auto st = e->wait(*id);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(finals, 1);
  EXPECT_EQ(from_event.n_prompt, st->n_prompt);
  EXPECT_EQ(from_event.n_generated, 5);
  EXPECT_EQ(from_event.n_cached, st->n_cached);
  EXPECT_EQ(from_event.prefill_ms, st->prefill_ms);
  EXPECT_EQ(from_event.decode_ms, st->decode_ms);
  EXPECT_EQ(from_event.finish, FinishReason::length);
}

TEST(EngineServing, DrainFinishesWhatItHasAndRefusesMore) {
  EngineOptions o;
  o.n_ctx = 128;
  auto e = make_engine(o);
  ASSERT_NE(e, nullptr);
  Collected a, b;
  Status from_callback;
  bool asked = false;
  auto ia = e->submit(greedy("Once upon a time", 6), [&](const TokenEvent& ev) {
    collect(a)(ev);
    if (!asked) {
      asked = true;
      from_callback = e->drain();  // the callbacks' thread cannot wait for itself
    }
  });
  auto ib = e->submit(greedy("Hello", 6), collect(b));  // queued behind a (n_seq_max 1)
  ASSERT_TRUE(ia.ok() && ib.ok());
  ASSERT_TRUE(e->drain().ok());
  EXPECT_EQ(from_callback.code(), StatusCode::invalid_argument);
  EXPECT_EQ(a.finals, 1);
  EXPECT_EQ(b.finals, 1);
  EXPECT_EQ(a.tokens.size(), 6u);
  EXPECT_EQ(b.tokens.size(), 6u);
  EngineMetrics m = e->metrics();
  EXPECT_TRUE(m.draining);
  EXPECT_EQ(m.n_running, 0);
  EXPECT_EQ(m.n_waiting, 0);
  auto refused = e->submit(greedy("Hello", 2), nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::resource_exhausted);
  EXPECT_NE(refused.status().message().find("draining"), std::string::npos);
  EXPECT_EQ(e->metrics().n_rejected, 1u);
  EXPECT_TRUE(e->drain().ok());             // nothing left: returns at once
  EXPECT_EQ(e->wait(*ib)->n_generated, 6);  // stats outlive the drain
}

std::vector<int32_t> token_run(int32_t n, int32_t start) {
  std::vector<int32_t> v;
  for (int32_t i = 0; i < n; ++i) v.push_back(start + 7 * i);
  return v;
}

TEST(EngineServing, MetricsCountTokensBlocksAndLatencies) {
  EngineOptions o;
  o.n_ctx = 256;
  auto e = make_engine(o);
  ASSERT_NE(e, nullptr);
  const EngineMetrics m0 = e->metrics();
  EXPECT_EQ(m0.kv_blocks_total, e->model().kv_blocks);
  EXPECT_EQ(m0.kv_bytes_total, e->model().kv_bytes);
  EXPECT_EQ(m0.kv_block_size, 16);
  EXPECT_EQ(m0.kv_blocks_total, 16);  // the default budget on a machine with room: n_seq_max x n_ctx
  Request r;
  r.prompt_tokens = token_run(20, 1000);
  r.sampling.temperature = 0;
  r.sampling.max_tokens = 5;
  r.sampling.ignore_eos = true;
  auto id = e->submit(r, nullptr);
  ASSERT_TRUE(id.ok());
  auto st = e->wait(*id);
  ASSERT_TRUE(st.ok());
  EXPECT_GE(st->queue_ms, 0);
  const EngineMetrics m1 = e->metrics();
  EXPECT_EQ(m1.n_prompt_tokens - m0.n_prompt_tokens, 20u);
  EXPECT_EQ(m1.n_generated_tokens - m0.n_generated_tokens, 5u);
  EXPECT_EQ(m1.prefix_cache_queries - m0.prefix_cache_queries, 20u);
  EXPECT_EQ(m1.n_finished - m0.n_finished, 1u);
  EXPECT_EQ(m1.ttft_ms.size() - m0.ttft_ms.size(), 1u);
  EXPECT_EQ(m1.itl_ms.size() - m0.itl_ms.size(), 4u);
  EXPECT_EQ(m1.e2e_ms.size() - m0.e2e_ms.size(), 1u);
  for (double v : m1.ttft_ms) EXPECT_GT(v, 0);
  for (double v : m1.itl_ms) EXPECT_GT(v, 0);
  EXPECT_GE(m1.e2e_ms.back(), m1.ttft_ms.back());
  EXPECT_EQ(m1.kv_blocks_used, 0);
  EXPECT_EQ(m1.kv_blocks_cached, 1);  // the prompt's one full block waits for reuse
  // While a request runs it holds blocks, and their bytes.
  Busy busy;
  busy.start(*e, 1);
  const EngineMetrics m2 = e->metrics();
  EXPECT_EQ(m2.n_running, 1);
  EXPECT_GE(m2.kv_blocks_used, 1);
  EXPECT_EQ(m2.kv_bytes_used, m2.kv_bytes_total / 16 * static_cast<uint64_t>(m2.kv_blocks_used));
  busy.stop(*e);
}

TEST(EngineServing, CacheSaltSeparatesPrefixNamespaces) {
  EngineOptions o;
  o.n_ctx = 256;
  auto e = make_engine(o);
  ASSERT_NE(e, nullptr);
  const EngineMetrics m0 = e->metrics();
  std::vector<std::vector<int32_t>> outputs;
  auto run = [&](const std::string& salt) {
    Request r;
    r.prompt_tokens = token_run(40, 3000);  // 2 full blocks before the last token's
    r.sampling.temperature = 0;
    r.sampling.max_tokens = 2;
    r.sampling.ignore_eos = true;
    r.cache_salt = salt;
    Collected c;
    auto id = e->submit(r, collect(c));
    EXPECT_TRUE(id.ok());
    auto st = e->wait(*id);
    outputs.push_back(c.tokens);
    return st.ok() ? st->n_cached : -1;
  };
  EXPECT_EQ(run("alpha"), 0);
  EXPECT_EQ(run("alpha"), 32);
  EXPECT_EQ(run("beta"), 0);
  EXPECT_EQ(run(""), 0);
  EXPECT_EQ(run(""), 32);
  EXPECT_EQ(run("beta"), 32);
  const EngineMetrics m1 = e->metrics();
  EXPECT_EQ(m1.prefix_cache_hits - m0.prefix_cache_hits, 96u);
  EXPECT_EQ(m1.prefix_cache_queries - m0.prefix_cache_queries, 240u);
  EXPECT_EQ(m1.n_cached_tokens - m0.n_cached_tokens, 96u);
  for (const auto& out : outputs) EXPECT_EQ(out, outputs[0]);  // a prefix hit changes no token
}

TEST(EngineServing, FinishedRequestsAreReleasedWithoutWait) {
  EngineOptions o;
  o.n_ctx = 8;
  o.kv_block_size = 8;
  o.n_seq_max = 16;
  o.keep_finished = 4;
  auto e = make_engine(o);
  ASSERT_NE(e, nullptr);
  constexpr size_t kN = 12;
  auto marker = std::make_shared<int>(0);  // every callback holds a copy until the engine releases it
  std::atomic<size_t> done{0};
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < kN; ++i) {
    Request r;
    r.prompt_tokens = {static_cast<int32_t>(100 + i)};
    r.sampling.max_tokens = 0;  // prefill only: one step each
    auto id = e->submit(r, [marker, &done](const TokenEvent& ev) {
      if (ev.done) ++done;
    });
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  wait_until([&] { return done.load() == kN && marker.use_count() == 1; });
  // The newest keep_finished keep their stats for wait(); older ones are gone.
  for (size_t i = 0; i < kN - 4; ++i) {
    auto gone = e->wait(ids[i]);
    ASSERT_FALSE(gone.ok()) << i;
    EXPECT_EQ(gone.status().code(), StatusCode::not_found);
    EXPECT_NE(gone.status().message().find("keep_finished"), std::string::npos);
  }
  for (size_t i = kN - 4; i < kN; ++i) {
    auto kept = e->wait(ids[i]);
    ASSERT_TRUE(kept.ok()) << i;
    EXPECT_EQ(kept->finish, FinishReason::length);
    EXPECT_FALSE(e->wait(ids[i]).ok());  // taken
  }
  EXPECT_EQ(e->metrics().n_finished, kN);
  // A waiter blocked on a request keeps its stats even when the request drops out of the kept window.
  o.keep_finished = 0;
  auto z = make_engine(o);
  ASSERT_NE(z, nullptr);
  auto id = z->submit(greedy("Hello", 3), [](const TokenEvent& ev) {
    // Hold the final callback a moment, so that wait() below is surely blocked before the request ends.
    if (ev.done) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  });
  ASSERT_TRUE(id.ok());
  auto st = z->wait(*id);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->n_generated, 3);
}

// The engine does not wait for its callbacks: while one blocks, the request's steps go on to its end; its
// events then arrive in order, and wait() returns after the final one. A callback cannot wait() for a request
// that has not finished (it would wait for itself).
TEST(EngineServing, ABlockedCallbackDoesNotHoldUpTheSteps) {
  EngineOptions o;
  o.n_ctx = 128;
  auto e = make_engine(o);
  ASSERT_NE(e, nullptr);
  std::atomic<uint64_t> self{0};
  std::atomic<bool> release{false};
  std::atomic<int> n_tokens{0}, finals{0};
  Status waited = Status::ok_status();
  auto id = e->submit(greedy("Once upon a time", 8), [&](const TokenEvent& ev) {
    if (ev.done) {
      ++finals;
      return;
    }
    if (++n_tokens > 1) return;
    while (self.load() == 0) std::this_thread::yield();  // submit() has returned the id
    waited = e->wait(self.load()).status();
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  ASSERT_TRUE(id.ok());
  self = *id;
  wait_until([&] { return e->metrics().n_finished == 1; });  // all 8 tokens made, the first callback held
  EXPECT_EQ(n_tokens.load(), 1);
  EXPECT_EQ(finals.load(), 0);
  EXPECT_EQ(e->metrics().n_generated_tokens, 8u);
  release = true;
  auto st = e->wait(*id);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->finish, FinishReason::length);
  EXPECT_EQ(n_tokens.load(), 8);
  EXPECT_EQ(finals.load(), 1);
  EXPECT_EQ(waited.code(), StatusCode::invalid_argument);
  EXPECT_NE(waited.message().find("called from a callback"), std::string::npos) << waited.message();
}

}  // namespace
}  // namespace kiln
