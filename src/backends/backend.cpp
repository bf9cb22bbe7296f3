// make_backend: the one place that lists the backends; make_collective_group: their tensor-parallel groups.
#include "backends/backend.h"

#include <algorithm>
#include <string>
#include <thread>

#include "backends/cpu/cpu_backend.h"
#if defined(KILN_HAVE_CUDA)
#include "backends/cuda/cuda_backend.h"
#endif

namespace kiln {

std::string_view weight_role_name(WeightRole role) {
  switch (role) {
    case WeightRole::weight_role_embedding: return "embedding";
    case WeightRole::weight_role_tied_embedding: return "tied_embedding";
    case WeightRole::weight_role_matmul: return "matmul";
    case WeightRole::weight_role_expert_matmul: return "expert_matmul";
    case WeightRole::weight_role_norm: return "norm";
    case WeightRole::weight_role_bias: return "bias";
    case WeightRole::weight_role_rope_factors: return "rope_factors";
  }
  return "?";
}

Status Backend::run(const ops::Op& op) {
  Program program;
  KILN_TRY(program.add(op));
  return run(program);
}

Result<std::unique_ptr<Buffer>> Backend::allocate_host(size_t bytes) {
  (void)bytes;
  return unimplemented("{} backend: no host memory of its own", name());
}

Result<std::vector<std::unique_ptr<WeightHandle>>> Backend::prepare_weight_group(
    std::span<const Tensor> logicals, std::span<const std::string> names, WeightRole role,
    const ReadDone& read_done) {
  if (names.size() != logicals.size()) {
    return invalid_argument("{}: prepare_weight_group: {} weights but {} names", name(), logicals.size(),
                            names.size());
  }
  std::vector<std::unique_ptr<WeightHandle>> handles;
  for (size_t i = 0; i < logicals.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<WeightHandle> h,
                          prepare_weight_reporting(logicals[i], names[i], role, read_done));
    handles.push_back(std::move(h));
  }
  return handles;
}

Status check_transfer(std::string_view what, const Tensor& t, size_t bytes) {
  if (t.data == nullptr) return invalid_argument("{}: the tensor has no data", what);
  if (!t.is_contiguous()) return invalid_argument("{}: {} is not contiguous", what, t.describe());
  const auto size = static_cast<size_t>(t.nb[3] * t.ne[3]);
  if (size != bytes)
    return invalid_argument("{}: {} holds {} bytes, not {}", what, t.describe(), size, bytes);
  return Status::ok_status();
}

Result<size_t> check_copy(std::string_view what, const Tensor& dst, const Tensor& src) {
  if (dst.type != src.type || dst.ne != src.ne) {
    return invalid_argument("{}: dst is {} but src is {}", what, dst.describe(), src.describe());
  }
  const auto bytes = static_cast<size_t>(src.nb[3] * src.ne[3]);
  KILN_TRY(check_transfer(what, src, bytes));
  KILN_TRY(check_transfer(what, dst, bytes));
  return bytes;
}

bool cuda_available() {
#if defined(KILN_HAVE_CUDA)
  return cuda_device_present();
#else
  return false;
#endif
}

Result<int> cuda_device_index(std::string_view name) {
  if (name == "cuda") return 0;
  const std::string_view n = name.starts_with("cuda:") ? name.substr(5) : std::string_view();
  if (n.empty() || n.size() > 4 ||
      !std::all_of(n.begin(), n.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return invalid_argument("backend \"{}\": the device must be cuda:N, N a number", name);
  return std::stoi(std::string(n));
}

Status check_thread_count(int n_threads) {
  // More threads than a few per core only cost memory and scheduling (and thousands fail to start at all).
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int max_threads = std::max(kMaxThreadsPerCore * cores, 16);
  if (n_threads < 0 || n_threads > max_threads) {
    return invalid_argument(
        "{} threads: the count must be in [0, {}] ({} x the {} cores here; 0 = the default)", n_threads,
        max_threads, kMaxThreadsPerCore, cores);
  }
  return Status::ok_status();
}

Result<std::unique_ptr<Backend>> make_backend(std::string_view name, const BackendOptions& options) {
  KILN_TRY(check_thread_count(options.n_threads));
  if (name == "cpu") return make_cpu_backend(options);
  if (name == "auto") {
#if defined(KILN_HAVE_CUDA)
    if (Result<std::unique_ptr<Backend>> gpu = make_cuda_backend(0, options); gpu.ok()) return gpu;
#endif
    return make_cpu_backend(options);
  }
  if (name == "cuda" || name.starts_with("cuda:")) {
#if defined(KILN_HAVE_CUDA)
    KILN_ASSIGN_OR_RETURN(const int device, cuda_device_index(name));
    return make_cuda_backend(device, options);
#else
    return not_found("backend \"{}\": this build has no CUDA backend (build a `cuda` preset)", name);
#endif
  }
  return not_found("backend \"{}\" is not available (available: auto, cpu{})", name,
#if defined(KILN_HAVE_CUDA)
                   ", cuda[:N]"
#else
                   ""
#endif
  );
}

Result<std::unique_ptr<CollectiveGroup>> make_collective_group(std::span<Backend* const> ranks) {
  if (ranks.empty()) return invalid_argument("tensor parallelism: a group needs at least one rank");
  std::string names;
  size_t host = 0;
  [[maybe_unused]] size_t cuda = 0;  // CUDA backends
  for (const Backend* b : ranks) {
    if (b == nullptr) return invalid_argument("tensor parallelism: a rank has no backend");
    names += fmt::format("{}{}", names.empty() ? "" : ", ", b->name());
    host += b->host_memory() ? 1 : 0;
#if defined(KILN_HAVE_CUDA)
    cuda += cuda_backend_device(*b) >= 0 ? 1 : 0;
#endif
  }
  if (host == ranks.size())
    return std::unique_ptr<CollectiveGroup>(std::make_unique<HostGroup>(static_cast<int32_t>(ranks.size())));
#if defined(KILN_HAVE_CUDA)
  if (cuda == ranks.size()) return make_nccl_group(ranks);
#else
  if (host == 0) return unimplemented("tensor parallelism over {}: this build has no CUDA backend", names);
#endif
  return invalid_argument("tensor parallelism: the ranks' backends ({}) must be all CPU or all CUDA", names);
}

}  // namespace kiln
