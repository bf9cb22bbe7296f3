// The matmul kernels at the avx512 level. x86-64 AVX-512 F/BW/VL/DQ (built with -mavx512f -mavx512bw
// -mavx512vl -mavx512dq and the AVX2 flags).
#define KILN_CPU_KERNELS_NAME cpu_kernels_avx512
#include "backends/cpu/kernels/cpu_kernels_impl.h"
