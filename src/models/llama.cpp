// Llama: Llama 2/3, SmolLM2, Mistral-style GQA decoders. Pre-norm (RMSNorm) blocks of causal GQA attention
// with RoPE (GGUF "normal" pair layout: the converter permutes Q/K rows for it) and a SwiGLU FFN; final
// RMSNorm; an output head or the token embedding tied.
//
// Tensors (GGUF names, shapes innermost first):
//   token_embd.weight [n_embd, n_vocab]           output_norm.weight [n_embd]      output.weight [n_embd,
//   n_vocab]? blk.N.attn_norm.weight [n_embd]               blk.N.ffn_norm.weight [n_embd]
//   blk.N.attn_q.weight [n_embd, n_head*hd]       blk.N.attn_k/v.weight [n_embd, n_kv*hd]
//   blk.N.attn_output.weight [n_head*hd, n_embd]  blk.N.ffn_gate/up.weight [n_embd, n_ff]   ffn_down [n_ff,
//   n_embd]
#include <cmath>

#include "models/blocks.h"
#include "models/model.h"

namespace kiln {

namespace {

struct LlamaLayer {
  Tensor attn_norm, ffn_norm;
  blocks::AttentionWeights attn;
  blocks::FfnWeights ffn;
};

class Llama final : public Model {
 public:
  Llama(std::shared_ptr<const gguf::File> file, Backend& backend, const ModelOptions& options)
      : file_(std::move(file)), backend_(backend), arena_(backend), options_(options) {}

  Status load() {
    const gguf::File& f = *file_;
    const std::string a = "llama";
    info_.architecture = a;
    KILN_ASSIGN_OR_RETURN(info_.name, f.get_string_or("general.name", f.name()));
    KILN_ASSIGN_OR_RETURN(info_.n_embd, blocks::hparam_int(f, a + ".embedding_length", {}));
    KILN_ASSIGN_OR_RETURN(info_.n_layers, blocks::hparam_int(f, a + ".block_count", {}));
    KILN_ASSIGN_OR_RETURN(n_ff_, blocks::hparam_int(f, a + ".feed_forward_length", {}));
    KILN_ASSIGN_OR_RETURN(shape_.n_heads, blocks::hparam_int(f, a + ".attention.head_count", {}));
    KILN_ASSIGN_OR_RETURN(shape_.n_kv_heads,
                          blocks::hparam_int(f, a + ".attention.head_count_kv", shape_.n_heads));
    KILN_ASSIGN_OR_RETURN(info_.n_ctx_train, blocks::hparam_int(f, a + ".context_length", 4096));
    KILN_ASSIGN_OR_RETURN(eps_, blocks::hparam_float(f, a + ".attention.layer_norm_rms_epsilon", 1e-5f));
    if (info_.n_embd % shape_.n_heads != 0 || shape_.n_heads % shape_.n_kv_heads != 0) {
      return invalid_argument("{}: embedding_length {}, head_count {}, head_count_kv {} do not divide",
                              f.name(), info_.n_embd, shape_.n_heads, shape_.n_kv_heads);
    }
    KILN_ASSIGN_OR_RETURN(shape_.head_dim,
                          blocks::hparam_int(f, a + ".attention.key_length", info_.n_embd / shape_.n_heads));
    shape_.scale = 1.0f / std::sqrt(static_cast<float>(shape_.head_dim));
    info_.head_dim = shape_.head_dim;
    info_.n_kv_heads = shape_.n_kv_heads;

    blocks::WeightLoader w(f, backend_);
    KILN_ASSIGN_OR_RETURN(embd_, blocks::load_embeddings(f, w, info_));
    KILN_ASSIGN_OR_RETURN(rope_,
                          blocks::read_rope(f, w, a, shape_.head_dim, ops::RopeLayout::rope_layout_normal));
    layers_.resize(info_.n_layers);
    for (int32_t l = 0; l < info_.n_layers; ++l) {
      LlamaLayer& L = layers_[l];
      const std::string p = "blk." + std::to_string(l) + ".";
      const int64_t e = info_.n_embd;
      KILN_ASSIGN_OR_RETURN(L.attn_norm, w.get(p + "attn_norm.weight", e));
      KILN_ASSIGN_OR_RETURN(L.attn, blocks::load_attention(w, p, e, shape_, /*qk_norm=*/false));
      KILN_ASSIGN_OR_RETURN(L.ffn_norm, w.get(p + "ffn_norm.weight", e));
      KILN_ASSIGN_OR_RETURN(L.ffn, blocks::load_ffn(w, p, e, n_ff_));
    }
    info_.n_params = w.n_params();
    info_.weight_bytes = w.n_bytes();
    return Status::ok_status();
  }

  const ModelInfo& info() const override { return info_; }

  Status forward(const Batch& batch, KvBuffers& kv, float* logits) override {
    KILN_TRY(blocks::check_forward(batch, kv, info_));
    arena_.reset();
    const int64_t n = batch.n_tokens(), e = info_.n_embd;
    const blocks::StepInfo step = blocks::make_step(batch, kv.block_size);
    const bool qx = options_.quantize_activations;
    KILN_ASSIGN_OR_RETURN(Tensor x, arena_.f32(e, n));  // [n_embd, n_tokens] the residual stream
    KILN_TRY(backend_.run(ops::GetRows{embd_.tok_embd, batch.tokens, x}));
    for (int32_t l = 0; l < info_.n_layers; ++l) {
      const LlamaLayer& L = layers_[l];
      KILN_ASSIGN_OR_RETURN(Tensor h, blocks::rms_norm(backend_, arena_, x, L.attn_norm, eps_));
      KILN_ASSIGN_OR_RETURN(Tensor att,
                            blocks::attention(backend_, arena_, h, L.attn, shape_, rope_, step, kv, l, qx));
      KILN_TRY(backend_.run(ops::Binary{x, att, ops::BinaryKind::binary_kind_add, x}));
      KILN_ASSIGN_OR_RETURN(h, blocks::rms_norm(backend_, arena_, x, L.ffn_norm, eps_));
      KILN_ASSIGN_OR_RETURN(Tensor ffn,
                            blocks::gated_ffn(backend_, arena_, h, L.ffn, ops::GluKind::glu_kind_silu, qx));
      KILN_TRY(backend_.run(ops::Binary{x, ffn, ops::BinaryKind::binary_kind_add, x}));
    }
    return blocks::output_logits(backend_, arena_, x, batch, embd_, eps_, info_.n_vocab, logits, qx);
  }

 private:
  std::shared_ptr<const gguf::File> file_;
  Backend& backend_;
  blocks::Arena arena_;
  ModelOptions options_;
  ModelInfo info_;
  blocks::AttentionShape shape_;
  ops::RopeParams rope_;
  int32_t n_ff_ = 0;
  float eps_ = 1e-5f;
  blocks::EmbeddingWeights embd_;
  std::vector<LlamaLayer> layers_;
};

}  // namespace

Result<std::unique_ptr<Model>> make_llama(std::shared_ptr<const gguf::File> file, Backend& backend,
                                          const ModelOptions& options) {
  auto m = std::make_unique<Llama>(std::move(file), backend, options);
  KILN_TRY(m->load());
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace kiln
