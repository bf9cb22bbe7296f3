// What cuBLAS offers for the batched-decode GEMMs of a Llama-3-8B layer: bf16 weights (W^T, k x n) times bf16
// x (k x m), f32 out, as src/backends/cuda/matmul/matmul_gemm.cu's gemm() calls it. For each shape and token
// count, the time a call of cublasGemmEx's default, then of every algorithm cuBLASLt's heuristic returns (up
// to 16, each with its config: algo id, tile id, split-k), weights cycled past the L2 cache; % of the card's
// copy bandwidth (read + write of a 1 GiB device copy). Standalone (cuBLAS only), built and run on the GPU
// machine by `scripts/gpu-check.sh ltprobe`:
//   nvcc -O2 -arch=sm_90a -std=c++20 bench/cublaslt_probe.cu -lcublasLt -lcublas -o cublaslt_probe
//   cublaslt_probe [KxN ...]   (default: the 8B's q, k/v, q+k+v, gate, gate+up, down)
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

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::pair<int, int>> shapes;
  for (int i = 1; i < argc; ++i) {
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
      cublasLtMatmulPreference_t pref = nullptr;
      CHECK(cublasLtMatmulPreferenceCreate(&pref));
      CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWorkspace,
                                                 sizeof kWorkspace));
      cublasLtMatmulHeuristicResult_t found[16] = {};
      int n_found = 0;
      CHECK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 16, found, &n_found));
      double best = 1e30;
      std::string algos;
      for (int i = 0; i < n_found; ++i) {
        if (found[i].state != CUBLAS_STATUS_SUCCESS) continue;
        const double us = timer.us(weights, [&](void* w) {
          CHECK(cublasLtMatmul(lt, desc, &one, w, la, x, lb, &zero, d, lc, d, lc, &found[i].algo, workspace,
                               kWorkspace, stream));
        });
        best = std::min(best, us);
        int id = -1, tile = -1, split = -1;
        size_t written = 0;
        cublasLtMatmulAlgoConfigGetAttribute(&found[i].algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id,
                                             &written);
        cublasLtMatmulAlgoConfigGetAttribute(&found[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile,
                                             &written);
        cublasLtMatmulAlgoConfigGetAttribute(&found[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split,
                                             sizeof split, &written);
        char one_algo[64];
        std::snprintf(one_algo, sizeof one_algo, " [%d %d %d %.1f]", id, tile, split, us);
        algos += one_algo;
      }
      const auto share = [&](double us) {
        return 100.0 * static_cast<double>(w_bytes) / (us * 1e-6) / bandwidth;
      };
      std::printf("| %d x %d | %d | %.1f | %.0f | %.1f | %.0f |%s |\n", k, n, m, gemm_ex, share(gemm_ex),
                  best, share(best), algos.c_str());
      std::fflush(stdout);
      CHECK(cublasLtMatmulPreferenceDestroy(pref));
      CHECK(cublasLtMatrixLayoutDestroy(la));
      CHECK(cublasLtMatrixLayoutDestroy(lb));
      CHECK(cublasLtMatrixLayoutDestroy(lc));
      CHECK(cublasLtMatmulDescDestroy(desc));
    }
    for (void* w : weights) CHECK(cudaFree(w));
    CHECK(cudaFree(x));
    CHECK(cudaFree(d));
  }
  return 0;
}
