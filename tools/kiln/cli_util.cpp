#include "cli_util.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace kiln::cli {

std::string models_dir() {
  if (const char* d = std::getenv("KILN_MODELS_DIR"); d != nullptr && *d != '\0') return d;
  std::string cache;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0') {
    cache = x;
  } else if (const char* h = std::getenv("HOME"); h != nullptr) {
    cache = std::string(h) + "/.cache";
  } else {
    cache = ".cache";
  }
  return cache + "/kiln/models";
}

std::string default_model_path() { return models_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf"; }

Result<std::string> resolve_model_path(const std::string& path) {
  if (!path.empty()) {
    if (!std::filesystem::exists(path)) return not_found("model not found: {}", path);
    return path;
  }
  std::string def = default_model_path();
  if (!std::filesystem::exists(def)) {
    return not_found("the default model is not at {}; run scripts/fetch-models.sh (or pass -m MODEL)", def);
  }
  return def;
}

int report_error(const char* cmd, const Status& status) {
  std::fprintf(stderr, "kiln %s: error: %s\n", cmd, status.message().c_str());
  switch (status.code()) {
    case StatusCode::not_found: return 2;
    case StatusCode::invalid_argument: return 3;
    case StatusCode::unimplemented: return 4;
    default: return 1;
  }
}

}  // namespace kiln::cli
