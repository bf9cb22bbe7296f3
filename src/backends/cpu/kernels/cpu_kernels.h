// The matmul kernels of one ISA level, as a table of function pointers (cpu_kernels(isa)). One source,
// cpu_kernels_impl.h, is compiled once per level (cpu_kernels_<level>.cpp, each with its -m flags); the level
// is picked at run time, so one binary runs on any x86-64 CPU. See docs/cpu-kernels.md.
//
// Quantized products work on 32-element sub-blocks in two layouts that every weight type maps to:
// - an x row, quantized once per call (QRowX): int8 quants and, per sub-block, its f32 scale and the scaled
//   sums of its two halves (for weights with an offset);
// - a tile of kTileRows weight rows unpacked from their GGUF blocks (QTileW, per thread, reused for every x
//   row): quants as uint8 (int8 for the signed types q8_0 / iq4_nl) and, per 16 elements, w = d * q + m.
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
};

// kTileRows unpacked weight rows; kp as in QRowX, the padding zero.
struct QTileW {
  const uint8_t* q;  // [kTileRows][kp] quants (int8 bits for signed types)
  const float* d;    // [kTileRows][kp / 4] per 16 elements the scale, 4 times (lanes, as QRowX::d)
  const float* m;    // [kTileRows][kp / 16] per 16 elements the offset: w = d * q + m
  int64_t kp;
  int64_t kb, ke;  // qdot multiplies elements [kb, ke) only (multiples of kKPad)
};

struct CpuKernels {
  // x [k] f32 -> `act` (q8_0 / q8_1: per 32; q8_k: per 256) rounded exactly as the reference quantizer, in
  // the QRowX layout: q [kp], d [kp / 4], s [kp / 16].
  void (*quantize_x)(uint32_t act, const float* x, int64_t k, int8_t* q, float* d, float* s);
  // Unpacks kTileRows rows of weight type `w` (any type activation_type() maps to a q8 type), k elements
  // each, into q [kTileRows * kp], d [kTileRows * kp / 4], m [kTileRows * kp / 16].
  void (*unpack_w)(uint32_t w, const uint8_t* const* rows, int64_t k, uint8_t* q, float* d, float* m);
  // out[c * kTileRows + r] = product of unpacked row r and x row c over [w.kb, w.ke), for c < n_x
  // (1..kTileCols).
  // is_signed: the quants are int8 (q8_0, iq4_nl); has_m: some m is non-zero.
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
};

// The table of each level, defined in its cpu_kernels_<level>.cpp (cpu_kernels(CpuIsa) picks one).
const CpuKernels& cpu_kernels_scalar();
const CpuKernels& cpu_kernels_avx2();
const CpuKernels& cpu_kernels_avx512();
const CpuKernels& cpu_kernels_avx512vnni();

}  // namespace kiln::cpu
