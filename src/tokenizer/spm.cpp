// SentencePiece-style BPE: space escaping, byte fallback, and merges recovered from the vocabulary.
#include <algorithm>

#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace kiln::tokenizer_detail {

namespace {

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581, SentencePiece's visible space

// Appends the initial symbols of `word` (one per character) to `symbols`.
void spm_symbols(const Vocab& v, std::string_view word, std::vector<int32_t>& symbols) {
  size_t pos = 0;
  uint32_t cp = 0;
  bool last_unk = false;
  while (pos < word.size()) {
    size_t len = unicode::utf8_decode(word, pos, cp);
    if (len == 0) len = 1;  // cannot happen on validated text; treated as one byte
    const std::string_view ch = word.substr(pos, len);
    pos += len;
    if (const int32_t id = v.key_index.find(ch); id >= 0) {
      symbols.push_back(id);
      last_unk = false;
      continue;
    }
    if (v.byte_fallback) {
      bool all = true;
      for (char c : ch) all = all && v.byte_ids[static_cast<uint8_t>(c)] >= 0;
      if (all) {
        for (char c : ch) symbols.push_back(v.byte_ids[static_cast<uint8_t>(c)]);
        last_unk = false;
        continue;
      }
    }
    if (v.model_unk < 0) continue;  // no unk token: the character is dropped, as Hugging Face does
    if (!(v.fuse_unk && last_unk)) symbols.push_back(v.model_unk);
    last_unk = true;
  }
}

}  // namespace

void encode_spm(const Vocab& v, std::string_view segment, bool at_start, std::vector<int32_t>& out) {
  std::string text;
  text.reserve(segment.size() + 8);
  if (v.spm_prepend_segments && !segment.empty()) text += kMetaspace;
  for (char c : segment) {
    if (c == ' ' && v.spm_escape_spaces) {
      text += kMetaspace;
    } else {
      text.push_back(c);
    }
  }
  if (v.add_space_prefix && at_start && !text.starts_with(kMetaspace)) text.insert(0, kMetaspace);
  std::vector<int32_t> symbols;
  auto run = [&](std::string_view word) {
    symbols.clear();
    spm_symbols(v, word, symbols);
    bpe_merge(v, symbols);
    out.insert(out.end(), symbols.begin(), symbols.end());
  };
  if (!v.spm_split_metaspace) {
    if (!text.empty()) run(text);
    return;
  }
  // Split before every U+2581 (the metaspace stays with the text after it).
  std::string_view rest = text;
  while (!rest.empty()) {
    size_t cut = rest.find(kMetaspace, 1);
    if (cut == std::string_view::npos) cut = rest.size();
    run(rest.substr(0, cut));
    rest.remove_prefix(cut);
  }
}

Status generate_spm_merges(Vocab& v, const std::vector<double>& scores, std::string_view source) {
  // Bounded before any of it is done; the sum stops once over the budget (no overflow).
  uint64_t work = 0;
  size_t longest = 0;
  for (size_t id = 0; id < v.keys.size() && work <= kMaxSpmSplitWork; ++id) {
    const uint64_t n = v.keys[id].size();
    work += n * n;
    if (n > v.keys[longest].size()) longest = id;
  }
  if (work > kMaxSpmSplitWork) {
    return resource_exhausted(
        "{}: the vocabulary's tokens are too long to derive merges from (sum of squared lengths over {}); "
        "the longest is token {}, {} bytes",
        source, kMaxSpmSplitWork, longest, v.keys[longest].size());
  }
  // One candidate per split of a token into two vocabulary tokens, ranked by the merged token's score
  // (scores[merged]: higher merges first).
  struct Candidate {
    uint32_t len_l;  // code points of the left part: longer first
    uint32_t len_r;  // code points of the right part: longer first
    int32_t order;   // first position of the merged token's key in the vocabulary
    int32_t left, right, merged;
  };
  std::vector<Candidate> cands;
  cands.reserve(v.keys.size() * 2);
  // A repeated key is visited once, at its first position, with the id (and score) of its last.
  KeyIndex first;
  first.build(v.keys, /*first_wins=*/true);
  std::vector<size_t> bounds;  // byte offsets of the code point boundaries of one key
  for (int32_t id = 0; id < v.n_vocab(); ++id) {
    const std::string& key = v.keys[id];
    const int32_t merged = v.key_index.find(key);
    if (merged < 0 || first.find(key) != id) continue;
    bounds.clear();
    uint32_t cp = 0;
    for (size_t pos = 0; pos < key.size();) {
      const size_t len = unicode::utf8_decode(key, pos, cp);
      pos += len == 0 ? 1 : len;
      bounds.push_back(pos);
    }
    const auto n_cp = static_cast<uint32_t>(bounds.size());
    for (uint32_t k = 0; k + 1 < n_cp; ++k) {
      const int32_t il = v.key_index.find(std::string_view(key).substr(0, bounds[k]));
      if (il < 0) continue;
      const int32_t ir = v.key_index.find(std::string_view(key).substr(bounds[k]));
      if (ir < 0) continue;
      cands.push_back({k + 1, n_cp - k - 1, id, il, ir, merged});
    }
  }
  std::sort(cands.begin(), cands.end(), [&](const Candidate& a, const Candidate& b) {
    const double sa = scores[a.merged], sb = scores[b.merged];
    if (sa != sb) return sa > sb;
    if (a.len_l != b.len_l) return a.len_l > b.len_l;
    if (a.len_r != b.len_r) return a.len_r > b.len_r;
    return a.order < b.order;
  });
  v.merges.clear();
  v.merges.reserve(cands.size());
  for (size_t i = 0; i < cands.size(); ++i) {
    v.merges.insert(MergeTable::pair_key(cands[i].left, cands[i].right),
                    Merge{static_cast<uint32_t>(i), cands[i].merged});
  }
  return {};
}

}  // namespace kiln::tokenizer_detail
