#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cstdint>
#include <utility>

namespace kiln {

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kDigitPattern = R"(\p{N})";

namespace {

// Llama-3 (also Hugging Face's choice for llama-bpe, dbrx, smaug-bpe, falcon3 files).
const char* const kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2: as Llama-3 but digits one at a time.
const char* const kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// DeepSeek-Coder.
const char* const kDeepseekCoderPatterns[] = {
    R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", R"([一-龥ࠀ-一가-퟿]+)", R"(\p{N})",
};
// DeepSeek-V3 and R1 distills of Llama.
const char* const kDeepseek3Patterns[] = {
    R"(\p{N}{1,3})",
    R"([一-龥぀-ゟ゠-ヿ]+)",
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
};

}  // namespace

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

Result<Regex> Regex::compile(const std::string& pattern) {
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &err_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return invalid_argument("pre-tokenizer regex \"{}\": error at offset {}: {}", pattern, err_offset,
                            reinterpret_cast<const char*>(msg));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // best effort: the interpreter is the fallback
  Regex r;
  r.pattern_ = pattern;
  auto c = std::make_shared<Code>();
  c->code = code;
  r.code_ = std::move(c);
  return r;
}

Status Regex::split(std::string_view text, std::vector<std::string_view>& out, uint64_t* budget) const {
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create_from_pattern(code_->code, nullptr), &pcre2_match_data_free);
  std::unique_ptr<pcre2_match_context, decltype(&pcre2_match_context_free)> ctx(
      pcre2_match_context_create(nullptr), &pcre2_match_context_free);
  if (!md || !ctx) return resource_exhausted("pre-tokenizer: out of memory for match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;   // where the next search starts
  size_t last = 0;  // end of the last piece emitted
  while (pos < text.size()) {
    // PCRE2 does not say how much work a search took, only that it hit its match limit. So each search
    // starts with a small limit and doubles it while the limit is hit; every try is charged its whole
    // limit, which bounds what was spent (at most twice what the search needed, plus the first limit).
    int rc = 0;
    for (uint64_t limit = 16;; limit *= 2) {
      const uint64_t this_try = std::min({limit, *budget, uint64_t{UINT32_MAX}});
      if (this_try == 0) {
        return resource_exhausted(
            "pre-tokenizer regex \"{}\": more than {} + {} per byte of work on a {}-byte text (it backtracks "
            "without bound here)",
            pattern_, kRegexWorkBase, kRegexWorkPerByte, text.size());
      }
      pcre2_set_match_limit(ctx.get(), static_cast<uint32_t>(this_try));
      // The text was validated once by the caller: skip PCRE2's per-call UTF check.
      rc = pcre2_match(code_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md.get(), ctx.get());
      *budget -= this_try;
      if (rc != PCRE2_ERROR_MATCHLIMIT) break;
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      return invalid_argument("pre-tokenizer regex \"{}\": match failed at byte {}: {}", pattern_, pos,
                              reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const size_t start = ov[0], end = ov[1];
    if (end == start) {
      // An empty match splits nothing: step over one character.
      pos = start + 1;
      while (pos < text.size() && (static_cast<uint8_t>(text[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (start > last) out.push_back(text.substr(last, start - last));
    out.push_back(text.substr(start, end - start));
    last = pos = end;
  }
  if (last < text.size()) out.push_back(text.substr(last));
  return Status::ok_status();
}

Result<PreTokenizer> PreTokenizer::from_patterns(const std::vector<std::string>& patterns) {
  PreTokenizer p;
  for (const auto& pat : patterns) {
    KILN_ASSIGN_OR_RETURN(Regex r, Regex::compile(pat));
    p.regexes_.push_back(std::move(r));
  }
  return p;
}

Result<PreTokenizer> PreTokenizer::from_gguf_name(std::string_view pre) {
  auto list = [](auto&& arr) { return std::vector<std::string>(std::begin(arr), std::end(arr)); };
  if (pre == "default" || pre == "gpt2" || pre == "gpt-2" || pre == "mpt" || pre == "olmo" || pre == "jais") {
    return from_patterns({kGpt2Pattern});
  }
  // Vocabularies trained with every digit its own piece before GPT-2's regex (tokenizer.json: Digits with
  // individual_digits, then ByteLevel), as llama.cpp reads these names. transformers' GGUF loader leaves the
  // digit split out; the two differ where a digit follows what the vocabulary would merge across it
  // ("\n\n1": llama.cpp and the trained tokenizer "\n\n" "1", GPT-2's regex alone "\n" "\n" "1").
  if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "command-r" || pre == "codeshell" ||
      pre == "exaone") {
    return from_patterns({kDigitPattern, kGpt2Pattern});
  }
  if (pre == "llama3" || pre == "llama-v3" || pre == "llama-bpe" || pre == "falcon3" || pre == "falcon-h1" ||
      pre == "pixtral" || pre == "dbrx" || pre == "smaug-bpe" || pre == "lfm2" || pre == "midm-2.0") {
    return from_patterns({kLlama3Pattern});
  }
  if (pre == "qwen2" || pre == "deepseek-r1-qwen" || pre == "megrez" || pre == "stablelm2") {
    return from_patterns({kQwen2Pattern});
  }
  if (pre == "deepseek-coder") return from_patterns(list(kDeepseekCoderPatterns));
  if (pre == "deepseek-v3") return from_patterns(list(kDeepseek3Patterns));
  return unimplemented("tokenizer.ggml.pre = \"{}\": kiln has no pre-tokenizer for it", pre);
}

std::vector<std::string> PreTokenizer::patterns() const {
  std::vector<std::string> out;
  out.reserve(regexes_.size());
  for (const Regex& r : regexes_) out.push_back(r.pattern());
  return out;
}

Status PreTokenizer::split(std::string_view text, std::vector<std::string_view>& out) const {
  if (regexes_.empty()) {
    if (!text.empty()) out.push_back(text);
    return Status::ok_status();
  }
  uint64_t budget = kRegexWorkBase + kRegexWorkPerByte * text.size();
  std::vector<std::string_view> cur{text}, next;
  for (const Regex& r : regexes_) {
    next.clear();
    for (std::string_view piece : cur) KILN_TRY(r.split(piece, next, &budget));
    cur.swap(next);
  }
  out.insert(out.end(), cur.begin(), cur.end());
  return Status::ok_status();
}

}  // namespace kiln
