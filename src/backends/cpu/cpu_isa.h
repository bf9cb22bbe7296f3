// The instruction-set levels the CPU kernels are compiled for, and which one a process uses: the best this
// machine runs (cpuid, read once), unless the backend's options name one (cpu_options.h). Levels are
// ordered: each runs everything the one before it does. ARM (NEON, dotprod) slots in as its own levels.
#pragma once

#include <string_view>

#include "core/status.h"

namespace kiln::cpu {

struct CpuKernels;  // kernels/cpu_kernels.h

enum class CpuIsa : int {
  cpu_isa_scalar,      // portable C++, any CPU
  cpu_isa_avx2,        // x86-64 AVX2 + FMA + F16C
  cpu_isa_avx512,      // + AVX-512 F/BW/VL/DQ
  cpu_isa_avx512vnni,  // + AVX-512 VNNI (vpdpbusd)
  cpu_isa_amx,         // + AMX-INT8 tiles (tdpbsud), the tile state granted to the process by the kernel
};
inline constexpr CpuIsa kCpuIsaLevels[] = {CpuIsa::cpu_isa_scalar, CpuIsa::cpu_isa_avx2,
                                           CpuIsa::cpu_isa_avx512, CpuIsa::cpu_isa_avx512vnni,
                                           CpuIsa::cpu_isa_amx};

// "scalar", "avx2", "avx512", "avx512vnni", "amx".
std::string_view cpu_isa_name(CpuIsa isa);
// The level of a name; invalid_argument naming the value and the choices otherwise.
Result<CpuIsa> cpu_isa_from_name(std::string_view name);
// Whether this machine can run the level's kernels.
bool cpu_isa_supported(CpuIsa isa);
// The best level this machine runs.
CpuIsa cpu_isa_best();
// The kernels of a level this machine runs.
const CpuKernels& cpu_kernels(CpuIsa isa);

}  // namespace kiln::cpu
