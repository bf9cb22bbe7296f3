#include "models/op_offload.h"

#include <memory>
#include <span>
#include <variant>
#include <vector>

namespace kiln::blocks {

namespace {

bool f32_matrix(const Tensor& t) {
  return t.type == DType::f32 && t.is_contiguous() && t.ne[2] == 1 && t.ne[3] == 1;
}

// One run of offloaded matmuls: x of each uploaded once, every weight uploaded, the products downloaded.
Status run_on_device(std::span<const ops::Op> matmuls, Backend& device) {
  std::vector<std::unique_ptr<Buffer>> buffers;
  std::vector<std::unique_ptr<WeightHandle>> weights;
  std::vector<std::pair<const void*, Tensor>> xs;  // host x -> its device copy
  auto device_copy = [&](const Tensor& t, bool upload) -> Result<Tensor> {
    const auto bytes = static_cast<size_t>(t.n_elements()) * sizeof(float);
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> b, device.allocate(bytes));
    const Tensor d = make_tensor(DType::f32, *b, 0, t.ne[0], t.ne[1]);
    buffers.push_back(std::move(b));
    if (upload) KILN_TRY(device.upload(d, t.data, bytes));
    return d;
  };
  Program program;
  std::vector<std::pair<Tensor, Tensor>> results;  // (device dst, host dst)
  for (const ops::Op& op : matmuls) {
    const auto& m = std::get<ops::Matmul>(op);
    Tensor x;
    for (const auto& [host, dev] : xs) {
      if (host == m.x.data) x = dev;
    }
    if (x.data == nullptr) {
      KILN_ASSIGN_OR_RETURN(x, device_copy(m.x, /*upload=*/true));
      xs.emplace_back(m.x.data, x);
    }
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<WeightHandle> w,
                          device.prepare_weight(m.w.tensor, "offloaded", WeightRole::weight_role_matmul));
    KILN_ASSIGN_OR_RETURN(const Tensor dst, device_copy(m.dst, /*upload=*/false));
    KILN_TRY(program.add(ops::Matmul{w->weight, x, dst, m.quantize_x}));
    program.n_tokens = static_cast<int32_t>(m.x.ne[1]);
    weights.push_back(std::move(w));
    results.emplace_back(dst, m.dst);
  }
  KILN_TRY(device.run(program));
  for (const auto& [dev, host] : results) {
    KILN_TRY(device.download(host.data, dev, static_cast<size_t>(host.n_elements()) * sizeof(float)));
  }
  return device.synchronize();  // the products are in host memory; the buffers may go
}

}  // namespace

bool offloadable(const ops::Op& op, int32_t min_tokens) {
  const auto* m = std::get_if<ops::Matmul>(&op);
  return m != nullptr && min_tokens > 0 && m->x.ne[1] >= min_tokens && m->w.tensor.buffer == nullptr &&
         m->w.tensor.data != nullptr && f32_matrix(m->x) && f32_matrix(m->dst);
}

Status run_offloading(const Program& program, Backend& host, Backend& device, int32_t min_tokens) {
  const std::vector<ops::Op>& ops = program.ops();
  Program part;
  part.n_tokens = program.n_tokens;
  for (size_t i = 0; i < ops.size();) {
    if (!offloadable(ops[i], min_tokens)) {
      KILN_TRY(part.add(ops[i++]));
      continue;
    }
    if (part.size() > 0) {
      KILN_TRY(host.run(part));
      part.clear();
    }
    KILN_TRY(host.synchronize());  // x is in host memory
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
    KILN_TRY(run_on_device(std::span(ops).subspan(i, end - i), device));
    i = end;
  }
  return part.size() > 0 ? host.run(part) : Status::ok_status();
}

}  // namespace kiln::blocks
