#include "tokenizer/tokenizer.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace kiln {

namespace tokenizer_detail {

namespace {

// Control tokens that end a turn in the chat formats kiln knows, besides the declared EOS/EOT/EOM.
constexpr std::string_view kEogTexts[] = {
    "<|eot_id|>", "<|im_end|>",      "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
    "<EOT>",      "<|end_of_text|>", "</s>",    "<|return|>",    "<|call|>",
};

// "<0xAB>" -> 0xAB, or -1 when `key` is not of that form.
int parse_byte_token(std::string_view key) {
  if (key.size() != 6 || !key.starts_with("<0x") || key[5] != '>') return -1;
  int value = 0;
  for (char c : key.substr(3, 2)) {
    int d = -1;
    if (c >= '0' && c <= '9') d = c - '0';
    if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    if (d < 0) return -1;
    value = value * 16 + d;
  }
  return value;
}

void build_trie(Vocab& v) {
  v.trie_edges.clear();
  v.trie_token.assign(1, -1);
  v.trie_first.fill(false);
  for (size_t i = 0; i < v.added.size(); ++i) {
    const std::string& text = v.added[i].content;
    if (text.empty()) continue;
    v.trie_first[static_cast<uint8_t>(text[0])] = true;
    int32_t node = 0;
    for (char c : text) {
      const uint64_t edge = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(c);
      auto [it, inserted] = v.trie_edges.emplace(edge, static_cast<int32_t>(v.trie_token.size()));
      if (inserted) v.trie_token.push_back(-1);
      node = it->second;
    }
    v.trie_token[node] = static_cast<int32_t>(i);  // a repeated content: the last declaration wins
  }
}

void build_pieces(Vocab& v) {
  const int32_t n = v.n_vocab();
  v.pieces.assign(n, std::string());
  v.byte_ids.fill(-1);
  v.byte_char_ids.fill(-1);
  for (int32_t id = 0; id < n; ++id) {
    const std::string& key = v.keys[id];
    if (v.model == TokenizerModel::byte_level_bpe) {
      std::string bytes;
      v.pieces[id] = unicode::byte_level_to_bytes(key, bytes) ? bytes : key;
      continue;
    }
    const int byte = parse_byte_token(key);
    if (byte >= 0) {
      v.pieces[id].assign(1, static_cast<char>(byte));
      continue;
    }
    std::string& piece = v.pieces[id];
    for (size_t pos = 0; pos < key.size();) {
      if (key.compare(pos, 3, "\xE2\x96\x81") == 0) {
        piece.push_back(' ');
        pos += 3;
      } else {
        piece.push_back(key[pos++]);
      }
    }
  }
  // Added tokens decode to their own text.
  for (const AddedToken& t : v.added) v.pieces[t.id] = t.content;
  for (int b = 0; b < 256; ++b) {
    if (v.model == TokenizerModel::spm_bpe) {
      if (const int32_t id = v.key_index.find(fmt::format("<0x{:02X}>", b)); id >= 0) v.byte_ids[b] = id;
    } else {
      std::string ch;
      unicode::utf8_append(ch, unicode::byte_to_codepoint()[b]);
      if (const int32_t id = v.key_index.find(ch); id >= 0) v.byte_char_ids[b] = id;
    }
  }
}

}  // namespace

void build_key_index(Vocab& v) { v.key_index.build(v.keys); }

Status finalize_vocab(Vocab& v, std::string_view source) {
  const int32_t n = v.n_vocab();
  if (n <= 0) return invalid_argument("{}: the vocabulary is empty", source);
  if (v.types.size() != v.keys.size()) {
    return make_status(StatusCode::internal, "{}: {} token types for {} tokens", source, v.types.size(),
                       v.keys.size());
  }
  const std::pair<const char*, int32_t> ids[] = {{"bos", v.bos},
                                                 {"eos", v.eos},
                                                 {"eot", v.eot},
                                                 {"eom", v.eom},
                                                 {"unk", v.unk},
                                                 {"pad", v.pad},
                                                 {"model unk", v.model_unk}};
  for (const auto& [name, id] : ids) {
    if (id < -1 || id >= n) {
      return out_of_range("{}: {} token id {} is outside the vocabulary of {} tokens", source, name, id, n);
    }
  }
  size_t added_bytes = 0;
  for (size_t i = 0; i < v.added.size(); ++i) {
    const AddedToken& t = v.added[i];
    if (t.id < 0 || t.id >= n) {
      return out_of_range("{}: added token {} (\"{}\") has id {} outside the vocabulary of {} tokens", source,
                          i, t.content.substr(0, 64), t.id, n);
    }
    added_bytes += t.content.size();
    if (added_bytes > kMaxAddedTokenBytes) {
      return resource_exhausted(
          "{}: the added and special tokens hold more than {} bytes of text (token {}, id {}, is {} bytes)",
          source, kMaxAddedTokenBytes, i, t.id, t.content.size());
    }
  }
  build_pieces(v);
  build_trie(v);
  v.special.assign(n, 0);
  for (const AddedToken& t : v.added) v.special[t.id] = t.special ? 1 : 0;
  for (int32_t id : {v.bos, v.eos, v.eot, v.eom, v.unk, v.pad}) {
    if (id >= 0) v.special[id] = 1;
  }
  v.eog.clear();
  for (int32_t id : {v.eos, v.eot, v.eom}) {
    if (id >= 0) v.eog.push_back(id);
  }
  for (const AddedToken& t : v.added) {
    if (!t.special) continue;
    for (std::string_view text : kEogTexts) {
      if (t.content == text) v.eog.push_back(t.id);
    }
  }
  std::sort(v.eog.begin(), v.eog.end());
  v.eog.erase(std::unique(v.eog.begin(), v.eog.end()), v.eog.end());
  return Status::ok_status();
}

}  // namespace tokenizer_detail

using tokenizer_detail::AddedToken;
using tokenizer_detail::Vocab;

namespace {

// `text` with every invalid UTF-8 sequence replaced by U+FFFD (one per invalid byte).
std::string sanitize_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 8);
  uint32_t cp = 0;
  for (size_t pos = 0; pos < text.size();) {
    const size_t len = unicode::utf8_decode(text, pos, cp);
    if (len == 0) {
      out += "\xEF\xBF\xBD";
      ++pos;
    } else {
      out.append(text.substr(pos, len));
      pos += len;
    }
  }
  return out;
}

// The longest added token starting at `pos` (index into v.added), or -1. Special tokens count only when
// `parse_special`.
int32_t match_added(const Vocab& v, std::string_view text, size_t pos, bool parse_special, size_t& end) {
  int32_t node = 0, best = -1;
  for (size_t i = pos; i < text.size(); ++i) {
    auto it = v.trie_edges.find((static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(text[i]));
    if (it == v.trie_edges.end()) break;
    node = it->second;
    const int32_t t = v.trie_token[node];
    if (t >= 0 && (parse_special || !v.added[t].special)) {
      best = t;
      end = i + 1;
    }
  }
  return best;
}

}  // namespace

void Tokenizer::encode_segment(std::string_view segment, bool at_start, std::vector<int32_t>& out) const {
  if (segment.empty()) return;
  if (v_->model == TokenizerModel::byte_level_bpe) {
    tokenizer_detail::encode_byte_level(*v_, segment, out);
  } else {
    tokenizer_detail::encode_spm(*v_, segment, at_start, out);
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  std::string clean;
  if (!unicode::utf8_valid(text)) {
    clean = sanitize_utf8(text);
    text = clean;
  }
  const Vocab& v = *v_;
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special && v.add_bos && v.bos >= 0) ids.push_back(v.bos);
  size_t seg_start = 0, pos = 0;
  while (pos < text.size()) {
    size_t end = 0;
    const int32_t t =
        v.trie_first[static_cast<uint8_t>(text[pos])] ? match_added(v, text, pos, parse_special, end) : -1;
    if (t < 0) {
      ++pos;
      continue;
    }
    encode_segment(text.substr(seg_start, pos - seg_start), seg_start == 0, ids);
    ids.push_back(v.added[t].id);
    pos = seg_start = end;
  }
  encode_segment(text.substr(seg_start), seg_start == 0, ids);
  if (add_special && v.add_eos && v.eos >= 0) ids.push_back(v.eos);
  return ids;
}

bool Tokenizer::append_piece(int32_t id, bool skip_special, bool first, std::string& out) const {
  if (id < 0 || id >= n_vocab()) return false;
  if (skip_special && v_->special[id]) return true;
  std::string_view piece = v_->pieces[id];
  if (first && v_->strip_space_prefix && piece.starts_with(' ')) piece.remove_prefix(1);
  out.append(piece);
  return true;
}

Result<std::string> Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  bool first = true;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!append_piece(ids[i], skip_special, first, out)) {
      return out_of_range("decode: token {} is id {}, outside the vocabulary of {} tokens", i, ids[i],
                          n_vocab());
    }
    if (!(skip_special && v_->special[ids[i]])) first = false;
  }
  return out;
}

std::string Tokenizer::token_to_piece(int32_t id) const {
  if (id < 0 || id >= n_vocab()) return {};
  return v_->pieces[id];
}

bool Tokenizer::is_special(int32_t id) const { return id >= 0 && id < n_vocab() && v_->special[id] != 0; }

bool Tokenizer::is_eog(int32_t id) const { return std::binary_search(v_->eog.begin(), v_->eog.end(), id); }

TokenType Tokenizer::token_type(int32_t id) const {
  return id >= 0 && id < n_vocab() ? v_->types[id] : TokenType::undefined;
}

std::optional<int32_t> Tokenizer::token_id(std::string_view text) const {
  const Vocab& v = *v_;
  for (const AddedToken& t : v.added) {
    if (t.content == text) return t.id;
  }
  if (const int32_t id = v.key_index.find(text); id >= 0) return id;
  std::string spelled;
  if (v.model == TokenizerModel::byte_level_bpe) {
    spelled = unicode::bytes_to_byte_level(text);
  } else {
    for (char c : text) spelled += c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c);
  }
  if (const int32_t id = v.key_index.find(spelled); id >= 0) return id;
  return std::nullopt;
}

}  // namespace kiln
