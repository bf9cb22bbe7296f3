#include "backends/cuda/cuda_handles.h"

#include <cublasLt.h>
#ifdef KILN_HAVE_CUSOLVER
#include <cusolverDn.h>
#endif

namespace kiln::cuda {

LibraryHandles::LibraryHandles(cudaStream_t stream) : stream_(stream) {
  if (cublasLtHandle_t h = nullptr; cublasLtCreate(&h) == CUBLAS_STATUS_SUCCESS) lt_ = h;
}

LibraryHandles::~LibraryHandles() {
#ifdef KILN_HAVE_CUSOLVER
  if (solver_ != nullptr) cusolverDnDestroy(static_cast<cusolverDnHandle_t>(solver_));
#endif
  if (lt_ != nullptr) cublasLtDestroy(static_cast<cublasLtHandle_t>(lt_));
}

void* LibraryHandles::solver() {
#ifdef KILN_HAVE_CUSOLVER
  if (solver_ == nullptr) {
    cusolverDnHandle_t h = nullptr;
    if (cusolverDnCreate(&h) != CUSOLVER_STATUS_SUCCESS) return nullptr;
    cusolverDnSetStream(h, stream_);
    solver_ = h;
  }
#endif
  return solver_;
}

}  // namespace kiln::cuda
