#include "quant/imatrix_collector.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string_view>
#include <utility>

#include "ops/program.h"

namespace kiln::quant {

namespace {

// llama-imatrix leaves out the matmuls of batches this small (a Matmul's x rows; never a MoeMatmul's).
constexpr int64_t kMinRows = 16;

// "blk.0.attn_qkv.weight[q]" -> "blk.0.attn_qkv.weight".
std::string without_part(const std::string& name) {
  const size_t bracket = name.find('[');
  return bracket == std::string::npos ? name : name.substr(0, bracket);
}

// A SumSquares to insert before op `before`.
struct Insert {
  size_t before;
  ops::SumSquares op;
  std::string name;
};

}  // namespace

void ImatrixCollector::attach(std::span<const std::unique_ptr<WeightHandle>> weights) {
  names_.clear();
  for (const std::unique_ptr<WeightHandle>& h : weights) {
    if (h->role != WeightRole::weight_role_matmul && h->role != WeightRole::weight_role_expert_matmul &&
        h->role != WeightRole::weight_role_tied_embedding)
      continue;
    names_[{h->weight.tensor.data, h->weight.prepared}] = without_part(h->name);
  }
}

std::string ImatrixCollector::collected_name(const ops::Weight& w, int64_t x_rows, bool routed) const {
  const auto it = names_.find({w.tensor.data, w.prepared});
  if (it == names_.end()) return {};
  const std::string& name = it->second;
  if (routed) return name;
  if (x_rows < kMinRows) return {};
  if (name.starts_with("blk.") || (process_output_ && name == "output.weight")) return name;
  return {};
}

Status ImatrixCollector::recorded(Program& program, Backend& backend) {
  if (grams_taken_)
    return make_status(StatusCode::internal, "imatrix: a step recorded after the Gram matrices were taken");
  const std::vector<ops::Op>& ops = program.ops();
  // Each collected matmul's SumSquares goes before the run of matmuls on the same x that it ends (Q, K and V;
  // gate and up): the run stays whole for a backend that fuses it, and x is ready there.
  std::vector<Insert> inserts;
  std::map<std::string, std::pair<int64_t, int64_t>> fresh;  // weights not seen before: (n_cols, n_mat)
  size_t run_start = 0;
  const void* run_x = nullptr;
  for (size_t i = 0; i < ops.size(); ++i) {
    const auto* mm = std::get_if<ops::Matmul>(&ops[i]);
    const auto* moe = std::get_if<ops::MoeMatmul>(&ops[i]);
    if (mm == nullptr && moe == nullptr) {
      run_x = nullptr;
      continue;
    }
    const Tensor& x = mm != nullptr ? mm->x : moe->x;
    if (x.data != run_x) run_start = i, run_x = x.data;
    const ops::Weight& w = mm != nullptr ? mm->w : moe->w;
    const std::string name = collected_name(w, x.n_rows(), moe != nullptr);
    if (name.empty()) continue;
    bool again = false;  // another part of the same weight in this run: its x is counted once
    for (const Insert& in : inserts) again |= in.before == run_start && in.name == name;
    if (again) continue;
    const int64_t n_cols = w.tensor.ne[0], n_mat = moe != nullptr ? w.tensor.ne[2] : 1;
    if (const auto e = entries_.find(name); e != entries_.end()) {
      if (e->second.n_cols != n_cols || e->second.n_mat != n_mat ||
          slabs_[e->second.slab].backend != &backend) {
        return make_status(StatusCode::internal,
                           "imatrix: {} is multiplied as [{}, {}] matrices on {} here, "
                           "as [{}, {}] on {} before",
                           name, n_cols, n_mat, backend.name(), e->second.n_cols, e->second.n_mat,
                           slabs_[e->second.slab].backend->name());
      }
    } else {
      fresh.emplace(name, std::pair{n_cols, n_mat});
    }
    ops::SumSquares op;
    op.x = x;
    if (moe != nullptr) op.ids = moe->ids;
    inserts.push_back({run_start, op, name});
  }
  if (inserts.empty()) return Status::ok_status();
  if (!fresh.empty()) {  // one zeroed slab of sums and counts for the weights first seen here
    size_t floats = 0;
    for (const auto& [name, shape] : fresh) {
      Entry e{slabs_.size(), floats, shape.first, shape.second, nullptr};
      floats += static_cast<size_t>(shape.first * shape.second + 2 * shape.second);
      if (full_ && shape.second == 1) {  // and a zeroed Gram matrix of its own
        const size_t n2 = static_cast<size_t>(shape.first * shape.first);
        KILN_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> g, backend.allocate(n2 * sizeof(float)));
        const std::vector<float> zeros(n2, 0.0f);
        KILN_TRY(backend.upload(make_tensor(DType::f32, *g, 0, static_cast<int64_t>(n2)), zeros.data(),
                                n2 * sizeof(float)));
        e.gram = std::move(g);
      }
      entries_[name] = std::move(e);
    }
    Slab slab;
    slab.backend = &backend;
    KILN_ASSIGN_OR_RETURN(slab.buffer, backend.allocate(floats * sizeof(float)));
    slab.host.assign(floats, 0.0f);
    const Tensor all = make_tensor(DType::f32, *slab.buffer, 0, static_cast<int64_t>(floats));
    KILN_TRY(backend.upload(all, slab.host.data(), floats * sizeof(float)));
    slabs_.push_back(std::move(slab));
  }
  for (Insert& in : inserts) {
    const Entry& e = entries_.at(in.name);
    const Buffer& buf = *slabs_[e.slab].buffer;
    in.op.sums = make_tensor(DType::f32, buf, e.offset * sizeof(float), e.n_cols, e.n_mat);
    const size_t counts_at = e.offset + static_cast<size_t>(e.n_cols * e.n_mat);
    in.op.counts = make_tensor(DType::f32, buf, counts_at * sizeof(float), 1, e.n_mat);
    in.op.amax =
        make_tensor(DType::f32, buf, (counts_at + static_cast<size_t>(e.n_mat)) * sizeof(float), 1, e.n_mat);
    if (e.gram != nullptr) in.op.gram = make_tensor(DType::f32, *e.gram, 0, e.n_cols, e.n_cols);
  }
  Program out;
  out.n_tokens = program.n_tokens;
  size_t next = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    for (; next < inserts.size() && inserts[next].before == i; ++next) KILN_TRY(out.add(inserts[next].op));
    KILN_TRY(out.add(ops[i]));
  }
  program = std::move(out);
  return Status::ok_status();
}

Status ImatrixCollector::read_back(std::map<std::string, ImatrixSums>& totals) {
  for (Slab& s : slabs_) {
    const Tensor all = make_tensor(DType::f32, *s.buffer, 0, static_cast<int64_t>(s.host.size()));
    KILN_TRY(s.backend->download(s.host.data(), all, s.host.size() * sizeof(float)));
  }
  for (Slab& s : slabs_) KILN_TRY(s.backend->synchronize());
  for (const auto& [name, e] : entries_) {
    const float* v = slabs_[e.slab].host.data() + e.offset;
    ImatrixSums step;
    step.n_cols = e.n_cols;
    step.sum2.assign(v, v + e.n_cols * e.n_mat);
    step.counts.assign(v + e.n_cols * e.n_mat, v + e.n_cols * e.n_mat + e.n_mat);
    step.amax.assign(v + e.n_cols * e.n_mat + e.n_mat, v + e.n_cols * e.n_mat + 2 * e.n_mat);
    for (const std::vector<double>* values : {&step.sum2, &step.amax}) {
      for (const double x : *values) {
        if (!std::isfinite(x))
          return invalid_argument("imatrix: the inputs of {} are not finite ({})", name, x);
      }
    }
    KILN_TRY(add_sums(name, step, totals[name], /*with_gram=*/false));  // the Gram matrix: take_grams
  }
  for (Slab& s : slabs_) {
    std::fill(s.host.begin(), s.host.end(), 0.0f);
    const Tensor all = make_tensor(DType::f32, *s.buffer, 0, static_cast<int64_t>(s.host.size()));
    KILN_TRY(s.backend->upload(all, s.host.data(), s.host.size() * sizeof(float)));
  }
  return Status::ok_status();
}

Status ImatrixCollector::take_grams(std::map<std::string, ImatrixSums>& totals) {
  grams_taken_ = true;
  for (auto& [name, e] : entries_) {
    if (e.gram == nullptr) continue;
    Backend& backend = *slabs_[e.slab].backend;
    const size_t n2 = static_cast<size_t>(e.n_cols * e.n_cols);
    std::vector<float>& into = totals[name].gram;
    std::vector<float> g(n2);
    KILN_TRY(backend.download(g.data(), make_tensor(DType::f32, *e.gram, 0, static_cast<int64_t>(n2)),
                              n2 * sizeof(float)));
    KILN_TRY(backend.synchronize());
    e.gram.reset();
    for (const float x : g) {
      if (!std::isfinite(x))
        return invalid_argument("imatrix: the inputs of {} are not finite ({})", name, x);
    }
    if (into.empty()) {
      into = std::move(g);
    } else if (into.size() == n2) {
      for (size_t i = 0; i < n2; ++i) into[i] += g[i];
    } else {
      return invalid_argument("imatrix: {} has a Gram matrix of {} values here, {} before", name, n2,
                              into.size());
    }
  }
  return Status::ok_status();
}

Status add_sums(const std::string& name, const ImatrixSums& from, ImatrixSums& into, bool with_gram) {
  if (into.counts.empty()) {
    std::vector<float> gram = std::move(into.gram);
    into = from;
    if (!with_gram) into.gram = std::move(gram);
    return Status::ok_status();
  }
  if (from.sum2.size() != into.sum2.size()) {
    return invalid_argument("imatrix: {} has {} values here, {} before", name, from.sum2.size(),
                            into.sum2.size());
  }
  if (into.counts.size() == 1 && from.counts.size() > 1) {  // a legacy file's one count, for every expert
    into.counts.assign(from.counts.size(), into.counts[0]);
    into.n_cols = from.n_cols;
  }
  if (from.counts.size() == 1) {
    for (double& c : into.counts) c += from.counts[0];
  } else if (from.counts.size() == into.counts.size()) {
    for (size_t m = 0; m < into.counts.size(); ++m) into.counts[m] += from.counts[m];
  } else {
    return invalid_argument("imatrix: {} has {} matrices here, {} before", name, from.counts.size(),
                            into.counts.size());
  }
  for (size_t i = 0; i < into.sum2.size(); ++i) into.sum2[i] += from.sum2[i];
  if (from.amax.size() == into.amax.size() && from.amax.size() == into.counts.size()) {
    for (size_t m = 0; m < into.amax.size(); ++m) into.amax[m] = std::max(into.amax[m], from.amax[m]);
  } else {
    into.amax.clear();  // a side without ranges (or one count for many experts): the whole run's are unknown
  }
  if (!with_gram) return Status::ok_status();
  if (from.gram.size() != into.gram.size()) {
    return invalid_argument("imatrix: {} has a Gram matrix of {} values here, {} before", name,
                            from.gram.size(), into.gram.size());
  }
  for (size_t i = 0; i < into.gram.size(); ++i) into.gram[i] += from.gram[i];
  return Status::ok_status();
}

}  // namespace kiln::quant
