// The e4m3 GEMM of a decode batch (9 to 64 rows of x) on Hopper's warpgroup tensor-core instruction (wgmma,
// sm_90a), in place of cuBLASLt's for those rows: D[i, j] = sx[i] sw[j] sum_k qx[i, k] qw[j, k].
//
// At 64 rows an 8B-shaped layer's GEMMs are bound by the weights' bytes (a 4096 x 4096 weight is 16.8 MB
// against 2.1 GFLOP), and cuBLASLt's e4m3 kernels tile D by 128 x 128 with no split of k: such a weight runs
// on 32 of an H100's 132 multiprocessors. Here a block takes 128 weight rows over a slice of k, and the
// slices of one tile (up to 8) form a thread-block cluster whose blocks sum their partial tiles through
// distributed shared memory, in rank order: every multiprocessor streams weights, no partial tile goes
// through global memory, and the sum is the same bits from run to run. The split is the largest (up to the
// tiles' share of the multiprocessors' block slots) whose clusters the device holds all at once: 32 clusters
// of 8 where 30 fit took a second wave for the last two, and twice the time.
//
// A block is one warpgroup (128 threads). Stage by stage (128 bytes of k), one thread has the tensor memory
// accelerator bring the 128 weight rows and the 64 rows of x (zeros past m, n and k) into shared memory in
// the 128-byte swizzle that the instruction reads, counted on the stage's mbarrier; four stages in flight.
// (The same stages by 16-byte cp.async from every thread ran 1.4 to 1.8 times as long.) Four m64n128k32
// products a stage accumulate in f32 registers.
#include <cooperative_groups.h>
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_launch.cuh"
#include "backends/cuda/matmul/matmul.cuh"
#include "backends/cuda/wgmma.cuh"

namespace kiln::cuda {

namespace {

constexpr int kRows = 64;      // rows of x a block (the instruction's m)
constexpr int kN = 128;        // weight rows a block (the instruction's n)
constexpr int kStageK = 128;   // bytes of k a stage: one swizzled row
constexpr int kStages = 4;     // stages in flight
constexpr int kThreads = 128;  // one warpgroup
constexpr int kMaxSplit = 8;   // the portable cluster size
constexpr int kWBytes = kN * kStageK, kXBytes = kRows * kStageK, kStageBytes = kWBytes + kXBytes;
// The stages and 1 KB to align them (96 KB, two blocks a multiprocessor).
constexpr int kSmem = kStages * kStageBytes + 1024;
// A rank's partial rows from every slice of its cluster (split x ceil(m / split) rows, at most 64 + split),
// over the stages once they are done: rows of kN + 8 floats, so that a warp's float2 stores (8 rows, 4 column
// pairs) land in distinct banks.
constexpr int kPartStride = kN + 8;
static_assert((kRows + kMaxSplit) * kPartStride * 4 <= kStages * kStageBytes);

#ifdef KILN_WGMMA
__device__ __forceinline__ void mbar_init(uint32_t bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_expect(uint32_t bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_wait(uint32_t bar, unsigned parity) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// The box at (byte c, row r) of the 2-D tensor `map` into shared memory at `dst`, counted on `bar`.
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap& map, int c, int r, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
      "[%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(c), "r"(r), "r"(bar)
      : "memory");
}
#endif

// Block (rank, tile): D's columns [kN tile, kN tile + kN) over k's stages [rank KB / S, (rank + 1) KB / S)
// (KB = ceil(k / 128), S = gridDim.x, the cluster), summed with the cluster's other partial tiles; rank r
// writes rows [r ceil(m / S), (r + 1) ceil(m / S)) of D. `w_constant`: the weights do not change while the
// stream runs, so their first stages are asked for before the wait on the kernels that wrote x.
__global__ void __launch_bounds__(kThreads, 2)
    fp8_wgmma_kernel(const __grid_constant__ CUtensorMap wmap, const __grid_constant__ CUtensorMap xmap,
                     const float* __restrict__ sw, bool w_constant, const float* __restrict__ sx, int64_t m,
                     int64_t k, int64_t n, float* __restrict__ d, int64_t ldd) {
#ifdef KILN_WGMMA
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t full[kStages];
  // The swizzled tiles want 1 KB alignment: the launch asks for 1 KB more than the stages.
  const auto raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t base = (raw + 1023) & ~1023u;
  uint8_t* smem = smem_raw + (base - raw);
  const auto bar0 = static_cast<uint32_t>(__cvta_generic_to_shared(full));
  const int64_t split = gridDim.x, rank = blockIdx.x;
  const int j0 = static_cast<int>(blockIdx.y) * kN;
  const int64_t blocks = (k + kStageK - 1) / kStageK;
  const int64_t kb0 = rank * blocks / split, n_stages = (rank + 1) * blocks / split - kb0;
  const bool leader = threadIdx.x == 0;
  if (leader) {
    for (int s = 0; s < kStages; ++s) mbar_init(bar0 + 8 * s, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  }
  __syncthreads();
  if (leader) {
    for (int s = 0; s < kStages && s < n_stages; ++s) {
      mbar_expect(bar0 + 8 * s, kStageBytes);
      if (w_constant) {
        tma_load(base + s * kStageBytes, wmap, static_cast<int>((kb0 + s) * kStageK), j0, bar0 + 8 * s);
      }
    }
  }
  pdl_wait();
  if (leader) {
    for (int s = 0; s < kStages && s < n_stages; ++s) {
      const int c = static_cast<int>((kb0 + s) * kStageK);
      if (!w_constant) tma_load(base + s * kStageBytes, wmap, c, j0, bar0 + 8 * s);
      tma_load(base + s * kStageBytes + kWBytes, xmap, c, 0, bar0 + 8 * s);
    }
  }
  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
  for (int64_t s = 0; s < n_stages; ++s) {
    const int slot = static_cast<int>(s % kStages);
    mbar_wait(bar0 + 8 * slot, static_cast<unsigned>((s / kStages) & 1));
    const uint32_t stage = base + static_cast<uint32_t>(slot) * kStageBytes;
    wgmma_pin(acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kStageK / 32; ++kk) {
      wgmma_e4m3_m64n128k32(acc, smem_desc_sw128(stage + kWBytes + 32 * kk),
                            smem_desc_sw128(stage + 32 * kk));
    }
    wgmma_commit_and_wait();
    wgmma_pin(acc);
    if (const int64_t next = s + kStages; next < n_stages) {
      __syncthreads();  // the warpgroup's products on this slot are done before it is refilled
      if (leader) {
        const int c = static_cast<int>((kb0 + next) * kStageK);
        mbar_expect(bar0 + 8 * slot, kStageBytes);
        tma_load(stage, wmap, c, j0, bar0 + 8 * slot);
        tma_load(stage + kWBytes, xmap, c, 0, bar0 + 8 * slot);
      }
    }
  }
  pdl_trigger();
  // Each row of D is one rank's: the slices' partial rows are sent to it (stores into its shared memory,
  // which do not wait for a reply as loads from it would), and it sums them in rank order.
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every block of the cluster is past its stages, whose memory takes the partial rows
  const int64_t per_rank = (m + split - 1) / split;
  auto* part = reinterpret_cast<float*>(smem);
  // The fragments: warp q holds rows 16 q + lane / 4 (+ 8), columns 8 c + 2 (lane % 4) (+ 1) of each 8-column
  // group c, as acc[4 c .. 4 c + 3].
  const int lane = static_cast<int>(threadIdx.x % 32);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t i = 16 * (threadIdx.x / 32) + lane / 4 + 8 * h;
    if (i >= m) continue;
    float* to = cluster.map_shared_rank(part, static_cast<unsigned>(i / per_rank)) +
                (rank * per_rank + i % per_rank) * kPartStride + 2 * (lane % 4);
#pragma unroll
    for (int c = 0; c < kN / 8; ++c) {
      *reinterpret_cast<float2*>(to + 8 * c) = make_float2(acc[4 * c + 2 * h], acc[4 * c + 2 * h + 1]);
    }
  }
  cluster.sync();
  for (int col = static_cast<int>(threadIdx.x); col < kN; col += kThreads) {
    const int64_t j = j0 + col;
    if (j >= n) break;
    const float w_scale = sw[j];
    for (int64_t q = 0; q < per_rank && rank * per_rank + q < m; ++q) {
      const int64_t i = rank * per_rank + q;
      float sum = 0.0f;
      for (int64_t r = 0; r < split; ++r) sum += part[(r * per_rank + q) * kPartStride + col];
      d[i * ldd + j] = sum * sx[i] * w_scale;
    }
  }
#else
  __trap();  // built without sm_90a: fp8_wgmma_gemm never launches this
#endif
}

// cuTensorMapEncodeTiled, from the driver the runtime loaded (null where it has none).
PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// A 2-D map of `rows` rows of `cols` bytes, `ld` bytes apart, in boxes of 128 bytes x `box_rows` rows in the
// 128-byte swizzle; reads past the tensor give zeros.
bool encode_map(CUtensorMap* map, const void* data, int64_t cols, int64_t rows, int64_t ld,
                unsigned box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = encode_tiled();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld)};
  const cuuint32_t box[2] = {kStageK, box_rows}, elem[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(data), dims, strides, box, elem,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The most clusters of `split` blocks of `kernel` (`smem` bytes each) that the device holds at once.
int max_active_clusters(const void* kernel, int smem, int64_t split, int64_t tiles) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int64_t>, int> known;  // (device, kernel, split)
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  const std::lock_guard lock(mu);
  const auto key = std::make_tuple(device, kernel, split);
  if (const auto it = known.find(key); it != known.end()) return it->second;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(split), static_cast<unsigned>(tiles));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim = {static_cast<unsigned>(split), 1, 1};
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) {
    cudaGetLastError();
    n = 0;
  }
  known.emplace(key, n);
  return n;
}

// Whether this build holds the kernel for the device: 1 yes, 0 no, -1 not asked yet.
std::atomic<int> built_for_device{-1};

}  // namespace

bool fp8_wgmma_applies(const Context& ctx, int64_t m) {
  if (!ctx.wgmma || !ctx.options.wgmma || m <= kGemvMaxCols || m > kRows) return false;
  int built = built_for_device.load();
  if (built < 0) {
    cudaFuncAttributes attr{};
    built = cudaFuncGetAttributes(&attr, fp8_wgmma_kernel) == cudaSuccess && attr.binaryVersion == 90 &&
                    encode_tiled() != nullptr
                ? 1
                : 0;
    built_for_device.store(built);
  }
  return built == 1;
}

cudaError_t fp8_wgmma_gemm(const Context& ctx, const Fp8Operands& o) {
  CUtensorMap wmap, xmap;
  if (!encode_map(&wmap, o.w, o.k, o.n, o.ldw, kN) || !encode_map(&xmap, o.x, o.k, o.m, o.k, kRows)) {
    return cudaErrorNotSupported;
  }
  const auto* key = reinterpret_cast<const void*>(fp8_wgmma_kernel);
  if (const cudaError_t e = allow_dynamic_shared(key, kSmem); e != cudaSuccess) return e;
  // The tiles' share of the multiprocessors' block slots (two each), at most a cluster's worth and one stage
  // a block; less while the device cannot hold all the clusters at once. The split depends on the shape
  // alone, never on m.
  const int64_t tiles = (o.n + kN - 1) / kN, blocks = (o.k + kStageK - 1) / kStageK;
  int64_t split = std::clamp<int64_t>(2 * ctx.n_sms / tiles, 1, std::min<int64_t>(kMaxSplit, blocks));
  while (split > 1 && max_active_clusters(key, kSmem, split, tiles) < tiles) --split;
  return launch_kernel_cluster(ctx, fp8_wgmma_kernel,
                               dim3(static_cast<unsigned>(split), static_cast<unsigned>(tiles)),
                               dim3(kThreads), kSmem, static_cast<unsigned>(split), wmap, xmap, o.w_scales,
                               o.w_constant, o.x_scales, o.m, o.k, o.n, o.d, o.ldd);
}

}  // namespace kiln::cuda
