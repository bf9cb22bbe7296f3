#include "formats/hf_config.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <utility>

#include "formats/folder.h"
#include "formats/json_file.h"

namespace kiln::hf {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr int64_t kMaxSize = (int64_t{1} << 31) - 1;  // the largest size a config may declare

Status wrong_type(const std::string& source, std::string_view key, const char* expected, const json& v) {
  return invalid_argument("{}: \"{}\" must be {}, got {} ({})", source, key, expected, json_file::preview(v),
                          json_file::type_name(v));
}

Result<json> require_object(json raw, const std::string& source) {
  if (!raw.is_object()) {
    return invalid_argument("{}: must be a JSON object, got {} ({})", source, json_file::preview(raw),
                            json_file::type_name(raw));
  }
  return raw;
}

// A special token: a string, or an AddedToken object {"content": "<s>", ...}; null -> nullopt.
Result<std::optional<std::string>> token_text(const JsonObject& obj, std::string_view key) {
  const json* v = obj.find(key);
  if (v == nullptr) return std::optional<std::string>();
  if (v->is_string()) return std::optional<std::string>(v->get<std::string>());
  if (v->is_object()) {
    const auto content = v->find("content");
    if (content != v->end() && content->is_string())
      return std::optional<std::string>(content->get<std::string>());
    return invalid_argument("{}: \"{}\" is an object without a string \"content\": {}", obj.source(), key,
                            json_file::preview(*v));
  }
  return wrong_type(obj.source(), key, "a string or an AddedToken object", *v);
}

Result<std::optional<bool>> optional_bool(const JsonObject& obj, std::string_view key) {
  if (!obj.has(key)) return std::optional<bool>();
  KILN_ASSIGN_OR_RETURN(const bool b, obj.get_bool(key));
  return std::optional<bool>(b);
}

Result<std::optional<int64_t>> optional_int_at_least(const JsonObject& obj, std::string_view key,
                                                     int64_t lo) {
  if (!obj.has(key)) return std::optional<int64_t>();
  KILN_ASSIGN_OR_RETURN(const int64_t v, obj.get_int(key));
  if (v < lo) return invalid_argument("{}: \"{}\" must be >= {}, got {}", obj.source(), key, lo, v);
  return std::optional<int64_t>(v);
}

Result<std::optional<double>> optional_float_in(const JsonObject& obj, std::string_view key, double lo,
                                                double hi) {
  if (!obj.has(key)) return std::optional<double>();
  KILN_ASSIGN_OR_RETURN(const double v, obj.get_float(key));
  if (v < lo || v > hi)
    return invalid_argument("{}: \"{}\" must be in [{}, {}], got {}", obj.source(), key, lo, hi, v);
  return std::optional<double>(v);
}

Result<std::vector<ChatTemplate>> parse_chat_templates(const JsonObject& obj) {
  std::vector<ChatTemplate> out;
  const json* v = obj.find("chat_template");
  if (v == nullptr) return out;
  if (v->is_string()) {
    out.push_back({"default", v->get<std::string>()});
    return out;
  }
  if (!v->is_array())
    return wrong_type(obj.source(), "chat_template", "a string or a list of {name, template}", *v);
  for (size_t i = 0; i < v->size(); ++i) {
    const json& item = (*v)[i];
    const auto name = item.is_object() ? item.find("name") : item.end();
    const auto text = item.is_object() ? item.find("template") : item.end();
    if (!item.is_object() || name == item.end() || text == item.end() || !name->is_string() ||
        !text->is_string()) {
      return invalid_argument(
          "{}: chat_template[{}] must be an object with string \"name\" and \"template\", got {}",
          obj.source(), i, json_file::preview(item));
    }
    for (const ChatTemplate& t : out) {
      if (t.name == name->get<std::string>()) {
        return invalid_argument("{}: chat_template[{}]: duplicate template name \"{}\"", obj.source(), i,
                                t.name);
      }
    }
    out.push_back({name->get<std::string>(), text->get<std::string>()});
  }
  return out;
}

}  // namespace

// ---- JsonObject

const json* JsonObject::find(std::string_view key) const {
  if (!raw_.is_object()) return nullptr;
  const auto it = raw_.find(std::string(key));
  if (it == raw_.end() || it->is_null()) return nullptr;
  return &*it;
}

Result<std::string> JsonObject::get_string(std::string_view key) const {
  const json* v = find(key);
  if (v == nullptr) return not_found("{}: missing \"{}\"", source_, key);
  if (!v->is_string()) return wrong_type(source_, key, "a string", *v);
  return v->get<std::string>();
}

Result<int64_t> JsonObject::get_int(std::string_view key) const {
  const json* v = find(key);
  if (v == nullptr) return not_found("{}: missing \"{}\"", source_, key);
  if (v->is_number_unsigned()) {
    if (v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return invalid_argument("{}: \"{}\" = {} does not fit in int64", source_, key, v->get<uint64_t>());
    }
    return static_cast<int64_t>(v->get<uint64_t>());
  }
  if (v->is_number_integer()) return v->get<int64_t>();
  return wrong_type(source_, key, "an integer", *v);
}

Result<int64_t> JsonObject::get_positive(std::string_view key) const {
  KILN_ASSIGN_OR_RETURN(const int64_t v, get_int(key));
  if (v < 1 || v > kMaxSize) {
    return invalid_argument("{}: \"{}\" must be a positive integer below 2^31, got {}", source_, key, v);
  }
  return v;
}

Result<double> JsonObject::get_float(std::string_view key) const {
  const json* v = find(key);
  if (v == nullptr) return not_found("{}: missing \"{}\"", source_, key);
  if (!v->is_number()) return wrong_type(source_, key, "a number", *v);
  const double d = v->get<double>();
  if (!std::isfinite(d)) return invalid_argument("{}: \"{}\" must be finite, got {}", source_, key, d);
  return d;
}

Result<bool> JsonObject::get_bool(std::string_view key) const {
  const json* v = find(key);
  if (v == nullptr) return not_found("{}: missing \"{}\"", source_, key);
  if (!v->is_boolean()) return wrong_type(source_, key, "true or false", *v);
  return v->get<bool>();
}

Result<std::string> JsonObject::get_string_or(std::string_view key, std::string fallback) const {
  return has(key) ? get_string(key) : Result<std::string>(std::move(fallback));
}
Result<int64_t> JsonObject::get_positive_or(std::string_view key, int64_t fallback) const {
  return has(key) ? get_positive(key) : Result<int64_t>(fallback);
}
Result<double> JsonObject::get_float_or(std::string_view key, double fallback) const {
  return has(key) ? get_float(key) : Result<double>(fallback);
}
Result<bool> JsonObject::get_bool_or(std::string_view key, bool fallback) const {
  return has(key) ? get_bool(key) : Result<bool>(fallback);
}

Result<std::vector<int64_t>> JsonObject::get_int_list(std::string_view key) const {
  std::vector<int64_t> out;
  const json* v = find(key);
  if (v == nullptr) return out;
  if (!v->is_array()) {
    KILN_ASSIGN_OR_RETURN(const int64_t one, get_int(key));
    out.push_back(one);
    return out;
  }
  for (size_t i = 0; i < v->size(); ++i) {
    const json& item = (*v)[i];
    if (!item.is_number_integer() ||
        (item.is_number_unsigned() && item.get<uint64_t>() > (uint64_t{1} << 62))) {
      return invalid_argument("{}: \"{}\"[{}] must be an integer, got {}", source_, key, i,
                              json_file::preview(item));
    }
    out.push_back(item.get<int64_t>());
  }
  return out;
}

// ---- ModelConfig

Result<ModelConfig> ModelConfig::from_json(json raw, std::string source) {
  KILN_ASSIGN_OR_RETURN(json obj, require_object(std::move(raw), source));
  return ModelConfig(std::move(obj), std::move(source));
}

Result<ModelConfig> ModelConfig::load(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(json raw, json_file::read(path, json_file::kMaxConfigBytes));
  return from_json(std::move(raw), path);
}

Result<std::string> ModelConfig::architecture() const {
  const json* v = find("architectures");
  if (v == nullptr) return not_found("{}: missing \"architectures\"", source());
  if (!v->is_array() || v->empty() || !(*v)[0].is_string()) {
    return wrong_type(source(), "architectures", "a non-empty list of strings", *v);
  }
  return (*v)[0].get<std::string>();
}

Result<std::string> ModelConfig::model_type() const { return get_string("model_type"); }
Result<int64_t> ModelConfig::hidden_size() const { return get_positive("hidden_size"); }
Result<int64_t> ModelConfig::num_hidden_layers() const { return get_positive("num_hidden_layers"); }
Result<int64_t> ModelConfig::num_attention_heads() const { return get_positive("num_attention_heads"); }
Result<int64_t> ModelConfig::intermediate_size() const { return get_positive("intermediate_size"); }
Result<int64_t> ModelConfig::vocab_size() const { return get_positive("vocab_size"); }
Result<int64_t> ModelConfig::max_position_embeddings() const {
  return get_positive("max_position_embeddings");
}

Result<int64_t> ModelConfig::num_key_value_heads() const {
  KILN_ASSIGN_OR_RETURN(const int64_t heads, num_attention_heads());
  KILN_ASSIGN_OR_RETURN(const int64_t kv, get_positive_or("num_key_value_heads", heads));
  if (heads % kv != 0) {
    return invalid_argument("{}: \"num_key_value_heads\" = {} does not divide \"num_attention_heads\" = {}",
                            source(), kv, heads);
  }
  return kv;
}

Result<int64_t> ModelConfig::head_dim() const {
  if (has("head_dim")) return get_positive("head_dim");
  KILN_ASSIGN_OR_RETURN(const int64_t hidden, hidden_size());
  KILN_ASSIGN_OR_RETURN(const int64_t heads, num_attention_heads());
  if (hidden % heads != 0) {
    return invalid_argument(
        "{}: no \"head_dim\" and \"hidden_size\" = {} is not a multiple of "
        "\"num_attention_heads\" = {}",
        source(), hidden, heads);
  }
  return hidden / heads;
}

Result<double> ModelConfig::rms_norm_eps() const {
  KILN_ASSIGN_OR_RETURN(const double eps, get_float("rms_norm_eps"));
  if (!(eps > 0)) return invalid_argument("{}: \"rms_norm_eps\" must be positive, got {}", source(), eps);
  return eps;
}

Result<double> ModelConfig::rope_theta() const {
  double theta = 10000.0;
  if (has("rope_theta")) {
    KILN_ASSIGN_OR_RETURN(theta, get_float("rope_theta"));
  } else if (const json* params = find("rope_parameters"); params != nullptr) {
    if (!params->is_object()) return wrong_type(source(), "rope_parameters", "an object", *params);
    KILN_ASSIGN_OR_RETURN(
        theta, JsonObject(*params, source() + " rope_parameters").get_float_or("rope_theta", theta));
  }
  if (!(theta > 0)) return invalid_argument("{}: \"rope_theta\" must be positive, got {}", source(), theta);
  return theta;
}

Result<std::optional<RopeScaling>> ModelConfig::rope_scaling() const {
  const char* key = has("rope_scaling") ? "rope_scaling" : "rope_parameters";
  const json* v = find(key);
  if (v == nullptr) return std::optional<RopeScaling>();
  if (!v->is_object()) return wrong_type(source(), key, "an object", *v);
  const JsonObject obj(*v, fmt::format("{} \"{}\"", source(), key));
  RopeScaling rs;
  // "rope_type" (newer) or "type" (older configs).
  KILN_ASSIGN_OR_RETURN(rs.type,
                        obj.has("rope_type") ? obj.get_string("rope_type") : obj.get_string_or("type", ""));
  if (rs.type.empty()) return invalid_argument("{}: \"{}\" has no \"rope_type\" or \"type\"", source(), key);
  if (rs.type == "default") return std::optional<RopeScaling>();
  if (obj.has("factor")) {
    KILN_ASSIGN_OR_RETURN(const double factor, obj.get_float("factor"));
    if (!(factor > 0))
      return invalid_argument("{}: \"{}\".factor must be positive, got {}", source(), key, factor);
    rs.factor = factor;
  }
  rs.raw = *v;
  return std::optional<RopeScaling>(std::move(rs));
}

Result<bool> ModelConfig::tie_word_embeddings() const { return get_bool_or("tie_word_embeddings", false); }

Result<std::optional<std::string>> ModelConfig::torch_dtype() const {
  const char* key = has("dtype") ? "dtype" : "torch_dtype";
  if (!has(key)) return std::optional<std::string>();
  KILN_ASSIGN_OR_RETURN(std::string s, get_string(key));
  return std::optional<std::string>(std::move(s));
}

Result<std::optional<ModelConfig>> ModelConfig::text_config() const {
  const json* v = find("text_config");
  if (v == nullptr) return std::optional<ModelConfig>();
  KILN_ASSIGN_OR_RETURN(ModelConfig c, from_json(*v, source() + " text_config"));
  return std::optional<ModelConfig>(std::move(c));
}

// ---- TokenizerConfig

Result<TokenizerConfig> TokenizerConfig::from_json(json raw, std::string source) {
  KILN_ASSIGN_OR_RETURN(json obj, require_object(std::move(raw), source));
  TokenizerConfig c(std::move(obj), std::move(source));
  KILN_ASSIGN_OR_RETURN(c.chat_templates_, parse_chat_templates(c));
  KILN_ASSIGN_OR_RETURN(c.bos_token_, token_text(c, "bos_token"));
  KILN_ASSIGN_OR_RETURN(c.eos_token_, token_text(c, "eos_token"));
  KILN_ASSIGN_OR_RETURN(c.unk_token_, token_text(c, "unk_token"));
  KILN_ASSIGN_OR_RETURN(c.pad_token_, token_text(c, "pad_token"));
  KILN_ASSIGN_OR_RETURN(c.add_bos_token_, optional_bool(c, "add_bos_token"));
  KILN_ASSIGN_OR_RETURN(c.add_eos_token_, optional_bool(c, "add_eos_token"));
  if (const json* v = c.find("model_max_length"); v != nullptr) {
    if (!v->is_number()) return wrong_type(c.source(), "model_max_length", "a number", *v);
    // transformers writes 1000000000000000019884624838656 (a float) for "no limit".
    if (v->is_number_integer() && !(v->is_number_unsigned() && v->get<uint64_t>() > (uint64_t{1} << 62))) {
      const int64_t n = v->get<int64_t>();
      if (n < 1) return invalid_argument("{}: \"model_max_length\" must be positive, got {}", c.source(), n);
      c.model_max_length_ = n;
    }
  }
  return c;
}

Result<TokenizerConfig> TokenizerConfig::load(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(json raw, json_file::read(path, json_file::kMaxTokenizerBytes));
  return from_json(std::move(raw), path);
}

const ChatTemplate* TokenizerConfig::chat_template(std::string_view name) const {
  for (const ChatTemplate& t : chat_templates_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

void TokenizerConfig::set_chat_template(std::string name, std::string source) {
  for (ChatTemplate& t : chat_templates_) {
    if (t.name == name) {
      t.source = std::move(source);
      return;
    }
  }
  chat_templates_.push_back({std::move(name), std::move(source)});
}

// ---- GenerationConfig

Result<GenerationConfig> GenerationConfig::from_json(json raw, std::string source) {
  KILN_ASSIGN_OR_RETURN(json obj, require_object(std::move(raw), source));
  GenerationConfig c(std::move(obj), std::move(source));
  KILN_ASSIGN_OR_RETURN(c.eos_token_ids, c.get_int_list("eos_token_id"));
  for (size_t i = 0; i < c.eos_token_ids.size(); ++i) {
    if (c.eos_token_ids[i] < 0) {
      return invalid_argument("{}: \"eos_token_id\" {} is negative", c.source(), c.eos_token_ids[i]);
    }
  }
  KILN_ASSIGN_OR_RETURN(c.bos_token_id, optional_int_at_least(c, "bos_token_id", 0));
  KILN_ASSIGN_OR_RETURN(c.pad_token_id, optional_int_at_least(c, "pad_token_id", 0));
  KILN_ASSIGN_OR_RETURN(c.do_sample, optional_bool(c, "do_sample"));
  KILN_ASSIGN_OR_RETURN(c.temperature, optional_float_in(c, "temperature", 0.0, 1e6));
  KILN_ASSIGN_OR_RETURN(c.top_p, optional_float_in(c, "top_p", 0.0, 1.0));
  KILN_ASSIGN_OR_RETURN(c.top_k, optional_int_at_least(c, "top_k", 0));
  KILN_ASSIGN_OR_RETURN(c.max_new_tokens, optional_int_at_least(c, "max_new_tokens", 1));
  return c;
}

Result<GenerationConfig> GenerationConfig::load(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(json raw, json_file::read(path, json_file::kMaxConfigBytes));
  return from_json(std::move(raw), path);
}

// ---- ModelFolder

Result<ModelFolder> ModelFolder::open(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return not_found("model folder not found: {}", dir);
  const fs::path d(dir);
  for (const char* name : {"config.json", "tokenizer_config.json", "chat_template.jinja",
                           "generation_config.json", "tokenizer.json"}) {
    KILN_TRY(check_in_folder(dir, (d / name).string()));
  }
  KILN_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::load((d / "config.json").string()));
  ModelFolder f{dir, std::move(config), std::nullopt, std::nullopt, std::nullopt};
  if (fs::exists(d / "tokenizer_config.json", ec)) {
    KILN_ASSIGN_OR_RETURN(f.tokenizer_config, TokenizerConfig::load((d / "tokenizer_config.json").string()));
  }
  // transformers 5 saves the chat template beside tokenizer_config.json; it takes precedence.
  if (fs::exists(d / "chat_template.jinja", ec)) {
    KILN_ASSIGN_OR_RETURN(std::string text, json_file::read_text((d / "chat_template.jinja").string(),
                                                                 json_file::kMaxConfigBytes));
    if (!f.tokenizer_config)
      f.tokenizer_config = TokenizerConfig(json::object(), (d / "chat_template.jinja").string());
    f.tokenizer_config->set_chat_template("default", std::move(text));
  }
  if (fs::exists(d / "generation_config.json", ec)) {
    KILN_ASSIGN_OR_RETURN(f.generation_config,
                          GenerationConfig::load((d / "generation_config.json").string()));
  }
  if (fs::exists(d / "tokenizer.json", ec)) f.tokenizer_json_path = (d / "tokenizer.json").string();
  return f;
}

}  // namespace kiln::hf
