// Tensor parallelism's transport on CUDA (ops/collective.h): one NCCL communicator per rank, each rank a CUDA
// backend on a device of its own, all in this process (ncclCommInitAll). NCCL is loaded when the first group
// is made (dlopen of libnccl.so.2): kiln starts without it, and only a tensor-parallel model on CUDA needs
// it.
//
// Lifetime: ncclCommDestroy and ncclCommAbort wait until every CUDA graph that captured one of the group's
// collectives is gone, so the group must outlive the backends that ran its collectives (their graphs).
// abort() refuses every later collective at once, and a thread of its own then sets NCCL's abort flags (a
// collective kernel waiting for a peer that never comes returns), waits for those graphs and frees the
// communicators; the destructor joins it.
#pragma once

#include <cuda_runtime.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "core/status.h"
#include "ops/collective.h"
#include "ops/ops.h"

struct ncclComm;  // NCCL's opaque communicator (ncclComm_t)

namespace kiln::cuda {

struct NcclApi;
class NcclGroup;

// One rank of an NcclGroup: its communicator, on its device. The calls enqueue on `stream` (of the rank's
// device, which must be the calling thread's) and return cudaSuccess, or an error whose reason error() gives:
// NCCL's, or the group's abort.
class NcclCollective final : public Collective {
 public:
  NcclCollective(NcclGroup& group, int32_t rank, int device, ncclComm* comm)
      : group_(group), rank_(rank), device_(device), comm_(comm) {}
  int32_t world() const override;
  int32_t rank() const override { return rank_; }
  Transport transport() const override { return Transport::nccl; }
  int device() const { return device_; }
  const NcclGroup& group() const { return group_; }
  // dst[i] = the sum of every rank's x[i] for n values (the same bits on every rank); dst may be x.
  cudaError_t all_reduce(const float* x, float* dst, size_t n, cudaStream_t stream) const;
  // dst = every rank's n values of x one after another, in rank order; dst apart from x.
  cudaError_t all_gather(const float* x, float* dst, size_t n, cudaStream_t stream) const;
  // Why the last call failed; ok when it did not. Read by the rank's own thread.
  const Status& error() const { return error_; }

 private:
  friend class NcclGroup;
  // Whether a collective may be enqueued: the calling thread is on the rank's device, and the group not
  // aborted (then entered: NcclGroup::enter); else error_ says why.
  bool ready() const;
  // cudaSuccess for NCCL's ncclSuccess, else an error and error_ naming `what` and NCCL's reason.
  cudaError_t finish(int result, const char* what) const;

  NcclGroup& group_;
  int32_t rank_;
  int device_;
  ncclComm* comm_;
  mutable Status error_;
};

class NcclGroup final : public CollectiveGroup {
 public:
  // Rank r on CUDA device devices[r], each device once. unimplemented when NCCL cannot be loaded.
  static Result<std::unique_ptr<NcclGroup>> make(std::span<const int> devices);
  ~NcclGroup() override;
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  int32_t world() const override { return static_cast<int32_t>(ranks_.size()); }
  Collective& rank(int32_t r) override { return *ranks_.at(static_cast<size_t>(r)); }
  void abort(const Status& why) override;
  // ok, or the reason abort() was given.
  Status failed() const;

 private:
  friend class NcclCollective;
  friend class NcclLaunch;
  NcclGroup(const NcclApi& api, std::span<const int> devices, std::span<ncclComm* const> comms);
  // A rank enqueueing work that uses its communicator (a collective, or a graph that captured one) enters
  // the group first and leaves it after: the communicators are freed only once no rank is inside. Refused
  // with the abort's reason once the group is aborted.
  Status enter() const;
  void leave() const;

  const NcclApi& api_;
  std::vector<std::unique_ptr<NcclCollective>> ranks_;
  mutable std::mutex mu_;
  mutable std::condition_variable left_;
  mutable int32_t inside_ = 0;  // ranks entered
  Status failed_;
  std::thread aborting_;
};

// The NCCL groups of a program's collectives entered for a launch of work that uses their communicators (a
// captured step): no abort frees them meanwhile, and status() is the reason of a group aborted before.
class NcclLaunch {
 public:
  explicit NcclLaunch(std::span<const NcclCollective* const> ranks);
  ~NcclLaunch();
  NcclLaunch(const NcclLaunch&) = delete;
  NcclLaunch& operator=(const NcclLaunch&) = delete;
  const Status& status() const { return status_; }

 private:
  std::vector<const NcclGroup*> entered_;
  Status status_;
};

// The NCCL ranks that the collectives of `ops` run on, one per group.
std::vector<const NcclCollective*> nccl_ranks(std::span<const ops::Op> ops);
// Why `op` failed to enqueue when it is a collective on an NCCL rank that says so (NcclCollective::error);
// else ok.
Status collective_error(const ops::Op& op);

}  // namespace kiln::cuda
