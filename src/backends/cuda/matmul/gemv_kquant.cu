// The GEMV instances of the K-quants, exact, and integer for Q4_K, Q5_K and Q6_K: this unit's part of the
// list in gemv_kernel.cuh.
#include "backends/cuda/matmul/gemv_kernel.cuh"

namespace kiln::cuda {

KILN_GEMV_KQUANT_TYPES(KILN_GEMV_INSTANCES)

}  // namespace kiln::cuda
