// Shared building blocks of the architectures: the activation arena, weight lookup with shape checks, and the
// layers every decoder-only transformer uses (attention over the paged cache, gated FFN). Only what every
// model needs lives here.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "core/tensor.h"
#include "formats/gguf.h"
#include "models/batch.h"
#include "models/model.h"

namespace kiln::blocks {

// Activation memory for one forward pass: bump-allocated from backend buffers, all released by reset(). After
// the first pass of a given size it allocates nothing.
class Arena {
 public:
  explicit Arena(Backend& backend) : backend_(backend) {}
  // A contiguous f32 tensor [ne0, ne1, ne2] from the arena.
  Result<Tensor> f32(int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1);
  // n int32 values from the arena (indices ops read or write, e.g. expert ids).
  Result<std::span<int32_t>> i32(int64_t n);
  // Forgets every tensor handed out (keeps the memory; merges chunks into one when there were several).
  void reset();

 private:
  // `bytes` (rounded up to 64) of backend memory.
  Result<void*> allocate(size_t bytes);

  Backend& backend_;
  std::vector<std::unique_ptr<Buffer>> chunks_;
  size_t used_ = 0;        // bytes used in the last chunk
  size_t total_used_ = 0;  // bytes handed out since reset()
  size_t peak_ = 0;        // largest total_used_ seen
};

// Reads weights (tensor views into the file) and checks their shapes, with errors naming the tensor.
class WeightLoader {
 public:
  WeightLoader(const gguf::File& file, Backend& backend) : file_(file), backend_(backend) {}
  // The tensor `name` with shape [ne0, ne1] (ne1 = 0: a 1-d tensor [ne0]). not_found when missing,
  // invalid_argument naming the tensor, its shape and the expected one otherwise.
  Result<Tensor> get(const std::string& name, int64_t ne0, int64_t ne1 = 0);
  // A 3-d tensor [ne0, ne1, ne2] (e.g. the stacked expert matrices of an MoE layer), errors as above.
  Result<Tensor> get(const std::string& name, int64_t ne0, int64_t ne1, int64_t ne2);
  // The same, or an empty Tensor (data == nullptr) when the file has no such tensor.
  Result<Tensor> get_optional(const std::string& name, int64_t ne0, int64_t ne1 = 0);
  // An optional f32 [n] bias (empty when absent; invalid_argument when of another type).
  Result<Tensor> get_bias(const std::string& name, int64_t n);
  int64_t n_params() const { return n_params_; }
  uint64_t n_bytes() const { return n_bytes_; }

 private:
  Result<Tensor> get_shape(const std::string& name, const std::vector<int64_t>& expected);

  const gguf::File& file_;
  Backend& backend_;
  int64_t n_params_ = 0;
  uint64_t n_bytes_ = 0;
};

// Hyper-parameter lookup: "{arch}.{key}" as a positive int32 / a finite float, with a default or required.
Result<int32_t> hparam_int(const gguf::File& file, const std::string& key, std::optional<int32_t> fallback);
Result<float> hparam_float(const gguf::File& file, const std::string& key, std::optional<float> fallback);

// Reads the RoPE parameters of an architecture: {arch}.rope.dimension_count, freq_base, scaling.type/factor/
// original_context_length, yarn betas; rope_freqs.weight when present (Llama-3.1 frequency factors); Phi-3's
// longrope: rope_factors_long.weight when n_ctx > {arch}.rope.scaling.original_context_length, else
// rope_factors_short.weight, with {arch}.rope.scaling.attn_factor.
Result<ops::RopeParams> read_rope(const gguf::File& file, WeightLoader& weights, const std::string& arch,
                                  int32_t head_dim, ops::RopeLayout layout, int32_t n_ctx = 0);

// The embedding, the final norm and the output head (the embedding itself when output.weight is absent).
struct EmbeddingWeights {
  Tensor tok_embd;     // [n_embd, n_vocab]
  Tensor output_norm;  // [n_embd]
  Tensor output;       // [n_embd, n_vocab]
};
// Reads them and sets info.n_vocab from token_embd.weight.
Result<EmbeddingWeights> load_embeddings(const gguf::File& file, WeightLoader& weights, ModelInfo& info);

// The per-layer weights of a standard attention block.
struct AttentionWeights {
  Tensor wq, wk, wv, wo;  // [n_embd, n_heads*head_dim] ... [n_heads*head_dim, n_embd]
  Tensor bq, bk, bv, bo;  // f32 [rows of the matching weight] biases (Qwen2), or none
  Tensor q_norm, k_norm;  // [head_dim] RMSNorm of each query / key head before RoPE (Gemma 3, Qwen3), or none
};

struct AttentionShape {
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  float scale = 0.0f;      // on q.k, usually 1/sqrt(head_dim)
  float softcap = 0.0f;    // 0: none
  int32_t window = 0;      // 0: full attention
  float norm_eps = 1e-6f;  // of q_norm / k_norm
};

// Per-architecture defaults for read_hparams().
struct HparamDefaults {
  int32_t n_ctx_train = 4096;
  float norm_eps = 1e-5f;
  int32_t head_dim = 0;  // 0: embedding_length / head_count
  int32_t window = 0;    // 0: full attention
};

// What every decoder reads from "{arch}.*": general.name, embedding_length, block_count, context_length,
// attention.head_count(_kv) (GQA must divide), attention.key_length (= value_length),
// attention.layer_norm_rms_epsilon (also the QK-norm epsilon), attention.scale (default 1/sqrt(head_dim)),
// attention.sliding_window. Fills info's name, architecture, sizes, head_dim and n_kv_heads, and `shape`.
Status read_hparams(const gguf::File& file, const std::string& arch, const HparamDefaults& defaults,
                    ModelInfo& info, AttentionShape& shape);

// blk.N.attn_{q,k,v,output}.weight of layer `prefix` ("blk.N."), or Q, K and V as row slices of a fused
// attn_qkv.weight [n_embd, (n_heads + 2 n_kv_heads) head_dim] (Phi-3); attn_{q,k,v,output}.bias when present;
// attn_{q,k}_norm.weight when qk_norm.
Result<AttentionWeights> load_attention(WeightLoader& weights, const std::string& prefix, int64_t n_embd,
                                        const AttentionShape& shape, bool qk_norm);

// The weights of a gated FFN.
struct FfnWeights {
  Tensor gate, up;  // [n_embd, n_ff]
  Tensor down;      // [n_ff, n_embd]
};
// blk.N.ffn_{gate,up,down}.weight, or gate and up as the row halves of a fused ffn_up.weight [n_embd, 2 n_ff]
// when there is no ffn_gate.weight (Phi-3: gate first).
Result<FfnWeights> load_ffn(WeightLoader& weights, const std::string& prefix, int64_t n_embd, int64_t n_ff);

// Per-forward values shared by every layer: where each token's K/V goes.
struct StepInfo {
  const Batch* batch = nullptr;
  std::vector<int32_t> slots;  // [n_tokens] block * block_size + offset
};
StepInfo make_step(const Batch& batch, int32_t block_size);

// out = Wo · attention(rope(Wq·x), rope(Wk·x), Wv·x) over the paged cache of `layer`.   x: [n_embd,
// n_tokens].
Result<Tensor> attention(Backend& backend, Arena& arena, const Tensor& x, const AttentionWeights& w,
                         const AttentionShape& shape, const ops::RopeParams& rope, const StepInfo& step,
                         KvBuffers& kv, int32_t layer, bool quantize_x);

// out = Wdown · (act(Wgate·x) * (Wup·x)).   x: [n_embd, n_tokens].
Result<Tensor> gated_ffn(Backend& backend, Arena& arena, const Tensor& x, const FfnWeights& w,
                         ops::GluKind kind, bool quantize_x);

// dst = rms_norm(x) * w
Result<Tensor> rms_norm(Backend& backend, Arena& arena, const Tensor& x, const Tensor& w, float eps);

// What every forward() checks first: the batch against the model's vocabulary, the KV buffers against its
// layers.
Status check_forward(const Batch& batch, const KvBuffers& kv, const ModelInfo& info);

// The logits of batch.logit_rows: those rows of the residual stream x [n_embd, n_tokens], final RMSNorm,
// output head, into `logits` [logit_rows.size(), n_vocab].
Status output_logits(Backend& backend, Arena& arena, const Tensor& x, const Batch& batch,
                     const EmbeddingWeights& w, float eps, int32_t n_vocab, float* logits, bool quantize_x);

// The rows of x (f32 [n, n_tokens]) listed in `rows`, as a new tensor [n, rows.size()].
Result<Tensor> select_rows(Backend& backend, Arena& arena, const Tensor& x, std::span<const int32_t> rows);

}  // namespace kiln::blocks
