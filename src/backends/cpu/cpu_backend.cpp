#include "backends/cpu/cpu_backend.h"

#include <cstdlib>
#include <new>

#include "backends/cpu/cpu_ops.h"

namespace kiln {

namespace {

class HostBuffer final : public Buffer {
 public:
  HostBuffer(void* p, size_t n) : p_(p), n_(n) {}
  ~HostBuffer() override { std::free(p_); }
  void* data() override { return p_; }
  size_t size() const override { return n_; }

 private:
  void* p_;
  size_t n_;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int n_threads) : pool_(n_threads) {}
  std::string_view name() const override { return "cpu"; }
  bool supports(const ops::Op&) const override { return true; }  // every op, every type with a dequantizer
  Status run(const ops::Op& op) override {
    KILN_TRY(ops::check(op));
    cpu::run(pool_, op);
    return Status::ok_status();
  }
  Result<std::unique_ptr<Buffer>> allocate(size_t bytes) override {
    const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (p == nullptr) return resource_exhausted("cpu backend: cannot allocate {} bytes", bytes);
    return std::unique_ptr<Buffer>(new HostBuffer(p, bytes));
  }
  bool host_memory() const override { return true; }
  void synchronize() override {}
  int n_threads() const override { return pool_.n_threads(); }

 private:
  ThreadPool pool_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options) {
  return std::make_unique<CpuBackend>(options.n_threads);
}

}  // namespace kiln
