#include "backends/cuda/nccl_group.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <variant>

#include "backends/cuda/cuda_backend.h"
#include "core/log.h"

namespace kiln::cuda {

// NCCL's ABI as nccl.h declares it, written out here because the machine that builds kiln may not have the
// header: the communicator is an opaque pointer, the enums are C ints, and these values are NCCL 2's.
using ncclComm_t = ncclComm*;
enum ncclResult_t : int { ncclSuccess = 0 };
enum ncclDataType_t : int { ncclFloat32 = 7 };
enum ncclRedOp_t : int { ncclSum = 0 };

// The NCCL functions kiln calls, looked up once in libnccl.so.2.
struct NcclApi {
  const char* (*get_error_string)(ncclResult_t) = nullptr;
  const char* (*get_last_error)(ncclComm_t) = nullptr;  // NCCL 2.13 and newer; else null
  ncclResult_t (*get_version)(int*) = nullptr;
  ncclResult_t (*comm_init_all)(ncclComm_t*, int, const int*) = nullptr;
  ncclResult_t (*comm_destroy)(ncclComm_t) = nullptr;
  ncclResult_t (*comm_abort)(ncclComm_t) = nullptr;
  ncclResult_t (*all_reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                             cudaStream_t) = nullptr;
  ncclResult_t (*all_gather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) = nullptr;
  int version = 0;  // NCCL_VERSION_CODE: major * 10000 + minor * 100 + patch since 2.9
};

namespace {

constexpr int kMinVersion = 20900;  // 2.9: collectives captured in CUDA graphs

template <class F>
bool bind(void* lib, F& f, const char* name) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  return f != nullptr;
}

std::string version_name(int v) {
  return v >= 10000 ? fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100)
                    : fmt::format("{}.{}.{}", v / 1000, v / 100 % 10, v % 100);
}

Result<const NcclApi*> load() {
  static NcclApi api;
  void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);  // kept for the process's lifetime
  const auto missing = [] {
    const char* e = dlerror();
    return unimplemented("tensor parallelism on CUDA needs NCCL (libnccl.so.2): {}",
                         e != nullptr ? e : "not found");
  };
  if (lib == nullptr) return missing();
  if (!bind(lib, api.get_error_string, "ncclGetErrorString") ||
      !bind(lib, api.get_version, "ncclGetVersion") || !bind(lib, api.comm_init_all, "ncclCommInitAll") ||
      !bind(lib, api.comm_destroy, "ncclCommDestroy") || !bind(lib, api.comm_abort, "ncclCommAbort") ||
      !bind(lib, api.all_reduce, "ncclAllReduce") || !bind(lib, api.all_gather, "ncclAllGather")) {
    return missing();
  }
  (void)bind(lib, api.get_last_error, "ncclGetLastError");
  if (api.get_version(&api.version) != ncclSuccess || api.version < kMinVersion) {
    return unimplemented("tensor parallelism on CUDA needs NCCL 2.9 or newer (libnccl.so.2 is {})",
                         version_name(api.version));
  }
  log_debug("cuda: NCCL {} loaded", version_name(api.version));
  return &api;
}

// The library, loaded by the first call (every later one gets its result).
Result<const NcclApi*> nccl() {
  static const Result<const NcclApi*> api = load();
  return api;
}

// The calling thread's device, put back when it goes: NCCL's management calls switch devices.
class DeviceKept {
 public:
  DeviceKept() { ok_ = cudaGetDevice(&device_) == cudaSuccess; }
  ~DeviceKept() {
    if (ok_) cudaSetDevice(device_);
  }
  DeviceKept(const DeviceKept&) = delete;
  DeviceKept& operator=(const DeviceKept&) = delete;

 private:
  int device_ = 0;
  bool ok_ = false;
};

const NcclCollective* nccl_rank(const ops::Op& op) {
  const Collective* c = nullptr;
  if (const auto* r = std::get_if<ops::AllReduce>(&op)) c = r->group;
  if (const auto* g = std::get_if<ops::AllGather>(&op)) c = g->group;
  return c != nullptr && c->transport() == Collective::Transport::nccl
             ? dynamic_cast<const NcclCollective*>(c)
             : nullptr;
}

}  // namespace

int32_t NcclCollective::world() const { return group_.world(); }

bool NcclCollective::ready() const {
  if (int current = -1; cudaGetDevice(&current) != cudaSuccess || current != device_) {
    error_ =
        make_status(StatusCode::invalid_argument,
                    "tensor parallelism: rank {} of {} is on cuda:{}, but its collective runs on cuda:{}",
                    rank_, world(), device_, current);
    return false;
  }
  if (Status refused = group_.enter(); !refused.ok()) {
    error_ = std::move(refused);
    return false;
  }
  return true;
}

cudaError_t NcclCollective::finish(int result, const char* what) const {
  if (result == ncclSuccess) {
    if (!error_.ok()) error_ = Status::ok_status();
    return cudaSuccess;
  }
  const NcclApi& api = group_.api_;
  const char* detail = api.get_last_error != nullptr ? api.get_last_error(comm_) : nullptr;
  error_ =
      make_status(StatusCode::internal, "tensor parallelism: {} on cuda:{} (rank {} of {}) failed: {}{}{}",
                  what, device_, rank_, world(), api.get_error_string(static_cast<ncclResult_t>(result)),
                  detail != nullptr && *detail != '\0' ? ": " : "", detail != nullptr ? detail : "");
  return cudaErrorUnknown;
}

cudaError_t NcclCollective::all_reduce(const float* x, float* dst, size_t n, cudaStream_t stream) const {
  if (!ready()) return cudaErrorUnknown;
  const cudaError_t e =
      finish(group_.api_.all_reduce(x, dst, n, ncclFloat32, ncclSum, comm_, stream), "ncclAllReduce");
  group_.leave();
  return e;
}

cudaError_t NcclCollective::all_gather(const float* x, float* dst, size_t n, cudaStream_t stream) const {
  if (!ready()) return cudaErrorUnknown;
  const cudaError_t e =
      finish(group_.api_.all_gather(x, dst, n, ncclFloat32, comm_, stream), "ncclAllGather");
  group_.leave();
  return e;
}

Result<std::unique_ptr<NcclGroup>> NcclGroup::make(std::span<const int> devices) {
  if (devices.empty()) return invalid_argument("tensor parallelism: a group needs at least one rank");
  // NVLink SHARP (NVLS: the switches' multicast) stays off unless the user set it: on a host whose GPUs
  // others share, a program that creates multicast objects can put those GPUs out of service for everyone.
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  // Every connection is made in ncclCommInitAll, not at a rank's first collective of each algorithm (NCCL
  // 2.22's default), where the enqueue would wait on the host for its peers: abort() waits for enqueues in
  // progress, and a peer that failed never comes.
  setenv("NCCL_RUNTIME_CONNECT", "0", 0);
  KILN_ASSIGN_OR_RETURN(const NcclApi* api, nccl());
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  ncclResult_t made = ncclSuccess;
  {
    const DeviceKept kept;
    made = api->comm_init_all(comms.data(), static_cast<int>(devices.size()), devices.data());
  }
  if (made != ncclSuccess) {
    std::string list;
    for (const int d : devices) list += fmt::format("{}cuda:{}", list.empty() ? "" : ", ", d);
    return make_status(StatusCode::internal, "tensor parallelism: ncclCommInitAll over {} failed: {}", list,
                       api->get_error_string(made));
  }
  log_debug("cuda: an NCCL group of {} ranks", devices.size());
  return std::unique_ptr<NcclGroup>(new NcclGroup(*api, devices, comms));
}

NcclGroup::NcclGroup(const NcclApi& api, std::span<const int> devices, std::span<ncclComm* const> comms)
    : api_(api) {
  for (size_t r = 0; r < devices.size(); ++r)
    ranks_.push_back(std::make_unique<NcclCollective>(*this, static_cast<int32_t>(r), devices[r], comms[r]));
}

NcclGroup::~NcclGroup() {
  if (aborting_.joinable()) {
    aborting_.join();  // the communicators are freed
    return;
  }
  const DeviceKept kept;
  for (const auto& r : ranks_) api_.comm_destroy(r->comm_);
}

Status NcclGroup::failed() const {
  const std::lock_guard lock(mu_);
  return failed_;
}

Status NcclGroup::enter() const {
  const std::lock_guard lock(mu_);
  if (!failed_.ok()) return failed_;
  ++inside_;
  return Status::ok_status();
}

void NcclGroup::leave() const {
  const std::lock_guard lock(mu_);
  if (--inside_ == 0) left_.notify_all();
}

void NcclGroup::abort(const Status& why) {
  const std::lock_guard lock(mu_);
  if (!failed_.ok()) return;
  failed_ = why.ok() ? Status(StatusCode::internal, "tensor parallelism: the group was stopped") : why;
  // ncclCommAbort sets the communicator's abort flags, which a collective kernel waiting for its peers polls;
  // the last one then waits until the graphs that captured the group's collectives are gone (the backends'),
  // so on a thread of its own. Ranks enqueueing now finish first, or the communicators would be freed under
  // them; none enters after this.
  aborting_ = std::thread([this] {
    {
      std::unique_lock inside(mu_);
      left_.wait(inside, [this] { return inside_ == 0; });
    }
    for (const auto& r : ranks_) api_.comm_abort(r->comm_);
  });
}

NcclLaunch::NcclLaunch(std::span<const NcclCollective* const> ranks) {
  for (const NcclCollective* r : ranks) {
    status_ = r->group().enter();
    if (!status_.ok()) return;
    entered_.push_back(&r->group());
  }
}

NcclLaunch::~NcclLaunch() {
  for (const NcclGroup* g : entered_) g->leave();
}

std::vector<const NcclCollective*> nccl_ranks(std::span<const ops::Op> ops) {
  std::vector<const NcclCollective*> ranks;
  for (const ops::Op& op : ops) {
    const NcclCollective* r = nccl_rank(op);
    if (r == nullptr) continue;
    if (std::none_of(ranks.begin(), ranks.end(),
                     [&](const NcclCollective* q) { return &q->group() == &r->group(); }))
      ranks.push_back(r);
  }
  return ranks;
}

Status collective_error(const ops::Op& op) {
  const NcclCollective* r = nccl_rank(op);
  return r != nullptr ? r->error() : Status::ok_status();
}

}  // namespace kiln::cuda

namespace kiln {

Result<std::unique_ptr<CollectiveGroup>> make_nccl_group(std::span<Backend* const> ranks) {
  std::vector<int> devices;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const int d = ranks[r] != nullptr ? cuda_backend_device(*ranks[r]) : -1;
    if (d < 0) {
      return invalid_argument("tensor parallelism: rank {} ({}) is not a CUDA backend", r,
                              ranks[r] != nullptr ? ranks[r]->name() : "none");
    }
    if (const auto seen = std::find(devices.begin(), devices.end(), d); seen != devices.end()) {
      return invalid_argument(
          "tensor parallelism: ranks {} and {} are both on cuda:{} (NCCL takes a device once)",
          seen - devices.begin(), r, d);
    }
    devices.push_back(d);
  }
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<cuda::NcclGroup> group, cuda::NcclGroup::make(devices));
  return std::unique_ptr<CollectiveGroup>(std::move(group));
}

}  // namespace kiln
