// kiln inspect on a Hugging Face model folder: config.json, tokenizer files, safetensors weights.
#include "inspect_hf.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <utility>
#include <vector>

#include "formats/hf_config.h"
#include "formats/safetensors.h"
#include "inspect_util.h"
#include "models/hf_fp8.h"

namespace kiln::cli {
namespace {

template <class T>
std::string or_dash(const Result<T>& r) {
  if (!r.ok()) return "-";
  return fmt::format("{}", *r);
}

void print_config(const hf::ModelConfig& c) {
  std::printf("architecture:   %s (model_type %s)\n", or_dash(c.architecture()).c_str(),
              or_dash(c.model_type()).c_str());
  std::printf("\nhyper-parameters:\n");
  std::printf("  %-28s %s\n", "hidden_size", or_dash(c.hidden_size()).c_str());
  std::printf("  %-28s %s\n", "num_hidden_layers", or_dash(c.num_hidden_layers()).c_str());
  std::printf("  %-28s %s\n", "num_attention_heads", or_dash(c.num_attention_heads()).c_str());
  std::printf("  %-28s %s\n", "num_key_value_heads", or_dash(c.num_key_value_heads()).c_str());
  std::printf("  %-28s %s\n", "head_dim", or_dash(c.head_dim()).c_str());
  std::printf("  %-28s %s\n", "intermediate_size", or_dash(c.intermediate_size()).c_str());
  std::printf("  %-28s %s\n", "vocab_size", or_dash(c.vocab_size()).c_str());
  std::printf("  %-28s %s\n", "max_position_embeddings", or_dash(c.max_position_embeddings()).c_str());
  std::printf("  %-28s %s\n", "rms_norm_eps", or_dash(c.rms_norm_eps()).c_str());
  std::printf("  %-28s %s\n", "rope_theta", or_dash(c.rope_theta()).c_str());
  if (auto rs = c.rope_scaling(); rs.ok() && rs->has_value()) {
    std::printf("  %-28s %s\n", "rope_scaling", (*rs)->raw.dump().c_str());
  }
  std::printf("  %-28s %s\n", "tie_word_embeddings", or_dash(c.tie_word_embeddings()).c_str());
  if (auto dt = c.torch_dtype(); dt.ok() && dt->has_value())
    std::printf("  %-28s %s\n", "dtype", (*dt)->c_str());
}

void print_tokenizer(const hf::ModelFolder& folder) {
  std::printf("\ntokenizer:      %s\n",
              folder.tokenizer_json_path ? folder.tokenizer_json_path->c_str() : "no tokenizer.json");
  if (!folder.tokenizer_config) return;
  const hf::TokenizerConfig& tc = *folder.tokenizer_config;
  std::printf("                bos %s, eos %s, add_bos %s\n", tc.bos_token().value_or("none").c_str(),
              tc.eos_token().value_or("none").c_str(),
              tc.add_bos_token() ? (*tc.add_bos_token() ? "yes" : "no") : "-");
  if (tc.chat_templates().empty()) {
    std::printf("\nchat template:  none\n");
  }
  for (const hf::ChatTemplate& t : tc.chat_templates()) {
    std::printf("\nchat template '%s' (%zu bytes):\n%s\n", t.name.c_str(), t.source.size(), t.source.c_str());
  }
}

// The quantization config.json (or hf_quant_config.json) declares, as kiln reads it: the FP8 form and its
// weight scales by grain (each scale's shape), or why kiln does not load the folder.
void print_quantization(const hf::ModelConfig& c, const std::string& dir, const safetensors::Model& weights) {
  using Method = hf_import::Fp8Config::Method;
  const Result<hf_import::Fp8Config> q = hf_import::read_fp8_config(c, dir);
  if (!q.ok()) {
    std::printf("\nquantization:   not loadable: %s\n", q.status().message().c_str());
    return;
  }
  if (q->method == Method::none) return;
  const char* method = q->method == Method::compressed_tensors ? "compressed-tensors"
                       : q->method == Method::modelopt         ? "modelopt"
                                                               : "fp8";
  std::map<std::string, size_t> grains;  // "per channel" -> weights
  for (const safetensors::Tensor* t : weights.tensors()) {
    if (!t->name.ends_with(q->scale_suffix)) continue;
    const std::string stem = t->name.substr(0, t->name.size() - q->scale_suffix.size());
    const safetensors::Tensor* w = weights.find(stem + ".weight");
    if (w == nullptr || w->shape.size() != 2) continue;  // the loader names such a scale
    switch (hf_import::scale_grain(t->shape, w->shape[0], w->shape[1], *q)) {
      case hf_import::ScaleGrain::tensor: ++grains["per tensor"]; break;
      case hf_import::ScaleGrain::channel: ++grains["per channel"]; break;
      case hf_import::ScaleGrain::block:
        ++grains[fmt::format("per {}x{} block", q->block_rows, q->block_cols)];
        break;
      case hf_import::ScaleGrain::unknown: ++grains["of another shape"]; break;
    }
  }
  std::string scales;
  for (const auto& [grain, n] : grains)
    scales += fmt::format("{}{} {}", scales.empty() ? "" : ", ", n, grain);
  std::printf("\nquantization:   FP8 e4m3 (%s), weight scales *%s: %s; activations %s\n", method,
              q->scale_suffix.c_str(), scales.empty() ? "none" : scales.c_str(),
              q->static_activations ? "static (input_scale)" : "rounded per token");
}

// Tensors by type: "F8_E4M3  210 tensors  100.44 MiB", most bytes first.
void print_tensor_summary(const safetensors::Model& weights) {
  std::map<std::string, std::pair<size_t, uint64_t>> by_type;
  for (const safetensors::Tensor* t : weights.tensors()) {
    auto& [count, bytes] = by_type[safetensors::dtype_name(t->dtype)];
    ++count;
    bytes += t->data.size();
  }
  std::vector<std::pair<std::string, std::pair<size_t, uint64_t>>> rows(by_type.begin(), by_type.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
  for (const auto& [type, cb] : rows) {
    std::printf("  %-7s %5zu tensors  %s\n", type.c_str(), cb.first, human_bytes(cb.second).c_str());
  }
}

}  // namespace

Status inspect_hf_dir(const std::string& dir, bool show_tensors) {
  KILN_ASSIGN_OR_RETURN(hf::ModelFolder folder, hf::ModelFolder::open(dir));
  KILN_ASSIGN_OR_RETURN(safetensors::Model weights, safetensors::Model::open_dir(dir));
  uint64_t total = 0;
  for (const safetensors::Tensor* t : weights.tensors()) total += t->data.size();
  std::printf("folder:         %s\n", dir.c_str());
  std::printf("format:         Hugging Face, %zu safetensors file(s), %zu tensors, %s\n",
              weights.shards().size(), weights.n_tensors(), human_bytes(total).c_str());
  print_config(folder.config);
  print_quantization(folder.config, dir, weights);
  print_tokenizer(folder);
  std::printf("\ntensors (%zu, %s):\n", weights.n_tensors(), human_bytes(total).c_str());
  if (!show_tensors) {
    print_tensor_summary(weights);
  } else {
    std::printf("  %-48s %-7s %-24s %s\n", "name", "type", "shape", "bytes");
    for (const safetensors::Tensor* t : weights.tensors()) {
      std::printf("  %-48s %-7s %-24s %s\n", t->name.c_str(), safetensors::dtype_name(t->dtype),
                  shape_string(t->shape).c_str(), human_bytes(t->data.size()).c_str());
    }
  }
  return Status();
}

}  // namespace kiln::cli
