#include "models/op_offload.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <span>
#include <thread>
#include <variant>
#include <vector>

namespace kiln::blocks {

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

// memcpy by up to 8 threads, pieces of at least 4 MiB: the source is a file's pages, which one thread faults
// in and copies at a fraction of the memory's speed.
void parallel_copy(uint8_t* dst, const uint8_t* src, size_t n) {
  constexpr size_t kPiece = size_t{4} << 20;
  const size_t k = std::clamp<size_t>(n / kPiece, 1, 8);
  const size_t piece = (n + k - 1) / k;
  std::vector<std::jthread> threads;
  for (size_t i = 1; i < k; ++i) {
    const size_t lo = i * piece, len = std::min(piece, n - std::min(n, lo));
    if (len > 0) threads.emplace_back([=] { std::memcpy(dst + lo, src + lo, len); });
  }
  std::memcpy(dst, src, std::min(piece, n));
}

// The weights of a run in page-locked staging (scratch.staging, grown to fit): their views there, in order;
// an empty vector when staging is off or the device has no host memory of its own.
Result<std::vector<Tensor>> stage(std::span<const ops::Op> matmuls, Backend& device,
                                  OffloadScratch& scratch) {
  std::vector<Tensor> views;
  if (!scratch.stage_weights) return views;
  size_t total = 0;
  for (const ops::Op& op : matmuls)
    total += (span_bytes(std::get<ops::Matmul>(op).w.tensor) + 4095) / 4096 * 4096;
  if (scratch.staging == nullptr || scratch.staging->size() < total) {
    scratch.staging.reset();
    Result<std::unique_ptr<Buffer>> b = device.allocate_host(total);
    if (!b.ok()) {
      if (b.status().code() != StatusCode::unimplemented) return b.status();
      scratch.stage_weights = false;
      return views;
    }
    scratch.staging = std::move(b).value();
  }
  auto* base = static_cast<uint8_t*>(scratch.staging->data());
  size_t off = 0;
  for (const ops::Op& op : matmuls) {
    Tensor v = std::get<ops::Matmul>(op).w.tensor;
    const size_t n = span_bytes(v);
    parallel_copy(base + off, static_cast<const uint8_t*>(v.data), n);
    v.data = base + off;
    views.push_back(v);
    off += (n + 4095) / 4096 * 4096;
  }
  return views;
}

// One run of offloaded matmuls: x of each uploaded once, every weight uploaded, the products downloaded.
Status run_on_device(std::span<const ops::Op> matmuls, Backend& device, OffloadScratch& scratch,
                     OffloadProfile& prof) {
  auto t_weights = Clock::now();
  KILN_ASSIGN_OR_RETURN(const std::vector<Tensor> staged, stage(matmuls, device, scratch));
  prof.weights_ms += ms_since(t_weights);
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
    prof.weights_ms += ms_since(t0);
    prof.weight_bytes += static_cast<uint64_t>(m.w.tensor.row_bytes() * m.w.tensor.ne[1]);
    KILN_ASSIGN_OR_RETURN(const Tensor dst, device_copy(m.dst, /*upload=*/false));
    KILN_TRY(program.add(ops::Matmul{w->weight, x, dst, m.quantize_x}));
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
      "offloaded steps: {} steps, {:.1f} device runs a step; per step host ops {:.1f} ms, weight uploads "
      "{:.1f} ms "
      "({:.0f} MB), device runs {:.1f} ms (x and products {:.0f} MB)",
      steps, static_cast<double>(runs) / n, host_ms / n, weights_ms / n,
      static_cast<double>(weight_bytes) / n / 1e6, device_ms / n,
      static_cast<double>(activation_bytes) / n / 1e6);
}

Status run_offloading(const Program& program, Backend& host, Backend& device, int32_t min_tokens,
                      OffloadScratch& scratch, OffloadProfile* profile) {
  OffloadProfile local;
  OffloadProfile& prof = profile != nullptr ? *profile : local;
  ++prof.steps;
  const std::vector<ops::Op>& ops = program.ops();
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
  for (size_t i = 0; i < ops.size();) {
    if (!offloadable(ops[i], min_tokens)) {
      KILN_TRY(part.add(ops[i++]));
      continue;
    }
    if (part.size() > 0) KILN_TRY(run_host());
    // The run stops before a matmul that reads a product of the run (it is downloaded at the run's end).
    size_t end = i;
    auto reads_run = [&](size_t j) {
      const Tensor& x = std::get<ops::Matmul>(ops[j]).x;
      const auto* lo = static_cast<const uint8_t*>(x.data);
      const uint8_t* hi = lo + x.n_elements() * 4;
      for (size_t k = i; k < j; ++k) {
        const Tensor& d = std::get<ops::Matmul>(ops[k]).dst;
        const auto* d_lo = static_cast<const uint8_t*>(d.data);
        if (d_lo < hi && lo < d_lo + d.n_elements() * 4) return true;
      }
      return false;
    };
    while (end < ops.size() && offloadable(ops[end], min_tokens) && !reads_run(end)) ++end;
    KILN_TRY(run_on_device(std::span(ops).subspan(i, end - i), device, scratch, prof));
    i = end;
  }
  return part.size() > 0 ? run_host() : Status::ok_status();
}

}  // namespace kiln::blocks
