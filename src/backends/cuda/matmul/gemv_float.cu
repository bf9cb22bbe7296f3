// The GEMV instances of the float weight types (f32, f16, bf16), exact and paired: this unit's part of the
// list in gemv_kernel.cuh.
#include "backends/cuda/matmul/gemv_kernel.cuh"

namespace kiln::cuda {

KILN_GEMV_FLOAT_TYPES(KILN_GEMV_INSTANCES)

}  // namespace kiln::cuda
