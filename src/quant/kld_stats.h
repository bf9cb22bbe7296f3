// KL divergence of a model's token distributions from a base model's (quant/kld_file.h's rows), and the
// statistics llama.cpp's llama-perplexity --kl-divergence reports, computed the same way: per position the
// KL divergence KL(base || model) summed over the entries whose base log-prob is above -16, the two models'
// negative log-likelihoods of the text's next token, Δp (the model's probability of that token less the
// base's), and whether their most likely tokens agree; over positions, means with the standard error of the
// mean, the covariance of the two log-likelihoods (for the error of ln(PPL(Q)/PPL(base))), percentiles by
// linear interpolation between sorted values.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "quant/kld_file.h"

namespace kiln::kld {

// One position compared: f32 per-position values as the reference computes them.
struct Position {
  double kld = 0;         // KL(base || model) over the entries whose base log-prob is above -16
  float p_diff = 0;       // p(token) - p_base(token)
  float nll = 0;          // -log p(token)
  float nll_base = 0;     // -log p_base(token), from the row
  bool same_top = false;  // the two most likely tokens (the first of equals) are the same
};

// Compares one position: the model's logits (f32 [n_vocab]) against the base row, `token` the text's next
// token. Pure: positions may be compared on any thread, in any order.
Position compare_row(std::span<const float> logits, const RowView& base, int32_t token);

// Sums over positions, in f64, of the f32 values (squares and products taken in f32, as the reference does).
// Positions added in the same order give the same sums.
struct Sums {
  double nll = 0, nll2 = 0;            // the model's -log p(token), and its square
  double nll_base = 0, nll_base2 = 0;  // the base's, from the row
  double nll_nll_base = 0;             // their product
  double kld = 0, kld2 = 0;
  double p_diff = 0, p_diff2 = 0, p_diff4 = 0;
  int64_t n_same_top = 0;
  int64_t count = 0;
  void add(const Position& p);
};

// A mean with its standard error (0 when 10 positions or fewer, or no spread).
struct Estimate {
  double value = 0, error = 0;
};
Estimate mean_and_error(double sum, double sum2, int64_t count);
// The covariance of the means of a and b (0 below 10 positions).
double covariance_of_means(double sum_a, double sum_b, double sum_ab, int64_t count);
// `sorted` ascending, not empty; fraction in [0, 1]: linear interpolation at fraction * (n - 1), in f32.
float percentile(std::span<const float> sorted, float fraction);
// The middle value, or the mean of the two middle values.
float median(std::span<const float> sorted);

// The percentiles a report lists, in order: {fraction, value}. KL divergence: maximum, 99.9, 99, 95, 90,
// median, 10, 5, 1, 0.1, minimum; Δp adds 75 and 25.
using Percentiles = std::vector<std::pair<float, float>>;

struct Report {
  int64_t count = 0;
  Estimate ppl, ppl_base;         // exp(mean nll), error ppl * error of the mean nll
  double ln_ppl_correlation = 0;  // of the two mean nll estimates
  Estimate ln_ppl_ratio;          // mean nll - mean nll_base
  Estimate ppl_ratio;             // exp of that
  Estimate ppl_diff;              // ppl - ppl_base
  Estimate kld;                   // mean KL divergence
  Percentiles kld_percentiles;    // fraction 1 is the maximum, 0.5 the median, 0 the minimum
  Estimate p_diff;                // mean Δp
  Percentiles p_diff_percentiles;
  Estimate p_diff_rms;  // sqrt of the mean Δp², its error by the delta method
  Estimate same_top;    // fraction of positions whose top tokens agree, binomial error
};

// The running figures of a chunk line: ppl, ln ratio, KL divergence, Δp RMS and same-top so far.
Report running_report(const Sums& sums);
// The final report; sorts the per-position values in place.
Report final_report(const Sums& sums, std::vector<float>& kld_values, std::vector<float>& p_diff_values);

}  // namespace kiln::kld
