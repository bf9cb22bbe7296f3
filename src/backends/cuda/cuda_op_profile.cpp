#include "backends/cuda/cuda_op_profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <utility>
#include <vector>

namespace kiln::cuda {

namespace {

// A matmul's key names its weight type, shape and rows (1-8: GEMV; 9-64 and more: GEMMs).
std::string key_of(const ops::Op& op) {
  const auto* mm = std::get_if<ops::Matmul>(&op);
  if (mm == nullptr) return std::string(ops::op_name(op));
  const Tensor& w = mm->w.tensor;
  const int64_t m = mm->x.n_rows();
  return fmt::format("matmul {} [{}, {}] m {}", dtype_name(w.type), w.ne[0], w.ne[1],
                     m <= 8    ? std::to_string(m)
                     : m <= 64 ? "9-64"
                               : ">64");
}

}  // namespace

void OpProfile::add(const ops::Op& op, size_t n, double kernel_ms, double enqueue_us) {
  std::string key = key_of(op);
  if (n > 1) key = fmt::format("{} + {} fused", key, n - 1);
  OpTime& t = times_[key];
  t.kernel_ms += kernel_ms;
  t.enqueue_us += enqueue_us;
  ++t.calls;
}

void OpProfile::print(std::string_view backend) const {
  std::vector<std::pair<std::string, OpTime>> rows(times_.begin(), times_.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.kernel_ms > b.second.kernel_ms; });
  double total = 0, enqueue = 0;
  for (const auto& r : rows) total += r.second.kernel_ms, enqueue += r.second.enqueue_us;
  fmt::print(stderr,
             "{} profile: {:.1f} ms of kernels, {:.1f} ms enqueueing them\n{:<44} {:>10} {:>8} {:>10} {:>6} "
             "{:>12}\n",
             backend, total, enqueue / 1000.0, "op", "ms", "calls", "us/call", "share", "enqueue us");
  for (const auto& [key, t] : rows) {
    const auto calls = static_cast<double>(t.calls);
    fmt::print(stderr, "{:<44} {:>10.2f} {:>8} {:>10.1f} {:>5.1f}% {:>12.1f}\n", key, t.kernel_ms, t.calls,
               1000.0 * t.kernel_ms / calls, 100.0 * t.kernel_ms / total, t.enqueue_us / calls);
  }
}

}  // namespace kiln::cuda
