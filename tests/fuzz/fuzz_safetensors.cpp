// libFuzzer target: arbitrary bytes into the safetensors parser. Every input must end in a File or a
// Status — never a crash, a sanitizer report, a hang or an unbounded allocation.
#include <cstddef>
#include <cstdint>
#include <span>

#include "formats/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = kiln::safetensors::File::parse(std::span<const uint8_t>(data, size), "fuzz.safetensors");
  if (file.ok()) {
    // Touch what a consumer touches: the first and last byte of every tensor.
    uint64_t sum = 0;
    for (const auto& t : file->tensors()) {
      if (!t.data.empty()) sum += t.data.front() + t.data.back();
    }
    (void)sum;
  }
  return 0;
}
