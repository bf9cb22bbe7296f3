// The integer GEMV through shared memory (Matmul at the fast precision where matmul/matmul.cu takes the
// integer GEMV) of Q4_K and Q5_K rows that start 16-byte aligned and are whole 16-byte chunks, and of rows in
// grouped form (always so): Q6_K's (matmul/dequant.cuh's q6k_block), and the legacy block types'
// (legacy_block) for one column of x.
//
// The work of a launch is items of kRows weight rows and a group of up to kCols columns; a block takes the
// items blockIdx.x, blockIdx.x + gridDim.x, ... (the grid is what the device holds at once, so there is no
// later wave), and walks each item's rows a segment at a time: kGemvThreads units of every row, one unit a
// thread. Segments reach shared memory by cp.async, 16 bytes a copy and no register waiting, the block's next
// segment (of this item or of its next one) in flight while this one is multiplied, so that a block streams
// its share of the weight with loads always on the way. The first segment is asked for before the wait for
// the kernel before (weights are constant).
//
// A landed K-quant segment's super-block scales are decoded once, into a table of f32 factors in shared
// memory, a quarter super-block a thread, and every unit reads its factors from there: decoding them per unit
// (eight units share a super-block) cost more instructions than the dot products. A grouped row's segment is
// whole runs of 8 blocks (Q6_K: super-blocks), itself a row in grouped form: its units load from it as from
// the row (Q8G<T>), the legacy types' with no table.
//
// Each thread takes the units t, t + kGemvThreads, ... of a row in the order matmul/matmul.cu's
// gemv_q8_partial does, with the same arithmetic (the table holds the products k_pair_scales and
// Q8<q6_k>::load compute), and the block's sums meet as gemv_kernel's do: the two give the same bits
// (CudaGemv.Staged*).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_launch.cuh"
#include "backends/cuda/matmul/dequant.cuh"
#include "backends/cuda/matmul/dot_q8.cuh"
#include "backends/cuda/matmul/gemv.cuh"

namespace kiln::cuda {

namespace {

// How a type's rows are staged: Q, its units (Q8<T> or Q8G<T>); kA, the alignment of its rows' blocks;
// kSbBytes, the bytes of 256 elements (a K-quant super-block, a run of 8 legacy blocks); row_bytes(k), a
// row's length; kTable, whether a segment's scales go to a table first (table() writes part p of kParts of a
// super-block's 16 floats); load(), a unit of a staged segment.
template <DType T>
struct Staged;

// Weight bytes of one segment of a row: kGemvThreads units (whole super-blocks or runs of 8 blocks, whole
// 16-byte chunks).
template <DType T>
__host__ __device__ constexpr int seg_bytes() {
  return kGemvThreads * Staged<T>::Q::kUnit / 256 * Staged<T>::kSbBytes;
}

// Q4_K, Q5_K: for each pair j of sub-blocks {d * scale(2j), d * scale(2j+1), dmin * min(2j), dmin *
// min(2j+1)}.
template <DType T>
struct StagedK {
  using Q = Q8<T>;
  static constexpr int kA = Quant<T>::kAlign, kSbBytes = Q::kBytes;
  static constexpr bool kTable = true;
  static constexpr int kParts = 1;
  __device__ static int64_t row_bytes(int64_t k) { return k / 256 * kSbBytes; }
  // Super-block sb's table, whole: its 12 packed bytes decoded four at a time (each 32-bit operation works
  // on one byte of each of four sub-blocks, as k_pair_scales does on one), into the products k_pair_scales
  // computes, d * scale and dmin * min, with the same rounding.
  template <int A>
  __device__ static void table(const uint8_t* seg, unsigned sb, unsigned, float* t) {
    const uint8_t* b = seg + sb * kSbBytes;
    const uint32_t dd = ld_u32<A>(b);
    const uint32_t s0 = ld_u32<align_at(A, 4)>(b + 4), s1 = ld_u32<align_at(A, 8)>(b + 8),
                   s2 = ld_u32<align_at(A, 4)>(b + 12);
    const float d = f16_bits_to_f32(dd & 0xFFFF), dmin = f16_bits_to_f32(dd >> 16);
    // Sub-blocks 0..3 hold 6 bits in bytes 0..3 (scales) and 4..7 (mins); 4..7 the nibbles of bytes 8..11
    // and, above them, the top two bits of bytes 0..3 (scales) and 4..7 (mins).
    const uint32_t sc[2] = {s0 & 0x3F3F3F3Fu, (s2 & 0x0F0F0F0Fu) | ((s0 >> 2) & 0x30303030u)};
    const uint32_t mn[2] = {s1 & 0x3F3F3F3Fu, ((s2 >> 4) & 0x0F0F0F0Fu) | ((s1 >> 2) & 0x30303030u)};
    const auto f = [](uint32_t w, int i) { return static_cast<float>((w >> (8 * i)) & 0xFF); };
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // the pair of sub-blocks 2j, 2j + 1
      const uint32_t s = sc[j / 2], m = mn[j / 2];
      const int i = 2 * (j % 2);
      reinterpret_cast<float4*>(t)[j] =
          make_float4(d * f(s, i), d * f(s, i + 1), dmin * f(m, i), dmin * f(m, i + 1));
    }
  }
  // Unit v (0 .. kGemvThreads - 1) of a segment.
  template <int A>
  __device__ static WK load(const uint8_t* seg, const float* table, int v) {
    const int sb = v / 8, j = (v % 8) / 2, t = v % 2;
    WK w;
    Q8<T>::template quants<A>(seg + sb * Q8<T>::kBytes, j, t, w);
    const float4 s = reinterpret_cast<const float4*>(table + 16 * sb)[j];
    w.d0 = s.x, w.d1 = s.y, w.m0 = s.z, w.m1 = s.w;
    return w;
  }
};
template <>
struct Staged<DType::q4_k> : StagedK<DType::q4_k> {};
template <>
struct Staged<DType::q5_k> : StagedK<DType::q5_k> {};

// Q6_K in grouped form (matmul/dequant.cuh's q6k_block): a segment is one run of 8 super-blocks. d * scale(i)
// of sub-block i = 8h + 2g + q at 8h + 4q + g, so that the unit (h, t) of a super-block reads its four (g =
// 0..3, q = t / 4) as one float4.
template <>
struct Staged<DType::q6_k> {
  using Q = Q8<DType::q6_k>;
  static constexpr int kA = 16 | kGrouped, kSbBytes = Q::kBytes;
  static constexpr bool kTable = true;
  static constexpr int kParts = 2;
  __device__ static int64_t row_bytes(int64_t k) { return grouped_bytes(k, 256, 18, 192); }
  // Half h of super-block sb's table: its scales 8h .. 8h + 7 in one 8-byte load, each times d as
  // Q8<q6_k>::load computes it.
  template <int A>
  __device__ static void table(const uint8_t* seg, unsigned sb, unsigned h, float* t) {
    static_assert((A & kGrouped) != 0, "grouped rows");
    const Q6kBlock b = q6k_block<A>(seg, sb);
    const float d = f16_bits_to_f32(ld_u16<q6k_d_align<A>()>(b.d));
    const uint2 v = ld_u64<align_at(A, 8)>(b.scales + 8 * h);
    // d * scale(8h + i)
    const auto f = [&](int i) {
      return d * static_cast<float>(static_cast<int8_t>((i < 4 ? v.x : v.y) >> (8 * (i % 4))));
    };
    // Sub-block 8h + 2g + q goes to 8h + 4q + g: each float4 holds one q of the half.
#pragma unroll
    for (int q = 0; q < 2; ++q)
      reinterpret_cast<float4*>(t)[2 * h + q] = make_float4(f(q), f(2 + q), f(4 + q), f(6 + q));
  }
  template <int A>
  __device__ static Q::W load(const uint8_t* seg, const float* table, int v) {
    const int sb = v / 16, h = (v % 16) / 8, t = v % 8;
    Q::W w;
    Q::quants<A>(q6k_block<A>(seg, sb), h, t, w);
    const float4 s = reinterpret_cast<const float4*>(table + 16 * sb + 8 * h)[t / 4];
    w.d[0] = s.x, w.d[1] = s.y, w.d[2] = s.z, w.d[3] = s.w;
    return w;
  }
};

// The legacy block types in grouped form: a segment's runs of 8 blocks (headers, then quants) are read in
// place.
template <DType T>
struct StagedGrouped {
  using Q = Q8G<T>;
  static constexpr int kHead = Quant<T>::kHead, kQs = Quant<T>::kBytes - kHead;
  static constexpr int kA = 16 | kGrouped, kSbBytes = 8 * (kHead + kQs);
  static constexpr bool kTable = false;
  static constexpr int kParts = 1;
  // A last run of r < 8 blocks keeps the room of 8 headers: a multiple of 16 bytes all the same (kHead is
  // even).
  __device__ static int64_t row_bytes(int64_t k) { return grouped_bytes(k, 32, kHead, kQs); }
  template <int A>
  __device__ static void table(const uint8_t*, unsigned, unsigned, float*) {}
  template <int A>
  __device__ static typename Q::W load(const uint8_t* seg, const float*, int v) {
    return Q::template load<A>(seg, v);
  }
};
template <>
struct Staged<DType::q4_0> : StagedGrouped<DType::q4_0> {};
template <>
struct Staged<DType::q4_1> : StagedGrouped<DType::q4_1> {};
template <>
struct Staged<DType::q5_0> : StagedGrouped<DType::q5_0> {};
template <>
struct Staged<DType::q5_1> : StagedGrouped<DType::q5_1> {};
template <>
struct Staged<DType::q8_0> : StagedGrouped<DType::q8_0> {};

// One item: the rows row0 .. row0 + kRows - 1 of `part` (the last repeated past its end) and the columns
// q0 .. q0 + cols - 1.
struct Item {
  GemvPart part;
  int part_index;
  const uint8_t* w;  // the part's weight (the expert's, with ids)
  int64_t row0, q0;
  int cols;
};
template <int kRows>
__device__ __forceinline__ Item item_at(const GemvArgs& a, unsigned item) {
  const auto groups = static_cast<unsigned>(a.n_groups);
  unsigned block = groups == 1 ? item : item / groups;
  Item it;
  it.part = gemv_part(a, block, it.part_index);
  it.row0 = int64_t{block} * kRows;
  it.q0 = int64_t{groups == 1 ? 0u : item % groups} * a.m;
  it.cols = static_cast<int>(min(static_cast<int64_t>(a.m), a.n_cols - it.q0));
  it.w = it.part.w + (a.use_ids ? a.ids[it.q0] * a.w_nb2 : 0);
  return it;
}

// Blocks a multiprocessor must hold (registers): a one-column launch of one or two rows a block is many short
// blocks (a small model's matmuls), which run in one wave only when the device holds them all at once. With
// RoPE (kRope), whose store takes more registers, 8: at 12 the kernel spilled.
template <int kCols, int kRows, int kRope = kNoRope>
inline constexpr int kStagedMinBlocks = kCols == 1 && kRows <= 2 ? (kRope != kNoRope ? 8 : 12) : 1;

// kRope (kRopeFloat or kRopeQ8; kRows even, a.rope.on): Q, K and V with RoPE and the KV write (GemvRope), as
// gemv_kernel.
template <DType T, int kCols, int kRows, int kRope>
__global__ void __launch_bounds__(kGemvThreads, kStagedMinBlocks<kCols, kRows, kRope>)
    gemv_staged_kernel(GemvArgs a, unsigned n_items, RopeArg<kRope> freqs) {
  using S = Staged<T>;
  using Q = typename S::Q;
  constexpr int kSeg = seg_bytes<T>();
  static_assert(kSeg % 16 == 0, "a segment is whole 16-byte chunks");
  static_assert(S::kParts >= 1 && 16 % S::kParts == 0, "a super-block's table in whole parts");
  constexpr int kSbSeg = kSeg / S::kSbBytes;  // super-blocks (runs of 8 blocks) of a row in a segment
  constexpr int A = S::kA | kInShared;
  __shared__ float red[kGemvThreads / 32][kRows][kCols];
  __shared__ __align__(16) float table[S::kTable ? kRows * kSbSeg * 16 : 4];
  extern __shared__ __align__(16) uint8_t stage[];  // two slots of kRows segments
  const int64_t n_units = a.k / Q::kUnit;
  const int64_t row_bytes = S::row_bytes(a.k);
  const int n_seg = static_cast<int>((n_units + kGemvThreads - 1) / kGemvThreads);
  // A slot holds a segment of each of the item's rows, kSeg bytes apart. Thread t copies the chunks c,
  // c + kPerRow, ... (c = t % kPerRow) of row t / kPerRow: one row pointer a thread, set once an item, and
  // copies at fixed offsets from it (a warp writes 16-byte chunks of one or two rows, in distinct banks).
  constexpr int kChunks = kSeg / 16, kPerRow = kGemvThreads / kRows,
                kCopies = (kChunks + kPerRow - 1) / kPerRow;
  static_assert(kGemvThreads % kRows == 0, "whole threads a row");
  const int my_row = static_cast<int>(threadIdx.x) / kPerRow,
            my_chunk = static_cast<int>(threadIdx.x) % kPerRow;
  const auto stage_at = static_cast<unsigned>(__cvta_generic_to_shared(stage));
  // Segment `seg` of item `item`'s rows into slot `slot`; a group is committed even when there is none, so
  // that cp_async_wait<1> below always leaves just the next segment in flight. The item of the segments being
  // issued is kept (next), so that item_at() runs once an item, except in the kernels that must hold many
  // blocks: there it runs again where the item's segments are read, since holding the Item across the loop
  // took the one-column kernels of 1-2 rows from 38 to 52-70 registers.
  constexpr bool kKeepItem = kStagedMinBlocks<kCols, kRows, kRope> == 1;
  Item next{};
  const uint8_t* from = nullptr;  // the thread's row of the item being issued, at its first chunk
  const auto issue = [&](unsigned item, int seg, int slot) {
    if (item < n_items) {
      if (seg == 0) {
        const Item n = item_at<kRows>(a, item);
        if constexpr (kKeepItem) next = n;
        from = n.w + min(n.row0 + my_row, n.part.n - 1) * n.part.w_nb1 + 16 * my_chunk;
      }
      const int64_t off = int64_t{seg} * kSeg;
      const int left = static_cast<int>(min(int64_t{kSeg}, row_bytes - off) / 16) - my_chunk;
      const int at = slot * (kRows * kSeg) + my_row * kSeg + 16 * my_chunk;
#pragma unroll
      for (int j = 0; j < kCopies; ++j) {
        if (kPerRow * j < left) {
          // The K-quants' copies go to a shared-memory address worked out once (docs/cuda.md: their
          // launches measured faster so); the legacy types' keep the generic pointer, measured within the
          // spread of their short launches but not shown faster.
          if constexpr (S::kTable)
            cp_async16_at(stage_at + at + 16 * kPerRow * j, from + off + 16 * kPerRow * j);
          else
            cp_async16(stage + at + 16 * kPerRow * j, from + off + 16 * kPerRow * j);
        }
      }
    }
    cp_async_commit();
  };
  unsigned item = blockIdx.x;
  int seg = 0, slot = 0;
  if (a.use_ids) pdl_wait();  // the experts' ids come from the kernel before
  issue(item, 0, 0);
  // kRope: the cos/sin of the item being multiplied (rope_at) and of the next (rope_next), each made while
  // its first segment is on its way: the first item's before the wait, a later one's as it is issued.
  RopeAt rope_at, rope_next;
  if constexpr (kRope != kNoRope) {
    if (threadIdx.x < 32 && item < n_items) {
      const Item first = item_at<kRows>(a, item);
      rope_at = gemv_rope_ahead<kRows, kCols>(a, freqs, first.part_index, first.row0, first.part.n, first.q0,
                                              first.cols);
    }
  }
  pdl_wait();
  if (a.early_trigger) pdl_trigger();
  Item it{};
  XRow x[kCols];
  float acc[kRows][kCols] = {};
  while (item < n_items) {
    if (seg == 0) {
      it = kKeepItem ? next : item_at<kRows>(a, item);  // issued last
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const int64_t i = divmod(it.q0 + min(c, it.cols - 1), a.x_div).q;
        x[c] = {a.xq + i * (a.k / 4), a.xds + i * (a.k / 32)};
      }
    }
    unsigned next_item = item;
    int next_seg = seg + 1;
    if (next_seg == n_seg) next_seg = 0, next_item += gridDim.x;
    issue(next_item, next_seg, slot ^ 1);
    if constexpr (kRope != kNoRope) {
      if (next_seg == 0 && next_item < n_items && threadIdx.x < 32) {
        const Item n = kKeepItem ? next : item_at<kRows>(a, next_item);
        rope_next = gemv_rope_ahead<kRows, kCols>(a, freqs, n.part_index, n.row0, n.part.n, n.q0, n.cols);
      }
    }
    if (next_item >= n_items)
      pdl_trigger();  // this block's weights are on their way: the next kernel may start
    cp_async_wait<1>();
    __syncthreads();  // every thread's copies of this segment have landed
    const uint8_t* buf = stage + slot * (kRows * kSeg);
    if constexpr (S::kTable) {
      // A super-block's table a thread, or a part of one (S::kParts): with the 8B's rows of 8, each thread
      // writes one super-block of Q4_K or half of one of Q6_K.
      constexpr unsigned kP = S::kParts;
      const auto n_sb = static_cast<unsigned>(min(int64_t{kSbSeg}, a.k / 256 - int64_t{seg} * kSbSeg));
      for (unsigned e = threadIdx.x; e < unsigned{kRows * kSbSeg} * kP; e += kGemvThreads) {
        const unsigned i = e / kP;
        if (i % kSbSeg < n_sb)
          S::template table<A>(buf + (i / kSbSeg) * kSeg, i % kSbSeg, e % kP, table + 16 * i);
      }
      __syncthreads();  // the table is written
    }
    const int64_t u = int64_t{seg} * kGemvThreads + threadIdx.x;
    if (u < n_units) {
      if constexpr (kCols == 1) {
        const typename Q::X xv = Q::load_x(u, x[0]);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const typename Q::W w = S::template load<A>(buf + r * kSeg, table + r * kSbSeg * 16, threadIdx.x);
          acc[r][0] = __fadd_rn(acc[r][0], Q::dot(w, xv));
        }
      } else {
        typename Q::W w[kRows];
#pragma unroll
        for (int r = 0; r < kRows; ++r)
          w[r] = S::template load<A>(buf + r * kSeg, table + r * kSbSeg * 16, threadIdx.x);
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          if (c < it.cols) {  // (not a break: the loop unrolls, and x stays in registers)
            const typename Q::X xv = Q::load_x(u, x[c]);
#pragma unroll
            for (int r = 0; r < kRows; ++r) acc[r][c] = __fadd_rn(acc[r][c], Q::dot(w[r], xv));
          }
        }
      }
    }
    if (next_seg == 0) {  // the item's last segment
      if constexpr (kRope != kNoRope) {
        rope_at.part = it.part_index + a.rope.first_part;
        gemv_store<kRows, kCols, false, kRope>(acc, red, it.part, a.dst_type, it.row0, it.q0, it.cols, a.pair,
                                               a.more[0], a.rope, freqs, rope_at);
        rope_at = rope_next;
      } else {
        gemv_store(acc, red, it.part, a.dst_type, it.row0, it.q0, it.cols, a.pair, a.more[0]);
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
#pragma unroll
        for (int c = 0; c < kCols; ++c) acc[r][c] = 0.0f;
      }
    }
    __syncthreads();  // the slot, the table and red are written again
    item = next_item, seg = next_seg, slot ^= 1;
  }
}

template <DType T, int kCols, int kRows, int kRope>
void launch_staged(const Context& ctx, const GemvArgs& a, int64_t row_blocks, const RopeArg<kRope>& freqs) {
  const auto kernel = gemv_staged_kernel<T, kCols, kRows, kRope>;
  constexpr size_t smem = 2 * kRows * seg_bytes<T>();
  // Blocks a multiprocessor holds (registers, the two slots and the table): the grid is that many a
  // multiprocessor, or fewer when there are fewer items (or CudaOptions::staged_gemv_grid says fewer).
  static const int per_sm = [&] {
    int b = 0;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)) !=
            cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, kGemvThreads, smem) != cudaSuccess) {
      (void)cudaGetLastError();
      b = 1;
    }
    return std::max(b, 1);
  }();
  const int64_t cap = ctx.options.staged_gemv_grid > 0 ? ctx.options.staged_gemv_grid : int64_t{0x7fffffff};
  const int64_t items = row_blocks * a.n_groups;
  const int64_t grid = std::min({items, int64_t{per_sm} * std::max(ctx.n_sms, 1), cap});
  (void)launch_kernel(ctx, kernel, dim3(static_cast<unsigned>(grid)), dim3(kGemvThreads), smem, a,
                      static_cast<unsigned>(items), freqs);
}

}  // namespace

template <DType T, int kCols, int kRows>
void launch_gemv_staged(const Context& ctx, const GemvArgs& a, int64_t row_blocks, const RopeFreqs* rope) {
  if constexpr (kRows % 2 == 0) {
    if (a.rope.on && a.rope.q8_block != 0)
      return launch_staged<T, kCols, kRows, kRopeQ8>(ctx, a, row_blocks, *rope);
    if (a.rope.on) return launch_staged<T, kCols, kRows, kRopeFloat>(ctx, a, row_blocks, *rope);
  }
  launch_staged<T, kCols, kRows, kNoRope>(ctx, a, row_blocks, NoRope{});
}

// The types with an integer path (KILN_CUDA_Q8_TYPES) are the staged ones (kStagedType).
#define KILN_STAGED(name)                                                                                  \
  static_assert(kStagedType<DType::name>);                                                                 \
  template void launch_gemv_staged<DType::name, 1, 8>(const Context&, const GemvArgs&, int64_t,            \
                                                      const RopeFreqs*);                                   \
  template void launch_gemv_staged<DType::name, 1, 4>(const Context&, const GemvArgs&, int64_t,            \
                                                      const RopeFreqs*);                                   \
  template void launch_gemv_staged<DType::name, 1, 2>(const Context&, const GemvArgs&, int64_t,            \
                                                      const RopeFreqs*);                                   \
  template void launch_gemv_staged<DType::name, 1, 1>(const Context&, const GemvArgs&, int64_t,            \
                                                      const RopeFreqs*);                                   \
  template void launch_gemv_staged<DType::name, 4, 4>(const Context&, const GemvArgs&, int64_t,            \
                                                      const RopeFreqs*);                                   \
  template void launch_gemv_staged<DType::name, kGemvMaxCols, 4>(const Context&, const GemvArgs&, int64_t, \
                                                                 const RopeFreqs*);
KILN_CUDA_Q8_TYPES(KILN_STAGED)
#undef KILN_STAGED

}  // namespace kiln::cuda
