// KILN_HOST_DEVICE: marks the ops/ helpers the CUDA kernels call too (rope_freq, the draw's uniform), so that
// every backend computes them with the same code.
#pragma once

#if defined(__CUDACC__)
#define KILN_HOST_DEVICE __host__ __device__
#else
#define KILN_HOST_DEVICE
#endif
