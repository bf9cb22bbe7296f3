// The matmul kernels at the scalar level. The portable level: any CPU, no -m flags.
#define KILN_CPU_KERNELS_NAME cpu_kernels_scalar
#include "backends/cpu/kernels/cpu_kernels_impl.h"
