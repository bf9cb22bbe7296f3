#include "tokenizer/gguf_export.h"

#include <algorithm>

#include "formats/gguf.h"
#include "tokenizer/unicode.h"

namespace kiln {

using gguf::Value;
using gguf::ValueType;
using tokenizer_detail::Vocab;

namespace {

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581

// A llama.cpp pre-tokenizer name and the regexes llama.cpp splits with under it, spelled as tokenizer.json
// spells them (the form a Vocab holds). Several llama.cpp names share one list; the first is written.
struct PreName {
  std::string name;
  std::vector<std::string> patterns;
};

const std::vector<PreName>& pre_names() {
  static const std::vector<PreName> names = [] {
    std::vector<PreName> out;
    // kiln's reader and llama.cpp split the same way under each of these names ("smollm": digits one at a
    // time, then GPT-2's regex, as tokenizer.json's Digits(individual) + ByteLevel).
    for (const char* name : {"gpt-2", "llama-bpe", "qwen2", "deepseek-coder", "deepseek-v3", "smollm"}) {
      auto pre = PreTokenizer::from_gguf_name(name);
      KILN_ASSERT(pre.ok());
      out.push_back({name, pre->patterns()});
    }
    return out;
  }();
  return names;
}

bool in_byte_alphabet(std::string_view s) {
  std::string bytes;
  return unicode::byte_level_to_bytes(s, bytes);
}

// Whether a byte-level vocabulary lacks the character of some byte: only then can byte fallback (or unk) act.
bool byte_char_missing(const Vocab& v) {
  return std::any_of(v.byte_char_ids.begin(), v.byte_char_ids.end(), [](int32_t id) { return id < 0; });
}
// The bytes whose characters a byte-level vocabulary lacks, as "0x04, 0x06, ..." (the first 8).
std::string missing_bytes(const Vocab& v) {
  std::string out;
  int n = 0;
  for (size_t b = 0; b < v.byte_char_ids.size(); ++b) {
    if (v.byte_char_ids[b] >= 0) continue;
    if (n < 8) out += fmt::format("{}0x{:02x}", out.empty() ? "" : ", ", b);
    ++n;
  }
  if (n > 8) out += fmt::format(" and {} more", n - 8);
  return out;
}

// True when unknown characters can reach BPE's unk token (byte fallback does not cover every byte).
bool unk_reachable(const Vocab& v) {
  if (v.model == TokenizerModel::byte_level_bpe) return byte_char_missing(v);
  return !v.byte_fallback ||
         std::any_of(v.byte_ids.begin(), v.byte_ids.end(), [](int32_t id) { return id < 0; });
}

// The unk id kiln's GGUF reader gives a SentencePiece vocabulary (unknown_token_id, else "<unk>").
int32_t spm_reader_unk(const Vocab& v) {
  if (v.unk >= 0) return v.unk;
  return v.key_index.find("<unk>");
}

// Vocab features the GGUF keys cannot carry, as an error naming the feature; ok when there are none.
Status check_expressible(const Vocab& v) {
  constexpr std::string_view where = "write_gguf_tokenizer";
  if (v.model == TokenizerModel::byte_level_bpe) {
    if (v.spm_escape_spaces || v.spm_prepend_segments || v.spm_split_metaspace || v.add_space_prefix) {
      return unimplemented("{}: a byte-level tokenizer with SentencePiece space handling has no GGUF form",
                           where);
    }
    // Byte fallback never acts where every byte has its character in the vocabulary (transformers 4.x
    // writes it so for a GGUF "gpt2" vocabulary of a Llama model): the GGUF form leaves it out.
    if (v.byte_fallback && byte_char_missing(v)) {
      return unimplemented(
          "{}: a byte-level tokenizer with byte fallback for bytes missing from its vocabulary ({}) has no "
          "GGUF form",
          where, missing_bytes(v));
    }
    if (v.strip_space_prefix) {
      return unimplemented("{}: a byte-level tokenizer whose decoder strips a leading space has no GGUF form",
                           where);
    }
    if (v.model_unk >= 0 && unk_reachable(v)) {
      return unimplemented(
          "{}: a byte-level tokenizer that emits unk (id {}) for bytes missing from its "
          "vocabulary ({}) has no GGUF form",
          where, v.model_unk, missing_bytes(v));
    }
    return Status::ok_status();
  }
  if (!v.spm_escape_spaces) {
    return unimplemented(
        "{}: a SentencePiece-style tokenizer that keeps spaces (no U+2581 escaping) has no "
        "GGUF form",
        where);
  }
  if (v.spm_split_metaspace) {
    // Splitting before each U+2581 matters only when some token has one after its first character.
    for (int32_t id = 0; id < v.n_vocab(); ++id) {
      if (v.keys[id].find(kMetaspace, 1) != std::string::npos) {
        return unimplemented(
            "{}: the pre-tokenizer splits before each U+2581 and token {} (\"{}\") spans "
            "one; GGUF \"llama\" tokenizers do not split",
            where, id, v.keys[id]);
      }
    }
  }
  if (v.ignore_merges) {
    return unimplemented("{}: ignore_merges on a SentencePiece-style tokenizer has no GGUF form", where);
  }
  const bool prefix = v.add_space_prefix || v.spm_prepend_segments;
  if (v.strip_space_prefix != prefix) {
    return unimplemented("{}: the decoder {} a leading space but add_space_prefix is {}; GGUF ties the two",
                         where, v.strip_space_prefix ? "strips" : "keeps", prefix);
  }
  if (!v.byte_fallback &&
      std::any_of(v.byte_ids.begin(), v.byte_ids.end(), [](int32_t id) { return id >= 0; })) {
    return unimplemented(
        "{}: byte fallback is off but the vocabulary has <0xXX> tokens; GGUF \"llama\" "
        "tokenizers always fall back to them",
        where);
  }
  if (unk_reachable(v) && (!v.fuse_unk || v.model_unk != spm_reader_unk(v))) {
    return unimplemented(
        "{}: unknown characters become unk id {} (fuse_unk {}) where a GGUF \"llama\" "
        "tokenizer would emit id {} (fused)",
        where, v.model_unk, v.fuse_unk, spm_reader_unk(v));
  }
  return Status::ok_status();
}

// One merge of the vocabulary, for sorting by rank.
struct RankedMerge {
  uint64_t rank;
  int32_t left, right, merged;
};

std::vector<RankedMerge> merges_by_rank(const Vocab& v) {
  std::vector<RankedMerge> out;
  out.reserve(v.merges.size());
  v.merges.for_each([&](uint64_t pair, const tokenizer_detail::Merge& m) {
    out.push_back(
        {m.rank, static_cast<int32_t>(pair >> 32), static_cast<int32_t>(pair & 0xFFFFFFFFu), m.merged});
  });
  std::sort(out.begin(), out.end(),
            [](const RankedMerge& a, const RankedMerge& b) { return a.rank < b.rank; });
  return out;
}

Value string_array(const std::vector<std::string>& items) {
  std::vector<Value> values;
  values.reserve(items.size());
  for (const std::string& s : items) values.push_back(Value::str(s));
  return Value::array(ValueType::string, std::move(values));
}

}  // namespace

Result<std::string> gguf_pre_name(const std::vector<std::string>& patterns) {
  for (const PreName& p : pre_names()) {
    if (p.patterns == patterns) return p.name;
  }
  std::string listed;
  for (const std::string& pat : patterns) listed += fmt::format("{}\"{}\"", listed.empty() ? "" : ", ", pat);
  return unimplemented(
      "no llama.cpp tokenizer.ggml.pre name splits with the regexes [{}]; writing another "
      "name would make llama.cpp tokenize differently",
      listed);
}

Status write_gguf_tokenizer(const Tokenizer& tok, gguf::Writer& w, int32_t n_vocab_model,
                            const std::optional<std::string>& chat_template) {
  const Vocab& v = tok.vocab();
  const int32_t n = v.n_vocab();
  if (n_vocab_model < n) {
    return invalid_argument(
        "write_gguf_tokenizer: n_vocab_model = {} is smaller than the tokenizer's {} tokens", n_vocab_model,
        n);
  }
  KILN_TRY(check_expressible(v));
  const bool byte_level = v.model == TokenizerModel::byte_level_bpe;
  std::string pre = "default";  // what llama.cpp's converter writes for SentencePiece models (unused there)
  if (byte_level) {
    auto name = gguf_pre_name(v.pre.patterns());
    if (!name.ok()) return Status(name.status().code(), "write_gguf_tokenizer: " + name.status().message());
    pre = std::move(name).value();
    // llama.cpp looks a whole pre-token up before merging only for "llama-bpe".
    if (v.ignore_merges && pre != "llama-bpe") {
      return unimplemented(
          "write_gguf_tokenizer: ignore_merges with pre-tokenizer \"{}\" has no GGUF form "
          "(llama.cpp ignores merges only for \"llama-bpe\")",
          pre);
    }
  }

  // Token text and type as the file spells them: added tokens by their raw text, the rest by their key.
  std::vector<std::string> texts(v.keys.begin(), v.keys.end());
  std::vector<TokenType> types(n, TokenType::normal);
  for (int32_t id = 0; id < n; ++id) {
    const TokenType t = v.types[id];
    if (t == TokenType::byte || t == TokenType::unused || t == TokenType::unknown) types[id] = t;
  }
  for (const tokenizer_detail::AddedToken& t : v.added) {
    texts[t.id] = t.content;
    if (types[t.id] != TokenType::control) {
      types[t.id] = t.special ? TokenType::control : TokenType::user_defined;
    }
  }
  // kiln's reader makes BOS/EOS/UNK/PAD special added tokens whatever their type (so one that the source
  // kept as a plain vocabulary token is matched in text with parse_special after a round trip); llama.cpp
  // wants them typed as control.
  for (int32_t id : {v.bos, v.eos, v.unk, v.pad}) {
    if (id >= 0 && types[id] == TokenType::normal) types[id] = TokenType::control;
  }

  // Merges in rank order. Their tokens must read back to the same keys: the reader respells byte-level
  // text outside the byte alphabet; a space inside a token would split the "left right" form.
  const std::vector<RankedMerge> ranked = merges_by_rank(v);
  if (!byte_level && ranked.size() >= (size_t{1} << 24)) {
    return unimplemented("write_gguf_tokenizer: {} merges: f32 scores cannot rank more than 2^24 distinctly",
                         ranked.size());
  }
  auto reread_key = [&](int32_t id) {
    return byte_level && !in_byte_alphabet(texts[id]) ? unicode::bytes_to_byte_level(texts[id]) : texts[id];
  };
  std::vector<std::string> merges;
  merges.reserve(ranked.size());
  std::vector<int64_t> best_rank(n, -1);  // [n_vocab] dense rank of the first merge producing each token
  for (size_t i = 0; i < ranked.size(); ++i) {
    const RankedMerge& m = ranked[i];
    for (int32_t id : {m.left, m.right, m.merged}) {
      if (v.keys[id].find(' ') != std::string::npos || reread_key(id) != v.keys[id]) {
        return unimplemented(
            "write_gguf_tokenizer: merge {} (\"{}\" + \"{}\") uses token {} (\"{}\") written "
            "as \"{}\", which a GGUF merge list cannot name",
            i, v.keys[m.left], v.keys[m.right], id, v.keys[id], texts[id]);
      }
    }
    merges.push_back(v.keys[m.left] + " " + v.keys[m.right]);
    if (best_rank[m.merged] < 0) best_rank[m.merged] = static_cast<int64_t>(i);
  }

  // Padding up to the embedding's rows. Every check is done before the first key is set.
  for (int32_t id = n; id < n_vocab_model; ++id) {
    std::string pad = fmt::format("[PAD{}]", id);
    if (v.key_index.contains(pad) || tok.token_id(pad).has_value()) {
      return invalid_argument("write_gguf_tokenizer: padding token \"{}\" is already in the vocabulary", pad);
    }
    texts.push_back(std::move(pad));
    types.push_back(TokenType::unused);
  }

  w.set("tokenizer.ggml.model", Value::str(byte_level ? "gpt2" : "llama"));
  w.set("tokenizer.ggml.pre", Value::str(pre));
  w.set("tokenizer.ggml.tokens", string_array(texts));
  std::vector<Value> type_values;
  type_values.reserve(types.size());
  for (TokenType t : types) type_values.push_back(Value::i32(static_cast<int32_t>(t)));
  w.set("tokenizer.ggml.token_type", Value::array(ValueType::int32, std::move(type_values)));
  if (!byte_level) {
    // -rank of the best merge producing the token (exact in f32 below 2^24 merges); tokens no merge
    // produces (characters, bytes, added and padding tokens) score below every merge.
    const float floor_score = -static_cast<float>(ranked.size()) - 1.0f;
    std::vector<Value> scores;
    scores.reserve(texts.size());
    for (size_t id = 0; id < texts.size(); ++id) {
      const int64_t r = id < best_rank.size() ? best_rank[id] : -1;
      scores.push_back(Value::f32(r >= 0 ? -static_cast<float>(r) : floor_score));
    }
    w.set("tokenizer.ggml.scores", Value::array(ValueType::float32, std::move(scores)));
  }
  w.set("tokenizer.ggml.merges", string_array(merges));
  const std::pair<const char*, int32_t> ids[] = {
      {"tokenizer.ggml.bos_token_id", v.bos},     {"tokenizer.ggml.eos_token_id", v.eos},
      {"tokenizer.ggml.eot_token_id", v.eot},     {"tokenizer.ggml.eom_token_id", v.eom},
      {"tokenizer.ggml.unknown_token_id", v.unk}, {"tokenizer.ggml.padding_token_id", v.pad},
  };
  for (const auto& [key, id] : ids) {
    if (id >= 0) w.set(key, Value::u32(static_cast<uint32_t>(id)));
  }
  w.set("tokenizer.ggml.add_bos_token", Value::boolean(v.add_bos));
  w.set("tokenizer.ggml.add_eos_token", Value::boolean(v.add_eos));
  // HF's Prepend normalizer (U+2581 before every segment, also after an added token) has no key of its
  // own: add_space_prefix is the closest (llama.cpp also prefixes the text after a special token; kiln's
  // reader prefixes the start of the text only).
  w.set("tokenizer.ggml.add_space_prefix", Value::boolean(v.add_space_prefix || v.spm_prepend_segments));
  if (chat_template) w.set("tokenizer.chat_template", Value::str(*chat_template));
  return Status::ok_status();
}

}  // namespace kiln
