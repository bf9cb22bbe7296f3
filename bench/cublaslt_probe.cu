// What cuBLAS offers for the batched-decode GEMMs of a Llama-3-8B layer: bf16 weights (W^T, k x n) times bf16
// x (k x m), f32 out, as src/backends/cuda/matmul/matmul_gemm.cu's gemm() calls it. For each shape and token
// count, the time a call of cublasGemmEx's default, then of every algorithm cuBLASLt's heuristic returns (up
// to 16, each with its config: algo id, tile id, split-k), weights cycled past the L2 cache; % of the card's
// copy bandwidth (read + write of a 1 GiB device copy). Standalone (cuBLAS only), built and run on the GPU
// machine by `scripts/gpu-check.sh ltprobe`:
//   nvcc -O2 -arch=sm_90a -std=c++20 bench/cublaslt_probe.cu -lcublasLt -lcublas -o cublaslt_probe
//   cublaslt_probe [--fp8 | --fp8-batched | --fp8-plain] [KxN ...]   (default: the 8B's q, k/v, q+k+v, gate,
//   gate+up, down)
// --fp8: the e4m3 GEMM of src/backends/cuda/matmul/fp8_gemm.cu instead (e4m3 weight and x, a scale vector
// each, fast accumulation, f32 out), with the weight's leading dimension k (packed) and k + 16 (the row
// form), every heuristic algorithm and, for those that take it, split-k 2 to 16; m 9 to 64 and 2048.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

void check(int status, const char* what) {
  if (status != 0) {
    std::fprintf(stderr, "%s failed: %d\n", what, status);
    std::exit(1);
  }
}
#define CHECK(call) check(static_cast<int>(call), #call)

constexpr size_t kWorkspace = size_t{32} << 20;  // as the backend's cuBLAS workspace
constexpr int kIterations = 60;

struct Timer {
  cudaStream_t stream;
  cudaEvent_t start, stop;
  // us a call of f(weight) over `iterations` calls, the weights taken in turn, after 5 warm-up calls.
  template <class F>
  double us(const std::vector<void*>& weights, F&& f) {
    for (int i = 0; i < 5; ++i) f(weights[i % weights.size()]);
    CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < kIterations; ++i) f(weights[i % weights.size()]);
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    return 1000.0 * ms / kIterations;
  }
};

double copy_bandwidth(cudaStream_t stream, Timer& t) {
  const size_t bytes = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  CHECK(cudaMalloc(&a, bytes));
  CHECK(cudaMalloc(&b, bytes));
  const std::vector<void*> src = {a};
  const double us =
      t.us(src, [&](void* p) { CHECK(cudaMemcpyAsync(b, p, bytes, cudaMemcpyDeviceToDevice, stream)); });
  CHECK(cudaFree(a));
  CHECK(cudaFree(b));
  return 2.0 * static_cast<double>(bytes) / (us * 1e-6);
}

// Every algorithm cuBLASLt's heuristic offers for a GEMM (up to 16, within the workspace), none where it
// refuses the GEMM.
struct Offered {
  cublasLtMatmulHeuristicResult_t found[16] = {};
  int n = 0;
  const cublasLtMatmulHeuristicResult_t* begin() const { return found; }
  const cublasLtMatmulHeuristicResult_t* end() const { return found + n; }
};
Offered heuristics(cublasLtHandle_t lt, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                   cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc) {
  cublasLtMatmulPreference_t pref = nullptr;
  CHECK(cublasLtMatmulPreferenceCreate(&pref));
  CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWorkspace,
                                             sizeof kWorkspace));
  Offered o;
  if (cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 16, o.found, &o.n) !=
      CUBLAS_STATUS_SUCCESS)
    o.n = 0;
  CHECK(cublasLtMatmulPreferenceDestroy(pref));
  return o;
}

void release(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
             cublasLtMatrixLayout_t lc) {
  CHECK(cublasLtMatrixLayoutDestroy(la));
  CHECK(cublasLtMatrixLayoutDestroy(lb));
  CHECK(cublasLtMatrixLayoutDestroy(lc));
  CHECK(cublasLtMatmulDescDestroy(desc));
}

// An algorithm's id, tile id and split-k count.
struct AlgoConfig {
  int id = -1, tile = -1, split = 1;
};
AlgoConfig config_of(const cublasLtMatmulAlgo_t& algo) {
  AlgoConfig c;
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &c.id, sizeof c.id, &written);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &c.tile, sizeof c.tile, &written);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &c.split, sizeof c.split,
                                       &written);
  return c;
}

// The backend's e4m3 GEMM (lt_gemm): D = A^T B, f32 accumulators in the tensor cores' own (fast
// accumulation), with the outer scale vectors sw (of A's columns) and sx (of B's) unless they are null.
cublasLtMatmulDesc_t fp8_desc(void* sw, void* sx) {
  cublasLtMatmulDesc_t desc = nullptr;
  CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const int8_t fast = 1;
  CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
  CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  if (sw != nullptr) {
    const cublasLtMatmulMatrixScale_t vec = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &vec, sizeof vec));
    CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &vec, sizeof vec));
    CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw, sizeof sw));
    CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sx, sizeof sx));
  }
  return desc;
}

// Copies of an e4m3 weight of w_bytes (every code 1.0), enough of them (400 MB, at least 2) that the timed
// loop reads each from memory, not from L2.
std::vector<void*> e4m3_weights(size_t w_bytes) {
  std::vector<void*> weights(std::max(2, static_cast<int>((size_t{400} << 20) / w_bytes)));
  for (void*& w : weights) {
    CHECK(cudaMalloc(&w, w_bytes));
    CHECK(cudaMemset(w, 0x38, w_bytes));  // e4m3 1.0
  }
  return weights;
}

// The FP8 table: as the backend's lt_gemm, for each algorithm the heuristic returns and each split-k its
// capabilities allow.
int fp8_probe(const std::vector<std::pair<int, int>>& shapes, cudaStream_t stream, cublasLtHandle_t lt,
              void* workspace, Timer& timer, double bandwidth) {
  std::printf(
      "| k x n | lda | m | heuristic's first us | %% | best us | %% | best [id tile split-k] | algos |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---|---|\n");
  const int ms[] = {9, 16, 32, 64, 2048};
  for (const auto [k, n] : shapes) {
    for (const int pad : {0, 16}) {
      const int lda = k + pad;
      const size_t w_bytes = size_t{1} * lda * n;
      const std::vector<void*> weights = e4m3_weights(w_bytes);
      void *x = nullptr, *d = nullptr, *sw = nullptr, *sx = nullptr;
      CHECK(cudaMalloc(&x, size_t{1} * k * 2048));
      CHECK(cudaMemset(x, 0x38, size_t{1} * k * 2048));
      CHECK(cudaMalloc(&d, size_t{4} * n * 2048));
      CHECK(cudaMalloc(&sw, size_t{4} * n));
      CHECK(cudaMalloc(&sx, size_t{4} * 2048));
      CHECK(cudaMemset(sw, 0, size_t{4} * n));
      CHECK(cudaMemset(sx, 0, size_t{4} * 2048));
      for (const int m : ms) {
        cublasLtMatmulDesc_t desc = fp8_desc(sw, sx);
        cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
        CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, k, n, lda));
        CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, k, m, k));
        CHECK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, n, m, n));
        const float one = 1.0f, zero = 0.0f;
        double first = -1, best = 1e30;
        std::string algos, best_cfg;
        const Offered offered = heuristics(lt, desc, la, lb, lc);
        for (const cublasLtMatmulHeuristicResult_t& found : offered) {
          if (found.state != CUBLAS_STATUS_SUCCESS) continue;
          const AlgoConfig cfg = config_of(found.algo);
          const int id = cfg.id, tile = cfg.tile, split0 = cfg.split;
          size_t written = 0;
          int split_cap = 0;
          cublasLtMatmulAlgoCapGetAttribute(&found.algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &split_cap,
                                            sizeof split_cap, &written);
          std::vector<int> splits = {split0};
          if (split_cap != 0 && m <= 64) {
            for (const int s : {1, 2, 3, 4, 6, 8, 12, 16})
              if (s != split0) splits.push_back(s);
          }
          for (const int split : splits) {
            cublasLtMatmulAlgo_t algo = found.algo;
            if (split != split0) {
              cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split,
                                                   sizeof split);
              cublasLtMatmulHeuristicResult_t checked{};
              if (cublasLtMatmulAlgoCheck(lt, desc, la, lb, lc, lc, &algo, &checked) !=
                      CUBLAS_STATUS_SUCCESS ||
                  checked.workspaceSize > kWorkspace) {
                continue;
              }
            }
            const double us = timer.us(weights, [&](void* w) {
              CHECK(cublasLtMatmul(lt, desc, &one, w, la, x, lb, &zero, d, lc, d, lc, &algo, workspace,
                                   kWorkspace, stream));
            });
            if (first < 0) first = us;
            char one_algo[64];
            std::snprintf(one_algo, sizeof one_algo, "[%d %d %d]", id, tile, split);
            if (us < best) best = us, best_cfg = one_algo;
            char timed[80];
            std::snprintf(timed, sizeof timed, " %s %.1f", one_algo, us);
            algos += timed;
          }
        }
        const auto share = [&](double us) {
          return 100.0 * static_cast<double>(size_t{1} * k * n) / (us * 1e-6) / bandwidth;
        };
        if (first < 0) {
          std::printf("| %d x %d | %d | %d | refused | | | | | |\n", k, n, lda, m);
        } else {
          std::printf("| %d x %d | %d | %d | %.1f | %.0f | %.1f | %.0f | %s |%s |\n", k, n, lda, m, first,
                      share(first), best, share(best), best_cfg.c_str(), algos.c_str());
        }
        std::fflush(stdout);
        release(desc, la, lb, lc);
      }
      for (void* w : weights) CHECK(cudaFree(w));
      for (void* p : {x, d, sw, sx}) CHECK(cudaFree(p));
    }
  }
  return 0;
}

// D[j, i] = sum over s of part[s][j, i]: the split-k partials of a batched GEMM reduced (one thread a value).
__global__ void sum_parts(const float* part, int64_t count, int splits, float* d) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= count) return;
  float acc = 0.0f;
  for (int s = 0; s < splits; ++s) acc += part[s * count + e];
  d[e] = acc;
}

// --fp8-batched: split-k done as a strided batch of k-slices (batch s multiplies columns [s k / S, (s + 1) k
// / S) of the weight and of x, into its own n x m partial), the partials then summed by sum_parts; for S = 1
// to 16 at m 16 to 128, the weight in row form (lda k + 16): the best of the algorithms the heuristic offers
// (at S = 1 with each split-k those take), us a call (GEMM + sum), and whether the sum equals the unsplit
// product (weights and x 1.0, scales 1: each value k). With the two scale vectors (outer, the backend's
// GEMM: shared by every batch) or --fp8-plain without them (alpha 1: the scales then applied by the sum).
int fp8_batched_probe(const std::vector<std::pair<int, int>>& shapes, cudaStream_t stream,
                      cublasLtHandle_t lt, void* workspace, Timer& timer, double bandwidth, bool outer) {
  std::printf(
      "%s\n\n| k x n | m | S=1 us | %% | best S | us | %% | each S: best us [id tile split-k] (algos) |\n"
      "|---|---:|---:|---:|---:|---:|---:|---|\n",
      outer ? "outer vector scales" : "no scales (plain e4m3)");
  for (const auto [k, n] : shapes) {
    const int lda = k + 16;
    const size_t w_bytes = size_t{1} * lda * n;
    const std::vector<void*> weights = e4m3_weights(w_bytes);
    constexpr int kMaxM = 128, kMaxSplit = 16;
    void *x = nullptr, *d = nullptr, *part = nullptr, *sw = nullptr, *sx = nullptr;
    CHECK(cudaMalloc(&x, size_t{1} * k * kMaxM));
    CHECK(cudaMemset(x, 0x38, size_t{1} * k * kMaxM));
    CHECK(cudaMalloc(&d, size_t{4} * n * kMaxM));
    CHECK(cudaMalloc(&part, size_t{4} * n * kMaxM * kMaxSplit));
    // Room for a vector a batch, the first 1.0 and the others 2.0: a GEMM that took a batch's own vector
    // (which the backend would have to give) shows as WRONG.
    CHECK(cudaMalloc(&sw, size_t{4} * n * kMaxSplit));
    CHECK(cudaMalloc(&sx, size_t{4} * kMaxM * kMaxSplit));
    for (auto [p, len] : {std::pair{sw, n}, std::pair{sx, kMaxM}}) {
      std::vector<float> v(static_cast<size_t>(len) * kMaxSplit, 2.0f);
      std::fill(v.begin(), v.begin() + len, 1.0f);
      CHECK(cudaMemcpy(p, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    }
    for (const int m : {16, 32, 64, 128}) {
      double first = -1, best = 1e30;
      int best_s = 0;
      std::string each;
      for (const int split : {1, 2, 3, 4, 6, 8, 12, 16}) {
        if (k % (16 * split) != 0) continue;
        const int64_t ks = k / split;
        cublasLtMatmulDesc_t desc = outer ? fp8_desc(sw, sx) : fp8_desc(nullptr, nullptr);
        cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
        CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, ks, n, lda));
        CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, ks, m, k));
        CHECK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, n, m, n));
        if (split > 1) {
          const int32_t batch = split;
          const int64_t a_off = ks, b_off = ks, c_off = int64_t{n} * m;
          for (auto [l, off] : {std::pair{la, a_off}, std::pair{lb, b_off}, std::pair{lc, c_off}}) {
            CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                                   sizeof batch));
            CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &off,
                                                   sizeof off));
          }
        }
        // The algorithms to time: each offered, at S = 1 also with each split-k it takes.
        cublasLtMatmulAlgo_t algos[96];
        int n_algos = 0;
        for (const cublasLtMatmulHeuristicResult_t& h : heuristics(lt, desc, la, lb, lc)) {
          if (h.state != CUBLAS_STATUS_SUCCESS) continue;
          algos[n_algos++] = h.algo;
          size_t written = 0;
          int split_cap = 0;
          cublasLtMatmulAlgoCapGetAttribute(&h.algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &split_cap,
                                            sizeof split_cap, &written);
          if (split != 1 || split_cap == 0) continue;
          for (const int sk : {2, 4, 8, 16}) {
            cublasLtMatmulAlgo_t a = h.algo;
            cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk, sizeof sk);
            cublasLtMatmulHeuristicResult_t checked{};
            if (cublasLtMatmulAlgoCheck(lt, desc, la, lb, lc, lc, &a, &checked) == CUBLAS_STATUS_SUCCESS &&
                checked.workspaceSize <= kWorkspace)
              algos[n_algos++] = a;
          }
        }
        char cell[128];
        if (n_algos == 0) {
          std::snprintf(cell, sizeof cell, " S%d refused", split);
          each += cell;
          release(desc, la, lb, lc);
          continue;
        }
        const float one = 1.0f, zero = 0.0f;
        float* out = split == 1 ? static_cast<float*>(d) : static_cast<float*>(part);
        const int64_t count = int64_t{n} * m;
        double s_best = 1e30;
        AlgoConfig s_cfg;
        bool s_ok = true;
        for (int ai = 0; ai < n_algos; ++ai) {
          const cublasLtMatmulAlgo_t& algo = algos[ai];
          const auto call = [&](void* w) {
            CHECK(cublasLtMatmul(lt, desc, &one, static_cast<char*>(w) + 16, la, x, lb, &zero, out, lc, out,
                                 lc, &algo, workspace, kWorkspace, stream));
            if (split > 1)
              sum_parts<<<static_cast<unsigned>((count + 255) / 256), 256, 0, stream>>>(
                  static_cast<float*>(part), count, split, static_cast<float*>(d));
          };
          CHECK(cudaMemset(d, 0, size_t{4} * count));
          call(weights[0]);
          CHECK(cudaStreamSynchronize(stream));
          std::vector<float> host(static_cast<size_t>(count));
          CHECK(cudaMemcpy(host.data(), d, host.size() * 4, cudaMemcpyDeviceToHost));
          // The 16 bytes before each row are the weight's (row form) header here, also 1.0: the product
          // is k.
          s_ok = s_ok &&
                 std::all_of(host.begin(), host.end(), [&](float v) { return v == static_cast<float>(k); });
          const double us = timer.us(weights, call);
          if (us < s_best) s_best = us, s_cfg = config_of(algo);
        }
        if (split == 1) first = s_best;
        if (s_best < best) best = s_best, best_s = split;
        std::snprintf(cell, sizeof cell, " S%d %.1f%s [%d %d %d] (%d)", split, s_best, s_ok ? "" : " WRONG",
                      s_cfg.id, s_cfg.tile, s_cfg.split, n_algos);
        each += cell;
        release(desc, la, lb, lc);
      }
      const auto share = [&](double us) {
        return 100.0 * static_cast<double>(size_t{1} * k * n) / (us * 1e-6) / bandwidth;
      };
      std::printf("| %d x %d | %d | %.1f | %.0f | %d | %.1f | %.0f |%s |\n", k, n, m, first, share(first),
                  best_s, best, share(best), each.c_str());
      std::fflush(stdout);
    }
    for (void* w : weights) CHECK(cudaFree(w));
    for (void* p : {x, d, part, sw, sx}) CHECK(cudaFree(p));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::pair<int, int>> shapes;
  bool fp8 = false, fp8_batched = false, fp8_plain = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--fp8") {
      fp8 = true;
      continue;
    }
    if (std::string(argv[i]) == "--fp8-batched" || std::string(argv[i]) == "--fp8-plain") {
      fp8_batched = true;
      fp8_plain = std::string(argv[i]) == "--fp8-plain";
      continue;
    }
    int k = 0, n = 0;
    if (std::sscanf(argv[i], "%dx%d", &k, &n) != 2 || k <= 0 || n <= 0) {
      std::fprintf(stderr, "%s is not KxN\n", argv[i]);
      return 2;
    }
    shapes.emplace_back(k, n);
  }
  if (shapes.empty())
    shapes = {{4096, 4096}, {4096, 1024}, {4096, 6144}, {4096, 14336}, {4096, 28672}, {14336, 4096}};
  const int ms[] = {9, 16, 32, 64};

  cudaStream_t stream = nullptr;
  CHECK(cudaStreamCreate(&stream));
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;
  CHECK(cublasCreate(&blas));
  CHECK(cublasLtCreate(&lt));
  void* workspace = nullptr;
  CHECK(cudaMalloc(&workspace, kWorkspace));
  CHECK(cublasSetWorkspace(blas, workspace, kWorkspace));
  CHECK(cublasSetStream(blas, stream));
  Timer timer{stream, nullptr, nullptr};
  CHECK(cudaEventCreate(&timer.start));
  CHECK(cudaEventCreate(&timer.stop));
  const double bandwidth = copy_bandwidth(stream, timer);
  std::printf("copy bandwidth %.0f GB/s\n\n", bandwidth / 1e9);
  if (fp8) return fp8_probe(shapes, stream, lt, workspace, timer, bandwidth);
  if (fp8_batched) return fp8_batched_probe(shapes, stream, lt, workspace, timer, bandwidth, !fp8_plain);
  std::printf(
      "| k x n | m | cublasGemmEx us | %% | best of cuBLASLt us | %% | algos: [id tile split-k us] |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---|\n");

  for (const auto [k, n] : shapes) {
    const size_t w_bytes = size_t{2} * k * n;
    const int copies = std::max(2, static_cast<int>((size_t{400} << 20) / w_bytes));  // past the 50 MB L2
    std::vector<void*> weights(copies);
    for (void*& w : weights) {
      CHECK(cudaMalloc(&w, w_bytes));
      CHECK(cudaMemset(w, 0, w_bytes));
    }
    void *x = nullptr, *d = nullptr;
    CHECK(cudaMalloc(&x, size_t{2} * k * 64));
    CHECK(cudaMemset(x, 0, size_t{2} * k * 64));
    CHECK(cudaMalloc(&d, size_t{4} * n * 64));
    const float one = 1.0f, zero = 0.0f;
    for (const int m : ms) {
      const double gemm_ex = timer.us(weights, [&](void* w) {
        CHECK(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, w, CUDA_R_16BF, k, x, CUDA_R_16BF,
                           k, &zero, d, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      });
      cublasLtMatmulDesc_t desc = nullptr;
      CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
      CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
      CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
      cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
      CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, k, n, k));
      CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, m, k));
      CHECK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, n, m, n));
      double best = 1e30;
      std::string algos;
      const Offered offered = heuristics(lt, desc, la, lb, lc);
      for (const cublasLtMatmulHeuristicResult_t& found : offered) {
        if (found.state != CUBLAS_STATUS_SUCCESS) continue;
        const double us = timer.us(weights, [&](void* w) {
          CHECK(cublasLtMatmul(lt, desc, &one, w, la, x, lb, &zero, d, lc, d, lc, &found.algo, workspace,
                               kWorkspace, stream));
        });
        best = std::min(best, us);
        const AlgoConfig cfg = config_of(found.algo);
        char one_algo[64];
        std::snprintf(one_algo, sizeof one_algo, " [%d %d %d %.1f]", cfg.id, cfg.tile, cfg.split, us);
        algos += one_algo;
      }
      const auto share = [&](double us) {
        return 100.0 * static_cast<double>(w_bytes) / (us * 1e-6) / bandwidth;
      };
      std::printf("| %d x %d | %d | %.1f | %.0f | %.1f | %.0f |%s |\n", k, n, m, gemm_ex, share(gemm_ex),
                  best, share(best), algos.c_str());
      std::fflush(stdout);
      release(desc, la, lb, lc);
    }
    for (void* w : weights) CHECK(cudaFree(w));
    CHECK(cudaFree(x));
    CHECK(cudaFree(d));
  }
  return 0;
}
