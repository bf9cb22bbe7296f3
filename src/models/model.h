// Model: one architecture's weights and forward pass. forward() is the only way tokens go through a model
// (batch.h): it records the ops of one step into a program (ops/program.h) that the backend runs as a whole.
// Architectures are registered in registry.cpp, one line each; load_model() picks one from the GGUF file's
// general.architecture.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "core/status.h"
#include "core/tensor.h"
#include "formats/gguf.h"
#include "models/batch.h"
#include "ops/collective.h"
#include "ops/program.h"

namespace kiln {

// What the runtime needs to know about a loaded model.
struct ModelInfo {
  std::string architecture;  // "llama"
  std::string name;          // general.name, or the file name
  int32_t n_vocab = 0;
  int32_t n_ctx_train = 0;  // context length the model was trained for
  int32_t n_layers = 0;
  int32_t n_embd = 0;
  int32_t n_kv_heads = 0;  // per layer (the KV pools' second dimension)
  int32_t head_dim = 0;    // per head (the KV pools' first dimension)
  int32_t kv_window =
      0;                 // every layer attends only to the last kv_window positions (0: some layer reads all)
  int64_t n_params = 0;  // elements of all weights
  uint64_t weight_bytes = 0;
};

class Model;

// The paged K/V pools of every layer: k[l], v[l] are [head_dim, n_kv_heads, block_size, n_blocks].
struct KvBuffers {
  std::vector<Tensor> k, v;  // [n_layers]
  int32_t block_size = 0;
  int32_t n_blocks = 0;
  std::vector<std::unique_ptr<Buffer>> storage;
  // Tensor parallelism: k, v and storage are rank 0's pools (its KV heads: ModelInfo::n_kv_heads) and
  // ranks[r - 1] rank r's, each on its rank's backend; empty otherwise.
  std::vector<KvBuffers> ranks;

  // Allocates the pools on `backend`. dtype: f32 or f16.
  static Result<KvBuffers> allocate(Backend& backend, const ModelInfo& info, int32_t block_size,
                                    int32_t n_blocks, DType dtype);
  // The same, each layer's pools on the backend that runs the layer (Model::layer_backend), or every rank's
  // (Model::allocate_kv).
  static Result<KvBuffers> allocate(const Model& model, int32_t block_size, int32_t n_blocks, DType dtype);
  // The bytes of the pools (rank 0's under tensor parallelism: one device's).
  uint64_t bytes() const;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelInfo& info() const = 0;
  // Runs `batch` through the model: checks it once (check_batch), uploads its metadata, records the step's
  // program and has the backend run it. Writes each token's K/V into `kv` (at its position, through its block
  // table). Returns the logits of the rows in batch.logit_rows: f32 [n_vocab, logit_rows.size()] in backend
  // memory, valid until the next forward(); with batch.argmax_vocab, their argmax: i32 [logit_rows.size()]
  // (ops::Argmax: -1 for a row holding a NaN or +inf). Nothing here waits for the backend: read the result
  // with read_logits() / read_token_ids() (or Backend::download, then synchronize()).
  virtual Result<Tensor> forward(const Batch& batch, KvBuffers& kv) = 0;
  // The program of the last forward() (tests, tools: which ops a step runs, on which operands).
  virtual const Program& last_program() const = 0;
  // Every weight as the backend prepared it, in load order, with its GGUF name and role.
  virtual std::span<const std::unique_ptr<WeightHandle>> weights() const = 0;
  // The most scratch memory one step has used (the arenas' peaks, partial offload's weight staging), in
  // bytes.
  virtual size_t peak_scratch_bytes() const = 0;
  // The backend that runs layer `layer` (its weights and K/V live there), and the one that holds forward()'s
  // result: the backend the model was loaded on, unless ModelOptions split the layers over two.
  virtual Backend& layer_backend(int32_t layer) const = 0;
  virtual Backend& output_backend() const = 0;
  // The K/V pools of `n_blocks` blocks of `block_size` tokens for this model (KvBuffers::allocate(model,
  // ...)): each layer's on its backend; under tensor parallelism, every rank's (KvBuffers::ranks).
  virtual Result<KvBuffers> allocate_kv(int32_t block_size, int32_t n_blocks, DType dtype) const;
};

// Downloads `logits` (forward()'s result) into `out` ([n_logits * n_vocab] f32, resized) and waits for the
// backend: the step's first asynchronous error, if any, is returned here.
Status read_logits(Backend& backend, const Tensor& logits, std::vector<float>& out);
// The same for forward()'s token ids under Batch::argmax_vocab ([n_logits] i32).
Status read_token_ids(Backend& backend, const Tensor& ids, std::vector<int32_t>& out);

// How a split model's host stage runs its program (ModelOptions::host_stage), given by the layer above.
class HostStageRunner {
 public:
  virtual ~HostStageRunner() = default;
  // Runs `program` (recorded for `host`, program.n_tokens tokens) as host.run(program) would, any of its ops
  // possibly on `device` (the first stage's backend); returns when the results are in host memory.
  virtual Status run(const Program& program, Backend& host, Backend& device) = 0;
  // Host memory it holds for its own use (staging), in bytes.
  virtual size_t scratch_bytes() const = 0;
};

// Sees each program a model records before it first runs, and may add ops to it: the quantization tools'
// statistics of what the matmuls multiply (quant/imatrix_collector.h). It may insert ops between the model's
// own, never change or remove those. Called once per recording (a step that runs its program again does not
// call it), for each backend's program of a split model.
class ProgramHook {
 public:
  virtual ~ProgramHook() = default;
  // `program`: the ops just recorded for `backend`; the hook replaces it with the program to run.
  virtual Status recorded(Program& program, Backend& backend) = 0;
};

struct ModelOptions {
  // The context the model will serve (0: unknown). Long-context RoPE variants (Phi-3 longrope) pick their
  // frequencies from it, as llama.cpp does.
  int32_t n_ctx = 0;
  // Partial offload (`kiln run --gpu-layers N`): the token embedding and the first `n_first_layers` layers
  // run on the backend load_model() is given, the later layers, the final norm and the output head on `rest`
  // (each layer's weights are prepared on its backend, and its K/V live there: KvBuffers::allocate(model)).
  // A step then runs as two programs, the residual stream copied from the first backend to `rest` between
  // them. rest == nullptr, or n_first_layers >= the model's layers: every layer on the first backend.
  Backend* rest = nullptr;
  int32_t n_first_layers = 0;
  // Split with the first backend a device (a GPU) and `rest` the host: what runs the host layers' program,
  // which may send some of its ops to the device (the runtime's placement unit: runtime/placement/offload.h,
  // the host layers' matmuls of a prompt's step). It must outlive the model. nullptr: `rest` runs it all.
  HostStageRunner* host_stage = nullptr;
  // A step whose metadata has the shapes and places of the step before runs the program recorded for that
  // step again; false: every step is recorded anew.
  bool reuse_program = true;
  // Sees every program recorded (ProgramHook); it must outlive the model. nullptr: programs run as recorded.
  ProgramHook* program_hook = nullptr;
  // Tensor parallelism: the model is one rank's part of a model (models/tp_shard.h's view of the file), and
  // its steps combine their partial sums with the other ranks' through this group (ops/collective.h). It must
  // outlive the model; not with `rest`. nullptr: the whole model. load_tp_model() (models/tp_model.h) sets
  // it.
  const Collective* collective = nullptr;
};

// Loads the architecture named by the file's general.architecture. The file must outlive the model (weights
// are used in place). unimplemented listing the supported architectures for any other.
Result<std::unique_ptr<Model>> load_model(std::shared_ptr<const gguf::File> file, Backend& backend,
                                          const ModelOptions& options = {});
// The architectures load_model() knows, comma-separated.
std::string supported_architectures();

// A Hugging Face folder (config.json + safetensors) as a GGUF file in memory, with the tensor names and
// metadata of the GGUF architecture that config.json's class maps to (models/hf_import.h); load_model() runs
// it, and gguf::copy_into() + Writer save it. force_f32: every tensor as f32 (else as stored; 1-d tensors
// f32). activation_scales: FP8 weights' static activation scales as tensors of their own (for a model to run;
// hf_import::Options). Errors: an unsupported class (listing the supported ones), and the folder's own
// errors.
Result<std::shared_ptr<const gguf::File>> import_hf_folder(const std::string& dir, bool force_f32 = false,
                                                           bool activation_scales = false);

}  // namespace kiln
