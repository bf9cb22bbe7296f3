// The GEMV instances of the grid i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M; exact): this
// unit's part of the list in gemv_kernel.cuh.
#include "backends/cuda/matmul/gemv_kernel.cuh"

namespace kiln::cuda {

KILN_GEMV_IQUANT_TYPES(KILN_GEMV_INSTANCES)

}  // namespace kiln::cuda
