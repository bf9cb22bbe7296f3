// The vocabulary's token bytes as a trie, for walking every token through a grammar state at once.
// Internal to grammar/.
//
// Tokens (those with bytes, neither excluded nor end tokens) are sorted by bytes; trie nodes are stored in
// preorder, so a node's subtree is the node range [id, end) and its tokens are the sorted-token range
// [tok_begin, tok_end), those whose bytes end exactly at the node first: [tok_begin, tok_here_end).
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"

namespace kiln::grammar {

struct TokenTrieNode {
  int32_t depth = 0;         // bytes from the root
  int32_t end = 0;           // one past the last node of the subtree
  int32_t tok_begin = 0;     // into TokenTrie::order
  int32_t tok_here_end = 0;  // tokens ending here: [tok_begin, tok_here_end)
  int32_t tok_end = 0;       // tokens of the subtree: [tok_begin, tok_end)
  uint8_t byte = 0;          // the edge from the parent (none at the root)
};

struct TokenTrie {
  std::vector<int32_t> order;        // [n_tokens] token ids sorted by bytes
  std::vector<TokenTrieNode> nodes;  // preorder, nodes[0] the root (depth 0)
  std::string_view bytes_of_rank(int32_t rank, const Vocabulary& v) const {
    return v.bytes[static_cast<size_t>(order[static_cast<size_t>(rank)])];
  }
};

TokenTrie build_token_trie(const Vocabulary& vocab);
// One trie per vocabulary object, kept while the vocabulary lives and shared by every grammar compiled
// against it.
std::shared_ptr<const TokenTrie> token_trie_for(const std::shared_ptr<const Vocabulary>& vocab);

}  // namespace kiln::grammar
