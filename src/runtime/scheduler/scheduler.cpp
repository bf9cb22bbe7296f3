#include "runtime/scheduler/scheduler.h"

#include <algorithm>
#include <utility>

namespace kiln {

int32_t StepPlan::n_tokens() const {
  int32_t n = 0;
  for (const ScheduledChunk& c : chunks) n += c.n_tokens;
  return n;
}

Scheduler::Scheduler(const SchedulerOptions& options, KvCache kv_cache)
    : options_(options), kv_(std::move(kv_cache)) {}

Result<Scheduler> Scheduler::create(const SchedulerOptions& options, KvCache kv_cache) {
  if (options.max_running < 1)
    return invalid_argument("scheduler: max_running = {} must be >= 1", options.max_running);
  if (options.max_batch_tokens < 1) {
    return invalid_argument("scheduler: max_batch_tokens = {} must be >= 1", options.max_batch_tokens);
  }
  if (options.kv_window < 0)
    return invalid_argument("scheduler: kv_window = {} must be >= 0", options.kv_window);
  if (kv_cache.n_sequences() != 0) {
    return invalid_argument("scheduler: the KV cache holds {} sequences; it must start empty",
                            kv_cache.n_sequences());
  }
  return Scheduler(options, std::move(kv_cache));
}

Status Scheduler::add(uint64_t id, std::vector<int32_t> prompt, std::string cache_salt, bool reuse_prefix,
                      int32_t priority) {
  if (reqs_.contains(id))
    return invalid_argument("scheduler: request id {} is already queued or running", id);
  if (prompt.empty()) return invalid_argument("scheduler: request {} has an empty prompt", id);
  Req r;
  r.priority = priority;
  r.arrival = next_arrival_++;
  r.tokens = std::move(prompt);
  r.cache_salt = std::move(cache_salt);
  r.reuse_prefix = reuse_prefix;
  reqs_.emplace(id, std::move(r));
  insert_ranked(waiting_, id);
  return Status::ok_status();
}

bool Scheduler::ranks_before(uint64_t a, uint64_t b) const {
  const Req& ra = reqs_.at(a);
  const Req& rb = reqs_.at(b);
  return ra.priority != rb.priority ? ra.priority < rb.priority : ra.arrival < rb.arrival;
}

template <class List>
void Scheduler::insert_ranked(List& list, uint64_t id) {
  auto at = std::upper_bound(list.begin(), list.end(), id,
                             [&](uint64_t a, uint64_t b) { return ranks_before(a, b); });
  list.insert(at, id);
}

bool Scheduler::cancel(uint64_t id) {
  auto it = reqs_.find(id);
  if (it == reqs_.end()) return false;
  it->second.cancel_requested = true;
  return true;
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  end_cancelled(plan);
  int32_t budget = options_.max_batch_tokens;
  // Every slot taken and the waiting head outranks the last running request: make room for it.
  while (!waiting_.empty() && static_cast<int32_t>(running_.size()) == options_.max_running &&
         ranks_before(waiting_.front(), running_.back())) {
    preempt_last(plan, budget);
  }
  const size_t n_outranked = plan.preempted.size();
  // Decodes (one pending token) first, then prefill chunks, each group in rank order.
  std::vector<uint64_t> order;
  order.reserve(running_.size());
  for (uint64_t id : running_) {
    if (reqs_.at(id).pending() == 1) order.push_back(id);
  }
  for (uint64_t id : running_) {
    const int32_t pending = reqs_.at(id).pending();
    KILN_ASSERT(pending >= 1);  // the caller appended a token to, or finished, every request it sampled
    if (pending > 1) order.push_back(id);
  }
  for (uint64_t id : order) {
    if (budget == 0) break;
    auto it = reqs_.find(id);
    if (it == reqs_.end() || !it->second.running) continue;  // preempted or ended earlier in this step
    const int32_t n = std::min(it->second.pending(), budget);
    if (!reserve_or_preempt(id, n, plan, budget)) continue;
    const Req& r = reqs_.at(id);
    plan.chunks.push_back({id, r.n_computed, n, r.n_computed + n == static_cast<int32_t>(r.tokens.size())});
    budget -= n;
  }
  // Blocks ran out this step: admitting now would only grow the next preemption.
  if (plan.preempted.size() == n_outranked) admit_waiting(plan, budget);
  add_drafts(plan, budget);
  for (auto& [id, r] : reqs_) r.n_draft = 0;  // set_draft() asks for one schedule()
  return plan;
}

void Scheduler::add_drafts(StepPlan& plan, int32_t& budget) {
  const int32_t bs = kv_.block_size();
  for (ScheduledChunk& c : plan.chunks) {
    if (budget <= 0) return;
    const Req& r = reqs_.at(c.id);
    if (r.n_draft == 0 || !c.sample || c.n_tokens != 1) continue;  // a chunk of its one pending token
    const auto seq = static_cast<int64_t>(c.id);
    // Positions reserved already, then whole new blocks while one more stays free for each running request.
    const int32_t room = kv_.capacity(seq) - (c.start + 1);
    const int32_t spare_blocks =
        std::max(0, kv_.pool().n_available() - static_cast<int32_t>(running_.size()));
    const int32_t n = std::min({r.n_draft, budget, room + spare_blocks * bs});
    if (n <= 0 || !kv_.reserve(seq, 1 + n).ok()) continue;
    c.n_tokens += n;
    c.n_draft = n;
    budget -= n;
  }
}

void Scheduler::end_cancelled(StepPlan& plan) {
  std::vector<uint64_t> ids;
  for (uint64_t id : running_) {
    if (reqs_.at(id).cancel_requested) ids.push_back(id);
  }
  for (uint64_t id : waiting_) {
    if (reqs_.at(id).cancel_requested) ids.push_back(id);
  }
  for (uint64_t id : ids) {
    finish(id);
    plan.ended.push_back({id, EndReason::end_reason_cancelled, ""});
  }
}

bool Scheduler::reserve_or_preempt(uint64_t id, int32_t n, StepPlan& plan, int32_t& budget) {
  for (;;) {
    Status st = kv_.reserve(static_cast<int64_t>(id), n);
    if (st.ok()) return true;
    if (running_.size() == 1) {
      // Alone, with every other block free or merely cached: the cache is too small for this request.
      std::string message = too_large_message(id, n);
      finish(id);
      plan.ended.push_back({id, EndReason::end_reason_too_large, std::move(message)});
      return false;
    }
    const uint64_t victim = running_.back();
    preempt_last(plan, budget);
    if (victim == id) return false;
  }
}

void Scheduler::preempt_last(StepPlan& plan, int32_t& budget) {
  const uint64_t id = running_.back();
  running_.pop_back();
  Req& r = reqs_.at(id);
  kv_.free_sequence(static_cast<int64_t>(id));
  r.running = false;
  r.n_computed = 0;
  insert_ranked(waiting_, id);  // with one priority: the front, as it is older than every waiting request
  auto chunk =
      std::find_if(plan.chunks.begin(), plan.chunks.end(), [&](const auto& c) { return c.id == id; });
  if (chunk != plan.chunks.end()) {
    budget += chunk->n_tokens;
    plan.chunks.erase(chunk);
  }
  plan.preempted.push_back(id);
}

void Scheduler::admit_waiting(StepPlan& plan, int32_t& budget) {
  while (!waiting_.empty() && static_cast<int32_t>(running_.size()) < options_.max_running && budget > 0) {
    const uint64_t id = waiting_.front();
    Req& r = reqs_.at(id);
    const auto n_tokens = static_cast<int32_t>(r.tokens.size());
    Result<int32_t> cached =
        kv_.add_sequence(static_cast<int64_t>(id), r.tokens, r.cache_salt, r.reuse_prefix);
    KILN_ASSERT(cached.ok());                                // a waiting request holds no KV sequence
    const int32_t n = std::min(n_tokens - *cached, budget);  // >= 1: a prefix hit leaves the last token
    if (!kv_.reserve(static_cast<int64_t>(id), n).ok()) {
      std::string message = too_large_message(id, *cached + n);
      kv_.free_sequence(static_cast<int64_t>(id));  // gives the prefix hits back to the LRU list
      if (!running_.empty()) break;                 // the head waits for blocks; nobody overtakes it
      finish(id);
      plan.ended.push_back({id, EndReason::end_reason_too_large, std::move(message)});
      continue;
    }
    waiting_.pop_front();
    insert_ranked(running_, id);  // with one priority: the back
    r.running = true;
    r.n_computed = *cached;
    plan.admitted.push_back({id, n_tokens, *cached, !r.admitted_before});
    r.admitted_before = true;
    plan.chunks.push_back({id, *cached, n, *cached + n == n_tokens});
    budget -= n;
  }
}

std::string Scheduler::too_large_message(uint64_t id, int32_t n) const {
  const int32_t bs = kv_.block_size();
  const int64_t need = int64_t{reqs_.at(id).n_computed} + n;
  return fmt::format("the KV cache holds {} tokens ({} x {}-token blocks) and this request needs {} tokens",
                     int64_t{kv_.n_blocks()} * bs, kv_.n_blocks(), bs, need);
}

void Scheduler::commit(const StepPlan& plan) {
  for (const ScheduledChunk& c : plan.chunks) {
    Req& r = reqs_.at(c.id);
    KILN_ASSERT(r.running && r.n_computed == c.start);
    const int32_t n = c.n_tokens - c.n_draft;  // the drafts: accept_draft(), those kept
    kv_.commit(static_cast<int64_t>(c.id), std::span<const int32_t>(r.tokens).subspan(
                                               static_cast<size_t>(c.start), static_cast<size_t>(n)));
    r.n_computed += n;
    release_window(c.id);
  }
}

void Scheduler::release_window(uint64_t id) {
  if (options_.kv_window <= 0) return;
  // Positions below the next token's window are never read again.
  kv_.release_before(static_cast<int64_t>(id), reqs_.at(id).n_computed - options_.kv_window + 1);
}

void Scheduler::set_draft(uint64_t id, int32_t n) {
  auto it = reqs_.find(id);
  if (it != reqs_.end() && it->second.running) it->second.n_draft = std::max(0, n);
}

void Scheduler::accept_draft(uint64_t id, int32_t token) {
  Req& r = reqs_.at(id);
  KILN_ASSERT(r.running && r.pending() == 0 && r.n_computed < kv_.capacity(static_cast<int64_t>(id)));
  r.tokens.push_back(token);
  kv_.commit(static_cast<int64_t>(id), std::span<const int32_t>(&r.tokens.back(), 1));
  ++r.n_computed;
  release_window(id);
}

void Scheduler::append_token(uint64_t id, int32_t token) {
  Req& r = reqs_.at(id);
  KILN_ASSERT(r.running && r.pending() == 0);
  r.tokens.push_back(token);
}

bool Scheduler::finish(uint64_t id) {
  auto it = reqs_.find(id);
  if (it == reqs_.end()) return false;
  if (it->second.running) {
    kv_.free_sequence(static_cast<int64_t>(id));
    running_.erase(std::find(running_.begin(), running_.end(), id));
  } else {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), id));
  }
  reqs_.erase(it);
  return true;
}

std::span<const int32_t> Scheduler::tokens(uint64_t id) const { return reqs_.at(id).tokens; }

int32_t Scheduler::n_computed(uint64_t id) const { return reqs_.at(id).n_computed; }

std::span<const int32_t> Scheduler::block_table(uint64_t id) const {
  KILN_ASSERT(reqs_.at(id).running);
  return kv_.block_table(static_cast<int64_t>(id));
}

Status Scheduler::check_invariants() const {
  auto broken = [](std::string what) { return Status(StatusCode::internal, "scheduler: " + what); };
  if (running_.size() + waiting_.size() != reqs_.size()) {
    return broken(fmt::format("{} running + {} waiting but {} requests", running_.size(), waiting_.size(),
                              reqs_.size()));
  }
  if (static_cast<int32_t>(running_.size()) > options_.max_running) {
    return broken(
        fmt::format("{} running, more than max_running = {}", running_.size(), options_.max_running));
  }
  if (kv_.n_sequences() != static_cast<int32_t>(running_.size())) {
    return broken(fmt::format("{} KV sequences for {} running requests", kv_.n_sequences(), running_.size()));
  }
  // Each list in rank order; within a priority, running requests arrived before waiting ones.
  std::unordered_map<int32_t, uint64_t> newest_running;  // priority -> latest arrival among running
  auto check_order = [&](const auto& list, bool running) -> Status {
    for (size_t i = 0; i < list.size(); ++i) {
      if (!reqs_.contains(list[i])) return broken(fmt::format("request {} is listed but unknown", list[i]));
      if (i > 0 && !ranks_before(list[i - 1], list[i])) {
        return broken(fmt::format("request {} is out of rank order", list[i]));
      }
      const Req& r = reqs_.at(list[i]);
      if (running) {
        uint64_t& newest = newest_running[r.priority];
        newest = std::max(newest, r.arrival + 1);
      } else if (auto it = newest_running.find(r.priority);
                 it != newest_running.end() && r.arrival + 1 < it->second) {
        return broken(
            fmt::format("waiting request {} (arrival {}) arrived before a running one of priority {}",
                        list[i], r.arrival, r.priority));
      }
    }
    return Status::ok_status();
  };
  KILN_TRY(check_order(running_, true));
  KILN_TRY(check_order(waiting_, false));
  auto check = [&](uint64_t id, bool running) -> Status {
    const Req& r = reqs_.at(id);
    if (r.running != running) return broken(fmt::format("request {} is listed in the wrong queue", id));
    if (r.n_computed < 0 || r.n_computed > static_cast<int32_t>(r.tokens.size())) {
      return broken(fmt::format("request {}: {} computed of {} tokens", id, r.n_computed, r.tokens.size()));
    }
    if (running != kv_.has_sequence(static_cast<int64_t>(id))) {
      return broken(
          fmt::format("request {}: running = {} but KV sequence present = {}", id, running, !running));
    }
    if (running && kv_.n_tokens(static_cast<int64_t>(id)) != r.n_computed) {
      return broken(fmt::format("request {}: {} computed but the cache holds {}", id, r.n_computed,
                                kv_.n_tokens(static_cast<int64_t>(id))));
    }
    if (!running && r.n_computed != 0)
      return broken(fmt::format("waiting request {} counts computed tokens", id));
    return Status::ok_status();
  };
  for (uint64_t id : running_) KILN_TRY(check(id, true));
  for (uint64_t id : waiting_) KILN_TRY(check(id, false));
  return kv_.check_invariants();
}

}  // namespace kiln
