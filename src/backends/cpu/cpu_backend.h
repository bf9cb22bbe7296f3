// The CPU backend: every op of ops/ops.h in portable, multithreaded C++ on a persistent thread pool. Operands
// are host memory; weights are read in place (e.g. from a memory-mapped GGUF file).
#pragma once

#include <memory>

#include "backends/backend.h"
#include "core/thread_pool.h"

namespace kiln {

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options);

}  // namespace kiln
