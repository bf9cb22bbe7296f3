#include "server/prometheus.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace kiln::server {

namespace {

std::vector<double> latency_buckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5,
          0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0};
}

std::string number(double v) { return fmt::format("{}", v); }

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1) {}

void Histogram::observe(double v) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  ++counts_[i];
  sum_ += v;
  ++count_;
}

std::string Histogram::text(const std::string& name, const std::string& help) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out = fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, number(bounds_[i]), cumulative);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count_, name,
                     number(sum_), name, count_);
  return out;
}

ServerMetrics::ServerMetrics()
    : ttft(latency_buckets()),
      itl(latency_buckets()),
      e2e(latency_buckets()),
      queue(latency_buckets()),
      prefill(latency_buckets()),
      decode(latency_buckets()) {}

void ServerMetrics::count_finished(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu);
  ++finished[reason];
}

std::string ServerMetrics::text(const EngineMetrics& m, const std::string& model) {
  std::string out;
  const auto gauge = [&](const char* name, const char* help, double v) {
    out += fmt::format("# HELP kiln:{0} {1}\n# TYPE kiln:{0} gauge\nkiln:{0}{{model_name=\"{2}\"}} {3}\n",
                       name, help, model, number(v));
  };
  const auto counter = [&](const char* name, const char* help, uint64_t v) {
    out += fmt::format("# HELP kiln:{0} {1}\n# TYPE kiln:{0} counter\nkiln:{0}{{model_name=\"{2}\"}} {3}\n",
                       name, help, model, v);
  };
  gauge("num_requests_running", "Requests admitted to the engine (holding KV cache blocks).", m.n_running);
  gauge("num_requests_waiting", "Requests waiting for admission, preempted ones included.", m.n_waiting);
  gauge("kv_cache_usage_perc", "Fraction of the KV cache blocks in use (1 = full).",
        m.kv_blocks_total > 0 ? static_cast<double>(m.kv_blocks_used) / m.kv_blocks_total : 0.0);
  counter("prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
          m.prefix_cache_queries);
  counter("prefix_cache_hits_total", "Prompt tokens found in the prefix cache (not recomputed).",
          m.prefix_cache_hits);
  counter("prompt_tokens_total", "Prompt tokens of admitted requests.", m.n_prompt_tokens);
  counter("generation_tokens_total", "Tokens generated.", m.n_generated_tokens);
  counter("num_preemptions_total", "Requests preempted for lack of KV cache blocks (recomputed later).",
          m.n_preemptions);
  counter("num_requests_rejected_total", "Generation requests refused with 503: the queue was at its bound.",
          rejected.load());
  counter("num_requests_queue_timeout_total", "Requests that waited past --queue-timeout for admission.",
          m.n_queue_timeouts);
  counter("spec_decode_num_drafts_total", "Speculative decoding: steps in which a request verified a draft.",
          m.n_drafts);
  counter("spec_decode_num_draft_tokens_total", "Speculative decoding: draft tokens verified (--spec).",
          m.n_draft_tokens);
  counter("spec_decode_num_accepted_tokens_total", "Speculative decoding: draft tokens kept.",
          m.n_accepted_tokens);
  {
    std::lock_guard<std::mutex> lock(mu);
    out +=
        "# HELP kiln:request_success_total Requests finished, by finish reason.\n"
        "# TYPE kiln:request_success_total counter\n";
    for (const char* reason : {"stop", "length", "abort", "error"}) {
      const auto it = finished.find(reason);
      out += fmt::format("kiln:request_success_total{{model_name=\"{}\",finished_reason=\"{}\"}} {}\n", model,
                         reason, it == finished.end() ? 0 : it->second);
    }
  }
  out += ttft.text("kiln:time_to_first_token_seconds", "From the request's arrival to its first token.");
  out += itl.text("kiln:inter_token_latency_seconds", "Between two consecutive tokens of a request.");
  out += e2e.text("kiln:e2e_request_latency_seconds", "From the request's arrival to its last token.");
  out +=
      queue.text("kiln:request_queue_time_seconds", "From submission to the engine to the first admission.");
  out += prefill.text("kiln:request_prefill_time_seconds", "From the first admission to the first token.");
  out += decode.text("kiln:request_decode_time_seconds", "From the first token to the last.");
  return out;
}

}  // namespace kiln::server
