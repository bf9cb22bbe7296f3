#include "backends/cuda/cuda_options.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <string_view>

namespace kiln {

namespace {

// The variable's value; empty when it is not set.
std::string_view variable(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string_view() : std::string_view(v);
}

// A default-on option: off only when the variable is set to "0".
bool on_unless_zero(const char* name, bool def) {
  const std::string_view v = variable(name);
  return v.empty() ? def : v != "0";
}

// A count from 0 to `most`; the default when the variable is unset or not such a number.
int count_or(const char* name, int def, int most) {
  const std::string_view v = variable(name);
  int n = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  return !v.empty() && ec == std::errc() && end == v.data() + v.size() && n >= 0 ? std::min(n, most) : def;
}

}  // namespace

CudaOptions cuda_options_from_env() {
  CudaOptions o;
  o.graphs = count_or("KILN_CUDA_GRAPHS", o.graphs, 256);  // 1 keeps only the step captured last
  o.pdl = on_unless_zero("KILN_CUDA_PDL", o.pdl);
  o.fuse = on_unless_zero("KILN_CUDA_FUSE", o.fuse);
  o.mmq = on_unless_zero("KILN_CUDA_MMQ", o.mmq);
  o.wgmma = on_unless_zero("KILN_CUDA_WGMMA", o.wgmma);
  o.profile = variable("KILN_CUDA_PROFILE") == "1";
  return o;
}

std::string describe(const CudaOptions& o) {
  return fmt::format(
      "precision {} batch_invariant {} graphs {} pdl {} fuse {} mmq {} (from {} rows) wgmma {} profile {} "
      "staged_gemv {} staged_gemv_grid {} gemv_rows {} "
      "grouped_weights {} stack_weights {} gemv_rope {} gemv_rope_split {}",
      o.precision == ops::Precision::precision_fast ? "fast" : "exact", o.batch_invariant, o.graphs, o.pdl,
      o.fuse, o.mmq, o.mmq_min_cols, o.wgmma, o.profile, o.staged_gemv, o.staged_gemv_grid, o.gemv_rows,
      o.grouped_weights, o.stack_weights, o.gemv_rope, o.gemv_rope_split);
}

}  // namespace kiln
