#include "backends/cuda/cuda_options.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <string_view>

namespace kiln {

namespace {

// A default-on option: off only when the variable is set to "0".
bool on_unless_zero(const char* name, bool def) {
  const char* v = std::getenv(name);
  return v == nullptr ? def : std::string_view(v) != "0";
}

}  // namespace

CudaOptions cuda_options_from_env() {
  CudaOptions o;
  // KILN_CUDA_GRAPHS: a count (1 keeps only the step captured last); any other non-zero value the default.
  if (const char* v = std::getenv("KILN_CUDA_GRAPHS"); v != nullptr) {
    int n = 0;
    const std::string_view sv(v);
    const auto [end, ec] = std::from_chars(sv.data(), sv.data() + sv.size(), n);
    o.graphs = ec == std::errc() && end == sv.data() + sv.size() && n >= 0 ? std::min(n, 256) : o.graphs;
  }
  o.pdl = on_unless_zero("KILN_CUDA_PDL", o.pdl);
  o.fuse = on_unless_zero("KILN_CUDA_FUSE", o.fuse);
  o.mmq = on_unless_zero("KILN_CUDA_MMQ", o.mmq);
  const char* profile = std::getenv("KILN_CUDA_PROFILE");
  o.profile = profile != nullptr && std::string_view(profile) == "1";
  return o;
}

std::string describe(const CudaOptions& o) {
  return fmt::format(
      "precision {} batch_invariant {} graphs {} pdl {} fuse {} mmq {} (from {} rows) profile {} "
      "staged_gemv {} staged_gemv_grid {} gemv_rows {} "
      "grouped_weights {} stack_weights {} gemv_rope {} gemv_rope_split {}",
      o.precision == ops::Precision::precision_fast ? "fast" : "exact", o.batch_invariant, o.graphs, o.pdl,
      o.fuse, o.mmq, o.mmq_min_cols, o.profile, o.staged_gemv, o.staged_gemv_grid, o.gemv_rows,
      o.grouped_weights, o.stack_weights, o.gemv_rope, o.gemv_rope_split);
}

}  // namespace kiln
