// Hyper-parameters: "{arch}.*" keys read with range checks (errors name the key and the value), the attention
// shape every decoder shares, and the RoPE configuration with its frequency-factor tensor.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "formats/gguf.h"
#include "models/model.h"
#include "models/weights.h"
#include "ops/ops.h"

namespace kiln::blocks {

// "{arch}.{key}" as a positive int32 (at most 2^30) / a finite float, with a default or required.
Result<int32_t> hparam_int(const gguf::File& file, const std::string& key, std::optional<int32_t> fallback);
Result<float> hparam_float(const gguf::File& file, const std::string& key, std::optional<float> fallback);

struct AttentionShape {
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  float scale = 0.0f;      // on q.k, usually 1/sqrt(head_dim)
  float softcap = 0.0f;    // 0: none
  int32_t window = 0;      // 0: full attention
  float norm_eps = 1e-6f;  // of q_norm / k_norm
};

// Per-architecture defaults for read_hparams().
struct HparamDefaults {
  int32_t n_ctx_train = 4096;
  float norm_eps = 1e-5f;
  int32_t head_dim = 0;  // 0: embedding_length / head_count
  int32_t window = 0;    // 0: full attention
};

// What every decoder reads from "{arch}.*": general.name, embedding_length, block_count, context_length,
// attention.head_count(_kv) (GQA must divide), attention.key_length (= value_length),
// attention.layer_norm_rms_epsilon (also the QK-norm epsilon), attention.scale (default 1/sqrt(head_dim)),
// attention.sliding_window. Fills info's name, architecture, sizes, head_dim and n_kv_heads, and `shape`.
Status read_hparams(const gguf::File& file, const std::string& arch, const HparamDefaults& defaults,
                    ModelInfo& info, AttentionShape& shape);

// RoPE as a layer applies it: the parameters and the per-pair frequency factors (f32 [n_rot/2]) or none.
struct RopeConfig {
  ops::RopeParams params;
  ops::Weight freq_factors;
};

// Reads the RoPE parameters of an architecture: {arch}.rope.dimension_count, freq_base, scaling.type/factor/
// original_context_length, yarn betas; rope_freqs.weight when present (Llama-3.1 frequency factors); Phi-3's
// longrope: rope_factors_long.weight when n_ctx > {arch}.rope.scaling.original_context_length, else
// rope_factors_short.weight, with {arch}.rope.scaling.attn_factor.
Result<RopeConfig> read_rope(const gguf::File& file, WeightLoader& weights, const std::string& arch,
                             int32_t head_dim, ops::RopeLayout layout, int32_t n_ctx = 0);

}  // namespace kiln::blocks
