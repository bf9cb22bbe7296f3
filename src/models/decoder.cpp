#include "models/decoder.h"

#include "models/blocks.h"
#include "models/moe.h"
#include "ops/program.h"

namespace kiln::blocks {

namespace {

struct DecoderLayer {
  ops::Weight attn_norm, ffn_norm;  // [n_embd]
  AttentionWeights attn;
  FfnWeights ffn;  // dense layers
  MoeWeights moe;  // expert layers (moe.router.tensor.data != nullptr)
};

class Decoder final : public StepModel {
 public:
  Decoder(std::shared_ptr<const gguf::File> file, Backend& backend, const ModelOptions& options,
          DecoderTraits traits)
      : StepModel(backend, options), file_(std::move(file)), traits_(std::move(traits)) {}

  Status load() {
    const gguf::File& f = *file_;
    const std::string a(traits_.arch);
    KILN_TRY(read_hparams(f, a, {.n_ctx_train = traits_.n_ctx_train_default}, info_, shape_));
    info_.kv_window = shape_.window;  // every layer has the same window

    KILN_TRY(place_layers());
    WeightLoader w(f, backend_);
    KILN_ASSIGN_OR_RETURN(embd_, load_embeddings(f, w, info_, output_backend(), tp_ranks()));
    for (int32_t s = 0; s < n_stages(); ++s) {  // every backend's layers read the RoPE factors
      w.place_on(stage_backend(s), /*copies=*/s > 0);
      KILN_ASSIGN_OR_RETURN(rope_.emplace_back(),
                            read_rope(f, w, a, shape_.head_dim, traits_.rope_layout, options_.n_ctx));
    }
    KILN_TRY(read_moe_shape(f));
    layers_.resize(info_.n_layers);
    for (int32_t l = 0; l < info_.n_layers; ++l) {
      DecoderLayer& L = layers_[l];
      w.place_on(layer_backend(l));
      const std::string p = "blk." + std::to_string(l) + ".";
      const int64_t e = info_.n_embd;
      KILN_ASSIGN_OR_RETURN(L.attn_norm, w.get(p + "attn_norm.weight", WeightRole::weight_role_norm, e));
      KILN_ASSIGN_OR_RETURN(L.attn, load_attention(w, p, e, shape_, traits_.qk_norm));
      KILN_ASSIGN_OR_RETURN(L.ffn_norm, w.get(p + "ffn_norm.weight", WeightRole::weight_role_norm, e));
      if (f.find_tensor(p + "ffn_gate_inp.weight") != nullptr) {
        if (moe_.n_expert == 0) return invalid_argument("{}: {}.expert_count is missing", f.name(), a);
        const bool shared = f.find_tensor(p + "ffn_gate_shexp.weight") != nullptr;
        KILN_ASSIGN_OR_RETURN(L.moe, load_moe(w, p, e, moe_, shared));
      } else {
        KILN_ASSIGN_OR_RETURN(const int32_t n_ff, hparam_int(f, a + ".feed_forward_length", {}));
        KILN_ASSIGN_OR_RETURN(L.ffn, load_ffn(w, p, e, n_ff));
      }
    }
    info_.n_params = w.n_params();
    info_.weight_bytes = w.n_bytes();
    weights_ = w.release();
    return Status::ok_status();
  }

 protected:
  Result<Tensor> record_embedding(Recorder& r) override { return embed(r, embd_, info_.n_embd); }

  Status record_layer(Recorder& r, int32_t l, const Tensor& x, KvBuffers& kv) override {
    const DecoderLayer& L = layers_[l];
    KILN_ASSIGN_OR_RETURN(Tensor h, rms_norm(r, x, L.attn_norm, shape_.norm_eps));
    KILN_ASSIGN_OR_RETURN(Tensor att, attention(r, h, L.attn, shape_, rope_[layer_stage(l)], kv, l));
    KILN_TRY(r.program.add(ops::Binary{x, att, ops::BinaryKind::binary_kind_add, x}));
    KILN_ASSIGN_OR_RETURN(h, rms_norm(r, x, L.ffn_norm, shape_.norm_eps));
    Tensor ffn;
    if (L.moe.router.tensor.data != nullptr) {
      KILN_ASSIGN_OR_RETURN(ffn, moe_ffn(r, h, L.moe, moe_));
    } else {
      KILN_ASSIGN_OR_RETURN(ffn, gated_ffn(r, h, L.ffn, ops::GluKind::glu_kind_silu));
    }
    return r.program.add(ops::Binary{x, ffn, ops::BinaryKind::binary_kind_add, x});
  }

  Result<Tensor> record_output(Recorder& r, const Tensor& x) override {
    return output_logits(r, x, embd_, shape_.norm_eps, info_.n_vocab);
  }

 private:
  // {arch}.expert_count / expert_used_count / expert_feed_forward_length (else feed_forward_length) /
  // expert_shared_feed_forward_length / expert_weights_norm; n_expert 0 when the model has no experts.
  Status read_moe_shape(const gguf::File& f) {
    const std::string a(traits_.arch);
    if (f.find(a + ".expert_count") == nullptr) return Status::ok_status();
    KILN_ASSIGN_OR_RETURN(moe_.n_expert, hparam_int(f, a + ".expert_count", {}));
    KILN_ASSIGN_OR_RETURN(moe_.n_used, hparam_int(f, a + ".expert_used_count", {}));
    if (moe_.n_used > moe_.n_expert) {
      return invalid_argument("{}: expert_used_count {} > expert_count {}", f.name(), moe_.n_used,
                              moe_.n_expert);
    }
    std::optional<int32_t> dense_ff;
    if (f.find(a + ".feed_forward_length") != nullptr) {
      KILN_ASSIGN_OR_RETURN(dense_ff, hparam_int(f, a + ".feed_forward_length", {}));
    }
    KILN_ASSIGN_OR_RETURN(moe_.n_ff_exp, hparam_int(f, a + ".expert_feed_forward_length", dense_ff));
    KILN_ASSIGN_OR_RETURN(moe_.n_ff_shexp,
                          hparam_int(f, a + ".expert_shared_feed_forward_length", moe_.n_ff_exp));
    KILN_ASSIGN_OR_RETURN(moe_.normalize,
                          f.get_bool_or(a + ".expert_weights_norm", traits_.expert_weights_norm));
    return Status::ok_status();
  }

  std::shared_ptr<const gguf::File> file_;
  DecoderTraits traits_;
  AttentionShape shape_;
  std::vector<RopeConfig> rope_;  // a copy on each backend that runs layers, [layer_stage(l)]
  MoeShape moe_;
  EmbeddingWeights embd_;
  std::vector<DecoderLayer> layers_;
};

}  // namespace

Result<std::unique_ptr<Model>> make_decoder(std::shared_ptr<const gguf::File> file, Backend& backend,
                                            const ModelOptions& options, const DecoderTraits& traits) {
  auto m = std::make_unique<Decoder>(std::move(file), backend, options, traits);
  KILN_TRY(m->load());
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace kiln::blocks
