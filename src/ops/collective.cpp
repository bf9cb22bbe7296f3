#include "ops/collective.h"

#include <algorithm>
#include <cstring>

namespace kiln {

HostGroup::HostGroup(int32_t world) : posted_(static_cast<size_t>(std::max(world, 1)), nullptr) {
  for (int32_t r = 0; r < std::max(world, 1); ++r)
    ranks_.push_back(std::make_unique<HostCollective>(*this, r));
}

void HostGroup::abort(const Status& why) {
  std::lock_guard lock(mu_);
  if (failed_.ok())
    failed_ = why.ok() ? Status(StatusCode::internal, "tensor parallelism: the group was stopped") : why;
  cv_.notify_all();
}

Status HostGroup::arrive(int32_t rank, const void* p) {
  std::unique_lock lock(mu_);
  if (!failed_.ok()) return failed_;
  if (p != nullptr) posted_[static_cast<size_t>(rank)] = p;
  const uint64_t phase = phase_;
  if (++arrived_ == world()) {
    arrived_ = 0;
    ++phase_;
    cv_.notify_all();
    return Status::ok_status();
  }
  cv_.wait(lock, [&] { return phase_ != phase || !failed_.ok(); });
  return phase_ != phase ? Status::ok_status() : failed_;
}

int32_t HostCollective::world() const { return group_.world(); }

Status HostCollective::all_reduce(const float* x, float* dst, int64_t n) {
  // Phase 1: every rank's x is posted. Each rank sums them in rank order into its own buffer (the same bits
  // on every rank); phase 2: every rank has read every x, so dst (which may be x) can be written.
  KILN_TRY(group_.arrive(rank_, x));
  std::vector<float> sum(static_cast<size_t>(n), 0.0f);
  for (const void* p : group_.posted_) {
    const auto* v = static_cast<const float*>(p);
    for (int64_t i = 0; i < n; ++i) sum[static_cast<size_t>(i)] += v[i];
  }
  KILN_TRY(group_.arrive(rank_, nullptr));
  std::memcpy(dst, sum.data(), sizeof(float) * static_cast<size_t>(n));
  return Status::ok_status();
}

Status HostCollective::all_gather(const float* x, int64_t n, int64_t rows, float* dst) {
  KILN_TRY(group_.arrive(rank_, x));
  const int64_t w = world();
  for (int64_t r = 0; r < w; ++r) {
    const auto* v = static_cast<const float*>(group_.posted_[static_cast<size_t>(r)]);
    for (int64_t j = 0; j < rows; ++j)
      std::memcpy(dst + j * n * w + r * n, v + j * n, sizeof(float) * static_cast<size_t>(n));
  }
  return group_.arrive(rank_, nullptr);
}

}  // namespace kiln
