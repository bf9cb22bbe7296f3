// The CUDA libraries' handles a backend holds beside its cuBLAS handle, bound to its stream: cuBLASLt's (the
// FP8 GEMM, matmul/fp8_gemm.cu), made with the backend rather than in a step that may be captured, and
// cuSOLVER's (InverseCholesky, linalg/inverse_cholesky.cu), made at its first use.
#pragma once

#include <cuda_runtime.h>

namespace kiln::cuda {

class LibraryHandles {
 public:
  explicit LibraryHandles(cudaStream_t stream);
  ~LibraryHandles();
  LibraryHandles(const LibraryHandles&) = delete;
  LibraryHandles& operator=(const LibraryHandles&) = delete;

  void* lt() const { return lt_; }  // a cublasLtHandle_t, or null when it could not be made
  // A cusolverDnHandle_t, or null when this build has no cuSOLVER or it could not be made.
  void* solver();

 private:
  cudaStream_t stream_;
  void* lt_ = nullptr;
  void* solver_ = nullptr;
};

}  // namespace kiln::cuda
