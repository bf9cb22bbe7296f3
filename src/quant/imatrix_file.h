// Importance matrices on disk: llama.cpp's imatrix GGUF files (what `kiln imatrix` writes) and its legacy
// `.dat` files (read only). Both interchange with llama-imatrix and llama-quantize; the layouts are described
// at the top of imatrix_file.cpp.
//
// An importance matrix holds, for each weight matrix a model multiplies by, the sum over calibration tokens
// of each input column's squared activation (per expert for a stacked MoE weight) and how many tokens each
// sum saw. A quantizer weights each column's rounding error by sum / count.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace kiln::quant {

struct ImatrixTensor {
  int64_t n_cols = 0;         // input columns of the weight (its row length)
  int64_t n_mat = 1;          // matrices: 1, or the experts of a stacked MoE weight
  std::vector<float> sum2;    // [n_mat][n_cols]: sums of squared activations
  std::vector<float> counts;  // [n_mat]: tokens (activation rows) each matrix's sums saw (whole numbers)
  // [n_cols][n_cols]: the sum over the same tokens of x x^T ("<weight>.in_gram", `kiln imatrix --full`;
  // n_mat 1 only), or none: in `gram` when computed, viewed in the file's mapped bytes when read
  // (`gram_mapped`, kept alive by Imatrix::mapping: a 1.5B model's are 9.8 GB, read once by GPTQ, which the
  // page cache holds and can drop again, where a copy would be 9.8 GB of the process's own memory).
  std::vector<float> gram;
  std::span<const float> gram_mapped;
  // [n_mat]: each matrix's largest |input| over the same tokens ("<weight>.in_amax", kiln's files), or empty:
  // not in the file. A static FP8 activation scale is made from it (fp8_folder.h).
  std::vector<float> amax;
  std::span<const float> gram_values() const {
    return gram.empty() ? gram_mapped : std::span<const float>(gram);
  }
  bool has_gram() const { return !gram_values().empty(); }
};

struct Imatrix {
  std::map<std::string, ImatrixTensor>
      tensors;                        // by weight name, as in the model file ("blk.0.attn_q.weight")
  std::vector<std::string> datasets;  // calibration files the sums came from
  int64_t chunk_count = 0;            // chunks of chunk_size tokens evaluated
  int64_t chunk_size = 0;
  // Read from a legacy .dat file: each tensor has n_mat 1 and n_cols = all its values (a stacked weight's
  // experts one after another: the file does not say how many), sum2 = each column's mean square times
  // ncall and counts = {ncall} (1 where the file says 0, so that importance() gives the values as stored,
  // as llama-quantize takes them); chunk_size 0.
  bool legacy = false;
  std::shared_ptr<const void> mapping;  // the file read_imatrix() read, while a tensor's gram_mapped views it
};

// Reads an imatrix GGUF file or a legacy .dat file (told apart by content, not by name). An error names the
// file and what is wrong (truncated, a count of zero where sums are not, a shape that does not add up, a
// value that is not finite, a GGUF file without the imatrix keys).
Result<Imatrix> read_imatrix(const std::filesystem::path& path);

// Writes `imatrix` as an imatrix GGUF file, complete or not at all (a temporary file renamed at the end).
Status write_imatrix(const Imatrix& imatrix, const std::filesystem::path& path);

// The importance weights a quantizer takes for matrix `mat` of `tensor`: sum2 / count per column (n_cols
// values), as llama-quantize derives them; 1 for every column of a matrix whose count is 0 (an expert no
// calibration token reached).
std::vector<float> importance(const ImatrixTensor& tensor, int64_t mat);
// Every matrix's, one after another (n_mat * n_cols values): what llama-quantize hands its quantizer for a
// weight [n_cols, n, n_mat], the rows of expert e taking values [e * n_cols, (e + 1) * n_cols). It checks the
// size against the weight's ne[0] * ne[2] (a legacy file's tensors hold every expert in one "matrix").
std::vector<float> importance_all(const ImatrixTensor& tensor);

}  // namespace kiln::quant
