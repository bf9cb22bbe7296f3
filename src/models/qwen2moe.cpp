// Qwen2-MoE (Qwen1.5-MoE): Qwen2 attention (QKV biases, NeoX RoPE) with routed experts (softmax over all
// experts, top-k, renormalised only when norm_topk_prob) plus a shared expert scaled per token by
// sigmoid(ffn_gate_inp_shexp . x). Layers listed in mlp_only_layers keep a dense FFN. The forward is the
// shared pre-norm decoder.
//
// Tensors: qwen2's, and in expert layers blk.N.ffn_gate_inp.weight [n_embd, n_expert],
//   ffn_{gate,up}_exps.weight [n_embd, n_ff_exp, n_expert], ffn_down_exps.weight [n_ff_exp, n_embd,
//   n_expert], ffn_{gate,up}_shexp.weight [n_embd, n_ff_shexp], ffn_down_shexp.weight [n_ff_shexp, n_embd],
//   ffn_gate_inp_shexp.weight [n_embd].
// Hyper-parameters: qwen2's plus qwen2moe.{expert_count, expert_used_count, expert_feed_forward_length,
//   expert_shared_feed_forward_length, expert_weights_norm?}.
#include "models/architecture.h"
#include "models/decoder.h"

namespace kiln {

namespace {

constexpr blocks::DecoderTraits kTraits = {.arch = "qwen2moe",
                                           .rope_layout = ops::RopeLayout::rope_layout_neox,
                                           .expert_weights_norm = false,
                                           .n_ctx_train_default = 32768};

constexpr std::string_view kHfClasses[] = {"Qwen2MoeForCausalLM"};

}  // namespace

extern const Architecture kQwen2Moe = {blocks::make_decoder_with<kTraits>, {.hf_classes = kHfClasses}};

}  // namespace kiln
