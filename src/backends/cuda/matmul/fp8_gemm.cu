// The FP8 tensor-core GEMM of f8_e4m3 weights (FP8 checkpoints) at the fast precision, beyond the GEMV's
// columns: vLLM's W8A8 FP8 scheme, per-channel weights and dynamic per-token activations.
//
// - A weight in row form (the backend's form for a checkpoint with one scale a row: per channel, per tensor;
//   Quant<f8_e4m3>) is multiplied where it lies, its codes a matrix of leading dimension nb1 (copied packed
//   into scratch first where cuBLASLt refuses that); only its scales are gathered into one vector. Any other
//   (a scale a block of 32: 128 x 128 block checkpoints, or a weight not prepared) is rewritten into scratch
//   as plain e4m3 rows and one f32 scale a row, the row's largest block scale, a block of a smaller scale
//   rounded again to it.
// - x is rounded per token to e4m3 with the scale amax / 448, or with the checkpoint's static scale
//   (ops::Weight::input_scale) where it has one.
// - cuBLASLt multiplies the codes on the e4m3 tensor cores with f32 accumulation and applies both scale
//   vectors to the accumulators (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F): D[j, i] = sw[j] sx[i] sum_k
//   qw[j, k] qx[i, k], in f32, rounded once to dst's type. A decode batch's 9 to 64 rows on Hopper take
//   fp8_wgmma.cu's kernel instead, the same products split over k across the whole device.
// Rounding x to 3 mantissa bits costs about 2.5% relative error a product: the backend's fast tolerance for
// this weight type (Backend::fast_tolerance).
#include <cublasLt.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <compare>
#include <cstdint>
#include <map>
#include <mutex>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/matmul/dequant.cuh"
#include "backends/cuda/matmul/fp8_round.cuh"
#include "backends/cuda/matmul/matmul.cuh"

namespace kiln::cuda {

namespace {

constexpr int kThreads = 256;
constexpr size_t kLtWorkspace = size_t{32} << 20;

// Row j of the weight (k / 32 blocks of 36 bytes, a scale and 32 codes, at w + j * nb1: the file's form) as k
// codes at codes + j * k, and its scale.
__global__ void fp8_weight_rows(const uint8_t* w, int64_t nb1, int64_t k, uint8_t* codes, float* scales) {
  __shared__ float smem[32];
  const int64_t j = blockIdx.x;
  const uint8_t* row = w + j * nb1;
  const int64_t n_blocks = k / 32;
  const auto scale_of = [&](int64_t b) { return *reinterpret_cast<const float*>(row + b * 36); };
  float d_max = 0.0f;
  for (int64_t b = threadIdx.x; b < n_blocks; b += blockDim.x) d_max = fmaxf(d_max, scale_of(b));
  d_max = block_max(d_max, smem);
  if (threadIdx.x == 0) scales[j] = d_max;
  uint8_t* out = codes + j * k;
  for (int64_t e = threadIdx.x; e < k; e += blockDim.x) {
    const float d = scale_of(e / 32);
    const uint8_t q = row[(e / 32) * 36 + 4 + e % 32];
    out[e] = d == d_max || d_max == 0.0f ? q : fp8_code(__fmul_rn(d, e4m3_to_f32(q)), d_max);
  }
}

// The scales of the n rows of a weight in row form (the f32 at byte 12 of each row) as one vector.
__global__ void fp8_row_scales(const uint8_t* w, int64_t nb1, int64_t n, float* scales) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j < n) scales[j] = *reinterpret_cast<const float*>(w + j * nb1 + 12);
}

// Row i of x (blockIdx.x) as k e4m3 codes at codes + i * k (k a multiple of 4), and its scale: `fixed` (a
// static scale, x / fixed saturating at 448), else amax / 448 (1 for a row of zeros). A decode batch's rows
// are few blocks: each thread loads its kXVec groups of 4 at once
// and keeps them for the rounding, so that a block waits on memory once (a loop of dependent loads took
// about 30 us a row of 4096 on an H100, longer than the GEMM); k past kXThreads * kXVec * 4 is read again.
constexpr int kXThreads = 1024, kXVec = 4;
template <bool kVec>
__device__ __forceinline__ float4 x_group(const float* row, int64_t e) {
  if constexpr (kVec) return __ldg(reinterpret_cast<const float4*>(row + e));
  return make_float4(row[e], row[e + 1], row[e + 2], row[e + 3]);
}
template <bool kVec>
__global__ void __launch_bounds__(kXThreads)
    fp8_x_rows(Rows x, int64_t k, float fixed, uint8_t* codes, float* scales) {
  __shared__ float smem[32];
  const int64_t i = blockIdx.x;
  const float* row = x.row_as<const float>(i);
  const int64_t per_pass = 4 * static_cast<int64_t>(kXThreads) * kXVec;
  float4 v[kXVec];
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < kXVec; ++j) {
    const int64_t e = 4 * (threadIdx.x + static_cast<int64_t>(j) * kXThreads);
    v[j] = e < k ? x_group<kVec>(row, e) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    amax = amax4(amax, v[j]);
  }
  if (fixed <= 0.0f) {  // the same for every thread of the grid
    for (int64_t e = per_pass + 4 * threadIdx.x; e < k; e += 4 * kXThreads)
      amax = amax4(amax, x_group<kVec>(row, e));
    amax = block_max(amax, smem);
  }
  const float s = fp8_row_scale(amax, fixed);
  if (threadIdx.x == 0) scales[i] = s;
  uint8_t* out = codes + i * k;
  const auto put = [&](int64_t e, float4 u) {
    *reinterpret_cast<uint32_t*>(out + e) = fp8_codes4(u.x, u.y, u.z, u.w, s);
  };
#pragma unroll
  for (int j = 0; j < kXVec; ++j) {
    const int64_t e = 4 * (threadIdx.x + static_cast<int64_t>(j) * kXThreads);
    if (e < k) put(e, v[j]);
  }
  for (int64_t e = per_pass + 4 * threadIdx.x; e < k; e += 4 * kXThreads) put(e, x_group<kVec>(row, e));
}

struct LtDesc {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtDesc() {
    if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

bool lt_ok(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }

// Set once cuBLASLt refused an FP8 GEMM: the process's later ones take the dequantizing path at once. Set
// once it refused a row-form weight's codes where they lie (leading dimension k + 16): later ones copy them
// into scratch first.
std::atomic<bool> refused{false}, refused_in_place{false};

// cuBLASLt's algorithm for a GEMM shape, asked of its heuristic once (a call of the heuristic costs far more
// host time than the GEMM's launch, and a prompt's steps, not replayed as graphs, call every weight's GEMM),
// for operands aligned to 16 bytes at least (kLtAlign: each call's are).
struct AlgoKey {
  const void* lt;
  int64_t n, m, k, lda, ldd;
  auto operator<=>(const AlgoKey&) const = default;
};
std::mutex algo_mutex;
std::map<AlgoKey, cublasLtMatmulAlgo_t> algos;
constexpr uint32_t kLtAlign = 16;

// The GEMM of `o` on the e4m3 tensor cores, column-major: A = the weight's codes (k x n, leading dimension
// ldw) transposed, B = x's codes (k x m), D (n x m), each operand with its vector of scales; false where
// cuBLASLt takes no such GEMM.
// The products accumulate in the tensor cores' own accumulators (CUBLASLT_MATMUL_DESC_FAST_ACCUM), without
// the promotion to f32 every few blocks of k: inference's choice (vLLM's, TensorRT-LLM's), well inside this
// path's tolerance.
bool lt_gemm(const Context& ctx, const Fp8Operands& o, void* workspace) {
  LtDesc desc;
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const cublasLtMatmulMatrixScale_t outer = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  const void* a_scale = o.w_scales;
  const void* b_scale = o.x_scales;
  const uint64_t ws_bytes = kLtWorkspace;
  const int8_t fast_accum = 1;
  bool ok = lt_ok(cublasLtMatmulDescCreate(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F)) &&
            lt_ok(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum,
                                                 sizeof fast_accum)) &&
            lt_ok(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta)) &&
            lt_ok(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb)) &&
            lt_ok(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &outer,
                                                 sizeof outer)) &&
            lt_ok(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &outer,
                                                 sizeof outer)) &&
            lt_ok(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale,
                                                 sizeof a_scale)) &&
            lt_ok(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale,
                                                 sizeof b_scale)) &&
            lt_ok(cublasLtMatrixLayoutCreate(&desc.a, CUDA_R_8F_E4M3, static_cast<uint64_t>(o.k),
                                             static_cast<uint64_t>(o.n), o.ldw)) &&
            lt_ok(cublasLtMatrixLayoutCreate(&desc.b, CUDA_R_8F_E4M3, static_cast<uint64_t>(o.k),
                                             static_cast<uint64_t>(o.m), o.k)) &&
            lt_ok(cublasLtMatrixLayoutCreate(&desc.d, CUDA_R_32F, static_cast<uint64_t>(o.n),
                                             static_cast<uint64_t>(o.m), o.ldd));
  if (!ok) return false;
  const auto lt = static_cast<cublasLtHandle_t>(ctx.lt());
  const AlgoKey key{lt, o.n, o.m, o.k, o.ldw, o.ldd};
  cublasLtMatmulAlgo_t algo{};
  bool cached = false;
  {
    const std::lock_guard lock(algo_mutex);
    if (const auto it = algos.find(key); it != algos.end()) algo = it->second, cached = true;
  }
  if (!cached) {
    const auto pref = [&](cublasLtMatmulPreferenceAttributes_t a, const auto& v) {
      return lt_ok(cublasLtMatmulPreferenceSetAttribute(desc.pref, a, &v, sizeof v));
    };
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    if (!lt_ok(cublasLtMatmulPreferenceCreate(&desc.pref)) ||
        !pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, ws_bytes) ||
        !pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, kLtAlign) ||
        !pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, kLtAlign) ||
        !pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, kLtAlign) ||
        !pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, kLtAlign) ||
        !lt_ok(cublasLtMatmulAlgoGetHeuristic(lt, desc.op, desc.a, desc.b, desc.d, desc.d, desc.pref, 1,
                                              &heuristic, &found)) ||
        found == 0) {
      return false;
    }
    algo = heuristic.algo;
    const std::lock_guard lock(algo_mutex);
    algos.emplace(key, algo);
  }
  const float one = 1.0f, zero = 0.0f;
  return lt_ok(cublasLtMatmul(lt, desc.op, &one, o.w, desc.a, o.x, desc.b, &zero, o.d, desc.d, o.d, desc.d,
                              &algo, workspace, kLtWorkspace, ctx.stream));
}

}  // namespace

bool fp8_gemm_applies(const Context& ctx, const ops::Matmul& op) {
  const Tensor& w = op.w.tensor;
  return w.type == DType::f8_e4m3 && ctx.fast && !ctx.options.batch_invariant && !refused.load() &&
         ctx.lt() != nullptr && w.ne[0] % 16 == 0 && w.ne[1] % 16 == 0 && w.ne[2] == 1 && w.ne[3] == 1 &&
         op.x.n_rows() > kGemvMaxCols;
}

cudaError_t fp8_x_room(const Context& ctx, int64_t k, int64_t m, float fixed, E4m3Out* out) {
  const int64_t x_codes = (m * k + 255) / 256 * 256;
  auto* xbuf = static_cast<uint8_t*>(ctx.scratch(kSlotX, static_cast<size_t>(x_codes + m * 4)));
  if (xbuf == nullptr) return cudaErrorMemoryAllocation;
  *out = {xbuf, reinterpret_cast<float*>(xbuf + x_codes), fixed};
  return cudaSuccess;
}

cudaError_t fp8_round_x(const Context& ctx, const Tensor& x, float scale, Fp8X* out) {
  const int64_t k = x.ne[0], m = x.n_rows();
  E4m3Out room{};
  if (const cudaError_t e = fp8_x_room(ctx, k, m, scale, &room); e != cudaSuccess) return e;
  const Rows rows = rows_of(x);
  const auto grid = static_cast<unsigned>(m);
  if (rows_aligned16(rows)) {
    fp8_x_rows<true><<<grid, kXThreads, 0, ctx.stream>>>(rows, k, scale, room.codes, room.scales);
  } else {
    fp8_x_rows<false><<<grid, kXThreads, 0, ctx.stream>>>(rows, k, scale, room.codes, room.scales);
  }
  *out = {room.codes, room.scales};
  return cudaGetLastError();
}

float fp8_group_scale(std::span<const ops::Matmul* const> group) {
  float scale = 0.0f;
  for (const ops::Matmul* op : group) {
    if (op->w.input_scale <= 0.0f) return 0.0f;
    scale = std::max(scale, op->w.input_scale);
  }
  return scale;
}

cudaError_t fp8_row_scale_vector(const Context& ctx, const void* rows, int64_t nb1, int64_t n, float* out) {
  fp8_row_scales<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, ctx.stream>>>(
      static_cast<const uint8_t*>(rows), nb1, n, out);
  return cudaGetLastError();
}

cudaError_t fp8_gemm_f32(const Context& ctx, const ops::Weight& weight, const Fp8X& x, int64_t m, float* d,
                         int64_t ldd) {
  const Tensor& w = weight.tensor;
  const bool row_form = grouped(weight);
  const WeightLayout* layout = layout_of(weight);
  const float* row_scales = row_form && layout != nullptr ? layout->row_scales() : nullptr;
  const int64_t k = w.ne[0], n = w.ne[1];
  // Scratch: the weight's codes (unless a row-form weight's are taken where they lie) and scales (slot W),
  // cuBLASLt's workspace. The codes' room is taken whether or not they are copied, so that a step captured
  // as a graph never needs more than its first run.
  const int64_t w_codes = (n * k + 255) / 256 * 256;
  auto* wbuf = static_cast<uint8_t*>(ctx.scratch(kSlotW, static_cast<size_t>(w_codes + n * 4)));
  void* ws = ctx.scratch(kSlotPartial, kLtWorkspace);
  if (wbuf == nullptr || ws == nullptr) return cudaErrorMemoryAllocation;
  auto* w_scales = reinterpret_cast<float*>(wbuf + w_codes);
  const auto* w_rows = static_cast<const uint8_t*>(w.data);
  if (row_scales == nullptr && row_form) {  // else the weight's own vector (WeightLayout)
    fp8_row_scales<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, ctx.stream>>>(
        w_rows, w.nb[1], n, w_scales);
  } else if (!row_form) {
    fp8_weight_rows<<<static_cast<unsigned>(n), kThreads, 0, ctx.stream>>>(w_rows, w.nb[1], k, wbuf,
                                                                           w_scales);
  }
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  const float* a_scales = row_scales != nullptr ? row_scales : w_scales;
  Fp8Operands o{wbuf, k, a_scales, false, x.codes, x.scales, d, ldd, n, m, k};
  if (row_form && aligned(w_rows + 16, 16) && w.nb[1] % 16 == 0) {
    o.w = w_rows + 16;
    o.ldw = w.nb[1];
    o.w_constant = true;
  }
  // 9 to 64 rows on Hopper: the warpgroup kernel (fp8_wgmma.cu), on codes in place or rewritten above;
  // cuBLASLt where the driver encodes no tensor map for the operands or the runtime refuses the cluster
  // launch.
  if ((o.w_constant || !row_form) && fp8_wgmma_applies(ctx, m)) {
    const cudaError_t e = fp8_wgmma_gemm(ctx, o);
    if (e != cudaErrorInvalidClusterSize && e != cudaErrorNotSupported) return e;
    cudaGetLastError();
  }
  bool done = false;
  if (row_form && !refused_in_place.load()) {
    o.w = w_rows + 16;
    o.ldw = w.nb[1];
    done = lt_gemm(ctx, o, ws);
    if (!done) refused_in_place.store(true);
  }
  if (!done && row_form) {  // the codes packed, as a weight in the file's form has them
    if (const cudaError_t e = cudaMemcpy2DAsync(wbuf, static_cast<size_t>(k), w_rows + 16,
                                                static_cast<size_t>(w.nb[1]), static_cast<size_t>(k),
                                                static_cast<size_t>(n), cudaMemcpyDeviceToDevice, ctx.stream);
        e != cudaSuccess) {
      return e;
    }
    o.w = wbuf;
    o.ldw = k;
  }
  if (!done && !lt_gemm(ctx, o, ws)) {
    refused.store(true);
    return cudaErrorNotSupported;
  }
  return cudaSuccess;
}

cudaError_t fp8_gemm(const Context& ctx, const ops::Matmul& op, const Fp8X* rounded) {
  const int64_t n = op.w.tensor.ne[1], m = op.x.n_rows();
  Fp8X x{};
  if (rounded != nullptr) {
    x = *rounded;
  } else if (const cudaError_t e = fp8_round_x(ctx, op.x, op.w.input_scale, &x); e != cudaSuccess) {
    return e;
  }
  float* d = nullptr;
  int64_t ldd = n;
  if (op.dst.type == DType::f32) {  // in place where cuBLASLt takes it: 16-byte aligned columns
    const int64_t ld = leading_dim(op.dst, 4);
    if (ld != 0 && ld % 4 == 0 && aligned(op.dst.data, 16)) d = static_cast<float*>(op.dst.data), ldd = ld;
  }
  const bool via_scratch = d == nullptr;
  if (via_scratch) {
    d = static_cast<float*>(ctx.scratch(kSlotDst, static_cast<size_t>(n * m * 4)));
    if (d == nullptr) return cudaErrorMemoryAllocation;
  }
  if (const cudaError_t e = fp8_gemm_f32(ctx, op.w, x, m, d, ldd); e != cudaSuccess) {
    return e;
  }
  if (!via_scratch) return cudaSuccess;
  return convert_rows(ctx, packed_rows(d, n, m, 4), n, m, rows_of(op.dst), op.dst.type);
}

}  // namespace kiln::cuda
