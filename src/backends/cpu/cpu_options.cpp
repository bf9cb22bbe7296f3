// The one place the CPU backend reads the environment (cpu_options.h).
#include "backends/cpu/cpu_options.h"

#include <fmt/format.h>

#include <cstdlib>

namespace kiln::cpu {

Result<CpuIsa> cpu_isa_select(std::string_view name) {
  std::string_view what = "cpu isa";
  if (name.empty()) {
    const char* env = std::getenv("KILN_CPU_ISA");
    if (env == nullptr || *env == '\0') return cpu_isa_best();
    name = env;
    what = "KILN_CPU_ISA";
  }
  Result<CpuIsa> isa = cpu_isa_from_name(name);
  if (!isa.ok()) return invalid_argument("{}: {}", what, isa.status().message());
  if (!cpu_isa_supported(*isa)) {
    return invalid_argument("{}={}: this CPU cannot run it (the best it runs is {})", what, name,
                            cpu_isa_name(cpu_isa_best()));
  }
  return isa;
}

Result<CpuOptions> cpu_options(const BackendOptions& options) {
  CpuOptions o;
  KILN_ASSIGN_OR_RETURN(o.isa, cpu_isa_select(options.cpu_isa));
  const char* repack = std::getenv("KILN_CPU_REPACK");
  o.repack = repack == nullptr || std::string_view(repack) != "0";
  o.precision = options.precision;
  o.n_threads = options.n_threads;
  return o;
}

std::string cpu_options_describe(const CpuOptions& o) {
  return fmt::format("isa {}, repack {}, precision {}, {} threads", cpu_isa_name(o.isa),
                     o.repack ? "on" : "off",
                     o.precision == ops::Precision::precision_fast ? "fast" : "exact", o.n_threads);
}

}  // namespace kiln::cpu
