// GGUF block-quant layouts (byte-exact with ggml's block_* structs) and the scalar reference
// (de)quantizers that dtype.cpp puts in the table.
//
// Every block struct is read from raw file bytes with std::memcpy (blocks in a row are only
// byte-aligned in general), so the structs hold plain integers: f16 fields are IEEE half bits
// (convert with core/half.h), multi-byte fields are little-endian as on every supported host.
// A row of n elements is n / block_size blocks laid end to end.
#pragma once

#include <cstdint>
#include <cstring>

namespace kiln::quant {

inline constexpr int kQK = 32;     // elements per block of the legacy quants and IQ4_NL
inline constexpr int kQK_K = 256;  // elements per super-block of the K-quants and IQ4_XS

// --- legacy quants: blocks of 32 --------------------------------------------------------------

// y = d * (q - 8), q in [0, 15]; qs[j] holds element j (low nibble) and j + 16 (high nibble).
struct BlockQ4_0 {
  uint16_t d;           // f16 scale
  uint8_t qs[kQK / 2];  // 4-bit quants
};
static_assert(sizeof(BlockQ4_0) == 18);

// y = d * q + m, q in [0, 15]; nibble layout as Q4_0.
struct BlockQ4_1 {
  uint16_t d;           // f16 scale
  uint16_t m;           // f16 minimum
  uint8_t qs[kQK / 2];  // 4-bit quants
};
static_assert(sizeof(BlockQ4_1) == 20);

// y = d * (q - 16), q in [0, 31]: low 4 bits as Q4_0, bit 4 of element j is bit j of qh.
struct BlockQ5_0 {
  uint16_t d;           // f16 scale
  uint8_t qh[4];        // bit 4 of each quant, little-endian uint32, bit j = element j
  uint8_t qs[kQK / 2];  // low 4 bits
};
static_assert(sizeof(BlockQ5_0) == 22);

// y = d * q + m, q in [0, 31]; bit layout as Q5_0.
struct BlockQ5_1 {
  uint16_t d;           // f16 scale
  uint16_t m;           // f16 minimum
  uint8_t qh[4];        // bit 4 of each quant
  uint8_t qs[kQK / 2];  // low 4 bits
};
static_assert(sizeof(BlockQ5_1) == 24);

// y = d * q, q in [-127, 127] (the quantizer never writes -128, the dequantizer accepts it).
struct BlockQ8_0 {
  uint16_t d;      // f16 scale
  int8_t qs[kQK];  // quants, element order
};
static_assert(sizeof(BlockQ8_0) == 34);

// y = d * q; s = d * sum(q) (an activation-side type: the sum serves Q4_1/Q5_1 dot products).
struct BlockQ8_1 {
  uint16_t d;      // f16 scale
  uint16_t s;      // f16 d * sum(qs)
  int8_t qs[kQK];  // quants, element order
};
static_assert(sizeof(BlockQ8_1) == 36);

// IQ4_NL: y = d * kIQ4NLValues[q], q in [0, 15]; nibble layout as Q4_0.
struct BlockIQ4_NL {
  uint16_t d;           // f16 scale
  uint8_t qs[kQK / 2];  // 4-bit indices into kIQ4NLValues
};
static_assert(sizeof(BlockIQ4_NL) == 18);

// The 16 non-linear levels of IQ4_NL / IQ4_XS.
inline constexpr int8_t kIQ4NLValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// MXFP4 (OCP microscaling): y = 2^(e - 128) * kMXFP4Values[q]; nibble layout as Q4_0.
// The scale is an E8M0 exponent; the levels are E2M1 values doubled, hence the extra 1/2.
struct BlockMXFP4 {
  uint8_t e;            // E8M0 exponent, bias 127
  uint8_t qs[kQK / 2];  // 4-bit E2M1 codes (sign in bit 3)
};
static_assert(sizeof(BlockMXFP4) == 17);

// The 16 E2M1 values, doubled (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives, times 2).
inline constexpr int8_t kMXFP4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// kiln's FP8 form (DType::f8_e4m3, no GGUF type): y = d * e4m3fn(q[j]) (core/half.h: f8_e4m3_to_f32). The
// quants are an FP8 checkpoint's own bytes; d is the checkpoint's scale for the block's 32 values
// (per-tensor, per-channel and 128x128-block scales all expand to one per block of 32). An f32 scale, not
// f16: the checkpoints' scales are f32 and often far below f16's range.
struct BlockF8E4M3 {
  float d;         // f32 scale
  uint8_t q[kQK];  // float8_e4m3fn bits, element order
};
static_assert(sizeof(BlockF8E4M3) == 36);

// kiln's 8-bit KV cache block (DType::q8_64, no GGUF type): Q8_0 over 64 values, y = d * q, q in [-127, 127].
struct BlockQ8_64 {
  uint16_t d;          // f16 scale
  int8_t qs[2 * kQK];  // quants, element order
};
static_assert(sizeof(BlockQ8_64) == 66);

// --- K-quants: super-blocks of 256 ------------------------------------------------------------

// 16 sub-blocks of 16: y = d * (scales[s] & 15) * q - dmin * (scales[s] >> 4), q in [0, 3].
// Element e: byte qs[(e / 128) * 32 + e % 32], bits 2 * ((e % 128) / 32).
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];  // 4-bit scale (low) and 4-bit min (high) per sub-block
  uint8_t qs[kQK_K / 4];       // 2-bit quants
  uint16_t d;                  // f16 super-block scale of the scales
  uint16_t dmin;               // f16 super-block scale of the mins
};
static_assert(sizeof(BlockQ2_K) == 84);

// 16 sub-blocks of 16: y = d * (scale6[s] - 32) * (q2 - (hbit ? 0 : 4)).
// Low 2 bits as Q2_K; hbit of element e is bit e / 32 of hmask[e % 32].
// 6-bit scale s: low 4 bits from scales[s % 8] >> (4 * (s / 8)), high 2 bits from
// scales[8 + s % 4] >> (2 * (s / 4)).
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];  // high bit of each quant (inverted: 1 means no offset)
  uint8_t qs[kQK_K / 4];     // low 2 bits
  uint8_t scales[12];        // 16 packed 6-bit scales
  uint16_t d;                // f16 super-block scale
};
static_assert(sizeof(BlockQ3_K) == 110);

// 8 sub-blocks of 32: y = d * sc[s] * q - dmin * m[s], q in [0, 15], sc/m 6-bit (see
// k_scale_min). Element e: byte qs[(e / 64) * 32 + e % 32], low nibble when (e / 32) is even.
struct BlockQ4_K {
  uint16_t d;             // f16 super-block scale of the scales
  uint16_t dmin;          // f16 super-block scale of the mins
  uint8_t scales[12];     // 8 packed 6-bit scales and 8 packed 6-bit mins
  uint8_t qs[kQK_K / 2];  // 4-bit quants
};
static_assert(sizeof(BlockQ4_K) == 144);

// As Q4_K with a fifth bit: bit 4 of element e is bit e / 32 of qh[e % 32]; q in [0, 31].
struct BlockQ5_K {
  uint16_t d;             // f16 super-block scale of the scales
  uint16_t dmin;          // f16 super-block scale of the mins
  uint8_t scales[12];     // as Q4_K
  uint8_t qh[kQK_K / 8];  // bit 4 of each quant
  uint8_t qs[kQK_K / 2];  // low 4 bits
};
static_assert(sizeof(BlockQ5_K) == 176);

// 16 sub-blocks of 16: y = d * scales[s] * (q - 32), q in [0, 63].
// Element e (h = e / 128, w = e % 128, k = w / 32, l = w % 32): low 4 bits are nibble k / 2 of
// ql[h * 64 + (k % 2) * 32 + l]; high 2 bits are bits 2k of qh[h * 32 + l].
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];      // low 4 bits
  uint8_t qh[kQK_K / 4];      // high 2 bits
  int8_t scales[kQK_K / 16];  // 8-bit signed sub-block scales
  uint16_t d;                 // f16 super-block scale
};
static_assert(sizeof(BlockQ6_K) == 210);

// y = d * q: the activation-side type of K-quant dot products.
struct BlockQ8_K {
  float d;                    // f32 scale
  int8_t qs[kQK_K];           // quants, element order
  int16_t bsums[kQK_K / 16];  // sum of each group of 16 quants
};
static_assert(sizeof(BlockQ8_K) == 292);

// 8 sub-blocks of 32: y = d * (scale6[s] - 32) * kIQ4NLValues[q]; sub-block s uses
// qs[s * 16 .. s * 16 + 15] with the IQ4_NL nibble layout. scale6[s] = low 4 bits from
// scales_l[s / 2] >> (4 * (s % 2)), high 2 bits from scales_h >> (2 * s).
struct BlockIQ4_XS {
  uint16_t d;                    // f16 super-block scale
  uint16_t scales_h;             // high 2 bits of the 8 scales
  uint8_t scales_l[kQK_K / 64];  // low 4 bits of the 8 scales
  uint8_t qs[kQK_K / 2];         // 4-bit indices into kIQ4NLValues
};
static_assert(sizeof(BlockIQ4_XS) == 136);

// Block i of a row (by value: rows are only byte-aligned in general).
template <class Block>
Block load_block(const void* row, int64_t i) {
  Block b;
  std::memcpy(&b, static_cast<const uint8_t*>(row) + i * static_cast<int64_t>(sizeof(Block)), sizeof(Block));
  return b;
}
template <class Block>
void store_block(void* row, int64_t i, const Block& b) {
  std::memcpy(static_cast<uint8_t*>(row) + i * static_cast<int64_t>(sizeof(Block)), &b, sizeof(Block));
}

// --- ternary quants (super-blocks of 256): y = d * t, t in {-1, 0, 1} -----------------------

// Five trits per byte in qs (base 3, the first trit most significant, stored as the fixed-point
// fraction byte = ceil(value * 256 / 243)), four per byte in qh. Trit k of a byte b is
// ((uint8_t)(b * 3^k) * 3) >> 8. Element order: qs[0..31] trit k -> 32k + m; qs[32..47] trit k ->
// 160 + 16k + m; qh[0..3] trit k -> 240 + 4k + j.
struct BlockTQ1_0 {
  uint8_t qs[(kQK_K - 4 * kQK_K / 64) / 5];  // 48 bytes, 5 trits each
  uint8_t qh[kQK_K / 64];                    // 4 bytes, 4 trits each
  uint16_t d;                                // f16 scale
};
static_assert(sizeof(BlockTQ1_0) == 54);

// 2 bits per element, t = q - 1; element e: bits 2 * ((e % 128) / 32) of qs[(e / 128) * 32 + e % 32].
struct BlockTQ2_0 {
  uint8_t qs[kQK_K / 4];  // 2-bit codes
  uint16_t d;             // f16 scale
};
static_assert(sizeof(BlockTQ2_0) == 66);

// --- i-quants (super-blocks of 256): groups of 8 (IQ2, IQ1) or 4 (IQ3) elements coded as an index into a
// grid of core/quant/iq_grids.h. A "sub-block" is 32 elements; ib is its number (0..7), l a group in it.

// Sub-block ib is qs[4ib..4ib+3] as two little-endian uint32 a (bytes 0-3) and b (bytes 4-7):
// group l (8 elements) = kIQ2XXSGrid[byte l of a], signs kIQSigns[(b >> 7l) & 127];
// y = d * (0.5 + (b >> 28)) * 0.25 * grid * sign.
struct BlockIQ2_XXS {
  uint16_t d;              // f16 super-block scale
  uint16_t qs[kQK_K / 8];  // 4 grid bytes + 4 sign codes and a 4-bit scale per sub-block
};
static_assert(sizeof(BlockIQ2_XXS) == 66);

// Group g (0..31): kIQ2XSGrid[qs[g] & 511], signs kIQSigns[qs[g] >> 9];
// y = d * (0.5 + s) * 0.25 * grid * sign, s = the nibble (g / 2) % 2 of scales[g / 4].
struct BlockIQ2_XS {
  uint16_t d;                  // f16 super-block scale
  uint16_t qs[kQK_K / 8];      // 9-bit grid index and 7-bit sign code per group of 8
  uint8_t scales[kQK_K / 32];  // two 4-bit scales per sub-block (groups 0-1, groups 2-3)
};
static_assert(sizeof(BlockIQ2_XS) == 74);

// Group g (0..31): kIQ2SGrid[qs[g] | ((qh[g / 4] >> (2 * (g % 4))) & 3) << 8], sign bit j of element j in
// qs[32 + g]; scales as IQ2_XS.
struct BlockIQ2_S {
  uint16_t d;                  // f16 super-block scale
  uint8_t qs[kQK_K / 4];       // 32 low index bytes, then 32 sign bytes
  uint8_t qh[kQK_K / 32];      // high 2 index bits of the 4 groups of each sub-block
  uint8_t scales[kQK_K / 32];  // two 4-bit scales per sub-block
};
static_assert(sizeof(BlockIQ2_S) == 82);

// Quad q (0..63, 4 elements): kIQ3XXSGrid[qs[q]]. Sub-block ib has a little-endian uint32 b at
// qs[64 + 4ib]: group l (quads 8ib + 2l, +1) has signs kIQSigns[(b >> 7l) & 127];
// y = d * (0.5 + (b >> 28)) * 0.5 * grid * sign.
struct BlockIQ3_XXS {
  uint16_t d;                 // f16 super-block scale
  uint8_t qs[3 * kQK_K / 8];  // 64 grid indices, then 8 x (4 sign codes and a 4-bit scale)
};
static_assert(sizeof(BlockIQ3_XXS) == 98);

// Quad q (0..63): kIQ3SGrid[qs[q] | ((qh[q / 8] >> (q % 8)) & 1) << 8]; sign of element e in bit e % 8 of
// signs[e / 8]; y = d * (1 + 2 * s) * grid * sign, s = the nibble ib % 2 of scales[ib / 2].
struct BlockIQ3_S {
  uint16_t d;                  // f16 super-block scale
  uint8_t qs[kQK_K / 4];       // low 8 bits of the 64 grid indices
  uint8_t qh[kQK_K / 32];      // bit 8 of the grid indices
  uint8_t signs[kQK_K / 8];    // one sign bit per element
  uint8_t scales[kQK_K / 64];  // two 4-bit scales per byte, one per sub-block
};
static_assert(sizeof(BlockIQ3_S) == 110);

// Sub-block ib: h = qh[ib]; group l = kIQ1SGrid[qs[4ib + l] | ((h >> 3l) & 7) << 8];
// y = d * (2 * ((h >> 12) & 7) + 1) * (grid + delta), delta = -1/8 when bit 15 of h is set, else +1/8.
struct BlockIQ1_S {
  uint16_t d;               // f16 super-block scale
  uint8_t qs[kQK_K / 8];    // low 8 bits of the 32 grid indices
  uint16_t qh[kQK_K / 32];  // per sub-block: 4 x 3 high index bits, 3-bit scale, delta sign
};
static_assert(sizeof(BlockIQ1_S) == 50);

// Group g (0..31): h = the nibble g % 2 of qh[g / 2]; kIQ1SGrid[qs[g] | (h & 7) << 8], delta = -1/8 when
// h & 8, else +1/8. scales as 4 little-endian uint16 sc[k]: the f16 super-block scale d has bits
// 4k..4k+3 in the top nibble of sc[k]; group g uses the 3-bit scale (sc[g / 8] >> (3 * ((g / 2) % 4))) & 7
// = s; y = d * (2 * s + 1) * (grid + delta).
struct BlockIQ1_M {
  uint8_t qs[kQK_K / 8];       // low 8 bits of the 32 grid indices
  uint8_t qh[kQK_K / 16];      // per group: 3 high index bits and the delta sign
  uint8_t scales[kQK_K / 32];  // 16 3-bit scales and the f16 scale's nibbles
};
static_assert(sizeof(BlockIQ1_M) == 56);

// IQ1_S / IQ1_M: the grid value shift that gives the levels -1 - delta, -delta, 1 - delta (or + delta).
inline constexpr float kIQ1Delta = 0.125f;

// --- row functions: n elements (a multiple of the block size), src/dst do not overlap ---------
// Dequantizers read n / block_size blocks from src and write n floats; quantizers the reverse.
// Quantizers follow ggml's reference (*_ref) quantizers operation for operation, so the bytes are
// identical to ggml's and to the gguf Python package's.

void dequantize_row_f32(const void* src, float* dst, int64_t n);
void dequantize_row_f16(const void* src, float* dst, int64_t n);
void dequantize_row_bf16(const void* src, float* dst, int64_t n);
void quantize_row_f32(const float* src, void* dst, int64_t n);
void quantize_row_f16(const float* src, void* dst, int64_t n);
void quantize_row_bf16(const float* src, void* dst, int64_t n);
// FP8 blocks: d = max |x| / 448 (0 for an all-zero block), q = x / d rounded to nearest even, saturated to
// +-448; never a NaN code (a NaN input becomes 0).
void dequantize_row_f8_e4m3(const void* src, float* dst, int64_t n);
void quantize_row_f8_e4m3(const float* src, void* dst, int64_t n);
// Q8_64 blocks: Q8_0's reference rounding (d = max |x| / 127, q = x / d rounded half away from zero) over 64
// values.
void dequantize_row_q8_64(const void* src, float* dst, int64_t n);
void quantize_row_q8_64(const float* src, void* dst, int64_t n);
// As model rows (QuantizeRowsFn): a plain float type has no use for importance weights.
void quantize_rows_f32(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                       const float* importance);
void quantize_rows_f16(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                       const float* importance);
void quantize_rows_bf16(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                        const float* importance);

void dequantize_row_q2_k(const void* src, float* dst, int64_t n);
void dequantize_row_q3_k(const void* src, float* dst, int64_t n);
void dequantize_row_q4_k(const void* src, float* dst, int64_t n);
void dequantize_row_q5_k(const void* src, float* dst, int64_t n);
void dequantize_row_q6_k(const void* src, float* dst, int64_t n);
void dequantize_row_q8_k(const void* src, float* dst, int64_t n);
void quantize_row_q8_k(const float* src, void* dst, int64_t n);

void dequantize_row_iq4_nl(const void* src, float* dst, int64_t n);
void dequantize_row_mxfp4(const void* src, float* dst, int64_t n);
void dequantize_row_iq4_xs(const void* src, float* dst, int64_t n);
void dequantize_row_tq1_0(const void* src, float* dst, int64_t n);
void dequantize_row_tq2_0(const void* src, float* dst, int64_t n);

void dequantize_row_iq2_xxs(const void* src, float* dst, int64_t n);
void dequantize_row_iq2_xs(const void* src, float* dst, int64_t n);
void dequantize_row_iq2_s(const void* src, float* dst, int64_t n);
void dequantize_row_iq3_xxs(const void* src, float* dst, int64_t n);
void dequantize_row_iq3_s(const void* src, float* dst, int64_t n);
void dequantize_row_iq1_s(const void* src, float* dst, int64_t n);
void dequantize_row_iq1_m(const void* src, float* dst, int64_t n);
// As model rows (QuantizeRowsFn), ggml's quantize_iq* search (quant_iq*_rows.cpp). IQ2_XXS, IQ2_XS and IQ1_S
// require importance weights; the others weight by x^2 (IQ2_S: by 0.25 sigma^2 + x^2) without them.
void quantize_rows_iq2_xxs(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                           const float* importance);
void quantize_rows_iq2_xs(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                          const float* importance);
void quantize_rows_iq2_s(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                         const float* importance);
void quantize_rows_iq3_xxs(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                           const float* importance);
void quantize_rows_iq3_s(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                         const float* importance);
void quantize_rows_iq1_s(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                         const float* importance);
void quantize_rows_iq1_m(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                         const float* importance);

// The row functions of the legacy blocks: Block is BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0 or
// BlockQ8_1 (quant_legacy.cpp instantiates these six).
template <class Block>
struct LegacyRow {
  static void dequantize(const void* src, float* dst, int64_t n);
  static void quantize(const float* src, void* dst, int64_t n);
};

// Model rows (QuantizeRowsFn), byte-identical with ggml_quantize_chunk. Without importance the reference
// quantizers above (Q8_0 always: it has no use for importance); IQ4_NL and IQ4_XS always search their scales,
// with x^2 weights when there is no importance. With importance, the searches of quant_k_search.h weighted
// by it (quant_legacy.cpp, quant_k_rows.cpp, quant_iq4_rows.cpp).
void quantize_rows_q4_0(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                        const float* importance);
void quantize_rows_q4_1(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                        const float* importance);
void quantize_rows_q5_0(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                        const float* importance);
void quantize_rows_q5_1(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                        const float* importance);
void quantize_rows_q8_0(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                        const float* importance);
void quantize_rows_q2_k(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                        const float* importance);
void quantize_rows_q3_k(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                        const float* importance);
void quantize_rows_q4_k(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                        const float* importance);
void quantize_rows_q5_k(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                        const float* importance);
void quantize_rows_q6_k(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                        const float* importance);
void quantize_rows_iq4_nl(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                          const float* importance);
void quantize_rows_iq4_xs(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                          const float* importance);

}  // namespace kiln::quant
