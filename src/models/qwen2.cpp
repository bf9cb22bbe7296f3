// Qwen2 / Qwen2.5: the Llama block with biases on Q, K and V and RoPE in the NeoX (half-split) layout, so the
// Hugging Face weights need no permutation. Output head often tied (the small models). The forward is the
// shared pre-norm decoder.
//
// Tensors: those of llama.cpp's dense models plus blk.N.attn_{q,k,v}.bias [n_head*hd | n_kv*hd] f32.
// Hyper-parameters: qwen2.{context_length, embedding_length, block_count, feed_forward_length,
//   attention.head_count(_kv), attention.layer_norm_rms_epsilon, rope.freq_base, rope.scaling.*}.
#include "models/architecture.h"
#include "models/decoder.h"

namespace kiln {

namespace {

constexpr blocks::DecoderTraits kTraits = {
    .arch = "qwen2", .rope_layout = ops::RopeLayout::rope_layout_neox, .n_ctx_train_default = 32768};

constexpr std::string_view kHfClasses[] = {"Qwen2ForCausalLM"};

}  // namespace

extern const Architecture kQwen2 = {blocks::make_decoder_with<kTraits>, {.hf_classes = kHfClasses}};

}  // namespace kiln
