// The e4m3 tensor-core matmul of FP8 weights in row form (one scale a row: per-channel and per-tensor
// checkpoints) for the batches of a batched decode, 9 to 64 tokens at the fast precision: the weight's bytes
// bound these, and cuBLASLt's e4m3 GEMM tiles them 128 x 128, so a 4096-row weight ran on 32 blocks.
//
// x is rounded per token to e4m3 with the scale amax / 448 (fp8_gemm.cu's rounding), written once for the
// matmuls that share it as tiles of 8 tokens: sub-block s (32 elements) of tile T at byte (T * k / 32 + s) *
// 256, token t's 32 codes at 32 (t % 8); a warp's loads of one sub-block's B fragment read 256 consecutive
// bytes.
//
// A warp owns 32 weight rows (two m16 tiles, so that each x fragment it loads serves both). It copies 64
// codes of each row into shared memory with cp.async, two such chunks in flight while it multiplies the one
// before with every token of the batch: mma.sync m16n8k32 on e4m3 codes, each chunk's sums added to f32
// accumulators, the scales applied once at the end (w's row scale times x's token scale). A thread of the mma
// holds A words (4c, 16 + 4c) of rows g, g + 8 and B words (4c, 16 + 4c) of token g; they are mapped to
// elements 8c .. 8c + 7 of the sub-block, in A and B alike, so that each is one 8-byte load.
//
// A block has 4 warps: 4 / k_split row tiles of 32 rows, each split over k_split warps that take every
// k_split-th chunk, summed in warp order at the end; k_split is chosen from the weight's shape alone.
#include <cuda_fp8.h>

#include <algorithm>

#include "backends/cuda/cuda_launch.cuh"
#include "backends/cuda/matmul/matmul.cuh"

namespace kiln::cuda {

namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kStages = 3;     // chunks of a warp's rows in shared memory: one in use, two in flight
constexpr int kWarpRows = 32;  // two m16 tiles
constexpr int kChunk = 64;     // codes of a row a stage holds
// A row's slot: 96 bytes put the 8-byte loads of rows g = 0..3 (a half-warp) in different banks.
constexpr int kSlot = 96;
constexpr float kE4M3Max = 448.0f;

constexpr size_t kSmemBytes = size_t{kWarps} * kStages * kWarpRows * kSlot;
static_assert(kSmemBytes <= 48 * 1024, "the default dynamic shared memory limit");
static_assert(kSmemBytes >= size_t{kWarps} * 2 * 8 * 4 * 32 * sizeof(float), "room for the k-split sums");

// The tokens of x a block of m takes (8 NT: NT tiles of 8).
int tiles_a_block(int64_t m) { return m <= 16 ? 2 : m <= 32 ? 4 : 8; }

// Token t of x (blockIdx.x; t < m_pad) as e4m3 codes in x's tiles, and its scale amax / 448 (1 for a row of
// zeros, and for the tokens past m, whose codes are zeros). A batch's few tokens are few blocks: each thread
// loads its kXVec groups of 4 at once and keeps them for the rounding, so that a block waits on memory once
// (a loop of dependent loads took 30 us at k = 4096); k past kXThreads * kXVec * 4 is read again.
constexpr int kXThreads = 1024, kXVec = 4;
template <bool kVec>
__device__ __forceinline__ float4 x_group(const float* row, int64_t e) {
  if constexpr (kVec) return __ldg(reinterpret_cast<const float4*>(row + e));
  return make_float4(row[e], row[e + 1], row[e + 2], row[e + 3]);
}
template <bool kVec>
__global__ void __launch_bounds__(kXThreads)
    fp8_x_tiles(Rows x, int64_t k, int64_t m, uint8_t* q, float* scales) {
  __shared__ float smem[32];
  pdl_begin();
  const int64_t t = blockIdx.x;
  const float* row = t < m ? x.row_as<const float>(t) : nullptr;
  const int64_t per_pass = 4 * static_cast<int64_t>(kXThreads) * kXVec;
  float4 v[kXVec];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kXVec; ++i) {
    const int64_t e = 4 * (threadIdx.x + static_cast<int64_t>(i) * kXThreads);
    v[i] = row != nullptr && e < k ? x_group<kVec>(row, e) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v[i].x), fabsf(v[i].y)), fmaxf(fabsf(v[i].z), fabsf(v[i].w))));
  }
  for (int64_t e = per_pass + 4 * threadIdx.x; row != nullptr && e < k; e += 4 * kXThreads) {
    const float4 u = x_group<kVec>(row, e);
    amax = fmaxf(amax, fmaxf(fmaxf(fabsf(u.x), fabsf(u.y)), fmaxf(fabsf(u.z), fabsf(u.w))));
  }
  amax = block_max(amax, smem);
  const float s = amax > 0.0f ? amax / kE4M3Max : 1.0f;
  if (threadIdx.x == 0) scales[t] = s;
  uint8_t* tile = q + (t / 8) * (k / 32) * 256 + (t % 8) * 32;
  const auto put = [&](int64_t e, float4 u) {
    const float f[4] = {u.x, u.y, u.z, u.w};
    uint32_t word = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      word |= static_cast<uint32_t>(__nv_cvt_float_to_fp8(__fdiv_rn(f[j], s), __NV_SATFINITE, __NV_E4M3))
              << (8 * j);
    }
    *reinterpret_cast<uint32_t*>(tile + (e / 32) * 256 + e % 32) = word;
  };
#pragma unroll
  for (int i = 0; i < kXVec; ++i) {
    const int64_t e = 4 * (threadIdx.x + static_cast<int64_t>(i) * kXThreads);
    if (e < k) put(e, v[i]);
  }
  for (int64_t e = per_pass + 4 * threadIdx.x; e < k; e += 4 * kXThreads) {
    put(e, row != nullptr ? x_group<kVec>(row, e) : make_float4(0.0f, 0.0f, 0.0f, 0.0f));
  }
}

// c += a b: a 16 x 32 tile of e4m3 codes, b 32 x 8, f32 accumulators (sm_89 and newer).
__device__ __forceinline__ void mma_e4m3_k32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();  // never launched: fp8_mmq_applies() asks for Context::fp8_mma
#endif
}

struct Fp8MmqArgs {
  const uint8_t* w;  // rows in row form (Quant<f8_e4m3>): 12 bytes, the f32 scale, k codes; w_nb1 apart
  int64_t w_nb1;
  int64_t n, k, m;
  const uint8_t* xq;  // x's tiles (fp8_x_tiles)
  const float* xs;    // x's token scales
  Rows dst;           // rows of n
};

// dst[:, t] = W x_t for the 8 * NT tokens of blockIdx.y and the 32 * (kWarps / k_split) rows of blockIdx.x.
template <int NT>
__global__ void __launch_bounds__(kThreads) fp8_mmq_kernel(Fp8MmqArgs a, Store store_to, int k_split) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
  const int tiles = kWarps / k_split, rt = warp % tiles, kp = warp / tiles;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * tiles + rt) * kWarpRows;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * 8 * NT;
  const int m = static_cast<int>(min(static_cast<int64_t>(8 * NT), a.m - t0));
  const int64_t n_chunks = (a.k + kChunk - 1) / kChunk, n_sub = a.k / 32;
  const int64_t count = n_chunks > kp ? (n_chunks - 1 - kp) / k_split + 1 : 0;
  uint8_t* stage = smem + warp * (kStages * kWarpRows * kSlot);

  // Chunk kp + it * k_split of the warp's rows into stage slot it % kStages (the rows past n repeat the last
  // one; a last chunk of 32 codes copies half); one commit group per call, empty past the end, so that the
  // waits below count uniformly.
  auto issue = [&](int64_t it) {
    if (it < count) {
      const int64_t start = (kp + it * k_split) * kChunk;
      const int pieces = static_cast<int>(min(static_cast<int64_t>(kChunk), a.k - start) / 16);
      uint8_t* to = stage + (it % kStages) * kWarpRows * kSlot;
      for (int i = lane; i < kWarpRows * pieces; i += 32) {
        const int r = i / pieces, p = i - r * pieces;
        cp_async16(to + r * kSlot + 16 * p, a.w + min(row0 + r, a.n - 1) * a.w_nb1 + 16 + start + 16 * p);
      }
    }
    cp_async_commit();
  };
  // Weights are constant: their first copies start before the wait for the kernel that wrote x.
  issue(0);
  issue(1);
  pdl_wait();
  const uint8_t* xq = a.xq + t0 * a.k;
  float acc[2][NT][4] = {};
  for (int64_t it = 0; it < count; ++it) {
    issue(it + 2);
    const int64_t ch = kp + it * k_split;
    const int subs = static_cast<int>(min(static_cast<int64_t>(kChunk), a.k - ch * kChunk) / 32);
    cp_async_wait<kStages - 1>();
    __syncwarp();
    // The chunk's x fragments first, all loads in flight at once (in the loop below each mma waited on its
    // own load: a 64-token batch took 10x its weight's time).
    const uint8_t* xc = xq + ch * (kChunk / 32) * 256 + 32 * g + 8 * c;
    uint2 xb[NT][kChunk / 32];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int j = 0; j < kChunk / 32; ++j) {
        xb[nt][j] = j < subs ? __ldg(reinterpret_cast<const uint2*>(xc + (nt * n_sub + j) * 256)) : uint2{};
      }
    }
    const uint8_t* buf = stage + (it % kStages) * kWarpRows * kSlot;
    uint32_t w[kChunk / 32][2][4];  // sub-block j, row tile h
#pragma unroll
    for (int j = 0; j < kChunk / 32; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint2 v0 = *reinterpret_cast<const uint2*>(buf + (16 * h + g) * kSlot + 32 * j + 8 * c);
        const uint2 v1 = *reinterpret_cast<const uint2*>(buf + (16 * h + g + 8) * kSlot + 32 * j + 8 * c);
        w[j][h][0] = v0.x, w[j][h][1] = v1.x, w[j][h][2] = v0.y, w[j][h][3] = v1.y;
      }
    }
    // The tensor cores sum e4m3 products at less than f32's precision: each chunk's sums start from zero in
    // them and are added to the f32 accumulators here (DeepSeek-V3's promotion), so that their error does not
    // grow with k.
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      float part[2][4] = {};
#pragma unroll
      for (int j = 0; j < kChunk / 32; ++j) {
        if (j < subs) {
          mma_e4m3_k32(part[0], w[j][0], xb[nt][j].x, xb[nt][j].y);
          mma_e4m3_k32(part[1], w[j][1], xb[nt][j].x, xb[nt][j].y);
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[h][nt][i] = __fadd_rn(acc[h][nt][i], part[h][i]);
      }
    }
    __syncwarp();  // the slot is copied into again two iterations on
  }
  cp_async_wait<0>();
  pdl_trigger();
  __syncthreads();  // the stages become the k-split warps' partial sums
  auto* red = reinterpret_cast<float*>(smem);
  const auto red_at = [&](int w, int h, int nt, int i) {
    return (((w * 2 + h) * NT + nt) * 4 + i) * 32 + lane;
  };
  if (kp > 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) red[red_at(warp, h, nt, i)] = acc[h][nt][i];
      }
    }
  }
  __syncthreads();
  if (kp > 0) return;
  for (int p = 1; p < k_split; ++p) {
    const int w = warp + p * tiles;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[h][nt][i] = __fadd_rn(acc[h][nt][i], red[red_at(w, h, nt, i)]);
      }
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t row = row0 + 16 * h + g + (i < 2 ? 0 : 8);
      if (row >= a.n) continue;
      const float sw = __ldg(reinterpret_cast<const float*>(a.w + row * a.w_nb1 + 12));
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int col = 8 * nt + 2 * c + i % 2;
        if (col < m) {
          store(store_to, a.dst.row(t0 + col), row, __fmul_rn(__fmul_rn(acc[h][nt][i], sw), a.xs[t0 + col]));
        }
      }
    }
  }
}

// Blocks of the 64-token kernel (the most registers) a multiprocessor holds: the k split is chosen for it
// whatever the batch.
int64_t blocks_per_sm() {
  static const int64_t blocks = [] {
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, fp8_mmq_kernel<8>, kThreads, kSmemBytes) !=
        cudaSuccess) {
      cudaGetLastError();
      b = 2;
    }
    return std::max(b, 1);
  }();
  return blocks;
}

// The k split (1, 2 or 4 warps a row tile) from the weight's shape alone: blocks run in rounds of
// blocks_per_sm() * n_sms, each block's time 1 / k_split of an unsplit one's; the split of the fewest rounds
// / k_split, the smaller on a tie.
int k_split_for(const Context& ctx, int64_t n, int64_t k) {
  const int64_t slots = blocks_per_sm() * std::max(ctx.n_sms, 1);
  int best = 1;
  double best_cost = 0.0;
  for (int ks = 1; ks <= kWarps && ks <= ceil_div(k, kChunk); ks *= 2) {
    const int64_t blocks = ceil_div(n, kWarpRows * (kWarps / ks));
    const double cost = static_cast<double>(ceil_div(blocks, slots)) / ks;
    if (best_cost == 0.0 || cost < best_cost) best = ks, best_cost = cost;
  }
  return best;
}

template <int NT>
cudaError_t launch(const Context& ctx, const Fp8MmqArgs& a, DType dst_type) {
  const int k_split = k_split_for(ctx, a.n, a.k);
  const dim3 grid(static_cast<unsigned>(ceil_div(a.n, kWarpRows * (kWarps / k_split))),
                  static_cast<unsigned>(ceil_div(a.m, 8 * NT)));
  return launch_kernel(ctx, fp8_mmq_kernel<NT>, grid, kThreads, kSmemBytes, a, store_of(dst_type), k_split);
}

}  // namespace

bool fp8_mmq_applies(const Context& ctx, const ops::Matmul& op) {
  const Tensor& w = op.w.tensor;
  const int64_t m = op.x.n_rows();
  return w.type == DType::f8_e4m3 && ctx.fast && ctx.fp8_mma && ctx.options.mmq &&
         !ctx.options.batch_invariant && grouped(op.w) && m > kGemvMaxCols && m <= kMmqMaxCols &&
         w.ne[0] % 32 == 0 && w.ne[2] == 1 && w.ne[3] == 1 && aligned(w.data, 16) && w.nb[1] % 16 == 0;
}

cudaError_t fp8_mmq_group(const Context& ctx, std::span<const ops::Matmul* const> group) {
  const ops::Matmul& first = *group[0];
  const int64_t k = first.w.tensor.ne[0], m = first.x.n_rows();
  const int nt = tiles_a_block(m);
  const int64_t m_pad = ceil_div(m, 8 * nt) * 8 * nt;
  const int64_t q_bytes = m_pad * k;  // a multiple of 256: the scales stay aligned
  auto* xq = static_cast<uint8_t*>(ctx.scratch(kSlotX, static_cast<size_t>(q_bytes + m_pad * 4)));
  if (xq == nullptr) return cudaErrorMemoryAllocation;
  auto* xs = reinterpret_cast<float*>(xq + q_bytes);
  const Rows x = rows_of(first.x);
  if (const cudaError_t e = rows_aligned16(x)
                                ? launch_kernel(ctx, fp8_x_tiles<true>, static_cast<unsigned>(m_pad),
                                                kXThreads, 0, x, k, m, xq, xs)
                                : launch_kernel(ctx, fp8_x_tiles<false>, static_cast<unsigned>(m_pad),
                                                kXThreads, 0, x, k, m, xq, xs);
      e != cudaSuccess) {
    return e;
  }
  for (const ops::Matmul* op : group) {
    const Tensor& w = op->w.tensor;
    const Fp8MmqArgs a{static_cast<const uint8_t*>(w.data), w.nb[1], w.ne[1], k, m, xq, xs, rows_of(op->dst)};
    const cudaError_t e = nt == 2   ? launch<2>(ctx, a, op->dst.type)
                          : nt == 4 ? launch<4>(ctx, a, op->dst.type)
                                    : launch<8>(ctx, a, op->dst.type);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace kiln::cuda
