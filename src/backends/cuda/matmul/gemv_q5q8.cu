// Q5_1 and Q8_0 (exact and integer), IQ4_NL, IQ4_XS and MXFP4 (exact) GEMVs: its part of the list of GEMV
// instances (gemv_kernel.cuh).
#include "backends/cuda/matmul/gemv_kernel.cuh"

namespace kiln::cuda {

KILN_GEMV_Q5Q8_TYPES(KILN_GEMV_INSTANCES)

}  // namespace kiln::cuda
