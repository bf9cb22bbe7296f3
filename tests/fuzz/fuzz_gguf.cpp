// libFuzzer target: arbitrary bytes into the GGUF parser. Every input must end in a File or a Status —
// never a crash, a sanitizer report, a hang or an unbounded allocation.
#include <cstddef>
#include <cstdint>
#include <span>

#include "formats/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = kiln::gguf::File::parse(std::span<const uint8_t>(data, size), "fuzz.gguf");
  if (file.ok()) {
    // Touch what a consumer touches: every value's display form and every tensor's bytes.
    for (const auto& [key, value] : file->metadata()) (void)value.to_display_string();
    uint64_t sum = 0;
    for (const auto& t : file->tensors()) {
      if (t.n_bytes > 0) sum += t.data[0] + t.data[t.n_bytes - 1];
    }
    (void)sum;
  }
  return 0;
}
