// The grammar as automata over UTF-8 bytes: one deterministic automaton per rule whose edges consume a byte
// range or call another rule. Internal to grammar/; built by parse_gbnf (gbnf_parse.cpp, automaton.cpp).
//
// Invariants (automaton.cpp establishes them):
//  - states are numbered globally [0, n_states); each belongs to one rule; a rule's states are contiguous;
//  - per state, byte edges are sorted, disjoint ranges; at most one rule edge per called rule;
//  - every state is reachable from its rule's start and can reach a final state (useless states and calls of
//    rules that match nothing are removed), so every stack the matcher keeps can still complete;
//  - no rule can call itself without consuming a byte first (left recursion is a parse error), so a chain of
//    calls made without consuming is shorter than the number of rules.
#pragma once

#include <bitset>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "grammar/grammar.h"

namespace kiln::grammar {

struct ByteEdge {
  uint8_t lo = 0, hi = 0;  // the byte range [lo, hi]
  int32_t target = 0;      // state
};

struct RuleEdge {
  int32_t rule = 0;    // the called rule
  int32_t target = 0;  // the state the caller returns to, in the caller's rule
};

using ByteSet = std::bitset<256>;

struct Grammar {
  std::vector<std::string> rule_names;  // [n_rules]
  std::vector<int32_t> rule_start;      // [n_rules] start state of each rule
  std::vector<int32_t> rule_first;      // [n_rules + 1] states of rule r: [rule_first[r], rule_first[r + 1])
  int32_t root = 0;                     // rule

  std::vector<int32_t> state_rule;   // [n_states]
  std::vector<uint8_t> state_final;  // [n_states] 1: the rule may end here
  // 1: final with no edges: returning to it is returning from its rule (calls made in tail position push no
  // return frame).
  std::vector<uint8_t> state_tail;   // [n_states]
  std::vector<uint32_t> byte_begin;  // [n_states + 1] into byte_edges
  std::vector<ByteEdge> byte_edges;  //
  std::vector<uint32_t> rule_begin;  // [n_states + 1] into rule_edges
  std::vector<RuleEdge> rule_edges;  //
  // States with many byte ranges also have a dense table: byte_table[table_of[s] * 256 + b] = next(s, b).
  std::vector<int32_t> table_of;    // [n_states] table index or -1
  std::vector<int32_t> byte_table;  // [n_tables * 256] states, -1 none
  std::vector<ByteSet> follow;      // [n_rules] bytes that may come right after the rule returns
  std::vector<uint8_t> follow_end;  // [n_rules] 1: the text may end right after the rule returns

  int32_t n_states() const { return static_cast<int32_t>(state_rule.size()); }
  int32_t n_rules() const { return static_cast<int32_t>(rule_start.size()); }
  std::span<const ByteEdge> bytes_of(int32_t s) const {
    return {byte_edges.data() + byte_begin[static_cast<size_t>(s)],
            byte_edges.data() + byte_begin[static_cast<size_t>(s) + 1]};
  }
  std::span<const RuleEdge> calls_of(int32_t s) const {
    return {rule_edges.data() + rule_begin[static_cast<size_t>(s)],
            rule_edges.data() + rule_begin[static_cast<size_t>(s) + 1]};
  }
  bool has_bytes(int32_t s) const {
    return byte_begin[static_cast<size_t>(s)] != byte_begin[static_cast<size_t>(s) + 1];
  }
  // The state reached from s on byte b, or -1.
  int32_t next(int32_t s, uint8_t b) const {
    const int32_t t = table_of[static_cast<size_t>(s)];
    if (t >= 0) return byte_table[static_cast<size_t>(t) * 256 + b];
    for (const ByteEdge& e : bytes_of(s)) {
      if (b < e.lo) return -1;
      if (b <= e.hi) return e.target;
    }
    return -1;
  }
};

struct GbnfAst;
// The automata of a parsed grammar. Errors: invalid_argument (left recursion, a root that matches nothing),
// resource_exhausted (more than limits.max_states states).
Result<std::shared_ptr<const Grammar>> build_automaton(const GbnfAst& ast, const Limits& limits);

}  // namespace kiln::grammar
