#include "grammar/stack_walk.h"

#include <algorithm>

namespace kiln::grammar {

namespace {

size_t hash_node(int32_t below, int32_t state) {
  uint64_t k = (static_cast<uint64_t>(static_cast<uint32_t>(below)) << 32) | static_cast<uint32_t>(state);
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  return static_cast<size_t>(k);
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
    size_t h = hash_node(nodes_[id].below, nodes_[id].state) & mask;
    while (table_[h] >= 0) h = (h + 1) & mask;
    table_[h] = static_cast<int32_t>(id);
  }
}

int32_t StackPool::intern(int32_t below, int32_t state) {
  const size_t mask = table_.size() - 1;
  size_t h = hash_node(below, state) & mask;
  while (table_[h] >= 0) {
    const StackNode& n = nodes_[static_cast<size_t>(table_[h])];
    if (n.below == below && n.state == state) return table_[h];
    h = (h + 1) & mask;
  }
  const auto id = static_cast<int32_t>(nodes_.size());
  nodes_.push_back({below, state});
  table_[h] = id;
  if (nodes_.size() * 2 > table_.size()) rehash(table_.size() * 2);
  return id;
}

void StackPool::compact(std::vector<int32_t>& roots) {
  // Nodes point only to older nodes, so a node's new id can be assigned after its below's.
  std::vector<int32_t> remap(nodes_.size(), -1);
  std::vector<int32_t> chain;
  for (int32_t r : roots) {
    for (int32_t id = r; id >= 0 && remap[static_cast<size_t>(id)] == -1;
         id = nodes_[static_cast<size_t>(id)].below) {
      remap[static_cast<size_t>(id)] = -2;  // reached
    }
  }
  std::vector<StackNode> kept;
  for (size_t id = 0; id < nodes_.size(); ++id) {
    if (remap[id] != -2) continue;
    StackNode n = nodes_[id];
    if (n.below >= 0) n.below = remap[static_cast<size_t>(n.below)];
    remap[id] = static_cast<int32_t>(kept.size());
    kept.push_back(n);
  }
  for (int32_t& r : roots) r = remap[static_cast<size_t>(r)];
  nodes_ = std::move(kept);
  size_t capacity = 64;
  while (capacity < nodes_.size() * 2 + 2) capacity *= 2;
  rehash(capacity);
}

void StackWalker::new_mark() {
  if (++stamp_ == 0) {
    std::fill(marks_.begin(), marks_.end(), 0);
    stamp_ = 1;
  }
}

bool StackWalker::mark(int32_t id) {
  const auto i = static_cast<size_t>(id);
  if (i >= marks_.size()) marks_.resize(std::max(i + 1, marks_.size() * 2), 0);
  if (marks_[i] == stamp_) return false;
  marks_[i] = stamp_;
  return true;
}

void StackWalker::expand(std::span<const int32_t> raw, std::vector<int32_t>& out, WalkEvents& ev) {
  const Grammar& g = *g_;
  out.clear();
  new_mark();
  work_.assign(raw.begin(), raw.end());
  size_t visited = 0;
  while (!work_.empty()) {
    const int32_t id = work_.back();
    work_.pop_back();
    if (!mark(id)) continue;
    if (++visited > kMaxExpandWork || out.size() >= kMaxStacks) {
      ev.overflow = true;
      out.clear();
      return;
    }
    const StackNode node = (*pool_)[id];
    const auto s = static_cast<size_t>(node.state);
    if (g.has_bytes(node.state)) out.push_back(id);
    for (const RuleEdge& c : g.calls_of(node.state)) {
      const int32_t below =
          g.state_tail[static_cast<size_t>(c.target)] ? node.below : pool_->intern(node.below, c.target);
      work_.push_back(pool_->intern(below, g.rule_start[static_cast<size_t>(c.rule)]));
    }
    if (g.state_final[s]) {
      if (node.below == kStackEnd) {
        ev.ended = true;
      } else if (node.below == kStackBase) {
        ev.escaped = true;
      } else {
        work_.push_back(node.below);
      }
    }
  }
}

void StackWalker::step(std::span<const int32_t> in, uint8_t b, std::vector<int32_t>& out) {
  out.clear();
  new_mark();
  for (int32_t id : in) {
    const StackNode node = (*pool_)[id];
    const int32_t t = g_->next(node.state, b);
    if (t < 0) continue;
    const int32_t moved = pool_->intern(node.below, t);
    if (mark(moved)) out.push_back(moved);
  }
}

bool StackWalker::consume(std::span<const int32_t> in, std::string_view bytes, std::vector<int32_t>& out,
                          WalkEvents& ev) {
  if (bytes.empty()) {
    out.assign(in.begin(), in.end());
    return true;
  }
  std::span<const int32_t> cur = in;
  for (size_t i = 0; i < bytes.size(); ++i) {
    step(cur, static_cast<uint8_t>(bytes[i]), tmp_a_);
    if (tmp_a_.empty()) return false;
    ev = WalkEvents{};
    std::vector<int32_t>& dst = i + 1 == bytes.size() ? out : tmp_b_;
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
