// Tokenizer::from_gguf: the vocabulary from a GGUF file's tokenizer.ggml.* metadata, built the way
// Hugging Face transformers builds a tokenizer from the same file (so that the ids agree).
#include <cmath>
#include <limits>

#include "formats/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace kiln {

using tokenizer_detail::AddedToken;
using tokenizer_detail::Vocab;

namespace {

// Python's str.isspace() for one code point (the set str.strip() removes).
bool py_isspace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

// True when every code point of `s` satisfies `pred` (false for invalid UTF-8); `n_cp` gets the count.
template <class Pred>
bool all_code_points(std::string_view s, Pred pred, size_t& n_cp) {
  n_cp = 0;
  uint32_t cp = 0;
  for (size_t pos = 0; pos < s.size(); ++n_cp) {
    const size_t len = unicode::utf8_decode(s, pos, cp);
    if (len == 0 || !pred(cp)) return false;
    pos += len;
  }
  return true;
}

bool in_byte_alphabet(std::string_view s) {
  size_t n = 0;
  return all_code_points(
      s, [](uint32_t cp) { return unicode::codepoint_to_byte(cp) >= 0; }, n);
}

// An optional token id key: -1 when absent; out_of_range when it names no token.
Result<int32_t> read_token_id(const gguf::File& f, std::string_view key, int32_t n_vocab) {
  if (f.find(key) == nullptr) return -1;
  KILN_ASSIGN_OR_RETURN(uint64_t id, f.get_uint(key));
  if (id >= static_cast<uint64_t>(n_vocab)) {
    return out_of_range("{}: {} = {} is outside the vocabulary of {} tokens", f.name(), key, id, n_vocab);
  }
  return static_cast<int32_t>(id);
}

Status read_types(const gguf::File& f, Vocab& v) {
  const int32_t n = v.n_vocab();
  v.types.assign(n, TokenType::normal);
  if (f.find("tokenizer.ggml.token_type") == nullptr) return Status::ok_status();
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> types, f.get_int_array("tokenizer.ggml.token_type"));
  if (types.size() != static_cast<size_t>(n)) {
    return invalid_argument("{}: tokenizer.ggml.token_type has {} entries but tokenizer.ggml.tokens has {}",
                            f.name(), types.size(), n);
  }
  for (int32_t i = 0; i < n; ++i) {
    if (types[i] < 0 || types[i] > static_cast<int64_t>(TokenType::byte)) {
      return invalid_argument("{}: tokenizer.ggml.token_type[{}] = {} is not a token type (0..6)", f.name(),
                              i, types[i]);
    }
    v.types[i] = static_cast<TokenType>(types[i]);
  }
  return Status::ok_status();
}

// Merges listed in the file ("left right"), ranked by their order.
Status read_merges(const gguf::File& f, Vocab& v) {
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> merges, f.get_string_array("tokenizer.ggml.merges"));
  v.merges.reserve(merges.size());
  std::string joined;
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string& m = merges[i];
    const size_t space = m.find(' ');
    if (space == std::string::npos || m.find(' ', space + 1) != std::string::npos) {
      return invalid_argument(
          "{}: tokenizer.ggml.merges[{}] = \"{}\" is not two tokens separated by one space", f.name(), i, m);
    }
    const std::string_view left = std::string_view(m).substr(0, space),
                           right = std::string_view(m).substr(space + 1);
    joined.assign(left).append(right);
    const int32_t il = v.key_index.find(left), ir = v.key_index.find(right), ij = v.key_index.find(joined);
    for (const auto& [id, text] :
         {std::pair{il, left}, std::pair{ir, right}, std::pair{ij, std::string_view(joined)}}) {
      if (id < 0) {
        return invalid_argument("{}: tokenizer.ggml.merges[{}] = \"{}\": \"{}\" is not in the vocabulary",
                                f.name(), i, m, text);
      }
    }
    // A repeated pair: the last wins.
    v.merges.insert_or_assign(tokenizer_detail::MergeTable::pair_key(il, ir),
                              tokenizer_detail::Merge{static_cast<uint32_t>(i), ij});
  }
  return Status::ok_status();
}

Status check_byte_tokens(const gguf::File& f, const Vocab& v) {
  for (int32_t i = 0; i < v.n_vocab(); ++i) {
    if (v.types[i] != TokenType::byte) continue;
    const std::string& k = v.keys[i];
    const bool ok = k.size() == 6 && k.starts_with("<0x") && k[5] == '>' &&
                    std::isxdigit(static_cast<uint8_t>(k[3])) && std::isxdigit(static_cast<uint8_t>(k[4]));
    if (!ok) {
      return invalid_argument("{}: tokenizer.ggml.tokens[{}] = \"{}\" has token type byte but is not <0xXX>",
                              f.name(), i, k);
    }
  }
  return Status::ok_status();
}

// SentencePiece vocabulary (tokenizer.ggml.model "llama").
Status build_spm(const gguf::File& f, Vocab& v, bool gemma) {
  v.model = TokenizerModel::spm_bpe;
  size_t n_cp = 0;
  if (gemma) {
    // Gemma files store the multi-space tokens with real spaces; HF looks them up as U+2581 runs.
    for (std::string& k : v.keys) {
      if (k.find(' ') != std::string::npos && all_code_points(k, py_isspace, n_cp)) {
        k.clear();
        for (size_t i = 0; i < n_cp; ++i) k += "\xE2\x96\x81";
      }
    }
  }
  tokenizer_detail::build_key_index(v);
  KILN_TRY(check_byte_tokens(f, v));
  if (f.find("tokenizer.ggml.merges") != nullptr) {
    KILN_TRY(read_merges(f, v));
  } else {
    std::vector<double> scores(v.keys.size());
    if (gemma) {
      // Gemma's scores do not follow its merge order; its vocabulary order does.
      for (size_t i = 0; i < scores.size(); ++i) scores[i] = -static_cast<double>(i);
    } else {
      KILN_ASSIGN_OR_RETURN(scores, f.get_float_array("tokenizer.ggml.scores"));
      if (scores.size() != v.keys.size()) {
        return invalid_argument("{}: tokenizer.ggml.scores has {} entries but tokenizer.ggml.tokens has {}",
                                f.name(), scores.size(), v.keys.size());
      }
      for (size_t i = 0; i < scores.size(); ++i) {
        if (!std::isfinite(scores[i])) {
          return invalid_argument("{}: tokenizer.ggml.scores[{}] = {} is not finite", f.name(), i, scores[i]);
        }
      }
    }
    KILN_TRY(tokenizer_detail::generate_spm_merges(v, scores, f.name()));
  }
  v.spm_escape_spaces = true;
  if (!gemma) {
    KILN_ASSIGN_OR_RETURN(v.add_space_prefix, f.get_bool_or("tokenizer.ggml.add_space_prefix", true));
  }
  v.strip_space_prefix = v.add_space_prefix;
  v.byte_fallback = true;
  v.fuse_unk = true;
  v.model_unk = v.unk;
  if (v.model_unk < 0) {
    v.model_unk = v.key_index.find("<unk>");
  }
  return Status::ok_status();
}

// Byte-level vocabulary (tokenizer.ggml.model "gpt2").
Status build_byte_level(const gguf::File& f, Vocab& v) {
  v.model = TokenizerModel::byte_level_bpe;
  // Tokens written outside the byte alphabet (raw text) are respelled into it, as HF does.
  for (std::string& k : v.keys) {
    if (!in_byte_alphabet(k)) k = unicode::bytes_to_byte_level(k);
  }
  tokenizer_detail::build_key_index(v);
  if (f.find("tokenizer.ggml.merges") == nullptr) {
    return not_found("{}: tokenizer.ggml.merges is missing (a gpt2 tokenizer needs its merges)", f.name());
  }
  KILN_TRY(read_merges(f, v));
  KILN_ASSIGN_OR_RETURN(std::string pre, f.get_string_or("tokenizer.ggml.pre", "default"));
  auto pt = PreTokenizer::from_gguf_name(pre);
  if (!pt.ok()) return invalid_argument("{}: {}", f.name(), pt.status().message());
  v.pre = std::move(pt).value();
  return Status::ok_status();
}

// Control tokens become special added tokens; user-defined ones plain added tokens (only when their text
// is a vocabulary key, as HF checks). BOS/EOS/UNK/PAD are added too when they are not yet.
void add_gguf_added_tokens(const std::vector<std::string>& raw, Vocab& v) {
  const bool byte_level = v.model == TokenizerModel::byte_level_bpe;
  std::vector<uint8_t> added(v.keys.size(), 0);
  for (int32_t i = 0; i < v.n_vocab(); ++i) {
    if (v.types[i] != TokenType::control || (byte_level && !in_byte_alphabet(raw[i]))) continue;
    const int32_t found = v.key_index.find(raw[i]);
    const int32_t id = found >= 0 ? found : i;
    v.added.push_back({raw[i], id, true});
    added[id] = 1;
  }
  for (int32_t id : {v.bos, v.eos, v.unk, v.pad}) {
    if (id >= 0 && !added[id]) {
      v.added.push_back({raw[id], id, true});
      added[id] = 1;
    }
  }
  for (int32_t i = 0; i < v.n_vocab(); ++i) {
    if (v.types[i] != TokenType::user_defined) continue;
    const int32_t id = v.key_index.find(raw[i]);
    if (id >= 0) v.added.push_back({raw[i], id, false});
  }
}

}  // namespace

Result<Tokenizer> Tokenizer::from_gguf(const gguf::File& f) {
  auto v = std::make_shared<Vocab>();
  KILN_ASSIGN_OR_RETURN(std::string model, f.get_string("tokenizer.ggml.model"));
  KILN_ASSIGN_OR_RETURN(v->keys, f.get_string_array("tokenizer.ggml.tokens"));
  if (v->keys.empty() || v->keys.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return invalid_argument("{}: tokenizer.ggml.tokens has {} entries", f.name(), v->keys.size());
  }
  const std::vector<std::string> raw = v->keys;  // as the file spells them
  const int32_t n = v->n_vocab();
  KILN_TRY(read_types(f, *v));
  KILN_ASSIGN_OR_RETURN(v->bos, read_token_id(f, "tokenizer.ggml.bos_token_id", n));
  KILN_ASSIGN_OR_RETURN(v->eos, read_token_id(f, "tokenizer.ggml.eos_token_id", n));
  KILN_ASSIGN_OR_RETURN(v->eot, read_token_id(f, "tokenizer.ggml.eot_token_id", n));
  KILN_ASSIGN_OR_RETURN(v->eom, read_token_id(f, "tokenizer.ggml.eom_token_id", n));
  KILN_ASSIGN_OR_RETURN(v->unk, read_token_id(f, "tokenizer.ggml.unknown_token_id", n));
  KILN_ASSIGN_OR_RETURN(v->pad, read_token_id(f, "tokenizer.ggml.padding_token_id", n));
  if (model == "gpt2") {
    KILN_TRY(build_byte_level(f, *v));
    KILN_ASSIGN_OR_RETURN(v->add_bos, f.get_bool_or("tokenizer.ggml.add_bos_token", false));
  } else if (model == "llama") {
    const std::string arch = f.architecture();
    KILN_TRY(build_spm(f, *v, arch == "gemma" || arch == "gemma2" || arch == "gemma3"));
    KILN_ASSIGN_OR_RETURN(v->add_bos, f.get_bool_or("tokenizer.ggml.add_bos_token", true));
  } else {
    return unimplemented("{}: tokenizer.ggml.model = \"{}\": kiln supports \"gpt2\" and \"llama\"", f.name(),
                         model);
  }
  KILN_ASSIGN_OR_RETURN(v->add_eos, f.get_bool_or("tokenizer.ggml.add_eos_token", false));
  add_gguf_added_tokens(raw, *v);
  KILN_TRY(tokenizer_detail::finalize_vocab(*v, f.name()));
  return Tokenizer(std::move(v));
}

}  // namespace kiln
