// The BPE merge loop (shared by both families) and byte-level BPE encoding.
#include <queue>

#include "core/log.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace kiln::tokenizer_detail {

namespace {

// A symbol of the word being merged: a doubly linked list over the initial positions.
struct Symbol {
  int32_t id;    // token id
  int32_t prev;  // index of the previous live symbol, -1 at the start
  int32_t next;  // index of the next live symbol, -1 at the end
  bool alive;
};

// A candidate merge of the symbol at `pos` with its successor.
struct Candidate {
  uint64_t rank;
  int32_t pos;
  int32_t merged;
};

struct CandidateAfter {
  // std::priority_queue pops the greatest: make it the lowest rank, then the leftmost position.
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  }
};

}  // namespace

void bpe_merge(const Vocab& v, std::vector<int32_t>& symbols) {
  const auto n = static_cast<int32_t>(symbols.size());
  if (n < 2 || v.merges.empty()) return;
  std::vector<Symbol> sym(symbols.size());
  for (int32_t i = 0; i < n; ++i) sym[i] = {symbols[i], i - 1, i + 1 < n ? i + 1 : -1, true};
  std::priority_queue<Candidate, std::vector<Candidate>, CandidateAfter> queue;
  auto push = [&](int32_t pos) {
    const int32_t next = sym[pos].next;
    if (next < 0) return;
    const Merge* m = v.merges.find(MergeTable::pair_key(sym[pos].id, sym[next].id));
    if (m != nullptr) queue.push({m->rank, pos, m->merged});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = sym[top.pos];
    if (!left.alive || left.next < 0) continue;
    // Skip candidates made stale by an earlier merge of either side.
    const Merge* m = v.merges.find(MergeTable::pair_key(left.id, sym[left.next].id));
    if (m == nullptr || m->merged != top.merged) continue;
    Symbol& right = sym[left.next];
    left.id = top.merged;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = top.pos;
    if (left.prev >= 0) push(left.prev);
    push(top.pos);
  }
  symbols.clear();
  for (int32_t i = 0; i >= 0; i = sym[i].next) symbols.push_back(sym[i].id);
}

void encode_byte_level(const Vocab& v, std::string_view segment, std::vector<int32_t>& out) {
  std::vector<std::string_view> words;
  if (Status st = v.pre.split(segment, words); !st.ok()) {
    log_warn("tokenizer: {}; encoding the {}-byte segment without pre-tokenization", st.message(),
             segment.size());
    words.assign(1, segment);
  }
  std::vector<int32_t> symbols;
  std::string spelled;
  for (std::string_view word : words) {
    if (v.ignore_merges) {
      spelled = unicode::bytes_to_byte_level(word);
      if (const int32_t id = v.key_index.find(spelled); id >= 0) {
        out.push_back(id);
        continue;
      }
    }
    symbols.clear();
    for (char c : word) {
      const int32_t id = v.byte_char_ids[static_cast<uint8_t>(c)];
      if (id >= 0) {
        symbols.push_back(id);
      } else if (v.model_unk >= 0 && !(v.fuse_unk && !symbols.empty() && symbols.back() == v.model_unk)) {
        symbols.push_back(v.model_unk);
      }
      // Without an unk token a byte the vocabulary lacks is dropped, as Hugging Face does.
    }
    bpe_merge(v, symbols);
    out.insert(out.end(), symbols.begin(), symbols.end());
  }
}

}  // namespace kiln::tokenizer_detail
