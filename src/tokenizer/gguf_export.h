// A Tokenizer written as GGUF tokenizer metadata: the tokenizer.ggml.* keys (and tokenizer.chat_template)
// that llama.cpp reads and that Tokenizer::from_gguf reads back into the same tokenizer, so that a Hugging
// Face folder converted to GGUF carries its tokenizer.
//
// What the file holds, per model:
// - byte-level BPE: model "gpt2", pre = the llama.cpp pre-tokenizer name whose regex list is this
//   tokenizer's (see gguf_pre_name), tokens in the byte alphabet (added tokens as their raw text), merges
//   "left right" in rank order;
// - SentencePiece-style BPE: model "llama", pre "default", tokens with U+2581 for spaces, <0xXX> byte tokens
//   of type byte, merges in rank order (read by kiln; llama.cpp ignores them for this model), and scores
//   derived from the merge ranks (-rank of the best merge producing the token) so that llama.cpp's
//   highest-score-first merging follows the same order as kiln's lowest-rank-first BPE.
// Both: token_type, bos/eos/eot/eom/unknown/padding ids (those the tokenizer has), add_bos_token,
// add_eos_token, add_space_prefix. Token types describe how the tokenizer treats each token: added tokens
// are control (special) or user_defined (matched in raw text); everything else is normal, byte, unknown or
// unused, so a vocabulary token that kiln never cuts out of the text is not re-declared as an added one.
//
// Features the GGUF keys cannot express (a Metaspace split that changes merges, no space escaping, a decode
// strip that differs from add_space_prefix, byte fallback off with byte tokens present...) are an
// `unimplemented` error naming the feature, never a file that tokenizes differently.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

namespace gguf {
class Writer;
}

// Sets the tokenizer keys on `w` (replacing keys of the same name; other keys are left alone, so call it on
// a Writer that holds no tokenizer keys from elsewhere). `n_vocab_model`: the rows of the model's token
// embedding; when it exceeds tok.n_vocab() the token list is padded with "[PAD<id>]" entries of type
// unused up to n_vocab_model (llama.cpp needs one token per embedding row). `chat_template`: written as
// tokenizer.chat_template when given. Errors: invalid_argument when n_vocab_model < tok.n_vocab() (naming
// both) or a padding name is already a token; unimplemented for features GGUF cannot express (above).
Status write_gguf_tokenizer(const Tokenizer& tok, gguf::Writer& w, int32_t n_vocab_model,
                            const std::optional<std::string>& chat_template = std::nullopt);

// The llama.cpp tokenizer.ggml.pre name whose regex list (as llama.cpp splits with it) is `patterns`, in
// the spelling tokenizer.json and kiln use. Error: unimplemented listing the patterns when no llama.cpp
// name splits that way (any name would make llama.cpp tokenize differently).
Result<std::string> gguf_pre_name(const std::vector<std::string>& patterns);

}  // namespace kiln
