// WeightLoader: finds a model's weights in the file, checks their shapes (errors name the tensor), and has
// the backend prepare each one once (Backend::prepare_weight: a device copy, a repacked layout). The handles
// it makes are the model's: release() hands them over, and Model::weights() lists them by name.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "core/tensor.h"
#include "formats/gguf.h"

namespace kiln::blocks {

class WeightLoader {
 public:
  WeightLoader(const gguf::File& file, Backend& backend) : file_(file), backend_(&backend) {}
  // The weights got from now on are prepared on `backend` (a model split over two backends places each
  // layer's). copies: they are second copies of weights already got on another backend (a tied output head,
  // RoPE factors that every layer reads), left out of n_params() and n_bytes().
  void place_on(Backend& backend, bool copies = false) {
    backend_ = &backend;
    copies_ = copies;
  }
  // The tensor `name` with shape [ne0, ne1] (ne1 = 0: a 1-d tensor [ne0]). not_found when missing,
  // invalid_argument naming the tensor, its shape and the expected one otherwise.
  Result<ops::Weight> get(const std::string& name, WeightRole role, int64_t ne0, int64_t ne1 = 0);
  // A 3-d tensor [ne0, ne1, ne2] (e.g. the stacked expert matrices of an MoE layer), errors as above.
  Result<ops::Weight> get(const std::string& name, WeightRole role, int64_t ne0, int64_t ne1, int64_t ne2);
  // The same, or an empty Weight (tensor.data == nullptr) when the file has no such tensor.
  Result<ops::Weight> get_optional(const std::string& name, WeightRole role, int64_t ne0, int64_t ne1 = 0);
  // An optional f32 [n] bias (empty when absent; invalid_argument when of another type).
  Result<ops::Weight> get_bias(const std::string& name, int64_t n);
  // Rows [first, first + count) of the 2-d tensor `name` [ne0, ne1] as a weight of its own, named
  // "name[part]" (a fused QKV or gate-up tensor split into its matrices). Errors as get().
  Result<ops::Weight> get_rows_of(const std::string& name, const std::string& part, WeightRole role,
                                  int64_t ne0, int64_t ne1, int64_t first, int64_t count);
  // One of several matrices [ne0, count] that the model multiplies by the same x (get_group): the tensor
  // `name` [ne0, ne1] whole (part empty; count = ne1), or its rows [first, first + count) as "name[part]".
  struct GroupPart {
    std::string name;
    std::string part;
    int64_t ne1 = 0;
    int64_t first = 0;
    int64_t count = 0;
  };
  // Those matrices (Q, K, V) in order, prepared together (Backend::prepare_weight_group: the backend may hold
  // them as one matrix). Errors as get().
  Result<std::vector<ops::Weight>> get_group(std::span<const GroupPart> parts, WeightRole role, int64_t ne0);
  const gguf::File& file() const { return file_; }
  Backend& backend() const { return *backend_; }
  // Whether the file has a tensor `name`.
  bool has(const std::string& name) const { return file_.find_tensor(name) != nullptr; }
  int64_t n_params() const { return n_params_; }
  uint64_t n_bytes() const { return n_bytes_; }
  // The handles made so far, in load order; the loader keeps none.
  std::vector<std::unique_ptr<WeightHandle>> release() { return std::move(handles_); }

 private:
  Result<Tensor> find(const std::string& name, const std::vector<int64_t>& expected);
  Result<ops::Weight> prepare(const Tensor& logical, const std::string& name, WeightRole role);
  // The static activation scale of the f8_e4m3 matrix `name` (or a part of one, "name[part]"): the file's
  // "<name less .weight>.input_scale" (hf_import::Options::activation_scales), else 0. invalid_argument
  // naming that tensor when it is not one finite positive f32.
  Result<float> input_scale(const Tensor& logical, const std::string& name, WeightRole role) const;
  // A matrix of a group as get_group prepares it: the view of its rows, counted once over the tensor's parts.
  Result<Tensor> find_part(const GroupPart& part, int64_t ne0);
  // Hands the file pages of `logical` back once the backend holds its own copy, and keeps the handle.
  void keep(std::unique_ptr<WeightHandle> h, const Tensor& logical);
  Backend::ReadDone read_done() const;

  const gguf::File& file_;
  Backend* backend_;
  bool copies_ = false;
  std::vector<std::unique_ptr<WeightHandle>> handles_;
  int64_t n_params_ = 0;
  uint64_t n_bytes_ = 0;
};

}  // namespace kiln::blocks
