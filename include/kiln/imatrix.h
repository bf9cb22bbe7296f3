// Importance matrices for quantization, as llama.cpp's llama-imatrix computes them: a model is run over a
// calibration text, cut into chunks of chunk_size tokens, and for every weight matrix that a layer multiplies
// by (each expert of a stacked MoE weight on its own) the sum of each input column's square and the number of
// rows summed are collected; the result is an imatrix GGUF file that llama-quantize (and kiln's quantizer)
// take.
//
//   kiln::compute_imatrix({.model = "model.gguf", .text_file = "calibration.txt", .output = "imatrix.gguf"});
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kiln/status.h"

namespace kiln {

// After each step of chunks.
struct ImatrixProgress {
  int64_t chunks_done = 0;
  int64_t n_chunks = 0;
  double seconds = 0;             // since the first chunk started
  double ppl = 0;                 // the running perplexity of the chunks done (0: not computed)
  std::vector<double> chunk_ppl;  // the running perplexity after each chunk done so far (empty: not computed)
};

struct ImatrixOptions {
  std::string model;                    // a GGUF file or a Hugging Face folder
  std::string text_file;                // the calibration text; empty: only in_files are combined
  std::string output = "imatrix.gguf";  // written through a temporary file renamed into place
  int32_t chunk_size = 512;             // tokens a chunk (llama-imatrix -c)
  int64_t max_chunks = -1;              // chunks at most (-1: all the text holds)
  std::string device = "auto";          // "cpu", "cuda", "cuda:N", "auto"
  int threads = 0;                      // CPU threads (0: the default)
  bool exact = false;                   // exact f32 matmuls (else the fast path, as `kiln run`)
  // The output is also written every output_frequency chunks (0: only at the end), as llama-imatrix does;
  // with `full`, only at the end.
  int64_t output_frequency = 10;
  // imatrix files (GGUF or legacy .dat) whose sums are added to the collected ones, as llama-imatrix's
  // --in-file: a legacy file's values and counts count chunk_size rows a call.
  std::vector<std::string> in_files;
  bool process_output = false;  // also collect output.weight's input (llama-imatrix --process-output)
  // Also each weight's Gram matrix of inputs X^T X (for `kiln quantize --method gptq`), written as
  // "<weight>.in_gram" tensors that llama.cpp's tools skip. Stacked MoE weights have none. n_cols^2 floats a
  // weight, on the backend and in the file (summed in f32, read back once at the end); collected on the CPU.
  // in_files with Gram matrices need `full`, and under `full` every one-matrix weight of them must have one.
  bool full = false;
  bool compute_ppl = true;  // the perplexity of each chunk's second half, as llama-imatrix reports it
  std::function<void(const ImatrixProgress&)> progress;
};

struct ImatrixStats {
  std::string model_name;
  std::string device;
  int64_t text_tokens = 0;  // the text's tokens
  int64_t chunks = 0;       // chunks run
  int64_t entries = 0;      // weights in the file written
  int64_t partial = 0;      // of those, stacked weights some of whose experts no token reached
  double seconds = 0;       // running the chunks
  double tokens_per_second = 0;
  double ppl = 0, ppl_error = 0;  // 0 when not computed
};

Result<ImatrixStats> compute_imatrix(const ImatrixOptions& options);

}  // namespace kiln
