// Hugging Face folders as GGUF: config.json and the safetensors weights of a folder become a gguf::File in
// memory with the standard GGUF tensor names and "{arch}.*" metadata, so one model file per architecture
// serves both formats, and `kiln convert` writes exactly what kiln runs.
//
// What is shared lives here: the common hyper-parameters, the common tensor names, expert stacking, 1-d
// tensors widened to f32. Each architecture file declares the rest in an HfSpec (its config.json class names,
// its extra metadata, its renames and per-tensor changes) and registers it beside its factory (registry.cpp).
//
// Weights that need no change are used in place from the safetensors memory maps; changed ones (permuted Q/K
// rows, Gemma norms, stacked experts, widened 1-d tensors) are converted once into buffers the File owns.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "formats/gguf.h"
#include "formats/hf_config.h"

namespace kiln::hf_import {

// The metadata being written for one model ("{arch}.{key}" setters), and any small f32 tensors an
// architecture derives from config.json (RoPE frequency factors).
class Metadata {
 public:
  explicit Metadata(std::string arch) : arch_(std::move(arch)) {}
  const std::string& arch() const { return arch_; }
  // Sets "{arch}.{key}" (replacing an earlier value).
  void set_u32(std::string_view key, int64_t v) { set(key, gguf::Value::u32(static_cast<uint32_t>(v))); }
  void set_f32(std::string_view key, double v) { set(key, gguf::Value::f32(static_cast<float>(v))); }
  void set_bool(std::string_view key, bool v) { set(key, gguf::Value::boolean(v)); }
  void set_str(std::string_view key, std::string v) { set(key, gguf::Value::str(std::move(v))); }
  void set(std::string_view key, gguf::Value v);
  // Sets a full key (no "{arch}." prefix).
  void set_raw(std::string key, gguf::Value v);
  // Adds a 1-d f32 tensor (GGUF name) computed from the config.
  void add_tensor(std::string name, std::vector<float> values) {
    tensors_.emplace_back(std::move(name), std::move(values));
  }
  std::vector<std::pair<std::string, gguf::Value>>& entries() { return entries_; }
  std::vector<std::pair<std::string, std::vector<float>>>& tensors() { return tensors_; }

 private:
  std::string arch_;
  std::vector<std::pair<std::string, gguf::Value>> entries_;
  std::vector<std::pair<std::string, std::vector<float>>> tensors_;
};

// A change applied to one tensor's values as it is imported (the tensor becomes f32).
struct TensorEdit {
  std::string_view suffix;                 // GGUF name suffix it applies to ("norm.weight")
  void (*apply)(std::span<float> values);  // edits the values in place, in GGUF order
};

// One HF module-name suffix (after "model.layers.N.") renamed to a GGUF one (after "blk.N.").
struct Rename {
  std::string_view hf;    // "post_attention_layernorm.weight"
  std::string_view gguf;  // "post_attention_norm.weight"
};

// What an architecture file declares to load from a Hugging Face folder.
struct HfSpec {
  std::span<const std::string_view> hf_classes;  // config.json "architectures" entries ("Qwen2ForCausalLM")
  // Writes the architecture's metadata beyond the common keys (import() writes context_length,
  // embedding_length, block_count, feed_forward_length, attention.head_count(_kv), key/value_length,
  // layer_norm_rms_epsilon, rope.freq_base, rope.dimension_count and rope scaling linear/yarn/llama3).
  Status (*metadata)(const hf::ModelConfig& cfg, Metadata& md) = nullptr;
  std::span<const Rename> renames = {};    // consulted before the common names
  std::span<const TensorEdit> edits = {};  // f32 edits of matching tensors (Gemma's 1 + w norms)
  bool permute_qk = false;  // Q/K rows from HF's half-split RoPE order to GGUF's interleaved pairs
};

struct Options {
  // true: every tensor becomes f32 (what the BF16 checks compare against); false: kept as stored (F32, F16,
  // BF16), 1-d tensors always f32.
  bool force_f32 = false;
  // true: each FP8 weight's static activation scale is the tensor "<its GGUF name less .weight>.input_scale"
  // (F32 [1]), which blocks::WeightLoader gives to the weight, the largest of Q's, K's and V's for each of
  // them and of gate's and up's for both (one x each); false: they are left out (a GGUF written from the
  // import has no such tensors).
  bool activation_scales = false;
};

// Loads the folder `dir` as a GGUF file in memory. `spec_for` finds the HfSpec (and GGUF architecture name)
// of a config.json class, or returns unimplemented listing the supported ones.
// Errors: the folder's own errors (config.json, safetensors), an unsupported class, a tensor that no name
// maps (named), a missing or misshapen tensor, experts of a layer that do not agree.
using SpecLookup = std::function<Result<std::pair<std::string, const HfSpec*>>(const std::string& hf_class)>;
Result<std::shared_ptr<const gguf::File>> import(const std::string& dir, const SpecLookup& spec_for,
                                                 const Options& options = {});

// The text-model config of a folder's config.json (text_config for multimodal wrappers such as Gemma 3).
Result<hf::ModelConfig> text_config(const hf::ModelConfig& cfg);

// The GGUF weight a decoder layer's projection becomes, as import() names it without an architecture's own
// renames ("model.layers.3.self_attn.q_proj.weight" -> "blk.3.attn_q.weight"; an expert's projection ->
// its stacked tensor, with the expert's index in `expert`, else -1 there); "" for any other tensor.
std::string projection_gguf_name(std::string_view hf_name, int64_t* expert);

}  // namespace kiln::hf_import
