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
// llm-compressor's FP8 scheme). With GPTQ (Fp8FolderOptions::gptq) the same scales are kept and the codes are
// chosen column by column with error feedback through the inverse Hessian of the projection's inputs (the
// importance matrix's Gram matrix, `kiln imatrix --full`; quant/gptq.h with GptqOptions::row_scales), which
// lowers the layer's output error rather than each weight's; MoE experts, whose stacked importance entries
// hold no Gram matrix, are rounded to nearest. Every other tensor (embeddings, norms, the output head, MoE
// routers) is copied as it is and named in the config's `ignore` list where it is a linear layer. config.json
// gains the quantization_config; the tokenizer, chat template and generation files are copied. The output
// folder appears only when complete.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "quant/imatrix_file.h"

namespace kiln::quant {

struct Fp8FolderOptions {
  int n_threads = 0;  // CPU threads (0: the physical cores); the bytes do not depend on it
  // A kiln importance matrix of the same model: input ranges for static activations, Gram matrices for GPTQ;
  // null: neither.
  const Imatrix* imatrix = nullptr;
  bool static_activations = false;  // a static per-tensor input_scale from imatrix's ranges; else per token
  bool gptq = false;                // weights rounded by GPTQ with imatrix's Gram matrices
  double gptq_damp = 0.01;          // GptqOptions::damp
  bool gptq_act_order = true;       // GptqOptions::act_order
  // Where GPTQ's factors and updates run (GptqOptions::backend): "cpu", "auto" (a GPU when this build and
  // machine have one) or "cuda[:N]".
  std::string device = "cpu";
};

struct Fp8FolderStats {
  int64_t n_quantized = 0;      // weights written as F8_E4M3
  int64_t n_gptq = 0;           // of those, rounded by GPTQ
  int64_t n_experts_plain = 0;  // MoE experts' weights rounded to nearest under gptq (no per-expert Gram)
  int64_t n_copied = 0;         // tensors copied unchanged
  uint64_t bytes_in = 0;        // tensor bytes read
  uint64_t bytes_out = 0;       // tensor bytes written
  std::string gptq_device;      // where GPTQ's factors and updates ran (a backend's name, or "cpu")
  // Weights GPTQ was asked for but could not round, each with why (a Hessian not positive definite even
  // dampened, a row not whole blocks of 32), rounded to nearest instead.
  std::vector<std::string> notes;
};

// Writes `out` (a folder that must not exist) from the Hugging Face folder `in`. Errors: `in` is not a folder
// of safetensors weights, a weight to quantize that is not F32/F16/BF16 or holds a non-finite value (named),
// static activations or GPTQ without an importance matrix, a weight the importance matrix has no range
// (static activations) or no Gram matrix (GPTQ, experts aside) for (named), `out` exists, a write error
// (nothing is left behind).
Result<Fp8FolderStats> write_fp8_folder(const std::string& in, const std::string& out,
                                        const Fp8FolderOptions& o);

}  // namespace kiln::quant
