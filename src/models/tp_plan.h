// Tensor parallelism's partition of a model's weights (Megatron's): which part of each GGUF weight a rank of
// `world` holds, so that each layer needs one all-reduce after attention and one after the FFN.
//
// - Q, K and V are split by their rows (output features) at whole heads: rank r computes query heads
//   [r H / N, (r + 1) H / N). KV heads are split the same way when N divides their count; when their count
//   divides N instead, each rank holds the one KV head its query heads read (replicated across the N / n_kv
//   ranks that share it). Biases and per-head norms follow their projection. Phi-3's fused attn_qkv gives
//   each rank its Q rows, then its K rows, then its V rows.
// - The output projection is split by its columns (input features) at the same heads: each rank's product is
//   a partial sum of the layer's output, which the all-reduce adds up. Its bias is replicated (added once,
//   after the all-reduce).
// - Gate and up are split by rows, down by columns: the FFN's intermediate features [r F / N, (r + 1) F / N).
//   Phi-3's fused gate+up ffn_up gives each rank its gate rows, then its up rows. Down's bias is replicated.
// - A MoE layer's experts are split by their features, as a dense FFN is: every rank holds every expert's
//   gate and up rows and down columns [r F / N, (r + 1) F / N) of the expert width F, so the router
//   (replicated) picks the same experts on every rank and each rank's weighted sum is a partial sum. A shared
//   expert is split as a dense FFN of its own width; its gate (ffn_gate_inp_shexp) is replicated.
// - The output head is split by rows over the vocabulary (each rank's logits are gathered). The token
//   embedding is replicated: a lookup is not split.
// - Everything else (norms, the router, the RoPE factors) is replicated.
//
// A column split of a block-quantized weight must fall on whole blocks; a shape that does not divide, and
// expert biases, are errors naming the weight and the numbers.
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
  int64_t n_ff_exp = 0;   // each expert's intermediate features (0: dense)
  int64_t n_vocab = 0;
};

enum class Axis {
  replicated,  // every rank holds the whole weight
  rows,        // ne[1]: output features (or the vocabulary)
  cols,        // ne[0]: input features
};

// [begin, end) along a part's axis.
struct Range {
  int64_t begin = 0, end = 0;
};

// One rank's part of a weight: [begin, end) along `axis` (the whole weight for replicated). A fused weight's
// part is a range of each matrix it fuses, taken one after another: [begin, end), then each of `more`
// (Phi-3's attn_qkv: the Q rows, then the K rows and the V rows).
struct Part {
  Axis axis = Axis::replicated;
  int64_t begin = 0, end = 0;
  std::vector<Range> more;
  // The part's extent along its axis: of every range.
  int64_t size() const;
};

class Plan {
 public:
  // Errors: a world below 1; query heads, the FFN's or the experts' features or the vocabulary that `world`
  // does not divide; KV heads that neither divide nor are divided by it (each named with its count).
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
  // `ne` that `rank` holds. Errors: a split that does not divide the weight's extent along its axis, or that
  // cuts a quantized block; a stacked expert weight of another expert count; an expert bias (named, with the
  // numbers).
  Result<Part> part(const std::string& name, DType type, const int64_t ne[4], int32_t rank) const;

 private:
  Plan(const Shape& shape, int32_t world) : shape_(shape), world_(world) {}
  Shape shape_;
  int32_t world_;
};

// The bytes of a part of a contiguous weight `t` (its rows of each matrix, or its whole blocks of columns of
// each row; a fused weight's ranges one after another), as a contiguous tensor of the part's shape would
// hold them.
Result<std::vector<uint8_t>> slice(const Tensor& t, const Part& part);

}  // namespace kiln::tp
