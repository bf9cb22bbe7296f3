#include "runtime/placement/placement.h"

#include <algorithm>
#include <charconv>

namespace kiln {

int32_t fit_gpu_layers(const GpuFitInput& in) {
  const auto n = static_cast<int32_t>(in.layer_bytes.size());
  if (in.free <= in.reserve) return 0;
  const uint64_t room = in.free - in.reserve;
  uint64_t all = in.first_bytes + in.last_bytes;
  for (const uint64_t b : in.layer_bytes) all += b;
  if (all <= room) return n;
  uint64_t used = in.first_bytes;
  int32_t fit = 0;
  while (fit < n - 1 && used + in.layer_bytes[static_cast<size_t>(fit)] <= room) {
    used += in.layer_bytes[static_cast<size_t>(fit)];
    ++fit;
  }
  return used <= room ? fit : 0;
}

GpuFitInput gpu_fit_input(const gguf::File& f, int32_t n_layers, uint64_t free) {
  GpuFitInput in;
  in.layer_bytes.assign(static_cast<size_t>(n_layers), 0);
  in.free = free;
  // Kept for the KV cache (sized afterwards from what is left) and the steps' scratch (cuBLAS's workspace, a
  // prompt's activations, a quantized matrix dequantized for a GEMM).
  in.reserve = std::max<uint64_t>(uint64_t{1} << 30, free / 10);
  for (const gguf::TensorInfo& t : f.tensors()) {
    int32_t layer = -1;
    if (t.name.starts_with("blk.")) {
      const char* p = t.name.data() + 4;
      std::from_chars(p, t.name.data() + t.name.size(), layer);
    }
    if (layer >= 0 && layer < n_layers) {
      in.layer_bytes[static_cast<size_t>(layer)] += t.n_bytes;
    } else if (t.name == "output.weight" || t.name == "output_norm.weight") {
      in.last_bytes += t.n_bytes;
    } else {
      in.first_bytes += t.n_bytes;  // the embedding (also the head when tied: one copy), RoPE factors
    }
  }
  return in;
}

}  // namespace kiln
