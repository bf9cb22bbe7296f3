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

int64_t Part::size() const {
  int64_t n = end - begin;
  for (const Range& r : more) n += r.end - r.begin;
  return n;
}

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
  if (s.n_experts < 0 || (s.n_experts > 0) != (s.n_ff_exp > 0)) {
    return invalid_argument("tensor parallelism: {} experts of {} features each", s.n_experts, s.n_ff_exp);
  }
  if (s.n_ff_exp % world != 0) {
    return invalid_argument("tensor parallelism over {}: {} features of each expert do not divide", world,
                            s.n_ff_exp);
  }
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
  // An FP8 weight's static activation scale (one number) holds for every part of its weight.
  if (std::string_view(name).ends_with(".input_scale")) return Part{Axis::replicated, 0, 0, {}};
  const std::string_view m = module_of(name);
  const bool bias = std::string_view(name).ends_with(".bias");
  // The part, and the extent the weight must have along its axis (the shape's, so that a mislabelled weight
  // is caught rather than cut wrong).
  Part p;
  int64_t whole = 0;
  const auto split = [&](Axis axis, int64_t extent, int64_t first, int64_t count) {
    p = {axis, first, first + count, {}};
    whole = extent;
  };
  // A bias of a row-split projection is split with it: its features are its ne[0].
  const Axis rows = bias ? Axis::cols : Axis::rows;
  const int64_t features = bias ? ne[0] : ne[1];
  const int64_t hd = shape_.head_dim, q = shape_.n_heads * hd, kv = shape_.n_kv_heads * hd;
  const int64_t q0 = first_head(rank) * hd, nq = heads_per_rank() * hd;
  const int64_t kv0 = first_kv_head(rank) * hd, nkv = kv_heads_per_rank() * hd;
  const int64_t ff = shape_.n_ff / world_, fe = shape_.n_ff_exp / world_;
  if (m == "attn_qkv") {  // Q, K and V rows one after another: the rank's of each
    split(rows, q + 2 * kv, q0, nq);
    p.more = {{q + kv0, q + kv0 + nkv}, {q + kv + kv0, q + kv + kv0 + nkv}};
  } else if (m == "attn_q") {
    split(rows, q, q0, nq);
  } else if (m == "attn_k" || m == "attn_v") {
    split(rows, kv, kv0, nkv);
  } else if (m == "attn_output" && !bias) {
    split(Axis::cols, q, q0, nq);
  } else if (m == "ffn_up" && shape_.n_ff > 0 && features == 2 * shape_.n_ff) {  // gate rows, then up rows
    split(rows, 2 * shape_.n_ff, rank * ff, ff);
    p.more = {{shape_.n_ff + rank * ff, shape_.n_ff + (rank + 1) * ff}};
  } else if (m == "ffn_gate" || m == "ffn_up") {
    split(rows, shape_.n_ff, rank * ff, ff);
  } else if (m == "ffn_down" && !bias) {
    split(Axis::cols, shape_.n_ff, rank * ff, ff);
  } else if (m == "ffn_gate_shexp" || m == "ffn_up_shexp") {  // a shared expert: its own width
    split(rows, features, rank * (features / world_), features / world_);
  } else if (m == "ffn_down_shexp" && !bias) {
    split(Axis::cols, ne[0], rank * (ne[0] / world_), ne[0] / world_);
  } else if (m == "ffn_gate_exps" || m == "ffn_up_exps" || m == "ffn_down_exps") {
    // Every expert's features [rank F / N, (rank + 1) F / N): its rows of gate and up, its columns of down.
    if (bias) return unimplemented("tensor parallelism: {} is an expert bias, which is not split", name);
    if (ne[2] != shape_.n_experts) {
      return invalid_argument("tensor parallelism: {} stacks {} experts, expected {}", name, ne[2],
                              shape_.n_experts);
    }
    split(m == "ffn_down_exps" ? Axis::cols : Axis::rows, shape_.n_ff_exp, rank * fe, fe);
  } else if (m == "output") {
    split(rows, shape_.n_vocab, rank * (shape_.n_vocab / world_), shape_.n_vocab / world_);
  } else {
    // Norms, the embedding, the router, the shared expert's gate, RoPE factors, biases added after a reduce.
    return Part{Axis::replicated, 0, 0, {}};
  }
  const int64_t extent = p.axis == Axis::rows ? ne[1] : ne[0];
  if (extent != whole || whole % world_ != 0) {
    return invalid_argument(
        "tensor parallelism over {}: {} has {} along its split axis, expected {} in {} parts", world_, name,
        extent, whole, world_);
  }
  const int64_t block = dtype_info(type).block_size;
  if (p.axis == Axis::cols) {
    std::vector<Range> ranges = p.more;
    ranges.insert(ranges.begin(), Range{p.begin, p.end});
    for (const Range& r : ranges) {
      if (r.begin % block == 0 && r.end % block == 0) continue;
      return invalid_argument(
          "tensor parallelism over {}: {} ({}) would be cut at column {}, inside a block of {}", world_, name,
          dtype_name(type), r.begin % block != 0 ? r.begin : r.end, block);
    }
  }
  return p;
}

Result<std::vector<uint8_t>> slice(const Tensor& t, const Part& part) {
  if (!t.is_contiguous()) return invalid_argument("tensor parallelism: {} is not contiguous", t.describe());
  std::vector<Range> ranges = part.more;
  ranges.insert(ranges.begin(), Range{part.begin, part.end});
  const int64_t extent = part.axis == Axis::rows ? t.ne[1] : t.ne[0];
  for (const Range& r : ranges) {
    if (part.axis != Axis::replicated && (r.begin < 0 || r.begin > r.end || r.end > extent)) {
      return invalid_argument("tensor parallelism: part [{}, {}) of {} along an axis of {}", r.begin, r.end,
                              t.describe(), extent);
    }
  }
  const auto* base = static_cast<const uint8_t*>(t.data);
  const int64_t rows = t.ne[1] * t.ne[2] * t.ne[3];
  std::vector<uint8_t> out;
  switch (part.axis) {
    case Axis::replicated: out.assign(base, base + rows * t.nb[1]); break;
    case Axis::rows: {  // per matrix (ne[2], ne[3]) its rows of each range
      out.reserve(static_cast<size_t>(t.ne[2] * t.ne[3] * part.size() * t.nb[1]));
      for (int64_t m = 0; m < t.ne[2] * t.ne[3]; ++m) {
        for (const Range& r : ranges) {
          const uint8_t* from = base + (m * t.ne[1] + r.begin) * t.nb[1];
          out.insert(out.end(), from, from + (r.end - r.begin) * t.nb[1]);
        }
      }
      break;
    }
    case Axis::cols: {                                 // every row's columns of each range, whole blocks
      std::vector<std::pair<int64_t, int64_t>> bytes;  // (skip, take) of each range
      for (const Range& r : ranges) {
        KILN_ASSIGN_OR_RETURN(const int64_t skip, dtype_row_bytes(t.type, r.begin));
        KILN_ASSIGN_OR_RETURN(const int64_t take, dtype_row_bytes(t.type, r.end - r.begin));
        bytes.emplace_back(skip, take);
      }
      for (int64_t row = 0; row < rows; ++row) {
        for (const auto& [skip, take] : bytes) {
          const uint8_t* from = base + row * t.nb[1] + skip;
          out.insert(out.end(), from, from + take);
        }
      }
      break;
    }
  }
  return out;
}

}  // namespace kiln::tp
