// The architecture registry: one line per architecture.
#include <string_view>

#include "models/model.h"

namespace kiln {

// Each architecture file defines its factory.
Result<std::unique_ptr<Model>> make_llama(std::shared_ptr<const gguf::File> file, Backend& backend,
                                          const ModelOptions& options);
Result<std::unique_ptr<Model>> make_gemma3(std::shared_ptr<const gguf::File> file, Backend& backend,
                                           const ModelOptions& options);

namespace {

using Factory = Result<std::unique_ptr<Model>> (*)(std::shared_ptr<const gguf::File>, Backend&,
                                                   const ModelOptions&);
struct Entry {
  std::string_view architecture;
  Factory make;
};

constexpr Entry kArchitectures[] = {
    {"llama", make_llama},
    {"gemma3", make_gemma3},
};

}  // namespace

std::string supported_architectures() {
  std::string out;
  for (const Entry& e : kArchitectures)
    out += std::string(out.empty() ? "" : ", ") + std::string(e.architecture);
  return out;
}

Result<std::unique_ptr<Model>> load_model(std::shared_ptr<const gguf::File> file, Backend& backend,
                                          const ModelOptions& options) {
  const std::string arch = file->architecture();
  for (const Entry& e : kArchitectures) {
    if (e.architecture == arch) return e.make(std::move(file), backend, options);
  }
  if (arch.empty()) return invalid_argument("{}: general.architecture is missing", file->name());
  return unimplemented("{}: architecture \"{}\" is not supported (supported: {})", file->name(), arch,
                       supported_architectures());
}

}  // namespace kiln
