// Tensor parallelism's partition of a model's weights (Megatron's): which part of each GGUF weight a rank of
// `world` holds, so that each layer needs one all-reduce after attention and one after the FFN.
//
// - Q, K and V are split by their rows (output features) at whole heads: rank r computes query heads
//   [r H / N, (r + 1) H / N). KV heads are split the same way when N divides their count; when their count
//   divides N instead, each rank holds the one KV head its query heads read (replicated across the N / n_kv
//   ranks that share it). Biases and per-head norms follow their projection.
// - The output projection is split by its columns (input features) at the same heads: each rank's product is
//   a partial sum of the layer's output, which the all-reduce adds up.
// - Gate and up are split by rows, down by columns: the FFN's intermediate features [r F / N, (r + 1) F / N).
// - A MoE layer's experts are split whole: rank r holds experts [r E / N, (r + 1) E / N) of each stacked
//   expert weight; the router and the norms are replicated. A shared expert is split as a dense FFN.
// - The token embedding and the output head are split by rows over the vocabulary (the output's logits are
//   gathered, the embedding's rows summed).
// - Everything else (norms, the RoPE factors) is replicated.
//
// A column split of a block-quantized weight must fall on whole blocks; a shape that does not divide, and
// a fused weight (Phi-3's attn_qkv and gate+up ffn_up), are errors naming the weight and the numbers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace kiln::tp {

// The shapes the partition depends on (blocks::AttentionShape and the FFN's hyper-parameters).
struct Shape {
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int64_t n_ff = 0;       // the dense FFN's intermediate features (0: none)
  int32_t n_experts = 0;  // MoE experts a layer (0: dense)
  int64_t n_vocab = 0;
};

enum class Axis {
  replicated,  // every rank holds the whole weight
  rows,        // ne[1]: output features (or the vocabulary)
  cols,        // ne[0]: input features
  experts,     // ne[2]: a stacked expert weight's experts
};

// One rank's part of a weight: [begin, end) along `axis` (the whole weight for replicated).
struct Part {
  Axis axis = Axis::replicated;
  int64_t begin = 0, end = 0;
};

class Plan {
 public:
  // Errors: a world below 1; query heads, the FFN's features, experts or the vocabulary that `world` does
  // not divide; KV heads that neither divide nor are divided by it (each named with its count).
  static Result<Plan> make(const Shape& shape, int32_t world);

  int32_t world() const { return world_; }
  const Shape& shape() const { return shape_; }
  // The query heads of `rank` ([first, first + count)), and the KV heads it holds.
  int32_t heads_per_rank() const { return shape_.n_heads / world_; }
  int32_t first_head(int32_t rank) const { return rank * heads_per_rank(); }
  int32_t kv_heads_per_rank() const;  // 1 where KV heads are replicated
  int32_t first_kv_head(int32_t rank) const;
  bool kv_replicated() const { return shape_.n_kv_heads < world_; }

  // The part of weight `name` (its GGUF name: "blk.3.attn_q.weight", "token_embd.weight") of `type` and shape
  // `ne` that `rank` holds. Errors: a fused weight; a split that does not divide the weight's extent along
  // its axis, or that cuts a quantized block (named, with the numbers).
  Result<Part> part(const std::string& name, DType type, const int64_t ne[4], int32_t rank) const;

 private:
  Plan(const Shape& shape, int32_t world) : shape_(shape), world_(world) {}
  Shape shape_;
  int32_t world_;
};

// The bytes of `rank`'s part of a contiguous weight `t` (its rows, its whole blocks of columns, or its
// experts), as a contiguous tensor of the part's shape would hold them.
Result<std::vector<uint8_t>> slice(const Tensor& t, const Part& part);

}  // namespace kiln::tp
