// Hugging Face folder -> GGUF: the same tensors and metadata kiln runs the folder with (standard GGUF names,
// "{arch}.*" keys, Llama Q/K rows in GGUF's RoPE order, experts stacked), the tokenizer as tokenizer.ggml.*
// keys and the chat template, so llama.cpp and the `gguf` Python package read the file too.
//
//   kiln::convert_model({.input = "Qwen2.5-0.5B-Instruct/", .output = "qwen.gguf", .type = "q8_0"});
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "kiln/status.h"

namespace kiln {

struct ConvertOptions {
  std::string input;   // a Hugging Face folder (config.json, safetensors, tokenizer.json)
  std::string output;  // the GGUF file to write (written to a temporary name and renamed: never half a file)
  // "f32", "f16", "bf16", "q8_0"; empty: as stored (F32 / F16 / BF16). 1-d tensors and expert routers stay
  // f32; q8_0 rows whose length is not a multiple of 32 fall back to f16.
  std::string type;
  // Threads that cast tensors to `type` (0: the physical cores, or KILN_THREADS); the file is the same
  // whatever the count.
  int threads = 0;
  // Called after each tensor: (tensors done, tensors in all).
  std::function<void(size_t, size_t)> progress;
};

struct ConvertStats {
  std::string architecture;  // general.architecture written
  size_t n_tensors = 0;
  uint64_t tensor_bytes = 0;  // tensor data written
};

Result<ConvertStats> convert_model(const ConvertOptions& options);

}  // namespace kiln
