// make_backend: the one place that lists the backends.
#include "backends/backend.h"

#include <algorithm>
#include <thread>

#include "backends/cpu/cpu_backend.h"

namespace kiln {

Result<std::unique_ptr<Backend>> make_backend(std::string_view name, const BackendOptions& options) {
  // More threads than a few per core only cost memory and scheduling (and thousands fail to start at all).
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int max_threads = std::max(kMaxThreadsPerCore * cores, 16);
  if (options.n_threads < 0 || options.n_threads > max_threads) {
    return invalid_argument(
        "{} threads: the count must be in [0, {}] ({} x the {} cores here; 0 = the default)",
        options.n_threads, max_threads, kMaxThreadsPerCore, cores);
  }
  if (name == "cpu") return make_cpu_backend(options);
  return not_found("backend \"{}\" is not available (available: cpu)", name);
}

}  // namespace kiln
