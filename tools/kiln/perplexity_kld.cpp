#include "perplexity_kld.h"

#include <cstdio>
#include <string>

namespace kiln::cli {

namespace {

// "99.9%", "Median", ... the row label of a percentile; `what` pads to the reference layout.
std::string percentile_label(float fraction) {
  if (fraction >= 1) return "Maximum";
  if (fraction <= 0) return "Minimum";
  if (fraction == 0.5f) return "Median ";
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%4.1f%%  ", 100.0 * fraction);
  return buf;
}

// JSON key of a percentile: "max", "p99.9", "median", "min".
std::string percentile_key(float fraction) {
  if (fraction >= 1) return "max";
  if (fraction <= 0) return "min";
  if (fraction == 0.5f) return "median";
  char buf[16];
  std::snprintf(buf, sizeof(buf), "p%g", 100.0 * static_cast<double>(fraction));
  return buf;
}

nlohmann::json estimate(const kld::Estimate& e) { return {{"value", e.value}, {"error", e.error}}; }

}  // namespace

void print_kld_chunk_header() {
  std::printf(
      "chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS   "
      "  "
      "       Same top p\n");
}

void print_kld_chunk_line(int64_t chunk, const kld::Report& r) {
  std::printf(
      "%4lld    %9.4lf ± %9.4lf    %10.5lf ± %10.5lf    %10.5lf ± %10.5lf    %6.3lf ± %6.3lf %%    %6.3lf ± "
      "%6.3lf %%\n",
      static_cast<long long>(chunk), r.ppl.value, r.ppl.error, r.ln_ppl_ratio.value, r.ln_ppl_ratio.error,
      r.kld.value, r.kld.error, 100 * r.p_diff_rms.value, 100 * r.p_diff_rms.error, 100 * r.same_top.value,
      100 * r.same_top.error);
  std::fflush(stdout);
}

void print_kld_summary(const kld::Report& r) {
  std::printf("\n====== Perplexity statistics ======\n");
  std::printf("Mean PPL(Q)                   : %10.6lf ± %10.6lf\n", r.ppl.value, r.ppl.error);
  std::printf("Mean PPL(base)                : %10.6lf ± %10.6lf\n", r.ppl_base.value, r.ppl_base.error);
  std::printf("Cor(ln(PPL(Q)), ln(PPL(base))): %6.2lf%%\n", 100 * r.ln_ppl_correlation);
  std::printf("Mean ln(PPL(Q)/PPL(base))     : %10.6lf ± %10.6lf\n", r.ln_ppl_ratio.value,
              r.ln_ppl_ratio.error);
  std::printf("Mean PPL(Q)/PPL(base)         : %10.6lf ± %10.6lf\n", r.ppl_ratio.value, r.ppl_ratio.error);
  std::printf("Mean PPL(Q)-PPL(base)         : %10.6lf ± %10.6lf\n", r.ppl_diff.value, r.ppl_diff.error);
  std::printf("\n====== KL divergence statistics ======\n");
  std::printf("Mean    KLD: %10.6lf ± %10.6lf\n", r.kld.value, r.kld.error);
  for (const auto& [f, v] : r.kld_percentiles) {
    std::printf("%s KLD: %10.6f\n", percentile_label(f).c_str(), static_cast<double>(v));
  }
  std::printf("\n====== Token probability statistics ======\n");
  std::printf("Mean    Δp: %6.3lf ± %5.3lf %%\n", 100 * r.p_diff.value, 100 * r.p_diff.error);
  for (const auto& [f, v] : r.p_diff_percentiles) {
    std::printf("%s Δp: %6.3lf%%\n", percentile_label(f).c_str(), 100 * static_cast<double>(v));
  }
  std::printf("RMS Δp    : %6.3lf ± %5.3lf %%\n", 100 * r.p_diff_rms.value, 100 * r.p_diff_rms.error);
  std::printf("Same top p: %6.3lf ± %5.3lf %%\n", 100 * r.same_top.value, 100 * r.same_top.error);
}

nlohmann::json kld_report_json(const kld::Report& r) {
  nlohmann::json kld_p = nlohmann::json::object(), p_diff_p = nlohmann::json::object();
  for (const auto& [f, v] : r.kld_percentiles) kld_p[percentile_key(f)] = v;
  for (const auto& [f, v] : r.p_diff_percentiles) p_diff_p[percentile_key(f)] = v;
  return {{"scored_tokens", r.count},
          {"ppl", estimate(r.ppl)},
          {"ppl_base", estimate(r.ppl_base)},
          {"ln_ppl_correlation", r.ln_ppl_correlation},
          {"ln_ppl_ratio", estimate(r.ln_ppl_ratio)},
          {"ppl_ratio", estimate(r.ppl_ratio)},
          {"ppl_diff", estimate(r.ppl_diff)},
          {"kld", estimate(r.kld)},
          {"kld_percentiles", kld_p},
          {"p_diff", estimate(r.p_diff)},
          {"p_diff_percentiles", p_diff_p},
          {"p_diff_rms", estimate(r.p_diff_rms)},
          {"same_top", estimate(r.same_top)}};
}

}  // namespace kiln::cli
