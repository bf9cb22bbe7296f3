// Program: the ops of one forward step, recorded in order by a model and run by a backend as a whole
// (Backend::run). The CPU runs them one after another; a GPU backend may capture a program as a graph once
// per shape (the step's token count, padded up to a bucket) and replay it with new step metadata, or fuse
// neighbouring ops. Every op is check()ed as it is recorded, so a backend runs only valid ops.
//
// A program holds no host pointers to step data: positions, slots, block tables and ids are tensors in
// backend memory (models/step.h), and the tensors it names stay valid until the step's outputs were read.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "core/status.h"
#include "ops/ops.h"

namespace kiln {

class Program {
 public:
  // Appends `op` after check(op): invalid_argument naming the op and the operand otherwise (nothing added).
  Status add(ops::Op op) {
    KILN_TRY(ops::check(op));
    ops_.push_back(std::move(op));
    version_ = next_version();
    return Status::ok_status();
  }
  const std::vector<ops::Op>& ops() const { return ops_; }
  size_t size() const { return ops_.size(); }
  void clear() {
    ops_.clear();
    version_ = next_version();
  }
  // A number that changes whenever the ops do (add, clear) and that no other program has had, unless copied
  // from this one with the same ops: a backend that keeps what it made of a program (a captured graph, the
  // check that it supports every op) knows the same program run again without comparing its ops.
  uint64_t version() const { return version_; }
  // The number of tokens of the step (capture-bucket key for backends that replay graphs); 0 when unknown.
  int32_t n_tokens = 0;

 private:
  static uint64_t next_version() {
    static std::atomic<uint64_t> last{0};
    return last.fetch_add(1, std::memory_order_relaxed) + 1;
  }
  std::vector<ops::Op> ops_;
  uint64_t version_ = next_version();
};

}  // namespace kiln
