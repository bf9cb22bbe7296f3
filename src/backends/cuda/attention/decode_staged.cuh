// Internal to the decode attention kernels (attention_decode.cu): the staged kernel's geometry a head dim and
// staged type (Staged: f16 and f32 rows in 16-byte copies, 8-bit rows as they lie in the pool), and the reads
// of its staged rows.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "backends/cuda/attention/kv_pool.cuh"

namespace kiln::cuda {

inline constexpr int kDecodeGroup = 8;  // query heads a decode block, at most

template <int D, class KV>
struct Staged {
  static constexpr int kVec = 16 / static_cast<int>(sizeof(KV));  // elements a 16-byte vector
  static constexpr int kRowVecs = D / kVec;                       // vectors a row
  static constexpr int kRowBytes = D * static_cast<int>(sizeof(KV)) + 16;
  static constexpr int kStage = D * sizeof(KV) <= 256 ? 64 : D * sizeof(KV) <= 512 ? 32 : 16;  // positions
  static constexpr int kMinChunk = 4 * kStage;  // the fewest positions a chunk (attention_decode)
  // Threads a block: 16 warps for rows of up to 256 bytes, whose states fit the 128 registers a thread that
  // allows; 8 beyond.
  static constexpr int kThreads = D * sizeof(KV) <= 256 ? 512 : 256;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kHeadsAWarp = (kDecodeGroup + kWarps - 1) / kWarps;  // step B's heads a warp, at most
  static constexpr int kTpp = kThreads / kStage;                            // threads a position's scores
  static constexpr int kSliceVecs = kRowVecs / kTpp;            // vectors of a row a thread scores
  static constexpr int kCopies = kStage * kRowVecs / kThreads;  // copies a thread a stage, of K and of V
  static constexpr int kPg = 2 * kThreads / D;                  // position groups of step C
  static constexpr size_t kKvBytes = size_t{4} * kStage * kRowBytes;  // 2 stages of K and V
  static size_t shared_bytes(int g) {
    return kKvBytes +
           sizeof(float) * (size_t(g) * D + size_t(kTpp) * g * kStage + size_t(g) * kStage + 3 * g);
  }
  static_assert(kRowVecs % kTpp == 0 && (kStage * kRowVecs) % kThreads == 0 && kThreads % kRowVecs == 0);
  // The position groups' sums meet, at the end, in the stages' buffers.
  static_assert(sizeof(float) * (kPg - 1) * kDecodeGroup * D <= kKvBytes);
};

// 8-bit rows (KvQ8B<B>) staged as they lie in the pool: head_dim / B blocks of B + 2 bytes, whole 4-byte
// words when head_dim is D and that is a multiple of 64 (q8_0) or of 128 (q8_64) (staged_raw), copied 4 bytes
// a copy, a stage's copies spread evenly over the threads. Step A takes a slice of kSlice values of one block
// (q . codes, then times the block's scale), step C a pair of codes with their block's scale.
template <int D, int B>
struct Staged<D, KvQ8B<B>> {
  static constexpr int kPoolRowBytes = D / B * static_cast<int>(sizeof(KvQ8B<B>));
  static constexpr int kRowVecs = kPoolRowBytes / 4;  // copies a row
  // An odd number of words a staged row: step A's 32 positions a warp hit 32 distinct banks.
  static constexpr int kRowBytes = kRowVecs % 2 == 1 ? kPoolRowBytes : kPoolRowBytes + 4;
  // Stages of 128 positions up to 128 dims (17 KB of K and V, about f16's 64 positions): the kernel waits on
  // its stages' copies and barriers, not on bytes, so each stage carries as many bytes as f16's. Chunks of
  // 256 positions at least, as f16's.
  static constexpr int kStage = D <= 128 ? 128 : 32;
  static constexpr int kMinChunk = D <= 128 ? 256 : 4 * kStage;
  static constexpr int kThreads = D <= 128 ? 512 : 256;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kHeadsAWarp = (kDecodeGroup + kWarps - 1) / kWarps;
  static constexpr int kTpp = kThreads / kStage;
  static constexpr int kSlice = D / kTpp;  // values of a row a thread scores
  static constexpr int kCopies = (kStage * kRowVecs + kThreads - 1) / kThreads;
  static constexpr int kPg = 2 * kThreads / D;
  static constexpr size_t kKvBytes =
      std::max(size_t{4} * kStage * kRowBytes, sizeof(float) * (kPg - 1) * kDecodeGroup * D);
  // As the other types' (the stages, q, the scores, the softmax state), and the pool rows of two stages
  // (attention_staged_kernel's stage_rows).
  static size_t shared_bytes(int g) {
    return kKvBytes +
           sizeof(float) * (size_t(g) * D + size_t(kTpp) * g * kStage + size_t(g) * kStage + 3 * g) +
           sizeof(uint32_t) * 2 * kStage;
  }
  static_assert(kPoolRowBytes % 4 == 0 && kSlice % 8 == 0 && B % kSlice == 0 && kThreads % (D / 2) == 0);
};

// The two 8-bit codes of a 16-bit word, in f32, exactly and with no integer-to-float conversion: each code +
// 128 becomes the mantissa of a float of exponent 23 (2^23 + code + 128), from which 2^23 + 128 is taken.
__device__ inline float2 q8_pair(uint32_t w) {
  const uint32_t u = w ^ 0x8080u;
  return make_float2(__uint_as_float(__byte_perm(u, 0x4B000000u, 0x7540)) - 8388736.0f,
                     __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7541)) - 8388736.0f);
}
// Values d, d + 1 (d even) of a staged row of KvQ8B<B> blocks, in f32: the same products as kv_value's.
template <int B>
__device__ inline float2 q8_staged_pair(const unsigned char* row, int d) {
  const unsigned char* b = row + (d / B) * sizeof(KvQ8B<B>);
  const float scale = __half2float(*reinterpret_cast<const __half*>(b));
  const float2 c = q8_pair(*reinterpret_cast<const uint16_t*>(b + 2 + d % B));
  return make_float2(scale * c.x, scale * c.y);
}

__device__ inline void unpack(const unsigned char* p, float (&out)[8]) {  // 8 f16
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(h[i]);
    out[2 * i] = f.x, out[2 * i + 1] = f.y;
  }
}
__device__ inline void unpack(const unsigned char* p, float (&out)[4]) {  // 4 f32
  const float4 f = *reinterpret_cast<const float4*>(p);
  out[0] = f.x, out[1] = f.y, out[2] = f.z, out[3] = f.w;
}
__device__ inline float2 load_pair(const unsigned char* p, __half) {
  return __half22float2(*reinterpret_cast<const __half2*>(p));
}
__device__ inline float2 load_pair(const unsigned char* p, float) {
  return *reinterpret_cast<const float2*>(p);
}

}  // namespace kiln::cuda
