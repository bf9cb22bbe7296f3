// The architecture registry: each architecture file defines an Architecture; it is declared below and
// listed in kArchitectures (two lines per architecture).
#include <string_view>

#include "models/architecture.h"

namespace kiln {

// Each architecture file defines its entry.
extern const Architecture kLlama;
extern const Architecture kGemma3;
extern const Architecture kQwen2;
extern const Architecture kQwen3;
extern const Architecture kQwen2Moe;
extern const Architecture kQwen3Moe;
extern const Architecture kPhi3;

namespace {

struct Entry {
  std::string_view gguf_name;  // general.architecture
  const Architecture* arch;
};

constexpr Entry kArchitectures[] = {
    {"llama", &kLlama},       {"gemma3", &kGemma3},     {"qwen2", &kQwen2}, {"qwen3", &kQwen3},
    {"qwen2moe", &kQwen2Moe}, {"qwen3moe", &kQwen3Moe}, {"phi3", &kPhi3},
};

std::string hf_classes() {
  std::string out;
  for (const Entry& e : kArchitectures) {
    for (std::string_view c : e.arch->hf.hf_classes)
      out += std::string(out.empty() ? "" : ", ") + std::string(c);
  }
  return out;
}

}  // namespace

std::string supported_architectures() {
  std::string out;
  for (const Entry& e : kArchitectures)
    out += std::string(out.empty() ? "" : ", ") + std::string(e.gguf_name);
  return out;
}

Result<std::unique_ptr<Model>> load_model(std::shared_ptr<const gguf::File> file, Backend& backend,
                                          const ModelOptions& options) {
  const std::string arch = file->architecture();
  for (const Entry& e : kArchitectures) {
    if (e.gguf_name == arch) return e.arch->make(std::move(file), backend, options);
  }
  if (arch.empty()) {
    if (file->find("general.architecture") == nullptr)
      return invalid_argument("{}: general.architecture is missing", file->name());
    KILN_TRY(file->get_string("general.architecture").status());  // a value of the wrong type, named
    return invalid_argument("{}: general.architecture is empty", file->name());
  }
  return unimplemented("{}: architecture \"{}\" is not supported (supported: {})", file->name(), arch,
                       supported_architectures());
}

Result<std::shared_ptr<const gguf::File>> import_hf_folder(const std::string& dir, bool force_f32,
                                                           bool activation_scales) {
  auto lookup = [](const std::string& cls) -> Result<std::pair<std::string, const hf_import::HfSpec*>> {
    for (const Entry& e : kArchitectures) {
      for (std::string_view c : e.arch->hf.hf_classes) {
        if (c == cls)
          return std::pair<std::string, const hf_import::HfSpec*>(std::string(e.gguf_name), &e.arch->hf);
      }
    }
    return unimplemented("architecture \"{}\" is not supported (supported: {})", cls, hf_classes());
  };
  return hf_import::import(dir, lookup, hf_import::Options{force_f32, activation_scales});
}

}  // namespace kiln
