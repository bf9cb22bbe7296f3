// The GEMV instances of Q4_0, Q4_1 and Q5_0, exact and integer: this unit's part of the list in
// gemv_kernel.cuh.
#include "backends/cuda/matmul/gemv_kernel.cuh"

namespace kiln::cuda {

KILN_GEMV_Q4_TYPES(KILN_GEMV_INSTANCES)

}  // namespace kiln::cuda
