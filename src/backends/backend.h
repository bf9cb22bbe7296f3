// Backend: the narrow interface every compute backend implements. It owns memory (allocate, upload,
// download, copy), prepares weights once at load (prepare_weight), and runs the programs models record
// (ops/program.h), each as a whole. No silent fallback: a program with an op the backend does not support is
// unimplemented, naming the op.
//
// Ordering: run(), upload(), download() and copy() happen in the order they are called, as on one device
// stream; a device backend may return before the work is done. synchronize() waits for all of it and returns
// the first error an asynchronous kernel raised. The data of a download() is in host memory only once
// synchronize() returned ok.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/buffer.h"
#include "core/status.h"
#include "core/tensor.h"
#include "ops/collective.h"
#include "ops/ops.h"
#include "ops/program.h"

namespace kiln {

// What a weight is used for; a backend may choose its layout by it (e.g. repack matmul weights, keep
// embeddings in the file's format for row gathers).
enum class WeightRole : uint8_t {
  weight_role_embedding,       // get_rows table
  weight_role_tied_embedding,  // get_rows table that is also the output head (Matmul w)
  weight_role_matmul,          // Matmul w
  weight_role_expert_matmul,   // MoeMatmul w [k, n, n_expert]
  weight_role_norm,            // RmsNorm / LayerNorm weight or bias vector
  weight_role_bias,            // Binary add operand
  weight_role_rope_factors,    // Rope freq_factors
};
std::string_view weight_role_name(WeightRole role);

// A weight as a backend holds it, made once at load by prepare_weight().
struct WeightHandle {
  std::string name;  // the GGUF tensor name; a row slice of a fused tensor: "blk.0.attn_qkv.weight[q]"
  WeightRole role = WeightRole::weight_role_matmul;
  Tensor logical;      // the file's view: GGUF type, shape and bytes in host memory (the mapped file)
  ops::Weight weight;  // what ops read: a view of `logical` (CPU) or of `storage`, and `prepared`
  std::unique_ptr<Buffer> storage;                // the backend's copy of the bytes (device memory), or null
  std::unique_ptr<ops::PreparedWeight> prepared;  // the backend's own layout, or null; weight.prepared -> it
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  // Whether its memory is the host's (the CPU backend: the host reads its buffers in place, and a model on it
  // has no layers to place anywhere else); false: a device with memory of its own (a GPU).
  virtual bool host_memory() const = 0;
  // The KV cache type it runs best with, what EngineOptions::kv_type "auto" picks: f16 where its fast
  // precision reads f16 K/V (a GPU's tensor cores, as llama.cpp's default cache), else f32.
  virtual DType preferred_kv_type() const { return DType::f32; }
  // Whether run() accepts this op with these operand types (destination float types included).
  virtual bool supports(const ops::Op& op) const = 0;
  // Runs the ops of `program` in order, as one unit (the program's ops were check()ed when recorded).
  // unimplemented naming the first op that supports() refuses, before running any.
  virtual Status run(const Program& program) = 0;
  // Runs one op: check()ed (invalid_argument naming the op and operand), then as a program of one.
  Status run(const ops::Op& op);

  // `bytes` of backend memory (64-byte aligned). resource_exhausted when it cannot.
  virtual Result<std::unique_ptr<Buffer>> allocate(size_t bytes) = 0;
  // `bytes` of host memory (host_visible) that this backend's upload() and download() move fastest: a GPU's
  // page-locked memory, the CPU's own. unimplemented by default; resource_exhausted when it cannot.
  virtual Result<std::unique_ptr<Buffer>> allocate_host(size_t bytes);
  // Host -> `dst` (a contiguous tensor in this backend's memory, `bytes` = its size), and back.
  // invalid_argument when the sizes differ.
  virtual Status upload(const Tensor& dst, const void* src, size_t bytes) = 0;
  virtual Status download(void* dst, const Tensor& src, size_t bytes) = 0;
  // dst = src, two contiguous tensors of the same type and shape in this backend's memory.
  virtual Status copy(const Tensor& dst, const Tensor& src) = 0;
  // Waits for everything issued so far; the first asynchronous error, if any.
  virtual Status synchronize() = 0;

  // The backend's form of the weight `logical` (a view into host memory that outlives the handle), made once
  // at load: a device copy, a repacked layout, side tensors such as scales. `name` and `role` say what it is
  // (the quantization tools map a matmul input back to its weight by name).
  virtual Result<std::unique_ptr<WeightHandle>> prepare_weight(const Tensor& logical, std::string_view name,
                                                               WeightRole role) = 0;
  // prepare_weight, telling `read_done` (from any thread, in any order) of byte ranges of `logical` that it
  // has finished reading, so that the loader can hand their file pages back while the rest is still being
  // copied: a large tensor's file pages and its copy are then never resident together. The default tells
  // nothing (the loader hands the pages back once prepare_weight returns).
  using ReadDone = std::function<void(const void* p, size_t n)>;
  virtual Result<std::unique_ptr<WeightHandle>> prepare_weight_reporting(const Tensor& logical,
                                                                         std::string_view name,
                                                                         WeightRole role,
                                                                         const ReadDone& read_done) {
    (void)read_done;
    return prepare_weight(logical, name, role);
  }

  // prepare_weight_reporting for matrices [k, n_i] of one type that the model multiplies by the same x (Q, K
  // and V), in that order: a backend may lay their rows out as one matrix [k, sum n_i], so that one matmul
  // computes them all (a GEMM of several parts costs hardly more than one of the largest). The handles come
  // back in the order of `logicals`. The default prepares each on its own.
  virtual Result<std::vector<std::unique_ptr<WeightHandle>>> prepare_weight_group(
      std::span<const Tensor> logicals, std::span<const std::string> names, WeightRole role,
      const ReadDone& read_done);

  // Worker threads the backend uses (CPU) or 1.
  virtual int n_threads() const { return 1; }
  // The precision it computes Matmul, MoeMatmul and Attention at (BackendOptions::precision).
  virtual ops::Precision precision() const { return ops::Precision::precision_exact; }
  // How its precision_fast products round: 0 = x through ops::activation_type() exactly as the reference
  // does (the CPU's q8 blocks); > 0 = the backend's own lower-precision products (a GPU's bf16 / f16 tensor
  // cores, a GPU's e4m3 ones for FP8 weights), within this relative L2 error of the exact product, for
  // products with a weight of this type.
  virtual double fast_tolerance(DType weight) const {
    (void)weight;
    return 0.0;
  }
  // Free bytes of the backend's own memory (a GPU's), which the KV cache is sized by; 0 for host memory.
  virtual uint64_t device_memory_free() const { return 0; }
  // Bytes the backend holds as its kernels' own scratch (beyond the buffers it was asked for), as of now.
  virtual uint64_t scratch_bytes() const { return 0; }
  // The rows a decode step of `rows` sequences is best padded to (models' pad_decode): a backend that
  // replays recorded steps records one per size it returns. `rows` itself: no padding.
  virtual int32_t padded_rows(int32_t rows) const { return rows; }
  // The most rows a step may have and still replay as a recorded step; 0: no step replays (each launches
  // its ops), so no size makes a step's cost jump.
  virtual int32_t replayed_rows_max() const { return 0; }
  // One line on how the backend ran the programs it was given (e.g. CUDA graphs replayed and captured), for
  // KILN_STEP_PROFILE; empty: nothing to say.
  virtual std::string profile_summary() const { return {}; }
};

// The check every backend's upload/download/copy makes: `t` is contiguous, in host-visible memory or a buffer
// of the backend, and holds exactly `bytes`.
Status check_transfer(std::string_view what, const Tensor& t, size_t bytes);
// The check every backend's copy makes: dst and src of one type and shape, each passing check_transfer; the
// bytes to copy.
Result<size_t> check_copy(std::string_view what, const Tensor& dst, const Tensor& src);

// Whether this build has the CUDA backend and a CUDA device is usable (what "auto" picks).
bool cuda_available();
// The device a backend name "cuda" (0) or "cuda:N" (N, at most 4 digits) names; invalid_argument otherwise.
Result<int> cuda_device_index(std::string_view name);

struct BackendOptions {
  int n_threads = 0;  // CPU: 0 = default_thread_count(); at most kMaxThreadsPerCore per core (16 at least)
  // Every Matmul, MoeMatmul and Attention the backend runs (ops::Precision): exact f32 products, or the
  // faster lower-precision ones (`kiln run`'s default; `--exact` turns them off).
  ops::Precision precision = ops::Precision::precision_exact;
  // CPU: the kernels' ISA level, "scalar", "avx2", "avx512", "avx512vnni" or "amx"; "" = KILN_CPU_ISA when
  // set, else the best this CPU runs. A level the CPU cannot run is an error.
  std::string cpu_isa = {};
  // A row's result independent of the other rows of the step (EngineOptions::deterministic): the CPU's
  // kernels always are; a GPU then keeps one kernel and one reduction order per op whatever the batch.
  bool batch_invariant = false;
};
inline constexpr int kMaxThreadsPerCore = 4;
// An error naming the bound when n_threads is negative or more than kMaxThreadsPerCore per core (16 at
// least).
Status check_thread_count(int n_threads);

// "cpu" (always), "cuda" / "cuda:N" (when built with it), or "auto": CUDA device 0 when this build has CUDA
// and the device is usable, else the CPU. not_found naming the available ones otherwise; a thread count out
// of range is invalid_argument.
Result<std::unique_ptr<Backend>> make_backend(std::string_view name, const BackendOptions& options = {});

// The tensor-parallel group whose rank r runs on ranks[r] (ops/collective.h): a HostGroup when every backend
// works in host memory (the CPU), NCCL's when every one is a CUDA backend, each on a device of its own
// (backends/cuda/nccl_group.h; unimplemented when NCCL cannot be loaded). invalid_argument for no ranks or a
// mix. The group outlives the backends' runs of its collectives: destroy it after the backends.
Result<std::unique_ptr<CollectiveGroup>> make_collective_group(std::span<Backend* const> ranks);

}  // namespace kiln
