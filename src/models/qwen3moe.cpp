// Qwen3-MoE: Qwen3 attention (QK-norm, NeoX RoPE) with routed experts: softmax over all experts, top-k, the
// chosen weights renormalised (norm_topk_prob; on by default, as the released models set it). No shared
// expert. The forward is the shared pre-norm decoder.
//
// Tensors: qwen3's, and in expert layers blk.N.ffn_gate_inp.weight [n_embd, n_expert],
//   ffn_{gate,up}_exps.weight [n_embd, n_ff_exp, n_expert], ffn_down_exps.weight [n_ff_exp, n_embd,
//   n_expert].
// Hyper-parameters: qwen3's plus qwen3moe.{expert_count, expert_used_count, expert_feed_forward_length,
//   expert_weights_norm?}.
#include "models/architecture.h"
#include "models/decoder.h"

namespace kiln {

namespace {

constexpr blocks::DecoderTraits kTraits = {.arch = "qwen3moe",
                                           .rope_layout = ops::RopeLayout::rope_layout_neox,
                                           .qk_norm = true,
                                           .n_ctx_train_default = 40960};

constexpr std::string_view kHfClasses[] = {"Qwen3MoeForCausalLM"};

}  // namespace

extern const Architecture kQwen3Moe = {blocks::make_decoder_with<kTraits>, {.hf_classes = kHfClasses}};

}  // namespace kiln
