// Qwen3: the Llama block with RMSNorm on each query and key head before RoPE (QK-norm), NeoX RoPE, no biases,
// and an explicit head size (attention.key_length). The forward is the shared pre-norm decoder.
//
// Tensors: those of llama.cpp's dense models plus blk.N.attn_q_norm.weight / attn_k_norm.weight [hd].
// Hyper-parameters: qwen3.{context_length, embedding_length, block_count, feed_forward_length,
//   attention.head_count(_kv), attention.key_length, attention.layer_norm_rms_epsilon, rope.*}.
#include "models/architecture.h"
#include "models/decoder.h"

namespace kiln {

namespace {

constexpr blocks::DecoderTraits kTraits = {.arch = "qwen3",
                                           .rope_layout = ops::RopeLayout::rope_layout_neox,
                                           .qk_norm = true,
                                           .n_ctx_train_default = 40960};

constexpr std::string_view kHfClasses[] = {"Qwen3ForCausalLM"};

}  // namespace

extern const Architecture kQwen3 = {blocks::make_decoder_with<kTraits>, {.hf_classes = kHfClasses}};

}  // namespace kiln
