// The CUDA backend: device memory from a stream-ordered pool, transfers and programs on one stream, weights
// uploaded once at load (prepare_weight). Built with the `cuda` presets (KILN_CUDA).
//
// Where it stands: the memory model of backends/backend.h is complete (allocate, upload, download, copy,
// synchronize with the stream's first error, prepare_weight); no op has a kernel yet, so supports() refuses
// every op and run() answers unimplemented naming the first one. Kernels come op by op, each with its harness
// case.
#pragma once

#include <memory>

#include "backends/backend.h"

namespace kiln {

// Device `device` (cudaGetDeviceCount order). Errors name what is missing: no driver, no device, a device
// index out of range.
Result<std::unique_ptr<Backend>> make_cuda_backend(int device, const BackendOptions& options);

}  // namespace kiln
