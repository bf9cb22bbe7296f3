// ops::InverseCholesky on CUDA, in f64 as the contract asks: C = J (a + lambda I) J (J the order reversal)
// written column-major in f64, cuSOLVER's Cholesky factorization C = L0 L0^T (Xpotrf) and the inverse of L0
// (Xtrtri), both in place, then l = J L0^-T J rounded to f32 (l l^T = J C^-1 J = (a + lambda I)^-1, lower).
// The same road as the CPU's (backends/cpu/cpu_linalg.h), on the GPU's f64 units: for n = 14,336 (an 8B
// model's FFN down) about 3 TFLOP, which two CPU cores take minutes for.
//
// The status: 1 when potrf or trtri reports a failure, a pivot L0[j][j]^2 is not above 1e-10 of C[j][j] (read
// back from the inverse's diagonal, 1 / L0[j][j]), or an entry of l is not finite. Scratch: slot 0 holds C
// (n^2 doubles), slot 1 cuSOLVER's workspace, then the two info words and the flag.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "backends/cuda/cuda_kernels.h"

#ifdef KILN_HAVE_CUSOLVER
#include <cusolverDn.h>
#endif

namespace kiln::cuda {

#ifdef KILN_HAVE_CUSOLVER

namespace {

constexpr int kThreads = 256;
constexpr int kSlotMatrix = 0, kSlotWork = 1;

// c[i + j n] (column-major) = C[i][j] for i >= j, zero above: C[i][j] = a[n-1-j][n-1-i] (a's lower
// triangle) + lambda on the diagonal. Consecutive threads take consecutive i: both sides coalesce.
__global__ void reversed_to_f64(const float* a, double lambda, int64_t n, double* c) {
  const int64_t idx = blockIdx.x * int64_t{kThreads} + threadIdx.x;
  if (idx >= n * n) return;
  const int64_t i = idx % n, j = idx / n;
  double v = 0.0;
  if (i >= j) v = static_cast<double>(a[(n - 1 - j) * n + (n - 1 - i)]) + (i == j ? lambda : 0.0);
  c[idx] = v;
}

// l[i][j] = M[n-1-j][n-1-i] for j <= i (M = L0^-1, lower, column-major in c), zero above; flag |= 1 for an
// entry that is not finite or a pivot under the bound.
__global__ void inverse_to_l(const double* c, const float* a, double lambda, int64_t n, float* l, int* flag) {
  const int64_t idx = blockIdx.x * int64_t{kThreads} + threadIdx.x;
  if (idx >= n * n) return;
  const int64_t i = idx / n, j = idx % n;
  float v = 0.0f;
  if (j <= i) {
    const int64_t p = n - 1 - j, q = n - 1 - i;  // p >= q
    v = static_cast<float>(c[p + q * n]);
    if (!isfinite(v)) atomicOr(flag, 1);
  }
  l[idx] = v;
  if (i == j) {
    // C[i][i] = a[n-1-i][n-1-i] + lambda; L0[i][i] = 1 / M[i][i].
    const double m = c[i + i * n];
    const double cii = static_cast<double>(a[(n - 1 - i) * n + (n - 1 - i)]) + lambda;
    if (!(1.0 > 1e-10 * cii * m * m)) atomicOr(flag, 1);
  }
}

__global__ void write_status(const int* infos, int32_t* status) {
  status[0] = infos[0] != 0 || infos[1] != 0 || infos[2] != 0 ? 1 : 0;
}

}  // namespace

bool inverse_cholesky_supported() { return true; }

cudaError_t inverse_cholesky(const Context& ctx, const ops::InverseCholesky& op) {
  const auto handle = static_cast<cusolverDnHandle_t>(ctx.solver());
  if (handle == nullptr) return cudaErrorNotSupported;
  const int64_t n = op.a.ne[0];
  auto* c = static_cast<double*>(ctx.scratch(kSlotMatrix, static_cast<size_t>(n * n) * sizeof(double)));
  if (c == nullptr) return cudaErrorMemoryAllocation;
  cusolverDnParams_t params = nullptr;
  if (cusolverDnCreateParams(&params) != CUSOLVER_STATUS_SUCCESS) return cudaErrorUnknown;
  size_t dev_potrf = 0, host_potrf = 0, dev_trtri = 0, host_trtri = 0;
  bool ok = cusolverDnXpotrf_bufferSize(handle, params, CUBLAS_FILL_MODE_LOWER, n, CUDA_R_64F, c, n,
                                        CUDA_R_64F, &dev_potrf, &host_potrf) == CUSOLVER_STATUS_SUCCESS &&
            cusolverDnXtrtri_bufferSize(handle, CUBLAS_FILL_MODE_LOWER, CUBLAS_DIAG_NON_UNIT, n, CUDA_R_64F,
                                        c, n, &dev_trtri, &host_trtri) == CUSOLVER_STATUS_SUCCESS;
  const size_t dev_ws = std::max(dev_potrf, dev_trtri);
  const size_t ws_bytes = (dev_ws + 255) / 256 * 256;
  auto* work = static_cast<char*>(ctx.scratch(kSlotWork, ws_bytes + 4 * sizeof(int)));
  if (!ok || work == nullptr) {
    cusolverDnDestroyParams(params);
    return ok ? cudaErrorMemoryAllocation : cudaErrorUnknown;
  }
  int* infos = reinterpret_cast<int*>(work + ws_bytes);  // potrf, trtri, the flag
  // The host workspaces (none in the cuSOLVER versions seen) outlive the asynchronous calls.
  thread_local std::vector<char> host_ws;
  if (host_ws.size() < std::max(host_potrf, host_trtri)) host_ws.resize(std::max(host_potrf, host_trtri));
  cudaError_t err = cudaMemsetAsync(infos, 0, 3 * sizeof(int), ctx.stream);
  const int64_t blocks = (n * n + kThreads - 1) / kThreads;
  if (err == cudaSuccess) {
    reversed_to_f64<<<blocks, kThreads, 0, ctx.stream>>>(static_cast<const float*>(op.a.data), op.lambda, n,
                                                         c);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) {
    ok = cusolverDnXpotrf(handle, params, CUBLAS_FILL_MODE_LOWER, n, CUDA_R_64F, c, n, CUDA_R_64F, work,
                          dev_ws, host_ws.data(), host_potrf, infos) == CUSOLVER_STATUS_SUCCESS &&
         cusolverDnXtrtri(handle, CUBLAS_FILL_MODE_LOWER, CUBLAS_DIAG_NON_UNIT, n, CUDA_R_64F, c, n, work,
                          dev_ws, host_ws.data(), host_trtri, infos + 1) == CUSOLVER_STATUS_SUCCESS;
    if (!ok) err = cudaErrorUnknown;
  }
  cusolverDnDestroyParams(params);
  if (err == cudaSuccess) {
    inverse_to_l<<<blocks, kThreads, 0, ctx.stream>>>(c, static_cast<const float*>(op.a.data), op.lambda, n,
                                                      static_cast<float*>(op.l.data), infos + 2);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) {
    write_status<<<1, 1, 0, ctx.stream>>>(infos, static_cast<int32_t*>(op.status.data));
    err = cudaGetLastError();
  }
  return err;
}

#else

bool inverse_cholesky_supported() { return false; }
cudaError_t inverse_cholesky(const Context&, const ops::InverseCholesky&) { return cudaErrorNotSupported; }

#endif

}  // namespace kiln::cuda
