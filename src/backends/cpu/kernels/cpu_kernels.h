// The matmul kernels of one ISA level, as a table of function pointers (cpu_kernels(isa)). One source,
// cpu_kernels_impl.h, is compiled once per level (cpu_kernels_<level>.cpp, each with its -m flags); the level
// is picked at run time, so one binary runs on any x86-64 CPU. See docs/cpu-kernels.md.
//
// Quantized products work on 32-element sub-blocks in two layouts that every weight type maps to:
// - an x row, quantized once per call (QRowX): int8 quants and, per sub-block, its f32 scale and the scaled
//   sums of its two halves (for weights with an offset);
// - a tile of kTileRows weight rows unpacked from their GGUF blocks (QTileW, per thread, reused for every x
//   row): quants as uint8 (int8 for the signed types: q8_0, iq4_nl, iq4_xs and the grid i-quants, whose grid
//   values times signs are small integers) and, per 16 elements, w = d * q + m.
// A product is then sum over sub-blocks of d_w * d_x * (q_w . q_x) (exact in int32) + m_w * s_x.
//
// This header is all the per-level files include besides the block structs and intrinsics: whatever inline
// code they pull in is compiled with their -m flags, and a copy the linker picked from one of them could
// reach a CPU without those instructions. Types therefore travel as their GGUF ids (DType's values).
#pragma once

#include <cstdint>

namespace kiln::cpu {

inline constexpr int kTileRows = 4;   // weight rows per tile
inline constexpr int kTileCols = 4;   // x rows per micro-kernel call, at most
inline constexpr int64_t kSub = 32;   // elements per sub-block
inline constexpr int64_t kKPad = 64;  // rows are padded (with zeros) to a multiple of this many elements

// One x row in the quantized layout; kp = k rounded up to kKPad, the padding zero.
struct QRowX {
  const int8_t* q;  // [kp] quants
  const float* d;   // [kp / 32 * 8] the sub-block's scale, 8 times (one per int32 lane of its products)
  const float* s;   // [kp / 16] d * (sum of the 16 quants) of each half sub-block
  // [kp / 32] the sub-block's scale once (qdot_packed reads this: a long row's x then stays in L1 beside the
  // weights streaming through it)
  const float* d1 = nullptr;
};

// kTileRows unpacked weight rows; kp as in QRowX, the padding zero.
struct QTileW {
  const uint8_t* q;  // [kTileRows][kp] quants (int8 bits for signed types)
  const float* d;    // [kTileRows][kp / 4] per 16 elements the scale, 4 times (lanes, as QRowX::d)
  const float* m;    // [kTileRows][kp / 16] per 16 elements the offset: w = d * q + m
  int64_t kp;
  int64_t kb, ke;  // qdot multiplies elements [kb, ke) only (multiples of kKPad)
};

// ---- the packed layout: weights repacked at load (cpu_pack.cpp), for levels with a packed kernel ----------
// Rows go in groups of kPackRows, the rows of a group interleaved 4 bytes at a time, so that one 512-bit load
// holds 4 quants of each of 16 rows and one vpdpbusd against 4 broadcast x quants gives 16 rows' partial dot
// products: no horizontal sums, no scale conversion per row. A group is a run of chunks of up to
// kPackChunk sub-blocks of 32 elements; a chunk is
//   [header: 64 bytes, K scales only] then, for each run of the sub-blocks whose scales fill one 64-byte line
//   (2 sub-blocks; kPackDM: 1), [their scales, padded to 64 bytes] [their quants]
// so that a group is read as one sequential stream (scales in a region of their own, read beside the quants
// as a second stream, halved the rate at which kernels with a 64-byte scale line read memory).
// - quants of a sub-block, unsigned (a signed type's are stored + 128, its offset c then -128):
//   4 bits: 256 bytes, [4 pieces][16 rows][4 bytes]; byte b of piece c holds element 4c + b in its low nibble
//     and element 16 + 4c + b in its high one;
//   5 and 6 bits: those 256 bytes with the quants' low 4 bits, then their high bits in planes of
//     [16 rows][4 bytes] laid out as the pieces: 5 bits, one plane whose byte b holds in bit t the fifth bit
//     of element 4t + b (t < 4) or 16 + 4(t - 4) + b (t >= 4): 320 bytes; 6 bits, two planes, the first
//     holding in bits 2t, 2t + 1 the top two bits of element 4t + b, the second of element 16 + 4t + b: 384
//     bytes;
//   8 bits: 512 bytes, [8 pieces][16 rows][4 bytes], piece c elements 4c .. 4c + 3;
//   2 bits: 128 bytes, [2 pieces][16 rows][4 bytes]; byte b of piece p holds in bits 2t, 2t + 1 element
//     4(2t + p) + b (so that a shift by 2t and a mask make the 8-bit layout's piece 2t + p);
//   4-bit levels (PackedMatrix::levels: iq4_nl, iq4_xs): the 4-bit layout of each element's index into
//     IQ4_NL's 16 levels, which the kernels look up (one vpshufb a piece) as the 8-bit layout's values.
// - scales (PackScales), every value f16 (exact: the file's own) or a small integer:
inline constexpr int kPackRows = 16;      // weight rows per group
inline constexpr int kPackCols = 4;       // x rows per packed micro-kernel call, at most
inline constexpr int64_t kPackChunk = 8;  // sub-blocks per chunk
inline constexpr int kPackTileCols = 16;  // x rows an AMX tile holds (an A tile's rows)

enum PackScales : uint32_t {
  kPackD = 0,   // a sub-block: d[16] (32 bytes); w = d * (q + c)
  kPackDM = 1,  // a sub-block: d[16], m[16] (64 bytes); w = d * q + m
  kPackK32 =
      2,  // header: D[16], M[16]; a sub-block: sc[16] u8, mn[16] u8 (32 bytes); w = D * sc * q + M * mn
  kPackK16 = 3,   // header: D[16]; a sub-block: sc[16] i8 (its elements 0..15), sc[16] i8 (16..31);
                  // w = D * sc * (q + c)
  kPackKM16 = 4,  // header: D[16], M[16]; a sub-block: [16] u8 of sc | mn << 4 (its elements 0..15), [16]
                  // likewise (16..31), sc and mn 0..15; w = D * sc * q + M * mn (q2_K's scale and min per 16)
};

// Whether chunks of `scales` start with a header of super-block scales.
inline constexpr bool packed_has_header(uint32_t scales) {
  return scales == kPackK32 || scales == kPackK16 || scales == kPackKM16;
}

// One packed weight matrix [k, n]: ceil(n / kPackRows) groups (rows past n are zero), group g at
// data + g * group_bytes (64-byte aligned).
struct PackedMatrix {
  const uint8_t* data = nullptr;
  int64_t k = 0, n = 0;  // k a multiple of kSub
  int64_t group_bytes = 0;
  int bits = 8;  // bits a quant: 2, 4, 5, 6 or 8
  uint32_t scales = kPackD;
  float c = 0.0f;          // the quants' offset (kPackD, kPackK16)
  bool is_signed = false;  // quants stored + 128 (c is -128): kernels without vpdpbusd multiply them signed
  // A power of two every product is multiplied by last (exact): the grid i-quants' scales are unit * D * sc
  // (IQ2, IQ1: 1/8; IQ3_XXS: 1/4), so that D is the block's own f16.
  float unit = 1.0f;
  // 4-bit quants that index kIQ4NLValues: the quant is that level + 128 (is_signed, c -128).
  bool levels = false;
};

// x rows for the AMX packed kernel: quants one after another (row c at q + c * kp), and per tile of
// kPackTileCols rows t, sub-block s and row j < kPackTileCols, at [(t * kp / 32 + s) * kPackTileCols + j],
// the scalars the packed kernels put on with the weights' scales (zero for rows past the last):
struct QTilesX {
  const int8_t* q;
  int64_t kp;
  const float* dx;  // the sub-block's scale (QRowX::d1)
  // kPackK16: c * s_lo; kPackKM16: s_lo; kPackD: c * (s_lo + s_hi); else s_lo + s_hi (QRowX::s: s_lo, s_hi)
  const float* s0;
  const float* s1;  // kPackK16: c * s_hi; kPackKM16: s_hi; else unused
};

// A (bits, scales, levels) triple as one value, for the kernels' dispatch.
inline constexpr uint32_t packed_form(int bits, uint32_t scales, bool levels = false) {
  return static_cast<uint32_t>(levels) << 8 | static_cast<uint32_t>(bits) << 4 | scales;
}

// Bytes of the quants of one packed sub-block (16 rows) of `bits`-bit quants.
inline constexpr int64_t packed_quant_bytes(int bits) {
  return bits == 8 ? 512 : bits == 2 ? 128 : 256 + (bits - 4) * 64;
}

// Offsets of sub-block i's scales and quants from the start of a chunk's sub-blocks (after its header).
inline constexpr int64_t packed_scale_offset(int64_t i, int64_t scale_bytes, int64_t quant_bytes) {
  const int64_t per = 64 / scale_bytes;
  return i / per * (64 + per * quant_bytes) + i % per * scale_bytes;
}
inline constexpr int64_t packed_quant_offset(int64_t i, int64_t scale_bytes, int64_t quant_bytes) {
  const int64_t per = 64 / scale_bytes;
  return i / per * (64 + per * quant_bytes) + 64 + i % per * quant_bytes;
}

// Bytes of one packed group of k elements.
inline int64_t packed_group_bytes(int64_t k, int bits, uint32_t scales) {
  const int64_t header = packed_has_header(scales) ? 64 : 0;
  const int64_t sc = scales == kPackDM ? 64 : 32, qb = packed_quant_bytes(bits);
  int64_t bytes = 0;
  for (int64_t s0 = 0; s0 < k / kSub; s0 += kPackChunk) {
    const int64_t ns = k / kSub - s0 < kPackChunk ? k / kSub - s0 : kPackChunk;
    bytes += header + (ns * sc + 63) / 64 * 64 + ns * qb;
  }
  return bytes;
}

// ---- the packed float layout: f32 / f16 / bf16 weights repacked at load (cpu_pack.cpp) ----------------
// Rows in groups of kPackRows, a group [k][kPackRows] elements of the weight's own type (the file's bits),
// element i of its 16 rows side by side: one load (f16 / bf16: 32 bytes, f32: 64) gives element i of 16 rows,
// and one FMA against a broadcast x element adds it to the 16 rows' sums (no horizontal sums). Rows past n
// are zero; a group is padded to 64 bytes.
inline constexpr int kFPackGroups = 6;  // groups per fdot_packed call, at most (a run of one thread's items)

// One packed float matrix [k, n]: ceil(n / kPackRows) groups, group g at data + g * group_bytes (64-byte
// aligned).
struct PackedFloatMatrix {
  const uint8_t* data = nullptr;
  int64_t k = 0, n = 0;
  int64_t group_bytes = 0;
  uint32_t type = 0;  // the elements' type id: f32, f16, bf16 or f8_e4m3
};

// Bytes of one packed float group of k elements of elem_bytes each.
inline int64_t packed_float_group_bytes(int64_t k, int64_t elem_bytes) {
  return (k * kPackRows * elem_bytes + 63) / 64 * 64;
}

// FP8 checkpoints' f8_e4m3 (blocks of 32 e4m3fn codes and an f32 scale) in the packed float layout: a group
// is [k][kPackRows] codes, then [k / 32][kPackRows] floats, each its block's scale times 256 (the kernel
// reads a code as its value / 256: Ymm::load_e4m3_div256). Row r, element i: code[i][r] and scale[i / 32][r].
inline int64_t packed_f8_scales_offset(int64_t k) { return k * kPackRows; }
inline int64_t packed_f8_group_bytes(int64_t k) {
  return (packed_f8_scales_offset(k) + k / 32 * kPackRows * 4 + 63) / 64 * 64;
}

// ---- attention: a tile of query rows against a chunk of positions (cpu_attention.cpp drives) ------------
// A tile's rows are consecutive tokens of one sequence x the query heads of one KV head; its queries are held
// transposed (qt [head_dim][rp]), so a vector holds one element of kL rows and each K element, broadcast,
// feeds one FMA per kL rows (no horizontal sums, nothing to transpose per chunk). Positions go in chunks of
// kAttnChunk that start at multiples of kAttnChunk, whatever the tile. For row r and chunk c:
//   s_j  = (q_r . k_j as one f32 FMA chain over d in order) * scale, then softcap * tanh(s_j / softcap);
//          -inf where r does not see position j (causal mask, window)
//   m_c  = max_j s_j;  p_j = exp(s_j - m_c) (0 where masked);  l_c = sum_j p_j in position order;
//   a_c  = sum_j p_j v_j, for each element one FMA chain over j in position order
// and the row's state (m, l, o) takes the chunk in: m' = max(m, m_c), o' = a_c * exp(m_c - m') + o *
// exp(m - m'), l' likewise (a term whose max is -inf counts 0). Every step is elementwise in the row's lane,
// and a position the row does not see adds exact zeros, so a row's bits depend on its query, its positions
// and the K/V alone: not on the rows beside it in the tile, the tile's size or the batch.
inline constexpr int kAttnChunk = 64;  // positions per chunk
inline constexpr int kAttnAlign = 16;  // rp and dp are multiples of this (the widest vector's lanes)

// One tile against one chunk: the state (m, l, o) takes in the chunk's positions [j0, j1) (chunk-relative).
struct AttnChunk {
  const float* qt;  // [head_dim][rp] the tile's queries, transposed; rows n_rows .. rp - 1 zero
  int64_t head_dim, n_rows;
  int64_t rp;        // n_rows rounded up to kAttnAlign
  int64_t dp;        // head_dim rounded up to kAttnAlign: o's row stride
  uint32_t kv_type;  // the pools' DType id: f32, f16, q8_0 or q8_64
  const uint8_t* const*
      k_rows;  // [kAttnChunk] K row (head_dim elements) of chunk position j, for j0 <= j < j1
  const uint8_t* const* v_rows;  // [kAttnChunk] V rows, likewise
  int j0, j1;                    // the union of the rows' ranges: every row's lo >= j0, hi < j1
  const float* lo;               // [rp] row r sees chunk positions lo[r] <= j <= hi[r] (lo > hi: none)
  const float* hi;               // [rp]
  float scale, softcap;          // as ops::Attention's (softcap 0: none)
  float* m;                      // [rp] state: each row's running max (-inf before any position)
  float* l;                      // [rp] state: each row's running sum of exp(s - m)
  float* o;        // [n_rows][dp] state: each row's running sum of exp(s - m) * v (0 before any position)
  float* scratch;  // attn_scratch_floats(head_dim, rp)
};

inline int64_t attn_pad(int64_t n) { return (n + kAttnAlign - 1) / kAttnAlign * kAttnAlign; }
inline int64_t attn_scratch_floats(int64_t head_dim, int64_t rp) {
  return kAttnChunk * rp + 4 * rp + kAttnChunk * head_dim + (kAttnChunk + 1) * attn_pad(head_dim);
}

struct CpuKernels {
  // x [k] f32 -> `act` (q8_0 / q8_1: per 32; q8_k: per 256) rounded exactly as the reference quantizer, in
  // the QRowX layout: q [kp], d [kp / 4], s [kp / 16].
  void (*quantize_x)(uint32_t act, const float* x, int64_t k, int8_t* q, float* d, float* s);
  // Unpacks kTileRows rows of weight type `w` (any type activation_type() maps to a q8 type), k elements
  // each, into q [kTileRows * kp], d [kTileRows * kp / 4], m [kTileRows * kp / 16].
  void (*unpack_w)(uint32_t w, const uint8_t* const* rows, int64_t k, uint8_t* q, float* d, float* m);
  // out[c * kTileRows + r] = product of unpacked row r and x row c over [w.kb, w.ke), for c < n_x
  // (1..kTileCols).
  // is_signed: the quants are int8 (q8_0, iq4_nl, iq4_xs, the grid i-quants); has_m: some m is non-zero.
  void (*qdot)(const QTileW& w, const QRowX* x, int n_x, bool is_signed, bool has_m, float* out);
  // As qdot over [0, kp), straight from kTileRows packed rows of type `w` (k elements each) for n_x x rows,
  // rounding exactly as qdot does (so that a token's result does not depend on its batch); false (nothing
  // done) when this level has no such kernel for the type or that many x rows.
  // mb: scratch, [kTileRows * kp / 16] floats.
  bool (*qdot_direct)(uint32_t w, const uint8_t* const* rows, int64_t k, const QRowX* x, int n_x, float* mb,
                      float* out);
  // out[c * kTileRows + r] = sum_i w_r[i] * x_c[i] over k elements, w of type f32, f16 or bf16 (the
  // pointers may start inside rows: a cache block of k).
  void (*fdot)(uint32_t w, const uint8_t* const* rows, const float* const* x, int n_x, int64_t k, float* out);
  // out[c * kPackRows + r] = product of row r of packed group g and x row c (over all k), for c < n_x
  // (1..kPackCols); rounds the same for any n_x. Null at levels without a packed kernel (weights then stay in
  // their file layout).
  void (*qdot_packed)(const PackedMatrix& w, int64_t g, const QRowX* x, int n_x, float* out);
  // As qdot_packed, the same bits, in AMX tiles, for n_x x rows (any number) given as QTilesX.
  // out[c * kPackRows + r]. scratch: w.k / 32 * 512 + 64 bytes. Null at levels without tiles.
  void (*qdot_packed_tiles)(const PackedMatrix& w, int64_t g, const QTilesX& x, int64_t n_x, uint8_t* scratch,
                            float* out);
  // y[c][16 * g0 + r] = sum_i w[16 * g0 + r][i] * x[c][i] for the rows r < 16 * ng of groups g0 .. g0 + ng
  // that are < w.n (nothing past them is written), c < n_x (any number); ng <= kFPackGroups. Each result is
  // one f32 FMA chain over i = 0 .. k - 1 in order, whatever n_x and ng, so a token's result does not depend
  // on its batch. Null at levels without a packed kernel (float weights then stay in their file layout).
  void (*fdot_packed)(const PackedFloatMatrix& w, int64_t g0, int ng, const float* const* x, float* const* y,
                      int n_x);
  // Attention (AttnChunk above): the state takes in one chunk of positions.
  void (*attn_chunk)(const AttnChunk& c);
  // The state (m, l, o) takes in another state (m2, l2, o2) of the same rows with the operations attn_chunk
  // takes a chunk in with (a fresh state taking in X becomes X, bit for bit). The caller fixes where such
  // merges happen by position alone (cpu_attention.cpp: segments), so that they do not depend on the batch.
  // scratch: 2 * rp floats.
  void (*attn_merge)(float* m, float* l, float* o, const float* m2, const float* l2, const float* o2,
                     int64_t n_rows, int64_t rp, int64_t dp, float* scratch);
};

// The table of each level, defined in its cpu_kernels_<level>.cpp (cpu_kernels(CpuIsa) picks one).
const CpuKernels& cpu_kernels_scalar();
const CpuKernels& cpu_kernels_avx2();
const CpuKernels& cpu_kernels_avx512();
const CpuKernels& cpu_kernels_avx512vnni();
const CpuKernels& cpu_kernels_amx();

}  // namespace kiln::cpu
