// Reference dequantizers of the grid i-quants: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M. Each
// element's bits are located by the formulas next to its block struct in quant_blocks.h; the float
// arithmetic (scale products, then value times sign) is ggml's, in its order, so results are bit-exact.
#include "core/quant/fp_contract_off.h"
// (the line above must stay first)
#include <cstring>

#include "core/half.h"
#include "core/quant/iq_grids.h"
#include "core/quant/quant_blocks.h"

namespace kiln::quant {
namespace {

// Little-endian uint32 at p.
uint32_t load_u32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// y[0..7] = dl * magnitude_j * sign_j for a group of 8 from a uint64 grid entry and 8 sign bits (1 = -).
void put_group8(float* y, float dl, uint64_t entry, uint8_t signs) {
  for (int j = 0; j < 8; ++j) {
    y[j] = dl * static_cast<float>(grid_byte(entry, j)) * ((signs >> j) & 1 ? -1.0f : 1.0f);
  }
}

// y[0..7] from two uint32 IQ3 grid entries (4 elements each) and 8 sign bits.
void put_quads(float* y, float dl, uint32_t first, uint32_t second, uint8_t signs) {
  put_group8(y, dl, first | static_cast<uint64_t>(second) << 32, signs);
}

// y[0..7] = dl * (grid_j + delta) for an IQ1S grid entry.
void put_iq1_group(float* y, float dl, uint64_t entry, float delta) {
  for (int j = 0; j < 8; ++j) y[j] = dl * (static_cast<float>(grid_byte_signed(entry, j)) + delta);
}

// IQ2_XS / IQ2_S sub-block scale: the 4-bit nibble s -> d * (0.5 + s) * 0.25.
float iq2_scale(float d, int nibble) { return d * (0.5f + static_cast<float>(nibble)) * 0.25f; }

}  // namespace

void dequantize_row_iq2_xxs(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const auto b = load_block<BlockIQ2_XXS>(src, i);
    const float d = f16_to_f32(b.d);
    float* y = dst + i * kQK_K;
    for (int ib = 0; ib < kQK_K / 32; ++ib) {
      const uint32_t a = load_u32(b.qs + 4 * ib);
      const uint32_t s = load_u32(b.qs + 4 * ib + 2);
      const float db = iq2_scale(d, static_cast<int>(s >> 28));
      for (int l = 0; l < 4; ++l, y += 8) {
        put_group8(y, db, kIQ2XXSGrid[(a >> (8 * l)) & 0xFF], kIQSigns[(s >> (7 * l)) & 127]);
      }
    }
  }
}

void dequantize_row_iq2_xs(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const auto b = load_block<BlockIQ2_XS>(src, i);
    const float d = f16_to_f32(b.d);
    float* y = dst + i * kQK_K;
    for (int g = 0; g < kQK_K / 8; ++g, y += 8) {
      const float dl = iq2_scale(d, (b.scales[g / 4] >> (4 * ((g / 2) % 2))) & 0x0F);
      put_group8(y, dl, kIQ2XSGrid[b.qs[g] & 511], kIQSigns[b.qs[g] >> 9]);
    }
  }
}

void dequantize_row_iq2_s(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const auto b = load_block<BlockIQ2_S>(src, i);
    const float d = f16_to_f32(b.d);
    float* y = dst + i * kQK_K;
    for (int g = 0; g < kQK_K / 8; ++g, y += 8) {
      const float dl = iq2_scale(d, (b.scales[g / 4] >> (4 * ((g / 2) % 2))) & 0x0F);
      const int index = b.qs[g] | ((b.qh[g / 4] >> (2 * (g % 4))) & 3) << 8;
      put_group8(y, dl, kIQ2SGrid[index], b.qs[kQK_K / 8 + g]);
    }
  }
}

void dequantize_row_iq3_xxs(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const auto b = load_block<BlockIQ3_XXS>(src, i);
    const float d = f16_to_f32(b.d);
    float* y = dst + i * kQK_K;
    for (int ib = 0; ib < kQK_K / 32; ++ib) {
      const uint32_t s = load_u32(b.qs + kQK_K / 4 + 4 * ib);
      const float db = d * (0.5f + static_cast<float>(s >> 28)) * 0.5f;
      const uint8_t* qs = b.qs + 8 * ib;
      for (int l = 0; l < 4; ++l, y += 8) {
        put_quads(y, db, kIQ3XXSGrid[qs[2 * l]], kIQ3XXSGrid[qs[2 * l + 1]], kIQSigns[(s >> (7 * l)) & 127]);
      }
    }
  }
}

void dequantize_row_iq3_s(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const auto b = load_block<BlockIQ3_S>(src, i);
    const float d = f16_to_f32(b.d);
    float* y = dst + i * kQK_K;
    for (int ib = 0; ib < kQK_K / 32; ++ib) {
      const float db = d * static_cast<float>(1 + 2 * ((b.scales[ib / 2] >> (4 * (ib % 2))) & 0x0F));
      for (int l = 0; l < 4; ++l, y += 8) {
        const int q = 8 * ib + 2 * l;  // first quad of the group
        const int first = b.qs[q] | ((b.qh[ib] >> (2 * l)) & 1) << 8;
        const int second = b.qs[q + 1] | ((b.qh[ib] >> (2 * l + 1)) & 1) << 8;
        put_quads(y, db, kIQ3SGrid[first], kIQ3SGrid[second], b.signs[4 * ib + l]);
      }
    }
  }
}

void dequantize_row_iq1_s(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const auto b = load_block<BlockIQ1_S>(src, i);
    const float d = f16_to_f32(b.d);
    float* y = dst + i * kQK_K;
    for (int ib = 0; ib < kQK_K / 32; ++ib) {
      const int h = b.qh[ib];
      const float dl = d * static_cast<float>(2 * ((h >> 12) & 7) + 1);
      const float delta = h & 0x8000 ? -kIQ1Delta : kIQ1Delta;
      for (int l = 0; l < 4; ++l, y += 8) {
        put_iq1_group(y, dl, kIQ1SGrid[b.qs[4 * ib + l] | ((h >> (3 * l)) & 7) << 8], delta);
      }
    }
  }
}

void dequantize_row_iq1_m(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const auto b = load_block<BlockIQ1_M>(src, i);
    uint16_t sc[4];
    std::memcpy(sc, b.scales, sizeof(sc));
    const auto d_bits = static_cast<uint16_t>((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) |
                                              ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000));
    const float d = f16_to_f32(d_bits);
    float* y = dst + i * kQK_K;
    for (int g = 0; g < kQK_K / 8; ++g, y += 8) {
      const float dl = d * static_cast<float>(2 * ((sc[g / 8] >> (3 * ((g / 2) % 4))) & 7) + 1);
      const int h = (b.qh[g / 2] >> (4 * (g % 2))) & 0x0F;
      put_iq1_group(y, dl, kIQ1SGrid[b.qs[g] | (h & 7) << 8], h & 8 ? -kIQ1Delta : kIQ1Delta);
    }
  }
}

}  // namespace kiln::quant
