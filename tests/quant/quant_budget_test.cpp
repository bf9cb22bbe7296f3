// Quantization to a size budget (quant/quant_budget.h): the allocation fits, ignores dominated points, is
// the optimum on small cases checked exhaustively (within the greedy's last partial step), and refuses a
// budget the smallest types exceed; the sampled errors fall as the types get more bits and follow the
// importance.
#include "quant/quant_budget.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/thread_pool.h"

namespace kiln::quant {
namespace {

using Points = std::vector<std::vector<BudgetPoint>>;

uint64_t bytes_of(const Points& t, const std::vector<size_t>& c) {
  uint64_t b = 0;
  for (size_t i = 0; i < t.size(); ++i) b += t[i][c[i]].bytes;
  return b;
}
double error_of(const Points& t, const std::vector<size_t>& c) {
  double e = 0;
  for (size_t i = 0; i < t.size(); ++i) e += t[i][c[i]].error;
  return e;
}

// Ladders like the real ones: bytes up, error down roughly geometrically, with some noise.
Points random_points(std::mt19937& rng, size_t n_tensors) {
  std::uniform_real_distribution<double> u(0.5, 1.5);
  Points t(n_tensors);
  for (auto& pts : t) {
    const double scale = u(rng) * 100.0, sens = u(rng);
    for (int k = 0; k < 5; ++k)
      pts.push_back(
          {DType::q4_0, static_cast<uint64_t>(scale * (2 + k) * u(rng)), sens * std::pow(0.3, k) * u(rng)});
  }
  return t;
}

TEST(QuantBudget, FitsAndMatchesTheExhaustiveOptimumClosely) {
  std::mt19937 rng(7);
  int exact = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const Points t = random_points(rng, 4);
    uint64_t min_bytes = 0, max_bytes = 0;
    for (const auto& pts : t) {
      uint64_t mn = UINT64_MAX, mx = 0;
      for (const auto& p : pts) mn = std::min(mn, p.bytes), mx = std::max(mx, p.bytes);
      min_bytes += mn, max_bytes += mx;
    }
    const uint64_t budget = min_bytes + (max_bytes - min_bytes) * static_cast<uint64_t>(trial % 10) / 10;
    auto got = allocate_budget(t, budget);
    ASSERT_TRUE(got.ok()) << got.status().message();
    ASSERT_LE(bytes_of(t, *got), budget);
    // Exhaustive (5^4 assignments): the least error within a budget.
    const auto best_within = [&](uint64_t b) {
      double best = INFINITY;
      for (int code = 0; code < 625; ++code) {
        std::vector<size_t> c = {static_cast<size_t>(code % 5), static_cast<size_t>(code / 5 % 5),
                                 static_cast<size_t>(code / 25 % 5), static_cast<size_t>(code / 125)};
        if (bytes_of(t, c) <= b) best = std::min(best, error_of(t, c));
      }
      return best;
    };
    // The greedy can miss the optimum by its last step: never worse than the optimum of a budget one
    // largest step (of any tensor's ladder) smaller.
    uint64_t max_step = 0;
    for (const auto& pts : t) {
      for (const auto& a : pts)
        for (const auto& b : pts) max_step = std::max(max_step, b.bytes > a.bytes ? b.bytes - a.bytes : 0);
    }
    const double best = best_within(budget);
    const double e = error_of(t, *got);
    EXPECT_GE(e, best - 1e-12);
    if (budget >= min_bytes + max_step) {
      EXPECT_LE(e, best_within(budget - max_step) + 1e-12) << "trial " << trial;
    }
    exact += e <= best + 1e-12;
    // No single tensor could do better alone with what is left.
    for (size_t i = 0; i < t.size(); ++i) {
      for (size_t k = 0; k < t[i].size(); ++k) {
        if (t[i][k].error < t[i][(*got)[i]].error) {
          EXPECT_GT(bytes_of(t, *got) - t[i][(*got)[i]].bytes + t[i][k].bytes, budget);
        }
      }
    }
  }
  std::printf("allocation at the exhaustive optimum in %d of 200 cases\n", exact);
  EXPECT_GE(exact, 140);
}

TEST(QuantBudget, EndsAndDominatedPoints) {
  // Tensor 0: a dominated point (more bytes, more error) that must never be taken.
  const Points t = {{{DType::q2_k, 100, 1.0}, {DType::q3_k, 150, 1.2}, {DType::q4_k, 200, 0.1}},
                    {{DType::q2_k, 50, 0.5}, {DType::q8_0, 400, 0.0}}};
  auto all = allocate_budget(t, 10'000);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ((*all)[0], 2u);
  EXPECT_EQ((*all)[1], 1u);
  auto least = allocate_budget(t, 150);
  ASSERT_TRUE(least.ok());
  EXPECT_EQ((*least)[0], 0u);
  EXPECT_EQ((*least)[1], 0u);
  auto mid = allocate_budget(t, 260);
  ASSERT_TRUE(mid.ok());
  EXPECT_EQ((*mid)[0], 2u);  // 0.9 saved for 100 bytes beats 0.5 for 350
  EXPECT_EQ((*mid)[1], 0u);
  auto none = allocate_budget(t, 149);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::resource_exhausted);
  EXPECT_NE(none.status().message().find("come to 150 bytes"), std::string::npos) << none.status().message();
}

TEST(QuantBudget, Ladders) {
  EXPECT_EQ(budget_ladder(4096).front(), DType::q2_k);
  EXPECT_EQ(budget_ladder(4096).back(), DType::q8_0);
  EXPECT_EQ(budget_ladder(576).front(), DType::q4_0);
  EXPECT_TRUE(budget_ladder(100).empty());
}

TEST(QuantBudget, ErrorsFallWithBitsAndFollowTheImportance) {
  constexpr int64_t kRows = 64, kCols = 512;
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(kRows * kCols));
  for (float& x : w) x = n(rng);
  ThreadPool pool(2);
  const std::vector<DType> types = budget_ladder(kCols);
  const std::vector<double> e = rounding_errors(w.data(), kRows, kCols, nullptr, types, pool);
  ASSERT_EQ(e.size(), types.size());
  const auto at = [&](DType t) {
    return e[static_cast<size_t>(std::find(types.begin(), types.end(), t) - types.begin())];
  };
  EXPECT_GT(at(DType::q2_k), at(DType::q3_k));
  EXPECT_GT(at(DType::q3_k), at(DType::q4_k));
  EXPECT_GT(at(DType::q4_k), at(DType::q5_k));
  EXPECT_GT(at(DType::q5_k), at(DType::q6_k));
  EXPECT_GT(at(DType::q6_k), at(DType::q8_0));
  EXPECT_LT(at(DType::q4_k), 0.01);  // about 4.5 bits: a noise-to-signal ratio of ~0.4%
  // A ratio: the importance's scale does not change it.
  std::vector<float> imp(kCols), imp7(kCols);
  for (int64_t j = 0; j < kCols; ++j) {
    imp[static_cast<size_t>(j)] = 0.5f + static_cast<float>(j % 7);
    imp7[static_cast<size_t>(j)] = 8.0f * imp[static_cast<size_t>(j)];
  }
  const std::vector<double> a = rounding_errors(w.data(), kRows, kCols, imp.data(), types, pool);
  const std::vector<double> b = rounding_errors(w.data(), kRows, kCols, imp7.data(), types, pool);
  for (size_t k = 0; k < types.size(); ++k) EXPECT_NEAR(a[k] / b[k], 1.0, 1e-6) << dtype_name(types[k]);
}

}  // namespace
}  // namespace kiln::quant
