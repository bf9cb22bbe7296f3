// What the GEMV kernels share (matmul/matmul.cu: the kernel that reads weights straight from global memory;
// matmul/gemv_staged.cu: the integer one whose weight rows go through shared memory): the launch's arguments,
// the split of a launch's blocks between the matrices on one x, and the block's final sums.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "backends/cuda/attention/kv_pool.cuh"
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_launch.cuh"
#include "backends/cuda/cuda_rowmath.cuh"
#include "backends/cuda/norm_rope/rope.cuh"
#include "core/dtype.h"

namespace kiln::cuda {

inline constexpr int kGemvThreads = 128;  // threads per block, splitting k

// An i32 [ne0, ne1] index tensor on the device.
struct Ids {
  const char* data;
  int64_t ne0, nb0, nb1;
  __device__ int32_t operator[](int64_t i) const {
    const DivMod d = divmod(i, ne0);
    return *reinterpret_cast<const int32_t*>(data + d.r * nb0 + d.q * nb1);
  }
};

__device__ __forceinline__ void store_float(char* row, DType type, int64_t j, float v) {
  if (type == DType::f32)
    reinterpret_cast<float*>(row)[j] = v;
  else if (type == DType::f16)
    reinterpret_cast<__half*>(row)[j] = __float2half_rn(v);
  else
    reinterpret_cast<__nv_bfloat16*>(row)[j] = __float2bfloat16_rn(v);
}

// One more weight matrix of a multi-matrix GEMV (matmul_gemv_group): same x, type and k as the first.
struct GemvPart {
  const uint8_t* w;
  int64_t w_nb1;
  int64_t n;
  Rows dst;
};
inline constexpr int kGemvMaxParts = 3;

// Gate and up computed together (on): a block's first kRows / 2 rows are rows i .. of the first matrix (the
// gate) and the rest the same rows of the second (up), and the block also stores act(gate) * up, the gated
// activation of the two results, as its own kernel computes it (cuda_rowmath.cuh), into f32 rows `out`.
struct GemvPair {
  bool on;
  ops::GluKind kind;
  Rows out;
};

// Q, K and V computed together (on: the launch's three parts, f32 results, columns the step's tokens), with
// RoPE of q and k and the KV write of k and v done as the blocks store them (matmul_gemv_rope_group): a
// block's rows are whole pairs of dims (normal layout, every dim of a head rotated), rotated in place with
// the cos/sin of the token's position (the frequencies made on the host, RopeFreqs, passed beside the
// arguments, or else on the device from p and the frequency factors), and the rows of k and v also go to the
// pools at the token's slot (pools: [head_dim, n_kv, block_size, n_blocks], f32 or f16; or 8-bit blocks,
// a head row at a time, by the block whose rows complete it).
struct GemvRope {
  bool on;
  ops::RopeParams p;
  const float* factors;      // [n_rot / 2] or null
  const int32_t* positions;  // [tokens]
  const int32_t* slots;      // [tokens]
  void* k_pool;
  void* v_pool;
  bool k16, v16;  // the pools hold f16 (else f32)
  // 8-bit pools (q8_0, q8_64: KvQ8B<q8_block>; 0: float pools): a head row of k or v goes to its pool once
  // every block of its rows has stored them, by the block that stores the last (q8_rows: the rows stored
  // a token, KV head and k/v, [tokens][n_kv][2], zero before the launch and left zero).
  int q8_block;
  unsigned* q8_rows;
  int head_dim;
  int n_kv;
  // The part of Q, K and V that the launch's first part is (0; 2: a launch of V alone, whose weight has
  // another type than Q and K's).
  int first_part;
};

// Columns q = group * m + c, c < m, of one GEMV launch (group = blockIdx.y, grid-strided).
struct GemvArgs {
  const uint8_t* w;      // [k, n] or, with ids, [k, n, n_expert]
  int64_t w_nb1, w_nb2;  // bytes between rows, between experts
  int64_t n, k;
  int m;  // columns per group: 1 .. kGemvMaxCols
  int64_t n_groups;
  int64_t n_cols;  // columns in all: the last group may have fewer than m
  // Column groups side by side along grid.x (block x = row block * col_split + group % col_split), so that
  // the groups of a row block run together and read its weight rows once from memory; the rest along grid.y.
  int col_split;
  bool use_ids;  // MoE: column q uses expert ids[q] (m == 1); else expert 0
  Ids ids;
  int64_t x_div;       // column q reads x row q / x_div
  Rows x;              // f32 rows of k
  bool x_vec;          // every x row is 16-byte aligned
  bool prefetch;       // programmatic launch: the first bytes of the weight rows head for L2 before the wait
  bool early_trigger;  // pdl_trigger right after the wait, not after the main loop (gemv_early_trigger)
  bool staged;         // integer path: the weight rows go through shared memory (matmul/gemv_staged.cu)
  // x rounded to 8 bits (the integer path, matmul/dot_q8.cuh): x row i is qs + i * k / 4 and ds + i * k / 32.
  const int* xq;
  const float2* xds;
  Rows dst;  // rows of n
  DType dst_type;
  // Further matrices on the same x (n_parts - 1 of them): row blocks from part_start[i] on are part i's.
  int n_parts;
  GemvPart more[kGemvMaxParts - 1];
  unsigned part_start[kGemvMaxParts];
  // Gate and up (the first matrix and more[0]) paired in each block, f32 results (the exact GEMV).
  GemvPair pair;
  // Weights of the matmuls after this one that the blocks send toward L2 as they finish (prefetch_ahead).
  L2Ahead ahead;
  GemvRope rope;
};

// What a GEMV's stores do with RoPE (a template argument of the kernels, kRope): nothing; rotate and write
// the float pools (f16, f32); rotate and write 8-bit pools a head row at a time (GemvRope::q8_block), whose
// count and quantization take registers the float pools' instances should not pay for.
inline constexpr int kNoRope = 0, kRopeFloat = 1, kRopeQ8 = 2;
// The frequencies of a GEMV that rotates (kRope: GemvRope), a kernel argument of its own; nothing else.
struct NoRope {};
template <int kRope>
using RopeArg = std::conditional_t<kRope != kNoRope, RopeFreqs, NoRope>;

// Block `block` of `blocks`' share of `ahead`: its bytes split evenly over the blocks in 16-byte units, a
// 128-byte line a thread sent toward L2.
__device__ __forceinline__ void prefetch_ahead(const L2Ahead& ahead, unsigned block, unsigned blocks) {
  const int64_t units = (ahead.bytes[0] + ahead.bytes[1] + ahead.bytes[2]) / 16;
  const int64_t lo = units * block / blocks, hi = units * (block + 1) / blocks;
  int64_t base = 0;
#pragma unroll
  for (int r = 0; r < 3; ++r) {
    const int64_t n = ahead.bytes[r] / 16, from = max(lo, base), to = min(hi, base + n);
    const auto* p = static_cast<const uint8_t*>(ahead.p[r]) + (from - base) * 16;
    for (int64_t u = threadIdx.x * 8; u < to - from; u += int64_t{blockDim.x} * 8) prefetch_l2(p + u * 16);
    base += n;
  }
}

// The matrix that row block `block` of the launch belongs to; `block` becomes the block's index in it, and
// `index` the part's (0: the first matrix).
__device__ __forceinline__ GemvPart gemv_part(const GemvArgs& a, unsigned& block, int& index) {
  GemvPart part{a.w, a.w_nb1, a.n, a.dst};
  unsigned first = 0;
  index = 0;
  for (int i = 1; i < a.n_parts; ++i) {
    if (block >= a.part_start[i]) part = a.more[i - 1], first = a.part_start[i], index = i;
  }
  block -= first;
  return part;
}

// Where a rotating GEMV's block stores (GemvRope): its part of Q, K and V (0: q, 1: k, 2: v; the launch's
// part index plus GemvRope::first_part) and the cos/sin of the pair of the warp-0 lane's row and column, when
// it was made ahead (before the wait for the kernel before: the positions are step metadata, which no kernel
// writes).
struct RopeAt {
  int part = 0;
  float2 cs{};
  bool ready = false;
};

// The frequency of pair `pair` made on the device (frequency factors): a call of its own, so that its double
// arithmetic does not take registers from the GEMV around it.
__device__ __noinline__ inline ops::RopeFreq gemv_rope_freq(ops::RopeParams p, const float* factors,
                                                            int pair) {
  return ops::rope_freq(p, pair, factors != nullptr ? factors[pair] : 1.0f);
}

// The cos/sin of the pair of row `i` of a q or k part at column q (token q's position).
__device__ __forceinline__ float2 gemv_rope_cs(const GemvRope& g, const RopeFreqs& f, int64_t i, int64_t q) {
  const int pair = static_cast<int>(i % g.head_dim) / 2;
  return rope_cs(f.on ? f.f[pair] : gemv_rope_freq(g.p, g.factors, pair), g.positions[q]);
}

// RopeAt of a block's first rows row0 .. of the launch's part `part` and columns q0 .. (cols of them): the
// warp-0 lane that will store row row0 + lane / kCols, column q0 + lane % kCols makes its cos/sin now.
template <int kRows, int kCols>
__device__ __forceinline__ RopeAt gemv_rope_ahead(const GemvArgs& a, const RopeFreqs& f, int part,
                                                  int64_t row0, int64_t n, int64_t q0, int cols) {
  part += a.rope.first_part;
  RopeAt at{part};
  const int lane = static_cast<int>(threadIdx.x), r = lane / kCols, c = lane % kCols;
  if (part < 2 && lane < kRows * kCols && c < cols && row0 + r < n) {
    at.cs = gemv_rope_cs(a.rope, f, row0 + r, q0 + c);
    at.ready = true;
  }
  return at;
}

// Step kStep (lane offset 16 >> kStep) of gemv_store's warp sum over v's values (kValues of them at the
// start); templated so that every index into v is a constant (an unrolled loop with a run-time bound put v on
// the stack).
template <int kStep, int kValues>
__device__ __forceinline__ void butterfly(float (&v)[kValues], int lane, int& at) {
  if constexpr (kStep < 5) {
    constexpr int o = 16 >> kStep, half = (kValues >> kStep) / 2;
    if constexpr (half > 0) {
      const bool upper = (lane & o) != 0;
#pragma unroll
      for (int i = 0; i < half; ++i) {
        const float send = upper ? v[i] : v[i + half], keep = upper ? v[i + half] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
      }
      if (upper) at += half;
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], o);
    }
    butterfly<kStep + 1>(v, lane, at);
  }
}

// A head row of k or v into an 8-bit pool of blocks of B values: `src`, the row as every block stored it in
// the part's f32 destination (read from L2, past the fences of the blocks that stored it), a warp a block,
// put_q8's bits, into `dst`, the row's blocks at the token's slot.
template <int B>
__device__ __forceinline__ void gemv_q8_head(const float* src, void* dst, int head_dim, int lane) {
  auto* out = static_cast<KvQ8B<B>*>(dst);
  for (int b = 0; b < head_dim / B; ++b) {
    float x[B / 32];
#pragma unroll
    for (int i = 0; i < B / 32; ++i) x[i] = __ldcg(src + b * B + 32 * i + lane);
    put_q8<B>(x, out + b, lane);
  }
}

// The 8-bit pools' part of a rotating GEMV's stores, past the lanes' own (`on`: this lane stored an element
// of the head row at `src`, whose blocks go to `dst` and whose stored rows `count` counts): each stored row
// counts towards its head row (a lane's stores, then a fence, then its count: a row counted is visible to the
// last), and the warp quantizes every head row a lane of it completed (gemv_q8_head). A call of its own, of
// scalars only (a struct by reference would be copied to the stack from the kernel's parameters), so that
// the GEMV around it keeps its registers.
inline __device__ __noinline__ void gemv_q8_count(const float* src, void* dst, unsigned* count, int head_dim,
                                                  int q8_block, bool on, int lane) {
  bool last = false;
  if (on) {
    __threadfence();
    last = atomicAdd(count, 1u) == static_cast<unsigned>(head_dim) - 1;
    if (last) *count = 0;  // every row of it has counted: zero for the next launch
  }
  unsigned lasts = __ballot_sync(0xffffffffu, last);
  if (lasts == 0) return;
  __threadfence();
  while (lasts != 0) {
    const int from = __ffs(lasts) - 1;
    lasts &= lasts - 1;
    const auto* row = reinterpret_cast<const float*>(
        __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(src), from));
    auto* out =
        reinterpret_cast<void*>(__shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(dst), from));
    if (q8_block == 64) {
      gemv_q8_head<64>(row, out, head_dim, lane);
    } else {
      gemv_q8_head<32>(row, out, head_dim, lane);
    }
  }
}

// The block's sums of its threads' partial products acc[r][c] (rows row0 + r, columns q0 + c < q0 + cols),
// stored into the part's destination. Each warp sums its lanes by butterfly: at each step a lane keeps half
// of the values and adds its partner's half, so kRows x kCols sums take 2 * values - 1 shuffles instead of 5
// each. Every value's additions pair the same lanes in the same order as warp_sum's (a + b = b + a in
// IEEE arithmetic), so the bits are warp_sum's. Then the warps' sums meet in shared memory in warp order.
// Ends with `red` written and read: a later call must follow a __syncthreads(). kPair (pair.on): the block's
// rows are kRows / 2 rows of `part` (the gate) from row0 and the same rows of `up`, and each of the first
// kRows / 2 x kCols threads stores a gate value, its up value and their activation. kRope (GemvRope; kRows
// even, row0 a multiple of kRows): a thread a value (warp 0's lanes up to 32 values) sums it, the threads of
// a pair's two rows swap their sums, and each stores its element of the rotated pair (q, k) or its value (v),
// and k's and v's also to the float pools, or, to 8-bit pools, the warp whose stores complete a head row
// quantizes it (gemv_q8_head). gemv_store sums each warp's values into `red`, then gemv_store_sums (which a
// kernel whose warps wrote `red` themselves, the FP8 tensor-core GEMV, calls alone) does the rest.
template <int kRows, int kCols, bool kPair = false, int kRope = kNoRope>
__device__ __forceinline__ void gemv_store_sums(float (&red)[kGemvThreads / 32][kRows][kCols],
                                                const GemvPart& part, DType dst_type, int64_t row0,
                                                int64_t q0, int cols, const GemvPair& pair,
                                                const GemvPart& up, const GemvRope& rope = {},
                                                const RopeArg<kRope>& freqs = {}, const RopeAt& rope_at = {});
template <int kRows, int kCols, bool kPair = false, int kRope = kNoRope>
__device__ __forceinline__ void gemv_store(float (&acc)[kRows][kCols],
                                           float (&red)[kGemvThreads / 32][kRows][kCols],
                                           const GemvPart& part, DType dst_type, int64_t row0, int64_t q0,
                                           int cols, const GemvPair& pair, const GemvPart& up,
                                           const GemvRope& rope = {}, const RopeArg<kRope>& freqs = {},
                                           const RopeAt& rope_at = {}) {
  constexpr int kValues = kRows * kCols;
  static_assert(kValues <= 32 && (kValues & (kValues - 1)) == 0,
                "a power of two of values, at most a lane each");
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float v[kValues];
#pragma unroll
  for (int i = 0; i < kValues; ++i) v[i] = acc[i / kCols][i % kCols];
  int at = 0;  // the value this lane holds in v[0] at the end
  butterfly<0>(v, lane, at);
  if (lane % (32 / kValues) == 0) red[warp][at / kCols][at % kCols] = v[0];
  gemv_store_sums<kRows, kCols, kPair, kRope>(red, part, dst_type, row0, q0, cols, pair, up, rope, freqs,
                                              rope_at);
}

template <int kRows, int kCols, bool kPair, int kRope>
__device__ __forceinline__ void gemv_store_sums(float (&red)[kGemvThreads / 32][kRows][kCols],
                                                const GemvPart& part, DType dst_type, int64_t row0,
                                                int64_t q0, int cols, const GemvPair& pair,
                                                const GemvPart& up, const GemvRope& rope,
                                                const RopeArg<kRope>& freqs, const RopeAt& rope_at) {
  constexpr int kValues = kRows * kCols;
  static_assert(kValues <= kGemvThreads, "at most a thread a value");
  const int lane = threadIdx.x % 32;
  __syncthreads();
  if constexpr (kPair) {
    constexpr int kHalf = kRows / 2;
    if (threadIdx.x < kHalf * kCols) {
      const int r = threadIdx.x / kCols, c = threadIdx.x % kCols;
      if (c < cols && row0 + r < part.n) {
        float g = 0.0f, u = 0.0f;
#pragma unroll
        for (int i = 0; i < kGemvThreads / 32; ++i) g += red[i][r][c], u += red[i][r + kHalf][c];
        reinterpret_cast<float*>(part.dst.row(q0 + c))[row0 + r] = g;
        reinterpret_cast<float*>(up.dst.row(q0 + c))[row0 + r] = u;
        pair.out.row_as<float>(q0 + c)[row0 + r] = glu_times(pair.kind, g, u);
      }
    }
    return;
  }
  if constexpr (kRope != kNoRope) {
    static_assert(kRows % 2 == 0, "whole pairs of rows");
    // Value v = threadIdx.x, in the warps that hold one (warp 0 alone up to 32 values); row r ^ 1's value
    // is v ^ kCols, in the same warp.
    if (threadIdx.x >= (kValues + 31) / 32 * 32) return;
    const int v = static_cast<int>(threadIdx.x), r = (v / kCols) % kRows, c = v % kCols;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < kGemvThreads / 32; ++i) s += red[i][r][c];
    const float other = __shfl_xor_sync(0xffffffffu, s, kCols);  // row r ^ 1's
    const bool on = v < kValues && c < cols && row0 + r < part.n;
    const int64_t i = row0 + r, q = q0 + c;
    float y = s;
    if (on && rope_at.part < 2) {
      const float2 cs = rope_at.ready ? rope_at.cs : gemv_rope_cs(rope, freqs, i, q);
      const bool even = r % 2 == 0;
      const float2 yy = rope_rotate(even ? s : other, even ? other : s, cs);
      y = even ? yy.x : yy.y;
    }
    if (on) reinterpret_cast<float*>(part.dst.row(q))[i] = y;
    if (rope_at.part == 0) return;
    const int h = static_cast<int>(i / rope.head_dim);
    if constexpr (kRope == kRopeFloat) {
      if (!on) return;
      const int d = static_cast<int>(i) - h * rope.head_dim;
      const int64_t at = (int64_t{rope.slots[q]} * rope.n_kv + h) * rope.head_dim + d;
      const bool k = rope_at.part == 1;
      void* pool = k ? rope.k_pool : rope.v_pool;
      if (k ? rope.k16 : rope.v16)
        static_cast<__half*>(pool)[at] = __float2half_rn(y);
      else
        static_cast<float*>(pool)[at] = y;
    } else {
      const int kv = rope_at.part - 1;                                       // 0: k, 1: v
      const int64_t head = on ? int64_t{rope.slots[q]} * rope.n_kv + h : 0;  // q past the batch: not read
      const int64_t block_bytes = rope.q8_block == 64 ? sizeof(KvQ8B<64>) : sizeof(KvQ8B<32>);
      auto* pool = static_cast<char*>(kv == 0 ? rope.k_pool : rope.v_pool);
      gemv_q8_count(reinterpret_cast<const float*>(part.dst.row(q)) + int64_t{h} * rope.head_dim,
                    pool + head * (rope.head_dim / rope.q8_block) * block_bytes,
                    rope.q8_rows + (q * rope.n_kv + h) * 2 + kv, rope.head_dim, rope.q8_block, on, lane);
    }
    return;
  }
  if (threadIdx.x < kValues) {
    const int r = threadIdx.x / kCols, c = threadIdx.x % kCols;
    if (c < cols && row0 + r < part.n) {
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < kGemvThreads / 32; ++i) s += red[i][r][c];
      store_float(part.dst.row(q0 + c), dst_type, row0 + r, s);
    }
  }
}

// How the GEMV reads the weight's blocks: at their natural alignment (Quant<T>::kAlign), byte-safe, or in
// grouped form (rows 16-byte aligned).
enum class Access : uint8_t { natural, safe, grouped };

// The types whose integer GEMV reads its weights through shared memory where the rows allow (the K-quants'
// rows 16-byte aligned and whole 16-byte chunks; the legacy types' in grouped form): docs/cuda.md has the
// measurements.
template <DType T>
inline constexpr bool kStagedType =
    T == DType::q4_k || T == DType::q5_k || T == DType::q6_k || T == DType::q4_0 || T == DType::q4_1 ||
    T == DType::q5_0 || T == DType::q5_1 || T == DType::q8_0;

// Which GEMVs rotate (GemvRope): the exact one of float weights at their natural alignment and of FP8 ones
// (f8_e4m3, in row form too), and the integer one of the staged types, staged or in grouped form; the
// others are launched without (matmul/matmul.cu's launch_gemv decides).
template <DType T, bool kQ8>
inline constexpr bool kRopeGemv =
    kQ8 ? kStagedType<T> : T == DType::bf16 || T == DType::f16 || T == DType::f32 || T == DType::f8_e4m3;

// The GEMV of `a` (1 to kGemvMaxCols columns) with weight type T: exact (f32 x) or integer (kQ8: x rounded to
// 8 bits), kPair: gate and up paired with their activation (a.pair); with RoPE and the KV write (a.rope.on,
// its frequencies `rope`) where kRopeGemv and the access allow. Defined in gemv_kernel.cuh and instantiated
// from its list of instances, a part in each gemv_*.cu.
template <DType T, bool kQ8, bool kPair = false>
void launch_gemv_rows(const Context& ctx, const GemvArgs& a, Access access, const RopeFreqs* rope = nullptr);

// The staged integer GEMV (matmul/gemv_staged.cu) of kStagedType weights: row_blocks blocks of kRows rows
// (over all parts) times a.n_groups column groups of kCols.
template <DType T, int kCols, int kRows>
void launch_gemv_staged(const Context& ctx, const GemvArgs& a, int64_t row_blocks, const RopeFreqs* rope);

}  // namespace kiln::cuda
