// libFuzzer target: arbitrary bytes as a GGUF file whose tokenizer.ggml.* metadata is loaded as a vocabulary,
// then a fixed string encoded and decoded. Every input must end in a Tokenizer or a Status — never a crash, a
// sanitizer report, a hang or an unbounded allocation.
#include <cstddef>
#include <cstdint>
#include <span>

#include "formats/gguf.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = kiln::gguf::File::parse(std::span<const uint8_t>(data, size), "fuzz.gguf");
  if (!file.ok()) return 0;
  auto tok = kiln::Tokenizer::from_gguf(*file);
  if (!tok.ok()) return 0;
  const auto ids = tok->encode("Hello, w\xC3\xB6rld! 123 <s>\n\n  x", true, true);
  (void)tok->decode(ids, false);
  return 0;
}
