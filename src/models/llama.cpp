// Llama: Llama 2/3/3.1/3.2, SmolLM2, Mistral (sliding-window attention) and Mixtral (top-k routed experts).
// Pre-norm (RMSNorm) blocks of causal GQA attention with RoPE in GGUF's "normal" pair layout (Hugging Face
// Q/K rows are permuted into it on import, as llama.cpp's converter does) and a SwiGLU FFN or experts; final
// RMSNorm; an output head or the token embedding tied. The forward is the shared pre-norm decoder.
//
// Tensors (GGUF names, shapes innermost first):
//   token_embd.weight [n_embd, n_vocab]    output_norm.weight [n_embd]    output.weight [n_embd, n_vocab]?
//   rope_freqs.weight [n_rot/2]? (Llama 3.1 scaling)
//   blk.N.attn_norm.weight / ffn_norm.weight [n_embd]
//   blk.N.attn_q.weight [n_embd, n_head*hd]   attn_k/v.weight [n_embd, n_kv*hd]   attn_output [n_head*hd,
//   n_embd] blk.N.attn_{q,k,v,output}.bias? (attention_bias) dense: blk.N.ffn_gate/up.weight [n_embd, n_ff]
//   ffn_down.weight [n_ff, n_embd] experts: blk.N.ffn_gate_inp.weight [n_embd, n_expert]   ffn_{gate,up}_exps
//   [n_embd, n_ff, n_expert]
//            ffn_down_exps [n_ff, n_embd, n_expert]
// Hyper-parameters: llama.{context_length, embedding_length, block_count, feed_forward_length,
//   attention.head_count(_kv), attention.key_length, attention.layer_norm_rms_epsilon,
//   attention.sliding_window?, rope.*, expert_count?, expert_used_count?}.
#include "models/architecture.h"
#include "models/decoder.h"

namespace kiln {

namespace {

Result<std::unique_ptr<Model>> make(std::shared_ptr<const gguf::File> file, Backend& backend,
                                    const ModelOptions& options) {
  return blocks::make_decoder(std::move(file), backend, options, {.arch = "llama"});
}

Status hf_metadata(const hf::ModelConfig& cfg, hf_import::Metadata& md) {
  if (cfg.has("sliding_window")) {  // Mistral 7B v0.1; null in later Mistral configs
    KILN_ASSIGN_OR_RETURN(const int64_t w, cfg.get_positive("sliding_window"));
    md.set_u32("attention.sliding_window", w);
  }
  return Status::ok_status();
}

constexpr std::string_view kHfClasses[] = {"LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM"};

}  // namespace

extern const Architecture kLlama = {make,
                                    {.hf_classes = kHfClasses, .metadata = hf_metadata, .permute_qk = true}};

}  // namespace kiln
