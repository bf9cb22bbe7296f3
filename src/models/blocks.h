// The layers every decoder-only transformer is built from: the embedding and output head, attention over the
// paged cache, the gated FFN, norms. Each records its ops into the step's Program (ops/program.h) with
// scratch from the step's Arena; nothing runs until the backend runs the program. Only what every model needs
// lives here; the infrastructure is in arena.h, weights.h, hparams.h and step.h.
#pragma once

#include <string>

#include "models/arena.h"
#include "models/hparams.h"
#include "models/model.h"
#include "models/step.h"
#include "models/weights.h"
#include "ops/collective.h"
#include "ops/program.h"

namespace kiln::blocks {

// The embedding, the final norm and the output head (the embedding itself when output.weight is absent).
struct EmbeddingWeights {
  ops::Weight tok_embd;     // [n_embd, n_vocab]
  ops::Weight output_norm;  // [n_embd]
  ops::Weight output;       // [n_embd, n_vocab]
};
// Reads them and sets info.n_vocab from token_embd.weight: the embedding on the loader's backend, the final
// norm and the output head on `head` (the loader is left placed on it). A tied output head on another
// backend than the embedding is a copy of token_embd.weight there.
// Under tensor parallelism (`ranks` > 1) the output head is the rank's n_vocab / ranks rows of it.
Result<EmbeddingWeights> load_embeddings(const gguf::File& file, WeightLoader& weights, ModelInfo& info,
                                         Backend& head, int32_t ranks = 1);

// The per-layer weights of a standard attention block.
struct AttentionWeights {
  ops::Weight wq, wk, wv, wo;  // [n_embd, n_heads*head_dim] ... [n_heads*head_dim, n_embd]
  ops::Weight bq, bk, bv, bo;  // f32 [rows of the matching weight] biases (Qwen2), or none
  ops::Weight q_norm,
      k_norm;  // [head_dim] RMSNorm of each query / key head before RoPE (Gemma 3, Qwen3), or none
};

// blk.N.attn_{q,k,v,output}.weight of layer `prefix` ("blk.N."), or Q, K and V as row slices of a fused
// attn_qkv.weight [n_embd, (n_heads + 2 n_kv_heads) head_dim] (Phi-3); attn_{q,k,v,output}.bias when present;
// attn_{q,k}_norm.weight when qk_norm.
Result<AttentionWeights> load_attention(WeightLoader& weights, const std::string& prefix, int64_t n_embd,
                                        const AttentionShape& shape, bool qk_norm);

// The weights of a gated FFN.
struct FfnWeights {
  ops::Weight gate, up;  // [n_embd, n_ff]
  ops::Weight down;      // [n_ff, n_embd]
};
// blk.N.ffn_{gate,up,down}.weight, or gate and up as the row halves of a fused ffn_up.weight [n_embd, 2 n_ff]
// when there is no ffn_gate.weight (Phi-3: gate first).
Result<FfnWeights> load_ffn(WeightLoader& weights, const std::string& prefix, int64_t n_embd, int64_t n_ff);

// What a layer records into: the step's program, its scratch, its metadata.
struct Recorder {
  Program& program;
  Arena& arena;
  const StepTensors& step;
  // Tensor parallelism (ModelOptions::collective): this rank's group, whose partial sums attention, the FFNs
  // and the output head combine (reduce(), output_logits()); nullptr: the whole model runs here.
  const Collective* tp = nullptr;
};

// Under tensor parallelism, t (f32 [n, rows], contiguous) becomes the sum of every rank's t (an all-reduce);
// nothing otherwise. attention(), gated_ffn() and moe_ffn() call it on their output before any bias.
Status reduce(Recorder& r, const Tensor& t);

// x = embedding rows of the step's tokens.   x: f32 [n_embd, n_tokens] (from the arena).
Result<Tensor> embed(Recorder& r, const EmbeddingWeights& w, int64_t n_embd);

// out = Wo · attention(rope(Wq·x), rope(Wk·x), Wv·x) over the paged cache of `layer`.   x: f32 [n_embd,
// n_tokens]; out: f32 [n_embd, n_tokens].
Result<Tensor> attention(Recorder& r, const Tensor& x, const AttentionWeights& w, const AttentionShape& shape,
                         const RopeConfig& rope, KvBuffers& kv, int32_t layer);

// out = Wdown · (act(Wgate·x) * (Wup·x)).   x: f32 [n_embd, n_tokens]; out: f32 [n_embd, n_tokens].
// reduced false: each rank's partial sum under tensor parallelism (a MoE layer's shared expert, which the
// layer's one all-reduce adds up with the experts').
Result<Tensor> gated_ffn(Recorder& r, const Tensor& x, const FfnWeights& w, ops::GluKind kind,
                         bool reduced = true);

// out = rms_norm(x) * w.   x, out: f32 [n, rows].
Result<Tensor> rms_norm(Recorder& r, const Tensor& x, const ops::Weight& w, float eps);

// The logits of the step's logit rows: those rows of the residual stream x f32 [n_embd, n_tokens], the final
// RMSNorm, the output head (under tensor parallelism each rank's rows of it, its logits gathered). f32
// [n_vocab, n_logits] in the arena (an empty tensor when n_logits is 0); under StepTensors::argmax_vocab,
// their argmax: i32 [n_logits].
Result<Tensor> output_logits(Recorder& r, const Tensor& x, const EmbeddingWeights& w, float eps,
                             int32_t n_vocab);

// A model whose forward() is: build the step's metadata, record the embedding, the layers and the output head
// (record_embedding(), record_layer(), record_output()), run the program on the backend. Nothing
// synchronizes: the logits stay in backend memory until the runtime reads them. Split over two backends
// (ModelOptions::rest), a step is two programs, one a backend, each with its own metadata and arena, and the
// residual stream goes from the first backend to the second between them (the one wait inside forward()).
class StepModel : public Model {
 public:
  StepModel(Backend& backend, const ModelOptions& options);
  ~StepModel() override;
  const ModelInfo& info() const final { return info_; }
  Result<Tensor> forward(const Batch& batch, KvBuffers& kv) final;
  // The first backend's program, when split.
  const Program& last_program() const final;
  std::span<const std::unique_ptr<WeightHandle>> weights() const final { return weights_; }
  size_t peak_scratch_bytes() const final;
  Backend& layer_backend(int32_t layer) const final { return stages_[layer_stage(layer)]->backend; }
  Backend& output_backend() const final { return stages_.back()->backend; }

 protected:
  // Settles which layers run on which backend (ModelOptions::rest, n_first_layers): call once info_.n_layers
  // is known, before loading any weight. invalid_argument when n_first_layers is negative.
  Status place_layers();
  // The backends that run layers: 1, or 2 when the model is split; the one of `layer`.
  int32_t n_stages() const { return static_cast<int32_t>(stages_.size()); }
  int32_t layer_stage(int32_t layer) const {
    return stages_.size() > 1 && layer >= stages_[1]->first_layer ? 1 : 0;
  }
  Backend& stage_backend(int32_t stage) const { return stages_[stage]->backend; }
  // The ranks of the tensor-parallel group the model is one rank of (ModelOptions::collective), or 1.
  int32_t tp_ranks() const { return options_.collective != nullptr ? options_.collective->world() : 1; }

  // The residual stream after the embedding: f32 [n_embd, n_tokens] from the arena.
  virtual Result<Tensor> record_embedding(Recorder& r) = 0;
  // Layer `layer`, updating x in place; its scratch is given back when it returns (the next layer's).
  virtual Status record_layer(Recorder& r, int32_t layer, const Tensor& x, KvBuffers& kv) = 0;
  // The logits (output_logits()).
  virtual Result<Tensor> record_output(Recorder& r, const Tensor& x) = 0;

  Backend& backend_;
  ModelOptions options_;
  ModelInfo info_;
  std::vector<std::unique_ptr<WeightHandle>> weights_;  // from WeightLoader::release() at load

 private:
  // The part of a step one backend runs: layers [first_layer, the next stage's first_layer).
  struct Stage {
    Stage(Backend& b, Backend* host_of) : backend(b), arena(b, host_of), steps(b) {}
    Backend& backend;
    int32_t first_layer = 0;
    Arena arena;
    StepBuilder steps;
    StepTensors step;
  };
  // A recorded step: every stage's program, their result and the hops between them, and the step_key they
  // were recorded for.
  struct Recorded {
    std::vector<uint64_t> key;
    std::vector<Program> programs;  // one a stage
    Tensor logits;
    // The residual stream of stage s - 1 and stage s's copy of it (hops[s - 1]).
    std::vector<std::pair<Tensor, Tensor>> hops;
    uint64_t used = 0;  // clock_ when it ran last
  };
  // Steps of a few recurring shapes (decode steps of each batch size, and speculation's verifying steps of
  // each draft length, which alternate with them) each keep their programs: recording a step's ~15 ops a
  // layer, and a backend matching what it made of them (a captured graph), cost more than a small step's
  // kernels. The least recently run is recorded over.
  static constexpr size_t kRecordedSteps = 32;
  // Records every stage's program into `into`.
  Status record(KvBuffers& kv, Recorded& into);
  // What a step's recording depends on besides the weights: each stage's metadata (counts, and its tensors'
  // places and lengths), the KV pools (places, types, shapes) and the arenas' generations. A step with the
  // key of one recorded before runs those programs again (ModelOptions::reuse_program false: every step is
  // recorded).
  void step_key(const KvBuffers& kv, std::vector<uint64_t>& key) const;

  std::vector<std::unique_ptr<Stage>> stages_;
  std::vector<Recorded> recorded_;  // up to kRecordedSteps
  size_t current_ = 0;              // the entry run last
  uint64_t clock_ = 0;
  std::vector<uint64_t> next_key_;  // this step's
  // The second stage runs through ModelOptions::host_stage (some of its ops on the first's device).
  bool offload_matmuls_ = false;
  std::vector<float> carry_;  // the residual stream on its way from one backend to the next
};

}  // namespace kiln::blocks
