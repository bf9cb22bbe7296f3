// The K-quants: exact, and integer for Q4_K, Q5_K and Q6_K GEMVs (cuda_gemv_kernel.cuh).
#include "backends/cuda/matmul/gemv_kernel.cuh"

namespace kiln::cuda {

KILN_GEMV_INSTANTIATE(q2_k, false, false)
KILN_GEMV_INSTANTIATE(q3_k, false, false)
KILN_GEMV_INSTANTIATE(q4_k, false, false)
KILN_GEMV_INSTANTIATE(q4_k, true, false)
KILN_GEMV_INSTANTIATE(q5_k, false, false)
KILN_GEMV_INSTANTIATE(q5_k, true, false)
KILN_GEMV_INSTANTIATE(q6_k, false, false)
KILN_GEMV_INSTANTIATE(q6_k, true, false)

}  // namespace kiln::cuda
