// The CPU's token draw (ops::sample_row) against distributions computed from first principles
// (sample_stats.h): for fixed logits and each filter, 10^5 draws pass a chi-square test against the exact
// filtered distribution, and the same draws fail it against the distribution with the filter's boundary moved
// by one token.
#include "ops/sample.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "sample_stats.h"

namespace kiln::ops {
namespace {

using sample_stats::chi_square;
using sample_stats::ChiSquare;
using sample_stats::filtered;

TEST(Sample, DrawsFollowTheExactFilteredDistribution) {
  std::mt19937_64 gen(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> a(200);
  for (float& v : a) v = normal(gen);
  a[17] = a[18];  // a tie
  struct Case {
    const char* name;
    float temperature;
    int32_t top_k;
    float top_p, min_p;
  };
  const Case cases[] = {{"temperature", 0.9f, 0, 1.0f, 0.0f},
                        {"top_k", 1.0f, 12, 1.0f, 0.0f},
                        {"top_p", 0.8f, 0, 0.9f, 0.0f},
                        {"min_p", 1.0f, 0, 1.0f, 0.05f},
                        {"all", 1.1f, 30, 0.95f, 0.01f}};
  constexpr int64_t kDraws = 100000;
  SampleScratch scratch;
  for (const Case& c : cases) {
    SampleRow p;
    p.temperature = c.temperature, p.top_k = c.top_k, p.top_p = c.top_p, p.min_p = c.min_p;
    p.seed_lo = 1234;
    std::vector<int64_t> counts(a.size(), 0);
    for (int64_t d = 0; d < kDraws; ++d) {
      p.counter = static_cast<uint32_t>(d);
      const SampleOut o = sample_row(a, p, {}, scratch);
      ASSERT_GE(o.token, 0);
      ++counts[static_cast<size_t>(o.token)];
    }
    const ChiSquare fit = chi_square(counts, filtered(a, p, {}, 0), kDraws);
    EXPECT_LT(fit.stat, fit.limit) << c.name;
    if (c.top_k > 0 || c.top_p < 1.0f || c.min_p > 0.0f) {
      // The test has teeth: one token more or fewer kept is rejected.
      for (const int shift : {-1, 1}) {
        const ChiSquare wrong = chi_square(counts, filtered(a, p, {}, shift), kDraws);
        EXPECT_GT(wrong.stat, wrong.limit) << c.name << " shift " << shift;
      }
    }
  }
}

TEST(Sample, PenalizedDrawsFollowThePenalizedLogits) {
  std::vector<float> x(50);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<float>(i)) * 3.0f;
  SampleRow p;
  p.temperature = 1.0f;
  p.repeat_penalty = 1.5f, p.frequency_penalty = 0.3f, p.presence_penalty = 0.2f;
  const std::vector<SampleAdjust> adjust = {
      {1, 0.0f, 2, 0}, {2, 1.5f, 0, 0}, {8, -0.5f, 1, 0}, {11, 0.0f, 0, 1}};
  std::vector<float> a = x;
  for (const SampleAdjust& e : adjust)
    a[static_cast<size_t>(e.id)] = sample_adjusted(x[static_cast<size_t>(e.id)], p, e);
  EXPECT_EQ(a[11], -INFINITY);
  EXPECT_FLOAT_EQ(a[1], (x[1] > 0 ? x[1] / 1.5f : x[1] * 1.5f) - 0.6f - 0.2f);
  constexpr int64_t kDraws = 100000;
  std::vector<int64_t> counts(x.size(), 0);
  SampleScratch scratch;
  for (int64_t d = 0; d < kDraws; ++d) {
    p.counter = static_cast<uint32_t>(d);
    ++counts[static_cast<size_t>(sample_row(x, p, adjust, scratch).token)];
  }
  const ChiSquare fit = chi_square(counts, filtered(x, p, adjust, 0), kDraws);
  EXPECT_LT(fit.stat, fit.limit);
  EXPECT_EQ(counts[11], 0);
}

// The reference and the partial-selection path agree token for token, over seeds, filters and ties.
TEST(Sample, PartialSelectionIsTheReference) {
  std::mt19937_64 gen(9);
  std::uniform_real_distribution<float> u(-6.0f, 6.0f);
  SampleScratch scratch;
  for (const int n : {1, 2, 64, 4099, 49152}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (int rep = 0; rep < 40; ++rep) {
      for (float& v : x) v = rep % 2 ? std::round(u(gen) * 4.0f) / 4.0f : u(gen);
      SampleRow p;
      p.temperature = rep % 7 == 0 ? 0.0f : 0.5f + 0.1f * static_cast<float>(rep % 9);
      p.top_k = rep % 3 == 0 ? 0 : rep * 3;
      p.top_p = rep % 4 == 0 ? 1.0f : 0.6f + 0.01f * static_cast<float>(rep);
      p.min_p = rep % 5 == 0 ? 0.02f : 0.0f;
      p.seed_lo = static_cast<uint32_t>(rep * 77);
      p.counter = static_cast<uint32_t>(rep);
      p.n_top = rep % 21;
      const SampleOut want = sample_row_reference(x, p, {});
      const SampleOut got = sample_row(x, p, {}, scratch);
      ASSERT_EQ(got.token, want.token) << "n " << n << " rep " << rep;
      ASSERT_EQ(got.n_top, want.n_top);
      for (int j = 0; j < got.n_top; ++j) EXPECT_EQ(got.top_id[j], want.top_id[j]);
    }
  }
}

// A mask is a ban of every token it leaves out: the reference and the CPU path with a mask give the words
// of the reference with those tokens banned through adjust entries, over filters, greedy and a few allowed
// tokens; a masked token's entry never counts, not even one whose bias overflows; no token allowed is
// kSampleAllMasked; the logprobs stay those of the raw logits.
TEST(Sample, AMaskIsABanOfTheTokensItLeavesOut) {
  std::mt19937_64 gen(13);
  std::uniform_real_distribution<float> u(-6.0f, 6.0f);
  SampleScratch scratch;
  for (const int n : {5, 33, 4099, 49152}) {
    std::vector<float> x(static_cast<size_t>(n));
    std::vector<uint32_t> mask(static_cast<size_t>((n + 31) / 32));
    for (int rep = 0; rep < 24; ++rep) {
      for (float& v : x) v = rep % 2 ? std::round(u(gen) * 4.0f) / 4.0f : u(gen);
      std::fill(mask.begin(), mask.end(), 0u);
      std::vector<SampleAdjust> bans, with_mask;
      const int every = rep % 3 == 0 ? 2 : rep % 3 == 1 ? std::min(17, n) : n;  // dense, sparse, one
      for (int id = 0; id < n; ++id) {
        const bool allowed = (id + rep) % every == 0;
        if (allowed) mask[static_cast<size_t>(id / 32)] |= 1u << (id % 32);
        if (!allowed) bans.push_back({id, 0.0f, 0, 1});
        if (id % 5 == 0) with_mask.push_back({id, allowed ? 0.5f : 3e38f, 1, 0});  // overflow if it counted
      }
      SampleRow p;
      p.temperature = rep % 4 == 0 ? 0.0f : 0.7f + 0.05f * static_cast<float>(rep);
      p.top_k = rep % 5 == 1 ? 3 : 0;
      p.top_p = rep % 3 == 2 ? 0.9f : 1.0f;
      p.repeat_penalty = 1.2f;
      p.seed_lo = static_cast<uint32_t>(rep);
      p.n_top = 4;
      // The adjusted values of the allowed tokens, as entries beside the bans.
      std::vector<SampleAdjust> merged = bans;
      for (const SampleAdjust& e : with_mask) {
        if ((mask[static_cast<size_t>(e.id / 32)] >> (e.id % 32) & 1u) != 0) merged.push_back(e);
      }
      std::sort(merged.begin(), merged.end(),
                [](const SampleAdjust& a, const SampleAdjust& b) { return a.id < b.id; });
      const SampleOut want = sample_row_reference(x, p, merged);
      ASSERT_GE(want.token, 0) << "n " << n << " rep " << rep;
      ASSERT_TRUE(mask[static_cast<size_t>(want.token / 32)] >> (want.token % 32) & 1u);
      for (const SampleOut& got :
           {sample_row_reference(x, p, with_mask, mask), sample_row(x, p, with_mask, scratch, mask)}) {
        ASSERT_EQ(got.token, want.token) << "n " << n << " rep " << rep;
        EXPECT_EQ(got.logprob, want.logprob);
        for (int j = 0; j < 4 && j < n; ++j) EXPECT_EQ(got.top_id[j], want.top_id[j]);
      }
    }
    std::fill(mask.begin(), mask.end(), 0u);
    for (const float t : {0.0f, 1.0f}) {
      SampleRow p;
      p.temperature = t;
      EXPECT_EQ(sample_row_reference(x, p, {}, mask).token, kSampleAllMasked);
      EXPECT_EQ(sample_row(x, p, {}, scratch, mask).token, kSampleAllMasked);
    }
  }
}

TEST(Sample, UniformDependsOnSeedAndCounterOnly) {
  EXPECT_EQ(sample_uniform(7, 3), sample_uniform(7, 3));
  EXPECT_NE(sample_uniform(7, 3), sample_uniform(7, 4));
  EXPECT_NE(sample_uniform(7, 3), sample_uniform(8, 3));
  double lo = 1.0, hi = 0.0, sum = 0.0;
  for (uint32_t c = 0; c < 100000; ++c) {
    const double v = sample_uniform(42, c);
    ASSERT_GE(v, 0.0);
    ASSERT_LT(v, 1.0);
    lo = std::min(lo, v), hi = std::max(hi, v), sum += v;
  }
  EXPECT_LT(lo, 1e-3);
  EXPECT_GT(hi, 1.0 - 1e-3);
  EXPECT_NEAR(sum / 100000.0, 0.5, 0.005);
}

}  // namespace
}  // namespace kiln::ops
