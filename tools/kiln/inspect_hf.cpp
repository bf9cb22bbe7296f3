// kiln inspect on a Hugging Face model folder: config.json, tokenizer files, safetensors weights.
#include "inspect_hf.h"

#include <fmt/format.h>

#include <cstdio>

#include "formats/hf_config.h"
#include "formats/safetensors.h"
#include "inspect_util.h"

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
  print_tokenizer(folder);
  if (show_tensors) {
    std::printf("\ntensors (%zu, %s):\n", weights.n_tensors(), human_bytes(total).c_str());
    std::printf("  %-48s %-7s %-24s %s\n", "name", "type", "shape", "bytes");
    for (const safetensors::Tensor* t : weights.tensors()) {
      std::printf("  %-48s %-7s %-24s %s\n", t->name.c_str(), safetensors::dtype_name(t->dtype),
                  shape_string(t->shape).c_str(), human_bytes(t->data.size()).c_str());
    }
  }
  return Status();
}

}  // namespace kiln::cli
