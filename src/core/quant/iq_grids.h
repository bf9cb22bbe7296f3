// The lookup grids of the GGUF i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M). These values
// are part of the file format: a block stores indices into them, so they must equal ggml's tables exactly.
//
// Each grid entry packs one group of elements, element j in byte j (little-endian):
// - IQ2 grids: 8 magnitudes from {8, 25, 43}; the sign of each element is stored separately.
// - IQ3 grids: 4 magnitudes, IQ3_XXS from {4, 12, ..., 62}, IQ3_S from the odd numbers 1..15 (signs
//   stored separately).
// - IQ1S grid: 8 signed bytes from {-1, 0, 1}, shared by IQ1_S and IQ1_M.
#pragma once

#include <array>
#include <cstdint>

namespace kiln::quant {

extern const uint64_t kIQ2XXSGrid[256];  // IQ2_XXS: 8-bit index
extern const uint64_t kIQ2XSGrid[512];   // IQ2_XS: 9-bit index
extern const uint64_t kIQ2SGrid[1024];   // IQ2_S: 10-bit index
extern const uint32_t kIQ3XXSGrid[256];  // IQ3_XXS: 8-bit index
extern const uint32_t kIQ3SGrid[512];    // IQ3_S: 9-bit index
extern const uint64_t kIQ1SGrid[2048];   // IQ1_S and IQ1_M: 11-bit index

// Byte j of a grid entry.
inline int grid_byte(uint64_t entry, int j) { return static_cast<int>((entry >> (8 * j)) & 0xFF); }
// Byte j of an IQ1S grid entry, a signed value in {-1, 0, 1}.
inline int grid_byte_signed(uint64_t entry, int j) { return static_cast<int8_t>((entry >> (8 * j)) & 0xFF); }

// The 7-bit sign codes of the IQ2_XXS, IQ2_XS and IQ3_XXS blocks: bit j (j < 7) of code c is the sign of
// element j of a group of 8, and the sign of element 7 makes the number of negative elements even. The
// table maps a code to its 8 sign bits (the format's ksigns table).
inline constexpr std::array<uint8_t, 128> kIQSigns = [] {
  std::array<uint8_t, 128> t{};
  for (int c = 0; c < 128; ++c) {
    int ones = 0;
    for (int b = 0; b < 7; ++b) ones += (c >> b) & 1;
    t[c] = static_cast<uint8_t>(c | (ones % 2 == 1 ? 0x80 : 0));
  }
  return t;
}();
static_assert(kIQSigns[1] == 129 && kIQSigns[3] == 3 && kIQSigns[127] == 255);

}  // namespace kiln::quant
