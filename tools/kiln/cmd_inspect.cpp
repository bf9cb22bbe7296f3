// kiln inspect FILE_OR_DIR: what a model file holds — architecture, hyper-parameters, tokenizer,
// chat template, and the tensor table (type, shape, bytes).
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "cli_util.h"
#include "commands.h"
#include "formats/gguf.h"
#include "inspect_hf.h"

namespace kiln::cli {
namespace {

struct InspectOptions {
  std::string path;
  bool tensors = true;
  bool all_metadata = false;
};

std::string human_bytes(uint64_t n) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", n) : fmt::format("{:.2f} {}", v, units[u]);
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", shape[i]);
  return s + "]";
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
  std::printf("tokenizer:      %s%s%s%s, %zu tokens", model->c_str(), *kind ? " (" : "", kind, *kind ? ")" : "",
              toks.size());
  if (const gguf::Value* merges = f.find("tokenizer.ggml.merges"); merges && merges->as_array()) {
    std::printf(", %zu merges", merges->as_array()->items.size());
  }
  if (auto pre = f.get_string("tokenizer.ggml.pre"); pre.ok()) std::printf(", pre-tokenizer '%s'", pre->c_str());
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
  if (auto ft = f.get_uint("general.file_type"); ft.ok()) std::printf("file type:      %llu\n",
                                                                    static_cast<unsigned long long>(*ft));
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
  if (opt.tensors) {
    std::printf("\ntensors (%zu, %s):\n", f.tensors().size(), human_bytes(tensor_bytes).c_str());
    std::printf("  %-48s %-7s %-24s %s\n", "name", "type", "shape", "bytes");
    for (const auto& t : f.tensors()) {
      std::printf("  %-48s %-7s %-24s %s\n", t.name.c_str(), dtype_name(t.type), shape_string(t.shape).c_str(),
                  human_bytes(t.n_bytes).c_str());
    }
  }
  return Status();
}

}  // namespace

void register_inspect(CLI::App& app, int& rc) {
  auto opt = std::make_shared<InspectOptions>();
  CLI::App* cmd = app.add_subcommand(
      "inspect", "Show what a model holds: architecture, hyper-parameters, tokenizer, chat template, tensors");
  cmd->add_option("model", opt->path, "A GGUF file or a Hugging Face model folder (default: the default model)");
  cmd->add_flag("--no-tensors{false}", opt->tensors, "Leave out the tensor table");
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
