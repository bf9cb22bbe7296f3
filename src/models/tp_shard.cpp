#include "models/tp_shard.h"

#include <fmt/format.h>

#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "models/hparams.h"

namespace kiln::tp {

namespace {

// What a view's tensors point into: the whole file, and the parts copied out of it.
struct Storage {
  std::shared_ptr<const gguf::File> whole;
  std::vector<std::vector<uint8_t>> copies;
};

// The metadata keys the partition reads or rewrites; per-layer arrays of them are not split.
constexpr const char* kShapeKeys[] = {".attention.head_count",
                                      ".attention.head_count_kv",
                                      ".attention.key_length",
                                      ".attention.value_length",
                                      ".feed_forward_length",
                                      ".expert_feed_forward_length",
                                      ".expert_shared_feed_forward_length"};

// The head size as read_hparams() reads it: key_length, else the architecture's default (Gemma 3's 256),
// else embedding_length / head_count.
Result<int32_t> head_dim_of(const gguf::File& f, const std::string& a, int32_t n_heads) {
  std::optional<int32_t> fallback;
  if (a == "gemma3") {
    fallback = 256;
  } else {
    KILN_ASSIGN_OR_RETURN(const int32_t n_embd, blocks::hparam_int(f, a + ".embedding_length", {}));
    if (n_embd % n_heads == 0) fallback = n_embd / n_heads;
  }
  return blocks::hparam_int(f, a + ".attention.key_length", fallback);
}

// Whether the part's ranges, one after another, are the whole extent (world 1; a fused weight's every
// matrix): the weight itself.
bool covers_whole(const Part& p, int64_t extent) {
  if (p.begin != 0) return false;
  int64_t at = p.end;
  for (const Range& r : p.more) {
    if (r.begin != at) return false;
    at = r.end;
  }
  return at == extent;
}

// Tensor `t` of the whole file as the rank's weight `name`: the same bytes when replicated or whole, a range
// of them when the part is contiguous there (rows of one matrix, columns of one row), else a copy kept in
// `storage`.
Result<gguf::TensorInfo> part_of(const gguf::TensorInfo& t, const std::string& name, const Plan& plan,
                                 int32_t rank, Storage& storage) {
  if (t.shape.empty() || t.shape.size() > 4)
    return invalid_argument("tensor parallelism: {} has {} dimensions", t.name, t.shape.size());
  int64_t ne[4] = {1, 1, 1, 1};
  for (size_t i = 0; i < t.shape.size(); ++i) ne[i] = t.shape[i];
  KILN_ASSIGN_OR_RETURN(const Part p, plan.part(name, t.type, ne, rank));
  gguf::TensorInfo out = t;
  out.name = name;
  out.offset = 0;
  const size_t dim = p.axis == Axis::rows ? 1 : 0;
  if (p.axis == Axis::replicated || covers_whole(p, ne[dim])) return out;
  while (out.shape.size() <= dim) out.shape.push_back(1);
  out.shape[dim] = p.size();
  KILN_ASSIGN_OR_RETURN(const int64_t row_bytes, dtype_row_bytes(t.type, out.shape[0]));
  int64_t rows = 1;
  for (size_t i = 1; i < out.shape.size(); ++i) rows *= out.shape[i];
  out.n_bytes = static_cast<uint64_t>(row_bytes * rows);
  if (p.more.empty() && (dim == 1 ? ne[2] * ne[3] == 1 : ne[1] * ne[2] * ne[3] == 1)) {
    KILN_ASSIGN_OR_RETURN(const int64_t skip, dim == 1 ? dtype_row_bytes(t.type, ne[0] * p.begin)
                                                       : dtype_row_bytes(t.type, p.begin));
    out.data = t.data + skip;
    return out;
  }
  const Tensor whole = make_tensor(t.type, const_cast<uint8_t*>(t.data), ne[0], ne[1], ne[2], ne[3]);
  KILN_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, slice(whole, p));
  if (bytes.size() != out.n_bytes) {
    return make_status(StatusCode::internal, "tensor parallelism: {}'s part is {} bytes, its shape's {}",
                       name, bytes.size(), out.n_bytes);
  }
  out.data = storage.copies.emplace_back(std::move(bytes)).data();
  return out;
}

}  // namespace

Result<Shape> shape_of(const gguf::File& f) {
  const std::string a = f.architecture();
  if (a.empty()) return invalid_argument("{}: general.architecture is missing", f.name());
  for (const char* k : kShapeKeys) {
    if (const gguf::Value* v = f.find(a + k); v != nullptr && v->type == gguf::ValueType::array) {
      return unimplemented("{}: {}{} is given per layer, which tensor parallelism does not split", f.name(),
                           a, k);
    }
  }
  Shape s;
  KILN_ASSIGN_OR_RETURN(s.n_heads, blocks::hparam_int(f, a + ".attention.head_count", {}));
  KILN_ASSIGN_OR_RETURN(s.n_kv_heads, blocks::hparam_int(f, a + ".attention.head_count_kv", s.n_heads));
  KILN_ASSIGN_OR_RETURN(s.head_dim, head_dim_of(f, a, s.n_heads));
  if (f.find(a + ".feed_forward_length") != nullptr) {
    KILN_ASSIGN_OR_RETURN(s.n_ff, blocks::hparam_int(f, a + ".feed_forward_length", {}));
  }
  if (f.find(a + ".expert_count") != nullptr) {  // as the decoder reads the experts' width
    KILN_ASSIGN_OR_RETURN(s.n_experts, blocks::hparam_int(f, a + ".expert_count", {}));
    const std::optional<int32_t> dense =
        s.n_ff > 0 ? std::optional(static_cast<int32_t>(s.n_ff)) : std::nullopt;
    KILN_ASSIGN_OR_RETURN(s.n_ff_exp, blocks::hparam_int(f, a + ".expert_feed_forward_length", dense));
  }
  const gguf::TensorInfo* embd = f.find_tensor("token_embd.weight");
  if (embd == nullptr || embd->shape.size() != 2)
    return invalid_argument("{}: token_embd.weight is missing or not 2-d", f.name());
  s.n_vocab = embd->shape[1];
  return s;
}

Result<std::shared_ptr<const gguf::File>> shard_file(std::shared_ptr<const gguf::File> whole, int32_t world,
                                                     int32_t rank) {
  if (whole == nullptr) return invalid_argument("tensor parallelism: no file to split");
  const gguf::File& f = *whole;
  KILN_ASSIGN_OR_RETURN(const Shape shape, shape_of(f));
  KILN_ASSIGN_OR_RETURN(const Plan plan, Plan::make(shape, world));
  if (rank < 0 || rank >= world) return invalid_argument("tensor parallelism: rank {} of {}", rank, world);
  const std::string a = f.architecture();

  // Everything the rank's model derives from the shape, as the whole model reads it.
  const int32_t hd = shape.head_dim;
  KILN_ASSIGN_OR_RETURN(const int32_t v_dim, blocks::hparam_int(f, a + ".attention.value_length", hd));
  if (v_dim != hd)
    return unimplemented("{}: value_length {} differs from key_length {}", f.name(), v_dim, hd);
  KILN_ASSIGN_OR_RETURN(const float scale, blocks::hparam_float(f, a + ".attention.scale",
                                                                1.0f / std::sqrt(static_cast<float>(hd))));
  KILN_ASSIGN_OR_RETURN(const int32_t n_rot, blocks::hparam_int(f, a + ".rope.dimension_count", hd));
  int32_t n_ff_shexp = 0;
  if (shape.n_experts > 0) {
    KILN_ASSIGN_OR_RETURN(n_ff_shexp, blocks::hparam_int(f, a + ".expert_shared_feed_forward_length",
                                                         static_cast<int32_t>(shape.n_ff_exp)));
    if (n_ff_shexp % world != 0) {
      return invalid_argument(
          "tensor parallelism over {}: {}.expert_shared_feed_forward_length {} does not divide", world, a,
          n_ff_shexp);
    }
  }

  std::vector<std::pair<std::string, gguf::Value>> md = f.metadata();  // arrays are shared, not copied
  const auto set = [&](const std::string& key, gguf::Value v) {
    for (auto& [k, value] : md) {
      if (k == key) {
        value = std::move(v);
        return;
      }
    }
    md.emplace_back(key, std::move(v));
  };
  const auto u32 = [](int64_t v) { return gguf::Value::u32(static_cast<uint32_t>(v)); };
  set(a + ".attention.head_count", u32(plan.heads_per_rank()));
  set(a + ".attention.head_count_kv", u32(plan.kv_heads_per_rank()));
  set(a + ".attention.key_length", u32(hd));
  set(a + ".attention.value_length", u32(hd));
  set(a + ".attention.scale", gguf::Value::f32(scale));
  set(a + ".rope.dimension_count", u32(n_rot));
  if (shape.n_ff > 0) set(a + ".feed_forward_length", u32(shape.n_ff / world));
  if (shape.n_experts > 0) {
    set(a + ".expert_feed_forward_length", u32(shape.n_ff_exp / world));
    set(a + ".expert_shared_feed_forward_length", u32(n_ff_shexp / world));
  }
  if (f.find("general.name") == nullptr) set("general.name", gguf::Value::str(f.name()));

  auto storage = std::make_shared<Storage>();
  std::vector<gguf::TensorInfo> tensors;
  tensors.reserve(f.tensors().size() + 1);
  for (const gguf::TensorInfo& t : f.tensors()) {
    KILN_ASSIGN_OR_RETURN(gguf::TensorInfo part, part_of(t, t.name, plan, rank, *storage));
    tensors.push_back(std::move(part));
  }
  if (f.find_tensor("output.weight") == nullptr) {  // a tied head: its rows of the embedding, as the head
    KILN_ASSIGN_OR_RETURN(gguf::TensorInfo head, part_of(*f.find_tensor("token_embd.weight"), "output.weight",
                                                         plan, rank, *storage));
    tensors.push_back(std::move(head));
  }
  storage->whole = std::move(whole);
  const std::string name = fmt::format("{} (rank {} of {})", f.name(), rank, world);
  KILN_ASSIGN_OR_RETURN(gguf::File view,
                        gguf::File::assemble(name, std::move(md), std::move(tensors), std::move(storage)));
  return std::make_shared<const gguf::File>(std::move(view));
}

}  // namespace kiln::tp
