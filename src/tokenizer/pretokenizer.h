// Pre-tokenizers: split text into pieces before BPE, with Unicode regexes (PCRE2, UTF + UCP so that
// \p{L}, \p{N} and \s follow Unicode). A pre-tokenizer is a list of regexes applied in turn: each one
// splits every piece further, keeping both the matches and the text between them ("isolated", as
// Hugging Face's Split pre-tokenizer and llama.cpp's regex lists do).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace kiln {

class Regex {
 public:
  // Compiles `pattern` with UTF and UCP. Error: invalid_argument naming the offset of the error.
  static Result<Regex> compile(const std::string& pattern);
  const std::string& pattern() const { return pattern_; }
  // Appends to `out` the pieces of `text`: every match and every non-empty gap between matches,
  // in order (their concatenation is `text`). `text` must be valid UTF-8.
  Status split(std::string_view text, std::vector<std::string_view>& out) const;

 private:
  struct Code;
  std::string pattern_;
  std::shared_ptr<const Code> code_;  // shared, immutable compiled pattern
};

class PreTokenizer {
 public:
  PreTokenizer() = default;
  static Result<PreTokenizer> from_patterns(const std::vector<std::string>& patterns);
  // The regexes for a GGUF `tokenizer.ggml.pre` name ("gpt2", "llama-bpe", "qwen2", "smollm", ...).
  // Error: unimplemented naming the value when kiln does not know it.
  static Result<PreTokenizer> from_gguf_name(std::string_view pre);

  bool empty() const { return regexes_.empty(); }
  // The regex sources, in the order they are applied.
  std::vector<std::string> patterns() const;
  void add(Regex regex) { regexes_.push_back(std::move(regex)); }
  // Splits `text` (valid UTF-8) into pieces (views into `text`), concatenating back to it.
  Status split(std::string_view text, std::vector<std::string_view>& out) const;

 private:
  std::vector<Regex> regexes_;
};

// GPT-2's pattern (also Hugging Face's ByteLevel pre-tokenizer with use_regex).
extern const char* const kGpt2Pattern;

}  // namespace kiln
