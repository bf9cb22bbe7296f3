// Test driver for tests/python/test_safetensors.py: exposes the safetensors reader and the Hugging
// Face config loader to the `safetensors` and `transformers` Python packages.
//
//   safetensors_driver file PATH     one .safetensors file  -> JSON {"tensors": [...], "metadata": {...}}
//   safetensors_driver dir DIR       a model folder's weights (single or sharded) -> {"tensors": [...]}
//   safetensors_driver config DIR    a model folder's config files -> JSON of the typed values
// Each tensor: {"name", "dtype" (file name, "BF16"), "kiln_dtype" (or null), "shape", "hex" (its bytes)}.
// Errors: the message on stderr, exit status 1.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/dtype.h"
#include "formats/hf_config.h"
#include "formats/safetensors.h"

namespace {

using nlohmann::json;
namespace st = kiln::safetensors;

json tensor_json(const st::Tensor& t) {
  static const char* kDigits = "0123456789abcdef";
  std::string hex;
  hex.reserve(t.data.size() * 2);
  for (const uint8_t b : t.data) {
    hex.push_back(kDigits[b >> 4]);
    hex.push_back(kDigits[b & 15]);
  }
  const auto kiln_dtype = t.kiln_dtype();
  return {{"name", t.name},
          {"dtype", st::dtype_name(t.dtype)},
          {"kiln_dtype", kiln_dtype ? json(kiln::dtype_name(*kiln_dtype)) : json(nullptr)},
          {"shape", t.shape},
          {"hex", hex}};
}

int fail(const kiln::Status& s) {
  std::fprintf(stderr, "%s\n", s.to_string().c_str());
  return 1;
}

// Each typed accessor's value, or {"error": message} where it fails.
template <class T>
json value_or_error(const kiln::Result<T>& r) {
  if (!r.ok()) return json{{"error", r.status().message()}};
  return json(*r);
}

json config_json(const kiln::hf::ModelFolder& f) {
  const kiln::hf::ModelConfig& c = f.config;
  json out = {{"model_type", value_or_error(c.model_type())},
              {"architecture", value_or_error(c.architecture())},
              {"hidden_size", value_or_error(c.hidden_size())},
              {"num_hidden_layers", value_or_error(c.num_hidden_layers())},
              {"num_attention_heads", value_or_error(c.num_attention_heads())},
              {"num_key_value_heads", value_or_error(c.num_key_value_heads())},
              {"head_dim", value_or_error(c.head_dim())},
              {"intermediate_size", value_or_error(c.intermediate_size())},
              {"vocab_size", value_or_error(c.vocab_size())},
              {"max_position_embeddings", value_or_error(c.max_position_embeddings())},
              {"rms_norm_eps", value_or_error(c.rms_norm_eps())},
              {"rope_theta", value_or_error(c.rope_theta())},
              {"tie_word_embeddings", value_or_error(c.tie_word_embeddings())}};
  const auto rs = c.rope_scaling();
  if (!rs.ok()) {
    out["rope_scaling"] = {{"error", rs.status().message()}};
  } else if (rs->has_value()) {
    out["rope_scaling"] = {{"type", (*rs)->type},
                           {"factor", (*rs)->factor ? json(*(*rs)->factor) : json(nullptr)}};
  }
  if (f.tokenizer_config) {
    const auto& t = *f.tokenizer_config;
    json templates = json::object();
    for (const auto& ct : t.chat_templates()) templates[ct.name] = ct.source;
    out["tokenizer"] = {{"chat_templates", templates},
                        {"bos_token", t.bos_token() ? json(*t.bos_token()) : json(nullptr)},
                        {"eos_token", t.eos_token() ? json(*t.eos_token()) : json(nullptr)},
                        {"add_bos_token", t.add_bos_token() ? json(*t.add_bos_token()) : json(nullptr)}};
  }
  if (f.generation_config) {
    const auto& g = *f.generation_config;
    out["generation"] = {{"eos_token_ids", g.eos_token_ids},
                         {"bos_token_id", g.bos_token_id ? json(*g.bos_token_id) : json(nullptr)},
                         {"temperature", g.temperature ? json(*g.temperature) : json(nullptr)},
                         {"do_sample", g.do_sample ? json(*g.do_sample) : json(nullptr)}};
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: safetensors_driver file PATH | dir DIR | config DIR\n");
    return 2;
  }
  const std::string mode = argv[1];
  const std::string path = argv[2];
  json out;
  if (mode == "file") {
    auto f = st::File::open(path);
    if (!f.ok()) return fail(f.status());
    out["tensors"] = json::array();
    for (const st::Tensor& t : f->tensors()) out["tensors"].push_back(tensor_json(t));
    out["metadata"] = f->metadata();
  } else if (mode == "dir") {
    auto m = st::Model::open_dir(path);
    if (!m.ok()) return fail(m.status());
    out["tensors"] = json::array();
    for (const st::Tensor* t : m->tensors()) out["tensors"].push_back(tensor_json(*t));
    out["n_shards"] = m->shards().size();
  } else if (mode == "config") {
    auto f = kiln::hf::ModelFolder::open(path);
    if (!f.ok()) return fail(f.status());
    out = config_json(*f);
  } else {
    std::fprintf(stderr, "unknown mode: %s\n", mode.c_str());
    return 2;
  }
  std::cout << out.dump() << "\n";
  return 0;
}
