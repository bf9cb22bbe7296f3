// Gemma 3: pre- and post-norms around attention and FFN (RMSNorm; GGUF stores the weights with Gemma's "+1"
// already added), the embedding scaled by sqrt(n_embd), RMSNorm of each query and key head (QK-norm), NeoX
// RoPE, GeGLU (tanh GELU), attention scaled by 1/sqrt(head_dim), and layers interleaved five sliding-window
// (local RoPE base) to one global (global RoPE base, with the model's RoPE scaling). Output head tied to the
// embedding unless output.weight exists.
//
// Tensors (GGUF names, shapes innermost first):
//   token_embd.weight [n_embd, n_vocab]   output_norm.weight [n_embd]   output.weight [n_embd, n_vocab]?
//   blk.N.attn_norm / post_attention_norm / ffn_norm / post_ffw_norm.weight [n_embd]
//   blk.N.attn_q.weight [n_embd, n_head*hd]   blk.N.attn_k/v.weight [n_embd, n_kv*hd]   attn_output
//   [n_head*hd, n_embd] blk.N.attn_q_norm / attn_k_norm.weight [hd] blk.N.ffn_gate/up.weight [n_embd, n_ff]
//   blk.N.ffn_down.weight [n_ff, n_embd]
#include <cmath>

#include "models/architecture.h"
#include "models/blocks.h"

namespace kiln {

namespace {

constexpr int32_t kSwaPattern = 6;  // of every 6 layers, the first 5 use the sliding window

struct Gemma3Layer {
  ops::Weight attn_norm, post_attn_norm, ffn_norm, post_ffn_norm;  // [n_embd]
  blocks::AttentionWeights attn;
  blocks::FfnWeights ffn;
  bool sliding = false;
};

class Gemma3 final : public blocks::StepModel {
 public:
  Gemma3(std::shared_ptr<const gguf::File> file, Backend& backend, const ModelOptions& options)
      : StepModel(backend, options), file_(std::move(file)) {}

  Status load() {
    const gguf::File& f = *file_;
    const std::string a = "gemma3";
    KILN_TRY(blocks::read_hparams(
        f, a, {.n_ctx_train = 32768, .norm_eps = 1e-6f, .head_dim = 256, .window = 4096}, info_, shape_));
    KILN_ASSIGN_OR_RETURN(n_ff_, blocks::hparam_int(f, a + ".feed_forward_length", {}));

    KILN_TRY(place_layers());
    blocks::WeightLoader w(f, backend_);
    KILN_ASSIGN_OR_RETURN(embd_, blocks::load_embeddings(f, w, info_, output_backend(), tp_ranks()));
    KILN_ASSIGN_OR_RETURN(const float local_base,
                          blocks::hparam_float(f, a + ".rope.freq_base_swa", 10000.0f));
    for (int32_t s = 0; s < n_stages(); ++s) {  // every backend's layers read the RoPE factors
      w.place_on(stage_backend(s), /*copies=*/s > 0);
      Ropes& ropes = ropes_.emplace_back();
      KILN_ASSIGN_OR_RETURN(ropes.global,
                            blocks::read_rope(f, w, a, shape_.head_dim, ops::RopeLayout::rope_layout_neox));
      ropes.local = ropes.global;  // local layers: their own base, no scaling
      ropes.local.params.scaling = ops::RopeScaling::rope_scaling_none;
      ropes.local.params.factor = 1.0f;
      ropes.local.freq_factors = ops::Weight{};
      ropes.local.params.freq_base = local_base;
    }
    layers_.resize(info_.n_layers);
    for (int32_t l = 0; l < info_.n_layers; ++l) {
      Gemma3Layer& L = layers_[l];
      const std::string p = "blk." + std::to_string(l) + ".";
      const int64_t e = info_.n_embd;
      w.place_on(layer_backend(l));
      L.sliding = l % kSwaPattern < kSwaPattern - 1;
      KILN_ASSIGN_OR_RETURN(L.attn_norm, w.get(p + "attn_norm.weight", WeightRole::weight_role_norm, e));
      KILN_ASSIGN_OR_RETURN(L.post_attn_norm,
                            w.get(p + "post_attention_norm.weight", WeightRole::weight_role_norm, e));
      KILN_ASSIGN_OR_RETURN(L.ffn_norm, w.get(p + "ffn_norm.weight", WeightRole::weight_role_norm, e));
      KILN_ASSIGN_OR_RETURN(L.post_ffn_norm,
                            w.get(p + "post_ffw_norm.weight", WeightRole::weight_role_norm, e));
      KILN_ASSIGN_OR_RETURN(L.attn, blocks::load_attention(w, p, e, shape_, /*qk_norm=*/true));
      KILN_ASSIGN_OR_RETURN(L.ffn, blocks::load_ffn(w, p, e, n_ff_));
    }
    info_.n_params = w.n_params();
    info_.weight_bytes = w.n_bytes();
    weights_ = w.release();
    return Status::ok_status();
  }

 protected:
  Result<Tensor> record_embedding(blocks::Recorder& r) override {
    const int64_t e = info_.n_embd;
    KILN_ASSIGN_OR_RETURN(Tensor x,
                          blocks::embed(r, embd_, e));  // f32 [n_embd, n_tokens] the residual stream
    KILN_TRY(r.program.add(ops::Scale{x, std::sqrt(static_cast<float>(e)), x}));
    return x;
  }

  Status record_layer(blocks::Recorder& r, int32_t l, const Tensor& x, KvBuffers& kv) override {
    const Gemma3Layer& L = layers_[l];
    const Ropes& ropes = ropes_[layer_stage(l)];
    blocks::AttentionShape shape = shape_;
    shape.window = L.sliding ? shape_.window : 0;  // global layers see everything
    KILN_ASSIGN_OR_RETURN(Tensor h, blocks::rms_norm(r, x, L.attn_norm, shape_.norm_eps));
    KILN_ASSIGN_OR_RETURN(
        Tensor att, blocks::attention(r, h, L.attn, shape, L.sliding ? ropes.local : ropes.global, kv, l));
    KILN_TRY(r.program.add(ops::RmsNorm{att, L.post_attn_norm, shape_.norm_eps, false, att}));
    KILN_TRY(r.program.add(ops::Binary{x, att, ops::BinaryKind::binary_kind_add, x}));
    KILN_ASSIGN_OR_RETURN(h, blocks::rms_norm(r, x, L.ffn_norm, shape_.norm_eps));
    KILN_ASSIGN_OR_RETURN(Tensor ffn, blocks::gated_ffn(r, h, L.ffn, ops::GluKind::glu_kind_gelu_tanh));
    KILN_TRY(r.program.add(ops::RmsNorm{ffn, L.post_ffn_norm, shape_.norm_eps, false, ffn}));
    return r.program.add(ops::Binary{x, ffn, ops::BinaryKind::binary_kind_add, x});
  }

  Result<Tensor> record_output(blocks::Recorder& r, const Tensor& x) override {
    return blocks::output_logits(r, x, embd_, shape_.norm_eps, info_.n_vocab);
  }

 private:
  std::shared_ptr<const gguf::File> file_;
  blocks::AttentionShape shape_;
  struct Ropes {
    blocks::RopeConfig global, local;
  };
  std::vector<Ropes> ropes_;  // a copy on each backend that runs layers, [layer_stage(l)]
  int32_t n_ff_ = 0;
  blocks::EmbeddingWeights embd_;
  std::vector<Gemma3Layer> layers_;
};

Result<std::unique_ptr<Model>> make(std::shared_ptr<const gguf::File> file, Backend& backend,
                                    const ModelOptions& options) {
  auto m = std::make_unique<Gemma3>(std::move(file), backend, options);
  KILN_TRY(m->load());
  return std::unique_ptr<Model>(std::move(m));
}

// config.json: sliding_window, the per-layer-type RoPE bases, query_pre_attn_scalar; layer_types must follow
// the five-local-one-global pattern the GGUF architecture assumes.
Status hf_metadata(const hf::ModelConfig& cfg, hf_import::Metadata& md) {
  KILN_ASSIGN_OR_RETURN(const int64_t window, cfg.get_positive_or("sliding_window", 4096));
  md.set_u32("attention.sliding_window", window);
  double local_base = 10000.0;
  if (cfg.has("rope_local_base_freq")) {
    KILN_ASSIGN_OR_RETURN(local_base, cfg.get_float("rope_local_base_freq"));
  } else if (const nlohmann::json* rp = cfg.find("rope_parameters");
             rp != nullptr && rp->contains("sliding_attention")) {
    KILN_ASSIGN_OR_RETURN(
        local_base,
        hf::JsonObject((*rp)["sliding_attention"], cfg.source()).get_float_or("rope_theta", 10000.0));
  }
  md.set_f32("rope.freq_base_swa", local_base);
  KILN_ASSIGN_OR_RETURN(const int64_t head_dim, cfg.head_dim());
  KILN_ASSIGN_OR_RETURN(const double qpas,
                        cfg.get_float_or("query_pre_attn_scalar", static_cast<double>(head_dim)));
  if (!(qpas > 0)) return invalid_argument("{}: query_pre_attn_scalar {} is not > 0", cfg.source(), qpas);
  md.set_f32("attention.scale", 1.0 / std::sqrt(qpas));
  for (std::string_view k : {"attn_logit_softcapping", "final_logit_softcapping"}) {
    if (cfg.has(k)) return unimplemented("{}: {} is not supported for gemma3", cfg.source(), k);
  }
  for (std::string_view k : {"sliding_window_pattern", "_sliding_window_pattern"}) {
    if (!cfg.has(k)) continue;
    KILN_ASSIGN_OR_RETURN(const int64_t pattern, cfg.get_positive(k));
    if (pattern != kSwaPattern)
      return unimplemented("{}: {} = {} (gemma3 is 5 sliding : 1 global, pattern 6)", cfg.source(), k,
                           pattern);
  }
  if (const nlohmann::json* lt = cfg.find("layer_types"); lt != nullptr && lt->is_array()) {
    for (size_t l = 0; l < lt->size(); ++l) {
      const bool sliding = (*lt)[l] == "sliding_attention";
      if (sliding != (l % kSwaPattern < kSwaPattern - 1)) {
        return unimplemented("{}: layer_types[{}] breaks the 5 sliding : 1 global pattern gemma3 assumes",
                             cfg.source(), l);
      }
    }
  }
  return Status::ok_status();
}

// Gemma stores RMSNorm weights as w - 1; GGUF stores w.
void add_one(std::span<float> v) {
  for (float& x : v) x += 1.0f;
}

constexpr std::string_view kHfClasses[] = {"Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"};
constexpr hf_import::Rename kRenames[] = {
    {"post_attention_layernorm.weight", "post_attention_norm.weight"},
    {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
    {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
};
constexpr hf_import::TensorEdit kEdits[] = {{"norm.weight", add_one}};

}  // namespace

extern const Architecture kGemma3 = {
    make, {.hf_classes = kHfClasses, .metadata = hf_metadata, .renames = kRenames, .edits = kEdits}};

}  // namespace kiln
