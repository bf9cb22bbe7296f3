#include "models/weights.h"

#include <fmt/ranges.h>

#include <cmath>
#include <cstring>

namespace kiln::blocks {

Result<ops::Weight> WeightLoader::get_optional(const std::string& name, WeightRole role, int64_t ne0,
                                               int64_t ne1) {
  if (file_.find_tensor(name) == nullptr) return ops::Weight{};
  return get(name, role, ne0, ne1);
}

Result<ops::Weight> WeightLoader::get(const std::string& name, WeightRole role, int64_t ne0, int64_t ne1) {
  KILN_ASSIGN_OR_RETURN(const Tensor t,
                        find(name, ne1 > 0 ? std::vector<int64_t>{ne0, ne1} : std::vector<int64_t>{ne0}));
  return prepare(t, name, role);
}

Result<ops::Weight> WeightLoader::get(const std::string& name, WeightRole role, int64_t ne0, int64_t ne1,
                                      int64_t ne2) {
  KILN_ASSIGN_OR_RETURN(const Tensor t, find(name, {ne0, ne1, ne2}));
  return prepare(t, name, role);
}

Result<ops::Weight> WeightLoader::get_bias(const std::string& name, int64_t n) {
  if (file_.find_tensor(name) == nullptr) return ops::Weight{};
  KILN_ASSIGN_OR_RETURN(const Tensor b, find(name, {n}));
  if (b.type != DType::f32)
    return invalid_argument("{}: tensor {} has type {}, biases must be f32", file_.name(), name,
                            dtype_name(b.type));
  return prepare(b, name, WeightRole::weight_role_bias);
}

Result<ops::Weight> WeightLoader::get_rows_of(const std::string& name, const std::string& part,
                                              WeightRole role, int64_t ne0, int64_t ne1, int64_t first,
                                              int64_t count) {
  KILN_ASSIGN_OR_RETURN(const Tensor t, find_part({name, part, ne1, first, count}, ne0));
  return prepare(t, name + "[" + part + "]", role);
}

Result<std::vector<ops::Weight>> WeightLoader::get_group(std::span<const GroupPart> parts, WeightRole role,
                                                         int64_t ne0) {
  std::vector<Tensor> logicals;
  std::vector<std::string> names;
  for (const GroupPart& part : parts) {
    KILN_ASSIGN_OR_RETURN(const Tensor t, find_part(part, ne0));
    logicals.push_back(t);
    names.push_back(part.part.empty() ? part.name : part.name + "[" + part.part + "]");
  }
  KILN_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<WeightHandle>> handles,
                        backend_->prepare_weight_group(logicals, names, role, read_done()));
  std::vector<ops::Weight> weights;
  for (size_t i = 0; i < handles.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(handles[i]->weight.input_scale, input_scale(logicals[i], names[i], role));
    weights.push_back(handles[i]->weight);
    keep(std::move(handles[i]), logicals[i]);
  }
  return weights;
}

Result<Tensor> WeightLoader::find_part(const GroupPart& part, int64_t ne0) {
  if (part.part.empty()) return find(part.name, {ne0, part.ne1});
  KILN_ASSIGN_OR_RETURN(const Tensor t, find(part.name, {ne0, part.ne1}));
  if (part.first < 0 || part.count <= 0 || part.first + part.count > part.ne1) {
    return invalid_argument("{}: rows [{}, {}) of tensor {} are out of its {} rows", file_.name(), part.first,
                            part.first + part.count, part.name, part.ne1);
  }
  if (!copies_) {
    n_params_ -= t.n_elements() - ne0 * part.count;  // count each row once over the parts
    n_bytes_ -= static_cast<uint64_t>(t.row_bytes() * (part.ne1 - part.count));
  }
  return slice_rows(t, part.first, part.count);
}

Result<Tensor> WeightLoader::find(const std::string& name, const std::vector<int64_t>& expected) {
  const gguf::TensorInfo* t = file_.find_tensor(name);
  if (t == nullptr) return not_found("{}: tensor {} is missing", file_.name(), name);
  if (t->shape != expected) {
    return invalid_argument("{}: tensor {} has shape [{}], expected [{}]", file_.name(), name,
                            fmt::join(t->shape, ", "), fmt::join(expected, ", "));
  }
  const DTypeInfo& info = dtype_info(t->type);
  if (info.dequantize_row == nullptr && t->type != DType::f32) {
    return unimplemented("{}: tensor {} has type {}, which kiln cannot compute with yet", file_.name(), name,
                         info.name);
  }
  if (!copies_) {
    n_params_ += t->n_elements();
    n_bytes_ += t->n_bytes;
  }
  return make_tensor(t->type, const_cast<uint8_t*>(t->data), expected[0],
                     expected.size() > 1 ? expected[1] : 1, expected.size() > 2 ? expected[2] : 1);
}

Backend::ReadDone WeightLoader::read_done() const {
  return [this](const void* p, size_t n) { file_.drop_pages(p, n); };
}

Result<ops::Weight> WeightLoader::prepare(const Tensor& logical, const std::string& name, WeightRole role) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<WeightHandle> h,
                        backend_->prepare_weight_reporting(logical, name, role, read_done()));
  KILN_ASSIGN_OR_RETURN(h->weight.input_scale, input_scale(logical, name, role));
  const ops::Weight w = h->weight;
  keep(std::move(h), logical);
  return w;
}

Result<float> WeightLoader::input_scale(const Tensor& logical, const std::string& name,
                                        WeightRole role) const {
  if (logical.type != DType::f8_e4m3 || role != WeightRole::weight_role_matmul) return 0.0f;
  std::string_view stem(name);
  if (const size_t part = stem.find('['); part != std::string_view::npos) stem = stem.substr(0, part);
  if (!stem.ends_with(".weight")) return 0.0f;
  stem.remove_suffix(7);
  const std::string scale_name = std::string(stem) + ".input_scale";
  const gguf::TensorInfo* t = file_.find_tensor(scale_name);
  if (t == nullptr) return 0.0f;
  float v = 0.0f;
  if (t->type == DType::f32 && t->shape == std::vector<int64_t>{1} && t->n_bytes == sizeof v)
    std::memcpy(&v, t->data, sizeof v);
  if (!std::isfinite(v) || v <= 0.0f) {
    return invalid_argument("{}: tensor {} ({} [{}]) is not an activation scale (one finite positive f32)",
                            file_.name(), scale_name, dtype_name(t->type), fmt::join(t->shape, ", "));
  }
  return v;
}

void WeightLoader::keep(std::unique_ptr<WeightHandle> h, const Tensor& logical) {
  // A backend that makes its own copy (a repacked layout, device memory) reads the file's bytes only on paths
  // off the default one (--exact, a tied table's rows): their pages leave the resident set until then, each
  // run as soon as the backend has read it where it says so (a large table's pages and its copy are then not
  // resident together: Gemma 3's 178 MB embedding), the rest once it is done.
  if (h->prepared != nullptr || h->storage != nullptr) {
    int64_t span = logical.row_bytes();
    for (int d = 1; d < 4; ++d) span += (logical.ne[d] - 1) * logical.nb[d];
    file_.drop_pages(logical.data, static_cast<size_t>(span));
  }
  handles_.push_back(std::move(h));
}

}  // namespace kiln::blocks
