// The pre-norm decoder most architectures are: x += attention(rms_norm(x)); x += ffn(rms_norm(x)), then the
// final norm and the output head. What varies is declared in DecoderTraits by the architecture file
// (llama.cpp, qwen2.cpp, ...): the RoPE layout, QK-norm, how MoE experts are weighted. What the file carries
// is read from it: biases, fused QKV / gate-up tensors, sliding windows, RoPE scaling, and per layer a dense
// FFN or experts (blk.N.ffn_gate_inp.weight present), with a shared expert when its tensors are present.
#pragma once

#include <memory>
#include <string_view>

#include "models/model.h"

namespace kiln::blocks {

struct DecoderTraits {
  std::string_view arch;  // the GGUF key prefix ("qwen2")
  ops::RopeLayout rope_layout = ops::RopeLayout::rope_layout_normal;
  bool qk_norm = false;             // attn_{q,k}_norm.weight in every layer
  bool expert_weights_norm = true;  // default of {arch}.expert_weights_norm: top-k weights renormalised
  int32_t n_ctx_train_default = 4096;
};

Result<std::unique_ptr<Model>> make_decoder(std::shared_ptr<const gguf::File> file, Backend& backend,
                                            const ModelOptions& options, const DecoderTraits& traits);

// The Architecture::make of an architecture that is the decoder with kTraits.
template <const DecoderTraits& kTraits>
Result<std::unique_ptr<Model>> make_decoder_with(std::shared_ptr<const gguf::File> file, Backend& backend,
                                                 const ModelOptions& options) {
  return make_decoder(std::move(file), backend, options, kTraits);
}

}  // namespace kiln::blocks
