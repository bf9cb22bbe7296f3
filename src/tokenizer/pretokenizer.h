// Pre-tokenizers: split text into pieces before BPE, with Unicode regexes (PCRE2, UTF + UCP so that
// \p{L}, \p{N} and \s follow Unicode). A pre-tokenizer is a list of regexes applied in turn: each one
// splits every piece further, keeping both the matches and the text between them ("isolated", as
// Hugging Face's Split pre-tokenizer and llama.cpp's regex lists do).
#pragma once

#include <cstdint>
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
  // in order (their concatenation is `text`). `text` must be valid UTF-8. `*budget` is the PCRE2 work
  // (match-limit units) left for the text; it is charged what the search may have spent. Error:
  // resource_exhausted when the budget runs out, or PCRE2's own error naming the pattern.
  Status split(std::string_view text, std::vector<std::string_view>& out, uint64_t* budget) const;

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
  // Splits `text` (valid UTF-8) into pieces (views into `text`), concatenating back to it. All the
  // regexes together may spend kRegexWorkPerByte per byte of `text` plus kRegexWorkBase; past that the
  // split fails with resource_exhausted, in time linear in the text with a small constant.
  Status split(std::string_view text, std::vector<std::string_view>& out) const;

 private:
  std::vector<Regex> regexes_;
};

// The regex work budget of one split, in PCRE2 match-limit units (roughly, backtracking steps). The
// patterns of real tokenizers take at most ~10 per byte, on any text tried (prose, code, long runs of
// spaces, digits or punctuation); a pattern that backtracks
// catastrophically (`(a|aa)+b`) would otherwise take seconds per kilobyte, unbounded in total.
inline constexpr uint64_t kRegexWorkPerByte = 256;
inline constexpr uint64_t kRegexWorkBase = uint64_t{1} << 20;

// GPT-2's pattern (also Hugging Face's ByteLevel pre-tokenizer with use_regex).
extern const char* const kGpt2Pattern;
// One digit (Hugging Face's Digits pre-tokenizer with individual_digits).
extern const char* const kDigitPattern;

}  // namespace kiln
