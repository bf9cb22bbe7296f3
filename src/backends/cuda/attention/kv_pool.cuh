// The K/V pools as the attention kernels read them (attention/attention.cu, attention_prefill.cu,
// attention_decode.cu; norm_rope/rope.cu's KV write writes the 8-bit blocks as KvQ8B too): pools of f32, f16,
// q8_0 or q8_64, [head_dim, n_kv, block_size, n_blocks], whose row (slot, KV head) is row slot * n_kv + kvh.
// A kernel takes the pool's element type KV (float, __half, KvQ8 for q8_0 or KvQ8x64 for q8_64), finds a row
// with kv_row and reads its values with kv_value (8-bit blocks: or kv_load_run, several at a time), so that
// one kernel body serves them all; the prefill kernels' shared-memory chunks of 8-bit pools are kv_q8_chunk's
// and kv_q8_half_rows'.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/cuda_common.cuh"

namespace kiln::cuda {

// A block of an 8-bit pool's row: B values (q8_0: 32, q8_64: 64), value i = code i * the f16 scale, as
// core/quant's reference quantizer writes it (norm_rope/rope.cu's kv_write: the same bits). A row is
// head_dim / B of them, B + 2 bytes each, so rows and blocks are only 2-byte aligned.
template <int B>
struct KvQ8B {
  uint16_t d;    // f16 scale
  int8_t qs[B];  // codes, in element order
};
using KvQ8 = KvQ8B<32>;     // q8_0
using KvQ8x64 = KvQ8B<64>;  // q8_64
static_assert(sizeof(KvQ8) == 34 && alignof(KvQ8) == 2 && sizeof(KvQ8x64) == 66 && alignof(KvQ8x64) == 2);

// Whether a pool's element type KV is an 8-bit block, and the values an element holds (B; 1 for the float
// types).
template <class KV>
inline constexpr bool kKvQ8 = false;
template <int B>
inline constexpr bool kKvQ8<KvQ8B<B>> = true;
template <class KV>
inline constexpr int kKvBlock = 1;
template <int B>
inline constexpr int kKvBlock<KvQ8B<B>> = B;

// Row slot * n_kv + kvh of a pool.
template <class KV>
__device__ inline const KV* kv_row(const KV* pool, int64_t slot, int64_t kvh, int64_t n_kv,
                                   int64_t head_dim) {
  const int64_t elems = head_dim / kKvBlock<KV>;  // pool elements a row
  return pool + (slot * n_kv + kvh) * elems;
}

// Value d of a row, in f32 (exact: an 8-bit block's value is an 8-bit code times an f16, 19 bits at most).
__device__ inline float kv_value(const float* row, int64_t d) { return row[d]; }
__device__ inline float kv_value(const __half* row, int64_t d) { return __half2float(row[d]); }
template <int B>
__device__ inline float kv_value(const KvQ8B<B>* row, int64_t d) {
  const KvQ8B<B>& b = row[d / B];  // d >= 0, B a power of two: its block and code by shift and mask
  return __half2float(__ushort_as_half(b.d)) * static_cast<float>(b.qs[d % B]);
}

// Values d .. d + N - 1 of an 8-bit row (N 4 or 8, d a multiple of N: they share a block), as loaded: the
// block's scale and the codes, four a word (code i in byte i % 4 of q[i / 4]). The codes are 2-byte aligned
// (a row starts at an even byte, a block's codes 2 bytes into it, d is even), so they take 2-byte loads.
// Zero-initialised, the values are zeros.
template <int N>
struct KvQ8Run {
  uint32_t d;  // f16 scale
  uint32_t q[N / 4];
};
template <int N, int B>
__device__ inline KvQ8Run<N> kv_load_run(const KvQ8B<B>* row, int64_t d) {
  const KvQ8B<B>& b = row[d / B];
  const auto* q = reinterpret_cast<const uint16_t*>(b.qs + d % B);
  KvQ8Run<N> x;
  x.d = b.d;
#pragma unroll
  for (int i = 0; i < N / 4; ++i) x.q[i] = uint32_t{q[2 * i]} | uint32_t{q[2 * i + 1]} << 16;
  return x;
}
// Value i (0 .. N - 1) of such a load, in f32 (exact, as kv_value).
template <int N>
__device__ inline float kv_run_value(const KvQ8Run<N>& x, int i) {
  const auto code = static_cast<int8_t>(x.q[i / 4] >> (8 * (i % 4)));
  return __half2float(__ushort_as_half(static_cast<uint16_t>(x.d))) * static_cast<float>(code);
}

// The warp's B values (element 32 * i + lane in x[i] of that lane) as one 8-bit block at *b, bit for bit as
// the reference quantizer writes them (core/quant/quant_legacy.cpp's quantize_row_q8, which the CPU backend's
// KV write calls; norm_rope/rope.cu's KV write and the rotating GEMV's stores, matmul/gemv.cuh), every step
// of its arithmetic in the same order and rounding:
//   amax: its fold amax = amax > |x| ? amax : |x| from 0 in element order, so that a NaN element is kept only
//     until the next replaces it: the maximum of the elements after the last NaN, NaN if the last is one;
//   d = amax / 127 and id = d != 0 ? 1 / d : 0, in f32 (the scale stored is d rounded to f16, the codes use
//     the unrounded id);
//   q = (int8_t) roundf(x * id) as x86 converts: a truncation to int32 (INT32_MIN for NaN or out of range),
//     then its low byte (a d too small for its 1 / d reaches it).
// Where d is NaN (the last element NaN, every code 0), the f16 scale keeps the NaN x86 makes: that element's
// magnitude, quieted, its top payload bits.
template <int B>
__device__ inline void put_q8(const float (&x)[B / 32], KvQ8B<B>* b, int lane) {
  constexpr int kN = B / 32;
  int last_nan = -1;
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    const unsigned nan = __ballot_sync(0xffffffffu, x[i] != x[i]);
    if (nan != 0) last_nan = 32 * i + 31 - __clz(nan);
  }
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    if (32 * i + lane > last_nan) amax = fmaxf(amax, fabsf(x[i]));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (last_nan == B - 1) amax = __uint_as_float(0x7fc00000u);
  const float d = __fdiv_rn(amax, 127.0f);
  const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    const float r = roundf(__fmul_rn(x[i], id));
    const int32_t t = r >= -2147483648.0f && r < 2147483648.0f ? static_cast<int32_t>(r) : INT32_MIN;
    b->qs[32 * i + lane] = static_cast<int8_t>(t);
  }
  const unsigned last = __shfl_sync(0xffffffffu, __float_as_uint(x[kN - 1]), 31);
  if (lane == 0) {
    b->d = last_nan == B - 1 ? static_cast<uint16_t>(0x7e00u | ((last >> 13) & 0x3ffu))
                             : __half_as_ushort(__float2half_rn(d));
  }
}

// A value to f16 for the tensor cores, saturated: a pool value past f16's range (an f32 pool's, or a q8_0
// code times a large scale) becomes its largest, not an infinity.
__device__ __forceinline__ __half to_half_sat(float v) {
  return __float2half_rn(fminf(fmaxf(v, -65504.0f), 65504.0f));
}

// The exact prefill kernel's chunk of an 8-bit pool (attention.cu's load_chunk): rows p0 .. p0 + n - 1 of a
// sequence (table: its block table; rows of blocks given back, < 0, are skipped) of KV head kvh into shared
// memory as f32 (chunk[j * head_dim + d]), 8 values of a block a load.
template <int B>
__device__ inline void kv_q8_chunk(float* chunk, const KvQ8B<B>* pool, const int32_t* table, int32_t p0,
                                   int32_t n, int64_t kvh, int64_t n_kv, int64_t head_dim,
                                   int64_t block_size) {
  const int64_t vecs = head_dim / 8;
  for (int64_t e = threadIdx.x; e < int64_t{n} * vecs; e += blockDim.x) {
    const DivMod jd = divmod(e, vecs);
    const int64_t j = jd.q, d = jd.r * 8, p = p0 + j;
    const DivMod pb = divmod(p, block_size);
    const int32_t blk = table[pb.q];
    if (blk < 0) continue;
    const KvQ8Run<8> x =
        kv_load_run<8>(kv_row(pool, int64_t{blk} * block_size + pb.r, kvh, n_kv, head_dim), d);
#pragma unroll
    for (int i = 0; i < 8; ++i) chunk[j * head_dim + d + i] = kv_run_value(x, i);
  }
}

// The tensor-core prefill kernel's rows of an 8-bit pool (attention_prefill.cu's load_chunk): rows j0, j0 +
// kStep,
// ... (kIters of them; slots[j]: row j's pool slot, or -1) of KV head kvh, values d .. d + 7 of each (a
// block's), to f16 (to_half_sat) at out + i * kStep * ld, zeros for slot -1 and where `on` is false (dims
// past head_dim); every load of a batch of rows before its first store.
template <int kIters, int kStep, int B>
__device__ inline void kv_q8_half_rows(__half* out, int ld, const KvQ8B<B>* pool, const int32_t* slots,
                                       int j0, int64_t d, bool on, int64_t kvh, int64_t n_kv,
                                       int64_t head_dim) {
  constexpr int kBatch = kIters < 4 ? kIters : 4;  // rows in flight a thread
#pragma unroll
  for (int i0 = 0; i0 < kIters; i0 += kBatch) {
    KvQ8Run<8> x[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      x[i] = KvQ8Run<8>{};
      const int32_t slot = slots[j0 + (i0 + i) * kStep];
      if (slot >= 0 && on) x[i] = kv_load_run<8>(kv_row(pool, int64_t{slot}, kvh, n_kv, head_dim), d);
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      uint32_t w[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const __half2 h = __halves2half2(to_half_sat(kv_run_value(x[i], 2 * c)),
                                         to_half_sat(kv_run_value(x[i], 2 * c + 1)));
        w[c] = *reinterpret_cast<const uint32_t*>(&h);
      }
      *reinterpret_cast<uint4*>(out + (i0 + i) * kStep * ld) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

}  // namespace kiln::cuda
