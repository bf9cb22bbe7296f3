// Quant<> of the grid i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M): the part of
// dequant.cuh that reads the format's grids. Included at the end of dequant.cuh, whose helpers it uses;
// include dequant.cuh, not this file.
#pragma once

#include "backends/cuda/matmul/iq_grids_data.cuh"  // generated at build time (iq_grids_gen.cpp)

namespace kiln::cuda {

// ---- i-quants (core/quant/quant_iq_dequant.cpp): super-blocks of 256, a piece is group g = p % 32 (8
// elements) of its super-block, in sub-block ib = g / 4 (32 elements) at position l = g % 4 ----

// An i-quant grid entry as 8 bytes (byte j: element j); the grids are device arrays (iq_grids_data.cuh).
__device__ __forceinline__ uint2 iq_entry8(const uint64_t* grid, uint32_t i) {
  const unsigned long long e = __ldg(reinterpret_cast<const unsigned long long*>(grid) + i);
  return make_uint2(static_cast<uint32_t>(e), static_cast<uint32_t>(e >> 32));
}
// Two 4-element IQ3 entries as one 8-element group.
__device__ __forceinline__ uint2 iq_entry4x2(const uint32_t* grid, uint32_t first, uint32_t second) {
  return make_uint2(__ldg(grid + first), __ldg(grid + second));
}
// The 8 sign bits of a 7-bit sign code (core/quant/iq_grids.h's kIQSigns): bit 7 makes the count of set
// bits even.
__device__ __forceinline__ uint32_t iq_signs8(uint32_t code) { return code | ((__popc(code) & 1) << 7); }
// The scale of IQ2_XXS, IQ2_XS, IQ2_S (kDiv 4) and IQ3_XXS (kDiv 2): d * (0.5 + s) / kDiv, as the CPU's
// d * (0.5f + s) * (1 / kDiv), each product rounded.
template <int kDiv>
__device__ __forceinline__ float iq_half_scale(float d, uint32_t s) {
  return __fmul_rn(__fmul_rn(d, __fadd_rn(0.5f, small_int_to_f32(static_cast<int>(s)))), 1.0f / kDiv);
}
// w[j] = dl * magnitude_j, negated where sign bit j is set: the CPU's dl * magnitude * (+-1.0f), the
// multiplication by -1 being exact.
__device__ __forceinline__ void iq_group8(float dl, uint2 entry, uint32_t signs, float (&w)[8]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float v = __fmul_rn(dl, small_int_to_f32(static_cast<int>(byte_of(entry, j))));
    w[j] = (signs >> j) & 1 ? -v : v;
  }
}
// IQ1_S / IQ1_M: w[j] = dl * (grid_j + delta), grid_j a signed byte in {-1, 0, 1}, delta +-1/8 (the sum
// exact).
__device__ __forceinline__ void iq1_group8(float dl, uint2 entry, bool minus, float (&w)[8]) {
  const float delta = minus ? -0.125f : 0.125f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int g = static_cast<int8_t>(byte_of(entry, j));
    w[j] = __fmul_rn(dl, __fadd_rn(small_int_to_f32(g), delta));
  }
}

template <>
struct Quant<DType::iq2_xxs> {  // d:2 qs:64 (sub-block ib: 4 grid bytes, then a u32 of 4 sign codes + scale)
  static constexpr int kBlock = 256, kBytes = 66, kAlign = 2, kSafeAlign = 1;
  template <int A>
  __device__ static void piece(const uint8_t* row, int64_t p, float (&w)[8]) {
    int g;
    const uint8_t* b = block_of<Quant>(row, p, g);
    const int ib = g / 4, l = g % 4;
    const float d = f16_bits_to_f32(ld_u16<A>(b));
    const uint32_t index = ld_u8(b + 2 + 8 * ib + l);
    const uint32_t s = ld_u32<align_at(A, 2)>(b + 6 + 8 * ib);
    iq_group8(iq_half_scale<4>(d, s >> 28), iq_entry8(kIQ2XXSGrid, index), iq_signs8((s >> (7 * l)) & 127),
              w);
  }
};

template <>
struct Quant<DType::iq2_xs> {  // d:2 qs:64 (u16 a group: 9-bit index, 7-bit sign code) scales:8
  static constexpr int kBlock = 256, kBytes = 74, kAlign = 2, kSafeAlign = 1;
  template <int A>
  __device__ static void piece(const uint8_t* row, int64_t p, float (&w)[8]) {
    int g;
    const uint8_t* b = block_of<Quant>(row, p, g);
    const float d = f16_bits_to_f32(ld_u16<A>(b));
    const uint32_t q = ld_u16<align_at(A, 2)>(b + 2 + 2 * g);
    const uint32_t s = (ld_u8(b + 66 + g / 4) >> (4 * ((g / 2) % 2))) & 0x0F;
    iq_group8(iq_half_scale<4>(d, s), iq_entry8(kIQ2XSGrid, q & 511), iq_signs8(q >> 9), w);
  }
};

template <>
struct Quant<DType::iq2_s> {  // d:2 qs:32 signs:32 qh:8 scales:8
  static constexpr int kBlock = 256, kBytes = 82, kAlign = 2, kSafeAlign = 1;
  template <int A>
  __device__ static void piece(const uint8_t* row, int64_t p, float (&w)[8]) {
    int g;
    const uint8_t* b = block_of<Quant>(row, p, g);
    const float d = f16_bits_to_f32(ld_u16<A>(b));
    const uint32_t index = ld_u8(b + 2 + g) | (((ld_u8(b + 66 + g / 4) >> (2 * (g % 4))) & 3) << 8);
    const uint32_t s = (ld_u8(b + 74 + g / 4) >> (4 * ((g / 2) % 2))) & 0x0F;
    iq_group8(iq_half_scale<4>(d, s), iq_entry8(kIQ2SGrid, index), ld_u8(b + 34 + g), w);
  }
};

template <>
struct Quant<DType::iq3_xxs> {  // d:2 qs:64 (a grid byte a quad) then 8 u32 (4 sign codes + scale)
  static constexpr int kBlock = 256, kBytes = 98, kAlign = 2, kSafeAlign = 1;
  template <int A>
  __device__ static void piece(const uint8_t* row, int64_t p, float (&w)[8]) {
    int g;
    const uint8_t* b = block_of<Quant>(row, p, g);
    const int ib = g / 4, l = g % 4;
    const float d = f16_bits_to_f32(ld_u16<A>(b));
    const uint32_t quads = ld_u16<align_at(A, 2)>(b + 2 + 2 * g);  // quads 2g, 2g + 1
    const uint32_t s = ld_u32<align_at(A, 2)>(b + 66 + 4 * ib);
    iq_group8(iq_half_scale<2>(d, s >> 28), iq_entry4x2(kIQ3XXSGrid, quads & 0xFF, quads >> 8),
              iq_signs8((s >> (7 * l)) & 127), w);
  }
};

template <>
struct Quant<DType::iq3_s> {  // d:2 qs:64 qh:8 signs:32 scales:4
  static constexpr int kBlock = 256, kBytes = 110, kAlign = 2, kSafeAlign = 1;
  template <int A>
  __device__ static void piece(const uint8_t* row, int64_t p, float (&w)[8]) {
    int g;
    const uint8_t* b = block_of<Quant>(row, p, g);
    const int ib = g / 4, l = g % 4;
    const float d = f16_bits_to_f32(ld_u16<A>(b));
    const uint32_t quads = ld_u16<align_at(A, 2)>(b + 2 + 2 * g);  // low index bytes of quads 2g, 2g + 1
    const uint32_t high = ld_u8(b + 66 + ib) >> (2 * l);
    const uint32_t s = (ld_u8(b + 106 + ib / 2) >> (4 * (ib % 2))) & 0x0F;
    const float dl = __fmul_rn(d, small_int_to_f32(static_cast<int>(1 + 2 * s)));
    iq_group8(
        dl,
        iq_entry4x2(kIQ3SGrid, (quads & 0xFF) | ((high & 1) << 8), (quads >> 8) | (((high >> 1) & 1) << 8)),
        ld_u8(b + 74 + g), w);
  }
};

template <>
struct Quant<DType::iq1_s> {  // d:2 qs:32 qh:16 (u16 a sub-block: 4 x 3 index bits, 3-bit scale, delta sign)
  static constexpr int kBlock = 256, kBytes = 50, kAlign = 2, kSafeAlign = 1;
  template <int A>
  __device__ static void piece(const uint8_t* row, int64_t p, float (&w)[8]) {
    int g;
    const uint8_t* b = block_of<Quant>(row, p, g);
    const int ib = g / 4, l = g % 4;
    const float d = f16_bits_to_f32(ld_u16<A>(b));
    const uint32_t h = ld_u16<align_at(A, 2)>(b + 34 + 2 * ib);
    const float dl = __fmul_rn(d, small_int_to_f32(static_cast<int>(2 * ((h >> 12) & 7) + 1)));
    const uint32_t index = ld_u8(b + 2 + g) | (((h >> (3 * l)) & 7) << 8);
    iq1_group8(dl, iq_entry8(kIQ1SGrid, index), (h & 0x8000) != 0, w);
  }
};

template <>
struct Quant<DType::iq1_m> {  // qs:32 qh:16 scales:8 (4 u16: 3-bit scales, d's nibbles on top)
  static constexpr int kBlock = 256, kBytes = 56, kAlign = 8, kSafeAlign = 1;
  template <int A>
  __device__ static void piece(const uint8_t* row, int64_t p, float (&w)[8]) {
    int g;
    const uint8_t* b = block_of<Quant>(row, p, g);
    const uint2 sc = ld_u64<align_at(A, 48)>(b + 48);  // sc[0] | sc[1] << 16, sc[2] | sc[3] << 16
    const uint32_t d_bits =
        ((sc.x >> 12) & 0x000F) | ((sc.x >> 24) & 0x00F0) | ((sc.y >> 4) & 0x0F00) | ((sc.y >> 16) & 0xF000);
    const uint32_t scale = ((g < 16 ? sc.x : sc.y) >> (16 * ((g / 8) % 2) + 3 * ((g / 2) % 4))) & 7;
    const float dl = __fmul_rn(f16_bits_to_f32(d_bits), small_int_to_f32(static_cast<int>(2 * scale + 1)));
    const uint32_t h = (ld_u8(b + 32 + g / 2) >> (4 * (g % 2))) & 0x0F;
    iq1_group8(dl, iq_entry8(kIQ1SGrid, ld_u8(b + g) | ((h & 7) << 8)), (h & 8) != 0, w);
  }
};

}  // namespace kiln::cuda
