// The CUDA backend: device memory from a stream-ordered pool, transfers and programs on one stream, weights
// uploaded once at load (prepare_weight). Built with the `cuda` presets (KILN_CUDA).
//
// The kernels live in the folders beside it, one an op family (matmul/, attention/, norm_rope/, elementwise/,
// and fusion/ for the sequences of ops that run as one kernel; cuda_kernels.h lists them); the options it
// reads once are in cuda_options.h. supports() says which ops and operand types the kernels take, and run()
// refuses anything else as unimplemented, naming the op.
#pragma once

#include <memory>

#include "backends/backend.h"
#include "backends/cuda/cuda_options.h"

namespace kiln {

// Whether a CUDA driver and at least one device are usable.
bool cuda_device_present();

// Device `device` (cudaGetDeviceCount order), with the options of the environment (cuda_options_from_env).
// Errors name what is missing: no driver, no device, a device index out of range.
Result<std::unique_ptr<Backend>> make_cuda_backend(int device, const BackendOptions& options);
// The same with the options given (tests and benches: cuda_options_from_env(), then the fields they vary);
// invalid_argument naming a field out of its range.
Result<std::unique_ptr<Backend>> make_cuda_backend(int device, const CudaOptions& options);

}  // namespace kiln
