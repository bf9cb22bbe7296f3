// The matmul kernels at the avx512vnni level. x86-64 AVX-512 with VNNI (the avx512 flags and -mavx512vnni).
#define KILN_CPU_KERNELS_NAME cpu_kernels_avx512vnni
#include "backends/cpu/kernels/cpu_kernels_impl.h"
