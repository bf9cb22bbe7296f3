// Integer dot products of block-quantized weights with x rounded to 8 bits (Matmul at the fast precision on
// the GEMV path, matmul/matmul.cu).
//
// x is rounded per block of 32 elements, as llama.cpp's q8_1: int8 q = round(x / d) with d = max|x| / 127,
// and the block's pair {d, d * sum(q)} beside it. The products are then __dp4a of the weight's integers with
// q, four at a time, scaled once per block: a fraction of the instructions and of the x bytes the f32 GEMV
// needs. A weight offset or minimum (q4_0's -8, q4_1's m, the K-quants' mins) multiplies the block sum of x
// instead of every element.
//
// The unit of work is Q8<T>::kUnit elements of a row, which need not be contiguous: for the 4- and 5-bit
// types they are the low and high nibbles of the same bytes. Q8<T>::load<A>(row, u) reads unit u of a weight
// row (A: the alignment guaranteed for every block start, as in matmul/dequant.cuh) into registers;
// Q8<T>::load_x(u, x) reads the x values the unit multiplies; Q8<T>::dot(w, x) is their product.
#pragma once

#include <cstdint>
#include <type_traits>

#include "backends/cuda/matmul/dequant.cuh"

namespace kiln::cuda {

// One x row rounded to 8 bits: qs[k] as 32-bit words of four, and per block of 32 {d, d * sum(q)}.
struct XRow {
  const int* qs;
  const float2* ds;
};

// Byte `i` (0..11) of three little-endian words.
__device__ __forceinline__ uint32_t byte12(uint32_t w0, uint32_t w1, uint32_t w2, int i) {
  return ((i < 4 ? w0 : i < 8 ? w1 : w2) >> (8 * (i & 3))) & 0xFF;
}
// Bits 0..3 of b as bit 4 of bytes 0..3.
__device__ __forceinline__ uint32_t bits_to_bit4(uint32_t b) {
  return ((b & 1) << 4) | ((b & 2) << 11) | ((b & 4) << 18) | ((b & 8) << 25);
}

template <DType T>
struct Q8;

// Legacy 32-element blocks with 4-bit values: unit i (0..3) of a block is qs bytes 4i .. 4i+3, elements 4i ..
// 4i+3 (low nibbles) and 16+4i .. 16+4i+3 (high), a quarter of the block.
struct X32 {
  int lo, hi;
  float2 ds;
};
__device__ __forceinline__ X32 load_x32(int64_t u, const XRow& x) {
  const int64_t b = u / 4;
  const int i = static_cast<int>(u % 4);
  return {__ldg(x.qs + 8 * b + i), __ldg(x.qs + 8 * b + 4 + i), __ldg(x.ds + b)};
}
__device__ __forceinline__ int dot_nibbles(uint32_t lo, uint32_t hi, const X32& x) {
  return __dp4a(static_cast<int>(lo), x.lo, __dp4a(static_cast<int>(hi), x.hi, 0));
}

template <>
struct Q8<DType::q4_0> {  // d:2 qs:16; w = d * (q - 8)
  static constexpr int kUnit = 8;
  struct W {
    uint32_t q;
    float d;
  };
  using X = X32;
  template <int A>
  __device__ static W load(const uint8_t* row, int64_t u) {
    const uint8_t* b = row + (u / 4) * 18;
    return {ld_u32<align_at(A, 2)>(b + 2 + 4 * (u % 4)), f16_bits_to_f32(ld_u16<A>(b))};
  }
  __device__ static X load_x(int64_t u, const XRow& x) { return load_x32(u, x); }
  __device__ static float dot(const W& w, const X& x) {
    const int s = dot_nibbles(w.q & 0x0F0F0F0Fu, (w.q >> 4) & 0x0F0F0F0Fu, x);
    return w.d * (x.ds.x * static_cast<float>(s) - 2.0f * x.ds.y);  // -8 * sum(x) over a quarter block
  }
};

template <>
struct Q8<DType::q4_1> {  // d:2 m:2 qs:16; w = d * q + m
  static constexpr int kUnit = 8;
  struct W {
    uint32_t q;
    float d, m;
  };
  using X = X32;
  template <int A>
  __device__ static W load(const uint8_t* row, int64_t u) {
    const uint8_t* b = row + (u / 4) * 20;
    const uint32_t dm = ld_u32<A>(b);
    return {ld_u32<align_at(A, 4)>(b + 4 + 4 * (u % 4)), f16_bits_to_f32(dm & 0xFFFF),
            f16_bits_to_f32(dm >> 16)};
  }
  __device__ static X load_x(int64_t u, const XRow& x) { return load_x32(u, x); }
  __device__ static float dot(const W& w, const X& x) {
    const int s = dot_nibbles(w.q & 0x0F0F0F0Fu, (w.q >> 4) & 0x0F0F0F0Fu, x);
    return w.d * x.ds.x * static_cast<float>(s) + 0.25f * w.m * x.ds.y;
  }
};

// The 5-bit values of unit i: nibbles with their fifth bits from qh (bit j: element j).
__device__ __forceinline__ void five_bits(uint32_t qs, uint32_t qh, int i, uint32_t& lo, uint32_t& hi) {
  lo = (qs & 0x0F0F0F0Fu) | bits_to_bit4(qh >> (4 * i));
  hi = ((qs >> 4) & 0x0F0F0F0Fu) | bits_to_bit4(qh >> (16 + 4 * i));
}

template <>
struct Q8<DType::q5_0> {  // d:2 qh:4 qs:16; w = d * (q - 16)
  static constexpr int kUnit = 8;
  struct W {
    uint32_t lo, hi;
    float d;
  };
  using X = X32;
  template <int A>
  __device__ static W load(const uint8_t* row, int64_t u) {
    const uint8_t* b = row + (u / 4) * 22;
    const int i = static_cast<int>(u % 4);
    W w;
    five_bits(ld_u32<align_at(A, 2)>(b + 6 + 4 * i), ld_u32<align_at(A, 2)>(b + 2), i, w.lo, w.hi);
    w.d = f16_bits_to_f32(ld_u16<A>(b));
    return w;
  }
  __device__ static X load_x(int64_t u, const XRow& x) { return load_x32(u, x); }
  __device__ static float dot(const W& w, const X& x) {
    return w.d * (x.ds.x * static_cast<float>(dot_nibbles(w.lo, w.hi, x)) - 4.0f * x.ds.y);
  }
};

template <>
struct Q8<DType::q5_1> {  // d:2 m:2 qh:4 qs:16; w = d * q + m
  static constexpr int kUnit = 8;
  struct W {
    uint32_t lo, hi;
    float d, m;
  };
  using X = X32;
  template <int A>
  __device__ static W load(const uint8_t* row, int64_t u) {
    const uint8_t* b = row + (u / 4) * 24;
    const int i = static_cast<int>(u % 4);
    const uint2 head = ld_u64<A>(b);
    W w;
    five_bits(ld_u32<align_at(A, 8)>(b + 8 + 4 * i), head.y, i, w.lo, w.hi);
    w.d = f16_bits_to_f32(head.x & 0xFFFF);
    w.m = f16_bits_to_f32(head.x >> 16);
    return w;
  }
  __device__ static X load_x(int64_t u, const XRow& x) { return load_x32(u, x); }
  __device__ static float dot(const W& w, const X& x) {
    return w.d * x.ds.x * static_cast<float>(dot_nibbles(w.lo, w.hi, x)) + 0.25f * w.m * x.ds.y;
  }
};

template <>
struct Q8<DType::q8_0> {  // d:2 qs:32; w = d * q; unit i (0..3): elements 8i .. 8i+7
  static constexpr int kUnit = 8;
  struct W {
    int q0, q1;
    float d;
  };
  struct X {
    int q0, q1;
    float d;
  };
  template <int A>
  __device__ static W load(const uint8_t* row, int64_t u) {
    const uint8_t* b = row + (u / 4) * 34;
    const uint8_t* q = b + 2 + 8 * (u % 4);
    return {static_cast<int>(ld_u32<align_at(A, 2)>(q)), static_cast<int>(ld_u32<align_at(A, 2)>(q + 4)),
            f16_bits_to_f32(ld_u16<A>(b))};
  }
  __device__ static X load_x(int64_t u, const XRow& x) {
    return {__ldg(x.qs + 2 * u), __ldg(x.qs + 2 * u + 1), __ldg(x.ds + u / 4).x};
  }
  __device__ static float dot(const W& w, const X& x) {
    return w.d * x.d * static_cast<float>(__dp4a(w.q0, x.q0, __dp4a(w.q1, x.q1, 0)));
  }
};

// Q4_K / Q5_K: a super-block of 256 is 8 sub-blocks of 32 with 6-bit scales and mins; qs chunk j (32 bytes)
// holds sub-blocks 2j (low nibbles) and 2j+1 (high). Unit u (0..7 in a super-block): j = u/2, bytes 16t ..
// 16t+15 (t = u%2) of the chunk: elements 16t .. 16t+15 of both sub-blocks, half of each, in one 16-byte load
// (the super-blocks of a row starting at 16 bytes stay 16-byte aligned: 144 and 176 bytes), and one decoding
// of the pair's scales for 32 weights.
struct XK {
  int4 lo, hi;  // x's integers for those elements of sub-blocks 2j and 2j+1
  float2 ds0, ds1;
};
__device__ __forceinline__ XK load_xk(int64_t u, const XRow& x) {
  const int64_t sb = u / 8;
  const int j = static_cast<int>(u % 8) / 2, t = static_cast<int>(u % 2);
  const int4* q = reinterpret_cast<const int4*>(x.qs + 64 * sb + 16 * j + 4 * t);
  const float4 ds = __ldg(reinterpret_cast<const float4*>(x.ds + 8 * sb + 2 * j));
  return {__ldg(q), __ldg(q + 2), make_float2(ds.x, ds.y), make_float2(ds.z, ds.w)};
}
struct WK {
  uint4 lo, hi;          // the 4-bit (Q5_K: 5-bit) values of the unit's elements of sub-blocks 2j, 2j+1
  float d0, m0, d1, m1;  // d * scale and dmin * min of sub-blocks 2j and 2j+1
};
// The scales of sub-blocks 2j and 2j+1 from the super-block header (d, dmin, 12 packed bytes).
template <int A>
__device__ __forceinline__ void k_pair_scales(const uint8_t* b, int j, WK& w) {
  const uint32_t dd = ld_u32<A>(b);
  const uint32_t s0 = ld_u32<align_at(A, 4)>(b + 4), s1 = ld_u32<align_at(A, 8)>(b + 8),
                 s2 = ld_u32<align_at(A, 4)>(b + 12);
  const float d = f16_bits_to_f32(dd & 0xFFFF), dmin = f16_bits_to_f32(dd >> 16);
  float sc[2], mn[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int s = 2 * j + h;
    uint32_t scale, min;
    if (s < 4) {
      scale = byte12(s0, s1, s2, s) & 63;
      min = byte12(s0, s1, s2, s + 4) & 63;
    } else {
      const uint32_t packed = byte12(s0, s1, s2, s + 4);
      scale = (packed & 0x0F) | ((byte12(s0, s1, s2, s - 4) >> 6) << 4);
      min = (packed >> 4) | ((byte12(s0, s1, s2, s) >> 6) << 4);
    }
    sc[h] = d * static_cast<float>(scale);
    mn[h] = dmin * static_cast<float>(min);
  }
  w.d0 = sc[0], w.m0 = mn[0], w.d1 = sc[1], w.m1 = mn[1];
}
__device__ __forceinline__ int dp4a4(uint4 w, int4 x) {
  return __dp4a(static_cast<int>(w.x), x.x,
                __dp4a(static_cast<int>(w.y), x.y,
                       __dp4a(static_cast<int>(w.z), x.z, __dp4a(static_cast<int>(w.w), x.w, 0))));
}
__device__ __forceinline__ float dot_k(const WK& w, const XK& x) {
  const int s0 = dp4a4(w.lo, x.lo), s1 = dp4a4(w.hi, x.hi);
  // Each unit covers half of both sub-blocks: half of their mins' terms. Rounded operation by operation
  // (no contraction left to the compiler), so every kernel that inlines this gets the same bits.
  const float mins = __fmaf_rn(w.m0, x.ds0.y, __fmul_rn(w.m1, x.ds1.y));
  return __fmaf_rn(__fmul_rn(w.d0, x.ds0.x), static_cast<float>(s0),
                   __fmaf_rn(__fmul_rn(w.d1, x.ds1.x), static_cast<float>(s1), __fmul_rn(-0.5f, mins)));
}
__device__ __forceinline__ uint4 nibbles_lo(uint4 v) {
  return make_uint4(v.x & 0x0F0F0F0Fu, v.y & 0x0F0F0F0Fu, v.z & 0x0F0F0F0Fu, v.w & 0x0F0F0F0Fu);
}
__device__ __forceinline__ uint4 nibbles_hi(uint4 v) {
  return nibbles_lo(make_uint4(v.x >> 4, v.y >> 4, v.z >> 4, v.w >> 4));
}
// Bit s of each byte of h, as bit 4.
__device__ __forceinline__ uint4 fifth_bits(uint4 h, int s) {
  return make_uint4(((h.x >> s) & 0x01010101u) << 4, ((h.y >> s) & 0x01010101u) << 4,
                    ((h.z >> s) & 0x01010101u) << 4, ((h.w >> s) & 0x01010101u) << 4);
}
__device__ __forceinline__ uint4 or4(uint4 a, uint4 b) {
  return make_uint4(a.x | b.x, a.y | b.y, a.z | b.z, a.w | b.w);
}

// Q4_K and Q5_K: unit u of a row is half t = u % 2 of the pair of sub-blocks j = (u % 8) / 2 of super-block
// u / 8; Self::quants reads its values, k_pair_scales its scales.
template <class Self>
struct Q8KPair {
  static constexpr int kUnit = 32;
  using W = WK;
  using X = XK;
  template <int A>
  __device__ static W load(const uint8_t* row, int64_t u) {
    const uint8_t* b = row + (u / 8) * Self::kBytes;
    const int j = static_cast<int>(u % 8) / 2, t = static_cast<int>(u % 2);
    W w;
    Self::template quants<A>(b, j, t, w);
    k_pair_scales<A>(b, j, w);
    return w;
  }
  __device__ static X load_x(int64_t u, const XRow& x) { return load_xk(u, x); }
  __device__ static float dot(const W& w, const X& x) { return dot_k(w, x); }
};

template <>
struct Q8<DType::q4_k> : Q8KPair<Q8<DType::q4_k>> {  // d:2 dmin:2 scales:12 qs:128
  static constexpr int kBytes = 144;
  // The quants of the unit (j, t) of super-block b.
  template <int A>
  __device__ static void quants(const uint8_t* b, int j, int t, WK& w) {
    const uint4 v = ld_u128<align_at(A, 16)>(b + 16 + 32 * j + 16 * t);
    w.lo = nibbles_lo(v), w.hi = nibbles_hi(v);
  }
};

// d:2 dmin:2 scales:12 qh:32 qs:128; bit s of qh[l]: the fifth bit of element l of sub-block s.
template <>
struct Q8<DType::q5_k> : Q8KPair<Q8<DType::q5_k>> {
  static constexpr int kBytes = 176;
  template <int A>
  __device__ static void quants(const uint8_t* b, int j, int t, WK& w) {
    const uint4 v = ld_u128<align_at(A, 16)>(b + 48 + 32 * j + 16 * t);
    const uint4 h = ld_u128<align_at(A, 16)>(b + 16 + 16 * t);
    w.lo = or4(nibbles_lo(v), fifth_bits(h, 2 * j));
    w.hi = or4(nibbles_hi(v), fifth_bits(h, 2 * j + 1));
  }
};

// Q6_K (matmul/dequant.cuh's Quant<q6_k> gives the layout, in the file's form and grouped): w = d * scale *
// (q - 32). Unit u (0..15 of a super-block): half h = u / 8 (128 elements), l = 4t .. 4t+3 (t = u % 8) of
// each of its four runs of 32 (g = 0..3): three 32-bit words of quants (ql 64h + 4t, ql 64h + 32 + 4t, qh 32h
// + 4t) and four scales (sub-blocks 8h + 2g + t / 4).
template <>
struct Q8<DType::q6_k> {
  static constexpr int kUnit = 16;
  struct W {
    int q[4];    // q - 32 as int8, for g = 0..3
    float d[4];  // d * scale
  };
  struct X {
    int q[4];
    float d[4];
  };
  static constexpr int kBytes = 210;
  // The quants (q - 32) of the unit (h, t) of the super-block b.
  template <int A>
  __device__ static void quants(const Q6kBlock& b, int h, int t, W& w) {
    constexpr int Q = q6k_qs_align<A>();
    const uint32_t a = ld_u32<Q>(b.qs + q6k_ql<A>(h, 0) + 4 * t),
                   c = ld_u32<Q>(b.qs + q6k_ql<A>(h, 1) + 4 * t);
    const uint32_t hb = ld_u32<Q>(b.qs + 128 + 32 * h + 4 * t);
    const uint32_t q[4] = {
        (a & 0x0F0F0F0Fu) | ((hb << 4) & 0x30303030u), (c & 0x0F0F0F0Fu) | ((hb << 2) & 0x30303030u),
        ((a >> 4) & 0x0F0F0F0Fu) | (hb & 0x30303030u), ((c >> 4) & 0x0F0F0F0Fu) | ((hb >> 2) & 0x30303030u)};
    // q - 32 per byte without borrows: q + 0x60 stays below 0x100, and flipping bit 7 subtracts 0x80.
#pragma unroll
    for (int g = 0; g < 4; ++g) w.q[g] = static_cast<int>((q[g] + 0x60606060u) ^ 0x80808080u);
  }
  template <int A>
  __device__ static W load(const uint8_t* row, int64_t u) {
    const Q6kBlock b = q6k_block<A>(row, u / 16);
    const int h = static_cast<int>(u % 16) / 8, t = static_cast<int>(u % 8);
    W w;
    quants<A>(b, h, t, w);
    const uint2 scales = ld_u64<q6k_scales_align<A>()>(b.scales + 8 * h);  // sub-blocks 8h .. 8h+7
    const float d = f16_bits_to_f32(ld_u16<q6k_d_align<A>()>(b.d));
#pragma unroll
    for (int g = 0; g < 4; ++g)
      w.d[g] = d * static_cast<float>(static_cast<int8_t>(byte_of(scales, 2 * g + t / 4)));
    return w;
  }
  __device__ static X load_x(int64_t u, const XRow& x) {
    const int64_t sb = u / 16;
    const int h = static_cast<int>(u % 16) / 8, t = static_cast<int>(u % 8);
    X v;
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      v.q[g] = __ldg(x.qs + 64 * sb + 32 * h + 8 * g + t);
      v.d[g] = __ldg(x.ds + 8 * sb + 4 * h + g).x;
    }
    return v;
  }
  __device__ static float dot(const W& w, const X& x) {
    float s = 0.0f;
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      s = __fmaf_rn(__fmul_rn(w.d[g], x.d[g]), static_cast<float>(__dp4a(w.q[g], x.q[g], 0)), s);
    }
    return s;
  }
};

// Rows in grouped form (legacy_block, matmul/dequant.cuh): unit u is block u, whole (q8_0: half of it). Its
// 16 quant bytes are one 16-byte load and its header one more load, against a 4-byte load (two 2-byte ones at
// the blocks' 2-byte alignment) of quants and a header load per quarter block in the file's form. The dot
// products round operation by operation (no contraction left to the compiler), so that the GEMV that reads
// rows directly and the one that stages them (matmul/gemv_staged.cu) get the same bits.
template <DType T>
struct Q8G;

// x's integers for elements 0..15 and 16..31 of block u.
struct XB {
  int4 lo, hi;
  float2 ds;
};
__device__ __forceinline__ XB load_xb(int64_t u, const XRow& x) {
  const int4* q = reinterpret_cast<const int4*>(x.qs + 8 * u);
  return {__ldg(q), __ldg(q + 1), __ldg(x.ds + u)};
}
// The 4-bit values of a block's 16 quant bytes with their fifth bits from qh (bit j: element j): elements
// 0..15 (low nibbles) and 16..31 (high).
__device__ __forceinline__ void five_bits16(uint4 v, uint32_t qh, uint4& lo, uint4& hi) {
  lo = or4(nibbles_lo(v), make_uint4(bits_to_bit4(qh), bits_to_bit4(qh >> 4), bits_to_bit4(qh >> 8),
                                     bits_to_bit4(qh >> 12)));
  hi = or4(nibbles_hi(v), make_uint4(bits_to_bit4(qh >> 16), bits_to_bit4(qh >> 20), bits_to_bit4(qh >> 24),
                                     bits_to_bit4(qh >> 28)));
}

template <>
struct Q8G<DType::q4_0> {
  static constexpr int kUnit = 32;
  struct W {
    uint4 q;
    float d;
  };
  using X = XB;
  template <int A>
  __device__ static W load(const uint8_t* row, int64_t u) {
    const LegacyBlock b = legacy_block<2, 16, A>(row, u);
    return {ld_u128<qs_align<A, 2>()>(b.qs), f16_bits_to_f32(ld_u16<head_align<A, 2>()>(b.head))};
  }
  __device__ static X load_x(int64_t u, const XRow& x) { return load_xb(u, x); }
  __device__ static float dot(const W& w, const X& x) {
    const int s = dp4a4(nibbles_lo(w.q), x.lo) + dp4a4(nibbles_hi(w.q), x.hi);
    return __fmul_rn(w.d, __fmaf_rn(x.ds.x, static_cast<float>(s), __fmul_rn(-8.0f, x.ds.y)));
  }
};

template <>
struct Q8G<DType::q4_1> {
  static constexpr int kUnit = 32;
  struct W {
    uint4 q;
    float d, m;
  };
  using X = XB;
  template <int A>
  __device__ static W load(const uint8_t* row, int64_t u) {
    const LegacyBlock b = legacy_block<4, 16, A>(row, u);
    const uint32_t dm = ld_u32<head_align<A, 4>()>(b.head);
    return {ld_u128<qs_align<A, 4>()>(b.qs), f16_bits_to_f32(dm & 0xFFFF), f16_bits_to_f32(dm >> 16)};
  }
  __device__ static X load_x(int64_t u, const XRow& x) { return load_xb(u, x); }
  __device__ static float dot(const W& w, const X& x) {
    const int s = dp4a4(nibbles_lo(w.q), x.lo) + dp4a4(nibbles_hi(w.q), x.hi);
    return __fmaf_rn(__fmul_rn(w.d, x.ds.x), static_cast<float>(s), __fmul_rn(w.m, x.ds.y));
  }
};

template <>
struct Q8G<DType::q5_0> {
  static constexpr int kUnit = 32;
  struct W {
    uint4 lo, hi;
    float d;
  };
  using X = XB;
  template <int A>
  __device__ static W load(const uint8_t* row, int64_t u) {
    const LegacyBlock b = legacy_block<6, 16, A>(row, u);
    constexpr int H = head_align<A, 6>();
    W w;
    five_bits16(ld_u128<qs_align<A, 6>()>(b.qs), ld_u32<align_at(H, 2)>(b.head + 2), w.lo, w.hi);
    w.d = f16_bits_to_f32(ld_u16<H>(b.head));
    return w;
  }
  __device__ static X load_x(int64_t u, const XRow& x) { return load_xb(u, x); }
  __device__ static float dot(const W& w, const X& x) {
    const int s = dp4a4(w.lo, x.lo) + dp4a4(w.hi, x.hi);
    return __fmul_rn(w.d, __fmaf_rn(x.ds.x, static_cast<float>(s), __fmul_rn(-16.0f, x.ds.y)));
  }
};

template <>
struct Q8G<DType::q5_1> {
  static constexpr int kUnit = 32;
  struct W {
    uint4 lo, hi;
    float d, m;
  };
  using X = XB;
  template <int A>
  __device__ static W load(const uint8_t* row, int64_t u) {
    const LegacyBlock b = legacy_block<8, 16, A>(row, u);
    const uint2 head = ld_u64<head_align<A, 8>()>(b.head);
    W w;
    five_bits16(ld_u128<qs_align<A, 8>()>(b.qs), head.y, w.lo, w.hi);
    w.d = f16_bits_to_f32(head.x & 0xFFFF);
    w.m = f16_bits_to_f32(head.x >> 16);
    return w;
  }
  __device__ static X load_x(int64_t u, const XRow& x) { return load_xb(u, x); }
  __device__ static float dot(const W& w, const X& x) {
    const int s = dp4a4(w.lo, x.lo) + dp4a4(w.hi, x.hi);
    return __fmaf_rn(__fmul_rn(w.d, x.ds.x), static_cast<float>(s), __fmul_rn(w.m, x.ds.y));
  }
};

// q8_0: unit u is half h = u % 2 of block u / 2, 16 quant bytes, so that consecutive threads read consecutive
// 16-byte chunks of a group's quants (a whole block a thread leaves every other chunk to a second load).
template <>
struct Q8G<DType::q8_0> {
  static constexpr int kUnit = 16;
  struct W {
    uint4 q;
    float d;
  };
  struct X {
    int4 q;
    float d;
  };
  template <int A>
  __device__ static W load(const uint8_t* row, int64_t u) {
    const LegacyBlock b = legacy_block<2, 32, A>(row, u / 2);
    return {ld_u128<qs_align<A, 2>()>(b.qs + 16 * (u % 2)),
            f16_bits_to_f32(ld_u16<head_align<A, 2>()>(b.head))};
  }
  __device__ static X load_x(int64_t u, const XRow& x) {
    return {__ldg(reinterpret_cast<const int4*>(x.qs + 4 * u)), __ldg(x.ds + u / 2).x};
  }
  __device__ static float dot(const W& w, const X& x) {
    return __fmul_rn(__fmul_rn(w.d, x.d), static_cast<float>(dp4a4(w.q, x.q)));
  }
};

// Q6_K's units are the same in either form (q6k_block finds their bytes).
template <>
struct Q8G<DType::q6_k> : Q8<DType::q6_k> {};

// The unit structure of a row read with alignment A: grouped form or the file's.
template <DType T, int A>
using Q8At = std::conditional_t<(A & kGrouped) != 0, Q8G<T>, Q8<T>>;

// The weight types with an integer path; each needs `integer` 1 in its entry of the list of GEMV instances
// (gemv_kernel.cuh), and is a staged type (kStagedType: gemv_staged.cu instantiates its staged GEMV).
#define KILN_CUDA_Q8_TYPES(X) X(q4_0) X(q4_1) X(q5_0) X(q5_1) X(q8_0) X(q4_k) X(q5_k) X(q6_k)

}  // namespace kiln::cuda
