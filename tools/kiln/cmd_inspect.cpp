// kiln inspect FILE_OR_DIR: what a model file holds — architecture, hyper-parameters, tokenizer,
// chat template, and the tensor table (type, shape, bytes).
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "formats/gguf.h"
#include "inspect_hf.h"
#include "inspect_util.h"

namespace kiln::cli {
namespace {

struct InspectOptions {
  std::string path;
  bool tensors = false;
  bool all_metadata = false;
};

// general.file_type: the llama.cpp file-type enum ("mostly Q4_1" means most weights are Q4_1).
const char* file_type_name(uint64_t ft) {
  switch (ft) {
    case 0: return "all F32";
    case 1: return "mostly F16";
    case 2: return "mostly Q4_0";
    case 3: return "mostly Q4_1";
    case 7: return "mostly Q8_0";
    case 8: return "mostly Q5_0";
    case 9: return "mostly Q5_1";
    case 10: return "mostly Q2_K";
    case 11: return "mostly Q3_K - small";
    case 12: return "mostly Q3_K - medium";
    case 13: return "mostly Q3_K - large";
    case 14: return "mostly Q4_K - small";
    case 15: return "mostly Q4_K - medium";
    case 16: return "mostly Q5_K - small";
    case 17: return "mostly Q5_K - medium";
    case 18: return "mostly Q6_K";
    case 25: return "mostly IQ4_NL";
    case 32: return "mostly BF16";
    default: return "unknown";
  }
}

// Tensors by type: "q4_1  210 tensors  63.28 MiB", most bytes first.
void print_tensor_summary(const std::vector<gguf::TensorInfo>& tensors) {
  std::map<std::string, std::pair<size_t, uint64_t>> by_type;
  for (const auto& t : tensors) {
    auto& [count, bytes] = by_type[dtype_name(t.type)];
    ++count;
    bytes += t.n_bytes;
  }
  std::vector<std::pair<std::string, std::pair<size_t, uint64_t>>> rows(by_type.begin(), by_type.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
  for (const auto& [type, cb] : rows) {
    std::printf("  %-7s %5zu tensors  %s\n", type.c_str(), cb.first, human_bytes(cb.second).c_str());
  }
}

// One line naming a special token: "1 '<|im_start|>'".
std::string token_label(const gguf::File& f, const char* key, const std::vector<std::string>& tokens) {
  auto id = f.get_uint(key);
  if (!id.ok()) return "none";
  if (*id >= tokens.size()) return fmt::format("{} (out of range: vocab has {})", *id, tokens.size());
  return fmt::format("{} '{}'", *id, tokens[*id]);
}

void print_tokenizer(const gguf::File& f) {
  auto model = f.get_string("tokenizer.ggml.model");
  if (!model.ok()) {
    std::printf("tokenizer:      none in this file\n");
    return;
  }
  auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  std::vector<std::string> toks = tokens.ok() ? *tokens : std::vector<std::string>{};
  const char* kind = *model == "gpt2" ? "byte-level BPE" : *model == "llama" ? "SentencePiece-style BPE" : "";
  std::printf("tokenizer:      %s%s%s%s, %zu tokens", model->c_str(), *kind ? " (" : "", kind,
              *kind ? ")" : "", toks.size());
  if (const gguf::Value* merges = f.find("tokenizer.ggml.merges"); merges && merges->as_array()) {
    std::printf(", %zu merges", merges->as_array()->items.size());
  }
  if (auto pre = f.get_string("tokenizer.ggml.pre"); pre.ok())
    std::printf(", pre-tokenizer '%s'", pre->c_str());
  std::printf("\n");
  std::printf("                bos %s, eos %s", token_label(f, "tokenizer.ggml.bos_token_id", toks).c_str(),
              token_label(f, "tokenizer.ggml.eos_token_id", toks).c_str());
  if (f.find("tokenizer.ggml.padding_token_id")) {
    std::printf(", pad %s", token_label(f, "tokenizer.ggml.padding_token_id", toks).c_str());
  }
  auto add_bos = f.get_bool_or("tokenizer.ggml.add_bos_token", false);
  std::printf(", add_bos %s\n", add_bos.ok() && *add_bos ? "yes" : "no");
}

Status inspect_gguf(const InspectOptions& opt) {
  KILN_ASSIGN_OR_RETURN(gguf::File f, gguf::File::open(opt.path));
  uint64_t tensor_bytes = 0;
  for (const auto& t : f.tensors()) tensor_bytes += t.n_bytes;
  const std::string arch = f.architecture();
  std::printf("file:           %s\n", opt.path.c_str());
  std::printf("format:         GGUF v%u, %s, alignment %llu, %zu metadata keys, %zu tensors\n", f.version(),
              human_bytes(f.bytes().size()).c_str(), static_cast<unsigned long long>(f.alignment()),
              f.metadata().size(), f.tensors().size());
  std::printf("architecture:   %s\n", arch.empty() ? "(none)" : arch.c_str());
  if (auto name = f.get_string("general.name"); name.ok()) std::printf("name:           %s\n", name->c_str());
  if (auto ft = f.get_uint("general.file_type"); ft.ok()) {
    std::printf("file type:      %llu (%s)\n", static_cast<unsigned long long>(*ft), file_type_name(*ft));
  }
  std::printf("\nhyper-parameters:\n");
  const std::string prefix = arch + ".";
  for (const auto& [key, value] : f.metadata()) {
    if (!arch.empty() && key.rfind(prefix, 0) == 0) {
      std::printf("  %-40s %s\n", key.c_str(), value.to_display_string().c_str());
    }
  }
  std::printf("\n");
  print_tokenizer(f);
  if (opt.all_metadata) {
    std::printf("\nmetadata:\n");
    for (const auto& [key, value] : f.metadata()) {
      std::printf("  %-40s %s %s\n", key.c_str(), gguf::value_type_name(value.type),
                  value.to_display_string().c_str());
    }
  }
  if (auto tmpl = f.get_string("tokenizer.chat_template"); tmpl.ok()) {
    std::printf("\nchat template (%zu bytes):\n%s\n", tmpl->size(), tmpl->c_str());
  } else {
    std::printf("\nchat template:  none\n");
  }
  std::printf("\ntensors (%zu, %s):\n", f.tensors().size(), human_bytes(tensor_bytes).c_str());
  if (!opt.tensors) {
    print_tensor_summary(f.tensors());
  } else {
    std::printf("  %-48s %-7s %-24s %s\n", "name", "type", "shape", "bytes");
    for (const auto& t : f.tensors()) {
      std::printf("  %-48s %-7s %-24s %s\n", t.name.c_str(), dtype_name(t.type),
                  shape_string(t.shape).c_str(), human_bytes(t.n_bytes).c_str());
    }
  }
  return Status();
}

}  // namespace

void register_inspect(CLI::App& app, int& rc) {
  auto opt = std::make_shared<InspectOptions>();
  CLI::App* cmd = app.add_subcommand(
      "inspect",
      "Show what a model holds: architecture, hyper-parameters, tokenizer, chat template, tensors");
  cmd->add_option("model", opt->path,
                  "A GGUF file or a Hugging Face model folder (default: the default model)");
  cmd->add_flag("--tensors", opt->tensors,
                "List every tensor (name, type, shape, bytes), not only a summary by type");
  cmd->add_flag("--metadata", opt->all_metadata, "Also list every metadata key with its type and value");
  cmd->callback([opt, &rc] {
    auto path = resolve_model_path(opt->path);
    if (!path.ok()) {
      rc = report_error("inspect", path.status());
      return;
    }
    InspectOptions o = *opt;
    o.path = *path;
    Status s = std::filesystem::is_directory(o.path) ? inspect_hf_dir(o.path, o.tensors) : inspect_gguf(o);
    if (!s.ok()) rc = report_error("inspect", s);
  });
}

}  // namespace kiln::cli
