// The matmul kernels, written once and compiled per ISA level: each cpu_kernels_<level>.cpp defines
// KILN_CPU_KERNELS_NAME and includes this file under its -m flags. The kernels are templates over the vector
// types of cpu_kernels_simd.h, instantiated with those the compiler's macros allow: __AVX512BW__ (Zmm: 2
// sub-blocks per 512-bit vector), __AVX512VNNI__ (vpdpbusd), __AVX2__ (Ymm: 1 sub-block per 256-bit vector,
// vpmaddubsw + vpmaddwd), else portable C++. The parts, by op family: cpu_kernels_unpack.h (x quantization,
// weight unpacking), cpu_kernels_tile.h (products of unpacked tiles and float rows), cpu_kernels_direct.h
// (decode products straight from the blocks), cpu_kernels_packed.h and cpu_kernels_float_packed.h (products
// of the packed layouts), cpu_kernels_attention.h.
// Everything here has internal linkage (see cpu_kernels.h on why nothing else may be included).
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "backends/cpu/kernels/cpu_kernels.h"
#include "core/quant/iq_grids.h"  // its grid arrays only (data): no inline function of it is called here
#include "core/quant/quant_blocks.h"
#if defined(__AVX2__)
#include <immintrin.h>
#else
#include "core/half.h"  // the portable level only: an inline function compiled with -m flags must not leak
#endif

#ifndef KILN_CPU_KERNELS_NAME
#error "define KILN_CPU_KERNELS_NAME before including cpu_kernels_impl.h"
#endif

// Loops over the tile's rows and columns are unrolled before GCC decides what stays in registers: otherwise
// the accumulator arrays live on the stack and every FMA stores its result (2x slower).
#if defined(__clang__)
#define KILN_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define KILN_UNROLL _Pragma("GCC unroll 16")
#else
#define KILN_UNROLL
#endif
// The decode loop's helpers must inline into it (a call per sub-block cost a tenth of Gemma's decode).
#if defined(__GNUC__)
#define KILN_INLINE inline __attribute__((always_inline))
#else
#define KILN_INLINE inline
#endif

namespace kiln::cpu {
namespace {

using namespace kiln::quant;

// GGUF type ids (DType's values; cpu_matmul.cpp static_asserts that they agree).
constexpr uint32_t kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ8_1 = 9,
                   kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kQ8_K = 15, kIQ2_XXS = 16,
                   kIQ2_XS = 17, kIQ3_XXS = 18, kIQ1_S = 19, kIQ4_NL = 20, kIQ3_S = 21, kIQ2_S = 22,
                   kIQ4_XS = 23, kIQ1_M = 29, kBF16 = 30, kF8E4M3 = 100, kQ8_64 = 101;

int64_t pad_k(int64_t k) { return (k + kKPad - 1) / kKPad * kKPad; }

float h2f(uint16_t h) {
#if defined(__AVX2__)
  return _cvtsh_ss(h);
#else
  return kiln::f16_to_f32(h);
#endif
}

// IEEE round to nearest even, as core/half.h's f32_to_f16.
[[maybe_unused]] uint16_t f2h(float f) {
#if defined(__AVX2__)
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
#else
  return kiln::f32_to_f16(f);
#endif
}

[[maybe_unused]] float bf2f(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

template <class Block>
const Block* block_at(const uint8_t* row, int64_t i) {
  return reinterpret_cast<const Block*>(row + i * static_cast<int64_t>(sizeof(Block)));
}

}  // namespace
}  // namespace kiln::cpu

// The parts, in this order: each uses those before it.
// clang-format off
#include "backends/cpu/kernels/cpu_kernels_simd.h"
#include "backends/cpu/kernels/cpu_kernels_unpack.h"
#include "backends/cpu/kernels/cpu_kernels_tile.h"
#include "backends/cpu/kernels/cpu_kernels_attention.h"
#include "backends/cpu/kernels/cpu_kernels_direct.h"
#include "backends/cpu/kernels/cpu_kernels_float_packed.h"
#include "backends/cpu/kernels/cpu_kernels_packed.h"
// clang-format on

namespace kiln::cpu {

const CpuKernels& KILN_CPU_KERNELS_NAME() {
  static const CpuKernels table{
      quantize_x,  unpack_w,         qdot,        qdot_direct,      fdot,
      kQdotPacked, kQdotPackedTiles, kFdotPacked, attn::attn_chunk, attn::attn_merge};
  return table;
}

}  // namespace kiln::cpu
