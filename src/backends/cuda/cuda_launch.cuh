// Kernel launches with programmatic dependent launch (PDL, sm_90+): a kernel may be scheduled while the one
// before it on the stream is still running, and waits on the device until that one has finished and its
// writes are visible. What it saves is the gap between kernels (launch and ramp-up), which decode steps of
// many small kernels are made of, and a kernel may start reading what no kernel writes (its weights) before
// it waits.
//
// Contract: a kernel launched with launch_kernel() calls pdl_begin() before it reads or writes any memory
// that another kernel of the stream writes or reads; before that it may only read memory that stays constant
// while the stream runs (weights), e.g. prefetch_l2() them. Kernels launched with <<<>>> wait for their
// predecessor in full, as always.
#pragma once

#include <cuda_runtime.h>

#include "backends/cuda/cuda_kernels.h"

namespace kiln::cuda {

// Waits until every kernel this one depends on has completed and its memory operations are visible, then lets
// the next kernel on the stream be scheduled. In that order, at most one kernel waits behind a running one:
// a chain of launched, waiting kernels would hold multiprocessor slots that the running kernel's later blocks
// need.
__device__ __forceinline__ void pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Starts bringing the 128-byte line at p into L2 (no register waits for it).
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

// kernel<<<grid, block, smem, ctx.stream>>>(args...), as a programmatic dependent launch when ctx.pdl.
template <class... Params, class... Args>
cudaError_t launch_kernel(const Context& ctx, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                          Args&&... args) {
  if (!ctx.pdl) {
    kernel<<<grid, block, smem, ctx.stream>>>(static_cast<Params>(args)...);
    return cudaPeekAtLastError();  // left set: launchers check cudaGetLastError() after their launches
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = ctx.stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
}

}  // namespace kiln::cuda
