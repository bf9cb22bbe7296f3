// Phi-3 / Phi-3.5 (mini, medium): the Llama block with Q, K and V in one fused projection and gate and up in
// another (both split into row views at load, nothing copied), NeoX RoPE, sliding-window attention where
// configured, and LongRoPE: per-pair frequency divisors (short below the original context, long above it,
// chosen from the context served, as llama.cpp does) with a cos/sin magnitude factor. The forward is the
// shared pre-norm decoder.
//
// Tensors: token_embd, output_norm, output; blk.N.attn_norm / ffn_norm [n_embd];
//   blk.N.attn_qkv.weight [n_embd, (n_head + 2 n_kv) hd]; attn_output [n_head*hd, n_embd];
//   blk.N.ffn_up.weight [n_embd, 2 n_ff] (gate rows first); ffn_down [n_ff, n_embd];
//   rope_factors_short.weight / rope_factors_long.weight [n_rot/2] (LongRoPE).
// Hyper-parameters: phi3.{llama's keys, attention.sliding_window?, rope.scaling.attn_factor?,
//   rope.scaling.original_context_length?}.
#include <cmath>

#include "models/architecture.h"
#include "models/decoder.h"

namespace kiln {

namespace {

Result<std::unique_ptr<Model>> make(std::shared_ptr<const gguf::File> file, Backend& backend,
                                    const ModelOptions& options) {
  return blocks::make_decoder(std::move(file), backend, options,
                              {.arch = "phi3", .rope_layout = ops::RopeLayout::rope_layout_neox});
}

// One factor list of "rope_scaling"/"rope_parameters", n_rot/2 values.
Result<std::vector<float>> factors(const nlohmann::json& rs, const char* key, int64_t n,
                                   const std::string& src) {
  const nlohmann::json* v = rs.contains(key) ? &rs[key] : nullptr;
  if (v == nullptr || !v->is_array() || static_cast<int64_t>(v->size()) != n)
    return invalid_argument("{}: rope scaling {} must be a list of {} numbers", src, key, n);
  std::vector<float> out;
  for (const nlohmann::json& x : *v) {
    if (!x.is_number() || !(x.get<double>() > 0))
      return invalid_argument("{}: rope scaling {} holds {}, not a positive number", src, key, x.dump());
    out.push_back(x.get<float>());
  }
  return out;
}

Status hf_metadata(const hf::ModelConfig& cfg, hf_import::Metadata& md) {
  if (cfg.has("sliding_window")) {
    KILN_ASSIGN_OR_RETURN(const int64_t w, cfg.get_positive("sliding_window"));
    md.set_u32("attention.sliding_window", w);
  }
  KILN_ASSIGN_OR_RETURN(const std::optional<hf::RopeScaling> rs, cfg.rope_scaling());
  if (!rs || rs->type != "longrope") return Status::ok_status();
  const hf::JsonObject obj(rs->raw, cfg.source() + " rope scaling");
  KILN_ASSIGN_OR_RETURN(const int64_t n_ctx, cfg.max_position_embeddings());
  int64_t orig = 0;
  if (obj.has("original_max_position_embeddings")) {
    KILN_ASSIGN_OR_RETURN(orig, obj.get_positive("original_max_position_embeddings"));
  } else {
    KILN_ASSIGN_OR_RETURN(orig, cfg.get_positive("original_max_position_embeddings"));
  }
  const double factor = rs->factor.value_or(static_cast<double>(n_ctx) / static_cast<double>(orig));
  double attn = factor <= 1.0 ? 1.0 : std::sqrt(1.0 + std::log(factor) / std::log(static_cast<double>(orig)));
  KILN_ASSIGN_OR_RETURN(attn, obj.get_float_or("attention_factor", attn));
  KILN_ASSIGN_OR_RETURN(const int64_t head_dim, cfg.head_dim());
  KILN_ASSIGN_OR_RETURN(std::vector<float> shorts,
                        factors(rs->raw, "short_factor", head_dim / 2, cfg.source()));
  KILN_ASSIGN_OR_RETURN(std::vector<float> longs,
                        factors(rs->raw, "long_factor", head_dim / 2, cfg.source()));
  md.set_u32("rope.scaling.original_context_length", orig);
  md.set_f32("rope.scaling.attn_factor", attn);
  md.add_tensor("rope_factors_short.weight", std::move(shorts));
  md.add_tensor("rope_factors_long.weight", std::move(longs));
  return Status::ok_status();
}

constexpr std::string_view kHfClasses[] = {"Phi3ForCausalLM"};

}  // namespace

extern const Architecture kPhi3 = {make, {.hf_classes = kHfClasses, .metadata = hf_metadata}};

}  // namespace kiln
