// Device-side dequantization of every weight type the CUDA kernels read, bit-exact with the CPU references
// (core/quant/quant_*.cpp): the same f32 operations in the same order, each rounded on its own (__fmul_rn,
// __fadd_rn, __fsub_rn keep nvcc from contracting them into an FMA, as the CPU code is built with
// -ffp-contract=off).
//
// The unit of work is a piece: 8 consecutive elements of a row (a row of a block type is a whole number of
// blocks, so of pieces). Quant<T>::piece<A>(row, p, w) writes elements 8p .. 8p+7 of the row to w, reading
// the block with loads no wider than A bytes: A is the alignment the caller guarantees for every block start
// (Quant<T>::kAlign when the row start and stride allow it, Quant<T>::kSafeAlign always).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "core/dtype.h"

namespace kiln::cuda {

// ---- loads of A-aligned bytes through the read-only cache ----

// The loads take the alignment A guaranteed for their address; kInShared or-ed into A says the bytes are in
// shared memory (a staged copy of the weight, matmul/matmul.cu), read with plain loads instead of __ldg.
// kGrouped or-ed into A says a row of a legacy block type is in grouped form (legacy_block below).
inline constexpr int kInShared = 1 << 10;
inline constexpr int kGrouped = 1 << 11;
__host__ __device__ constexpr int align_bytes(int a) { return a & (kInShared - 1); }
__host__ __device__ constexpr int align_flags(int a) { return a & ~(kInShared - 1); }

template <int A, class V>
__device__ __forceinline__ V ld_as(const uint8_t* p) {
  if constexpr ((A & kInShared) != 0)
    return *reinterpret_cast<const V*>(p);
  else
    return __ldg(reinterpret_cast<const V*>(p));
}

__device__ __forceinline__ uint32_t ld_u8(const uint8_t* p) { return __ldg(p); }

template <int A>
__device__ __forceinline__ uint32_t ld_u16(const uint8_t* p) {
  if constexpr (align_bytes(A) >= 2) {
    return ld_as<A, unsigned short>(p);
  } else {
    static_assert((A & kInShared) == 0, "byte loads read global memory");
    return ld_u8(p) | (ld_u8(p + 1) << 8);
  }
}

template <int A>
__device__ __forceinline__ uint32_t ld_u32(const uint8_t* p) {
  if constexpr (align_bytes(A) >= 4)
    return ld_as<A, unsigned int>(p);
  else
    return ld_u16<A>(p) | (ld_u16<A>(p + 2) << 16);
}

// 8 bytes, little-endian: x holds bytes 0-3, y bytes 4-7.
template <int A>
__device__ __forceinline__ uint2 ld_u64(const uint8_t* p) {
  if constexpr (align_bytes(A) >= 8)
    return ld_as<A, uint2>(p);
  else
    return make_uint2(ld_u32<A>(p), ld_u32<A>(p + 4));
}

// 16 bytes, little-endian: x holds bytes 0-3, ..., w bytes 12-15.
template <int A>
__device__ __forceinline__ uint4 ld_u128(const uint8_t* p) {
  if constexpr (align_bytes(A) >= 16) {
    return ld_as<A, uint4>(p);
  } else {
    const uint2 lo = ld_u64<A>(p), hi = ld_u64<A>(p + 8);
    return make_uint4(lo.x, lo.y, hi.x, hi.y);
  }
}

// The alignment of an address at byte `offset` past an A-aligned one (the flags kept).
__host__ __device__ constexpr int align_at(int a, int offset) {
  const int low = offset & -offset, al = align_bytes(a);
  return align_flags(a) | (offset == 0 || low >= al ? al : low);
}

// Byte j (0..7) of an 8-byte value.
__device__ __forceinline__ uint32_t byte_of(uint2 v, int j) {
  return ((j < 4 ? v.x : v.y) >> (8 * (j & 3))) & 0xFF;
}

// An integer of magnitude < 2^22 as f32, exactly (as static_cast<float>), with an add instead of the slower
// integer-to-float conversion: 1.5 * 2^23 + q has q in its low mantissa bits.
__device__ __forceinline__ float small_int_to_f32(int q) {
  return __fsub_rn(__int_as_float(0x4B400000 + q), 12582912.0f);
}

__device__ __forceinline__ float f16_bits_to_f32(uint32_t h) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
}
__device__ __forceinline__ float bf16_bits_to_f32(uint32_t b) { return __uint_as_float(b << 16); }

// Entry q (0..15) of a 16-entry int8 table packed little-endian into four words, without a memory lookup
// (lanes index it divergently).
__device__ __forceinline__ int table16(uint32_t t0, uint32_t t1, uint32_t t2, uint32_t t3, uint32_t q) {
  const uint32_t word = q & 8 ? (q & 4 ? t3 : t2) : (q & 4 ? t1 : t0);
  return static_cast<int8_t>((word >> (8 * (q & 3))) & 0xFF);
}
// kIQ4NLValues (core/quant/quant_blocks.h): -127 -104 -83 -65 | -49 -35 -22 -10 | 1 13 25 38 | 53 69 89 113
__device__ __forceinline__ int iq4nl_value(uint32_t q) {
  return table16(0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u, q);
}
// kMXFP4Values: 0 1 2 3 | 4 6 8 12 | 0 -1 -2 -3 | -4 -6 -8 -12
__device__ __forceinline__ int mxfp4_value(uint32_t q) {
  return table16(0x03020100u, 0x0C080604u, 0xFDFEFF00u, 0xF4F8FAFCu, q);
}

// ---- per-type pieces ----

template <DType T>
struct Quant;

// Plain float types: a piece is 8 elements; one 16-byte load per 16 bytes when A == 16.
template <class Bits, int kSize>
struct FloatQuant {
  static constexpr int kBlock = 1, kBytes = kSize, kAlign = 16, kSafeAlign = kSize;
  template <int A>
  __device__ static void piece(const uint8_t* row, int64_t p, float (&w)[8]) {
    const uint8_t* b = row + p * 8 * kSize;
    if constexpr (A >= 16) {
#pragma unroll
      for (int v = 0; v < kSize / 2; ++v) {
        const uint4 u = __ldg(reinterpret_cast<const uint4*>(b) + v);
        const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          if constexpr (kSize == 4)
            w[v * 4 + i] = __uint_as_float(words[i]);
          else
            Bits::pair(words[i], w[v * 8 + 2 * i], w[v * 8 + 2 * i + 1]);
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) w[j] = element(b, j);
    }
  }
  // Element j past `b` (any row length: the tail of a row that is not a whole number of pieces).
  __device__ static float element(const uint8_t* b, int64_t j) {
    if constexpr (kSize == 4)
      return __ldg(reinterpret_cast<const float*>(b) + j);
    else
      return Bits::one(__ldg(reinterpret_cast<const unsigned short*>(b) + j));
  }
};
struct F16Bits {
  __device__ static float one(uint32_t h) { return f16_bits_to_f32(h); }
  __device__ static void pair(uint32_t u, float& a, float& b) {
    a = one(u & 0xFFFF);
    b = one(u >> 16);
  }
};
struct BF16Bits {
  __device__ static float one(uint32_t h) { return bf16_bits_to_f32(h); }
  __device__ static void pair(uint32_t u, float& a, float& b) {
    a = __uint_as_float(u << 16);
    b = __uint_as_float(u & 0xFFFF0000u);
  }
};
template <>
struct Quant<DType::f32> : FloatQuant<void, 4> {};
template <>
struct Quant<DType::f16> : FloatQuant<F16Bits, 2> {};
template <>
struct Quant<DType::bf16> : FloatQuant<BF16Bits, 2> {};

// The block of piece p and the piece's index inside it.
template <class Q>
__device__ __forceinline__ const uint8_t* block_of(const uint8_t* row, int64_t p, int& in_block) {
  constexpr int kPieces = Q::kBlock / 8;
  in_block = static_cast<int>(p % kPieces);
  return row + (p / kPieces) * Q::kBytes;
}

// The legacy blocks (q4_0, q4_1, q5_0, q5_1, q8_0: 32 elements) are a header of kHead bytes (d, m, qh) then
// kQs bytes of quants. A row in grouped form (A has kGrouped; made at load for matmul weights, group_rows()
// in matmul/grouped_weights.cu) stores each run of 8 blocks as their 8 headers, then their 8 quant arrays:
// the same 8 * kBytes bytes, with every quant array 16-byte aligned when the row is, so that a block's quants
// are whole 16-byte loads. A last run of r < 8 blocks keeps the room of 8 headers (the same offsets) before
// its r quant arrays. grouped_bytes() is the length of such a row.
struct LegacyBlock {
  const uint8_t* head;
  const uint8_t* qs;
};
template <int kHead, int kQs, int A>
__device__ __forceinline__ LegacyBlock legacy_block(const uint8_t* row, int64_t b) {
  if constexpr ((A & kGrouped) != 0) {
    const uint8_t* g = row + (b / 8) * (8 * (kHead + kQs));
    const int i = static_cast<int>(b % 8);
    return {g + i * kHead, g + 8 * kHead + i * kQs};
  } else {
    const uint8_t* h = row + b * (kHead + kQs);
    return {h, h + kHead};
  }
}
// The alignment of a legacy block's header and of its quants, in either form.
template <int A, int kHead>
__host__ __device__ constexpr int head_align() {
  return (A & kGrouped) != 0 ? align_at(A, kHead) : A;
}
template <int A, int kHead>
__host__ __device__ constexpr int qs_align() {
  return (A & kGrouped) != 0 ? A : align_at(A, kHead);
}
// Bytes of a row of k elements in grouped form (k a multiple of `block`, the elements of a block).
__host__ __device__ constexpr int64_t grouped_bytes(int64_t k, int block, int head, int qs) {
  const int64_t nb = k / block, r = nb % 8;
  return nb * (head + qs) + (r != 0 ? (8 - r) * head : 0);
}

// Legacy 4-bit layout: 8 bytes of qs at `qs` hold elements 8i.. (low nibbles, i < 2) or 8(i-2).. (high).
template <int A>
__device__ __forceinline__ void nibbles8(const uint8_t* qs, int i, int (&q)[8]) {
  const uint2 v = ld_u64<A>(qs + 8 * (i & 1));
  const int shift = i < 2 ? 0 : 4;
#pragma unroll
  for (int j = 0; j < 8; ++j) q[j] = (byte_of(v, j) >> shift) & 0x0F;
}

template <>
struct Quant<DType::q4_0> {  // d:2 qs:16
  static constexpr int kBlock = 32, kBytes = 18, kAlign = 2, kSafeAlign = 1, kHead = 2;
  template <int A>
  __device__ static void piece(const uint8_t* row, int64_t p, float (&w)[8]) {
    const LegacyBlock b = legacy_block<kHead, 16, A>(row, p / 4);
    const float d = f16_bits_to_f32(ld_u16<head_align<A, kHead>()>(b.head));
    int q[8];
    nibbles8<qs_align<A, kHead>()>(b.qs, static_cast<int>(p % 4), q);
#pragma unroll
    for (int j = 0; j < 8; ++j) w[j] = __fmul_rn(small_int_to_f32(q[j] - 8), d);
  }
};

template <>
struct Quant<DType::q4_1> {  // d:2 m:2 qs:16
  static constexpr int kBlock = 32, kBytes = 20, kAlign = 4, kSafeAlign = 1, kHead = 4;
  template <int A>
  __device__ static void piece(const uint8_t* row, int64_t p, float (&w)[8]) {
    const LegacyBlock b = legacy_block<kHead, 16, A>(row, p / 4);
    const uint32_t dm = ld_u32<head_align<A, kHead>()>(b.head);
    const float d = f16_bits_to_f32(dm & 0xFFFF), m = f16_bits_to_f32(dm >> 16);
    int q[8];
    nibbles8<qs_align<A, kHead>()>(b.qs, static_cast<int>(p % 4), q);
#pragma unroll
    for (int j = 0; j < 8; ++j) w[j] = __fadd_rn(__fmul_rn(small_int_to_f32(q[j]), d), m);
  }
};

template <>
struct Quant<DType::q5_0> {  // d:2 qh:4 qs:16
  static constexpr int kBlock = 32, kBytes = 22, kAlign = 2, kSafeAlign = 1, kHead = 6;
  template <int A>
  __device__ static void piece(const uint8_t* row, int64_t p, float (&w)[8]) {
    const int i = static_cast<int>(p % 4);
    const LegacyBlock b = legacy_block<kHead, 16, A>(row, p / 4);
    constexpr int H = head_align<A, kHead>();
    const float d = f16_bits_to_f32(ld_u16<H>(b.head));
    const uint32_t qh = ld_u32<align_at(H, 2)>(b.head + 2) >> (8 * i);
    int q[8];
    nibbles8<qs_align<A, kHead>()>(b.qs, i, q);
#pragma unroll
    for (int j = 0; j < 8; ++j) w[j] = __fmul_rn(small_int_to_f32((q[j] | (((qh >> j) & 1) << 4)) - 16), d);
  }
};

template <>
struct Quant<DType::q5_1> {  // d:2 m:2 qh:4 qs:16
  static constexpr int kBlock = 32, kBytes = 24, kAlign = 8, kSafeAlign = 1, kHead = 8;
  template <int A>
  __device__ static void piece(const uint8_t* row, int64_t p, float (&w)[8]) {
    const int i = static_cast<int>(p % 4);
    const LegacyBlock b = legacy_block<kHead, 16, A>(row, p / 4);
    const uint2 head = ld_u64<head_align<A, kHead>()>(b.head);
    const float d = f16_bits_to_f32(head.x & 0xFFFF), m = f16_bits_to_f32(head.x >> 16);
    const uint32_t qh = head.y >> (8 * i);
    int q[8];
    nibbles8<qs_align<A, kHead>()>(b.qs, i, q);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      w[j] = __fadd_rn(__fmul_rn(small_int_to_f32(q[j] | (((qh >> j) & 1) << 4)), d), m);
    }
  }
};

template <>
struct Quant<DType::q8_0> {  // d:2 qs:32
  static constexpr int kBlock = 32, kBytes = 34, kAlign = 2, kSafeAlign = 1, kHead = 2;
  template <int A>
  __device__ static void piece(const uint8_t* row, int64_t p, float (&w)[8]) {
    const LegacyBlock b = legacy_block<kHead, 32, A>(row, p / 4);
    const float d = f16_bits_to_f32(ld_u16<head_align<A, kHead>()>(b.head));
    const uint2 v = ld_u64<qs_align<A, kHead>()>(b.qs + 8 * (p % 4));
#pragma unroll
    for (int j = 0; j < 8; ++j) w[j] = __fmul_rn(small_int_to_f32(static_cast<int8_t>(byte_of(v, j))), d);
  }
};

template <>
struct Quant<DType::iq4_nl> {  // d:2 qs:16
  static constexpr int kBlock = 32, kBytes = 18, kAlign = 2, kSafeAlign = 1;
  template <int A>
  __device__ static void piece(const uint8_t* row, int64_t p, float (&w)[8]) {
    int i;
    const uint8_t* b = block_of<Quant>(row, p, i);
    const float d = f16_bits_to_f32(ld_u16<A>(b));
    int q[8];
    nibbles8<align_at(A, 2)>(b + 2, i, q);
#pragma unroll
    for (int j = 0; j < 8; ++j) w[j] = __fmul_rn(d, small_int_to_f32(iq4nl_value(q[j])));
  }
};

template <>
struct Quant<DType::mxfp4> {  // e:1 qs:16
  static constexpr int kBlock = 32, kBytes = 17, kAlign = 1, kSafeAlign = 1;
  template <int A>
  __device__ static void piece(const uint8_t* row, int64_t p, float (&w)[8]) {
    int i;
    const uint8_t* b = block_of<Quant>(row, p, i);
    const uint32_t e = ld_u8(b);
    // 2^(e - 128), exact for every e (2^-127 and 2^-128 are subnormal), as e8m0_to_f32_half.
    const float d = __uint_as_float(e < 2 ? (0x00200000u << e) : ((e - 1) << 23));
    int q[8];
    nibbles8<1>(b + 1, i, q);
#pragma unroll
    for (int j = 0; j < 8; ++j) w[j] = __fmul_rn(d, small_int_to_f32(mxfp4_value(q[j])));
  }
};

// An FP8 E4M3 (e4m3fn) code as f32, exactly: a normal code is 2^(e - 7) (1 + m / 8), f32 exponent e + 120;
// a subnormal one m 2^-9; S.1111.111 is NaN (the loader refuses it in weights).
__device__ __forceinline__ float e4m3_to_f32(uint32_t b) {
  const uint32_t e = (b >> 3) & 0xF, m = b & 7, sign = (b & 0x80) << 24;
  if ((b & 0x7F) == 0x7F) return __uint_as_float(sign | 0x7FC00000u);
  const float mag = e != 0 ? __uint_as_float(((e + 120) << 23) | (m << 20))
                           : __fmul_rn(small_int_to_f32(static_cast<int>(m)), 0.001953125f);
  return __uint_as_float(__float_as_uint(mag) | sign);
}

// f8_e4m3's grouped form is its row form: a checkpoint with one scale a row (per channel, per tensor) has
// every block of a row at the same scale, so a row is held as 12 bytes of zeros, the scale (f32), then the
// row's k codes (grouped_row_bytes: k + 16 bytes). The GEMV reads one byte a weight, and the codes are the
// plain e4m3 matrix (leading dimension k + 16) the FP8 GEMM multiplies (fp8_gemm.cu).
template <>
struct Quant<DType::f8_e4m3> {  // d:4 (f32) qs:32 (e4m3 codes): FP8 checkpoints' weights (core/quant)
  static constexpr int kBlock = 32, kBytes = 36, kAlign = 4, kSafeAlign = 1, kHead = 4;
  template <int A>
  __device__ static void piece(const uint8_t* row, int64_t p, float (&w)[8]) {
    float d;
    uint2 v;
    if constexpr ((A & kGrouped) != 0) {
      d = __uint_as_float(ld_u32<4>(row + 12));
      v = ld_u64<8>(row + 16 + 8 * p);
    } else {
      d = __uint_as_float(ld_u32<A>(row + (p / 4) * kBytes));
      v = ld_u64<align_at(A, kHead)>(row + (p / 4) * kBytes + kHead + 8 * (p % 4));
    }
    // Two codes at a time through the card's conversion (cvt.f16x2.e4m3x2 from sm_89), which is exact: f16
    // holds every e4m3 value (and e4m3_to_f32's NaN is f16's). The bit decoding above costs a decode step's
    // GEMV more than its memory.
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t word = j < 2 ? v.x : v.y;
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>((word >> (16 * (j % 2))) & 0xFFFF), __NV_E4M3);
      const float2 f = __half22float2(__half2(h));
      w[2 * j] = __fmul_rn(d, f.x);
      w[2 * j + 1] = __fmul_rn(d, f.y);
    }
  }
};

// K-quants: piece p of a 256-element super-block covers elements e0 = 8p .. 8p+7, all in one sub-block of 16
// (or 32) and, for the 2- and 4-bit layouts, in one run of 8 bytes with one bit shift.

template <>
struct Quant<DType::q2_k> {  // scales:16 qs:64 d:2 dmin:2
  static constexpr int kBlock = 256, kBytes = 84, kAlign = 4, kSafeAlign = 1;
  template <int A>
  __device__ static void piece(const uint8_t* row, int64_t p, float (&w)[8]) {
    int i;
    const uint8_t* b = block_of<Quant>(row, p, i);
    const uint32_t dd = ld_u32<align_at(A, 80)>(b + 80);
    const float d = f16_bits_to_f32(dd & 0xFFFF), dmin = f16_bits_to_f32(dd >> 16);
    const uint32_t sc = ld_u8(b + i / 2);
    const float dl = __fmul_rn(d, small_int_to_f32(sc & 0x0F));
    const float ml = __fmul_rn(dmin, small_int_to_f32(sc >> 4));
    const uint2 v = ld_u64<align_at(A, 16)>(b + 16 + (i / 16) * 32 + (i % 4) * 8);
    const int shift = 2 * ((i / 4) % 4);
#pragma unroll
    for (int j = 0; j < 8; ++j)
      w[j] = __fsub_rn(__fmul_rn(dl, small_int_to_f32((byte_of(v, j) >> shift) & 3)), ml);
  }
};

template <>
struct Quant<DType::q3_k> {  // hmask:32 qs:64 scales:12 d:2
  static constexpr int kBlock = 256, kBytes = 110, kAlign = 2, kSafeAlign = 1;
  template <int A>
  __device__ static void piece(const uint8_t* row, int64_t p, float (&w)[8]) {
    int i;
    const uint8_t* b = block_of<Quant>(row, p, i);
    const float d = f16_bits_to_f32(ld_u16<align_at(A, 108)>(b + 108));
    const int s = i / 2;  // sub-block of 16
    const int low = (ld_u8(b + 96 + s % 8) >> (4 * (s / 8))) & 0x0F;
    const int high = (ld_u8(b + 96 + 8 + s % 4) >> (2 * (s / 4))) & 0x03;
    const float dl = __fmul_rn(d, small_int_to_f32((low | (high << 4)) - 32));
    const uint2 hm = ld_u64<A>(b + (i % 4) * 8);
    const uint2 v = ld_u64<align_at(A, 32)>(b + 32 + (i / 16) * 32 + (i % 4) * 8);
    const int shift = 2 * ((i / 4) % 4), hbit = i / 4;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int q = static_cast<int>((byte_of(v, j) >> shift) & 3) - ((byte_of(hm, j) >> hbit) & 1 ? 0 : 4);
      w[j] = __fmul_rn(dl, small_int_to_f32(q));
    }
  }
};

// Q4_K / Q5_K: 6-bit scale and min of sub-block s (0..7) from the 12 packed bytes (k_scale_min).
__device__ __forceinline__ void k_scale_min(const uint8_t* scales, int s, int& sc, int& m) {
  if (s < 4) {
    sc = ld_u8(scales + s) & 63;
    m = ld_u8(scales + s + 4) & 63;
  } else {
    const uint32_t packed = ld_u8(scales + s + 4);
    sc = (packed & 0x0F) | ((ld_u8(scales + s - 4) >> 6) << 4);
    m = (packed >> 4) | ((ld_u8(scales + s) >> 6) << 4);
  }
}

// Q4_K / Q5_K: dl * q - ml with dl = d * scale, ml = dmin * min of the piece's sub-block.
template <int A>
__device__ __forceinline__ void k_scales(const uint8_t* b, int s, float& dl, float& ml) {
  const uint32_t dd = ld_u32<A>(b);
  int sc, m;
  k_scale_min(b + 4, s, sc, m);
  dl = __fmul_rn(f16_bits_to_f32(dd & 0xFFFF), small_int_to_f32(sc));
  ml = __fmul_rn(f16_bits_to_f32(dd >> 16), small_int_to_f32(m));
}

template <>
struct Quant<DType::q4_k> {  // d:2 dmin:2 scales:12 qs:128
  static constexpr int kBlock = 256, kBytes = 144, kAlign = 16, kSafeAlign = 1;
  template <int A>
  __device__ static void piece(const uint8_t* row, int64_t p, float (&w)[8]) {
    int i;
    const uint8_t* b = block_of<Quant>(row, p, i);
    const int s = i / 4;  // sub-block of 32
    float dl, ml;
    k_scales<A>(b, s, dl, ml);
    const uint2 v = ld_u64<align_at(A, 16)>(b + 16 + (i / 8) * 32 + (i % 4) * 8);
    const int shift = s % 2 ? 4 : 0;
#pragma unroll
    for (int j = 0; j < 8; ++j)
      w[j] = __fsub_rn(__fmul_rn(dl, small_int_to_f32((byte_of(v, j) >> shift) & 0x0F)), ml);
  }
};

template <>
struct Quant<DType::q5_k> {  // d:2 dmin:2 scales:12 qh:32 qs:128
  static constexpr int kBlock = 256, kBytes = 176, kAlign = 16, kSafeAlign = 1;
  template <int A>
  __device__ static void piece(const uint8_t* row, int64_t p, float (&w)[8]) {
    int i;
    const uint8_t* b = block_of<Quant>(row, p, i);
    const int s = i / 4;
    float dl, ml;
    k_scales<A>(b, s, dl, ml);
    const uint2 h = ld_u64<align_at(A, 16)>(b + 16 + (i % 4) * 8);
    const uint2 v = ld_u64<align_at(A, 16)>(b + 48 + (i / 8) * 32 + (i % 4) * 8);
    const int shift = s % 2 ? 4 : 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t q = ((byte_of(v, j) >> shift) & 0x0F) | (((byte_of(h, j) >> s) & 1) << 4);
      w[j] = __fsub_rn(__fmul_rn(dl, small_int_to_f32(q)), ml);
    }
  }
};

// Q6_K: ql:128 qh:64 scales:16 (int8) d:2 (f16). Element 128h + 32g + l (h 0..1, g 0..3, l 0..31) of a
// super-block is d * scales[8h + 2g + l / 16] * (q - 32), q's low 4 bits the low (g 0, 1) or high (g 2, 3)
// nibble of ql byte 64h + 32(g % 2) + l, its high 2 bits bits 2g, 2g + 1 of qh byte 32h + l.
//
// Grouped form (A has kGrouped; made at load for matmul weights, group_rows()): each run of 8 super-blocks
// as their 8 scale arrays, their 8 d, then their 8 quant arrays of 192 bytes (a last run of r < 8 keeps the
// room of 8 scale arrays and d before its r quant arrays: grouped_bytes(k, 256, 18, 192)). A quant array is
// the file's with ql's quarters in the order 0, 2, 1, 3 (ql bytes 64h + 32(g % 2) + l at 32h + 64(g % 2) +
// l), then qh: the 32-bit words of the unit (h, t) of Q8<q6_k> (ql 64h + 4t, 64h + 32 + 4t, qh 32h + 4t) lie
// in three runs of 64 bytes, one word a thread, so that the 32 threads of a warp (two super-blocks 192 bytes
// apart in a staged segment) read distinct banks. Quants and scales are 16-byte aligned when the row is.
struct Q6kBlock {
  const uint8_t* qs;      // ql (in the form's order), then qh at +128
  const uint8_t* scales;  // 16 int8
  const uint8_t* d;       // f16
};
// The offsets of super-block b's parts in a row.
struct Q6kAt {
  int64_t qs, scales, d;
};
template <int A>
__host__ __device__ constexpr Q6kAt q6k_at(int64_t b) {
  if constexpr ((A & kGrouped) != 0) {
    const int64_t g = (b / 8) * (8 * 210), i = b % 8;
    return {g + 144 + 192 * i, g + 16 * i, g + 128 + 2 * i};
  } else {
    return {b * 210, b * 210 + 192, b * 210 + 208};
  }
}
template <int A>
__device__ __forceinline__ Q6kBlock q6k_block(const uint8_t* row, int64_t b) {
  const Q6kAt at = q6k_at<A>(b);
  return {row + at.qs, row + at.scales, row + at.d};
}
// The offset in a Q6kBlock's qs of ql byte 64h + 32 * odd + l (l = 0).
template <int A>
__host__ __device__ constexpr int q6k_ql(int h, int odd) {
  return (A & kGrouped) != 0 ? 32 * h + 64 * odd : 64 * h + 32 * odd;
}
// The alignments of a Q6kBlock's parts: qs, scales, d.
template <int A>
__host__ __device__ constexpr int q6k_qs_align() {
  return A;
}
template <int A>
__host__ __device__ constexpr int q6k_scales_align() {
  return (A & kGrouped) != 0 ? A : align_at(A, 192);
}
template <int A>
__host__ __device__ constexpr int q6k_d_align() {
  return (A & kGrouped) != 0 ? align_flags(A) | 2 : align_at(A, 208);  // grouped: at 128 + 2i
}

template <>
struct Quant<DType::q6_k> {
  static constexpr int kBlock = 256, kBytes = 210, kAlign = 2, kSafeAlign = 1;
  template <int A>
  __device__ static void piece(const uint8_t* row, int64_t p, float (&w)[8]) {
    const Q6kBlock b = q6k_block<A>(row, p / 32);
    const int i = static_cast<int>(p % 32);
    const float d = f16_bits_to_f32(ld_u16<q6k_d_align<A>()>(b.d));
    const float dl = __fmul_rn(d, small_int_to_f32(static_cast<int8_t>(ld_u8(b.scales + i / 2))));
    const int h = i / 16, k = (i / 4) % 4, l0 = (i % 4) * 8;
    const uint2 lo = ld_u64<A>(b.qs + q6k_ql<A>(h, k % 2) + l0);
    const uint2 hi = ld_u64<A>(b.qs + 128 + h * 32 + l0);
    const int lshift = k / 2 ? 4 : 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int q =
          static_cast<int>(((byte_of(lo, j) >> lshift) & 0x0F) | (((byte_of(hi, j) >> (2 * k)) & 3) << 4));
      w[j] = __fmul_rn(dl, small_int_to_f32(q - 32));
    }
  }
};

template <>
struct Quant<DType::iq4_xs> {  // d:2 scales_h:2 scales_l:4 qs:128
  static constexpr int kBlock = 256, kBytes = 136, kAlign = 8, kSafeAlign = 1;
  template <int A>
  __device__ static void piece(const uint8_t* row, int64_t p, float (&w)[8]) {
    int i;
    const uint8_t* b = block_of<Quant>(row, p, i);
    const uint2 head = ld_u64<A>(b);
    const int s = i / 4, j0 = (i % 4) * 8;  // sub-block of 32, first element in it
    const int low = static_cast<int>(byte_of(head, 4 + s / 2) >> (4 * (s % 2))) & 0x0F;
    const int high = static_cast<int>(head.x >> (16 + 2 * s)) & 0x03;
    const float dl = __fmul_rn(f16_bits_to_f32(head.x & 0xFFFF), small_int_to_f32((low | (high << 4)) - 32));
    const uint2 v = ld_u64<align_at(A, 8)>(b + 8 + s * 16 + j0 % 16);
    const int shift = j0 < 16 ? 0 : 4;
#pragma unroll
    for (int j = 0; j < 8; ++j)
      w[j] = __fmul_rn(dl, small_int_to_f32(iq4nl_value((byte_of(v, j) >> shift) & 0x0F)));
  }
};

// The legacy block types (legacy_block) and Q6_K (q6k_block), whose matmul weights the backend holds in
// grouped form, and f8_e4m3, whose rows of one scale it holds in row form (Quant<f8_e4m3>).
template <DType T>
inline constexpr bool kLegacyType =
    T == DType::q4_0 || T == DType::q4_1 || T == DType::q5_0 || T == DType::q5_1 || T == DType::q8_0;
template <DType T>
inline constexpr bool kGroupedType = kLegacyType<T> || T == DType::q6_k || T == DType::f8_e4m3;

// The weight types the kernels take. A type added here needs its entry in the list of GEMV instances
// (gemv_kernel.cuh), or the backend does not link.
// (clang-format reflows this list differently on each run.)
// clang-format off
#define KILN_CUDA_WEIGHT_TYPES(X)                                                    \
  X(f32) X(f16) X(bf16)                                                              \
  X(q4_0) X(q4_1) X(q5_0) X(q5_1) X(q8_0)                                            \
  X(q2_k) X(q3_k) X(q4_k) X(q5_k) X(q6_k)                                            \
  X(iq4_nl) X(iq4_xs) X(mxfp4) X(f8_e4m3)                                            \
  X(iq2_xxs) X(iq2_xs) X(iq2_s) X(iq3_xxs) X(iq3_s) X(iq1_s) X(iq1_m)
// clang-format on

// A visitor's case for one type of such a list: f(std::integral_constant<DType, t>).
#define KILN_CUDA_TYPE_CASE(name) \
  case DType::name: return f(std::integral_constant<DType, DType::name>{});

// Calls f(std::integral_constant<DType, t>) for a weight type above; cudaErrorNotSupported for any other.
template <class F>
cudaError_t visit_weight_type(DType t, F&& f) {
  switch (t) {
    KILN_CUDA_WEIGHT_TYPES(KILN_CUDA_TYPE_CASE)
    default: return cudaErrorNotSupported;
  }
}

}  // namespace kiln::cuda

// The i-quants' Quant<> specializations.
#include "backends/cuda/matmul/dequant_iq.cuh"  // IWYU pragma: export
