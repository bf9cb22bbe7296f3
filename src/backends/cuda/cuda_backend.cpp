#include "backends/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "backends/cuda/cuda_graph.h"
#include "backends/cuda/cuda_handles.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_op_profile.h"
#include "backends/cuda/nccl_group.h"
#include "core/log.h"
#include "core/overloaded.h"

namespace kiln {

namespace {

// A failed CUDA call as a Status naming the call and CUDA's reason.
Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::ok_status();
  return make_status(StatusCode::internal, "cuda: {} failed: {} ({})", what, cudaGetErrorString(e),
                     cudaGetErrorName(e));
}
#define KILN_CUDA_TRY(call) KILN_TRY(cuda_status((call), #call))

// The backend's stream, shared with every buffer it allocated: a buffer that outlives the backend still frees
// in stream order, and the stream is destroyed (after its work finished) when the last owner lets go.
using Stream = std::shared_ptr<CUstream_st>;
Stream make_stream_owner(cudaStream_t s) {
  return Stream(s, [](cudaStream_t st) {
    cudaStreamSynchronize(st);
    cudaStreamDestroy(st);
  });
}

// n bytes at p that `release` hands back when the buffer goes: device memory (cudaFreeAsync on the backend's
// stream: stream-ordered, after the work already queued that may read it) or page-locked host memory
// (cudaHostAlloc: transfers to and from it run at the link's speed, without staging; cudaFreeHost waits for
// the device first).
class CudaBuffer final : public Buffer {
 public:
  CudaBuffer(void* p, size_t n, bool host_visible, std::function<void(void*)> release)
      : p_(p), n_(n), host_visible_(host_visible), release_(std::move(release)) {}
  ~CudaBuffer() override { release_(p_); }
  void* data() override { return p_; }
  size_t size() const override { return n_; }
  bool host_visible() const override { return host_visible_; }

 private:
  void* p_;
  size_t n_;
  bool host_visible_;
  std::function<void(void*)> release_;
};

// A weight's rows within the allocation that the weights prepared together share (prepare_weight_group);
// the allocation goes with the last of them.
class SliceBuffer final : public Buffer {
 public:
  SliceBuffer(std::shared_ptr<Buffer> whole, size_t offset, size_t n)
      : whole_(std::move(whole)), offset_(offset), n_(n) {}
  void* data() override { return static_cast<char*>(whole_->data()) + offset_; }
  size_t size() const override { return n_; }
  bool host_visible() const override { return false; }

 private:
  std::shared_ptr<Buffer> whole_;
  size_t offset_;
  size_t n_;
};

// A cuBLAS handle, destroyed after the work queued on its stream.
struct CublasDeleter {
  void operator()(cublasContext* h) const { cublasDestroy(h); }
};
using Cublas = std::unique_ptr<cublasContext, CublasDeleter>;

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, cudaStream_t stream, Cublas cublas, int n_sms, std::string name,
              const CudaOptions& options)
      : device_(device),
        owner_(make_stream_owner(stream)),
        stream_(stream),
        cublas_(std::move(cublas)),
        handles_(stream),
        name_(std::move(name)) {
    ctx_.stream = stream_;
    ctx_.cublas = cublas_.get();
    ctx_.n_sms = n_sms;
    ctx_.options = options;
    ctx_.fast = options.precision == ops::Precision::precision_fast;
    // Programmatic dependent launches (sm_90 and newer) unless options.pdl is off. Measured on an H100 with
    // the launch trigger after the GEMV's and attention's main loops: decode 2% faster on an 8B model, 7-13%
    // on a 135M one (docs/cuda.md).
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    ctx_.pdl = major >= 9 && options.pdl;
    ctx_.clusters = major >= 9;
    ctx_.wgmma = major == 9 && minor == 0;
    ctx_.scratch_fn = [](void* self, int slot, size_t bytes) {
      return static_cast<CudaBackend*>(self)->scratch(slot, bytes);
    };
    ctx_.owner = this;
    ctx_.solver_fn = [](void* self) { return static_cast<CudaBackend*>(self)->handles_.solver(); };
    ctx_.lt_fn = [](void* self) { return static_cast<CudaBackend*>(self)->handles_.lt(); };
    profile_ =
        options.profile && cudaEventCreate(&start_) == cudaSuccess && cudaEventCreate(&stop_) == cudaSuccess;
    // cuBLAS gets a workspace of its own up front, so that a captured GEMM never allocates.
    if (cudaMallocAsync(&cublas_ws_, kCublasWorkspace, stream_) == cudaSuccess) {
      cublasSetWorkspace(cublas_.get(), cublas_ws_, kCublasWorkspace);
    } else {
      cudaGetLastError();
      cublas_ws_ = nullptr;
    }
  }
  ~CudaBackend() override {
    for (GraphEntry& g : graphs_) cudaGraphExecDestroy(g.exec);
    if (profile_) {
      op_profile_.print(name_);
      cudaEventDestroy(start_);
      cudaEventDestroy(stop_);
    }
    for (Scratch& s : scratch_) {
      if (s.p != nullptr) cudaFreeAsync(s.p, stream_);
    }
    if (cublas_ws_ != nullptr) {
      cublasSetWorkspace(cublas_.get(), nullptr, 0);
      cudaFreeAsync(cublas_ws_, stream_);
    }
  }
  using Backend::run;
  int device() const { return device_; }
  std::string_view name() const override { return name_; }
  // Decode steps that go through a graph, padded to 1, 2, 4, then a multiple of 8 rows (11 sizes up to 64),
  // as vLLM's capture sizes: a served batch changes size almost every step as requests end and start.
  int32_t padded_rows(int32_t rows) const override {
    if (ctx_.options.graphs <= 0 || profile_ || rows < 1 || rows > graph_max_tokens()) return rows;
    return rows <= 2 ? rows : rows <= 4 ? 4 : (rows + 7) / 8 * 8;
  }
  int32_t replayed_rows_max() const override {
    return ctx_.options.graphs <= 0 || profile_ ? 0 : graph_max_tokens();
  }
  bool supports(const ops::Op& op) const override { return cuda::supports(op); }
  Status run(const Program& program) override {
    if (program.version() != supported_version_) {  // a program run again unchanged was checked before
      for (const ops::Op& op : program.ops()) {
        if (!supports(op)) {
          const Tensor* dst = ops::float_dst(op);
          // The weight's type, where the op has one: the types the kernels read are listed in
          // matmul/dequant.cuh.
          const Tensor* w =
              std::visit(Overloaded{[](const ops::GetRows& o) { return &o.table.tensor; },
                                    [](const ops::Matmul& o) { return &o.w.tensor; },
                                    [](const ops::MoeMatmul& o) { return &o.w.tensor; },
                                    [](const auto&) { return static_cast<const Tensor*>(nullptr); }},
                         op);
          return unimplemented("{}: {} with these operand types has no CUDA kernel{}{}", name_,
                               ops::op_name(op),
                               w != nullptr ? fmt::format(" (weight type {})", dtype_name(w->type)) : "",
                               dst != nullptr ? fmt::format(" (destination {})", dtype_name(dst->type)) : "");
        }
      }
      supported_version_ = program.version();
      nccl_ = cuda::nccl_ranks(program.ops());
    }
    KILN_TRY(select());
    if (ctx_.options.graphs > 0 && !profile_ && program.n_tokens > 0 &&
        program.n_tokens <= graph_max_tokens()) {
      KILN_ASSIGN_OR_RETURN(const bool replayed, run_as_graph(program));
      if (replayed) return Status::ok_status();
    }
    ++graph_stats_.eager;
    const std::vector<ops::Op>& ops = program.ops();
    for (size_t i = 0; i < ops.size();) {
      if (profile_) KILN_CUDA_TRY(cudaEventRecord(start_, stream_));
      const auto t0 = std::chrono::steady_clock::now();
      size_t n = 0;
      if (const cudaError_t e = enqueue(ops, i, n); e != cudaSuccess) {
        cudaGetLastError();
        KILN_TRY(cuda::collective_error(ops[i]));  // NCCL's reason, or the group's abort
        return make_status(StatusCode::internal, "{}: {} failed to launch: {} ({})", name_,
                           ops::op_name(ops[i]), cudaGetErrorString(e), cudaGetErrorName(e));
      }
      if (profile_) KILN_TRY(record_profile(ops[i], n, t0));
      i += n;
    }
    return Status::ok_status();
  }
  bool host_memory() const override { return false; }
  std::string profile_summary() const override {
    const GraphStats& g = graph_stats_;
    return fmt::format(
        "{}: {} programs replayed as graphs, {} captured ({} updated in place, {:.1f} ms in all), {} "
        "launched "
        "op by op; {} graphs kept",
        name_, g.launched - g.captured, g.captured, g.updated, g.capture_ms, g.eager, graphs_.size());
  }
  DType preferred_kv_type() const override { return ctx_.fast ? DType::f16 : DType::f32; }
  ops::Precision precision() const override {
    return ctx_.fast ? ops::Precision::precision_fast : ops::Precision::precision_exact;
  }
  // precision_fast matmuls run on tensor cores in bf16 / f16, f8_e4m3 weights' in e4m3 (matmul/matmul.cu).
  double fast_tolerance(DType weight) const override { return weight == DType::f8_e4m3 ? 5e-2 : 1e-2; }
  uint64_t scratch_bytes() const override {
    uint64_t total = 0;
    for (const Scratch& s : scratch_) total += s.bytes;
    return total;
  }
  uint64_t device_memory_free() const override {
    size_t free = 0, total = 0;
    if (cudaSetDevice(device_) != cudaSuccess || cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
    return free;
  }
  Result<std::unique_ptr<Buffer>> allocate(size_t bytes) override {
    KILN_TRY(select());
    void* p = nullptr;
    const size_t rounded = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
    if (cudaMallocAsync(&p, rounded, stream_) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error state of a failed allocation
      return resource_exhausted("{}: cannot allocate {} bytes of device memory", name_, bytes);
    }
    return std::unique_ptr<Buffer>(
        new CudaBuffer(p, bytes, false, [stream = owner_](void* q) { cudaFreeAsync(q, stream.get()); }));
  }
  Result<std::unique_ptr<Buffer>> allocate_host(size_t bytes) override {
    KILN_TRY(select());
    void* p = nullptr;
    if (cudaHostAlloc(&p, std::max<size_t>(bytes, 1), cudaHostAllocPortable) != cudaSuccess) {
      cudaGetLastError();
      return resource_exhausted("{}: cannot allocate {} bytes of page-locked host memory", name_, bytes);
    }
    return std::unique_ptr<Buffer>(new CudaBuffer(p, bytes, true, [](void* q) { cudaFreeHost(q); }));
  }
  Status upload(const Tensor& dst, const void* src, size_t bytes) override {
    KILN_TRY(check_transfer("cuda upload", dst, bytes));
    KILN_TRY(select());
    KILN_CUDA_TRY(cudaMemcpyAsync(dst.data, src, bytes, cudaMemcpyHostToDevice, stream_));
    return Status::ok_status();
  }
  Status download(void* dst, const Tensor& src, size_t bytes) override {
    KILN_TRY(check_transfer("cuda download", src, bytes));
    KILN_TRY(select());
    KILN_CUDA_TRY(cudaMemcpyAsync(dst, src.data, bytes, cudaMemcpyDeviceToHost, stream_));
    return Status::ok_status();
  }
  Status copy(const Tensor& dst, const Tensor& src) override {
    KILN_ASSIGN_OR_RETURN(const size_t bytes, check_copy("cuda copy", dst, src));
    KILN_TRY(select());
    KILN_CUDA_TRY(cudaMemcpyAsync(dst.data, src.data, bytes, cudaMemcpyDeviceToDevice, stream_));
    return Status::ok_status();
  }
  Status synchronize() override {
    KILN_TRY(select());
    KILN_CUDA_TRY(cudaStreamSynchronize(stream_));
    return cuda_status(cudaGetLastError(), "a kernel launched earlier");
  }
  // A device copy of the weight, uploaded once; ops read it there. A view (a row slice of a fused tensor)
  // keeps its strides: the bytes it spans travel, gaps included.
  Result<std::unique_ptr<WeightHandle>> prepare_weight(const Tensor& logical, std::string_view name,
                                                       WeightRole role) override {
    int64_t span = logical.n_elements() == 0 ? 0 : logical.row_bytes();
    for (int d = 1; d < 4; ++d) span += (logical.ne[d] - 1) * logical.nb[d];
    if (logical.nb[0] != dtype_info(logical.type).type_size || span < 0) {
      return invalid_argument("{}: weight {} is not a view with contiguous rows ({})", name_, name,
                              logical.describe());
    }
    const auto bytes = static_cast<size_t>(span);
    auto h = std::make_unique<WeightHandle>();
    h->name = std::string(name);
    h->role = role;
    h->logical = logical;
    KILN_ASSIGN_OR_RETURN(h->storage, allocate(bytes));
    if (bytes > 0) {
      KILN_TRY(select());
      KILN_CUDA_TRY(
          cudaMemcpyAsync(h->storage->data(), logical.data, bytes, cudaMemcpyHostToDevice, stream_));
    }
    Tensor device = logical;
    device.data = h->storage->data();
    device.buffer = h->storage.get();
    // Product weights of the legacy block types and of Q6_K go to grouped form, FP8 ones of one scale a row
    // to row form (cuda_kernels.h: WeightLayout), which the GEMVs read in whole 16-byte loads, the staged
    // GEMV only; the file's form is freed (in stream order). That includes a table that is also the output
    // head (GetRows reads grouped rows too) and the experts of a MoE matmul, whose matrices follow one
    // another (rows of all experts grouped as one matrix).
    const bool product = role == WeightRole::weight_role_matmul ||
                         role == WeightRole::weight_role_tied_embedding ||
                         role == WeightRole::weight_role_expert_matmul;
    const int64_t rows = logical.ne[1] * logical.ne[2];
    if (const int64_t row = cuda::grouped_row_bytes(std::span<const Tensor>(&logical, 1));
        ctx_.options.grouped_weights && product && row > 0 && rows > 0 && logical.ne[3] == 1 &&
        (logical.ne[2] == 1 || logical.nb[2] == logical.nb[1] * logical.ne[1])) {
      const bool fp8 = logical.type == DType::f8_e4m3;  // with its vector of row scales after the rows
      KILN_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> grouped,
                            allocate(static_cast<size_t>(row * rows + (fp8 ? rows * 4 : 0))));
      Tensor flat = device;  // the experts' matrices as one
      flat.ne[1] = rows;
      flat.ne[2] = 1;
      KILN_CUDA_TRY(cuda::group_rows(ctx_, flat, grouped->data(), row));
      float* scales =
          fp8 ? reinterpret_cast<float*>(static_cast<char*>(grouped->data()) + row * rows) : nullptr;
      if (fp8) KILN_CUDA_TRY(cuda::fp8_row_scale_vector(ctx_, grouped->data(), row, rows, scales));
      h->storage = std::move(grouped);
      device.data = h->storage->data();
      device.buffer = h->storage.get();
      device.nb[1] = row;
      device.nb[2] = row * logical.ne[1];
      device.nb[3] = row * rows;
      h->prepared = std::make_unique<cuda::WeightLayout>(true, nullptr, scales);
    }
    h->weight = ops::Weight(device);
    h->weight.prepared = h->prepared.get();
    return h;
  }
  // Matmul weights of one type and k whose rows are plain (the file's tensors, or row slices of a fused one)
  // go into one allocation as one matrix [k, sum n_i], in grouped form for the grouped types, each
  // handle's storage its slice of it (cuda_kernels.h: WeightLayout); anything else is prepared weight by
  // weight.
  Result<std::vector<std::unique_ptr<WeightHandle>>> prepare_weight_group(
      std::span<const Tensor> logicals, std::span<const std::string> names, WeightRole role,
      const ReadDone& read_done) override {
    bool stack = ctx_.options.stack_weights && role == WeightRole::weight_role_matmul &&
                 logicals.size() >= 2 && names.size() == logicals.size();
    for (const Tensor& t : logicals) {
      stack = stack && t.type == logicals[0].type && t.ne[0] == logicals[0].ne[0] && t.ne[1] > 0 &&
              t.ne[2] == 1 && t.ne[3] == 1 && t.nb[0] == dtype_info(t.type).type_size &&
              t.nb[1] == t.row_bytes();
    }
    if (!stack) return Backend::prepare_weight_group(logicals, names, role, read_done);
    const DType type = logicals[0].type;
    const int64_t k = logicals[0].ne[0], file_row = logicals[0].row_bytes();
    int64_t rows = 0;
    for (const Tensor& t : logicals) rows += t.ne[1];
    KILN_TRY(select());
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> file_form, allocate(static_cast<size_t>(rows * file_row)));
    auto* at = static_cast<char*>(file_form->data());
    for (const Tensor& t : logicals) {
      const auto bytes = static_cast<size_t>(t.ne[1] * file_row);
      KILN_CUDA_TRY(cudaMemcpyAsync(at, t.data, bytes, cudaMemcpyHostToDevice, stream_));
      at += bytes;
    }
    std::shared_ptr<Buffer> whole = std::move(file_form);
    int64_t row = file_row;
    const int64_t grouped_row = cuda::grouped_row_bytes(logicals);
    const bool grouped = ctx_.options.grouped_weights && grouped_row > 0;
    const bool fp8 = grouped && type == DType::f8_e4m3;  // with its vector of row scales after the rows
    float* scales = nullptr;
    if (grouped) {
      Tensor src = make_tensor(type, whole->data(), k, rows);
      src.buffer = whole.get();
      KILN_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> g,
                            allocate(static_cast<size_t>(rows * grouped_row + (fp8 ? rows * 4 : 0))));
      KILN_CUDA_TRY(cuda::group_rows(ctx_, src, g->data(), grouped_row));
      if (fp8) {
        scales = reinterpret_cast<float*>(static_cast<char*>(g->data()) + rows * grouped_row);
        KILN_CUDA_TRY(cuda::fp8_row_scale_vector(ctx_, g->data(), grouped_row, rows, scales));
      }
      whole = std::move(g);  // the file's form is freed in stream order
      row = grouped_row;
    }
    std::vector<std::unique_ptr<WeightHandle>> handles;
    int64_t first = 0;
    for (size_t i = 0; i < logicals.size(); ++i) {
      const Tensor& logical = logicals[i];
      auto h = std::make_unique<WeightHandle>();
      h->name = names[i];
      h->role = role;
      h->logical = logical;
      h->storage = std::make_unique<SliceBuffer>(whole, static_cast<size_t>(first * row),
                                                 static_cast<size_t>(logical.ne[1] * row));
      Tensor device = logical;
      device.data = h->storage->data();
      device.buffer = h->storage.get();
      device.nb[1] = row;
      device.nb[2] = device.nb[3] = row * logical.ne[1];
      h->prepared = std::make_unique<cuda::WeightLayout>(grouped, whole->data(),
                                                         scales != nullptr ? scales + first : nullptr);
      h->weight = ops::Weight(device);
      h->weight.prepared = h->prepared.get();
      handles.push_back(std::move(h));
      first += logical.ne[1];
    }
    return handles;
  }

 private:
  // The calling thread's device made this one, unless it is already (cudaSetDevice costs more than asking).
  Status select() {
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current == device_) return Status::ok_status();
    return cuda_status(cudaSetDevice(device_), "cudaSetDevice");
  }

  // Decode steps (few tokens a request, up to 64 requests) go through a CUDA graph (cuda_graph.h): replayed
  // when the program is the one captured last, else captured and launched. false: not run (the capture
  // failed, for one because scratch had to grow, which a capture must not do): the caller runs the ops one by
  // one, and the next identical program is captured. Programs of more than 8 tokens take cuBLAS GEMMs: after
  // kGraphMaxFailures captures of those fail in a row, only GEMV-sized programs are captured.
  static constexpr int32_t kGraphMaxTokens = 64, kGraphMaxTokensSafe = 8, kGraphMaxFailures = 3;
  int32_t graph_max_tokens() const {
    return graph_failures_ < kGraphMaxFailures ? kGraphMaxTokens : kGraphMaxTokensSafe;
  }
  static constexpr size_t kCublasWorkspace = size_t{32} << 20;
  static constexpr int64_t kL2Ahead = int64_t{8} << 20;  // the next matmuls' weights up to this size: enqueue
  // A captured step: replayed whenever a program of the same signature comes again.
  struct GraphEntry {
    std::vector<uint64_t> sig;  // cuda::program_signature, then the scratch pointers
    cudaGraphExec_t exec = nullptr;
    uint64_t version = 0;  // Program::version() of the program it was captured from or matched last
    std::array<void*, cuda::kScratchSlots> scratch{};  // scratch_ when it was captured
    std::vector<uint64_t> shape;                       // graph_shape of its graph
    uint64_t used = 0;                                 // graph_clock_ when it was launched last
  };
  struct GraphStats {
    int64_t launched = 0, captured = 0, updated = 0, eager = 0;
    double capture_ms = 0;  // capturing, updating or instantiating, and the first launch
  };
  Result<bool> run_as_graph(const Program& program) {
    // The scratch a graph was captured with must still be there: one grown since (and the old freed) differs.
    std::array<void*, cuda::kScratchSlots> scratch{};
    for (size_t i = 0; i < scratch.size(); ++i) scratch[i] = scratch_[i].p;
    ++graph_clock_;
    // A program a graph was captured from or matched, unchanged since (its version), needs no signature.
    for (size_t i = 0; i < graphs_.size(); ++i) {
      if (program.version() == graphs_[i].version && scratch == graphs_[i].scratch)
        return launch_graph(graphs_[i]);
    }
    std::vector<uint64_t> sig = cuda::program_signature(program);
    for (void* p : scratch) sig.push_back(reinterpret_cast<uint64_t>(p));
    for (size_t i = 0; i < graphs_.size(); ++i) {
      if (graphs_[i].sig != sig) continue;
      graphs_[i].version = program.version();
      return launch_graph(graphs_[i]);
    }
    const auto t0 = std::chrono::steady_clock::now();
    KILN_CUDA_TRY(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    capturing_ = true;
    capture_needs_scratch_ = false;
    cudaError_t launched = cudaSuccess;
    const std::vector<ops::Op>& ops = program.ops();
    for (size_t i = 0, n = 0; i < ops.size(); i += n) {
      if (launched = enqueue(ops, i, n); launched != cudaSuccess) break;
    }
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
    if (launched != cudaSuccess || ended != cudaSuccess) {
      if (graph != nullptr) cudaGraphDestroy(graph);
      cudaGetLastError();
      log_debug("{}: the capture of a {}-token step failed ({}, {}{})", name_, program.n_tokens,
                cudaGetErrorName(launched), cudaGetErrorName(ended),
                capture_needs_scratch_ ? "; it needed more scratch" : "");
      // A step that needed more scratch is captured next time (its ops, run one by one, grow it): not a
      // failure of the capture itself.
      if (program.n_tokens > kGraphMaxTokensSafe && !capture_needs_scratch_) ++graph_failures_;
      return false;
    }
    if (program.n_tokens > kGraphMaxTokensSafe) graph_failures_ = 0;
    ++graph_stats_.captured;
    // A new entry while there is room; else the least recently used one takes the graph: updated in place
    // when it has the graph's shape (graph_shape: same kernels, other parameters, cheaper than
    // instantiating), else instantiated anew.
    std::vector<uint64_t> shape = cuda::graph_shape(graph);
    size_t slot = graphs_.size();
    if (graphs_.size() >= static_cast<size_t>(ctx_.options.graphs)) {
      slot = 0;
      for (size_t i = 1; i < graphs_.size(); ++i) {
        if (graphs_[i].used < graphs_[slot].used) slot = i;
      }
    } else {
      graphs_.emplace_back();
    }
    GraphEntry& g = graphs_[slot];
    if (g.exec != nullptr && g.shape != shape) {
      cudaGraphExecDestroy(g.exec);
      g.exec = nullptr;
    }
    if (g.exec != nullptr) {
      cudaGraphExecUpdateResultInfo info{};
      if (cudaGraphExecUpdate(g.exec, graph, &info) != cudaSuccess) {
        cudaGetLastError();
        log_debug(
            "{}: the captured graph did not update in place (cudaGraphExecUpdateResult {}); instantiated "
            "anew",
            name_, static_cast<int>(info.result));
        cudaGraphExecDestroy(g.exec);
        g.exec = nullptr;
      } else {
        ++graph_stats_.updated;
      }
    }
    const cudaError_t made = g.exec != nullptr ? cudaSuccess : cudaGraphInstantiate(&g.exec, graph, 0);
    cudaGraphDestroy(graph);
    if (made != cudaSuccess) {
      graphs_.erase(graphs_.begin() + static_cast<std::ptrdiff_t>(slot));
      return cuda_status(made, "cudaGraphInstantiate");
    }
    g.sig = std::move(sig);
    g.version = program.version();
    g.scratch = scratch;
    g.shape = std::move(shape);
    graph_stats_.capture_ms +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return launch_graph(g);
  }
  Result<bool> launch_graph(GraphEntry& g) {
    g.used = graph_clock_;
    ++graph_stats_.launched;
    const cuda::NcclLaunch entered(nccl_);  // the graph's collectives' groups, not aborted meanwhile
    KILN_TRY(entered.status());
    KILN_CUDA_TRY(cudaGraphLaunch(g.exec, stream_));
    return true;
  }

  // Enqueues ops[i] and sets n = 1, or the fused sequence that starts there and n = its length.
  // A sequence with a matmul in it also gets the weights of the next matmuls when they take at most
  // kL2Ahead bytes (cuda::weights_ahead), which its GEMV sends toward L2 as its blocks finish.
  cudaError_t enqueue(const std::vector<ops::Op>& ops, size_t i, size_t& n) {
    const std::span<const ops::Op> rest = std::span(ops).subspan(i);
    const bool fuse = ctx_.options.fuse;
    cuda::Context ctx = ctx_;
    const size_t len = fuse ? std::max<size_t>(cuda::fused_length(ctx_, rest), 1) : 1;
    bool matmul = false;
    for (size_t j = 0; j < len; ++j) matmul = matmul || std::holds_alternative<ops::Matmul>(rest[j]);
    if (matmul) ctx.ahead = cuda::weights_ahead(ctx_, rest.subspan(len), kL2Ahead);
    n = 0;
    if (fuse) {
      if (const cudaError_t e = cuda::run_fused(ctx, rest, n); e != cudaSuccess) return e;
    }
    if (n > 0) return cudaSuccess;
    n = 1;
    return cuda::run(ctx, ops[i]);
  }

  // CudaOptions::profile: the op's kernels' time (events around it, then a wait) and the host's to enqueue
  // them (cuda_op_profile.h).
  Status record_profile(const ops::Op& op, size_t n, std::chrono::steady_clock::time_point t0) {
    const double enqueue_us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    KILN_CUDA_TRY(cudaEventRecord(stop_, stream_));
    KILN_CUDA_TRY(cudaEventSynchronize(stop_));
    float ms = 0;
    KILN_CUDA_TRY(cudaEventElapsedTime(&ms, start_, stop_));
    op_profile_.add(op, n, ms, enqueue_us);
    return Status::ok_status();
  }

  // Scratch for the kernels (cuda::Context::scratch): grown, never shrunk; the old buffer is freed in stream
  // order, after the kernels queued before that may still read it.
  struct Scratch {
    void* p = nullptr;
    size_t bytes = 0;
  };
  void* scratch(int slot, size_t bytes) {
    if (slot < 0 || slot >= cuda::kScratchSlots) return nullptr;
    Scratch& s = scratch_[static_cast<size_t>(slot)];
    if (bytes <= s.bytes) return s.p;
    if (capturing_) {  // a graph must not allocate: the capture fails, the ops run one by one
      capture_needs_scratch_ = true;
      return nullptr;
    }
    if (s.p != nullptr) cudaFreeAsync(s.p, stream_);
    s = {};
    const size_t grown = std::max(bytes, bytes / 4 * 5);  // room for the next, slightly larger step
    if (cudaMallocAsync(&s.p, grown, stream_) != cudaSuccess) {
      cudaGetLastError();
      s.p = nullptr;
      return nullptr;
    }
    s.bytes = grown;
    if (slot == cuda::kSlotCounters && cudaMemsetAsync(s.p, 0, grown, stream_) != cudaSuccess) {
      cudaGetLastError();
      cudaFreeAsync(s.p, stream_);
      s = {};
      return nullptr;
    }
    return s.p;
  }

  int device_;
  Stream owner_;         // shared with the buffers
  cudaStream_t stream_;  // owner_.get()
  Cublas cublas_;
  cuda::LibraryHandles handles_;  // cuBLASLt, cuSOLVER
  std::string name_;
  cuda::Context ctx_;
  std::array<Scratch, cuda::kScratchSlots> scratch_{};
  bool profile_ = false;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  bool capturing_ = false;
  bool capture_needs_scratch_ = false;  // a kernel asked for more scratch during the capture
  int graph_failures_ = 0;              // captures of programs of more than 8 tokens that failed in a row
  void* cublas_ws_ = nullptr;
  std::vector<GraphEntry> graphs_;  // at most options.graphs
  uint64_t graph_clock_ = 0;        // counts run_as_graph calls: GraphEntry::used
  GraphStats graph_stats_;
  uint64_t supported_version_ = 0;                 // of the last program whose every op supports() took
  std::vector<const cuda::NcclCollective*> nccl_;  // that program's NCCL ranks (cuda::nccl_ranks)
  cuda::OpProfile op_profile_;
};

}  // namespace

bool cuda_device_present() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

int cuda_backend_device(const Backend& backend) {
  const auto* b = dynamic_cast<const CudaBackend*>(&backend);
  return b != nullptr ? b->device() : -1;
}

Result<std::unique_ptr<Backend>> make_cuda_backend(int device, const BackendOptions& backend_options) {
  CudaOptions options = cuda_options_from_env();
  options.precision = backend_options.precision;
  options.batch_invariant = backend_options.batch_invariant;
  return make_cuda_backend(device, options);
}

Result<std::unique_ptr<Backend>> make_cuda_backend(int device, const CudaOptions& options) {
  if (options.gemv_rows != 0 && options.gemv_rows != 1 && options.gemv_rows != 2 && options.gemv_rows != 4 &&
      options.gemv_rows != 8 && options.gemv_rows != 16) {
    return invalid_argument("cuda: gemv_rows is {}; 0 (by shape), 1, 2, 4, 8 or 16", options.gemv_rows);
  }
  if (options.mmq_min_cols < 2 || options.mmq_min_cols > kMmqMaxCols) {
    return invalid_argument("cuda: mmq_min_cols is {}; 2 to {}", options.mmq_min_cols, kMmqMaxCols);
  }
  if (options.staged_gemv_grid < 0) {
    return invalid_argument("cuda: staged_gemv_grid is {}; 0 (the device's fill) or more",
                            options.staged_gemv_grid);
  }
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    return unimplemented("cuda: no usable CUDA driver or device: {} ({})", cudaGetErrorString(e),
                         cudaGetErrorName(e));
  }
  if (count == 0) return unimplemented("cuda: no CUDA device is present");
  if (device < 0 || device >= count) {
    return invalid_argument("cuda:{}: there are {} CUDA device(s), numbered from 0", device, count);
  }
  KILN_TRY(cuda_status(cudaSetDevice(device), "cudaSetDevice"));
  cudaStream_t stream = nullptr;
  KILN_TRY(cuda_status(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate"));
  cublasHandle_t handle = nullptr;
  if (const cublasStatus_t e = cublasCreate(&handle); e != CUBLAS_STATUS_SUCCESS) {
    cudaStreamDestroy(stream);
    return make_status(StatusCode::internal, "cuda:{}: cublasCreate failed: {}", device,
                       cublasGetStatusString(e));
  }
  Cublas cublas(handle);
  cublasSetStream(handle, stream);
  int n_sms = 0;
  KILN_TRY(cuda_status(cudaDeviceGetAttribute(&n_sms, cudaDevAttrMultiProcessorCount, device),
                       "cudaDeviceGetAttribute"));
  // Keep freed memory in the pool between steps instead of returning it to the driver.
  cudaMemPool_t pool = nullptr;
  if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
    uint64_t keep = UINT64_MAX;
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
  }
  std::string name = "cuda:" + std::to_string(device);
  log_debug("{}: options: {}", name, describe(options));
  return std::unique_ptr<Backend>(
      new CudaBackend(device, stream, std::move(cublas), n_sms, std::move(name), options));
}

}  // namespace kiln
