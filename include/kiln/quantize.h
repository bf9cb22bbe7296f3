// Model quantization: a GGUF file or Hugging Face folder written as a GGUF file of a llama.cpp file type
// (Q4_K_M, Q8_0, IQ4_XS, ...), each tensor typed as llama.cpp's llama-quantize types it for the same model
// and options, with the same bytes, so that the file is the one llama-quantize writes.
//
//   kiln::quantize_model({.input = "model-f16.gguf", .output = "model-q4_k_m.gguf", .type = "Q4_K_M"});
//
// Tensor by tensor: the input is memory-mapped, one tensor's output is in memory at a time (its rows
// converted to f32 a slice per thread), the output written to a temporary file renamed at the end.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kiln/status.h"

namespace kiln {

struct QuantizeOptions {
  std::string input;   // a GGUF file or a Hugging Face folder (config.json, safetensors, tokenizer.json)
  std::string output;  // the GGUF file to write (unused with dry_run)
  std::string
      type;  // the file type, as llama-quantize names it (case-insensitive): "Q4_K_M", "IQ4_XS", "F16"
  // An importance matrix (kiln imatrix / llama-imatrix GGUF, or a legacy .dat): each weight's rounding error
  // weighted by its input column's mean squared activation. Required by the 1-3 bit i-quant mixes and Q2_K_S.
  std::string imatrix;
  std::vector<std::string> tensor_types;  // "PATTERN=TYPE": tensors whose name the regex matches as TYPE
  std::string output_tensor_type;         // a type for output.weight ("q8_0"); empty: the mix's
  std::string token_embedding_type;       // a type for token_embd.weight; empty: the mix's
  bool allow_requantize = false;          // a quantized input is dequantized and quantized again
  bool leave_output_tensor = false;       // output.weight kept as it is
  bool pure = false;                      // every weight matrix the base type: no mix
  bool force = false;                     // replace an existing output file
  bool dry_run = false;                   // decide every tensor's type, write nothing
  // "" (each block rounded on its own, weighted by the importance matrix: llama-quantize's file) or "gptq":
  // the weight matrices whose imatrix entry has a Gram matrix (kiln imatrix --full) and whose type GPTQ
  // writes (gptq_supports) are rounded column by column with error feedback (quant/gptq.h); the others as
  // without it. Needs an imatrix with Gram matrices. The output is the same GGUF types, other bytes.
  std::string method;
  double gptq_damp = 0.01;  // GPTQ's dampening, a fraction of mean(diag H)
  // GPTQ's blocks and columns by decreasing activation (GptqOptions::act_order): no cost at run time, the
  // same format; on SmolLM2 it halves the KLD left by plain order.
  bool gptq_act_order = true;
  // Where GPTQ factors its Hessians and applies its updates (GptqOptions::backend): "auto" (a usable CUDA
  // device when this build has one, else the CPU), "cpu", "cuda" or "cuda:N". The rounding itself stays on
  // the CPU threads.
  std::string device = "auto";
  // A size budget for the weight matrices instead of the mix's types (target_bpw: bits per weight over every
  // tensor; target_size: the output file's bytes; 0: none; not both): each weight matrix takes the type, of a
  // ladder of block types its rows fit, that gives the least total rounding error (importance-weighted when
  // there is an importance matrix) within the budget. The token embedding, the output head, tensors an
  // override names and the tensors the mix keeps take the mix's types, as do stacked (MoE) weights.
  double target_bpw = 0.0;
  uint64_t target_size = 0;
  // A plan file: each weight matrix's type, as save_plan wrote it for this model (tensors it does not name
  // keep the mix's types). Not with a target.
  std::string plan;
  // Writes the types chosen (by the mix, a target or a plan) as a plan file, once they are all decided (with
  // dry_run too).
  std::string save_plan;
  // Threads that quantize a tensor's rows (0: the physical cores, or KILN_THREADS); the file is the same
  // whatever the count.
  int threads = 0;
};

// One tensor of the output.
struct QuantizeTensor {
  std::string name;
  std::vector<int64_t> shape;  // GGUF order: shape[0] is the row length
  std::string from;            // stored type: "f16"
  std::string to;              // written type: "q4_k"
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  std::string note;  // a fallback type or an override, or empty
};

struct QuantizeStats {
  std::string architecture;             // general.architecture
  std::string file_type;                // "Q4_K_M"
  std::vector<QuantizeTensor> tensors;  // in the order they are written
  size_t n_converted = 0;               // tensors written in another type than stored (the rest are copied)
  size_t n_requantized = 0;             // of them, tensors dequantized from a quantized type first
  size_t n_fallback = 0;                // tensors whose rows did not fit the mix's type
  uint64_t n_elements = 0;              // of all tensors
  uint64_t bytes_in = 0;                // tensor data read
  uint64_t bytes_out = 0;               // tensor data written
  bool used_imatrix = false;
  size_t n_gptq = 0;    // tensors rounded by GPTQ (method "gptq")
  size_t n_budget = 0;  // tensors whose type a target or a plan chose
  // With a target: the budget in bytes of the output file, and the sum over the tensors it chose of their
  // rounding error (quant/quant_budget.h), against the same sum for the mix's types.
  uint64_t budget_bytes = 0;
  double budget_error = 0.0, mix_error = 0.0;
  uint64_t file_bytes = 0;  // the output file's size (the header included)
};

struct QuantizeEvents {
  // Once every tensor's type is decided, before anything is written: notes the user should hear of
  // (fallback types, imatrix entries missing for tensors that can do without).
  std::function<void(const QuantizeStats& plan, const std::vector<std::string>& warnings)> planned;
  // After each tensor is written: its index in plan.tensors, and tensor bytes written so far.
  std::function<void(size_t index, uint64_t bytes_written)> tensor_done;
  // While writing: a tensor rounded otherwise than planned, and why (GPTQ's Hessian not positive definite
  // even dampened: the tensor is rounded as without --method).
  std::function<void(const std::string& note)> note;
};

// Errors name what is wrong: an unknown type or tensor type, a bad pattern, an output that is the input or
// exists (without force), a quantized input without allow_requantize, a type that needs an importance matrix
// without one, an imatrix entry whose columns do not match its tensor, a write that fails (no file is left).
Result<QuantizeStats> quantize_model(const QuantizeOptions& options, const QuantizeEvents& events = {});

}  // namespace kiln
