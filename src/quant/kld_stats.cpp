#include "quant/kld_stats.h"

#include <algorithm>
#include <cmath>

namespace kiln::kld {

Position compare_row(std::span<const float> logits, const RowView& base, int32_t token) {
  const size_t n = logits.size();
  KILN_ASSERT(n > 0 && token >= 0 && static_cast<size_t>(token) < n);
  // The model: its top token (the first of equals), log-sum-exp and the token's nll, in f32 per term.
  float max_logit = logits[0];
  size_t top = 0;
  for (size_t i = 1; i < n; ++i) {
    if (logits[i] > max_logit) {
      max_logit = logits[i];
      top = i;
    }
  }
  double sum_exp = 0;
  for (const float x : logits) sum_exp += std::exp(x - max_logit);
  const auto log_sum_exp = static_cast<float>(std::log(sum_exp));
  const float log_norm = max_logit + log_sum_exp;  // log p_i = logits[i] - log_norm
  Position pos;
  pos.nll = log_norm - logits[static_cast<size_t>(token)];
  pos.nll_base = -base.log_prob(token);
  // KL(base || model) over the entries the base row resolves (above -16 nats), and the base's top token.
  size_t top_base = 0;
  float top_base_log_prob = 0;
  for (size_t i = 0; i < n; ++i) {
    const float lp_base = base.log_prob(static_cast<int32_t>(i));
    if (i == 0 || lp_base > top_base_log_prob) {
      top_base_log_prob = lp_base;
      top_base = i;
    }
    if (lp_base > -kLogProbRange) pos.kld += std::exp(lp_base) * (lp_base - logits[i] + log_norm);
  }
  pos.same_top = top == top_base;
  pos.p_diff = std::exp(-pos.nll) - std::exp(-pos.nll_base);
  return pos;
}

void Sums::add(const Position& p) {
  nll += p.nll;
  nll2 += p.nll * p.nll;
  nll_base += p.nll_base;
  nll_base2 += p.nll_base * p.nll_base;
  nll_nll_base += p.nll * p.nll_base;
  kld += p.kld;
  kld2 += p.kld * p.kld;
  const double p_diff_sq = p.p_diff * p.p_diff;
  p_diff += p.p_diff;
  p_diff2 += p_diff_sq;
  p_diff4 += p_diff_sq * p_diff_sq;
  n_same_top += p.same_top ? 1 : 0;
  ++count;
}

Estimate mean_and_error(double sum, double sum2, int64_t count) {
  if (count < 1) return {};
  const auto n = static_cast<double>(count);
  const double mean = sum / n, var = sum2 / n - mean * mean;
  return {mean, var > 0 && count > 10 ? std::sqrt(var / (n - 1)) : 0.0};
}

double covariance_of_means(double sum_a, double sum_b, double sum_ab, int64_t count) {
  if (count < 10) return 0;
  const auto n = static_cast<double>(count);
  return (sum_ab / n - (sum_a / n) * (sum_b / n)) / (n - 1);
}

float percentile(std::span<const float> sorted, float fraction) {
  KILN_ASSERT(!sorted.empty());
  if (fraction <= 0) return sorted.front();
  if (fraction >= 1) return sorted.back();
  float at = fraction * static_cast<float>(sorted.size() - 1);
  const auto i = static_cast<size_t>(at);
  at -= static_cast<float>(i);
  return (1 - at) * sorted[i] + at * sorted[std::min(i + 1, sorted.size() - 1)];
}

float median(std::span<const float> sorted) {
  KILN_ASSERT(!sorted.empty());
  const size_t n = sorted.size();
  return n % 2 == 0 ? 0.5f * (sorted[n / 2] + sorted[n / 2 - 1]) : sorted[n / 2];
}

namespace {

// Everything but the percentiles.
Report summary(const Sums& s) {
  Report r;
  r.count = s.count;
  const Estimate ln_ppl = mean_and_error(s.nll, s.nll2, s.count);
  const Estimate ln_ppl_base = mean_and_error(s.nll_base, s.nll_base2, s.count);
  r.ppl = {std::exp(ln_ppl.value), std::exp(ln_ppl.value) * ln_ppl.error};
  r.ppl_base = {std::exp(ln_ppl_base.value), std::exp(ln_ppl_base.value) * ln_ppl_base.error};
  const double cov = covariance_of_means(s.nll, s.nll_base, s.nll_nll_base, s.count);
  const double errors = ln_ppl.error * ln_ppl_base.error;
  r.ln_ppl_correlation = errors > 0 ? cov / errors : 0.0;
  r.ln_ppl_ratio = {ln_ppl.value - ln_ppl_base.value,
                    std::sqrt(std::max(
                        0.0, ln_ppl.error * ln_ppl.error + ln_ppl_base.error * ln_ppl_base.error - 2 * cov))};
  r.ppl_ratio = {std::exp(r.ln_ppl_ratio.value), std::exp(r.ln_ppl_ratio.value) * r.ln_ppl_ratio.error};
  const double ppl_cov = r.ppl.value * r.ppl_base.value * cov;
  r.ppl_diff = {r.ppl.value - r.ppl_base.value,
                std::sqrt(std::max(
                    0.0, r.ppl.error * r.ppl.error + r.ppl_base.error * r.ppl_base.error - 2 * ppl_cov))};
  r.kld = mean_and_error(s.kld, s.kld2, s.count);
  r.p_diff = mean_and_error(s.p_diff, s.p_diff2, s.count);
  const Estimate mse = mean_and_error(s.p_diff2, s.p_diff4, s.count);
  const double rms = std::sqrt(mse.value);
  r.p_diff_rms = {rms, rms > 0 ? 0.5 / rms * mse.error : 0.0};
  const double same = s.count > 0 ? static_cast<double>(s.n_same_top) / static_cast<double>(s.count) : 0.0;
  r.same_top = {same, s.count > 1 ? std::sqrt(same * (1 - same) / static_cast<double>(s.count - 1)) : 0.0};
  return r;
}

Percentiles percentiles(std::span<const float> sorted, std::span<const float> fractions) {
  Percentiles out;
  for (const float f : fractions) out.emplace_back(f, f == 0.5f ? median(sorted) : percentile(sorted, f));
  return out;
}

}  // namespace

Report running_report(const Sums& sums) { return summary(sums); }

Report final_report(const Sums& sums, std::vector<float>& kld_values, std::vector<float>& p_diff_values) {
  Report r = summary(sums);
  if (kld_values.empty()) return r;
  std::sort(kld_values.begin(), kld_values.end());
  std::sort(p_diff_values.begin(), p_diff_values.end());
  static constexpr float kKld[] = {1.0f, 0.999f, 0.99f, 0.95f, 0.9f, 0.5f, 0.1f, 0.05f, 0.01f, 0.001f, 0.0f};
  static constexpr float kPDiff[] = {1.0f,  0.999f, 0.99f, 0.95f, 0.9f,   0.75f, 0.5f,
                                     0.25f, 0.1f,   0.05f, 0.01f, 0.001f, 0.0f};
  r.kld_percentiles = percentiles(kld_values, kKld);
  r.p_diff_percentiles = percentiles(p_diff_values, kPDiff);
  return r;
}

}  // namespace kiln::kld
