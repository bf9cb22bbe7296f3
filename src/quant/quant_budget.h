// Quantization to a size budget (`kiln quantize --target-bpw`, `--target-size`): each weight matrix's type
// chosen from a ladder of block types so that the file fits the budget with the least total rounding error.
//
// - A tensor's error at a type is measured on a sample of its rows (at most kBudgetSampleRows, evenly
//   strided): the rows quantized with the importance matrix and decoded again, their error weighted by each
//   column's mean squared activation (1 without an importance matrix) and divided by the rows' own weighted
//   energy: sum_j imp_j (w_ij - q_ij)^2 / sum_j imp_j w_ij^2, the matmul's noise-to-signal ratio. Tensors
//   compare by that ratio, whatever their size or scale.
// - The allocation is the greedy one on the lower convex hull of each tensor's (bytes, error) points: every
//   tensor starts at its smallest type, and the upgrade with the largest error saved per byte that still fits
//   is taken until none does (optimal on the hull up to the last, partial step); then each tensor in turn
//   takes the point of least error that the rest of the budget allows, so that no tensor alone could do
//   better.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace kiln {
class ThreadPool;
}

namespace kiln::quant {

inline constexpr int64_t kBudgetSampleRows = 512;

// The types a matrix with rows of n_per_row values may take, smallest first: the K-quants, IQ4_XS and Q8_0
// for whole 256-value blocks; Q4_0, IQ4_NL, Q4_1, Q5_0, Q5_1 and Q8_0 for whole 32-value blocks; none
// otherwise.
std::vector<DType> budget_ladder(int64_t n_per_row);

struct BudgetPoint {
  DType type;
  uint64_t bytes = 0;  // the tensor's bytes at this type, as the file pads them
  double error = 0.0;  // the noise-to-signal ratio above
};

// The error of `rows` ([n_rows][n_per_row] f32, finite) at each type of `types` (each row whole blocks of
// it), with `importance` [n_per_row] or null, on the rows' sample; the types over the pool's threads.
std::vector<double> rounding_errors(const float* rows, int64_t n_rows, int64_t n_per_row,
                                    const float* importance, std::span<const DType> types, ThreadPool& pool);

// One choice a tensor: the index into its points (any order) of the least total error whose bytes sum to at
// most `budget`. resource_exhausted when even the smallest points do not fit (the message gives their sum).
Result<std::vector<size_t>> allocate_budget(const std::vector<std::vector<BudgetPoint>>& tensors,
                                            uint64_t budget);

}  // namespace kiln::quant
