// GbnfAst -> Grammar: per rule, a Thompson automaton over bytes (code point classes spelled out in UTF-8,
// repetitions unrolled, groups inline), made deterministic by subset construction; then, over all rules,
// left recursion is rejected, useless states are removed and each rule's FOLLOW bytes computed.
#include "grammar/automaton.h"

#include <algorithm>
#include <map>

#include "grammar/gbnf_ast.h"
#include "grammar/utf8_ranges.h"

namespace kiln::grammar {

namespace {

struct NfaState {
  std::vector<int32_t> eps;
  std::vector<ByteEdge> bytes;
  std::vector<RuleEdge> calls;
};

// Small rules that are not recursive are built into their callers (an `expr_ref` becomes the callee's body):
// a caller's states then see through them, so that tokens crossing them (a string's characters, a number's
// digits, white space) are decided by the caller's cache alone instead of being uncertain at every character.
constexpr int64_t kInlineMaxSize = 256;  // expression nodes, callees included
constexpr int32_t kInlineMaxDepth = 8;   // rules built into one another

int64_t expr_size(const Expr& e, const std::vector<int64_t>& inlined_size) {
  switch (e.kind) {
    case ExprKind::expr_class: return static_cast<int64_t>(e.chars.size());
    case ExprKind::expr_ref: {
      const int64_t callee = inlined_size[static_cast<size_t>(e.rule)];
      return callee >= 0 ? callee + 1 : 1;
    }
    case ExprKind::expr_repeat: {
      const int64_t copies = std::max<int64_t>(1, e.max < 0 ? e.min + 1 : e.max);
      return std::min<int64_t>(expr_size(e.items[0], inlined_size) * copies, kInlineMaxSize + 1);
    }
    case ExprKind::expr_seq:
    case ExprKind::expr_alt: {
      int64_t total = 1;
      for (const Expr& item : e.items)
        total = std::min(total + expr_size(item, inlined_size), kInlineMaxSize + 1);
      return total;
    }
  }
  return 1;
}

void collect_refs(const Expr& e, std::vector<int32_t>& out) {
  if (e.kind == ExprKind::expr_ref) out.push_back(e.rule);
  for (const Expr& item : e.items) collect_refs(item, out);
}

// inline_rule[r]: references to r are built inline. Tarjan's strongly connected components (iterative) give
// the recursive rules and visit callees before callers, so sizes and depths are known when needed.
std::vector<uint8_t> choose_inlined(const GbnfAst& ast) {
  const size_t n = ast.rules.size();
  std::vector<std::vector<int32_t>> calls(n);
  for (size_t r = 0; r < n; ++r) collect_refs(ast.rules[r].body, calls[r]);
  std::vector<int32_t> index(n, -1), low(n, 0), stack;
  std::vector<uint8_t> on_stack(n, 0), out(n, 0);
  std::vector<int64_t> size(n, -1);  // inlined size of inlined rules, -1 for the others
  std::vector<int32_t> depth(n, 0);
  int32_t next_index = 0;
  std::vector<std::pair<int32_t, size_t>> dfs;
  for (size_t r0 = 0; r0 < n; ++r0) {
    if (index[r0] >= 0) continue;
    dfs.assign(1, {static_cast<int32_t>(r0), 0});
    index[r0] = low[r0] = next_index++;
    stack.push_back(static_cast<int32_t>(r0));
    on_stack[r0] = 1;
    while (!dfs.empty()) {
      auto& [r, i] = dfs.back();
      const auto ru = static_cast<size_t>(r);
      if (i < calls[ru].size()) {
        const auto c = static_cast<size_t>(calls[ru][i++]);
        if (index[c] < 0) {
          index[c] = low[c] = next_index++;
          stack.push_back(static_cast<int32_t>(c));
          on_stack[c] = 1;
          dfs.push_back({static_cast<int32_t>(c), 0});
        } else if (on_stack[c]) {
          low[ru] = std::min(low[ru], index[c]);
        }
        continue;
      }
      if (low[ru] == index[ru]) {  // ru roots a component
        std::vector<int32_t> comp;
        int32_t m = -1;
        do {
          m = stack.back();
          stack.pop_back();
          on_stack[static_cast<size_t>(m)] = 0;
          comp.push_back(m);
        } while (m != r);
        const bool self_call = std::find(calls[ru].begin(), calls[ru].end(), r) != calls[ru].end();
        if (comp.size() == 1 && !self_call && r != ast.root) {
          int32_t d = 0;
          for (int32_t c : calls[ru]) {
            if (size[static_cast<size_t>(c)] >= 0) d = std::max(d, depth[static_cast<size_t>(c)]);
          }
          const int64_t sz = expr_size(ast.rules[ru].body, size);
          if (sz <= kInlineMaxSize && d + 1 <= kInlineMaxDepth) {
            size[ru] = sz;
            depth[ru] = d + 1;
            out[ru] = 1;
          }
        }
      }
      const int32_t done = r;
      dfs.pop_back();
      if (!dfs.empty()) {
        const auto parent = static_cast<size_t>(dfs.back().first);
        low[parent] = std::min(low[parent], low[static_cast<size_t>(done)]);
      }
    }
  }
  return out;
}

class NfaBuilder {
 public:
  NfaBuilder(const Limits& limits, std::string_view rule, const GbnfAst& ast,
             const std::vector<uint8_t>& inlined)
      : limits_(limits), rule_(rule), ast_(ast), inlined_(inlined) {}

  int32_t add() {
    states_.emplace_back();
    return static_cast<int32_t>(states_.size()) - 1;
  }
  std::vector<NfaState>& states() { return states_; }

  // Appends `e` after state `from`; returns the state where it ends.
  Result<int32_t> build(const Expr& e, int32_t from) {
    if (states_.size() > static_cast<size_t>(limits_.max_states)) {
      return resource_exhausted("GBNF rule '{}': more than max_states = {} automaton states", rule_,
                                limits_.max_states);
    }
    switch (e.kind) {
      case ExprKind::expr_class: return build_class(e.chars, from);
      case ExprKind::expr_ref: {
        if (inlined_[static_cast<size_t>(e.rule)])
          return build(ast_.rules[static_cast<size_t>(e.rule)].body, from);
        const int32_t to = add();
        at(from).calls.push_back({e.rule, to});
        return to;
      }
      case ExprKind::expr_seq: {
        int32_t cur = from;
        for (const Expr& item : e.items) {
          KILN_ASSIGN_OR_RETURN(cur, build(item, cur));
        }
        return cur;
      }
      case ExprKind::expr_alt: {
        const int32_t end = add();
        for (const Expr& item : e.items) {
          const int32_t start = add();
          at(from).eps.push_back(start);
          KILN_ASSIGN_OR_RETURN(int32_t last, build(item, start));
          at(last).eps.push_back(end);
        }
        return end;
      }
      case ExprKind::expr_repeat: return build_repeat(e, from);
    }
    return from;
  }

 private:
  NfaState& at(int32_t s) { return states_[static_cast<size_t>(s)]; }

  Result<int32_t> build_class(const CodePointSet& chars, int32_t from) {
    std::vector<Utf8Sequence> seqs;
    for (auto [lo, hi] : chars) utf8_sequences(lo, hi, seqs);
    const int32_t end = add();
    for (const Utf8Sequence& s : seqs) {
      int32_t cur = from;
      for (int32_t i = 0; i < s.n; ++i) {
        const int32_t next = i + 1 == s.n ? end : add();
        at(cur).bytes.push_back({s.lo[i], s.hi[i], next});
        cur = next;
      }
    }
    return end;
  }

  Result<int32_t> build_repeat(const Expr& e, int32_t from) {
    const Expr& body = e.items[0];
    int32_t cur = from;
    for (int32_t i = 0; i < e.min; ++i) {
      KILN_ASSIGN_OR_RETURN(cur, build(body, cur));
    }
    if (e.max < 0) {  // a loop: cur -> loop -> body -> loop
      const int32_t loop = add();
      at(cur).eps.push_back(loop);
      const int32_t start = add();
      at(loop).eps.push_back(start);
      KILN_ASSIGN_OR_RETURN(int32_t last, build(body, start));
      at(last).eps.push_back(loop);
      return loop;
    }
    const int32_t end = add();
    for (int32_t i = e.min; i < e.max; ++i) {
      at(cur).eps.push_back(end);
      KILN_ASSIGN_OR_RETURN(cur, build(body, cur));
    }
    at(cur).eps.push_back(end);
    return end;
  }

  const Limits& limits_;
  std::string_view rule_;
  const GbnfAst& ast_;
  const std::vector<uint8_t>& inlined_;
  std::vector<NfaState> states_;
};

// One rule's deterministic automaton, states local to the rule (0 the start).
struct Dfa {
  std::vector<std::vector<ByteEdge>> bytes;
  std::vector<std::vector<RuleEdge>> calls;
  std::vector<uint8_t> final;
};

// Subset construction. A subset is keyed by its members that have edges (and the final state): states that
// only pass epsilons on change nothing about what the subset accepts.
Result<Dfa> determinize(std::vector<NfaState>& nfa, int32_t start, int32_t final, int32_t budget,
                        std::string_view rule) {
  const auto n = nfa.size();
  std::vector<uint32_t> mark(n, 0);
  uint32_t stamp = 0;
  auto closure = [&](std::vector<int32_t> seeds) {
    ++stamp;
    std::vector<int32_t> out, stack = std::move(seeds);
    while (!stack.empty()) {
      const int32_t s = stack.back();
      stack.pop_back();
      if (mark[static_cast<size_t>(s)] == stamp) continue;
      mark[static_cast<size_t>(s)] = stamp;
      const NfaState& st = nfa[static_cast<size_t>(s)];
      if (!st.bytes.empty() || !st.calls.empty() || s == final) out.push_back(s);
      for (int32_t t : st.eps) stack.push_back(t);
    }
    std::sort(out.begin(), out.end());
    return out;
  };
  Dfa dfa;
  std::map<std::vector<int32_t>, int32_t> ids;
  std::vector<std::vector<int32_t>> sets;
  auto id_of = [&](std::vector<int32_t> set) -> int32_t {
    auto it = ids.find(set);
    if (it != ids.end()) return it->second;
    const auto id = static_cast<int32_t>(sets.size());
    ids.emplace(set, id);
    sets.push_back(std::move(set));
    return id;
  };
  id_of(closure({start}));
  for (size_t d = 0; d < sets.size(); ++d) {
    if (static_cast<int64_t>(sets.size()) > budget) {
      return resource_exhausted("GBNF rule '{}': more than max_states automaton states", rule);
    }
    const std::vector<int32_t> set = sets[d];
    std::vector<ByteEdge> edges;
    std::vector<int32_t> cuts;  // interval starts
    std::map<int32_t, std::vector<int32_t>> calls;
    bool is_final = false;
    for (int32_t s : set) {
      const NfaState& st = nfa[static_cast<size_t>(s)];
      is_final |= s == final;
      for (const ByteEdge& e : st.bytes) {
        edges.push_back(e);
        cuts.push_back(e.lo);
        cuts.push_back(e.hi + 1);
      }
      for (const RuleEdge& c : st.calls) calls[c.rule].push_back(c.target);
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    std::vector<ByteEdge> out_bytes;
    std::vector<int32_t> prev_targets;
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      const int32_t lo = cuts[i], hi = cuts[i + 1] - 1;
      std::vector<int32_t> targets;
      for (const ByteEdge& e : edges) {
        if (e.lo <= lo && hi <= e.hi) targets.push_back(e.target);
      }
      if (targets.empty()) continue;
      std::sort(targets.begin(), targets.end());
      targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
      if (!out_bytes.empty() && out_bytes.back().hi + 1 == lo && targets == prev_targets) {
        out_bytes.back().hi = static_cast<uint8_t>(hi);
        continue;
      }
      const int32_t to = id_of(closure(targets));
      out_bytes.push_back({static_cast<uint8_t>(lo), static_cast<uint8_t>(hi), to});
      prev_targets = std::move(targets);
    }
    std::vector<RuleEdge> out_calls;
    for (auto& [rule_id, targets] : calls) out_calls.push_back({rule_id, id_of(closure(targets))});
    dfa.bytes.push_back(std::move(out_bytes));
    dfa.calls.push_back(std::move(out_calls));
    dfa.final.push_back(is_final ? 1 : 0);
  }
  return dfa;
}

// A cycle of calls made without consuming a byte, as "a -> b -> a", or "".
std::string find_left_recursion(const std::vector<Dfa>& dfas, const std::vector<std::string>& names) {
  const size_t n = dfas.size();
  std::vector<uint8_t> nullable(n, 0);
  // States of rule r reachable from its start without consuming, given `nullable`.
  auto walk = [&](size_t r, auto&& on_state) {
    std::vector<uint8_t> seen(dfas[r].final.size(), 0);
    std::vector<int32_t> stack{0};
    seen[0] = 1;
    while (!stack.empty()) {
      const auto s = static_cast<size_t>(stack.back());
      stack.pop_back();
      on_state(s);
      for (const RuleEdge& c : dfas[r].calls[s]) {
        if (nullable[static_cast<size_t>(c.rule)] && !seen[static_cast<size_t>(c.target)]) {
          seen[static_cast<size_t>(c.target)] = 1;
          stack.push_back(c.target);
        }
      }
    }
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      bool reaches_final = false;
      walk(r, [&](size_t s) { reaches_final |= dfas[r].final[s] != 0; });
      if (reaches_final) nullable[r] = 1, changed = true;
    }
  }
  std::vector<std::vector<int32_t>> left(n);  // rules called before anything is consumed
  for (size_t r = 0; r < n; ++r) {
    walk(r, [&](size_t s) {
      for (const RuleEdge& c : dfas[r].calls[s]) left[r].push_back(c.rule);
    });
  }
  std::vector<uint8_t> color(n, 0);  // 0 new, 1 on the path, 2 done
  std::vector<std::pair<int32_t, size_t>> path;
  for (size_t r0 = 0; r0 < n; ++r0) {
    if (color[r0] != 0) continue;
    path.assign(1, {static_cast<int32_t>(r0), 0});
    color[r0] = 1;
    while (!path.empty()) {
      auto& [r, i] = path.back();
      const auto ru = static_cast<size_t>(r);
      if (i == left[ru].size()) {
        color[ru] = 2;
        path.pop_back();
        continue;
      }
      const int32_t next = left[ru][i++];
      const auto nu = static_cast<size_t>(next);
      if (color[nu] == 1) {
        std::string cycle;
        size_t k = 0;
        while (path[k].first != next) ++k;
        for (; k < path.size(); ++k) cycle += names[static_cast<size_t>(path[k].first)] + " -> ";
        return cycle + names[nu];
      }
      if (color[nu] == 0) {
        color[nu] = 1;
        path.push_back({next, 0});
      }
    }
  }
  return "";
}

}  // namespace

Status analyze_grammar(Grammar& g);  // automaton_analysis.cpp

Result<std::shared_ptr<const Grammar>> build_automaton(const GbnfAst& ast, const Limits& limits) {
  const size_t n_rules = ast.rules.size();
  std::vector<Dfa> dfas(n_rules);
  std::vector<std::string> names(n_rules);
  int64_t total = 0;
  const std::vector<uint8_t> inlined = choose_inlined(ast);
  for (size_t r = 0; r < n_rules; ++r) {
    names[r] = ast.rules[r].name;
    NfaBuilder nfa(limits, names[r], ast, inlined);
    const int32_t start = nfa.add();
    KILN_ASSIGN_OR_RETURN(int32_t final, nfa.build(ast.rules[r].body, start));
    const auto budget = static_cast<int32_t>(std::max<int64_t>(0, limits.max_states - total));
    auto dfa = determinize(nfa.states(), start, final, budget, names[r]);
    if (!dfa.ok()) {
      return resource_exhausted("GBNF rule '{}': more than max_states = {} automaton states in all", names[r],
                                limits.max_states);
    }
    total += static_cast<int64_t>(dfa->final.size());
    dfas[r] = std::move(dfa).value();
  }
  if (std::string cycle = find_left_recursion(dfas, names); !cycle.empty()) {
    return invalid_argument("GBNF: left recursion: {} calls itself before consuming any text ({})",
                            cycle.substr(0, cycle.find(' ')), cycle);
  }
  auto g = std::make_shared<Grammar>();
  g->rule_names = names;
  g->root = ast.root;
  // Rule-local states to global ones; analyze_grammar then removes the useless ones.
  g->rule_first.push_back(0);
  for (size_t r = 0; r < n_rules; ++r) {
    const auto base = static_cast<int32_t>(g->state_rule.size());
    g->rule_start.push_back(base);
    for (size_t s = 0; s < dfas[r].final.size(); ++s) {
      g->state_rule.push_back(static_cast<int32_t>(r));
      g->state_final.push_back(dfas[r].final[s]);
      g->byte_begin.push_back(static_cast<uint32_t>(g->byte_edges.size()));
      for (ByteEdge e : dfas[r].bytes[s]) {
        e.target += base;
        g->byte_edges.push_back(e);
      }
      g->rule_begin.push_back(static_cast<uint32_t>(g->rule_edges.size()));
      for (RuleEdge c : dfas[r].calls[s]) {
        c.target += base;
        g->rule_edges.push_back(c);
      }
    }
    g->rule_first.push_back(static_cast<int32_t>(g->state_rule.size()));
  }
  g->byte_begin.push_back(static_cast<uint32_t>(g->byte_edges.size()));
  g->rule_begin.push_back(static_cast<uint32_t>(g->rule_edges.size()));
  KILN_TRY(analyze_grammar(*g));
  return std::shared_ptr<const Grammar>(std::move(g));
}

}  // namespace kiln::grammar
