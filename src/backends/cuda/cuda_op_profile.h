// CudaOptions::profile (KILN_CUDA_PROFILE=1): every op of the programs run op by op, timed alone, summed per
// kind of op (name, weight type, shape) and printed when the backend goes away. Two times an op: its kernels'
// (events around them, then a wait, so that each op runs alone on an idle GPU) and the host's, to enqueue
// them (argument checks, fusion matching, cuBLAS's calls, the launches): what a step that is not a CUDA graph
// spends before the GPU has work.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "ops/ops.h"

namespace kiln::cuda {

class OpProfile {
 public:
  // One run of `op` and the n - 1 ops fused with it (counted under the first, "+ n-1 fused").
  void add(const ops::Op& op, size_t n, double kernel_ms, double enqueue_us);
  void print(std::string_view backend) const;  // to stderr

 private:
  struct OpTime {
    double kernel_ms = 0;
    double enqueue_us = 0;
    int64_t calls = 0;
  };
  std::map<std::string, OpTime> times_;
};

}  // namespace kiln::cuda
