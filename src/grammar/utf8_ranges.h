// Code point ranges as sequences of UTF-8 byte ranges: the UTF-8 encodings of the code points [lo, hi] are
// exactly the byte strings b0 b1 .. b(n-1) with lo[i] <= b(i) <= hi[i], over a union of such sequences.
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::grammar {

struct Utf8Sequence {
  int32_t n = 0;                   // bytes, 1..4
  uint8_t lo[4] = {}, hi[4] = {};  // [n] the byte range at each position
};

// Appends the sequences of [lo, hi] (lo <= hi <= 0x10FFFF, no surrogate inside) to `out`.
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<Utf8Sequence>& out);

}  // namespace kiln::grammar
