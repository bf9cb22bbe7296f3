// The matmul kernels at the avx2 level. x86-64 AVX2 + FMA + F16C (built with -mavx2 -mfma -mf16c).
#define KILN_CPU_KERNELS_NAME cpu_kernels_avx2
#include "backends/cpu/kernels/cpu_kernels_impl.h"
