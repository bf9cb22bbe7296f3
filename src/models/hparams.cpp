#include "models/hparams.h"

#include <cmath>

namespace kiln::blocks {

Result<int32_t> hparam_int(const gguf::File& file, const std::string& key, std::optional<int32_t> fallback) {
  if (file.find(key) == nullptr) {
    if (fallback) return *fallback;
    return not_found("{}: {} is missing", file.name(), key);
  }
  KILN_ASSIGN_OR_RETURN(uint64_t v, file.get_uint(key));
  if (v == 0 || v > (1u << 30)) return invalid_argument("{}: {} = {} is out of range", file.name(), key, v);
  return static_cast<int32_t>(v);
}

Result<float> hparam_float(const gguf::File& file, const std::string& key, std::optional<float> fallback) {
  if (file.find(key) == nullptr) {
    if (fallback) return *fallback;
    return not_found("{}: {} is missing", file.name(), key);
  }
  KILN_ASSIGN_OR_RETURN(double v, file.get_float(key));
  if (!std::isfinite(v)) return invalid_argument("{}: {} = {} is not finite", file.name(), key, v);
  return static_cast<float>(v);
}

Status read_hparams(const gguf::File& f, const std::string& a, const HparamDefaults& d, ModelInfo& info,
                    AttentionShape& shape) {
  info.architecture = a;
  KILN_ASSIGN_OR_RETURN(info.name, f.get_string_or("general.name", f.name()));
  KILN_ASSIGN_OR_RETURN(info.n_embd, hparam_int(f, a + ".embedding_length", {}));
  KILN_ASSIGN_OR_RETURN(info.n_layers, hparam_int(f, a + ".block_count", {}));
  // Every layer has tensors of its own: a count beyond the file's tensors is false, and would size per-layer
  // arrays (weights, KV buffers) from a number the file cannot back.
  if (static_cast<size_t>(info.n_layers) > f.tensors().size()) {
    return invalid_argument("{}: {}.block_count = {} but the file holds only {} tensors", f.name(), a,
                            info.n_layers, f.tensors().size());
  }
  KILN_ASSIGN_OR_RETURN(info.n_ctx_train, hparam_int(f, a + ".context_length", d.n_ctx_train));
  KILN_ASSIGN_OR_RETURN(shape.n_heads, hparam_int(f, a + ".attention.head_count", {}));
  KILN_ASSIGN_OR_RETURN(shape.n_kv_heads, hparam_int(f, a + ".attention.head_count_kv", shape.n_heads));
  KILN_ASSIGN_OR_RETURN(shape.norm_eps, hparam_float(f, a + ".attention.layer_norm_rms_epsilon", d.norm_eps));
  if (shape.n_heads % shape.n_kv_heads != 0) {
    return invalid_argument("{}: head_count {} is not a multiple of head_count_kv {}", f.name(),
                            shape.n_heads, shape.n_kv_heads);
  }
  std::optional<int32_t> hd = d.head_dim > 0 ? std::optional(d.head_dim) : std::nullopt;
  if (!hd && info.n_embd % shape.n_heads == 0) hd = info.n_embd / shape.n_heads;
  KILN_ASSIGN_OR_RETURN(shape.head_dim, hparam_int(f, a + ".attention.key_length", hd));
  KILN_ASSIGN_OR_RETURN(const int32_t v_dim, hparam_int(f, a + ".attention.value_length", shape.head_dim));
  if (v_dim != shape.head_dim) {
    return unimplemented("{}: value_length {} differs from key_length {}", f.name(), v_dim, shape.head_dim);
  }
  KILN_ASSIGN_OR_RETURN(shape.scale, hparam_float(f, a + ".attention.scale",
                                                  1.0f / std::sqrt(static_cast<float>(shape.head_dim))));
  KILN_ASSIGN_OR_RETURN(shape.window, hparam_int(f, a + ".attention.sliding_window", d.window));
  info.head_dim = shape.head_dim;
  info.n_kv_heads = shape.n_kv_heads;
  return Status::ok_status();
}

Result<RopeConfig> read_rope(const gguf::File& file, WeightLoader& weights, const std::string& arch,
                             int32_t head_dim, ops::RopeLayout layout, int32_t n_ctx) {
  RopeConfig config;
  ops::RopeParams& p = config.params;
  p.layout = layout;
  KILN_ASSIGN_OR_RETURN(p.n_rot, hparam_int(file, arch + ".rope.dimension_count", head_dim));
  if (p.n_rot > head_dim || p.n_rot % 2 != 0) {
    return invalid_argument("{}: {}.rope.dimension_count = {} must be even and at most the head size {}",
                            file.name(), arch, p.n_rot, head_dim);
  }
  KILN_ASSIGN_OR_RETURN(p.freq_base, hparam_float(file, arch + ".rope.freq_base", 10000.0f));
  if (!(p.freq_base > 0))
    return invalid_argument("{}: {}.rope.freq_base = {} is not > 0", file.name(), arch, p.freq_base);
  KILN_ASSIGN_OR_RETURN(std::string type, file.get_string_or(arch + ".rope.scaling.type", "none"));
  KILN_ASSIGN_OR_RETURN(p.factor, hparam_float(file, arch + ".rope.scaling.factor", 1.0f));
  if (file.find(arch + ".rope.scale_linear") != nullptr) {  // older files
    KILN_ASSIGN_OR_RETURN(p.factor, hparam_float(file, arch + ".rope.scale_linear", 1.0f));
    type = "linear";
  }
  if (!(p.factor > 0))
    return invalid_argument("{}: {}.rope.scaling.factor = {} is not > 0", file.name(), arch, p.factor);
  if (type == "none" || p.factor == 1.0f) {
    p.scaling = ops::RopeScaling::rope_scaling_none;
  } else if (type == "linear") {
    p.scaling = ops::RopeScaling::rope_scaling_linear;
  } else if (type == "yarn") {
    p.scaling = ops::RopeScaling::rope_scaling_yarn;
    KILN_ASSIGN_OR_RETURN(p.original_context,
                          hparam_int(file, arch + ".rope.scaling.original_context_length", {}));
    KILN_ASSIGN_OR_RETURN(p.beta_fast, hparam_float(file, arch + ".rope.scaling.yarn_beta_fast", 32.0f));
    KILN_ASSIGN_OR_RETURN(p.beta_slow, hparam_float(file, arch + ".rope.scaling.yarn_beta_slow", 1.0f));
    KILN_ASSIGN_OR_RETURN(p.attn_factor, hparam_float(file, arch + ".rope.scaling.attn_factor", 1.0f));
  } else {
    return unimplemented("{}: {}.rope.scaling.type = \"{}\" is not supported (none, linear, yarn)",
                         file.name(), arch, type);
  }
  std::string factors_name = "rope_freqs.weight";
  if (file.find_tensor("rope_factors_short.weight") != nullptr) {  // longrope
    KILN_ASSIGN_OR_RETURN(const int32_t orig,
                          hparam_int(file, arch + ".rope.scaling.original_context_length", {}));
    KILN_ASSIGN_OR_RETURN(p.attn_factor, hparam_float(file, arch + ".rope.scaling.attn_factor", 1.0f));
    factors_name = n_ctx > orig ? "rope_factors_long.weight" : "rope_factors_short.weight";
  }
  if (const gguf::TensorInfo* t = file.find_tensor(factors_name); t != nullptr && t->type != DType::f32) {
    return invalid_argument("{}: {} must be f32", file.name(), factors_name);
  }
  KILN_ASSIGN_OR_RETURN(
      config.freq_factors,
      weights.get_optional(factors_name, WeightRole::weight_role_rope_factors, p.n_rot / 2));
  return config;
}

}  // namespace kiln::blocks
