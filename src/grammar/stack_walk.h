// Parse stacks and how they move over bytes. Internal to grammar/.
//
// A stack is a chain of frames, each a state of one rule: the top frame is where the text is now, each frame
// below is where its rule resumes when the rule above it returns. A Stack holds its top frame by value and
// the rest as a node of a tree of frames (StackPool), interned, so that equal stacks are equal values and
// the frames below are shared. A call made in tail position pushes no return frame (automaton.h:
// state_tail), so right recursion (lists, repetitions written as rules) keeps stacks flat.
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

constexpr int32_t kStackEnd = -1;         // below the root frame: returning to it ends the text
constexpr int32_t kStackBase = -2;        // below a mask-cache walk's base frame: returning leaves the rule
constexpr size_t kMaxStacks = 1024;       // stacks in one set
constexpr size_t kMaxExpandWork = 65536;  // stacks one expansion may visit

struct Stack {
  int32_t below = kStackEnd;  // StackPool node id, kStackEnd or kStackBase
  int32_t state = 0;          // the top frame's state
  uint64_t key() const {
    return (static_cast<uint64_t>(static_cast<uint32_t>(state)) << 32) | static_cast<uint32_t>(below + 3);
  }
  bool operator==(const Stack&) const = default;
};

// Interned frames below the top: node id -> (the node below it, its state). Ids are dense; compact()
// renumbers.
class StackPool {
 public:
  StackPool() { clear(); }
  int32_t intern(int32_t below, int32_t state);
  const Stack& operator[](int32_t id) const { return nodes_[static_cast<size_t>(id)]; }
  size_t size() const { return nodes_.size(); }
  void clear();
  // Keeps only the nodes reachable from the stacks' `below` (rewritten), so that a long run does not grow.
  void compact(std::span<Stack> stacks);

 private:
  void rehash(size_t capacity);
  std::vector<Stack> nodes_;
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

  // The expanded set of the stacks `raw` (their tops may have any state) into `out` (cleared first).
  void expand(std::span<const Stack> raw, std::vector<Stack>& out, WalkEvents& ev);
  // The stacks after consuming byte b from the expanded set `in`, not expanded, deduplicated, into `out`.
  void step(std::span<const Stack> in, uint8_t b, std::vector<Stack>& out) const;
  // Consumes `bytes` from the expanded set `in`: false when some byte has no continuation. On success `out`
  // is the expanded set after the last byte and ev.ended says whether the text may end there.
  bool consume(std::span<const Stack> in, std::string_view bytes, std::vector<Stack>& out, WalkEvents& ev);
  // The stack left when the frame on top of node `below` returns (unexpanded).
  Stack pop_to(int32_t below) const { return (*pool_)[below]; }

  StackPool& pool() { return *pool_; }
  const Grammar& grammar() const { return *g_; }

 private:
  bool first_visit(const Stack& s);  // true the first time `s` is seen in this expansion

  const Grammar* g_;
  StackPool* pool_;
  std::vector<uint64_t> seen_;     // open addressing of Stack::key(), 0 empty
  std::vector<size_t> seen_used_;  // occupied slots, to clear them
  std::vector<Stack> work_, tmp_a_, tmp_b_, tmp_c_;
};

}  // namespace kiln::grammar
