// kiln quantize FOLDER OUT_FOLDER FP8: a Hugging Face folder written as an FP8 checkpoint in the
// compressed-tensors format ("float-quantized", the layout of llm-compressor's FP8_DYNAMIC scheme), which
// kiln loads (models/hf_fp8.h) and vLLM and SGLang load as their W8A8 FP8 scheme.
//
// Each decoder layer's projection weight W [out, in] (attention Q/K/V/O, the FFN's gate/up/down, and MoE
// experts' projections) becomes `<module>.weight` F8_E4M3 and `<module>.weight_scale` F32 [out, 1]: per
// output channel, scale = max|W[r, :]| / 448 (the e4m3 maximum), W[r, c] ~ e4m3(W[r, c] / scale) * scale,
// rounded to nearest even. Activations are quantized per token at run time ("dynamic"), or, given an
// importance matrix of kiln imatrix (`calibration`: its input ranges, <weight>.in_amax), per tensor with a
// static `<module>.input_scale` F32 [1] = the largest |input| over the calibration tokens / 448 ("static",
// llm-compressor's FP8 scheme). Every other tensor (embeddings, norms, the output head, MoE routers) is
// copied as it is and named in the config's `ignore` list where it is a linear layer. config.json gains the
// quantization_config; the tokenizer, chat template and generation files are copied. The output folder
// appears only when complete.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "quant/imatrix_file.h"

namespace kiln::quant {

struct Fp8FolderStats {
  int64_t n_quantized = 0;  // weights written as F8_E4M3
  int64_t n_copied = 0;     // tensors copied unchanged
  uint64_t bytes_in = 0;    // tensor bytes read
  uint64_t bytes_out = 0;   // tensor bytes written
};

// Writes `out` (a folder that must not exist) from the Hugging Face folder `in`. Errors: `in` is not a folder
// of safetensors weights, a weight to quantize that is not F32/F16/BF16 or holds a non-finite value (named),
// a weight `calibration` has no range for (named), `out` exists, a write error (nothing is left behind).
Result<Fp8FolderStats> write_fp8_folder(const std::string& in, const std::string& out, int n_threads,
                                        const Imatrix* calibration = nullptr);

}  // namespace kiln::quant
