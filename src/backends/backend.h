// Backend: the narrow interface every compute backend implements. It runs ops (ops/ops.h) on tensors in its
// own memory, allocates that memory, and says what it supports. No silent fallback: run() on an op the
// backend does not support returns unimplemented.
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

#include "core/status.h"
#include "ops/ops.h"

namespace kiln {

// A block of backend memory; freed when the last owner drops it.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* data() = 0;
  virtual size_t size() const = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  // Whether run() accepts this op with these operand types.
  virtual bool supports(const ops::Op& op) const = 0;
  // Runs one op. The op is check()ed first; an invalid one is invalid_argument, an unsupported one
  // unimplemented.
  virtual Status run(const ops::Op& op) = 0;
  // `bytes` of memory the ops may use (64-byte aligned). resource_exhausted when it cannot.
  virtual Result<std::unique_ptr<Buffer>> allocate(size_t bytes) = 0;
  // Whether host pointers (e.g. a memory-mapped file) can be used as operands directly.
  virtual bool host_memory() const = 0;
  // Waits for every op run so far.
  virtual void synchronize() = 0;
  // Worker threads the backend uses (CPU) or 1.
  virtual int n_threads() const { return 1; }
};

struct BackendOptions {
  int n_threads = 0;  // CPU: 0 = default_thread_count(); at most kMaxThreadsPerCore per core (16 at least)
};
inline constexpr int kMaxThreadsPerCore = 4;

// "cpu" (always) or "cuda" (when built with it). not_found naming the available ones otherwise; a thread
// count out of range is invalid_argument.
Result<std::unique_ptr<Backend>> make_backend(std::string_view name, const BackendOptions& options = {});

}  // namespace kiln
