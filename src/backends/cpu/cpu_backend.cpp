#include "backends/cpu/cpu_backend.h"

#include <cstdlib>
#include <cstring>

#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/cpu_options.h"
#include "backends/cpu/cpu_pack.h"
#include "core/log.h"
#include "ops/ref/ref.h"

namespace kiln {

namespace {

class HostBuffer final : public Buffer {
 public:
  HostBuffer(void* p, size_t n) : p_(p), n_(n) {}
  ~HostBuffer() override { std::free(p_); }
  void* data() override { return p_; }
  size_t size() const override { return n_; }
  bool host_visible() const override { return true; }

 private:
  void* p_;
  size_t n_;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const cpu::CpuOptions& options)
      : pool_(options.n_threads), options_(options), kernels_(cpu::cpu_kernels(options.isa)) {
    options_.n_threads = pool_.n_threads();
    log_debug("cpu backend: {}", cpu::cpu_options_describe(options_));
  }
  using Backend::run;  // run(op) as well as run(program)
  std::string_view name() const override { return "cpu"; }
  bool host_memory() const override { return true; }
  // Every op, every weight type with a dequantizer; destinations in f32 only.
  bool supports(const ops::Op& op) const override {
    const Tensor* dst = ops::float_dst(op);
    return dst == nullptr || dst->type == DType::f32;
  }
  Status run(const Program& program) override {
    for (const ops::Op& op : program.ops()) {
      if (!supports(op)) {
        return unimplemented("cpu backend: {} with a {} destination is not supported (f32 only)",
                             ops::op_name(op), dtype_name(ops::float_dst(op)->type));
      }
    }
    for (const ops::Op& op : program.ops()) {
      // Tensor parallelism's collectives exchange host memory with the other ranks' threads
      // (ops/collective.h).
      if (const auto* o = std::get_if<ops::AllReduce>(&op)) {
        KILN_TRY(ops::ref::all_reduce(*o));
      } else if (const auto* g = std::get_if<ops::AllGather>(&op)) {
        KILN_TRY(ops::ref::all_gather(*g));
      } else {
        cpu::run(pool_, kernels_, op, options_.precision);
      }
    }
    return Status::ok_status();
  }
  Result<std::unique_ptr<Buffer>> allocate_host(size_t bytes) override { return allocate(bytes); }
  Result<std::unique_ptr<Buffer>> allocate(size_t bytes) override {
    const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (p == nullptr) return resource_exhausted("cpu backend: cannot allocate {} bytes", bytes);
    return std::unique_ptr<Buffer>(new HostBuffer(p, bytes));
  }
  Status upload(const Tensor& dst, const void* src, size_t bytes) override {
    KILN_TRY(check_transfer("cpu upload", dst, bytes));
    std::memcpy(dst.data, src, bytes);
    return Status::ok_status();
  }
  Status download(void* dst, const Tensor& src, size_t bytes) override {
    KILN_TRY(check_transfer("cpu download", src, bytes));
    std::memcpy(dst, src.data, bytes);
    return Status::ok_status();
  }
  Status copy(const Tensor& dst, const Tensor& src) override {
    KILN_ASSIGN_OR_RETURN(const size_t bytes, check_copy("cpu copy", dst, src));
    std::memmove(dst.data, src.data, bytes);
    return Status::ok_status();
  }
  Status synchronize() override { return Status::ok_status(); }  // every call above has finished on return
  // Weights are read in place, from the mapped file, unless this level has a packed kernel for their type
  // (CpuOptions::repack false: none is used): then the product matrices are repacked (cpu_pack.h), those of
  // block-quantized types for precision_fast matmuls (the exact path keeps reading their file blocks), the
  // f32 / f16 / bf16 ones for every matmul; a tied table's rows come from its packed copy.
  Result<std::unique_ptr<WeightHandle>> prepare_weight(const Tensor& logical, std::string_view name,
                                                       WeightRole role) override {
    return prepare_weight_reporting(logical, name, role, {});
  }
  // The packer reports each run of rows it has packed (a few MiB at a time).
  Result<std::unique_ptr<WeightHandle>> prepare_weight_reporting(const Tensor& logical, std::string_view name,
                                                                 WeightRole role,
                                                                 const ReadDone& read_done) override {
    auto h = std::make_unique<WeightHandle>();
    h->name = std::string(name);
    h->role = role;
    h->logical = logical;
    h->weight = ops::Weight(logical);
    const bool product = role == WeightRole::weight_role_matmul ||
                         role == WeightRole::weight_role_expert_matmul ||
                         role == WeightRole::weight_role_tied_embedding;
    if (product && options_.repack) {
      if (std::unique_ptr<cpu::PackedWeight> packed = cpu::pack_weight(pool_, kernels_, logical, read_done)) {
        h->weight.prepared = packed.get();
        h->prepared = std::move(packed);
      }
    }
    const bool vector = role == WeightRole::weight_role_norm || role == WeightRole::weight_role_bias ||
                        role == WeightRole::weight_role_rope_factors;
    if (vector && h->prepared == nullptr) KILN_TRY(copy_to_storage(*h));
    return h;
  }
  int n_threads() const override { return pool_.n_threads(); }
  ops::Precision precision() const override { return options_.precision; }

 private:
  // The weight's bytes copied into memory of this backend, contiguous, and the ops pointed at the copy. For
  // the small vectors (norms, biases, rope factors) that every step reads: the loader then hands their file
  // pages back, and a step reads no file page at all once the product weights are packed (where the page
  // cache holds the file in 2 MiB folios, one read of a 2 KiB norm maps a whole folio into the process).
  Status copy_to_storage(WeightHandle& h) {
    const Tensor& t = h.logical;
    const int64_t row = t.row_bytes(), rows = t.ne[1] * t.ne[2] * t.ne[3];
    KILN_ASSIGN_OR_RETURN(h.storage, allocate(static_cast<size_t>(row * rows)));
    auto* dst = static_cast<uint8_t*>(h.storage->data());
    for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * row, t.flat_row(r), static_cast<size_t>(row));
    // Host memory as the file's bytes are: a plain view (no buffer), as every CPU weight.
    h.weight.tensor = make_tensor(t.type, dst, t.ne[0], t.ne[1], t.ne[2], t.ne[3]);
    return Status::ok_status();
  }

  ThreadPool pool_;
  cpu::CpuOptions options_;
  const cpu::CpuKernels& kernels_;
};

}  // namespace

Result<std::unique_ptr<Backend>> make_cpu_backend(const BackendOptions& options) {
  KILN_ASSIGN_OR_RETURN(const cpu::CpuOptions o, cpu::cpu_options(options));
  return std::unique_ptr<Backend>(new CpuBackend(o));
}

}  // namespace kiln
