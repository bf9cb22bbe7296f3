// make_backend: the one place that lists the backends.
#include "backends/backend.h"

#include "backends/cpu/cpu_backend.h"

namespace kiln {

Result<std::unique_ptr<Backend>> make_backend(std::string_view name, const BackendOptions& options) {
  if (name == "cpu") return make_cpu_backend(options);
  return not_found("backend \"{}\" is not available (available: cpu)", name);
}

}  // namespace kiln
