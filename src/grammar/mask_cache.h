// The per-state token masks a compiled grammar keeps (xgrammar's adaptive token mask cache). Internal to
// grammar/.
//
// For a state s with byte edges, walking the whole token trie from a stack whose base frame is s (and whose
// first byte takes one of s's byte edges) sorts every token into:
//  - accepted: its bytes are consumed without returning from s's rule (calls into other rules allowed): it is
//    allowed on top of any stack;
//  - uncertain: some path returns from s's rule after the token's first k bytes, and the next byte can follow
//    the rule somewhere in the grammar (Grammar::follow): the token is allowed exactly when its remainder
//    bytes[k:] continues some stack below the frame. A token may have several such k;
//  - rejected: everything else.
// At run time a mask is the union of the accepted sets of the current stacks' top states, plus the uncertain
// tokens whose remainder the stacks below accept (each distinct remainder walked once, sorted, sharing
// prefixes).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "grammar/automaton.h"
#include "grammar/stack_walk.h"
#include "grammar/token_trie.h"

namespace kiln::grammar {

struct PositionCache {
  std::vector<uint32_t> accept_bits;  // [mask_words(n_vocab)] or empty: the accepted tokens are accept_ids
  std::vector<int32_t> accept_ids;    // sorted token ids, when fewer words than the bitset
  // Distinct remainders, sorted by bytes: remainder i is vocab.bytes[rem_token[i]] from rem_offset[i] on.
  std::vector<int32_t> rem_token, rem_offset;
  std::vector<int32_t> rem_lcp;  // [n_rem] bytes in common with remainder i-1 (0 for i = 0)
  // The uncertain tokens, grouped by remainder: those of remainder i are unc_token[rem_first[i] ..
  // rem_first[i + 1]).
  std::vector<int32_t> rem_first;  // [n_rem + 1]
  std::vector<int32_t> unc_token;  // [n_uncertain]
  int64_t work = 0;                // trie nodes visited + uncertain entries made to build it
};

// Builds the cache of `state` (one with byte edges) walking the trie; `walker` uses a pool of its own that
// this clears.
PositionCache build_position_cache(const Vocabulary& vocab, const TokenTrie& trie, int32_t state,
                                   StackWalker& walker);

struct CompiledGrammar {
  std::shared_ptr<const Grammar> grammar;
  std::shared_ptr<const Vocabulary> vocab;
  std::shared_ptr<const TokenTrie> trie;
  std::vector<uint8_t> is_end;  // [n_vocab] 1: an end token

  // The cache of a state with byte edges: built by compile() for the states its budget covered, else on
  // first use (under a lock; then shared).
  const PositionCache& position(int32_t state) const;

  mutable std::unique_ptr<std::atomic<const PositionCache*>[]> caches;  // [n_states]
  mutable std::vector<std::unique_ptr<PositionCache>> owned;            // the built caches
  mutable std::mutex build_mutex;                                       // guards owned and building
  int64_t compile_work = 0;                                             // trie nodes visited by compile()
};

// compile() with the trie-walk budget given (compile uses about a second's worth); 0 builds every cache on
// first use.
Result<std::shared_ptr<const CompiledGrammar>> compile_with_budget(std::shared_ptr<const Grammar> grammar,
                                                                   std::shared_ptr<const Vocabulary> vocab,
                                                                   int64_t work_budget);

}  // namespace kiln::grammar
