// GPTQ (Frantar et al. 2022, "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained
// Transformers"): a weight matrix rounded one input column at a time, each column's rounding error fed
// forward into the columns not yet rounded through the inverse Hessian of the layer's inputs, so that the
// layer's output error ||(W - Q) X||_F is small rather than each weight's own error. Written as GGUF blocks:
//
// - A block's parameters (scale, minimum, K-quant sub-block codes) are chosen first, when its first column is
//   reached, from its columns' current values (the original weights plus the error fed forward so far), by
//   the type's own row quantizer (core/quant) with importance diag(H): the search `kiln quantize --imatrix`
//   runs (on the block alone: the legacy types' search weighs by the block's mean square, not the row's).
//   Then its columns are rounded one at a time to the nearest level the block can decode (for IQ4_NL and
//   IQ4_XS, the nearest of the 16 non-linear levels times the block's scale; for f8_e4m3, the nearest e4m3fn
//   value of x / scale, saturating at +-448, times the scale), each error fed forward, the block's later
//   columns included. f8_e4m3 (kiln's FP8 blocks) takes its block scale as max |x| / 448 of the block's
//   current values, or, given GptqOptions::row_scales, a fixed scale per row (an FP8 checkpoint's
//   per-channel scale): then only the codes are chosen.
// - H = X^T X ([n_per_row, n_per_row], the calibration inputs' Gram matrix; any positive multiple gives the
//   same result up to float rounding). lambda = damp * mean(diag H) is added to its diagonal; when the
//   Cholesky factorization fails, lambda is raised tenfold up to three times. Columns with H[j][j] = 0
//   (inputs that were always 0) have their weights set to 0 before rounding.
// - Columns go in batches of kGptqBatch: the feedback within a batch is applied column by column, to the
//   columns after it a batch at a time (the paper's lazy batch updates); the result is the same up to float
//   rounding.
// - act_order: the blocks in order of decreasing sum of diag(H), the columns of a block in order of
//   decreasing H[j][j] (the paper's activation order, kept within the block structure of the format).
//
// Rows are independent given H: groups of rows run on the pool's threads; the bytes do not depend on the
// thread count. The factor and the lazy update use FMA where the machine has it (backends/cpu/cpu_linalg.h),
// so a rounding may differ in the last bit between machines with and without it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace kiln {

class Backend;
class ThreadPool;

inline constexpr int64_t kGptqBatch = 128;  // columns per lazy batch update

struct GptqOptions {
  double damp = 0.01;          // lambda as a fraction of mean(diag H); >= 0
  bool act_order = false;      // blocks and their columns by decreasing diag(H), as above
  ThreadPool* pool = nullptr;  // rows over its threads; null: the calling thread alone
  // Where the factor and the lazy updates run (a GPU's f64 and f32 units; ops::InverseCholesky, Matmul and
  // Binary at the exact precision), the rounding of each batch of positions staying on `pool`; null: all on
  // the CPU, as above. The result is the same up to float rounding (another summation order).
  Backend* backend = nullptr;
  // [n_rows]: each row's scale, finite and > 0, taken by every block of the row instead of one chosen from
  // the block's values (f8_e4m3 only); null: chosen per block.
  const float* row_scales = nullptr;
};

// The types gptq_quantize writes: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS,
// and kiln's f8_e4m3.
bool gptq_supports(DType type);

// GptqOptions::backend for a device name ("cpu", "auto": a GPU when this build and machine have one,
// "cuda[:N]"): a GPU's backend at the exact precision (f32 products, no TF32), or null for the CPU.
Result<std::unique_ptr<Backend>> gptq_device(const std::string& device);

// `w` [n_rows, n_per_row] row-major f32, `hessian` [n_per_row, n_per_row] row-major (symmetric: its lower
// triangle j <= i is read), written to `dst` as n_rows rows of `type` (dtype_row_bytes(type, n_per_row) bytes
// each), decodable by llama.cpp's dequantizers (f8_e4m3: by kiln's). Errors (nothing useful in dst then): an
// unsupported type, a row length that is not whole blocks, a weight or Hessian entry that is not finite, a
// negative diagonal entry, row scales for a type other than f8_e4m3 or not finite and > 0 (invalid_argument);
// a Hessian that stays not positive definite after the dampening's retries (out_of_range: a caller may round
// the tensor without GPTQ instead).
Status gptq_quantize(const float* w, int64_t n_rows, int64_t n_per_row, const float* hessian, DType type,
                     const GptqOptions& o, void* dst);

// The factor GPTQ rounds with: U upper triangular ([n][n] row-major, zeros below the diagonal) with
// U^T U = (H' + lambda I)^-1, H' = H with its zero diagonal entries set to 1. lambda is damp * mean(diag H'),
// raised as gptq_quantize does; `lambda` returns the value used.
struct GptqFactor {
  std::vector<float> u;  // [n][n]
  double lambda = 0.0;   // the dampening added to the diagonal
};
Result<GptqFactor> gptq_factor(const float* hessian, int64_t n, double damp);

}  // namespace kiln
