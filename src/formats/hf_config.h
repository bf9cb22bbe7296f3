// Hugging Face model folders: config.json, tokenizer_config.json, generation_config.json.
// Each struct keeps the raw JSON (for architecture-specific keys) plus typed accessors. A present key
// of the wrong type or out of range is an error naming the file, the key and the value; an absent
// key is not_found for required values, or the documented default. JSON null counts as absent
// (transformers writes "pad_token_id": null). Every file read is size-capped (json_file.h).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace kiln::hf {

// Typed reads of one JSON object's keys; `source` (a file name) starts every error.
class JsonObject {
 public:
  JsonObject() = default;
  JsonObject(nlohmann::json raw, std::string source) : raw_(std::move(raw)), source_(std::move(source)) {}

  const nlohmann::json& raw() const { return raw_; }
  const std::string& source() const { return source_; }
  // The key's value, or null when absent or JSON null.
  const nlohmann::json* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  Result<std::string> get_string(std::string_view key) const;
  Result<int64_t> get_int(std::string_view key) const;       // an integer (1.0 is not one)
  Result<int64_t> get_positive(std::string_view key) const;  // an integer in [1, 2^31)
  Result<double> get_float(std::string_view key) const;      // any finite number
  Result<bool> get_bool(std::string_view key) const;
  Result<std::string> get_string_or(std::string_view key, std::string fallback) const;
  Result<int64_t> get_positive_or(std::string_view key, int64_t fallback) const;
  Result<double> get_float_or(std::string_view key, double fallback) const;
  Result<bool> get_bool_or(std::string_view key, bool fallback) const;
  // An integer or a list of integers (eos_token_id); empty when absent.
  Result<std::vector<int64_t>> get_int_list(std::string_view key) const;

 private:
  nlohmann::json raw_;  // an object
  std::string source_;
};

// RoPE scaling ("rope_scaling", or transformers 5's "rope_parameters" when its type is not "default").
struct RopeScaling {
  std::string type;              // "linear", "dynamic", "yarn", "llama3", "longrope", ...
  std::optional<double> factor;  // scaling factor when given
  nlohmann::json raw;            // the whole object, for type-specific keys
};

// config.json.
class ModelConfig : public JsonObject {
 public:
  using JsonObject::JsonObject;
  static Result<ModelConfig> load(const std::string& path);
  // From parsed JSON (must be an object); `source` names it in errors.
  static Result<ModelConfig> from_json(nlohmann::json raw, std::string source);

  // architectures[0] ("LlamaForCausalLM"); not_found when absent (transformers omits it for bare configs).
  Result<std::string> architecture() const;
  Result<std::string> model_type() const;
  // Sizes: positive integers, not_found when absent.
  Result<int64_t> hidden_size() const;
  Result<int64_t> num_hidden_layers() const;
  Result<int64_t> num_attention_heads() const;
  Result<int64_t> intermediate_size() const;
  Result<int64_t> vocab_size() const;
  Result<int64_t> max_position_embeddings() const;
  // Default num_attention_heads; must divide it.
  Result<int64_t> num_key_value_heads() const;
  // Default hidden_size / num_attention_heads (which must divide).
  Result<int64_t> head_dim() const;
  // Positive and finite; not_found when absent.
  Result<double> rms_norm_eps() const;
  // "rope_theta", else rope_parameters.rope_theta, else 10000.
  Result<double> rope_theta() const;
  // nullopt when absent, null, or of type "default".
  Result<std::optional<RopeScaling>> rope_scaling() const;
  // Default false.
  Result<bool> tie_word_embeddings() const;
  // "dtype" (transformers 5) or "torch_dtype": "bfloat16", "float16", "float32"; nullopt when absent.
  Result<std::optional<std::string>> torch_dtype() const;
  // "text_config" of multimodal configs (gemma3, llava...), or nullopt when there is none.
  Result<std::optional<ModelConfig>> text_config() const;
};

struct ChatTemplate {
  std::string name;    // "default", "tool_use", "rag", ...
  std::string source;  // Jinja2 text
};

// tokenizer_config.json (+ chat_template.jinja, which transformers 5 writes beside it).
class TokenizerConfig : public JsonObject {
 public:
  using JsonObject::JsonObject;
  static Result<TokenizerConfig> load(const std::string& path);
  static Result<TokenizerConfig> from_json(nlohmann::json raw, std::string source);

  // "chat_template": a string (named "default") or a list of {"name", "template"}; empty when absent.
  const std::vector<ChatTemplate>& chat_templates() const { return chat_templates_; }
  // The template called `name`, or null.
  const ChatTemplate* chat_template(std::string_view name = "default") const;
  // Replaces or adds one template (the folder loader reads chat_template.jinja with it).
  void set_chat_template(std::string name, std::string source);

  // Special tokens: a string or an AddedToken object {"content": ...}; nullopt when absent or null.
  const std::optional<std::string>& bos_token() const { return bos_token_; }
  const std::optional<std::string>& eos_token() const { return eos_token_; }
  const std::optional<std::string>& unk_token() const { return unk_token_; }
  const std::optional<std::string>& pad_token() const { return pad_token_; }
  // nullopt when absent (the tokenizer's own default applies).
  const std::optional<bool>& add_bos_token() const { return add_bos_token_; }
  const std::optional<bool>& add_eos_token() const { return add_eos_token_; }
  // nullopt when absent or not a sane integer (transformers writes 1e30 for "no limit").
  const std::optional<int64_t>& model_max_length() const { return model_max_length_; }

 private:
  std::vector<ChatTemplate> chat_templates_;
  std::optional<std::string> bos_token_, eos_token_, unk_token_, pad_token_;
  std::optional<bool> add_bos_token_, add_eos_token_;
  std::optional<int64_t> model_max_length_;
};

// generation_config.json.
class GenerationConfig : public JsonObject {
 public:
  using JsonObject::JsonObject;
  static Result<GenerationConfig> load(const std::string& path);
  static Result<GenerationConfig> from_json(nlohmann::json raw, std::string source);

  std::vector<int64_t> eos_token_ids;   // "eos_token_id": one id or a list; empty when absent
  std::optional<int64_t> bos_token_id;  // token id
  std::optional<int64_t> pad_token_id;  // token id
  std::optional<bool> do_sample;
  std::optional<double> temperature;  // >= 0
  std::optional<double> top_p;        // in (0, 1]
  std::optional<int64_t> top_k;       // >= 0
  std::optional<int64_t> max_new_tokens;
};

// A model folder's configuration files. Weights are opened separately (safetensors::Model::open_dir).
struct ModelFolder {
  std::string dir;
  ModelConfig config;                                 // config.json (required)
  std::optional<TokenizerConfig> tokenizer_config;    // tokenizer_config.json (+ chat_template.jinja)
  std::optional<GenerationConfig> generation_config;  // generation_config.json
  std::optional<std::string> tokenizer_json_path;     // tokenizer.json when present (not parsed here)

  // Errors: not_found when `dir` or its config.json is missing; any error of the files it reads.
  static Result<ModelFolder> open(const std::string& dir);
};

}  // namespace kiln::hf
