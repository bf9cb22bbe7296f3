#include "backends/cpu/cpu_isa.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

#include <cstdlib>
#include <string>

#include "backends/cpu/kernels/cpu_kernels.h"

namespace kiln::cpu {

std::string_view cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::cpu_isa_scalar: return "scalar";
    case CpuIsa::cpu_isa_avx2: return "avx2";
    case CpuIsa::cpu_isa_avx512: return "avx512";
    case CpuIsa::cpu_isa_avx512vnni: return "avx512vnni";
  }
  return "?";
}

Result<CpuIsa> cpu_isa_from_name(std::string_view name) {
  std::string choices;
  for (CpuIsa isa : kCpuIsaLevels) {
    if (cpu_isa_name(isa) == name) return isa;
    choices += choices.empty() ? "" : "|";
    choices += cpu_isa_name(isa);
  }
  return invalid_argument("cpu isa \"{}\" is not a level: choose one of {}", name, choices);
}

bool cpu_isa_supported(CpuIsa isa) {
#if defined(__x86_64__) && defined(__GNUC__)
  // Read once: __builtin_cpu_supports consults the cpuid results the runtime gathered at start.
  // F16C from cpuid leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know "f16c".
  static const bool f16c = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & (1u << 29)) != 0;
  }();
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  static const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                             __builtin_cpu_supports("avx512dq");
  static const bool vnni = avx512 && __builtin_cpu_supports("avx512vnni");
  switch (isa) {
    case CpuIsa::cpu_isa_scalar: return true;
    case CpuIsa::cpu_isa_avx2: return avx2;
    case CpuIsa::cpu_isa_avx512: return avx512;
    case CpuIsa::cpu_isa_avx512vnni: return vnni;
  }
  return false;
#else
  return isa == CpuIsa::cpu_isa_scalar;
#endif
}

CpuIsa cpu_isa_best() {
  CpuIsa best = CpuIsa::cpu_isa_scalar;
  for (CpuIsa isa : kCpuIsaLevels) {
    if (cpu_isa_supported(isa)) best = isa;
  }
  return best;
}

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

const CpuKernels& cpu_kernels(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::cpu_isa_avx2: return cpu_kernels_avx2();
    case CpuIsa::cpu_isa_avx512: return cpu_kernels_avx512();
    case CpuIsa::cpu_isa_avx512vnni: return cpu_kernels_avx512vnni();
    case CpuIsa::cpu_isa_scalar: break;
  }
  return cpu_kernels_scalar();
}

}  // namespace kiln::cpu
