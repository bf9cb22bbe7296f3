// The CPU backend's options, read once when a backend is made (make_cpu_backend): BackendOptions first, then
// the environment, into one typed struct the backend keeps and logs at debug level. The environment names:
// - KILN_CPU_ISA=scalar|avx2|avx512|avx512vnni|amx: the kernels' ISA level (unless BackendOptions::cpu_isa
//   names one); default the best this CPU runs.
// - KILN_CPU_REPACK=0: no weight is repacked at load (the kernels read the file's blocks in place).
#pragma once

#include <string>
#include <string_view>

#include "backends/backend.h"
#include "backends/cpu/cpu_isa.h"
#include "core/status.h"

namespace kiln::cpu {

struct CpuOptions {
  CpuIsa isa = CpuIsa::cpu_isa_scalar;  // the matmul kernels' level
  bool repack = true;  // product weights repacked at load where the level has a packed kernel
  ops::Precision precision = ops::Precision::precision_exact;  // every Matmul, MoeMatmul, Attention
  int n_threads = 0;  // the pool's threads (0: default_thread_count())
};

// The level for `name`: "" = KILN_CPU_ISA when set, else cpu_isa_best(). invalid_argument for an unknown name
// or a level this machine cannot run.
Result<CpuIsa> cpu_isa_select(std::string_view name);

// The options of a backend made with `options`; the errors of cpu_isa_select.
Result<CpuOptions> cpu_options(const BackendOptions& options);

// "isa avx2, repack on, precision fast, 4 threads".
std::string cpu_options_describe(const CpuOptions& o);

}  // namespace kiln::cpu
