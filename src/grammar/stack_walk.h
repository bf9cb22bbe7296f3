// Parse stacks and how they move over bytes. Internal to grammar/.
//
// A stack is a chain of frames, each a state of one rule: the top frame is where the text is now, each frame
// below is where its rule resumes when the rule above it returns. Stacks are nodes of a tree (a node: its
// top state and the node below it), interned, so that equal stacks are one node id and sets of stacks dedup
// by id. A call made in tail position pushes no return frame (grammar.h: state_tail), so right recursion
// (lists, repetitions written as rules) keeps stacks flat.
//
// A stack set is "expanded" when each stack's top state has byte edges: the calls it may make and the returns
// it may take without consuming have been followed (StackWalker::expand). Left recursion is rejected at
// parse time, so expanding terminates; sets beyond kMaxStacks stacks (a grammar ambiguous enough to keep that
// many parses alive) are given up (WalkEvents::overflow): the bytes are then treated as not allowed.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "grammar/automaton.h"

namespace kiln::grammar {

constexpr int32_t kStackEnd = -1;    // below the root frame: returning to it ends the text
constexpr int32_t kStackBase = -2;   // below a mask-cache walk's base frame: returning to it leaves the rule
constexpr size_t kMaxStacks = 1024;  // stacks in one set
constexpr size_t kMaxExpandWork = 65536;  // nodes one expansion may visit

struct StackNode {
  int32_t below = kStackEnd;  // node id, kStackEnd or kStackBase
  int32_t state = 0;          // the top frame's state
};

// Interned stack nodes. Ids are dense; compact() renumbers.
class StackPool {
 public:
  StackPool() { clear(); }
  int32_t intern(int32_t below, int32_t state);
  const StackNode& operator[](int32_t id) const { return nodes_[static_cast<size_t>(id)]; }
  size_t size() const { return nodes_.size(); }
  void clear();
  // Keeps only the nodes that `roots` reach (ids in `roots` rewritten), so that a long run does not grow.
  void compact(std::vector<int32_t>& roots);

 private:
  void rehash(size_t capacity);
  std::vector<StackNode> nodes_;
  std::vector<int32_t> table_;  // [capacity, a power of two] node ids, -1 empty
};

struct WalkEvents {
  bool ended = false;     // a stack returned below the root: the text may end here
  bool escaped = false;   // a stack returned below the base frame: the base rule may end here
  bool overflow = false;  // the set passed kMaxStacks / kMaxExpandWork and was given up (left empty)
};

class StackWalker {
 public:
  StackWalker(const Grammar& g, StackPool& pool) : g_(&g), pool_(&pool) {}

  // The expanded set of the stacks `raw` (their tops may have any state), appended to `out` (cleared first).
  void expand(std::span<const int32_t> raw, std::vector<int32_t>& out, WalkEvents& ev);
  // The stacks after consuming byte b from the expanded set `in`, not expanded, into `out` (cleared first).
  void step(std::span<const int32_t> in, uint8_t b, std::vector<int32_t>& out);
  // Consumes `bytes` from the expanded set `in`: false when some byte has no continuation. On success `out`
  // is the expanded set after the last byte and ev.ended says whether the text may end there.
  bool consume(std::span<const int32_t> in, std::string_view bytes, std::vector<int32_t>& out,
               WalkEvents& ev);

  StackPool& pool() { return *pool_; }
  const Grammar& grammar() const { return *g_; }

 private:
  bool mark(int32_t id);  // true the first time `id` is marked since the last new_mark()
  void new_mark();

  const Grammar* g_;
  StackPool* pool_;
  std::vector<uint32_t> marks_;  // [pool size] == stamp_: marked
  uint32_t stamp_ = 0;
  std::vector<int32_t> work_, tmp_a_, tmp_b_, tmp_c_;
};

}  // namespace kiln::grammar
