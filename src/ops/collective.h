// The ranks of a tensor-parallel group, as its collective ops (ops::AllReduce, ops::AllGather) see them. Each
// rank runs its own model on its own backend; a collective op returns on a rank once every rank of the group
// has entered it, so every rank records the same collectives in the same order.
//
// Two transports: HostGroup (ranks that are threads of this process, exchanging host memory: the CPU
// backend's, and the reference's) and NCCL (the CUDA backend's: backends/cuda/nccl_group.h).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/status.h"

namespace kiln {

class Collective {
 public:
  enum class Transport : uint8_t { host, nccl };
  virtual ~Collective() = default;
  virtual int32_t world() const = 0;
  virtual int32_t rank() const = 0;
  virtual Transport transport() const = 0;
};

// A group of `world` ranks: made once, each rank's model given its Collective.
class CollectiveGroup {
 public:
  virtual ~CollectiveGroup() = default;
  virtual int32_t world() const = 0;
  virtual Collective& rank(int32_t r) = 0;
  // Fails every collective waiting now or entered later with `why`: a rank whose step stops before one of its
  // collectives (an error) would otherwise leave the others waiting for it forever. The group stays failed.
  virtual void abort(const Status& why) = 0;
};

class HostGroup;

// One rank of a HostGroup.
class HostCollective final : public Collective {
 public:
  HostCollective(HostGroup& group, int32_t rank) : group_(group), rank_(rank) {}
  int32_t world() const override;
  int32_t rank() const override { return rank_; }
  Transport transport() const override { return Transport::host; }
  // dst[i] = the sum of every rank's x[i] in rank order (the same bits on every rank), for n values; dst may
  // be x. Every rank calls it with the same n.
  Status all_reduce(const float* x, float* dst, int64_t n);
  // dst[:, j] = the ranks' x[:, j] one after another, in rank order: x [n, rows] and dst [n * world, rows],
  // both contiguous and apart. Every rank calls it with the same n and rows.
  Status all_gather(const float* x, int64_t n, int64_t rows, float* dst);

 private:
  HostGroup& group_;
  int32_t rank_;
};

class HostGroup final : public CollectiveGroup {
 public:
  explicit HostGroup(int32_t world);
  int32_t world() const override { return static_cast<int32_t>(ranks_.size()); }
  Collective& rank(int32_t r) override { return *ranks_.at(static_cast<size_t>(r)); }
  void abort(const Status& why) override;

 private:
  friend class HostCollective;
  // Rank `rank` posts `p`, then waits until every rank has posted (each collective's first phase) or, with
  // p == nullptr, until every rank has finished reading (its second).
  Status arrive(int32_t rank, const void* p);

  std::vector<std::unique_ptr<HostCollective>> ranks_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<const void*> posted_;  // a rank's operand in the current collective
  int32_t arrived_ = 0;
  uint64_t phase_ = 0;  // barriers passed
  Status failed_;
};

}  // namespace kiln
