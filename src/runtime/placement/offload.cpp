#include "runtime/placement/offload.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stop_token>
#include <thread>
#include <variant>
#include <vector>

namespace kiln {

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

bool f32_matrix(const Tensor& t) {
  return t.type == DType::f32 && t.is_contiguous() && t.ne[2] == 1 && t.ne[3] == 1;
}

// The bytes a weight view spans (its rows, strides kept).
size_t span_bytes(const Tensor& w) {
  int64_t span = w.row_bytes();
  for (int d = 1; d < 4; ++d) span += (w.ne[d] - 1) * w.nb[d];
  return static_cast<size_t>(span);
}

// memcpy by up to 4 threads, pieces of at least 4 MiB: the source is a file's pages, which one thread faults
// in and copies at a fraction of the memory's speed (and the host's own ops want the other cores).
void parallel_copy(uint8_t* dst, const uint8_t* src, size_t n) {
  constexpr size_t kPiece = size_t{4} << 20;
  const size_t k = std::clamp<size_t>(n / kPiece, 1, 4);
  const size_t piece = (n + k - 1) / k;
  std::vector<std::jthread> threads;
  for (size_t i = 1; i < k; ++i) {
    const size_t lo = i * piece, len = std::min(piece, n - std::min(n, lo));
    if (len > 0) threads.emplace_back([=] { std::memcpy(dst + lo, src + lo, len); });
  }
  std::memcpy(dst, src, std::min(piece, n));
}

// One run of offloaded matmuls: x of each uploaded once, every weight uploaded (from `staged`, its
// page-locked copy, when not empty), the products downloaded.
Status run_on_device(std::span<const ops::Op> matmuls, std::span<const Tensor> staged, Backend& device,
                     OffloadProfile& prof) {
  std::vector<std::unique_ptr<Buffer>> buffers;
  std::vector<std::unique_ptr<WeightHandle>> weights;
  std::vector<std::pair<const void*, Tensor>> xs;  // host x -> its device copy
  auto device_copy = [&](const Tensor& t, bool upload) -> Result<Tensor> {
    const auto bytes = static_cast<size_t>(t.n_elements()) * sizeof(float);
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> b, device.allocate(bytes));
    const Tensor d = make_tensor(DType::f32, *b, 0, t.ne[0], t.ne[1]);
    buffers.push_back(std::move(b));
    if (upload) KILN_TRY(device.upload(d, t.data, bytes));
    prof.activation_bytes += bytes;
    return d;
  };
  Program program;
  std::vector<std::pair<Tensor, Tensor>> results;  // (device dst, host dst)
  for (size_t i = 0; i < matmuls.size(); ++i) {
    const auto& m = std::get<ops::Matmul>(matmuls[i]);
    Tensor x;
    for (const auto& [host, dev] : xs) {
      if (host == m.x.data) x = dev;
    }
    if (x.data == nullptr) {
      KILN_ASSIGN_OR_RETURN(x, device_copy(m.x, /*upload=*/true));
      xs.emplace_back(m.x.data, x);
    }
    const auto t0 = Clock::now();
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<WeightHandle> w,
                          device.prepare_weight(staged.empty() ? m.w.tensor : staged[i], "offloaded",
                                                WeightRole::weight_role_matmul));
    w->weight.input_scale = m.w.input_scale;
    prof.wait_ms += ms_since(t0);
    prof.weight_bytes += static_cast<uint64_t>(m.w.tensor.row_bytes() * m.w.tensor.ne[1]);
    KILN_ASSIGN_OR_RETURN(const Tensor dst, device_copy(m.dst, /*upload=*/false));
    KILN_TRY(program.add(ops::Matmul{w->weight, x, dst}));
    program.n_tokens = static_cast<int32_t>(m.x.ne[1]);
    weights.push_back(std::move(w));
    results.emplace_back(dst, m.dst);
  }
  const auto t0 = Clock::now();
  KILN_TRY(device.run(program));
  for (const auto& [dev, host] : results) {
    KILN_TRY(device.download(host.data, dev, static_cast<size_t>(host.n_elements()) * sizeof(float)));
  }
  KILN_TRY(device.synchronize());  // the products are in host memory; the buffers may go
  prof.device_ms += ms_since(t0);
  ++prof.runs;
  return Status::ok_status();
}

}  // namespace

bool offloadable(const ops::Op& op, int32_t min_tokens) {
  const auto* m = std::get_if<ops::Matmul>(&op);
  return m != nullptr && min_tokens > 0 && m->x.ne[1] >= min_tokens && m->w.tensor.buffer == nullptr &&
         m->w.tensor.data != nullptr && f32_matrix(m->x) && f32_matrix(m->dst);
}

std::string OffloadProfile::summary() const {
  const double n = static_cast<double>(std::max<int64_t>(steps, 1));
  return fmt::format(
      "offloaded steps: {} steps, {:.1f} device runs a step; per step host ops {:.1f} ms, weights {:.0f} MB "
      "(staging {:.1f} ms alongside), waiting for weights {:.1f} ms, device runs {:.1f} ms (x and products "
      "{:.0f} MB)",
      steps, static_cast<double>(runs) / n, host_ms / n, static_cast<double>(weight_bytes) / n / 1e6,
      stage_ms / n, wait_ms / n, device_ms / n, static_cast<double>(activation_bytes) / n / 1e6);
}

namespace {

// The step's runs of offloaded matmuls, [begin, end) of the program's ops each. A run stops before a matmul
// that reads a product of the run (the products are downloaded at its end).
std::vector<std::pair<size_t, size_t>> find_runs(const std::vector<ops::Op>& ops, int32_t min_tokens) {
  auto overlaps = [](const Tensor& a, const Tensor& b) {
    const auto* a_lo = static_cast<const uint8_t*>(a.data);
    const auto* b_lo = static_cast<const uint8_t*>(b.data);
    return a_lo < b_lo + b.n_elements() * 4 && b_lo < a_lo + a.n_elements() * 4;
  };
  std::vector<std::pair<size_t, size_t>> runs;
  for (size_t i = 0; i < ops.size();) {
    if (!offloadable(ops[i], min_tokens)) {
      ++i;
      continue;
    }
    size_t end = i + 1;
    for (; end < ops.size() && offloadable(ops[end], min_tokens); ++end) {
      const Tensor& x = std::get<ops::Matmul>(ops[end]).x;
      bool reads_run = false;
      for (size_t k = i; k < end; ++k) reads_run |= overlaps(x, std::get<ops::Matmul>(ops[k]).dst);
      if (reads_run) break;
    }
    runs.emplace_back(i, end);
    i = end;
  }
  return runs;
}

// Copies the weights of the step's runs into page-locked staging on a thread of its own, one run ahead of the
// device: while the host runs its ops and the device the run before, the next run's weights are being copied
// (two buffers, run r in buffer r % 2, refilled once run r - 2 is done).
class Stager {
 public:
  Stager(const std::vector<ops::Op>& ops, const std::vector<std::pair<size_t, size_t>>& runs,
         std::array<uint8_t*, 2> buffers, OffloadProfile& prof)
      : views_(runs.size()), thread_([this, &ops, &runs, buffers, &prof](std::stop_token stop) {
          for (size_t r = 0; r < runs.size(); ++r) {
            {
              std::unique_lock lock(mu_);
              cv_.wait(lock, [&] { return stop.stop_requested() || r < done_ + 2; });
              if (stop.stop_requested()) return;
            }
            const auto t0 = Clock::now();
            std::vector<Tensor> views;
            size_t off = 0;
            for (size_t i = runs[r].first; i < runs[r].second; ++i) {
              Tensor v = std::get<ops::Matmul>(ops[i]).w.tensor;
              const size_t n = span_bytes(v);
              parallel_copy(buffers[r % 2] + off, static_cast<const uint8_t*>(v.data), n);
              v.data = buffers[r % 2] + off;
              views.push_back(v);
              off += (n + 4095) / 4096 * 4096;
            }
            std::lock_guard lock(mu_);
            prof.stage_ms += ms_since(t0);
            views_[r] = std::move(views);
            staged_ = r + 1;
            cv_.notify_all();
          }
        }) {}
  ~Stager() {
    {
      std::lock_guard lock(mu_);  // so that the thread cannot miss the stop between its check and its wait
      thread_.request_stop();
    }
    cv_.notify_all();
  }
  // Run r's weights in staging (waits for them).
  const std::vector<Tensor>& wait(size_t r) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return staged_ > r; });
    return views_[r];
  }
  // Run r is done with its buffer.
  void done(size_t r) {
    std::lock_guard lock(mu_);
    done_ = r + 1;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  size_t staged_ = 0, done_ = 0;
  std::vector<std::vector<Tensor>> views_;
  std::jthread thread_;  // last: it reads the members above
};

}  // namespace

Status run_offloading(const Program& program, Backend& host, Backend& device, int32_t min_tokens,
                      OffloadScratch& scratch, OffloadProfile* profile) {
  OffloadProfile local;
  OffloadProfile& prof = profile != nullptr ? *profile : local;
  ++prof.steps;
  const std::vector<ops::Op>& ops = program.ops();
  const std::vector<std::pair<size_t, size_t>> runs = find_runs(ops, min_tokens);
  // Two page-locked buffers, each holding the largest run's weights.
  size_t most = 0;
  for (const auto& [b, e] : runs) {
    size_t n = 0;
    for (size_t i = b; i < e; ++i)
      n += (span_bytes(std::get<ops::Matmul>(ops[i]).w.tensor) + 4095) / 4096 * 4096;
    most = std::max(most, n);
  }
  for (size_t k = 0; k < 2 && scratch.stage_weights && !runs.empty(); ++k) {
    if (scratch.staging[k] != nullptr && scratch.staging[k]->size() >= most) continue;
    scratch.staging[k].reset();
    Result<std::unique_ptr<Buffer>> b = device.allocate_host(most);
    if (!b.ok()) {
      if (b.status().code() != StatusCode::unimplemented) return b.status();
      scratch.stage_weights = false;  // the device has no host memory of its own
      break;
    }
    scratch.staging[k] = std::move(b).value();
  }
  std::optional<Stager> stager;
  if (scratch.stage_weights && !runs.empty()) {
    stager.emplace(ops, runs,
                   std::array{static_cast<uint8_t*>(scratch.staging[0]->data()),
                              static_cast<uint8_t*>(scratch.staging[1]->data())},
                   prof);
  }
  Program part;
  part.n_tokens = program.n_tokens;
  auto run_host = [&]() -> Status {
    const auto t0 = Clock::now();
    KILN_TRY(host.run(part));
    KILN_TRY(host.synchronize());  // x is in host memory
    prof.host_ms += ms_since(t0);
    part.clear();
    return Status::ok_status();
  };
  size_t i = 0;
  for (size_t r = 0; r < runs.size(); ++r) {
    for (; i < runs[r].first; ++i) KILN_TRY(part.add(ops[i]));
    if (part.size() > 0) KILN_TRY(run_host());
    std::span<const Tensor> staged;
    if (stager) {
      const auto t0 = Clock::now();
      staged = stager->wait(r);
      prof.wait_ms += ms_since(t0);
    }
    KILN_TRY(run_on_device(std::span(ops).subspan(runs[r].first, runs[r].second - runs[r].first), staged,
                           device, prof));
    if (stager) stager->done(r);
    i = runs[r].second;
  }
  for (; i < ops.size(); ++i) KILN_TRY(part.add(ops[i]));
  return part.size() > 0 ? run_host() : Status::ok_status();
}

OffloadRunner::OffloadRunner(const OffloadOptions& options) : options_(options) {
  scratch_.stage_weights = options.stage_weights;
}

OffloadRunner::~OffloadRunner() {
  if (options_.print_profile && profile_.steps > 0) fmt::print(stderr, "{}\n", profile_.summary());
}

Status OffloadRunner::run(const Program& program, Backend& host, Backend& device) {
  if (program.n_tokens < options_.min_tokens) return host.run(program);
  return run_offloading(program, host, device, options_.min_tokens, scratch_, &profile_);
}

size_t OffloadRunner::scratch_bytes() const {
  size_t total = 0;
  for (const auto& b : scratch_.staging) total += b != nullptr ? b->size() : 0;
  return total;
}

}  // namespace kiln
