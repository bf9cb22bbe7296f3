// Over all rules' automata: removes what can never be part of a match (rules that match no finite text,
// states that cannot reach their rule's end, rules the root never calls), then computes the FOLLOW bytes of
// each rule.
#include <algorithm>

#include "grammar/automaton.h"

namespace kiln::grammar {

namespace {

// Renumbers the states to those with keep[s], in order; edges into dropped states and calls of rules with
// no start are removed.
void compact(Grammar& g, const std::vector<uint8_t>& keep) {
  const auto n = static_cast<size_t>(g.n_states());
  std::vector<int32_t> id(n, -1);
  int32_t next = 0;
  for (size_t s = 0; s < n; ++s) {
    if (keep[s]) id[s] = next++;
  }
  Grammar out;
  out.rule_names = g.rule_names;
  out.root = g.root;
  out.rule_first.push_back(0);
  for (int32_t r = 0; r < g.n_rules(); ++r) {
    const int32_t start = g.rule_start[static_cast<size_t>(r)];
    out.rule_start.push_back(start >= 0 ? id[static_cast<size_t>(start)] : -1);
    for (int32_t s = g.rule_first[static_cast<size_t>(r)]; s < g.rule_first[static_cast<size_t>(r) + 1];
         ++s) {
      if (!keep[static_cast<size_t>(s)]) continue;
      out.state_rule.push_back(r);
      out.state_final.push_back(g.state_final[static_cast<size_t>(s)]);
      out.byte_begin.push_back(static_cast<uint32_t>(out.byte_edges.size()));
      for (ByteEdge e : g.bytes_of(s)) {
        if (id[static_cast<size_t>(e.target)] < 0) continue;
        e.target = id[static_cast<size_t>(e.target)];
        out.byte_edges.push_back(e);
      }
      out.rule_begin.push_back(static_cast<uint32_t>(out.rule_edges.size()));
      for (RuleEdge c : g.calls_of(s)) {
        const int32_t callee = g.rule_start[static_cast<size_t>(c.rule)];
        if (id[static_cast<size_t>(c.target)] < 0 || callee < 0 || id[static_cast<size_t>(callee)] < 0)
          continue;
        c.target = id[static_cast<size_t>(c.target)];
        out.rule_edges.push_back(c);
      }
    }
    out.rule_first.push_back(static_cast<int32_t>(out.state_rule.size()));
  }
  out.byte_begin.push_back(static_cast<uint32_t>(out.byte_edges.size()));
  out.rule_begin.push_back(static_cast<uint32_t>(out.rule_edges.size()));
  for (int32_t r = 0; r < out.n_rules(); ++r) {
    if (out.rule_first[static_cast<size_t>(r)] == out.rule_first[static_cast<size_t>(r) + 1]) {
      out.rule_start[static_cast<size_t>(r)] = -1;
    }
  }
  g = std::move(out);
}

// FIRST bytes of every state (what it may consume first, calls expanded) and whether its rule may end from it
// without consuming; then FOLLOW of every rule. Monotone fixpoints; states are visited last to first, so that
// a rule's chain of states settles in few passes.
void compute_follow(Grammar& g) {
  const auto n = static_cast<size_t>(g.n_states());
  const auto n_rules = static_cast<size_t>(g.n_rules());
  std::vector<ByteSet> first(n);
  std::vector<uint8_t> ends(n, 0);
  auto start_of = [&](int32_t r) { return static_cast<size_t>(g.rule_start[static_cast<size_t>(r)]); };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t s = n; s-- > 0;) {
      ByteSet f = first[s];
      uint8_t e = ends[s] | g.state_final[s];
      for (const ByteEdge& b : g.bytes_of(static_cast<int32_t>(s))) {
        for (int32_t c = b.lo; c <= b.hi; ++c) f.set(static_cast<size_t>(c));
      }
      for (const RuleEdge& c : g.calls_of(static_cast<int32_t>(s))) {
        const size_t callee = start_of(c.rule);
        f |= first[callee];
        if (ends[callee]) {
          f |= first[static_cast<size_t>(c.target)];
          e |= ends[static_cast<size_t>(c.target)];
        }
      }
      if (f != first[s] || e != ends[s]) {
        first[s] = f;
        ends[s] = e;
        changed = true;
      }
    }
  }
  g.follow.assign(n_rules, ByteSet());
  g.follow_end.assign(n_rules, 0);
  g.follow_end[static_cast<size_t>(g.root)] = 1;
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t s = 0; s < n; ++s) {
      const auto caller = static_cast<size_t>(g.state_rule[s]);
      for (const RuleEdge& c : g.calls_of(static_cast<int32_t>(s))) {
        const auto callee = static_cast<size_t>(c.rule);
        const auto t = static_cast<size_t>(c.target);
        ByteSet f = g.follow[callee] | first[t];
        uint8_t e = g.follow_end[callee];
        if (ends[t]) {
          f |= g.follow[caller];
          e |= g.follow_end[caller];
        }
        if (f != g.follow[callee] || e != g.follow_end[callee]) {
          g.follow[callee] = f;
          g.follow_end[callee] = e;
          changed = true;
        }
      }
    }
  }
}

}  // namespace

Status analyze_grammar(Grammar& g) {
  const auto n = static_cast<size_t>(g.n_states());
  const auto n_rules = static_cast<size_t>(g.n_rules());
  // Productive rules: the start reaches a final state through bytes and calls of productive rules.
  std::vector<uint8_t> productive(n_rules, 0);
  std::vector<uint32_t> seen(n, 0);  // == pass: visited in this pass
  uint32_t pass = 0;
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n_rules; ++r) {
      if (productive[r]) continue;
      std::vector<int32_t> stack{g.rule_start[r]};
      ++pass;
      seen[static_cast<size_t>(g.rule_start[r])] = pass;
      while (!stack.empty() && !productive[r]) {
        const int32_t s = stack.back();
        stack.pop_back();
        if (g.state_final[static_cast<size_t>(s)]) productive[r] = 1;
        auto visit = [&](int32_t t) {
          if (seen[static_cast<size_t>(t)] != pass) seen[static_cast<size_t>(t)] = pass, stack.push_back(t);
        };
        for (const ByteEdge& e : g.bytes_of(s)) visit(e.target);
        for (const RuleEdge& c : g.calls_of(s)) {
          if (productive[static_cast<size_t>(c.rule)]) visit(c.target);
        }
      }
      changed |= productive[r] != 0;
    }
  }
  if (!productive[static_cast<size_t>(g.root)]) {
    return invalid_argument("GBNF: rule 'root' matches no finite text (every path recurses forever)");
  }
  // States that can reach their rule's end: backwards from the final states.
  std::vector<std::vector<int32_t>> preds(n);
  for (size_t s = 0; s < n; ++s) {
    for (const ByteEdge& e : g.bytes_of(static_cast<int32_t>(s))) {
      preds[static_cast<size_t>(e.target)].push_back(static_cast<int32_t>(s));
    }
    for (const RuleEdge& c : g.calls_of(static_cast<int32_t>(s))) {
      if (productive[static_cast<size_t>(c.rule)])
        preds[static_cast<size_t>(c.target)].push_back(static_cast<int32_t>(s));
    }
  }
  std::vector<uint8_t> live(n, 0);
  std::vector<int32_t> stack;
  for (size_t s = 0; s < n; ++s) {
    if (g.state_final[s]) live[s] = 1, stack.push_back(static_cast<int32_t>(s));
  }
  while (!stack.empty()) {
    const auto s = static_cast<size_t>(stack.back());
    stack.pop_back();
    for (int32_t p : preds[s]) {
      if (!live[static_cast<size_t>(p)]) live[static_cast<size_t>(p)] = 1, stack.push_back(p);
    }
  }
  // Reachable from root's start through live states (a call makes the callee's start reachable).
  std::vector<uint8_t> keep(n, 0);
  stack.assign(1, g.rule_start[static_cast<size_t>(g.root)]);
  keep[static_cast<size_t>(stack[0])] = 1;
  while (!stack.empty()) {
    const int32_t s = stack.back();
    stack.pop_back();
    auto visit = [&](int32_t t) {
      if (live[static_cast<size_t>(t)] && !keep[static_cast<size_t>(t)])
        keep[static_cast<size_t>(t)] = 1, stack.push_back(t);
    };
    for (const ByteEdge& e : g.bytes_of(s)) visit(e.target);
    for (const RuleEdge& c : g.calls_of(s)) {
      if (!productive[static_cast<size_t>(c.rule)] || !live[static_cast<size_t>(c.target)]) continue;
      visit(c.target);
      visit(g.rule_start[static_cast<size_t>(c.rule)]);
    }
  }
  compact(g, keep);
  g.state_tail.assign(static_cast<size_t>(g.n_states()), 0);
  for (int32_t s = 0; s < g.n_states(); ++s) {
    g.state_tail[static_cast<size_t>(s)] =
        g.state_final[static_cast<size_t>(s)] && !g.has_bytes(s) && g.calls_of(s).empty();
  }
  // Dense tables for the states whose byte ranges a scan would be slow on, within 8 MiB.
  constexpr size_t kMinRanges = 4, kMaxTables = 8192;
  g.table_of.assign(static_cast<size_t>(g.n_states()), -1);
  for (int32_t s = 0; s < g.n_states() && g.byte_table.size() < kMaxTables * 256; ++s) {
    if (g.bytes_of(s).size() < kMinRanges) continue;
    g.table_of[static_cast<size_t>(s)] = static_cast<int32_t>(g.byte_table.size() / 256);
    const size_t base = g.byte_table.size();
    g.byte_table.resize(base + 256, -1);
    for (const ByteEdge& e : g.bytes_of(s)) {
      for (int32_t b = e.lo; b <= e.hi; ++b) g.byte_table[base + static_cast<size_t>(b)] = e.target;
    }
  }
  compute_follow(g);
  return {};
}

}  // namespace kiln::grammar
