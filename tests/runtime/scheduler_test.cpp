// The scheduler driven by a fake model (no weights). The fake keeps a simulated K/V storage — each slot holds
// the (token, position) written there through the block table — and its next token is a hash of everything a
// sequence reads back, so a wrong block table, a stale block or a recompute that missed a token changes the
// output. Covered: admission by free blocks (FCFS, no overtaking), chunked prefill under the token budget,
// preemption of the newest request and its resume with the same output, cancellation of queued and running
// requests, requests too large for the cache, prefix-cache salts, and fairness under a flood (requests that
// arrive later never make an earlier one finish later), and priorities (lower first, FCFS among equals, a
// waiting request preempting a running one it outranks, block shortage preempting the last-ranked).
#include "runtime/scheduler/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <vector>

namespace kiln {
namespace {

std::vector<int32_t> prompt_of(int32_t n, int32_t start) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

// Plays one step's plan: writes every chunk's tokens into the simulated storage, then samples each chunk with
// `sample` set from what its sequence reads back. Returns (id, token) per sampled chunk, in plan order.
class FakeModel {
 public:
  FakeModel(int32_t n_blocks, int32_t block_size)
      : block_size_(block_size), slots_(static_cast<size_t>(n_blocks) * block_size, Slot{}) {}

  std::vector<std::pair<uint64_t, int32_t>> run(const Scheduler& s, const StepPlan& plan) {
    std::vector<std::pair<uint64_t, int32_t>> out;
    for (const auto& [id, rows] : run_rows(s, plan, {})) out.emplace_back(id, rows[0]);
    return out;
  }

  // With draft tokens (drafts[id], the chunk's last n_draft positions): each sampled chunk's token of every
  // row, its own and then one after each draft.
  std::vector<std::pair<uint64_t, std::vector<int32_t>>> run_rows(
      const Scheduler& s, const StepPlan& plan, const std::map<uint64_t, std::vector<int32_t>>& drafts) {
    for (const ScheduledChunk& c : plan.chunks) {
      const std::span<const int32_t> table = s.block_table(c.id);
      const int32_t first_draft = c.start + c.n_tokens - c.n_draft;
      for (int32_t p = c.start; p < c.start + c.n_tokens; ++p) {
        const int32_t token = p < first_draft ? s.tokens(c.id)[p] : drafts.at(c.id)[p - first_draft];
        slot(table, p) = {token, p};
      }
    }
    std::vector<std::pair<uint64_t, std::vector<int32_t>>> out;
    for (const ScheduledChunk& c : plan.chunks) {
      if (!c.sample) continue;
      const std::span<const int32_t> table = s.block_table(c.id);
      std::vector<int32_t> rows;
      uint64_t h = 1469598103934665603ull;
      for (int32_t p = 0; p < c.start + c.n_tokens; ++p) {
        const Slot& sl = slot(table, p);
        EXPECT_EQ(sl.pos, p) << "request " << c.id << " reads a slot written for another position";
        h = (h ^ static_cast<uint64_t>(sl.token + 7 * p)) * 1099511628211ull;
        if (p >= c.start + c.n_tokens - c.n_draft - 1) rows.push_back(static_cast<int32_t>(h % 1000) + 1000);
      }
      out.emplace_back(c.id, std::move(rows));
    }
    return out;
  }

 private:
  struct Slot {
    int32_t token = -1;
    int32_t pos = -1;
  };
  Slot& slot(std::span<const int32_t> table, int32_t p) {
    const int32_t b = table[p / block_size_];
    return slots_[static_cast<size_t>(b) * block_size_ + p % block_size_];
  }
  int32_t block_size_;
  std::vector<Slot> slots_;  // [n_blocks * block_size]
};

// A scheduler, a fake model and the engine's part: append each sampled token, finish at max_new tokens.
struct Sim {
  Sim(int32_t n_blocks, int32_t block_size, SchedulerOptions o)
      : sched(Scheduler::create(o, KvCache(n_blocks, block_size)).value()), model(n_blocks, block_size) {}

  void add(uint64_t id, std::vector<int32_t> prompt, int32_t max_new, std::string salt = {},
           int32_t priority = 0) {
    ASSERT_TRUE(sched.add(id, std::move(prompt), std::move(salt), true, priority).ok());
    max_new_[id] = max_new;
  }

  StepPlan step() {
    StepPlan plan = sched.schedule();
    EXPECT_TRUE(sched.check_invariants().ok()) << sched.check_invariants().to_string();
    EXPECT_LE(plan.n_tokens(), sched.options().max_batch_tokens);
    for (const auto& e : plan.ended) ended[e.id] = e;
    n_preempted += static_cast<int32_t>(plan.preempted.size());
    const auto sampled = model.run(sched, plan);
    sched.commit(plan);
    for (auto [id, tok] : sampled) {
      out[id].push_back(tok);
      if (static_cast<int32_t>(out[id].size()) == max_new_[id]) {
        EXPECT_TRUE(sched.finish(id));
        finish_step[id] = n_steps;
      } else {
        sched.append_token(id, tok);
      }
    }
    EXPECT_TRUE(sched.check_invariants().ok()) << sched.check_invariants().to_string();
    ++n_steps;
    return plan;
  }

  void run(int32_t max_steps = 10000) {
    while (sched.has_work() && n_steps < max_steps) step();
    EXPECT_FALSE(sched.has_work()) << "still busy after " << max_steps << " steps";
  }

  Scheduler sched;
  FakeModel model;
  int32_t n_steps = 0, n_preempted = 0;
  std::map<uint64_t, std::vector<int32_t>> out;  // sampled tokens per request
  std::map<uint64_t, int32_t> finish_step;
  std::map<uint64_t, EndedRequest> ended;

 private:
  std::map<uint64_t, int32_t> max_new_;
};

SchedulerOptions opts(int32_t max_running, int32_t max_batch_tokens) {
  SchedulerOptions o;
  o.max_running = max_running;
  o.max_batch_tokens = max_batch_tokens;
  return o;
}

std::vector<uint64_t> ids_of(const StepPlan& p) {
  std::vector<uint64_t> v;
  for (const auto& c : p.chunks) v.push_back(c.id);
  return v;
}

TEST(Scheduler, CreateRejectsBadOptions) {
  EXPECT_NE(Scheduler::create(opts(0, 8), KvCache(4, 4)).status().message().find("max_running = 0"),
            std::string::npos);
  EXPECT_NE(Scheduler::create(opts(1, 0), KvCache(4, 4)).status().message().find("max_batch_tokens = 0"),
            std::string::npos);
  Sim sim(4, 4, opts(1, 8));
  EXPECT_EQ(sim.sched.add(1, {}).code(), StatusCode::invalid_argument);
  ASSERT_TRUE(sim.sched.add(1, {5}).ok());
  EXPECT_EQ(sim.sched.add(1, {5}).code(), StatusCode::invalid_argument);
  EXPECT_FALSE(sim.sched.cancel(99));
  EXPECT_FALSE(sim.sched.finish(99));
}

TEST(Scheduler, AdmitsByFreeBlocksInArrivalOrder) {
  Sim sim(8, 4, opts(4, 64));       // 8 blocks of 4 tokens
  sim.add(1, prompt_of(10, 0), 2);  // 3 blocks each
  sim.add(2, prompt_of(10, 100), 2);
  sim.add(3, prompt_of(10, 200), 2);
  sim.add(4, prompt_of(2, 300), 2);  // 1 block: would fit, but must not overtake 3
  StepPlan p = sim.step();
  ASSERT_EQ(p.admitted.size(), 2u);
  EXPECT_EQ(p.admitted[0].id, 1u);
  EXPECT_EQ(p.admitted[1].id, 2u);
  EXPECT_EQ(ids_of(p), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(sim.sched.n_running(), 2);
  EXPECT_EQ(sim.sched.n_waiting(), 2);  // a slot is free, the blocks are not
  EXPECT_EQ(sim.sched.kv_cache().pool().n_used(), 6);
  p = sim.step();  // decodes of 1 and 2; both finish (max_new 2)
  EXPECT_TRUE(p.admitted.empty());
  EXPECT_EQ(sim.finish_step.size(), 2u);
  p = sim.step();  // blocks are back: 3 then 4
  ASSERT_EQ(p.admitted.size(), 2u);
  EXPECT_EQ(p.admitted[0].id, 3u);
  EXPECT_EQ(p.admitted[1].id, 4u);
  sim.run();
  EXPECT_EQ(sim.out.size(), 4u);
  // A slot limit holds as well as the block limit.
  Sim one(64, 4, opts(1, 64));
  one.add(1, prompt_of(3, 0), 3);
  one.add(2, prompt_of(3, 50), 3);
  p = one.step();
  EXPECT_EQ(ids_of(p), (std::vector<uint64_t>{1}));
  EXPECT_EQ(one.sched.n_waiting(), 1);
}

TEST(Scheduler, ChunksPrefillsUnderTheTokenBudgetAndDecodesFirst) {
  Sim sim(64, 4, opts(4, 8));
  sim.add(1, prompt_of(21, 0), 4);
  std::vector<std::pair<int32_t, int32_t>> chunks;  // (start, n) of request 1
  for (int i = 0; i < 3; ++i) {
    StepPlan p = sim.step();
    ASSERT_EQ(p.chunks.size(), 1u);
    chunks.emplace_back(p.chunks[0].start, p.chunks[0].n_tokens);
    EXPECT_EQ(p.chunks[0].sample, i == 2);  // logits only once the prompt is complete
  }
  EXPECT_EQ(chunks, (std::vector<std::pair<int32_t, int32_t>>{{0, 8}, {8, 8}, {16, 5}}));
  ASSERT_EQ(sim.out[1].size(), 1u);
  // A long prompt arrives while 1 decodes: the decode goes first, the prefill gets the rest of the budget.
  sim.add(2, prompt_of(30, 100), 2);
  StepPlan p = sim.step();
  ASSERT_EQ(p.chunks.size(), 2u);
  EXPECT_EQ(p.chunks[0].id, 1u);
  EXPECT_EQ(p.chunks[0].n_tokens, 1);
  EXPECT_EQ(p.chunks[1].id, 2u);
  EXPECT_EQ(p.chunks[1].n_tokens, 7);
  EXPECT_FALSE(p.chunks[1].sample);
  // An older request's decode goes before a newer one's, and the older prefill before the newer prefill.
  sim.add(3, prompt_of(30, 200), 2);
  p = sim.step();
  EXPECT_EQ(ids_of(p), (std::vector<uint64_t>{1, 2}));  // 1 decodes, 2 takes the remaining 7 tokens
  EXPECT_EQ(p.n_tokens(), 8);
  sim.run();
  EXPECT_EQ(sim.out[2].size(), 2u);
  EXPECT_EQ(sim.out[3].size(), 2u);
}

// Outputs of requests run one at a time in a cache large enough: the oracle for batched and preempted runs.
std::map<uint64_t, std::vector<int32_t>> alone(const std::vector<std::vector<int32_t>>& prompts,
                                               int32_t max_new) {
  std::map<uint64_t, std::vector<int32_t>> out;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Sim sim(256, 4, opts(1, 512));
    sim.add(i + 1, prompts[i], max_new);
    sim.run();
    out[i + 1] = sim.out[i + 1];
  }
  return out;
}

TEST(Scheduler, PreemptsTheNewestAndResumesWithTheSameOutput) {
  const std::vector<std::vector<int32_t>> prompts = {prompt_of(6, 0), prompt_of(6, 100), prompt_of(6, 200)};
  const auto expected = alone(prompts, 20);  // 26 tokens each: 7 blocks of 4
  Sim sim(12, 4, opts(3, 16));               // room for fewer than two
  for (size_t i = 0; i < prompts.size(); ++i) sim.add(i + 1, prompts[i], 20);
  bool resumed = false;
  std::vector<uint64_t> last_preempted;
  while (sim.sched.has_work()) {
    ASSERT_LT(sim.n_steps, 1000);
    const auto out_before = sim.out;
    StepPlan p = sim.step();
    for (uint64_t v : p.preempted) {
      // The victim is newer than every request still running, and becomes the head of the queue.
      for (const auto& c : p.chunks) EXPECT_LT(c.id, v);
      EXPECT_FALSE(sim.sched.contains(v) && sim.sched.n_computed(v) != 0);
    }
    EXPECT_TRUE(p.preempted.empty() || p.admitted.empty());  // a step that preempted admits nobody
    if (!last_preempted.empty() && !p.admitted.empty()) {
      // The first admission after a preemption takes the request preempted last (the head of the queue).
      EXPECT_EQ(p.admitted[0].id, last_preempted.back());
      EXPECT_FALSE(p.admitted[0].first_time);
      // Recomputed from prompt + generated tokens, minus what the prefix cache still holds.
      EXPECT_EQ(p.admitted[0].n_looked_up, 6 + static_cast<int32_t>(out_before.at(p.admitted[0].id).size()));
      resumed = true;
      last_preempted.clear();
    }
    if (!p.preempted.empty()) last_preempted = p.preempted;
  }
  EXPECT_GT(sim.n_preempted, 0);
  EXPECT_TRUE(resumed);
  EXPECT_EQ(sim.out, expected);
  EXPECT_EQ(sim.sched.kv_cache().pool().n_used(), 0);
}

TEST(Scheduler, PriorityAdmitsLowerValuesFirstAndFcfsAmongEquals) {
  const std::vector<std::vector<int32_t>> prompts = {prompt_of(5, 0), prompt_of(5, 100), prompt_of(5, 200),
                                                     prompt_of(5, 300), prompt_of(5, 400)};
  const auto expected = alone(prompts, 8);
  Sim sim(64, 4, opts(1, 16));  // one slot, blocks to spare
  sim.add(1, prompts[0], 8);    // priority 0, running from the first step
  sim.step();
  sim.add(2, prompts[1], 8, "", 3);
  sim.add(3, prompts[2], 8, "", 0);
  sim.add(4, prompts[3], 8, "", 3);
  sim.add(5, prompts[4], 8, "", -2);  // outranks the running request 1
  StepPlan p = sim.step();
  EXPECT_EQ(p.preempted, std::vector<uint64_t>{1});
  ASSERT_EQ(p.admitted.size(), 1u);
  EXPECT_EQ(p.admitted[0].id, 5u);
  sim.run();
  // 5 first (it preempted 1), then 1 (resumed: it arrived before 3), 3, then the two of priority 3 in order.
  std::vector<uint64_t> order = {1, 2, 3, 4, 5};
  std::sort(order.begin(), order.end(),
            [&](uint64_t a, uint64_t b) { return sim.finish_step.at(a) < sim.finish_step.at(b); });
  EXPECT_EQ(order, (std::vector<uint64_t>{5, 1, 3, 2, 4}));
  EXPECT_EQ(sim.out, expected);  // the preempted request resumed with the output it has alone
}

TEST(Scheduler, BlockShortagePreemptsTheLastRankedNotTheNewest) {
  const std::vector<std::vector<int32_t>> prompts = {prompt_of(6, 0), prompt_of(6, 100)};
  const auto expected = alone(prompts, 20);  // 26 tokens each: 7 blocks of 4
  Sim sim(12, 4, opts(2, 16));               // room for fewer than two
  sim.add(1, prompts[0], 20, "", 5);         // older, but ranked after 2
  sim.add(2, prompts[1], 20, "", 1);
  std::vector<uint64_t> victims;
  while (sim.sched.has_work()) {
    ASSERT_LT(sim.n_steps, 1000);
    StepPlan p = sim.step();
    victims.insert(victims.end(), p.preempted.begin(), p.preempted.end());
  }
  ASSERT_FALSE(victims.empty());
  for (uint64_t v : victims) EXPECT_EQ(v, 1u);
  EXPECT_LT(sim.finish_step.at(2), sim.finish_step.at(1));
  EXPECT_EQ(sim.out, expected);
}

TEST(Scheduler, CancelsQueuedAndRunningRequestsAtOnce) {
  Sim sim(64, 4, opts(1, 64));
  sim.add(1, prompt_of(5, 0), 1000);
  sim.add(2, prompt_of(5, 100), 1000);
  sim.step();
  sim.step();
  ASSERT_EQ(sim.sched.n_running(), 1);
  ASSERT_EQ(sim.sched.n_waiting(), 1);
  // Queued behind a full slot: ends at the next step, while 1 keeps running.
  EXPECT_TRUE(sim.sched.cancel(2));
  StepPlan p = sim.step();
  ASSERT_EQ(p.ended.size(), 1u);
  EXPECT_EQ(p.ended[0].id, 2u);
  EXPECT_EQ(p.ended[0].reason, EndReason::end_reason_cancelled);
  EXPECT_EQ(ids_of(p), (std::vector<uint64_t>{1}));
  EXPECT_FALSE(sim.sched.contains(2));
  // Running: its blocks go back at once.
  EXPECT_GT(sim.sched.kv_cache().pool().n_used(), 0);
  EXPECT_TRUE(sim.sched.cancel(1));
  p = sim.step();
  ASSERT_EQ(p.ended.size(), 1u);
  EXPECT_EQ(p.ended[0].id, 1u);
  EXPECT_TRUE(p.chunks.empty());
  EXPECT_EQ(sim.sched.kv_cache().pool().n_used(), 0);
  EXPECT_FALSE(sim.sched.has_work());
  EXPECT_FALSE(sim.sched.cancel(1));
}

TEST(Scheduler, RequestsTooLargeForTheWholeCacheEnd) {
  Sim sim(4, 4, opts(2, 64));  // 16 tokens in all
  sim.add(1, prompt_of(20, 0), 1);
  sim.add(2, prompt_of(10, 100), 10);  // fits at first, outgrows the cache while alone
  sim.add(3, prompt_of(4, 200), 3);
  sim.run();
  ASSERT_TRUE(sim.ended.contains(1));
  EXPECT_EQ(sim.ended[1].reason, EndReason::end_reason_too_large);
  EXPECT_NE(sim.ended[1].message.find("holds 16 tokens (4 x 4-token blocks)"), std::string::npos)
      << sim.ended[1].message;
  EXPECT_NE(sim.ended[1].message.find("needs 20 tokens"), std::string::npos) << sim.ended[1].message;
  ASSERT_TRUE(sim.ended.contains(2));
  EXPECT_NE(sim.ended[2].message.find("needs 17 tokens"), std::string::npos) << sim.ended[2].message;
  EXPECT_EQ(sim.out[2].size(), 7u);  // tokens 11..17 were sampled before the cache ran out
  EXPECT_EQ(sim.out[3].size(), 3u);
  EXPECT_FALSE(sim.ended.contains(3));
}

TEST(Scheduler, CacheSaltSeparatesPrefixHits) {
  Sim sim(64, 4, opts(1, 64));
  sim.add(1, prompt_of(13, 0), 1, "a");
  sim.run();
  sim.add(2, prompt_of(13, 0), 1, "a");
  StepPlan p = sim.step();
  ASSERT_EQ(p.admitted.size(), 1u);
  EXPECT_EQ(p.admitted[0].n_cached, 12);
  EXPECT_EQ(p.chunks[0].start, 12);
  sim.add(3, prompt_of(13, 0), 1, "b");
  p = sim.step();
  ASSERT_EQ(p.admitted.size(), 1u);
  EXPECT_EQ(p.admitted[0].n_cached, 0);
  EXPECT_EQ(sim.out[1], sim.out[2]);
  EXPECT_EQ(sim.out[1], sim.out[3]);
}

// FCFS under a flood: requests that arrive later never make an earlier one finish later (in steps), none
// starves, and equal requests finish in arrival order. Preemption is reached in both runs.
TEST(Scheduler, FloodKeepsArrivalOrderAndStarvesNobody) {
  constexpr int32_t kEarly = 4, kFlood = 60, kNew = 16;
  auto prompt = [](int32_t i) { return prompt_of(8, 1000 * i); };  // distinct: no prefix hits
  Sim base(20, 4, opts(4, 16));                                    // 4 x 24 tokens need 24 blocks: preemption
  for (int32_t i = 1; i <= kEarly; ++i) base.add(i, prompt(i), kNew);
  base.run();
  EXPECT_GT(base.n_preempted, 0);

  Sim flood(20, 4, opts(4, 16));
  for (int32_t i = 1; i <= kEarly; ++i) flood.add(i, prompt(i), kNew);
  int32_t next = kEarly + 1;
  for (; next <= kEarly + kFlood / 2; ++next) flood.add(next, prompt(next), kNew);
  while (flood.sched.has_work()) {
    ASSERT_LT(flood.n_steps, 5000);
    if (next <= kEarly + kFlood) {  // more keep arriving, two per step
      flood.add(next, prompt(next), kNew);
      ++next;
      flood.add(next, prompt(next), kNew);
      ++next;
    }
    flood.step();
  }
  EXPECT_GT(flood.n_preempted, 0);
  ASSERT_EQ(static_cast<int32_t>(flood.finish_step.size()), next - 1);  // nobody starved
  for (int32_t i = 1; i <= kEarly; ++i) {
    EXPECT_EQ(flood.finish_step[i], base.finish_step[i]) << "request " << i;
    EXPECT_EQ(flood.out[i], base.out[i]);
  }
  for (int32_t i = 2; i < next; ++i) {
    EXPECT_LE(flood.finish_step[i - 1], flood.finish_step[i]) << "request " << i << " overtook " << i - 1;
  }
  EXPECT_TRUE(flood.ended.empty());
}

// Speculative steps: each decoding request drafts up to 5 tokens, the first `good` of them its true next
// tokens (from a run without drafts), then wrong ones. A chunk computes its token and the drafts; the caller
// keeps each draft while the row before it gave that token (accept_draft), then appends the row's own token.
// The outputs are those of the run without drafts, a step never exceeds the budget, and the cache's
// invariants hold after every step.
TEST(Scheduler, DraftsKeptAreCommittedAndTheRestLeaveNoTrace) {
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t i = 0; i < 4; ++i) prompts.push_back(prompt_of(9 + 5 * i, 100 * i));
  constexpr int32_t kMaxNew = 23;
  const auto oracle = alone(prompts, kMaxNew);
  for (int32_t good = 0; good <= 5; ++good) {
    // 14 blocks of 4: the four requests need 9 to 13 blocks together, so drafts sometimes find none free.
    Scheduler sched = Scheduler::create(opts(4, 12), KvCache(14, 4)).value();
    FakeModel model(14, 4);
    std::map<uint64_t, std::vector<int32_t>> out;
    for (size_t i = 0; i < prompts.size(); ++i) ASSERT_TRUE(sched.add(i + 1, prompts[i]).ok());
    int32_t n_drafted = 0, n_kept = 0, steps = 0;
    while (sched.has_work() && ++steps < 1000) {
      std::map<uint64_t, std::vector<int32_t>> drafts;
      for (auto& [id, o] : oracle) {
        if (!sched.contains(id) || sched.n_computed(id) + 1 != static_cast<int32_t>(sched.tokens(id).size()))
          continue;
        // The tokens `id` has not made yet: right for `good` of them, then off by one.
        const size_t made = out[id].size();
        std::vector<int32_t> d;
        for (size_t k = 0; k < 5 && made + k < o.size(); ++k)
          d.push_back(o[made + k] + (static_cast<int32_t>(k) < good ? 0 : 1));
        sched.set_draft(id, static_cast<int32_t>(d.size()));
        drafts[id] = d;
      }
      const StepPlan plan = sched.schedule();
      ASSERT_TRUE(sched.check_invariants().ok()) << sched.check_invariants().to_string();
      ASSERT_LE(plan.n_tokens(), 12);
      for (const ScheduledChunk& c : plan.chunks) {
        if (c.n_draft > 0) {
          ASSERT_EQ(c.n_tokens, 1 + c.n_draft);  // after the pending token alone
        }
      }
      const auto rows = model.run_rows(sched, plan, drafts);
      sched.commit(plan);
      for (const auto& [id, toks] : rows) {
        const ScheduledChunk& c = *std::find_if(plan.chunks.begin(), plan.chunks.end(),
                                                [&, id = id](const ScheduledChunk& x) { return x.id == id; });
        n_drafted += c.n_draft;
        for (int32_t k = 0; k <= c.n_draft; ++k) {
          out[id].push_back(toks[static_cast<size_t>(k)]);
          const bool kept =
              k < c.n_draft && toks[static_cast<size_t>(k)] == drafts[id][static_cast<size_t>(k)];
          if (static_cast<int32_t>(out[id].size()) == kMaxNew) {
            EXPECT_TRUE(sched.finish(id));
            break;
          }
          if (!kept) {
            sched.append_token(id, toks[static_cast<size_t>(k)]);
            break;
          }
          ++n_kept;
          sched.accept_draft(id, toks[static_cast<size_t>(k)]);
        }
      }
      ASSERT_TRUE(sched.check_invariants().ok()) << sched.check_invariants().to_string();
    }
    EXPECT_FALSE(sched.has_work());
    EXPECT_EQ(out, oracle) << "good = " << good;
    EXPECT_GT(n_drafted, 0);
    if (good == 0) {
      EXPECT_EQ(n_kept, 0);
    } else {
      EXPECT_GT(n_kept, 0);
    }
  }
}

}  // namespace
}  // namespace kiln
