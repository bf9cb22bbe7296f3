// Where a model's layers run when it does not fit on one device: how many leading layers go on the GPU
// (fit_gpu_layers, from the file's tensor table: gpu_fit_input), and how the CPU's layers then run
// (offload.h: a prompt's matmuls on the GPU). The engine (engine_load.cpp) is the one user.
#pragma once

#include <cstdint>
#include <vector>

#include "formats/gguf.h"

namespace kiln {

// How many leading layers of a model fit on a GPU when the user did not say (`--gpu-layers` unset): all of
// them (n_layers) when every weight fits in `free` less `reserve` (the room the KV cache and scratch are
// sized from); else the most that fit beside `first_bytes` (the token embedding, which stays on the GPU), the
// rest and the output head going to the CPU (at most n_layers - 1 then); 0 when not even the embedding fits.
struct GpuFitInput {
  std::vector<uint64_t> layer_bytes;  // [n_layers] each layer's weights
  uint64_t first_bytes = 0;           // on the GPU whatever the split: the token embedding and the like
  uint64_t last_bytes = 0;            // the final norm and the output head: on the GPU only with every layer
  uint64_t free = 0;                  // the GPU's free memory
  uint64_t reserve = 0;               // kept free of weights
};
int32_t fit_gpu_layers(const GpuFitInput& in);

// What the first `n_layers` layers of `f` put on a GPU with `free` bytes free, read from the file's tensor
// table ("blk.N." tensors a layer's; output.weight and output_norm.weight the last; the rest the first),
// with a reserve of max(1 GiB, free / 10) for the KV cache and the steps' scratch.
GpuFitInput gpu_fit_input(const gguf::File& f, int32_t n_layers, uint64_t free);

}  // namespace kiln
