// ImatrixCollector: the statistics of an importance matrix, collected on the model's own forward path. It is
// the model's ProgramHook (models/model.h): into each program the model records it inserts, before the
// matmuls that multiply a weight by an input, an ops::SumSquares that adds the input's column sums of squares
// and row count into accumulators on that backend (per expert, by the routing ids, for a stacked MoE weight).
// Nothing else of the program changes; a model without the hook records none of it. read_back() moves the
// accumulators into f64 sums on the host and zeroes them: once per step, never per op. The Gram matrices
// (`full`) are n_cols^2 floats a weight (9.8 GB for a 1.5B model): they accumulate in f32 on the backend over
// the whole run and are moved to the host once, by take_grams(), each buffer freed as soon as it is read.
//
// Which matmuls, as llama-imatrix collects them: every MoeMatmul (llama.cpp's MUL_MAT_ID); a Matmul whose
// weight is a layer's ("blk.*": attention, FFN, router, shared expert) on an x of at least 16 rows, or the
// output head "output.weight" when asked (a tied head, "token_embd.weight", never). The parts of a fused
// weight ("blk.0.attn_qkv.weight[q]", [k], [v]) are one weight, its x counted once.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/backend.h"
#include "core/status.h"
#include "models/model.h"

namespace kiln::quant {

// One weight's totals: f64 sums of squares [n_mat][n_cols] and rows [n_mat].
struct ImatrixSums {
  int64_t n_cols = 0;
  std::vector<double> sum2;    // [n_mat * n_cols]
  std::vector<double> counts;  // [n_mat]
  // [n_cols * n_cols]: the inputs' Gram matrix X^T X (a collector made with `full`, one-matrix weights, after
  // take_grams), or empty
  std::vector<float> gram;
  // [n_mat]: each matrix's largest |input| (ops::SumSquares::amax), or empty: not known (a legacy file, a
  // file written without it, or totals merged with one of those)
  std::vector<double> amax;
  int64_t n_mat() const { return static_cast<int64_t>(counts.size()); }
};

class ImatrixCollector final : public ProgramHook {
 public:
  // full: also each one-matrix weight's Gram matrix of inputs (ImatrixSums::gram; n_cols^2 floats of
  // backend memory a weight), for GPTQ.
  explicit ImatrixCollector(bool process_output, bool full = false)
      : process_output_(process_output), full_(full) {}
  // The model's weights (Model::weights()): how a matmul's weight is known by name. Before its first step.
  void attach(std::span<const std::unique_ptr<WeightHandle>> weights);
  Status recorded(Program& program, Backend& backend) override;
  // Adds what the backends accumulated since the last call into `totals` (by weight name) and zeroes it:
  // after a step's results were read (the backends are then done with it). An error names a weight whose
  // sums are not finite, or one whose shape differs from its totals' (a legacy file's broadcast counts
  // aside).
  Status read_back(std::map<std::string, ImatrixSums>& totals);
  // Adds every Gram matrix collected so far into `totals` (after a read_back), freeing the backend's copy;
  // the collector records nothing after it. An error names a weight whose Gram matrix is not finite.
  Status take_grams(std::map<std::string, ImatrixSums>& totals);

 private:
  // Device accumulators of the weights first seen in one recording on one backend: per weight, sums [n_cols,
  // n_mat], counts [1, n_mat] and amax [1, n_mat], one after another.
  struct Slab {
    Backend* backend = nullptr;
    std::unique_ptr<Buffer> buffer;
    std::vector<float> host;  // its floats, read back
  };
  struct Entry {
    size_t slab = 0;
    size_t offset = 0;  // in floats
    int64_t n_cols = 0, n_mat = 0;
    std::shared_ptr<Buffer> gram;  // [n_cols, n_cols] f32 on the slab's backend, or none
  };
  // The weight a matmul multiplies by, as llama-imatrix would collect it; empty: not collected.
  std::string collected_name(const ops::Weight& w, int64_t x_rows, bool routed) const;

  bool process_output_;
  bool full_;
  // (weight data, prepared form) -> the weight's name without a part suffix.
  std::map<std::pair<const void*, const void*>, std::string> names_;
  std::map<std::string, Entry> entries_;
  std::vector<Slab> slabs_;
  bool grams_taken_ = false;
};

// Adds `from` into `into` (llama-imatrix's merge): shapes must agree, except that a weight collected with one
// count takes as many as `from` has (a legacy file's single count). The ranges (amax) take the larger, and
// are dropped where either side has none. Without `with_gram`, into's Gram matrix is left as it is.
Status add_sums(const std::string& name, const ImatrixSums& from, ImatrixSums& into, bool with_gram = true);

}  // namespace kiln::quant
