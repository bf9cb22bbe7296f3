#include "grammar/utf8_ranges.h"

namespace kiln::grammar {

namespace {

int32_t utf8_length(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

void utf8_encode(uint32_t cp, uint8_t* out) {
  const int32_t n = utf8_length(cp);
  if (n == 1) {
    out[0] = static_cast<uint8_t>(cp);
    return;
  }
  const uint8_t lead[] = {0, 0, 0xC0, 0xE0, 0xF0};
  for (int32_t i = n - 1; i > 0; --i) {
    out[i] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    cp >>= 6;
  }
  out[0] = static_cast<uint8_t>(lead[n] | cp);
}

}  // namespace

// Splits [lo, hi] until both ends have the same length and, at every continuation position, the range covers
// whole blocks of 64 except in its leading differing byte: then the encodings of lo and hi give the ranges.
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<Utf8Sequence>& out) {
  for (uint32_t edge : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= edge && edge < hi) {
      utf8_sequences(lo, edge, out);
      utf8_sequences(edge + 1, hi, out);
      return;
    }
  }
  const int32_t n = utf8_length(lo);
  for (int32_t i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;  // the low i continuation bytes
    if ((lo & ~m) == (hi & ~m)) continue;
    if ((lo & m) != 0) {
      utf8_sequences(lo, lo | m, out);
      utf8_sequences((lo | m) + 1, hi, out);
      return;
    }
    if ((hi & m) != m) {
      utf8_sequences(lo, (hi & ~m) - 1, out);
      utf8_sequences(hi & ~m, hi, out);
      return;
    }
  }
  Utf8Sequence s;
  s.n = n;
  utf8_encode(lo, s.lo);
  utf8_encode(hi, s.hi);
  out.push_back(s);
}

}  // namespace kiln::grammar
