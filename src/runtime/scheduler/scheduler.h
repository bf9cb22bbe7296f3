// Scheduler: decides, step by step, which requests run and how many of their tokens, over one KvCache.
//
// THE RULE: by rank, over one list. A request's rank is its priority (lower first; 0 unless given), then
// its arrival: with no priorities it is first come, first served. The running requests and the waiting ones
// are each in rank order, always, and within one priority every running request arrived before every waiting
// one (check_invariants() verifies both). Each step spends a budget of max_batch_tokens: running decodes
// first (one token each), then running prefill chunks, then the head of the waiting queue is admitted while a
// running slot, budget and free KV blocks remain. When a running request needs a block and none is free, the
// LAST-RANKED running request (the newest, with no priorities) is preempted: its blocks are freed and it
// goes back into the waiting queue at its rank, to be recomputed later from its tokens so far (prompt +
// generated). A step that preempted for blocks admits nobody. When every running slot is taken and the head
// of the waiting queue outranks the last running request, that request is preempted to make room (vLLM's
// priority scheduling); with one priority this never happens.
//
// Consequences: the first-ranked request always progresses (it is never the victim while a lower-ranked one
// holds blocks), so a request that fits the cache alone always finishes; a request never delays one that
// outranks it (it is admitted after it, preempted before it, and its prefill comes after the other's).
// A request that cannot fit even alone (its tokens need more blocks than the whole cache) ends with
// end_reason_too_large.
//
// Pure bookkeeping: no model, no backend. The caller runs the plan (a Batch through the model), then calls
// commit(plan), then append_token() or finish() for every chunk with `sample` set.
//
// Speculative decoding: set_draft(id, n) before schedule() asks for room for n draft tokens after a decoding
// request's pending one. Drafts come last, from what the step leaves: its chunk then computes 1 + n_draft
// positions as far as the budget allows and the free blocks beyond one for each running request (drafts
// never preempt, nor hold back an admission; they are cut to fit or dropped). commit() commits the pending
// token alone; accept_draft() then commits each draft token the caller kept, in order, whose K/V that step
// wrote. The positions of the drafts not kept were written but never committed: later tokens overwrite them.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "runtime/kv_cache/kv_cache.h"

namespace kiln {

struct SchedulerOptions {
  int32_t max_running = 1;         // requests admitted at once (n_seq_max), >= 1
  int32_t max_batch_tokens = 512;  // tokens computed per step, all requests together, >= 1
  // Every layer attends only to the last kv_window positions (0: some layer reads all). Blocks wholly below
  // the window of a request's next token are given back after each commit.
  int32_t kv_window = 0;
};

// Positions [start, start + n_tokens) of request `id` are computed this step.
struct ScheduledChunk {
  uint64_t id = 0;
  int32_t start = 0;     // the request's computed tokens before the step
  int32_t n_tokens = 0;  // >= 1, the draft tokens included
  bool sample = false;   // the chunk ends at the request's last known token: its logits give the next token
  int32_t n_draft = 0;   // the last n_draft positions are draft tokens (set_draft), not the request's
};

struct AdmittedRequest {
  uint64_t id = 0;
  int32_t n_looked_up = 0;  // tokens of the request when it was admitted (prompt + generated)
  int32_t n_cached = 0;     // of those, found in the prefix cache (not recomputed)
  bool first_time = true;   // false: re-admitted after a preemption
};

enum class EndReason : uint8_t { end_reason_cancelled, end_reason_too_large };

struct EndedRequest {
  uint64_t id = 0;
  EndReason reason = EndReason::end_reason_cancelled;
  std::string message;  // end_reason_too_large: the sizes that do not fit
};

// One step's decisions. Every id appears in at most one of chunks and ended; a request may be admitted and
// have a chunk in the same step. Ended requests are gone from the scheduler (their blocks are freed).
struct StepPlan {
  std::vector<ScheduledChunk> chunks;     // batch order: decodes, then prefill chunks, each oldest first
  std::vector<AdmittedRequest> admitted;  // in admission (= arrival) order
  std::vector<uint64_t> preempted;        // back in the waiting queue, their blocks freed
  std::vector<EndedRequest> ended;        // cancelled, or too large for the cache

  int32_t n_tokens() const;  // sum of chunks' n_tokens, <= max_batch_tokens
};

class Scheduler {
 public:
  // invalid_argument naming the field when an option is out of range.
  static Result<Scheduler> create(const SchedulerOptions& options, KvCache kv_cache);

  // Queues request `id` (arrival order = call order) with its prompt. cache_salt: KvCache::add_sequence.
  // reuse_prefix = false: the request computes every prompt token (its own blocks still join the prefix
  // cache for others). priority: its rank before arrival (lower first). invalid_argument for an id in use or
  // an empty prompt.
  Status add(uint64_t id, std::vector<int32_t> prompt, std::string cache_salt = {}, bool reuse_prefix = true,
             int32_t priority = 0);
  // Marks a waiting or running request; the next schedule() ends it (end_reason_cancelled) wherever it is.
  // false (and nothing happens) for an unknown id.
  bool cancel(uint64_t id);
  // The next step's plan (see the rule above). Empty when nothing is queued or running.
  StepPlan schedule();
  // The plan's chunks were computed: their K/V are in the cache. Call once per plan, after the forward pass.
  void commit(const StepPlan& plan);
  // A token sampled for `id` from its last chunk; it is computed in a later step. Precondition (assert): `id`
  // is running with all its tokens computed.
  void append_token(uint64_t id, int32_t token);
  // The next schedule() may give running request `id`, when it decodes (one pending token), up to n draft
  // positions after it; applies to that one schedule() only. Unknown and waiting ids are ignored.
  void set_draft(uint64_t id, int32_t n);
  // A draft token of `id`'s last chunk kept: appended and committed (its K/V were written by that step).
  // Precondition (assert): `id` is running with all its tokens computed, and the chunk reserved the position.
  void accept_draft(uint64_t id, int32_t token);
  // Ends request `id` wherever it is and frees its blocks. false for an unknown id.
  bool finish(uint64_t id);

  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  int32_t n_running() const { return static_cast<int32_t>(running_.size()); }
  int32_t n_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  bool contains(uint64_t id) const { return reqs_.contains(id); }
  bool running(uint64_t id) const {
    const auto it = reqs_.find(id);
    return it != reqs_.end() && it->second.running;
  }
  // Prompt + generated tokens of a known request. Valid until the next call that changes it.
  std::span<const int32_t> tokens(uint64_t id) const;
  // Leading tokens of `id` whose K/V are in the cache (0 while waiting).
  int32_t n_computed(uint64_t id) const;
  // The request's KV blocks; precondition: it is running.
  std::span<const int32_t> block_table(uint64_t id) const;
  const KvCache& kv_cache() const { return kv_; }
  const SchedulerOptions& options() const { return options_; }

  // ok, or internal naming the first broken invariant: the rule's order, every running request (and no
  // other) has a KV sequence, computed counts match the cache, and the cache's own invariants.
  Status check_invariants() const;

 private:
  struct Req {
    int32_t priority = 0;         // rank first by this (lower first)...
    uint64_t arrival = 0;         // ...then by position in arrival order
    std::vector<int32_t> tokens;  // [n_tokens] prompt, then the sampled tokens
    int32_t n_computed = 0;       // leading tokens whose K/V are in the cache; 0 while waiting
    std::string cache_salt;
    bool reuse_prefix = true;
    bool running = false;
    bool cancel_requested = false;
    bool admitted_before = false;
    int32_t n_draft = 0;  // set_draft() for the next schedule()
    int32_t pending() const { return static_cast<int32_t>(tokens.size()) - n_computed; }
  };
  Scheduler(const SchedulerOptions& options, KvCache kv_cache);
  // Reserves blocks for n more tokens of `id`, preempting the last-ranked running requests until it fits.
  // false: `id` itself was the last and was preempted, or it is alone and too large (then it is in
  // plan.ended).
  bool reserve_or_preempt(uint64_t id, int32_t n, StepPlan& plan, int32_t& budget);
  void preempt_last(StepPlan& plan, int32_t& budget);
  // Whether request a ranks before request b.
  bool ranks_before(uint64_t a, uint64_t b) const;
  // Puts `id` into `list` (in rank order) at its rank.
  template <class List>
  void insert_ranked(List& list, uint64_t id);
  void end_cancelled(StepPlan& plan);
  void admit_waiting(StepPlan& plan, int32_t& budget);
  void end(uint64_t id, EndReason reason, std::string message, StepPlan& plan);
  // Extends the plan's one-token chunks by the drafts set_draft() asked for, within `budget` (see the top).
  void add_drafts(StepPlan& plan, int32_t& budget);
  // Gives back, for sliding-window models, the blocks below the window of `id`'s next token.
  void release_window(uint64_t id);
  std::string too_large_message(uint64_t id, int32_t n) const;

  SchedulerOptions options_;
  KvCache kv_;
  std::unordered_map<uint64_t, Req> reqs_;  // every request added and not ended
  std::vector<uint64_t> running_;           // first-ranked first; each holds a KvCache sequence
  std::deque<uint64_t> waiting_;            // first-ranked first; none holds a KvCache sequence
  uint64_t next_arrival_ = 0;
};

}  // namespace kiln
