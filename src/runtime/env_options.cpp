#include "runtime/env_options.h"

#include <cstdlib>
#include <string_view>

namespace kiln {

const RuntimeEnvOptions& runtime_env_options() {
  static const RuntimeEnvOptions options = [] {
    RuntimeEnvOptions o;
    const char* p = std::getenv("KILN_STEP_PROFILE");
    o.step_profile = p != nullptr && std::string_view(p) == "1";
    return o;
  }();
  return options;
}

}  // namespace kiln
