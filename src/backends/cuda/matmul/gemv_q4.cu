// Q4_0, Q4_1 and Q5_0: exact and integer GEMVs (cuda_gemv_kernel.cuh).
#include "backends/cuda/matmul/gemv_kernel.cuh"

namespace kiln::cuda {

KILN_GEMV_INSTANTIATE(q4_0, false, false)
KILN_GEMV_INSTANTIATE(q4_0, true, false)
KILN_GEMV_INSTANTIATE(q4_1, false, false)
KILN_GEMV_INSTANTIATE(q4_1, true, false)
KILN_GEMV_INSTANTIATE(q5_0, false, false)
KILN_GEMV_INSTANTIATE(q5_0, true, false)

}  // namespace kiln::cuda
