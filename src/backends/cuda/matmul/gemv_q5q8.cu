// Q5_1 and Q8_0 (exact and integer), IQ4_NL, IQ4_XS and MXFP4 (exact) GEMVs (cuda_gemv_kernel.cuh).
#include "backends/cuda/matmul/gemv_kernel.cuh"

namespace kiln::cuda {

KILN_GEMV_INSTANTIATE(q5_1, false, false)
KILN_GEMV_INSTANTIATE(q5_1, true, false)
KILN_GEMV_INSTANTIATE(q8_0, false, false)
KILN_GEMV_INSTANTIATE(q8_0, true, false)
KILN_GEMV_INSTANTIATE(iq4_nl, false, false)
KILN_GEMV_INSTANTIATE(iq4_xs, false, false)
KILN_GEMV_INSTANTIATE(mxfp4, false, false)

}  // namespace kiln::cuda
