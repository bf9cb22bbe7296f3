// The float weight types (f32, f16, bf16): exact and paired GEMVs: its part of the list of GEMV instances
// (gemv_kernel.cuh).
#include "backends/cuda/matmul/gemv_kernel.cuh"

namespace kiln::cuda {

KILN_GEMV_FLOAT_TYPES(KILN_GEMV_INSTANCES)

}  // namespace kiln::cuda
