// The matmul kernels at the amx level: the avx512vnni level's, and the packed products of many x rows in AMX
// tiles (the avx512vnni flags and -mamx-tile -mamx-int8).
#define KILN_CPU_KERNELS_NAME cpu_kernels_amx
#include "backends/cpu/kernels/cpu_kernels_impl.h"
