// Quantization to a size budget (quant_budget.h): the ladder of types, the sampled rounding errors, the
// greedy allocation on each tensor's convex hull.
#include "quant/quant_budget.h"

#include <algorithm>
#include <numeric>
#include <queue>
#include <tuple>

#include "core/thread_pool.h"

namespace kiln::quant {

std::vector<DType> budget_ladder(int64_t n_per_row) {
  if (n_per_row > 0 && n_per_row % 256 == 0) {
    return {DType::q2_k, DType::q3_k, DType::iq4_xs, DType::q4_k, DType::q5_k, DType::q6_k, DType::q8_0};
  }
  if (n_per_row > 0 && n_per_row % 32 == 0) {
    return {DType::q4_0, DType::iq4_nl, DType::q4_1, DType::q5_0, DType::q5_1, DType::q8_0};
  }
  return {};
}

std::vector<double> rounding_errors(const float* rows, int64_t n_rows, int64_t n_per_row,
                                    const float* importance, std::span<const DType> types, ThreadPool& pool) {
  const int64_t stride = std::max<int64_t>(1, (n_rows + kBudgetSampleRows - 1) / kBudgetSampleRows);
  const int64_t n_sample = (n_rows + stride - 1) / stride;
  std::vector<float> sample(static_cast<size_t>(n_sample * n_per_row));
  for (int64_t s = 0; s < n_sample; ++s) {
    std::copy_n(rows + s * stride * n_per_row, n_per_row, sample.begin() + s * n_per_row);
  }
  const auto weight = [&](int64_t j) {
    return importance != nullptr ? static_cast<double>(importance[j]) : 1.0;
  };
  double energy = 0.0;
  for (int64_t s = 0; s < n_sample; ++s) {
    for (int64_t j = 0; j < n_per_row; ++j) {
      const double w = sample[static_cast<size_t>(s * n_per_row + j)];
      energy += weight(j) * w * w;
    }
  }
  std::vector<double> errors(types.size(), 0.0);
  pool.parallel_dynamic(static_cast<int64_t>(types.size()), 1, [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) {
      const DTypeInfo& info = dtype_info(types[static_cast<size_t>(t)]);
      const size_t row_bytes = static_cast<size_t>(n_per_row / info.block_size * info.type_size);
      std::vector<uint8_t> q(row_bytes * static_cast<size_t>(n_sample));
      info.quantize_rows(sample.data(), q.data(), n_sample, n_per_row, importance);
      std::vector<float> back(static_cast<size_t>(n_per_row));
      double e = 0.0;
      for (int64_t s = 0; s < n_sample; ++s) {
        info.dequantize_row(q.data() + static_cast<size_t>(s) * row_bytes, back.data(), n_per_row);
        for (int64_t j = 0; j < n_per_row; ++j) {
          const double d = static_cast<double>(sample[static_cast<size_t>(s * n_per_row + j)]) -
                           back[static_cast<size_t>(j)];
          e += weight(j) * d * d;
        }
      }
      errors[static_cast<size_t>(t)] = energy > 0.0 ? e / energy : 0.0;
    }
  });
  return errors;
}

Result<std::vector<size_t>> allocate_budget(const std::vector<std::vector<BudgetPoint>>& tensors,
                                            uint64_t budget) {
  // Each tensor's lower convex hull, as indices into its points: bytes increasing, error decreasing, the
  // error saved per byte decreasing from one step to the next.
  std::vector<std::vector<size_t>> hulls(tensors.size());
  uint64_t total = 0;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const std::vector<BudgetPoint>& pts = tensors[t];
    if (pts.empty()) return invalid_argument("budget: tensor {} has no type to choose from", t);
    std::vector<size_t> order(pts.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return std::tie(pts[a].bytes, pts[a].error) < std::tie(pts[b].bytes, pts[b].error);
    });
    std::vector<size_t>& hull = hulls[t];
    for (size_t i : order) {
      if (!hull.empty() && pts[i].error >= pts[hull.back()].error) continue;  // dominated
      // b (the last) leaves the hull when the step a -> i saves at least as much per byte as a -> b
      while (hull.size() >= 2) {
        const BudgetPoint& a = pts[hull[hull.size() - 2]];
        const BudgetPoint& b = pts[hull.back()];
        const double ab = (a.error - b.error) / static_cast<double>(b.bytes - a.bytes);
        const double ai = (a.error - pts[i].error) / static_cast<double>(pts[i].bytes - a.bytes);
        if (ai < ab) break;
        hull.pop_back();
      }
      hull.push_back(i);
    }
    total += pts[hull[0]].bytes;
  }
  if (total > budget) {
    return resource_exhausted(
        "the budget of {} bytes cannot be met: the smallest types of the tensors it covers come to {} bytes",
        budget, total);
  }
  // The greedy pass: the step with the most error saved per byte first (ties: the earlier tensor).
  std::vector<size_t> at(tensors.size(), 0);  // position in the hull
  using Step = std::pair<double, size_t>;     // (error saved per byte, -tensor as an unsigned order)
  auto cmp = [](const Step& x, const Step& y) {
    return x.first < y.first || (x.first == y.first && x.second > y.second);
  };
  std::priority_queue<Step, std::vector<Step>, decltype(cmp)> steps(cmp);
  const auto push = [&](size_t t) {
    const std::vector<size_t>& hull = hulls[t];
    if (at[t] + 1 >= hull.size()) return;
    const BudgetPoint& a = tensors[t][hull[at[t]]];
    const BudgetPoint& b = tensors[t][hull[at[t] + 1]];
    steps.push({(a.error - b.error) / static_cast<double>(b.bytes - a.bytes), t});
  };
  for (size_t t = 0; t < tensors.size(); ++t) push(t);
  while (!steps.empty()) {
    const size_t t = steps.top().second;
    steps.pop();
    const uint64_t from = tensors[t][hulls[t][at[t]]].bytes, to = tensors[t][hulls[t][at[t] + 1]].bytes;
    if (total - from + to > budget) continue;  // does not fit: this tensor stays where it is
    total = total - from + to;
    ++at[t];
    push(t);
  }
  std::vector<size_t> choice(tensors.size());
  for (size_t t = 0; t < tensors.size(); ++t) choice[t] = hulls[t][at[t]];
  // What is left: each tensor in turn takes its point of least error that still fits (off the hull too), so
  // that no single tensor could do better alone.
  for (size_t t = 0; t < tensors.size(); ++t) {
    const std::vector<BudgetPoint>& pts = tensors[t];
    size_t best = choice[t];
    for (size_t i = 0; i < pts.size(); ++i) {
      if (pts[i].error < pts[best].error && total - pts[choice[t]].bytes + pts[i].bytes <= budget) best = i;
    }
    total = total - pts[choice[t]].bytes + pts[best].bytes;
    choice[t] = best;
  }
  return choice;
}

}  // namespace kiln::quant
