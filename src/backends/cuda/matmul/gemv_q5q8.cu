// The GEMV instances of Q5_1 and Q8_0 (exact and integer), IQ4_NL, IQ4_XS and MXFP4 (exact): this unit's part
// of the list in gemv_kernel.cuh.
#include "backends/cuda/matmul/gemv_kernel.cuh"

namespace kiln::cuda {

KILN_GEMV_Q5Q8_TYPES(KILN_GEMV_INSTANCES)

}  // namespace kiln::cuda
