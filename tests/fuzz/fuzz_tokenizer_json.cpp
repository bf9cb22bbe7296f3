// libFuzzer target: arbitrary text as a Hugging Face tokenizer.json, then a fixed string encoded and decoded
// with whatever loads. Every input must end in a Tokenizer or a Status — never a crash, a sanitizer report, a
// hang or an unbounded allocation.
#include <cstddef>
#include <cstdint>
#include <string>

#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Text, not a path: from_hf_json takes JSON text when it starts with '{'.
  std::string text(reinterpret_cast<const char*>(data), size);
  if (text.empty() || text[0] != '{') return 0;
  auto tok = kiln::Tokenizer::from_hf_json(text);
  if (!tok.ok()) return 0;
  const auto ids = tok->encode("Hello, w\xC3\xB6rld! 123 <|end|>\n\n  x", true, true);
  (void)tok->decode(ids, false);
  return 0;
}
