// The mixture-of-experts FFN block (Mixtral, Qwen2-MoE, Qwen3-MoE): a router scores n_expert gated FFNs per
// token, the n_used best run on it and their outputs are mixed by the routing weights; Qwen2-MoE adds a
// shared expert that every token goes through, scaled by a per-token sigmoid gate.
#pragma once

#include <cstdint>
#include <string>

#include "models/blocks.h"

namespace kiln::blocks {

struct MoeShape {
  int32_t n_expert = 0;    // experts per layer
  int32_t n_used = 0;      // experts per token, in [1, n_expert]
  int32_t n_ff_exp = 0;    // hidden size of each expert
  int32_t n_ff_shexp = 0;  // hidden size of the shared expert (used only when there is one)
  bool normalize = false;  // the chosen experts' weights rescaled to sum to 1 (Mixtral; Qwen norm_topk_prob)
};

// The weights of one MoE layer. Expert e's matrices are slab e of the stacked tensors.
struct MoeWeights {
  ops::Weight router;     // ffn_gate_inp [n_embd, n_expert]
  ops::Weight gate_exps;  // ffn_gate_exps [n_embd, n_ff_exp, n_expert]
  ops::Weight up_exps;    // ffn_up_exps [n_embd, n_ff_exp, n_expert]
  ops::Weight down_exps;  // ffn_down_exps [n_ff_exp, n_embd, n_expert]
  FfnWeights shared;  // ffn_{gate,up,down}_shexp [n_embd, n_ff_shexp] ... or none (tensor.data == nullptr)
  ops::Weight shared_gate;  // ffn_gate_inp_shexp [n_embd, 1] (stored [n_embd] or [n_embd, 1]), or none
};

// blk.N.ffn_gate_inp.weight and blk.N.ffn_{gate,up,down}_exps.weight of layer `prefix` ("blk.N."); with
// shared_expert also ffn_{gate,up,down}_shexp.weight and ffn_gate_inp_shexp.weight. invalid_argument naming
// the field for an impossible shape, the loader's errors for missing or misshapen tensors.
Result<MoeWeights> load_moe(WeightLoader& weights, const std::string& prefix, int64_t n_embd,
                            const MoeShape& shape, bool shared_expert);

// out[:, t] = sum_s w[s, t] * down_e(silu(gate_e x_t) * up_e x_t) over the n_used experts e the router picks
// for token t (ops::MoeRoute), plus sigmoid(shared_gate . x_t) * shared_ffn(x_t) when there is a shared
// expert (without shared_gate: the shared FFN unscaled).   x: f32 [n_embd, n_tokens]; out: f32 [n_embd,
// n_tokens].
// The expert ids stay in backend memory: MoeRoute writes them, the MoeMatmuls read them, within the program.
Result<Tensor> moe_ffn(Recorder& r, const Tensor& x, const MoeWeights& w, const MoeShape& shape);

}  // namespace kiln::blocks
