// The statistics the draw tests share (tests/ops/sample_test.cpp for the CPU, tests/cuda/cuda_sample_test.cpp
// for CUDA): the exact distribution a row defines, computed from first principles, and Pearson's chi-square.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "ops/sample.h"

namespace kiln::sample_stats {

using ops::SampleAdjust;
using ops::SampleRow;

// The distribution the contract defines for a row, from first principles: adjusted logits, the order, the
// filters, weights normalised over the kept tokens (double). `shift` moves the kept boundary by that many
// tokens (the alternative that the test must reject).
inline std::vector<double> filtered(const std::vector<float>& x, const SampleRow& p,
                                    const std::vector<SampleAdjust>& adj, int shift) {
  std::vector<double> a(x.begin(), x.end());
  for (const SampleAdjust& e : adj) {
    double v = a[static_cast<size_t>(e.id)] + e.bias;
    if (e.count > 0) {
      v = v > 0 ? v / p.repeat_penalty : v * p.repeat_penalty;
      v -= p.frequency_penalty * e.count + p.presence_penalty;
    }
    a[static_cast<size_t>(e.id)] = e.banned != 0 ? -HUGE_VAL : v;
  }
  std::vector<size_t> order;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != -HUGE_VAL) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t l, size_t r) { return a[l] > a[r]; });
  size_t n = order.size();
  if (p.top_k > 0) n = std::min(n, static_cast<size_t>(p.top_k));
  std::vector<double> w(n);
  for (size_t i = 0; i < n; ++i) w[i] = std::exp((a[order[i]] - a[order[0]]) / p.temperature);
  if (p.top_p < 1.0f) {
    const double total = std::accumulate(w.begin(), w.end(), 0.0);
    double cum = 0.0;
    for (size_t i = 0; i < n; ++i) {
      cum += w[i];
      if (cum >= p.top_p * total) {
        n = i + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.0f)
    n = static_cast<size_t>(std::count_if(w.begin(), w.begin() + n, [&](double v) { return v >= p.min_p; }));
  n = static_cast<size_t>(
      std::clamp<int64_t>(static_cast<int64_t>(n) + shift, 1, static_cast<int64_t>(order.size())));
  double total = 0.0;
  std::vector<double> prob(x.size(), 0.0);
  for (size_t i = 0; i < n; ++i) total += std::exp((a[order[i]] - a[order[0]]) / p.temperature);
  for (size_t i = 0; i < n; ++i)
    prob[order[i]] = std::exp((a[order[i]] - a[order[0]]) / p.temperature) / total;
  return prob;
}

// Pearson's statistic of `counts` (draws) against `prob`, cells of expected count < 5 merged, with the
// quantile of its chi-square distribution at 1 - 1e-3 (Wilson-Hilferty). +inf where a draw fell outside
// prob's support.
struct ChiSquare {
  double stat, limit;
};
inline ChiSquare chi_square(const std::vector<int64_t>& counts, const std::vector<double>& prob,
                            int64_t draws) {
  double stat = 0.0, pooled_e = 0.0;
  int64_t pooled_o = 0, cells = 0;
  for (size_t i = 0; i < prob.size(); ++i) {
    const double e = prob[i] * static_cast<double>(draws);
    if (e == 0.0) {
      if (counts[i] > 0) return {HUGE_VAL, 0.0};
      continue;
    }
    if (e < 5.0) {
      pooled_e += e, pooled_o += counts[i];
      continue;
    }
    const double d = static_cast<double>(counts[i]) - e;
    stat += d * d / e, ++cells;
  }
  if (pooled_e > 0.0) {
    const double d = static_cast<double>(pooled_o) - pooled_e;
    stat += d * d / pooled_e, ++cells;
  }
  const double df = static_cast<double>(std::max<int64_t>(cells - 1, 1)), z = 3.090232306167813;  // 1 - 1e-3
  const double h = 2.0 / (9.0 * df);
  return {stat, df * std::pow(1.0 - h + z * std::sqrt(h), 3.0)};
}

}  // namespace kiln::sample_stats
