#include "grammar/token_trie.h"

#include <algorithm>
#include <map>
#include <mutex>

namespace kiln::grammar {

TokenTrie build_token_trie(const Vocabulary& vocab) {
  TokenTrie t;
  std::vector<uint8_t> skip(vocab.bytes.size(), 0);
  for (int32_t id : vocab.end_ids) {
    if (id >= 0 && id < vocab.n_vocab()) skip[static_cast<size_t>(id)] = 1;
  }
  for (int32_t id = 0; id < vocab.n_vocab(); ++id) {
    const auto i = static_cast<size_t>(id);
    if (skip[i] || vocab.bytes[i].empty() || (i < vocab.excluded.size() && vocab.excluded[i])) continue;
    t.order.push_back(id);
  }
  std::sort(t.order.begin(), t.order.end(), [&](int32_t a, int32_t b) {
    const std::string& x = vocab.bytes[static_cast<size_t>(a)];
    const std::string& y = vocab.bytes[static_cast<size_t>(b)];
    return x != y ? x < y : a < b;
  });
  // Sorted strings visit the trie in preorder: token i adds the nodes below its common prefix with token i-1.
  t.nodes.push_back(TokenTrieNode{});
  std::vector<int32_t> path{0};  // node at each depth of the current token
  std::string_view prev;
  const auto n = static_cast<int32_t>(t.order.size());
  auto close_below = [&](size_t depth, int32_t rank) {  // nodes deeper than `depth` end before token `rank`
    while (path.size() > depth + 1) {
      TokenTrieNode& node = t.nodes[static_cast<size_t>(path.back())];
      node.end = static_cast<int32_t>(t.nodes.size());
      node.tok_end = rank;
      path.pop_back();
    }
  };
  for (int32_t rank = 0; rank < n; ++rank) {
    const std::string_view cur = t.bytes_of_rank(rank, vocab);
    size_t lcp = 0;
    while (lcp < prev.size() && lcp < cur.size() && prev[lcp] == cur[lcp]) ++lcp;
    close_below(lcp, rank);
    for (size_t d = lcp; d < cur.size(); ++d) {
      TokenTrieNode node;
      node.depth = static_cast<int32_t>(d + 1);
      node.byte = static_cast<uint8_t>(cur[d]);
      node.tok_begin = node.tok_here_end = rank;
      path.push_back(static_cast<int32_t>(t.nodes.size()));
      t.nodes.push_back(node);
    }
    t.nodes[static_cast<size_t>(path.back())].tok_here_end = rank + 1;
    prev = cur;
  }
  close_below(0, n);
  t.nodes[0].end = static_cast<int32_t>(t.nodes.size());
  t.nodes[0].tok_end = n;
  return t;
}

std::shared_ptr<const TokenTrie> token_trie_for(const std::shared_ptr<const Vocabulary>& vocab) {
  struct Entry {
    std::weak_ptr<const Vocabulary> vocab;
    std::shared_ptr<const TokenTrie> trie;  // kept while the vocabulary lives
  };
  static std::mutex mutex;
  static std::map<const Vocabulary*, Entry> cache;
  std::lock_guard<std::mutex> lock(mutex);
  for (auto it = cache.begin(); it != cache.end();) {  // forget vocabularies that are gone
    it = it->second.vocab.expired() ? cache.erase(it) : std::next(it);
  }
  auto it = cache.find(vocab.get());
  if (it != cache.end() && it->second.vocab.lock() == vocab) {
    return it->second.trie;
  }
  auto trie = std::make_shared<const TokenTrie>(build_token_trie(*vocab));
  cache[vocab.get()] = Entry{vocab, trie};
  return trie;
}

}  // namespace kiln::grammar
