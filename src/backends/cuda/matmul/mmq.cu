// The integer tensor-core matmul ("MMQ") of K-quant weights with x rounded to 8 bits per block of 32
// (quantize_x()'s rounding, dot_q8.cuh, copied once into tiles of 8 tokens: XTile): the batches of a batched
// decode, where the integer GEMV reads each weight row once but spends a __dp4a and a scaling per weight and
// token.
//
// A warp owns 16 weight rows. It copies one super-block (256 elements) of each of them into shared memory
// with cp.async, two super-blocks in flight while it multiplies the one before, and multiplies it with every
// token of the batch on the tensor cores: mma.sync m16n8k32 (unsigned 4- or 5-bit weights times signed x)
// for a sub-block of 32 with one scale, two m16n8k16 (signed 6-bit weights) for Q6_K's two sub-blocks of 16.
// The int32 products of a sub-block are scaled into f32 accumulators (d_w * d_x * dot, less the minimum's
// m_w * d_x * sum(q_x)), as the GEMV scales its units.
//
// The sum over k is exact in int32 within a sub-block, so the order of a sub-block's elements is free: a
// thread of the mma holds x words (4c, 16 + 4c) of token g and weight words (4c, 16 + 4c) of rows g, g + 8,
// and for the 4- and 5-bit types those are mapped to elements 8c .. 8c + 7 of the sub-block: one 8-byte load
// of the weight's nibbles and one of x (Q6_K's natural order: its low bits and high bits of element l are in
// different arrays).
//
// A block has 4 warps: 4 / k_split row tiles of 16 rows, each split over k_split warps that take every
// k_split-th super-block, summed in warp order at the end; k_split is chosen from the weight's shape alone
// (k_split_for), so a token's sums are the same operations in the same order whatever the batch: alone or
// among others, the same bits.
#include <algorithm>
#include <cstdlib>

#include "backends/cuda/cuda_launch.cuh"
#include "backends/cuda/matmul/dequant.cuh"
#include "backends/cuda/matmul/dot_q8.cuh"
#include "backends/cuda/matmul/mmq.cuh"

namespace kiln::cuda {

namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kStages = 3;  // super-blocks of a warp's rows in shared memory: one in use, two in flight
constexpr int kTileRows = 16;

// Bytes of a super-block, and of its slot in shared memory: the copy is whole 16-byte chunks from the chunk
// the super-block starts in (Q6_K's 210-byte super-blocks start 2-byte aligned), and slots 32 or 96 bytes
// past a multiple of 128 put the 8-byte loads of rows g = 0..3 (a half-warp) in different banks.
template <DType T>
struct MmqType;
template <>
struct MmqType<DType::q4_k> {
  static constexpr int kBytes = 144, kSlot = 160;
};
template <>
struct MmqType<DType::q5_k> {
  static constexpr int kBytes = 176, kSlot = 224;
};
template <>
struct MmqType<DType::q6_k> {
  static constexpr int kBytes = 210, kSlot = 224;
};

// c += a b: a 16 x 32 tile of unsigned 8-bit integers, b 32 x 8 of signed ones.
__device__ __forceinline__ void mma_u8s8_k32(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// c += a b: a 16 x 16 tile of signed 8-bit integers (rows g and g + 8: a0, a1), b 16 x 8.
__device__ __forceinline__ void mma_s8s8_k16(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(b));
}

// x in tiles of 8 tokens (mmq_tile_x): sub-block s (32 elements) of tile T is 8 x 32 quants, token t's at
// 32t, at byte (T * k / 32 + s) * 256, and its 8 {d, d * sum(q)} at float2 (T * k / 32 + s) * 8. A warp's
// loads of one sub-block's B fragment read 256 consecutive bytes, those of its C columns' scales 64.
struct XTile {
  const uint8_t* q;  // sub-block s of the warp's token tile nt: q + (nt * n_sub + s) * 256
  const float2* ds;  //                                          ds + (nt * n_sub + s) * 8
  int64_t n_sub;     // k / 32
};

// Q4_K / Q5_K: super-block sb of rows r0 (g) and r1 (g + 8), in shared memory, times the batch. Sub-block
// pair j (qs bytes 32j .. 32j + 31: sub-block 2j in the low nibbles, 2j + 1 in the high ones); the thread's
// elements 8c .. 8c + 7 of a sub-block are qs bytes 32j + 8c .. 32j + 8c + 7 (Q5_K: their fifth bits, bits
// 2j and 2j + 1 of qh bytes 8c .. 8c + 7).
template <DType T, int NT>
__device__ __forceinline__ void super_k(const uint8_t* r0, const uint8_t* r1, const XTile& x, int64_t sb,
                                        int g, int c, float (&acc)[NT][4]) {
  constexpr int kQs = T == DType::q5_k ? 48 : 16;
  constexpr uint32_t m4 = 0x0F0F0F0Fu;
  uint2 h0{}, h1{};
  if constexpr (T == DType::q5_k) {
    h0 = *reinterpret_cast<const uint2*>(r0 + 16 + 8 * c);
    h1 = *reinterpret_cast<const uint2*>(r1 + 16 + 8 * c);
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint2 v0 = *reinterpret_cast<const uint2*>(r0 + kQs + 32 * j + 8 * c);
    const uint2 v1 = *reinterpret_cast<const uint2*>(r1 + kQs + 32 * j + 8 * c);
    uint32_t lo[4] = {v0.x & m4, v1.x & m4, v0.y & m4, v1.y & m4};
    uint32_t hi[4] = {(v0.x >> 4) & m4, (v1.x >> 4) & m4, (v0.y >> 4) & m4, (v1.y >> 4) & m4};
    if constexpr (T == DType::q5_k) {
      const uint32_t h[4] = {h0.x, h1.x, h0.y, h1.y};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        lo[i] |= ((h[i] >> (2 * j)) & 0x01010101u) << 4;
        hi[i] |= ((h[i] >> (2 * j + 1)) & 0x01010101u) << 4;
      }
    }
    WK s0, s1;  // d * scale and dmin * min of sub-blocks 2j, 2j + 1: row g, row g + 8
    k_pair_scales<16 | kInShared>(r0, j, s0);
    k_pair_scales<16 | kInShared>(r1, j, s1);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int64_t s0i = nt * x.n_sub + 8 * sb + 2 * j;  // sub-blocks 2j (s0i) and 2j + 1 of the tile
      const uint8_t* xr = x.q + s0i * 256 + 32 * g + 8 * c;
      const uint2 bl = __ldg(reinterpret_cast<const uint2*>(xr));
      const uint2 bh = __ldg(reinterpret_cast<const uint2*>(xr + 256));
      int cl[4] = {0, 0, 0, 0}, ch[4] = {0, 0, 0, 0};
      mma_u8s8_k32(cl, lo, bl.x, bl.y);
      mma_u8s8_k32(ch, hi, bh.x, bh.y);
      // {d, d * sum(q)} of tokens 2c and 2c + 1: of sub-block 2j (el), of 2j + 1 (eh)
      const float4 el = __ldg(reinterpret_cast<const float4*>(x.ds + s0i * 8 + 2 * c));
      const float4 eh = __ldg(reinterpret_cast<const float4*>(x.ds + (s0i + 1) * 8 + 2 * c));
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const WK& w = i < 2 ? s0 : s1;
        const bool odd = i % 2 != 0;
        float v = acc[nt][i];
        v = __fmaf_rn(__fmul_rn(w.d0, odd ? el.z : el.x), static_cast<float>(cl[i]), v);
        v = __fmaf_rn(-w.m0, odd ? el.w : el.y, v);
        v = __fmaf_rn(__fmul_rn(w.d1, odd ? eh.z : eh.x), static_cast<float>(ch[i]), v);
        acc[nt][i] = __fmaf_rn(-w.m1, odd ? eh.w : eh.y, v);
      }
    }
  }
}

// The signed 6-bit values (q - 32, as bytes) of Q6_K elements 128h + 32q + 16l + 4c .. + 3 of a super-block
// whose quants are at b (matmul/dequant.cuh's Quant<q6_k> describes the layout; A: its form and alignment).
template <int A>
__device__ __forceinline__ uint32_t q6_word(const uint8_t* b, int h, int q, int l, int c) {
  const uint32_t ql = ld_u32<A>(b + q6k_ql<A>(h, q % 2) + 16 * l + 4 * c);
  const uint32_t qh = ld_u32<A>(b + 128 + 32 * h + 16 * l + 4 * c);
  const uint32_t v = ((q < 2 ? ql : ql >> 4) & 0x0F0F0F0Fu) | (((qh >> (2 * q)) & 0x03030303u) << 4);
  return (v + 0x60606060u) ^ 0x80808080u;  // q - 32 per byte without borrows
}

// A Q6_K super-block's d and its 16 scales (signed bytes, little-endian in sc).
struct Q6Head {
  float d;
  uint4 sc;
};
// The head from a slot of the file form: the scales at 192, d at 208 (A: their alignment, in shared memory).
template <int A>
__device__ __forceinline__ Q6Head q6_head_slot(const uint8_t* r) {
  return {f16_bits_to_f32(ld_u16<A>(r + 208)),
          make_uint4(ld_u32<A>(r + 192), ld_u32<A>(r + 196), ld_u32<A>(r + 200), ld_u32<A>(r + 204))};
}
// The head of super-block sb of a row in grouped form (q6k_block), from global memory: a run's scales and d
// share a line, so a warp's next super-blocks find them in L1.
__device__ __forceinline__ Q6Head q6_head_grouped(const uint8_t* row, int64_t sb) {
  const Q6kAt at = q6k_at<kGrouped>(sb);
  return {f16_bits_to_f32(__ldg(reinterpret_cast<const unsigned short*>(row + at.d))),
          __ldg(reinterpret_cast<const uint4*>(row + at.scales))};
}
// Scale j (0-15) of a head, times its d.
__device__ __forceinline__ float q6_scale(const Q6Head& h, int j) {
  const uint32_t w = j < 4 ? h.sc.x : j < 8 ? h.sc.y : j < 12 ? h.sc.z : h.sc.w;
  return __fmul_rn(h.d, static_cast<float>(static_cast<int8_t>((w >> (8 * (j % 4))) & 0xFF)));
}

// Q6_K: super-block sb of rows r0 (g) and r1 (g + 8) times the batch, a block of 32 (4h + q) at a time as
// two sub-blocks of 16 (l = 0, 1), one scale each. r0, r1: the quants (192 bytes, in a slot); h0, h1: the
// rows' heads.
template <int NT, int A>
__device__ __forceinline__ void super_q6(const uint8_t* r0, const uint8_t* r1, const Q6Head& h0,
                                         const Q6Head& h1, const XTile& x, int64_t sb, int g, int c,
                                         float (&acc)[NT][4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int blk = 4 * h + q;
      uint32_t w0[2], w1[2];
      float s0[2], s1[2];
#pragma unroll
      for (int l = 0; l < 2; ++l) {
        w0[l] = q6_word<A>(r0, h, q, l, c);
        w1[l] = q6_word<A>(r1, h, q, l, c);
        s0[l] = q6_scale(h0, 8 * h + 2 * q + l);
        s1[l] = q6_scale(h1, 8 * h + 2 * q + l);
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int64_t si = nt * x.n_sub + 8 * sb + blk;
        const uint8_t* xr = x.q + si * 256 + 32 * g + 4 * c;
        const auto bl = static_cast<uint32_t>(__ldg(reinterpret_cast<const int*>(xr)));
        const auto bh = static_cast<uint32_t>(__ldg(reinterpret_cast<const int*>(xr + 16)));
        int cl[4] = {0, 0, 0, 0}, ch[4] = {0, 0, 0, 0};
        mma_s8s8_k16(cl, w0[0], w1[0], bl);
        mma_s8s8_k16(ch, w0[1], w1[1], bh);
        const float4 e = __ldg(reinterpret_cast<const float4*>(x.ds + si * 8 + 2 * c));
        const float dx[2] = {e.x, e.z};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float* s = i < 2 ? s0 : s1;
          float v = acc[nt][i];
          v = __fmaf_rn(__fmul_rn(s[0], dx[i % 2]), static_cast<float>(cl[i]), v);
          acc[nt][i] = __fmaf_rn(__fmul_rn(s[1], dx[i % 2]), static_cast<float>(ch[i]), v);
        }
      }
    }
  }
}

// dst[:, t] = W x_t for the 8 * NT tokens of blockIdx.y and the 16 * (kWarps / k_split) rows of blockIdx.x.
// kGrouped6: Q6_K rows in grouped form (q6k_block): a super-block's quants are copied into the slot as 12
// chunks, and its scales and d are read from global memory (a run's share a line: L1 hits) before the wait
// for the slot. Copying them too, as 2 chunks from two other places of the run, the 64-token kernel waited
// twice as long on its x loads (docs/cuda.md). Both heads stay in registers: 168 a thread at 64 tokens, three
// blocks a multiprocessor, as blocks_per_sm() (the file form's kernel) assumes.
template <DType T, int NT, bool kGrouped6 = false>
__global__ void __launch_bounds__(kThreads) mmq_kernel(MmqArgs a, Store store_to, int k_split) {
  static_assert(!kGrouped6 || T == DType::q6_k, "Q6_K's grouped form");
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int kBytes = MmqType<T>::kBytes, kSlot = MmqType<T>::kSlot;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
  const int tiles = kWarps / k_split, rt = warp % tiles, kp = warp / tiles;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * tiles + rt) * kTileRows;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * 8 * NT;
  const int m = static_cast<int>(min(static_cast<int64_t>(8 * NT), a.m - t0));
  const int64_t n_sb = a.k / 256;
  const int64_t count = n_sb > kp ? (n_sb - 1 - kp) / k_split + 1 : 0;
  uint8_t* stage = smem + warp * (kStages * kTileRows * kSlot);

  // Super-block kp + it * k_split of the warp's rows into stage slot it % kStages (the rows past n repeat
  // the last one); one commit group per call, empty past the end, so that the waits below count uniformly.
  auto issue = [&](int64_t it) {
    if (it < count) {
      const int64_t sb = kp + it * k_split;
      uint8_t* dst = stage + (it % kStages) * kTileRows * kSlot;
      if constexpr (kGrouped6) {
        const int64_t qs = q6k_at<kGrouped>(sb).qs;
        for (int i = lane; i < kTileRows * 12; i += 32) {
          const int r = i / 12, ch = i - r * 12;
          cp_async16(dst + r * kSlot + 16 * ch, a.w + min(row0 + r, a.n - 1) * a.w_nb1 + qs + 16 * ch);
        }
      } else {
        const int64_t start = sb * kBytes, first = start & ~int64_t{15};
        const int chunks = static_cast<int>((start - first + kBytes + 15) / 16);
        for (int i = lane; i < kTileRows * chunks; i += 32) {
          const int r = i / chunks, ch = i - r * chunks;
          cp_async16(dst + r * kSlot + 16 * ch, a.w + min(row0 + r, a.n - 1) * a.w_nb1 + first + 16 * ch);
        }
      }
    }
    cp_async_commit();
  };
  // Weights are constant: their first copies start before the wait for the kernel that wrote x.
  issue(0);
  issue(1);
  pdl_wait();
  const XTile x{reinterpret_cast<const uint8_t*>(a.xq) + t0 * a.k, a.xds + t0 * (a.k / 32), a.k / 32};
  float acc[NT][4] = {};
  for (int64_t it = 0; it < count; ++it) {
    issue(it + 2);
    const int64_t sb = kp + it * k_split;
    Q6Head head0{}, head1{};  // grouped Q6_K: the heads of rows g and g + 8
    if constexpr (kGrouped6) {
      head0 = q6_head_grouped(a.w + min(row0 + g, a.n - 1) * a.w_nb1, sb);
      head1 = q6_head_grouped(a.w + min(row0 + g + 8, a.n - 1) * a.w_nb1, sb);
    }
    cp_async_wait<kStages - 1>();
    __syncwarp();
    if constexpr (kGrouped6) {
      const uint8_t* buf = stage + (it % kStages) * kTileRows * kSlot;
      super_q6<NT, 16 | kGrouped | kInShared>(buf + g * kSlot, buf + (g + 8) * kSlot, head0, head1, x, sb, g,
                                              c, acc);
    } else if constexpr (T == DType::q6_k) {
      const uint8_t* buf = stage + (it % kStages) * kTileRows * kSlot + ((sb * kBytes) & 15);
      const uint8_t *s0 = buf + g * kSlot, *s1 = buf + (g + 8) * kSlot;
      super_q6<NT, 2 | kInShared>(s0, s1, q6_head_slot<2 | kInShared>(s0), q6_head_slot<2 | kInShared>(s1), x,
                                  sb, g, c, acc);
    } else {
      const uint8_t* buf = stage + (it % kStages) * kTileRows * kSlot + ((sb * kBytes) & 15);
      super_k<T, NT>(buf + g * kSlot, buf + (g + 8) * kSlot, x, sb, g, c, acc);
    }
    __syncwarp();  // the slot is copied into again two iterations on
  }
  cp_async_wait<0>();
  pdl_trigger();
  __syncthreads();  // the stages become the k-split warps' partial sums
  auto* red = reinterpret_cast<float*>(smem);
  if (kp > 0) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) red[((warp * NT + nt) * 4 + i) * 32 + lane] = acc[nt][i];
    }
  }
  __syncthreads();
  if (kp > 0) return;
  for (int p = 1; p < k_split; ++p) {
    const int w = warp + p * tiles;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i)
        acc[nt][i] = __fadd_rn(acc[nt][i], red[((w * NT + nt) * 4 + i) * 32 + lane]);
    }
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t row = row0 + g + (i < 2 ? 0 : 8);
      const int col = 8 * nt + 2 * c + i % 2;
      if (row < a.n && col < m) store(store_to, a.dst.row(t0 + col), row, acc[nt][i]);
    }
  }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The token tiles a block of a batch of m takes (NT): 2, 4 or 8.
int tiles_a_block(int64_t m) { return m <= 16 ? 2 : m <= 32 ? 4 : 8; }

// x in quantize_x's layout (token t's quants at xq + t * k, its scales at xds + t * k / 32) into tiles of 8
// tokens (XTile); the tokens past m, up to a whole block's tiles, are copies of the last token. One thread a
// token's sub-block.
__global__ void tile_x_kernel(const uint8_t* xq, const float2* xds, int64_t k, int64_t m, int64_t total,
                              uint8_t* q, float2* ds) {
  pdl_begin();
  const int64_t n_sub = k / 32;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i % 8, rest = i / 8, s = rest % n_sub, tile = rest / n_sub;
    const int64_t tok = min(8 * tile + t, m - 1);
    const auto* from = reinterpret_cast<const uint4*>(xq + tok * k + 32 * s);
    auto* to = reinterpret_cast<uint4*>(q + i * 32);
    to[0] = __ldg(from);
    to[1] = __ldg(from + 1);
    ds[i] = __ldg(xds + tok * n_sub + s);
  }
}

// Shared memory of a block: kStages super-blocks of each warp's 16 rows.
template <DType T>
constexpr size_t smem_bytes() {
  return size_t{kWarps} * kStages * kTileRows * MmqType<T>::kSlot;
}

// Blocks of the 64-token kernel (the most registers) a multiprocessor holds, once per type: the k split is
// chosen for it whatever the batch, so that a token's sums never depend on its batch.
template <DType T>
int64_t blocks_per_sm() {
  static const int64_t blocks = [] {
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, mmq_kernel<T, 8>, kThreads, smem_bytes<T>()) !=
        cudaSuccess) {
      cudaGetLastError();
      b = 2;
    }
    return std::max(b, 1);
  }();
  return blocks;
}

// The k split (warps a row tile's k is split over: 1, 2 or 4) from the weight's shape alone: blocks run in
// rounds of blocks_per_sm() * n_sms, each block's time 1 / k_split of an unsplit one's, so the split that
// takes the fewest rounds / k_split, the smaller on a tie. The 8B's 14336-row matrices at 3 blocks a
// multiprocessor: 224 blocks in 1 round, 448 in 2 (the last with 52), 896 in 3 of a quarter the length: 4.
template <DType T>
int k_split_for(const Context& ctx, int64_t n, int64_t k) {
  const int64_t slots = blocks_per_sm<T>() * std::max(ctx.n_sms, 1);
  int best = 1;
  double best_cost = 0.0;
  for (int ks = 1; ks <= kWarps && ks <= k / 256; ks *= 2) {
    const int64_t blocks = ceil_div(n, kTileRows * (kWarps / ks));
    const double cost = static_cast<double>(ceil_div(blocks, slots)) / ks;
    if (best_cost == 0.0 || cost < best_cost) best = ks, best_cost = cost;
  }
  return best;
}

template <DType T, int NT>
cudaError_t launch(const Context& ctx, const MmqArgs& a) {
  const int k_split = k_split_for<T>(ctx, a.n, a.k);
  const dim3 grid(static_cast<unsigned>(ceil_div(a.n, kTileRows * (kWarps / k_split))),
                  static_cast<unsigned>(ceil_div(a.m, 8 * NT)));
  static_assert(smem_bytes<T>() <= 48 * 1024, "the default dynamic shared memory limit");
  static_assert(smem_bytes<T>() >= size_t{kWarps} * 8 * 4 * 32 * sizeof(float),
                "room for the k-split partial sums");
  if constexpr (T == DType::q6_k) {
    if (a.grouped) {
      return launch_kernel(ctx, mmq_kernel<T, NT, true>, grid, kThreads, smem_bytes<T>(), a,
                           store_of(a.dst_type), k_split);
    }
  }
  if (a.grouped) return cudaErrorNotSupported;
  return launch_kernel(ctx, mmq_kernel<T, NT>, grid, kThreads, smem_bytes<T>(), a, store_of(a.dst_type),
                       k_split);
}

template <DType T>
cudaError_t launch_type(const Context& ctx, const MmqArgs& a) {
  switch (tiles_a_block(a.m)) {
    case 2: return launch<T, 2>(ctx, a);
    case 4: return launch<T, 4>(ctx, a);
    default: return launch<T, 8>(ctx, a);
  }
}

int super_bytes(DType type) {
  switch (type) {
    case DType::q4_k: return MmqType<DType::q4_k>::kBytes;
    case DType::q5_k: return MmqType<DType::q5_k>::kBytes;
    case DType::q6_k: return MmqType<DType::q6_k>::kBytes;
    default: return 0;
  }
}

}  // namespace

bool mmq_type(DType type) { return super_bytes(type) != 0; }

bool mmq_rows_fit(DType type, const void* data, int64_t nb1, int64_t k, bool grouped) {
  return mmq_type(type) && (!grouped || type == DType::q6_k) && reinterpret_cast<uintptr_t>(data) % 16 == 0 &&
         nb1 % 16 == 0 && k % 256 == 0 && (grouped || (k / 256 * super_bytes(type)) % 16 == 0);
}

cudaError_t mmq_tile_x(const Context& ctx, MmqArgs& a, int slot) {
  // Whole blocks' tiles: a block reads its NT tiles whatever the tokens left.
  const int64_t block_tokens = 8 * tiles_a_block(a.m);
  const int64_t tokens = ceil_div(a.m, block_tokens) * block_tokens, total = tokens * (a.k / 32);
  const auto q_bytes = static_cast<size_t>(tokens * a.k);
  auto* out = static_cast<uint8_t*>(ctx.scratch(slot, q_bytes + static_cast<size_t>(total) * sizeof(float2)));
  if (out == nullptr) return cudaErrorMemoryAllocation;
  auto* ds = reinterpret_cast<float2*>(out + q_bytes);  // q_bytes is a multiple of 256
  constexpr int kTileThreads = 256;
  const auto grid = static_cast<unsigned>(std::min<int64_t>(ceil_div(total, kTileThreads), 1 << 20));
  const cudaError_t err =
      launch_kernel(ctx, tile_x_kernel, grid, kTileThreads, 0, reinterpret_cast<const uint8_t*>(a.xq), a.xds,
                    a.k, a.m, total, out, ds);
  a.xq = reinterpret_cast<const int*>(out);
  a.xds = ds;
  return err;
}

cudaError_t mmq(const Context& ctx, const MmqArgs& a, DType type) {
  switch (type) {
    case DType::q4_k: return launch_type<DType::q4_k>(ctx, a);
    case DType::q5_k: return launch_type<DType::q5_k>(ctx, a);
    case DType::q6_k: return launch_type<DType::q6_k>(ctx, a);
    default: return cudaErrorNotSupported;
  }
}

}  // namespace kiln::cuda
