// The CPU backend: every op of ops/ops.h, multithreaded on a persistent thread pool, the matmuls with the
// kernels of one ISA level and at the precision its options say (cpu_options.h).
// Operands are host memory; weights are read in place (e.g. from a memory-mapped GGUF file).
#pragma once

#include <memory>

#include "backends/backend.h"
#include "core/thread_pool.h"

namespace kiln {

// invalid_argument when the ISA level asked for is unknown or beyond this CPU.
Result<std::unique_ptr<Backend>> make_cpu_backend(const BackendOptions& options);

}  // namespace kiln
