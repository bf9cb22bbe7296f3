#include "grammar/stack_walk.h"

#include <algorithm>

namespace kiln::grammar {

namespace {

size_t hash_key(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  return static_cast<size_t>(k);
}

void sort_unique(std::vector<Stack>& v) {
  if (v.size() < 2) return;
  std::sort(v.begin(), v.end(), [](const Stack& a, const Stack& b) { return a.key() < b.key(); });
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

}  // namespace

void StackPool::clear() {
  nodes_.clear();
  table_.assign(64, -1);
}

void StackPool::rehash(size_t capacity) {
  table_.assign(capacity, -1);
  const size_t mask = capacity - 1;
  for (size_t id = 0; id < nodes_.size(); ++id) {
    size_t h = hash_key(nodes_[id].key()) & mask;
    while (table_[h] >= 0) h = (h + 1) & mask;
    table_[h] = static_cast<int32_t>(id);
  }
}

int32_t StackPool::intern(int32_t below, int32_t state) {
  const Stack key_stack{below, state};
  const size_t mask = table_.size() - 1;
  size_t h = hash_key(key_stack.key()) & mask;
  while (table_[h] >= 0) {
    if (nodes_[static_cast<size_t>(table_[h])] == key_stack) return table_[h];
    h = (h + 1) & mask;
  }
  const auto id = static_cast<int32_t>(nodes_.size());
  nodes_.push_back(key_stack);
  table_[h] = id;
  if (nodes_.size() * 2 > table_.size()) rehash(table_.size() * 2);
  return id;
}

void StackPool::compact(std::span<Stack> stacks) {
  // A node only points to older nodes, so new ids can be given in old order, each after its below's.
  std::vector<int32_t> remap(nodes_.size(), -1);
  for (const Stack& s : stacks) {
    for (int32_t id = s.below; id >= 0 && remap[static_cast<size_t>(id)] == -1;
         id = nodes_[static_cast<size_t>(id)].below) {
      remap[static_cast<size_t>(id)] = -2;  // reached
    }
  }
  std::vector<Stack> kept;
  for (size_t id = 0; id < nodes_.size(); ++id) {
    if (remap[id] != -2) continue;
    Stack n = nodes_[id];
    if (n.below >= 0) n.below = remap[static_cast<size_t>(n.below)];
    remap[id] = static_cast<int32_t>(kept.size());
    kept.push_back(n);
  }
  for (Stack& s : stacks) {
    if (s.below >= 0) s.below = remap[static_cast<size_t>(s.below)];
  }
  nodes_ = std::move(kept);
  size_t capacity = 64;
  while (capacity < nodes_.size() * 2 + 2) capacity *= 2;
  rehash(capacity);
}

bool StackWalker::first_visit(const Stack& s) {
  if (seen_.empty()) seen_.assign(64, 0);
  if (seen_used_.size() * 2 >= seen_.size()) {  // grow: rebuild from the occupied slots
    std::vector<uint64_t> keys;
    for (size_t i : seen_used_) keys.push_back(seen_[i]);
    seen_.assign(seen_.size() * 2, 0);
    seen_used_.clear();
    for (uint64_t k : keys) {
      size_t h = hash_key(k) & (seen_.size() - 1);
      while (seen_[h] != 0) h = (h + 1) & (seen_.size() - 1);
      seen_[h] = k;
      seen_used_.push_back(h);
    }
  }
  const uint64_t k = s.key();  // never 0: below + 3 >= 1
  const size_t mask = seen_.size() - 1;
  size_t h = hash_key(k) & mask;
  while (seen_[h] != 0) {
    if (seen_[h] == k) return false;
    h = (h + 1) & mask;
  }
  seen_[h] = k;
  seen_used_.push_back(h);
  return true;
}

void StackWalker::expand(std::span<const Stack> raw, std::vector<Stack>& out, WalkEvents& ev) {
  const Grammar& g = *g_;
  out.clear();
  if (raw.size() == 1) {  // the common case: one stack whose top only consumes bytes
    const int32_t s = raw[0].state;
    if (!g.state_final[static_cast<size_t>(s)] && g.calls_of(s).empty()) {
      out.push_back(raw[0]);
      return;
    }
  }
  for (size_t i : seen_used_) seen_[i] = 0;
  seen_used_.clear();
  work_.assign(raw.begin(), raw.end());
  size_t visited = 0;
  while (!work_.empty()) {
    const Stack st = work_.back();
    work_.pop_back();
    if (!first_visit(st)) continue;
    if (++visited > kMaxExpandWork || out.size() >= kMaxStacks) {
      ev.overflow = true;
      out.clear();
      return;
    }
    const auto s = static_cast<size_t>(st.state);
    if (g.has_bytes(st.state)) out.push_back(st);
    for (const RuleEdge& c : g.calls_of(st.state)) {
      const int32_t below =
          g.state_tail[static_cast<size_t>(c.target)] ? st.below : pool_->intern(st.below, c.target);
      work_.push_back({below, g.rule_start[static_cast<size_t>(c.rule)]});
    }
    if (g.state_final[s]) {
      if (st.below == kStackEnd) {
        ev.ended = true;
      } else if (st.below == kStackBase) {
        ev.escaped = true;
      } else {
        work_.push_back(pop_to(st.below));
      }
    }
  }
}

void StackWalker::step(std::span<const Stack> in, uint8_t b, std::vector<Stack>& out) const {
  out.clear();
  for (const Stack& st : in) {
    const int32_t t = g_->next(st.state, b);
    if (t >= 0) out.push_back({st.below, t});
  }
  sort_unique(out);
}

bool StackWalker::consume(std::span<const Stack> in, std::string_view bytes, std::vector<Stack>& out,
                          WalkEvents& ev) {
  if (bytes.empty()) {
    out.assign(in.begin(), in.end());
    return true;
  }
  std::span<const Stack> cur = in;
  for (size_t i = 0; i < bytes.size(); ++i) {
    step(cur, static_cast<uint8_t>(bytes[i]), tmp_a_);
    if (tmp_a_.empty()) return false;
    ev = WalkEvents{};
    std::vector<Stack>& dst = i + 1 == bytes.size() ? out : tmp_b_;
    expand(tmp_a_, dst, ev);
    if (ev.overflow) return false;
    if (i + 1 < bytes.size()) {
      std::swap(tmp_b_, tmp_c_);
      cur = tmp_c_;
    }
  }
  return true;
}

}  // namespace kiln::grammar
