// Kernel launches with programmatic dependent launch (PDL, sm_90+): a kernel may be scheduled while the one
// before it on the stream is still running, and waits on the device until that one has finished and its
// writes are visible. What it saves is the gap between kernels (launch and ramp-up), which decode steps of
// many small kernels are made of, and a kernel may start reading what no kernel writes (its weights) before
// it waits.
//
// Contract: a kernel launched with launch_kernel() calls pdl_wait() (or pdl_begin()) before it reads or
// writes any memory that another kernel of the stream writes or reads; before that it may only read memory
// that stays constant while the stream runs (weights), e.g. prefetch_l2() them. Kernels launched with <<<>>>
// wait for their predecessor in full, as always.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <utility>

#include "backends/cuda/cuda_kernels.h"

namespace kiln::cuda {

// Waits until every kernel this one depends on has completed and its memory operations are visible.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
// Lets the next kernel on the stream be scheduled once every block of this one has called it (or ended). Its
// blocks then start while this kernel's last ones finish, and wait (pdl_wait) for it to complete. Called
// after pdl_wait, at most one kernel waits behind a running one: a chain of launched, waiting kernels would
// hold multiprocessor slots that the running kernel's later blocks need. Kernels of several waves call it
// late (after their main loop), so that the next kernel's blocks do not take slots their own later blocks
// need.
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
// pdl_wait, then pdl_trigger: for kernels of one wave.
__device__ __forceinline__ void pdl_begin() {
  pdl_wait();
  pdl_trigger();
}

// Starts bringing the 128-byte line at p into L2 (no register waits for it).
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

// Lets `kernel` take `bytes` of dynamic shared memory on the current device
// (cudaFuncAttributeMaxDynamicSharedMemorySize). The attribute stays set, and setting it costs the host tens
// of microseconds a call (an H200 under CUDA 13: more than the launch), so it is set once per kernel, device
// and size (a smaller size then needs nothing).
inline cudaError_t allow_dynamic_shared(const void* kernel, size_t bytes) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, size_t> allowed;  // (device, kernel): the bytes set
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  const std::lock_guard<std::mutex> lock(mu);
  size_t& have = allowed[{device, kernel}];
  if (have >= bytes) return cudaSuccess;
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (e == cudaSuccess) have = bytes;
  return e;
}

// kernel<<<grid, block, smem, ctx.stream>>>(args...), as a programmatic dependent launch when ctx.pdl, in
// thread-block clusters of `cluster` blocks along x when cluster > 1 (grid.x a multiple of it; sm_90 and
// newer: ctx.clusters).
template <class... Params, class... Args>
cudaError_t launch_kernel_cluster(const Context& ctx, void (*kernel)(Params...), dim3 grid, dim3 block,
                                  size_t smem, unsigned cluster, Args&&... args) {
  if (!ctx.pdl && cluster <= 1) {
    kernel<<<grid, block, smem, ctx.stream>>>(static_cast<Params>(args)...);
    return cudaPeekAtLastError();  // left set: launchers check cudaGetLastError() after their launches
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = ctx.stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (ctx.pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n++].val.clusterDim = {cluster, 1, 1};
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
}

// kernel<<<grid, block, smem, ctx.stream>>>(args...), as a programmatic dependent launch when ctx.pdl.
template <class... Params, class... Args>
cudaError_t launch_kernel(const Context& ctx, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                          Args&&... args) {
  return launch_kernel_cluster(ctx, kernel, grid, block, smem, 1u, std::forward<Args>(args)...);
}

}  // namespace kiln::cuda
