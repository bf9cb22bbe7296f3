// The CUDA backend: device memory from a stream-ordered pool, transfers and programs on one stream, weights
// uploaded once at load (prepare_weight). Built with the `cuda` presets (KILN_CUDA).
//
// The kernels live in the folders beside it, one an op family (matmul/, attention/, norm_rope/, elementwise/,
// collective/, and fusion/ for the sequences of ops that run as one kernel; cuda_kernels.h lists them); the
// options it reads once are in cuda_options.h; tensor parallelism's collectives go through NCCL
// (nccl_group.h). supports() says which ops and operand types the kernels take, and run() refuses anything
// else as unimplemented, naming the op.
#pragma once

#include <memory>
#include <span>

#include "backends/backend.h"
#include "backends/cuda/cuda_options.h"
#include "ops/collective.h"

namespace kiln {

// Whether a CUDA driver and at least one device are usable.
bool cuda_device_present();

// Device `device` (cudaGetDeviceCount order), with the options of the environment (cuda_options_from_env).
// Errors name what is missing: no driver, no device, a device index out of range.
Result<std::unique_ptr<Backend>> make_cuda_backend(int device, const BackendOptions& options);
// The same with the options given (tests and benches: cuda_options_from_env(), then the fields they vary);
// invalid_argument naming a field out of its range.
Result<std::unique_ptr<Backend>> make_cuda_backend(int device, const CudaOptions& options);

// The device of a backend that make_cuda_backend made; -1 for any other backend.
int cuda_backend_device(const Backend& backend);

// Tensor parallelism's group over NCCL (backends/cuda/nccl_group.h): rank r on ranks[r]'s device, each rank
// a CUDA backend on a device of its own (invalid_argument naming the rank otherwise); unimplemented when NCCL
// (libnccl.so.2) cannot be loaded. The group must outlive the backends that ran its collectives (their CUDA
// graphs hold NCCL's state): destroy it after them.
Result<std::unique_ptr<CollectiveGroup>> make_nccl_group(std::span<Backend* const> ranks);

}  // namespace kiln
