#include "backends/cpu/cpu_isa.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
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
    case CpuIsa::cpu_isa_amx: return "amx";
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

namespace {

#if defined(__x86_64__) && defined(__GNUC__)
// AMX-TILE and AMX-INT8 (cpuid leaf 7: EDX bits 24, 25), the OS saving their state (XCR0 bits 17, 18), and on
// Linux the tile data granted to this process (arch_prctl ARCH_REQ_XCOMP_PERM, once, for every thread of it;
// a kernel or sandbox that refuses leaves the process at the level below). Without the grant the first tile
// instruction would end the process with SIGILL.
bool amx_granted() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
  if ((d & (1u << 24)) == 0 || (d & (1u << 25)) == 0) return false;
  __get_cpuid(1, &a, &b, &c, &d);
  if ((c & (1u << 27)) == 0) return false;  // OSXSAVE: xgetbv is usable
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & (3u << 17)) != (3u << 17)) return false;
#if defined(__linux__)
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;  // other systems: not yet known how they grant it
#endif
}
#endif

}  // namespace

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
  static const bool amx = vnni && amx_granted();
  switch (isa) {
    case CpuIsa::cpu_isa_scalar: return true;
    case CpuIsa::cpu_isa_avx2: return avx2;
    case CpuIsa::cpu_isa_avx512: return avx512;
    case CpuIsa::cpu_isa_avx512vnni: return vnni;
    case CpuIsa::cpu_isa_amx: return amx;
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

const CpuKernels& cpu_kernels(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::cpu_isa_avx2: return cpu_kernels_avx2();
    case CpuIsa::cpu_isa_avx512: return cpu_kernels_avx512();
    case CpuIsa::cpu_isa_avx512vnni: return cpu_kernels_avx512vnni();
    case CpuIsa::cpu_isa_amx: return cpu_kernels_amx();
    case CpuIsa::cpu_isa_scalar: break;
  }
  return cpu_kernels_scalar();
}

}  // namespace kiln::cpu
