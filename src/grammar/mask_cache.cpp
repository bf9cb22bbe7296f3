// Building the per-state token masks (mask_cache.h) and compile().
#include "grammar/mask_cache.h"

#include <algorithm>

#include "grammar/grammar.h"

namespace kiln::grammar {

namespace {

// compile() builds caches in state order until their walks have done this much work (trie nodes visited +
// uncertain tokens recorded, ~30 ns each: about a second on one core); the rest are built on first use. A
// typical JSON-schema grammar needs a few million.
constexpr int64_t kCompileWork = 30'000'000;

// `bits` [mask_words(n_vocab)] holds the accepted tokens; kept as is, or as a list when that is smaller.
void finish_accepted(std::vector<uint32_t> bits, int32_t count, PositionCache& pc) {
  if (static_cast<size_t>(count) >= bits.size()) {
    pc.accept_bits = std::move(bits);
    return;
  }
  pc.accept_ids.reserve(static_cast<size_t>(count));
  for (size_t w = 0; w < bits.size(); ++w) {
    for (uint32_t x = bits[w]; x != 0; x &= x - 1) {
      pc.accept_ids.push_back(static_cast<int32_t>(w * 32 + static_cast<size_t>(__builtin_ctz(x))));
    }
  }
}

void finish_uncertain(const Vocabulary& vocab, const TokenTrie& trie,
                      std::vector<std::pair<int32_t, int32_t>> entries,  // (rank, offset)
                      PositionCache& pc) {
  auto view = [&](const std::pair<int32_t, int32_t>& e) {
    return trie.bytes_of_rank(e.first, vocab).substr(static_cast<size_t>(e.second));
  };
  std::sort(entries.begin(), entries.end(), [&](const auto& a, const auto& b) {
    const std::string_view x = view(a), y = view(b);
    return x != y ? x < y : a.first < b.first;
  });
  std::string_view prev;
  for (const auto& e : entries) {
    const std::string_view v = view(e);
    if (pc.rem_token.empty() || v != prev) {
      size_t lcp = 0;
      while (lcp < prev.size() && lcp < v.size() && prev[lcp] == v[lcp]) ++lcp;
      pc.rem_token.push_back(trie.order[static_cast<size_t>(e.first)]);
      pc.rem_offset.push_back(e.second);
      pc.rem_lcp.push_back(pc.rem_token.size() == 1 ? 0 : static_cast<int32_t>(lcp));
      pc.rem_first.push_back(static_cast<int32_t>(pc.unc_token.size()));
      prev = v;
    }
    pc.unc_token.push_back(trie.order[static_cast<size_t>(e.first)]);
  }
  pc.rem_first.push_back(static_cast<int32_t>(pc.unc_token.size()));
}

}  // namespace

PositionCache build_position_cache(const Vocabulary& vocab, const TokenTrie& trie, int32_t state,
                                   StackWalker& walker) {
  const Grammar& g = walker.grammar();
  walker.pool().clear();
  const ByteSet& follow = g.follow[static_cast<size_t>(g.state_rule[static_cast<size_t>(state)])];
  PositionCache pc;
  std::vector<uint32_t> accepted(mask_words(vocab.n_vocab()), 0);
  int32_t n_accepted = 0;
  std::vector<std::pair<int32_t, int32_t>> entries;  // (rank, offset) of uncertain tokens
  // Per depth d along the current trie path: the expanded set after d bytes, whether the base frame could
  // return there, and how many entries of `active` (offsets where it returned and the next byte may follow
  // the rule) apply at d.
  std::vector<std::vector<Stack>> sets(1, {Stack{kStackBase, state}});
  std::vector<uint8_t> escaped(1, 0);
  std::vector<size_t> n_active(1, 0);
  std::vector<int32_t> active;
  std::vector<Stack> raw;
  const auto& nodes = trie.nodes;
  const auto n_nodes = static_cast<int32_t>(nodes.size());
  for (int32_t i = 1; i < n_nodes;) {
    const TokenTrieNode& node = nodes[static_cast<size_t>(i)];
    const auto d = static_cast<size_t>(node.depth);
    if (sets.size() <= d) {
      sets.resize(d + 1);
      escaped.resize(d + 1);
      n_active.resize(d + 1);
    }
    active.resize(n_active[d - 1]);
    if (escaped[d - 1] && follow.test(node.byte)) active.push_back(static_cast<int32_t>(d - 1));
    n_active[d] = active.size();
    ++pc.work;
    walker.step(sets[d - 1], node.byte, raw);
    WalkEvents ev;
    if (!raw.empty()) walker.expand(raw, sets[d], ev);
    if (!raw.empty() && !ev.overflow) {
      for (int32_t r = node.tok_begin; r < node.tok_here_end; ++r) {
        const int32_t id = trie.order[static_cast<size_t>(r)];
        accepted[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
        ++n_accepted;
      }
      escaped[d] = ev.escaped ? 1 : 0;
      const bool more = !sets[d].empty() || ev.escaped || !active.empty();
      i = more ? i + 1 : node.end;
      continue;
    }
    for (int32_t r = node.tok_begin; r < node.tok_end; ++r) {
      for (int32_t e : active) entries.emplace_back(r, e);
    }
    pc.work += static_cast<int64_t>(active.size()) * (node.tok_end - node.tok_begin);
    i = node.end;
  }
  finish_accepted(std::move(accepted), n_accepted, pc);
  finish_uncertain(vocab, trie, std::move(entries), pc);
  return pc;
}

const PositionCache& CompiledGrammar::position(int32_t state) const {
  std::atomic<const PositionCache*>& slot = caches[static_cast<size_t>(state)];
  if (const PositionCache* p = slot.load(std::memory_order_acquire)) return *p;
  std::lock_guard<std::mutex> lock(build_mutex);
  if (const PositionCache* p = slot.load(std::memory_order_acquire)) return *p;
  StackPool pool;
  StackWalker walker(*grammar, pool);
  owned.push_back(std::make_unique<PositionCache>(build_position_cache(*vocab, *trie, state, walker)));
  slot.store(owned.back().get(), std::memory_order_release);
  return *owned.back();
}

size_t memory_bytes(const CompiledGrammar& g) {
  const auto bytes = [](const auto& v) { return v.capacity() * sizeof(v[0]); };
  std::lock_guard<std::mutex> lock(g.build_mutex);
  size_t total = sizeof(CompiledGrammar) + bytes(g.is_end) + bytes(g.owned) +
                 static_cast<size_t>(g.grammar->n_states()) * sizeof(std::atomic<const PositionCache*>);
  for (const std::unique_ptr<PositionCache>& c : g.owned) {
    total += sizeof(PositionCache) + bytes(c->accept_bits) + bytes(c->accept_ids) + bytes(c->rem_token) +
             bytes(c->rem_offset) + bytes(c->rem_lcp) + bytes(c->rem_first) + bytes(c->unc_token);
  }
  return total;
}

Result<std::shared_ptr<const CompiledGrammar>> compile(std::shared_ptr<const Grammar> grammar,
                                                       std::shared_ptr<const Vocabulary> vocab,
                                                       const Limits& limits) {
  (void)limits;  // the grammar's size was bounded when it was parsed
  return compile_with_budget(std::move(grammar), std::move(vocab), kCompileWork);
}

Result<std::shared_ptr<const CompiledGrammar>> compile_with_budget(std::shared_ptr<const Grammar> grammar,
                                                                   std::shared_ptr<const Vocabulary> vocab,
                                                                   int64_t work_budget) {
  if (grammar == nullptr || vocab == nullptr)
    return invalid_argument("grammar compile: no grammar or vocabulary");
  const int32_t n_vocab = vocab->n_vocab();
  if (!vocab->excluded.empty() && vocab->excluded.size() != vocab->bytes.size()) {
    return invalid_argument("grammar compile: vocabulary has {} tokens but {} excluded flags", n_vocab,
                            vocab->excluded.size());
  }
  auto cg = std::make_shared<CompiledGrammar>();
  cg->grammar = grammar;
  cg->vocab = vocab;
  cg->is_end.assign(static_cast<size_t>(n_vocab), 0);
  for (int32_t id : vocab->end_ids) {
    if (id < 0 || id >= n_vocab)
      return invalid_argument("grammar compile: end token {} outside [0, {})", id, n_vocab);
    cg->is_end[static_cast<size_t>(id)] = 1;
  }
  cg->trie = token_trie_for(vocab);
  const auto n_states = static_cast<size_t>(grammar->n_states());
  cg->caches = std::make_unique<std::atomic<const PositionCache*>[]>(n_states);
  for (size_t s = 0; s < n_states; ++s) cg->caches[s].store(nullptr, std::memory_order_relaxed);
  StackPool pool;
  StackWalker walker(*grammar, pool);
  for (int32_t s = 0; s < grammar->n_states() && cg->compile_work < work_budget; ++s) {
    if (!grammar->has_bytes(s)) continue;
    cg->owned.push_back(std::make_unique<PositionCache>(build_position_cache(*vocab, *cg->trie, s, walker)));
    cg->compile_work += cg->owned.back()->work;
    cg->caches[static_cast<size_t>(s)].store(cg->owned.back().get(), std::memory_order_release);
  }
  return std::shared_ptr<const CompiledGrammar>(std::move(cg));
}

}  // namespace kiln::grammar
