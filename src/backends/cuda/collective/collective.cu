// Tensor parallelism's collectives on CUDA (ops::AllReduce, ops::AllGather): NCCL's all-reduce and
// all-gather on the backend's stream, through the rank's communicator (nccl_group.h). Nothing here allocates
// (a step is captured as a graph, and NCCL's calls are capturable). A group of one rank of another transport
// (the host's) is a copy. NCCL's sum has the same bits on every rank, but it adds in its ring's order, not in
// rank order: the reference's bits for two ranks (a + b = b + a), within a few roundings of them for more.
//
// NCCL's all-gather writes the ranks' buffers one after another: [world][rows][n]. dst's row j is the ranks'
// rows j one after another ([rows][world][n]), so with one row (a decode's token) that is dst itself; with
// more, the gather goes to scratch and a kernel interleaves it into dst.
#include <cstdint>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_launch.cuh"
#include "backends/cuda/nccl_group.h"

namespace kiln::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kSlotGathered = 0;

// dst[j][r][i] = gathered[r][j][i] (i < n, j < rows, r < world): one thread a dst element, so the stores
// coalesce, and the loads along runs of n.
__global__ void interleave_kernel(const float* gathered, float* dst, int64_t n, int64_t rows, int64_t world) {
  pdl_begin();
  const int64_t row = n * world, total = row * rows;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = e / row, r = e % row / n, i = e % n;
    dst[e] = gathered[(r * rows + j) * n + i];
  }
}

// The NCCL rank of a collective op, or null for a group of another transport (of one rank: supports()).
const NcclCollective* nccl_rank(const Collective* group) {
  return group->transport() == Collective::Transport::nccl ? dynamic_cast<const NcclCollective*>(group)
                                                           : nullptr;
}

size_t bytes_of(const Tensor& t) { return static_cast<size_t>(t.n_elements()) * sizeof(float); }

}  // namespace

cudaError_t all_reduce(const Context& ctx, const ops::AllReduce& op) {
  const auto* x = static_cast<const float*>(op.x.data);
  auto* dst = static_cast<float*>(op.dst.data);
  if (const NcclCollective* rank = nccl_rank(op.group)) {
    return rank->all_reduce(x, dst, static_cast<size_t>(op.x.n_elements()), ctx.stream);
  }
  if (op.group->transport() == Collective::Transport::nccl) return cudaErrorInvalidValue;
  if (dst == x) return cudaSuccess;
  return cudaMemcpyAsync(dst, x, bytes_of(op.x), cudaMemcpyDeviceToDevice, ctx.stream);
}

cudaError_t all_gather(const Context& ctx, const ops::AllGather& op) {
  const auto* x = static_cast<const float*>(op.x.data);
  auto* dst = static_cast<float*>(op.dst.data);
  const NcclCollective* rank = nccl_rank(op.group);
  if (rank == nullptr) {
    if (op.group->transport() == Collective::Transport::nccl) return cudaErrorInvalidValue;
    return cudaMemcpyAsync(dst, x, bytes_of(op.x), cudaMemcpyDeviceToDevice, ctx.stream);
  }
  const int64_t n = op.x.ne[0], rows = op.x.ne[1], world = rank->world();
  const auto count = static_cast<size_t>(op.x.n_elements());
  if (rows == 1 || world == 1) return rank->all_gather(x, dst, count, ctx.stream);
  auto* gathered = static_cast<float*>(ctx.scratch(kSlotGathered, bytes_of(op.dst)));
  if (gathered == nullptr) return cudaErrorMemoryAllocation;
  if (const cudaError_t e = rank->all_gather(x, gathered, count, ctx.stream); e != cudaSuccess) return e;
  (void)launch_kernel(ctx, interleave_kernel, grid_for(n * rows * world, kThreads), kThreads, 0, gathered,
                      dst, n, rows, world);
  return cudaGetLastError();
}

}  // namespace kiln::cuda
