#include "core/env_options.h"

#include <algorithm>
#include <cstdlib>

namespace kiln {

const CoreEnvOptions& core_env_options() {
  static const CoreEnvOptions options = [] {
    CoreEnvOptions o;
    if (const char* v = std::getenv("KILN_LOG_LEVEL"); v != nullptr) o.log_level = v;
    if (const char* v = std::getenv("KILN_THREADS"); v != nullptr) o.threads = std::max(std::atoi(v), 0);
    return o;
  }();
  return options;
}

}  // namespace kiln
