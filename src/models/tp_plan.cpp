#include "models/tp_plan.h"

#include <cstring>
#include <string_view>

namespace kiln::tp {

namespace {

// The module of a GGUF weight name: "blk.3.attn_q.weight" -> "attn_q", "token_embd.weight" -> "token_embd".
std::string_view module_of(std::string_view name) {
  if (name.starts_with("blk.")) {
    name.remove_prefix(4);
    const size_t dot = name.find('.');
    if (dot == std::string_view::npos) return {};
    name.remove_prefix(dot + 1);
  }
  const size_t dot = name.find('.');
  return dot == std::string_view::npos ? name : name.substr(0, dot);
}

}  // namespace

Result<Plan> Plan::make(const Shape& s, int32_t world) {
  if (world < 1) return invalid_argument("tensor parallelism: a world of {} GPUs", world);
  if (s.n_heads < 1 || s.n_heads % world != 0)
    return invalid_argument("tensor parallelism over {}: {} attention heads do not divide", world, s.n_heads);
  if (s.n_kv_heads < 1 || (s.n_kv_heads % world != 0 && world % s.n_kv_heads != 0)) {
    return invalid_argument(
        "tensor parallelism over {}: {} KV heads neither divide among them nor are each "
        "replicated on a whole number of them",
        world, s.n_kv_heads);
  }
  if (s.n_heads % s.n_kv_heads != 0)
    return invalid_argument("tensor parallelism: {} heads are not groups of {} KV heads", s.n_heads,
                            s.n_kv_heads);
  if (s.n_ff % world != 0)
    return invalid_argument("tensor parallelism over {}: {} FFN features do not divide", world, s.n_ff);
  if (s.n_experts % world != 0)
    return invalid_argument("tensor parallelism over {}: {} experts do not divide", world, s.n_experts);
  if (s.n_vocab < 1 || s.n_vocab % world != 0)
    return invalid_argument("tensor parallelism over {}: a vocabulary of {} does not divide", world,
                            s.n_vocab);
  return Plan(s, world);
}

int32_t Plan::kv_heads_per_rank() const { return kv_replicated() ? 1 : shape_.n_kv_heads / world_; }

int32_t Plan::first_kv_head(int32_t rank) const {
  if (!kv_replicated()) return rank * kv_heads_per_rank();
  return first_head(rank) / (shape_.n_heads / shape_.n_kv_heads);  // the KV head its query heads read
}

Result<Part> Plan::part(const std::string& name, DType type, const int64_t ne[4], int32_t rank) const {
  if (rank < 0 || rank >= world_) return invalid_argument("tensor parallelism: rank {} of {}", rank, world_);
  const std::string_view m = module_of(name);
  const bool bias = std::string_view(name).ends_with(".bias");
  const int64_t hd = shape_.head_dim;
  if (m == "attn_qkv" || (m == "ffn_up" && shape_.n_ff > 0 && ne[1] == 2 * shape_.n_ff))
    return unimplemented("tensor parallelism: {} is a fused weight, which is not split yet", name);
  // The part, and the extent the weight must have along its axis (the shape's, so that a mislabelled weight
  // is caught rather than cut wrong).
  Part p;
  int64_t whole = 0;
  const auto split = [&](Axis axis, int64_t extent, int64_t first, int64_t count) {
    p = {axis, first, first + count};
    whole = extent;
  };
  // A bias of a row-split projection is split with it: its features are its ne[0].
  const Axis rows = bias ? Axis::cols : Axis::rows;
  if (m == "attn_q") {
    split(rows, int64_t{shape_.n_heads} * hd, first_head(rank) * hd, heads_per_rank() * hd);
  } else if (m == "attn_k" || m == "attn_v") {
    split(rows, int64_t{shape_.n_kv_heads} * hd, first_kv_head(rank) * hd, kv_heads_per_rank() * hd);
  } else if (m == "attn_output" && !bias) {
    split(Axis::cols, int64_t{shape_.n_heads} * hd, first_head(rank) * hd, heads_per_rank() * hd);
  } else if (m == "ffn_gate" || m == "ffn_up") {
    split(rows, shape_.n_ff, rank * (shape_.n_ff / world_), shape_.n_ff / world_);
  } else if (m == "ffn_down" && !bias) {
    split(Axis::cols, shape_.n_ff, rank * (shape_.n_ff / world_), shape_.n_ff / world_);
  } else if (m == "ffn_gate_shexp" || m == "ffn_up_shexp") {  // a shared expert: its own width
    const int64_t w = bias ? ne[0] : ne[1];
    split(rows, w, rank * (w / world_), w / world_);
  } else if (m == "ffn_down_shexp" && !bias) {
    split(Axis::cols, ne[0], rank * (ne[0] / world_), ne[0] / world_);
  } else if (m == "ffn_gate_exps" || m == "ffn_up_exps" || m == "ffn_down_exps") {
    const int64_t e = shape_.n_experts / world_;
    split(Axis::experts, shape_.n_experts, rank * e, e);
  } else if (m == "token_embd" || m == "output") {
    split(Axis::rows, shape_.n_vocab, rank * (shape_.n_vocab / world_), shape_.n_vocab / world_);
  } else {
    return Part{Axis::replicated, 0, 0};  // norms, the router, RoPE factors, biases added after a reduce
  }
  const int64_t extent = p.axis == Axis::rows ? ne[1] : p.axis == Axis::cols ? ne[0] : ne[2];
  if (extent != whole || whole % world_ != 0) {
    return invalid_argument(
        "tensor parallelism over {}: {} has {} along its split axis, expected {} in {} parts", world_, name,
        extent, whole, world_);
  }
  const int64_t block = dtype_info(type).block_size;
  if (p.axis == Axis::cols && (p.begin % block != 0 || p.end % block != 0)) {
    return invalid_argument(
        "tensor parallelism over {}: {} ({}) would be cut at column {}, inside a block of {}", world_, name,
        dtype_name(type), p.begin % block != 0 ? p.begin : p.end, block);
  }
  return p;
}

Result<std::vector<uint8_t>> slice(const Tensor& t, const Part& part) {
  if (!t.is_contiguous()) return invalid_argument("tensor parallelism: {} is not contiguous", t.describe());
  const int64_t extent = part.axis == Axis::rows ? t.ne[1] : part.axis == Axis::cols ? t.ne[0] : t.ne[2];
  if (part.axis != Axis::replicated && (part.begin < 0 || part.begin > part.end || part.end > extent)) {
    return invalid_argument("tensor parallelism: part [{}, {}) of {} along an axis of {}", part.begin,
                            part.end, t.describe(), extent);
  }
  const auto* base = static_cast<const uint8_t*>(t.data);
  const int64_t rows = t.ne[1] * t.ne[2] * t.ne[3];
  std::vector<uint8_t> out;
  switch (part.axis) {
    case Axis::replicated: out.assign(base, base + rows * t.nb[1]); break;
    case Axis::rows: {  // per matrix (ne[2], ne[3]) its rows [begin, end)
      for (int64_t m = 0; m < t.ne[2] * t.ne[3]; ++m) {
        const uint8_t* from = base + (m * t.ne[1] + part.begin) * t.nb[1];
        out.insert(out.end(), from, from + (part.end - part.begin) * t.nb[1]);
      }
      break;
    }
    case Axis::cols: {  // every row's columns [begin, end), whole blocks
      KILN_ASSIGN_OR_RETURN(const int64_t skip, dtype_row_bytes(t.type, part.begin));
      KILN_ASSIGN_OR_RETURN(const int64_t take, dtype_row_bytes(t.type, part.end - part.begin));
      for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* from = base + r * t.nb[1] + skip;
        out.insert(out.end(), from, from + take);
      }
      break;
    }
    case Axis::experts: {
      const uint8_t* from = base + part.begin * t.nb[2];
      out.assign(from, from + (part.end - part.begin) * t.nb[2]);
      break;
    }
  }
  return out;
}

}  // namespace kiln::tp
