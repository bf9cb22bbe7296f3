// The Tokenizer: text -> token ids -> text, for the two BPE families kiln supports:
// - byte-level BPE (GPT-2, Llama-3, Qwen2, SmolLM): regex pre-tokenizer, bytes spelled in GPT-2's byte
//   alphabet, merges ranked by their order in the file;
// - SentencePiece-style BPE (Llama-2, Gemma): spaces become U+2581, merges ranked by the merged token's
//   score (Gemma: by its position in the vocabulary), characters missing from the vocabulary fall back to
//   the <0xXX> byte tokens.
// Both follow Hugging Face `tokenizers`: added tokens (control and user-defined) are cut out of the text
// first (leftmost-longest match), then each remaining segment is normalised, pre-tokenized and merged.
// Built from GGUF metadata (vocab_gguf.cpp) or from tokenizer.json (vocab_hf.cpp). Immutable once built;
// copies share the vocabulary, and all methods are safe to call from several threads at once.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/vocab_index.h"

namespace kiln {

namespace gguf {
class File;
}

// GGUF's token types (tokenizer.ggml.token_type), numbered as llama.cpp writes them.
enum class TokenType : uint8_t {
  undefined = 0,
  normal = 1,
  unknown = 2,
  control = 3,
  user_defined = 4,
  unused = 5,
  byte = 6,
};

enum class TokenizerModel : uint8_t {
  byte_level_bpe,  // GGUF tokenizer.ggml.model "gpt2"
  spm_bpe,         // GGUF tokenizer.ggml.model "llama"
};

namespace tokenizer_detail {

// A token cut out of the text before the model runs (HF "added tokens").
struct AddedToken {
  std::string content;   // raw text matched in the input
  int32_t id = -1;       // token id
  bool special = false;  // control tokens: only matched with parse_special, skipped by decode(skip_special)
};

// The whole vocabulary. Built once, then shared read-only by every copy of a Tokenizer. `keys` is not
// changed once key_index is built (it reads their strings).
struct Vocab {
  TokenizerModel model = TokenizerModel::byte_level_bpe;
  std::vector<std::string> keys;    // [n_vocab] the token as the model spells it (byte alphabet, U+2581)
  std::vector<std::string> pieces;  // [n_vocab] the raw bytes the token decodes to
  std::vector<TokenType> types;     // [n_vocab]
  std::vector<uint8_t> special;     // [n_vocab] 1: skipped by decode(skip_special)
  KeyIndex key_index;               // keys -> id (a repeated key: the last id)
  MergeTable merges;                // (left << 32 | right) -> merge
  std::vector<AddedToken> added;    // in the order they were declared

  // Added-token trie over bytes: edge (node << 8 | byte) -> child node; node 0 is the root.
  std::unordered_map<uint64_t, int32_t> trie_edges;
  std::vector<int32_t> trie_token;     // [n_nodes] index into `added` ending at this node, or -1
  std::array<bool, 256> trie_first{};  // bytes that start some added token

  PreTokenizer pre;                     // byte-level: regex splits
  bool spm_escape_spaces = false;       // SPM: " " -> U+2581 before merging
  bool add_space_prefix = false;        // SPM: U+2581 before the text unless it starts with one (HF Metaspace
                                        // "first": not after an added token)
  bool spm_prepend_segments = false;    // SPM: U+2581 before every segment (HF Prepend normalizer)
  bool strip_space_prefix = false;      // decode: drop one leading space (the prefix encode added)
  bool spm_split_metaspace = false;     // SPM: split before each U+2581 (HF Metaspace split=true)
  bool byte_fallback = false;           // SPM: unknown characters -> <0xXX> tokens
  bool fuse_unk = false;                // consecutive unknown characters -> one unk token
  bool ignore_merges = false;           // a pre-token found whole in the vocabulary is used as is
  std::array<int32_t, 256> byte_ids{};  // SPM: id of <0xXX>, or -1
  std::array<int32_t, 256> byte_char_ids{};  // byte-level: id of each byte's one-character token, or -1

  int32_t bos = -1, eos = -1, eot = -1, eom = -1, unk = -1, pad = -1;  // token ids, -1 when absent
  int32_t model_unk = -1;  // what BPE emits for a symbol it cannot spell (HF BPE unk_token), -1: dropped
  bool add_bos = false, add_eos = false;  // encode(add_special=true) adds them
  std::vector<int32_t> eog;               // end-of-generation ids, sorted

  int32_t n_vocab() const { return static_cast<int32_t>(keys.size()); }
};

// Fills key_index from keys (last id wins for a repeated key).
void build_key_index(Vocab& v);
// Validates the special ids and builds pieces, special flags, the added-token trie and the eog list.
// `source` names the file in errors.
Status finalize_vocab(Vocab& v, std::string_view source);

// Merges for a SentencePiece vocabulary that lists none, recovered as Hugging Face does: every split of a
// token into two vocabulary tokens, best first by `score_of(merged id)`, then longer left part first.
// The work is quadratic in each token's length: a vocabulary whose sum of squared token lengths exceeds
// kMaxSpmSplitWork (real ones: ~2e7) is resource_exhausted before any of it is done.
inline constexpr uint64_t kMaxSpmSplitWork = uint64_t{1} << 32;
Status generate_spm_merges(Vocab& v, const std::vector<double>& scores, std::string_view source);

// The text of all added tokens together (the index over them takes ~50 bytes per byte): real vocabularies
// hold a few hundred KiB.
inline constexpr size_t kMaxAddedTokenBytes = size_t{4} << 20;

// BPE on one pre-token: `symbols` (ids, in order) are merged by rank, lowest first, leftmost on ties.
void bpe_merge(const Vocab& v, std::vector<int32_t>& symbols);
// Byte-level BPE on one segment of text (valid UTF-8, no added tokens), appending ids to `out`. Should
// the regex engine fail on a piece (a PCRE2 resource limit), that piece is merged whole, with a warning.
void encode_byte_level(const Vocab& v, std::string_view segment, std::vector<int32_t>& out);
// SentencePiece-style BPE on one segment; `at_start`: the segment begins the text.
void encode_spm(const Vocab& v, std::string_view segment, bool at_start, std::vector<int32_t>& out);

}  // namespace tokenizer_detail

class Tokenizer {
 public:
  // From a GGUF file's tokenizer.ggml.* metadata. Errors name the key, the index and the value.
  static Result<Tokenizer> from_gguf(const gguf::File& file);
  // From a tokenizer.json (a path, or the JSON text itself when it starts with '{'), and optionally the
  // parsed tokenizer_config.json (bos_token, eos_token, add_bos_token, add_eos_token).
  static Result<Tokenizer> from_hf_json(const std::string& tokenizer_json_path_or_text,
                                        const std::optional<nlohmann::json>& tokenizer_config = std::nullopt);

  // Token ids of `text`. add_special: BOS/EOS as the model asks (add_bos/add_eos). parse_special:
  // control tokens written in the text ("<|im_start|>") become their ids; without it they are plain
  // text (user-defined added tokens are always recognised, as in HF). Invalid UTF-8 in `text` is
  // replaced by U+FFFD first.
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;
  // The text of `ids`: out_of_range naming the position and the id for an id outside [0, n_vocab).
  // skip_special drops control tokens (BOS, EOS, <|im_start|>...). The bytes are returned as they are
  // (a lone byte token may leave invalid UTF-8).
  Result<std::string> decode(std::span<const int32_t> ids, bool skip_special) const;
  // The raw bytes of one token's text (U+2581 as a space, <0x0A> as "\n"); empty for an invalid id.
  std::string token_to_piece(int32_t id) const;

  int32_t n_vocab() const { return v_->n_vocab(); }
  TokenizerModel model() const { return v_->model; }
  int32_t bos_id() const { return v_->bos; }  // -1 when absent
  int32_t eos_id() const { return v_->eos; }
  int32_t eot_id() const { return v_->eot; }
  int32_t unk_id() const { return v_->unk; }
  int32_t pad_id() const { return v_->pad; }
  bool add_bos() const { return v_->add_bos; }
  bool add_eos() const { return v_->add_eos; }
  // Control tokens (and other special added tokens); false for an invalid id.
  bool is_special(int32_t id) const;
  // End of generation: EOS, EOT, EOM and the control tokens that end a turn (<|im_end|>, <end_of_turn>,
  // <|eot_id|>, <|endoftext|>...).
  bool is_eog(int32_t id) const;
  const std::vector<int32_t>& eog_ids() const { return v_->eog; }
  TokenType token_type(int32_t id) const;
  // The id of a token given by its text (an added token's content, or a vocabulary token in raw text or in
  // the model's own spelling); nullopt when there is none.
  std::optional<int32_t> token_id(std::string_view text) const;

  // For StreamDecoder: appends the bytes of `id` to `out` as decode() would; `first` is true for the first
  // token that produces output. False (nothing appended) for an invalid id.
  bool append_piece(int32_t id, bool skip_special, bool first, std::string& out) const;

  // The whole vocabulary, read-only (for exporters such as write_gguf_tokenizer).
  const tokenizer_detail::Vocab& vocab() const { return *v_; }

 private:
  explicit Tokenizer(std::shared_ptr<const tokenizer_detail::Vocab> v) : v_(std::move(v)) {}
  void encode_segment(std::string_view segment, bool at_start, std::vector<int32_t>& out) const;

  std::shared_ptr<const tokenizer_detail::Vocab> v_;
};

}  // namespace kiln
