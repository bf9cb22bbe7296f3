// Matcher: a request's set of parse stacks (stack_walk.h) and its masks from the per-state caches
// (mask_cache.h).
#include <algorithm>

#include "grammar/grammar.h"
#include "grammar/mask_cache.h"
#include "grammar/stack_walk.h"

namespace kiln::grammar {

struct Matcher::State {
  explicit State(std::shared_ptr<const CompiledGrammar> g) : cg(std::move(g)), walker(*cg->grammar, pool) {}

  std::shared_ptr<const CompiledGrammar> cg;
  StackPool pool;
  StackWalker walker;
  std::vector<Stack> stacks;  // expanded, sorted by top state
  bool can_end = false;       // a stack returned below the root after the last token
  bool terminated = false;    // an end token was accepted
  size_t compacted_size = 0;  // pool size after the last compaction
  // Scratch.
  std::vector<Stack> next, popped, start, raw;
  std::vector<std::vector<Stack>> depth_sets;

  const Vocabulary& vocab() const { return *cg->vocab; }

  void set_stacks(std::vector<Stack>& s) {
    std::swap(stacks, s);
    std::sort(stacks.begin(), stacks.end(), [](const Stack& a, const Stack& b) { return a.key() < b.key(); });
  }
  void maybe_compact() {
    if (pool.size() < 4096 || pool.size() < 2 * compacted_size) return;
    pool.compact(stacks);
    compacted_size = pool.size();
  }
  bool text_token(int32_t token) const {
    const auto i = static_cast<size_t>(token);
    const Vocabulary& v = vocab();
    return !cg->is_end[i] && !v.bytes[i].empty() && !(i < v.excluded.size() && v.excluded[i]);
  }
  void evaluate_remainders(const PositionCache& pc, std::span<uint32_t> words);
};

// Sets the uncertain tokens of `pc` whose remainder continues some stack of `start`. Sorted remainders share
// prefixes: the sets along the previous remainder are kept per depth, and a prefix that died kills the
// following remainders sharing it.
void Matcher::State::evaluate_remainders(const PositionCache& pc, std::span<uint32_t> words) {
  const size_t n = pc.rem_token.size();
  if (depth_sets.empty()) depth_sets.resize(1);
  depth_sets[0] = start;
  size_t valid = 0;        // depth_sets[0..valid] follow the previous remainder's prefix
  size_t dead = SIZE_MAX;  // that prefix's first `dead` bytes have no continuation
  for (size_t i = 0; i < n; ++i) {
    const auto lcp = static_cast<size_t>(pc.rem_lcp[i]);
    if (lcp >= dead) continue;
    dead = SIZE_MAX;
    valid = std::min(valid, lcp);
    const std::string_view rem = std::string_view(vocab().bytes[static_cast<size_t>(pc.rem_token[i])])
                                     .substr(static_cast<size_t>(pc.rem_offset[i]));
    for (size_t d = valid; d < rem.size(); ++d) {
      walker.step(depth_sets[d], static_cast<uint8_t>(rem[d]), raw);
      if (raw.empty()) {
        dead = d + 1;
        break;
      }
      if (d + 1 == rem.size()) {
        for (int32_t k = pc.rem_first[i]; k < pc.rem_first[i + 1]; ++k) {
          const int32_t token = pc.unc_token[static_cast<size_t>(k)];
          words[static_cast<size_t>(token) / 32] |= 1u << (token % 32);
        }
        break;
      }
      if (depth_sets.size() <= d + 1) depth_sets.resize(d + 2);
      WalkEvents ev;
      walker.expand(raw, depth_sets[d + 1], ev);
      valid = d + 1;
    }
  }
}

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> grammar) {
  KILN_ASSERT(grammar != nullptr);
  state_ = std::make_unique<State>(std::move(grammar));
  State& st = *state_;
  const Grammar& g = *st.cg->grammar;
  const Stack root{kStackEnd, g.rule_start[static_cast<size_t>(g.root)]};
  WalkEvents ev;
  st.walker.expand(std::span<const Stack>(&root, 1), st.next, ev);
  st.can_end = ev.ended;
  st.set_stacks(st.next);
}

Matcher::~Matcher() = default;
Matcher::Matcher(Matcher&&) noexcept = default;
Matcher& Matcher::operator=(Matcher&&) noexcept = default;

void Matcher::fill_mask(std::span<uint32_t> words) {
  State& st = *state_;
  const Vocabulary& v = st.vocab();
  KILN_ASSERT(words.size() >= mask_words(v.n_vocab()));
  std::fill(words.begin(), words.end(), 0u);
  if (st.terminated) return;
  for (size_t lo = 0; lo < st.stacks.size();) {
    const int32_t state = st.stacks[lo].state;
    size_t hi = lo;
    while (hi < st.stacks.size() && st.stacks[hi].state == state) ++hi;
    const PositionCache& pc = st.cg->position(state);
    if (!pc.accept_bits.empty()) {
      for (size_t w = 0; w < pc.accept_bits.size(); ++w) words[w] |= pc.accept_bits[w];
    } else {
      for (int32_t id : pc.accept_ids) words[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
    }
    if (!pc.rem_token.empty()) {
      st.popped.clear();
      for (size_t k = lo; k < hi; ++k) {  // sorted by key: by state, then below
        const int32_t b = st.stacks[k].below;
        if (b >= 0 && (k == lo || st.stacks[k - 1].below != b)) st.popped.push_back(st.walker.pop_to(b));
      }
      WalkEvents ev;
      st.walker.expand(st.popped, st.start, ev);
      if (!st.start.empty()) st.evaluate_remainders(pc, words);
    }
    lo = hi;
  }
  if (st.can_end) {
    for (int32_t id : v.end_ids) words[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
  }
  st.maybe_compact();
}

void Matcher::fill_mask_reference(std::span<uint32_t> words) {
  State& st = *state_;
  const Vocabulary& v = st.vocab();
  KILN_ASSERT(words.size() >= mask_words(v.n_vocab()));
  std::fill(words.begin(), words.end(), 0u);
  if (st.terminated) return;
  for (int32_t id = 0; id < v.n_vocab(); ++id) {
    if (!st.text_token(id)) continue;
    WalkEvents ev;
    if (st.walker.consume(st.stacks, v.bytes[static_cast<size_t>(id)], st.next, ev)) {
      words[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
    }
    st.maybe_compact();
  }
  if (st.can_end) {
    for (int32_t id : v.end_ids) words[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
  }
}

bool Matcher::accept(int32_t token) {
  State& st = *state_;
  const Vocabulary& v = st.vocab();
  if (st.terminated || token < 0 || token >= v.n_vocab()) return false;
  if (st.cg->is_end[static_cast<size_t>(token)]) {
    if (!st.can_end) return false;
    st.terminated = true;
    st.stacks.clear();
    st.can_end = false;
    return true;
  }
  if (!st.text_token(token)) return false;
  WalkEvents ev;
  if (!st.walker.consume(st.stacks, v.bytes[static_cast<size_t>(token)], st.next, ev)) {
    st.maybe_compact();
    return false;
  }
  st.set_stacks(st.next);
  st.can_end = ev.ended;
  st.maybe_compact();
  return true;
}

bool Matcher::can_end() const { return !state_->terminated && state_->can_end; }

bool Matcher::done() const { return state_->terminated || (state_->stacks.empty() && state_->can_end); }

}  // namespace kiln::grammar
