// Placeholder until the MoE block lands.
#pragma once
#include "models/blocks.h"
namespace kiln::blocks {
struct MoeShape {
  int32_t n_expert = 0, n_used = 0, n_ff_exp = 0, n_ff_shexp = 0;
  bool normalize = true;
};
struct MoeWeights {
  Tensor gate_inp;
};
Result<MoeWeights> load_moe(WeightLoader& w, const std::string& prefix, int64_t n_embd, const MoeShape& shape,
                            bool shared_expert);
Result<Tensor> moe_ffn(Backend& backend, Arena& arena, const Tensor& x, const MoeWeights& w,
                       const MoeShape& shape, bool quantize_x);
}  // namespace kiln::blocks
