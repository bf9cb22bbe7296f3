// The integer tensor-core matmul ("MMQ") of K-quant weights with x rounded to 8 bits per block of 32
// (quantize_x's layout, cuda_q8.cuh): the batches of a batched decode, where the integer GEMV reads each
// weight row once but spends a __dp4a and a scaling per weight and token.
//
// A block of 4 warps owns 32 weight rows and 16 to 64 tokens. Its threads copy one super-block (256 elements)
// of each of its rows, and the same 256 x values of each of its tokens with their scales, into shared memory
// with cp.async, two super-blocks in flight while the one before is multiplied. A warp multiplies 16 of the
// rows with half of the tokens on the tensor cores: mma.sync m16n8k32 (unsigned 4- or 5-bit weights times
// signed x) for a sub-block of 32 with one scale, two m16n8k16 (signed 6-bit weights) for Q6_K's two
// sub-blocks of 16. The int32 products of a sub-block are scaled into f32 accumulators (d_w * d_x * dot, less
// the minimum's m_w * d_x * sum(q_x)), as the GEMV scales its units.
//
// The sum over k is exact in int32 within a sub-block, so the order of a sub-block's elements is free: a
// thread of the mma holds x words (4c, 16 + 4c) of token g and weight words (4c, 16 + 4c) of rows g, g + 8,
// and for the 4- and 5-bit types those are mapped to elements 8c .. 8c + 7 of the sub-block: one 8-byte load
// of the weight's nibbles and one of x (Q6_K's natural order: its low bits and high bits of element l are in
// different arrays).
//
// Each accumulator sums its row's and token's sub-blocks in order, the same operations whatever the batch:
// a token's products are the same bits alone (in a batch of more than kGemvMaxCols) or among others.
#include <algorithm>
#include <atomic>

#include "backends/cuda/cuda_launch.cuh"
#include "backends/cuda/cuda_mmq.cuh"
#include "backends/cuda/cuda_q8.cuh"
#include "backends/cuda/cuda_quant.cuh"

namespace kiln::cuda {

namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps;

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

// A stage of the block's copies in shared memory: the super-block of each of its kBlockRows weight rows
// (kSlot bytes apart), then per token of the block's 16 * NT the super-block's 256 x values (kXRow bytes
// apart: 32 bytes past a multiple of 128 put the 8-byte loads of tokens g = 0..3 in different banks) and
// their 8 {d, d * sum(q)}.
constexpr int kBlockRows = 32, kXRow = 288, kXDs = 64;
template <DType T, int NT>
__host__ __device__ constexpr int stage_bytes() {
  return kBlockRows * MmqType<T>::kSlot + 16 * NT * (kXRow + kXDs);
}
// Stages: one in use, the others in flight. A multiprocessor holds one or two blocks (the 8B's 4096-row
// matrices give it one): the more copies it keeps in flight, the nearer its reads come to the memory's rate.
template <int NT>
__host__ __device__ constexpr int stages() {
  return NT == 1 ? 6 : NT == 2 ? 4 : 3;
}

// Q4_K / Q5_K: a super-block of rows r0 (g) and r1 (g + 8) times the warp's 8 * NT tokens (xs: their x
// values, kXRow apart; ds: their scales, 8 a token), all in shared memory. Sub-block pair j (qs bytes 32j ..
// 32j + 31: sub-block 2j in the low nibbles, 2j + 1 in the high ones); the thread's elements 8c .. 8c + 7 of
// a sub-block are qs bytes 32j + 8c .. 32j + 8c + 7 (Q5_K: their fifth bits, bits 2j and 2j + 1 of qh bytes
// 8c .. 8c + 7).
template <DType T, int NT>
__device__ __forceinline__ void super_k(const uint8_t* r0, const uint8_t* r1, const uint8_t* xs,
                                        const float2* ds, int g, int c, float (&acc)[NT][4]) {
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
      const uint8_t* xr = xs + (8 * nt + g) * kXRow + 64 * j;
      const uint2 bl = *reinterpret_cast<const uint2*>(xr + 8 * c);
      const uint2 bh = *reinterpret_cast<const uint2*>(xr + 32 + 8 * c);
      int cl[4] = {0, 0, 0, 0}, ch[4] = {0, 0, 0, 0};
      mma_u8s8_k32(cl, lo, bl.x, bl.y);
      mma_u8s8_k32(ch, hi, bh.x, bh.y);
      // {d, d * sum(q)} of x's sub-blocks 2j and 2j + 1, tokens 2c and 2c + 1
      const float4 e[2] = {*reinterpret_cast<const float4*>(ds + (8 * nt + 2 * c) * 8 + 2 * j),
                           *reinterpret_cast<const float4*>(ds + (8 * nt + 2 * c + 1) * 8 + 2 * j)};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const WK& s = i < 2 ? s0 : s1;
        const float4& x = e[i % 2];
        float v = acc[nt][i];
        v = __fmaf_rn(__fmul_rn(s.d0, x.x), static_cast<float>(cl[i]), v);
        v = __fmaf_rn(-s.m0, x.y, v);
        v = __fmaf_rn(__fmul_rn(s.d1, x.z), static_cast<float>(ch[i]), v);
        acc[nt][i] = __fmaf_rn(-s.m1, x.w, v);
      }
    }
  }
}

// The signed 6-bit values (q - 32, as bytes) of Q6_K elements 128h + 32q + 16l + 4c .. + 3 of a super-block
// (cuda_q8.cuh's Q8<q6_k> describes the layout).
__device__ __forceinline__ uint32_t q6_word(const uint8_t* b, int h, int q, int l, int c) {
  constexpr int A = 2 | kInShared;
  const uint32_t ql = ld_u32<A>(b + 64 * h + 32 * (q % 2) + 16 * l + 4 * c);
  const uint32_t qh = ld_u32<A>(b + 128 + 32 * h + 16 * l + 4 * c);
  const uint32_t v = ((q < 2 ? ql : ql >> 4) & 0x0F0F0F0Fu) | (((qh >> (2 * q)) & 0x03030303u) << 4);
  return (v + 0x60606060u) ^ 0x80808080u;  // q - 32 per byte without borrows
}

// Q6_K: a super-block of rows r0 (g) and r1 (g + 8) times the warp's tokens, a block of 32 (4h + q) at a time
// as two sub-blocks of 16 (l = 0, 1), one scale each.
template <int NT>
__device__ __forceinline__ void super_q6(const uint8_t* r0, const uint8_t* r1, const uint8_t* xs,
                                         const float2* ds, int g, int c, float (&acc)[NT][4]) {
  constexpr int A = 2 | kInShared;
  const float d0 = f16_bits_to_f32(ld_u16<A>(r0 + 208)), d1 = f16_bits_to_f32(ld_u16<A>(r1 + 208));
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int blk = 4 * h + q;
      uint32_t w0[2], w1[2];
      float s0[2], s1[2];
#pragma unroll
      for (int l = 0; l < 2; ++l) {
        w0[l] = q6_word(r0, h, q, l, c);
        w1[l] = q6_word(r1, h, q, l, c);
        s0[l] = __fmul_rn(d0, static_cast<float>(static_cast<int8_t>(r0[192 + 8 * h + 2 * q + l])));
        s1[l] = __fmul_rn(d1, static_cast<float>(static_cast<int8_t>(r1[192 + 8 * h + 2 * q + l])));
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint8_t* xr = xs + (8 * nt + g) * kXRow + 32 * blk;
        const uint32_t bl = *reinterpret_cast<const uint32_t*>(xr + 4 * c);
        const uint32_t bh = *reinterpret_cast<const uint32_t*>(xr + 16 + 4 * c);
        int cl[4] = {0, 0, 0, 0}, ch[4] = {0, 0, 0, 0};
        mma_s8s8_k16(cl, w0[0], w1[0], bl);
        mma_s8s8_k16(ch, w0[1], w1[1], bh);
        const float dx[2] = {ds[(8 * nt + 2 * c) * 8 + blk].x, ds[(8 * nt + 2 * c + 1) * 8 + blk].x};
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

// dst[:, t] = W x_t for the 16 * NT tokens of blockIdx.y and the kBlockRows rows of blockIdx.x. Warp w takes
// rows 16 (w % 2) .. + 15 and tokens 8 NT (w / 2) .. + 8 NT - 1 of the block's; the block's threads copy each
// super-block of its rows and of its tokens' x into a stage, two stages in flight while one is multiplied.
template <DType T, int NT>
__global__ void __launch_bounds__(kThreads) mmq_kernel(MmqArgs a, Store store_to) {
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int kBytes = MmqType<T>::kBytes, kSlot = MmqType<T>::kSlot, kTokens = 16 * NT;
  constexpr int kStage = stage_bytes<T, NT>(), kXAt = kBlockRows * kSlot, kStages = stages<NT>();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kBlockRows;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kTokens;
  const int64_t n_sb = a.k / 256;
  // Super-block sb of the block's rows (the rows past n repeat the last one) into stage sb % kStages.
  auto copy_w = [&](int64_t sb) {
    if (sb >= n_sb) return;
    const int64_t start = sb * kBytes, first = start & ~int64_t{15};
    const int chunks = static_cast<int>((start - first + kBytes + 15) / 16);
    uint8_t* dst = smem + (sb % kStages) * kStage;
    for (int i = threadIdx.x; i < kBlockRows * chunks; i += kThreads) {
      const int r = i / chunks, ch = i - r * chunks;
      cp_async16(dst + r * kSlot + 16 * ch, a.w + min(row0 + r, a.n - 1) * a.w_nb1 + first + 16 * ch);
    }
  };
  // The x values and scales of super-block sb of the block's tokens (the tokens past m repeat the last one).
  auto copy_x = [&](int64_t sb) {
    if (sb >= n_sb) return;
    uint8_t* dst = smem + (sb % kStages) * kStage + kXAt;
    for (int i = threadIdx.x; i < kTokens * 20; i += kThreads) {
      const int t = i / 20, ch = i - t * 20;
      const int64_t tok = min(t0 + t, a.m - 1);
      if (ch < 16) {
        cp_async16(dst + t * kXRow + 16 * ch,
                   reinterpret_cast<const uint8_t*>(a.xq) + tok * a.k + sb * 256 + 16 * ch);
      } else {
        cp_async16(dst + kTokens * kXRow + t * kXDs + 16 * (ch - 16),
                   reinterpret_cast<const uint8_t*>(a.xds + tok * (a.k / 32) + sb * 8) + 16 * (ch - 16));
      }
    }
  };
  // Weights are constant: their first copies start before the wait for the kernel that wrote x. One commit
  // group a call, empty past the end, so that the wait below counts uniformly: when super-block sb is used,
  // the groups after its x are those of the kStages - 2 x copies after it and of the one copy (weights and x)
  // the loop has just issued.
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    copy_w(i);
    cp_async_commit();
  }
  pdl_wait();
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    copy_x(i);
    cp_async_commit();
  }
  const int rt = warp % 2, th = warp / 2;
  float acc[NT][4] = {};
  for (int64_t sb = 0; sb < n_sb; ++sb) {
    copy_w(sb + kStages - 1);
    copy_x(sb + kStages - 1);
    cp_async_commit();
    cp_async_wait<kStages - 1>();
    __syncthreads();
    const uint8_t* st = smem + (sb % kStages) * kStage;
    const uint8_t* w = st + 16 * rt * kSlot + ((sb * kBytes) & 15);
    const uint8_t* xs = st + kXAt + 8 * NT * th * kXRow;
    const auto* ds = reinterpret_cast<const float2*>(st + kXAt + kTokens * kXRow) + 8 * NT * th * 8;
    if constexpr (T == DType::q6_k) {
      super_q6<NT>(w + g * kSlot, w + (g + 8) * kSlot, xs, ds, g, c, acc);
    } else {
      super_k<T, NT>(w + g * kSlot, w + (g + 8) * kSlot, xs, ds, g, c, acc);
    }
    __syncthreads();  // the stage is copied into again by the next iteration
  }
  cp_async_wait<0>();
  pdl_trigger();
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t row = row0 + 16 * rt + g + (i < 2 ? 0 : 8);
      const int64_t col = t0 + 8 * NT * th + 8 * nt + 2 * c + i % 2;
      if (row < a.n && col < a.m) store(store_to, a.dst.row(col), row, acc[nt][i]);
    }
  }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <DType T, int NT>
cudaError_t launch(const Context& ctx, const MmqArgs& a) {
  constexpr int kSmem = stages<NT>() * stage_bytes<T, NT>();
  // More than the 48 KiB a block gets unasked: raised once per kernel and device.
  static std::atomic<uint64_t> raised{0};
  int device = 0;
  if (const cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  const uint64_t bit = uint64_t{1} << (device % 64);
  if ((raised.load(std::memory_order_acquire) & bit) == 0) {
    const cudaError_t err =
        cudaFuncSetAttribute(mmq_kernel<T, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (err != cudaSuccess) return err;
    raised.fetch_or(bit, std::memory_order_release);
  }
  const dim3 grid(static_cast<unsigned>(ceil_div(a.n, kBlockRows)),
                  static_cast<unsigned>(ceil_div(a.m, 16 * NT)));
  return launch_kernel(ctx, mmq_kernel<T, NT>, grid, kThreads, kSmem, a, store_of(a.dst_type));
}

template <DType T>
cudaError_t launch_type(const Context& ctx, const MmqArgs& a) {
  if (a.m <= 16) return launch<T, 1>(ctx, a);
  if (a.m <= 32) return launch<T, 2>(ctx, a);
  return launch<T, 4>(ctx, a);
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

bool mmq_rows_fit(DType type, const void* data, int64_t nb1, int64_t k) {
  return mmq_type(type) && reinterpret_cast<uintptr_t>(data) % 16 == 0 && nb1 % 16 == 0 && k % 256 == 0 &&
         (k / 256 * super_bytes(type)) % 16 == 0;
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
