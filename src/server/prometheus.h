// The server's own metrics (per-request latencies as histograms, requests by finish reason) and the
// Prometheus text format of them beside the engine's gauges and counters, under vLLM's names prefixed kiln:.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/kiln.h"

namespace kiln::server {

// A Prometheus histogram: counts of observations at or below each bound, their sum and count.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // The exposition lines of metric `name`, with its HELP text.
  std::string text(const std::string& name, const std::string& help) const;

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // [bounds + 1], the last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

struct ServerMetrics {
  ServerMetrics();
  Histogram ttft, itl, e2e, queue, prefill, decode;  // seconds
  std::mutex mu;
  std::map<std::string, uint64_t> finished;  // requests by finish_reason ("stop", "length", "abort", "error")
  std::atomic<uint64_t> rejected{0};  // generation requests shed with 503 (--max-queue, --max-queued-tokens)
  void count_finished(const std::string& reason);
  // The exposition of everything: the engine's metrics m and the model name as a label.
  std::string text(const EngineMetrics& m, const std::string& model);
};

}  // namespace kiln::server
