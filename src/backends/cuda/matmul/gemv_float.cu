// The float weight types (f32, f16, bf16): exact and paired GEMVs (cuda_gemv_kernel.cuh).
#include "backends/cuda/matmul/gemv_kernel.cuh"

namespace kiln::cuda {

KILN_GEMV_INSTANTIATE(f32, false, false)
KILN_GEMV_INSTANTIATE(f32, false, true)
KILN_GEMV_INSTANTIATE(f16, false, false)
KILN_GEMV_INSTANTIATE(f16, false, true)
KILN_GEMV_INSTANTIATE(bf16, false, false)
KILN_GEMV_INSTANTIATE(bf16, false, true)

}  // namespace kiln::cuda
