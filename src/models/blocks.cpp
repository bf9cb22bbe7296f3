#include "models/blocks.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

namespace kiln::blocks {

Result<Tensor> Arena::f32(int64_t ne0, int64_t ne1, int64_t ne2) {
  KILN_ASSIGN_OR_RETURN(void* p, allocate(static_cast<size_t>(ne0 * ne1 * ne2) * sizeof(float)));
  return make_tensor(DType::f32, p, ne0, ne1, ne2);
}

Result<std::span<int32_t>> Arena::i32(int64_t n) {
  KILN_ASSIGN_OR_RETURN(void* p, allocate(static_cast<size_t>(n) * sizeof(int32_t)));
  return std::span<int32_t>(static_cast<int32_t*>(p), static_cast<size_t>(n));
}

Result<void*> Arena::allocate(size_t size_bytes) {
  const size_t bytes = (size_bytes + 63) / 64 * 64;
  if (chunks_.empty() || used_ + bytes > chunks_.back()->size()) {
    // A new chunk: at least what the whole last pass needed, so a steady state has one chunk.
    const size_t size = std::max({bytes, peak_, size_t{1} << 20});
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> buf, backend_.allocate(size));
    chunks_.push_back(std::move(buf));
    used_ = 0;
  }
  void* p = static_cast<uint8_t*>(chunks_.back()->data()) + used_;
  used_ += bytes;
  total_used_ += bytes;
  peak_ = std::max(peak_, total_used_);
  return p;
}

void Arena::reset() {
  if (chunks_.size() > 1) chunks_.clear();  // the next pass allocates one chunk of peak_ bytes
  used_ = 0;
  total_used_ = 0;
}

Result<Tensor> WeightLoader::get_optional(const std::string& name, int64_t ne0, int64_t ne1) {
  const gguf::TensorInfo* t = file_.find_tensor(name);
  if (t == nullptr) return Tensor{};
  return get(name, ne0, ne1);
}

Result<Tensor> WeightLoader::get(const std::string& name, int64_t ne0, int64_t ne1) {
  return get_shape(name, ne1 > 0 ? std::vector<int64_t>{ne0, ne1} : std::vector<int64_t>{ne0});
}

Result<Tensor> WeightLoader::get(const std::string& name, int64_t ne0, int64_t ne1, int64_t ne2) {
  return get_shape(name, {ne0, ne1, ne2});
}

Result<Tensor> WeightLoader::get_shape(const std::string& name, const std::vector<int64_t>& expected) {
  const gguf::TensorInfo* t = file_.find_tensor(name);
  if (t == nullptr) return not_found("{}: tensor {} is missing", file_.name(), name);
  if (t->shape != expected) {
    return invalid_argument("{}: tensor {} has shape [{}], expected [{}]", file_.name(), name,
                            fmt::join(t->shape, ", "), fmt::join(expected, ", "));
  }
  if (!backend_.host_memory()) {
    return unimplemented("{}: backend {} needs weight upload, which is not implemented", file_.name(),
                         backend_.name());
  }
  const DTypeInfo& info = dtype_info(t->type);
  if (info.dequantize_row == nullptr && t->type != DType::f32) {
    return unimplemented("{}: tensor {} has type {}, which kiln cannot compute with yet", file_.name(), name,
                         info.name);
  }
  n_params_ += t->n_elements();
  n_bytes_ += t->n_bytes;
  return make_tensor(t->type, const_cast<uint8_t*>(t->data), expected[0],
                     expected.size() > 1 ? expected[1] : 1, expected.size() > 2 ? expected[2] : 1);
}

Result<Tensor> WeightLoader::get_bias(const std::string& name, int64_t n) {
  KILN_ASSIGN_OR_RETURN(Tensor b, get_optional(name, n));
  if (b.data != nullptr && b.type != DType::f32)
    return invalid_argument("{}: tensor {} has type {}, biases must be f32", file_.name(), name,
                            dtype_name(b.type));
  return b;
}

Result<int32_t> hparam_int(const gguf::File& file, const std::string& key, std::optional<int32_t> fallback) {
  if (file.find(key) == nullptr) {
    if (fallback) return *fallback;
    return not_found("{}: {} is missing", file.name(), key);
  }
  KILN_ASSIGN_OR_RETURN(uint64_t v, file.get_uint(key));
  if (v == 0 || v > (1u << 30)) return invalid_argument("{}: {} = {} is out of range", file.name(), key, v);
  return static_cast<int32_t>(v);
}

Result<float> hparam_float(const gguf::File& file, const std::string& key, std::optional<float> fallback) {
  if (file.find(key) == nullptr) {
    if (fallback) return *fallback;
    return not_found("{}: {} is missing", file.name(), key);
  }
  KILN_ASSIGN_OR_RETURN(double v, file.get_float(key));
  if (!std::isfinite(v)) return invalid_argument("{}: {} = {} is not finite", file.name(), key, v);
  return static_cast<float>(v);
}

Status read_hparams(const gguf::File& f, const std::string& a, const HparamDefaults& d, ModelInfo& info,
                    AttentionShape& shape) {
  info.architecture = a;
  KILN_ASSIGN_OR_RETURN(info.name, f.get_string_or("general.name", f.name()));
  KILN_ASSIGN_OR_RETURN(info.n_embd, hparam_int(f, a + ".embedding_length", {}));
  KILN_ASSIGN_OR_RETURN(info.n_layers, hparam_int(f, a + ".block_count", {}));
  // Every layer has tensors of its own: a count beyond the file's tensors is false, and would size per-layer
  // arrays (weights, KV buffers) from a number the file cannot back.
  if (static_cast<size_t>(info.n_layers) > f.tensors().size()) {
    return invalid_argument("{}: {}.block_count = {} but the file holds only {} tensors", f.name(), a,
                            info.n_layers, f.tensors().size());
  }
  KILN_ASSIGN_OR_RETURN(info.n_ctx_train, hparam_int(f, a + ".context_length", d.n_ctx_train));
  KILN_ASSIGN_OR_RETURN(shape.n_heads, hparam_int(f, a + ".attention.head_count", {}));
  KILN_ASSIGN_OR_RETURN(shape.n_kv_heads, hparam_int(f, a + ".attention.head_count_kv", shape.n_heads));
  KILN_ASSIGN_OR_RETURN(shape.norm_eps, hparam_float(f, a + ".attention.layer_norm_rms_epsilon", d.norm_eps));
  if (shape.n_heads % shape.n_kv_heads != 0) {
    return invalid_argument("{}: head_count {} is not a multiple of head_count_kv {}", f.name(),
                            shape.n_heads, shape.n_kv_heads);
  }
  std::optional<int32_t> hd = d.head_dim > 0 ? std::optional(d.head_dim) : std::nullopt;
  if (!hd && info.n_embd % shape.n_heads == 0) hd = info.n_embd / shape.n_heads;
  KILN_ASSIGN_OR_RETURN(shape.head_dim, hparam_int(f, a + ".attention.key_length", hd));
  KILN_ASSIGN_OR_RETURN(const int32_t v_dim, hparam_int(f, a + ".attention.value_length", shape.head_dim));
  if (v_dim != shape.head_dim) {
    return unimplemented("{}: value_length {} differs from key_length {}", f.name(), v_dim, shape.head_dim);
  }
  KILN_ASSIGN_OR_RETURN(shape.scale, hparam_float(f, a + ".attention.scale",
                                                  1.0f / std::sqrt(static_cast<float>(shape.head_dim))));
  KILN_ASSIGN_OR_RETURN(shape.window, hparam_int(f, a + ".attention.sliding_window", d.window));
  info.head_dim = shape.head_dim;
  info.n_kv_heads = shape.n_kv_heads;
  return Status::ok_status();
}

Result<ops::RopeParams> read_rope(const gguf::File& file, WeightLoader& weights, const std::string& arch,
                                  int32_t head_dim, ops::RopeLayout layout, int32_t n_ctx) {
  ops::RopeParams p;
  p.layout = layout;
  KILN_ASSIGN_OR_RETURN(p.n_rot, hparam_int(file, arch + ".rope.dimension_count", head_dim));
  if (p.n_rot > head_dim || p.n_rot % 2 != 0) {
    return invalid_argument("{}: {}.rope.dimension_count = {} must be even and at most the head size {}",
                            file.name(), arch, p.n_rot, head_dim);
  }
  KILN_ASSIGN_OR_RETURN(p.freq_base, hparam_float(file, arch + ".rope.freq_base", 10000.0f));
  if (!(p.freq_base > 0))
    return invalid_argument("{}: {}.rope.freq_base = {} is not > 0", file.name(), arch, p.freq_base);
  KILN_ASSIGN_OR_RETURN(std::string type, file.get_string_or(arch + ".rope.scaling.type", "none"));
  KILN_ASSIGN_OR_RETURN(p.factor, hparam_float(file, arch + ".rope.scaling.factor", 1.0f));
  if (file.find(arch + ".rope.scale_linear") != nullptr) {  // older files
    KILN_ASSIGN_OR_RETURN(p.factor, hparam_float(file, arch + ".rope.scale_linear", 1.0f));
    type = "linear";
  }
  if (!(p.factor > 0))
    return invalid_argument("{}: {}.rope.scaling.factor = {} is not > 0", file.name(), arch, p.factor);
  if (type == "none" || p.factor == 1.0f) {
    p.scaling = ops::RopeScaling::rope_scaling_none;
  } else if (type == "linear") {
    p.scaling = ops::RopeScaling::rope_scaling_linear;
  } else if (type == "yarn") {
    p.scaling = ops::RopeScaling::rope_scaling_yarn;
    KILN_ASSIGN_OR_RETURN(p.original_context,
                          hparam_int(file, arch + ".rope.scaling.original_context_length", {}));
    KILN_ASSIGN_OR_RETURN(p.beta_fast, hparam_float(file, arch + ".rope.scaling.yarn_beta_fast", 32.0f));
    KILN_ASSIGN_OR_RETURN(p.beta_slow, hparam_float(file, arch + ".rope.scaling.yarn_beta_slow", 1.0f));
    KILN_ASSIGN_OR_RETURN(p.attn_factor, hparam_float(file, arch + ".rope.scaling.attn_factor", 1.0f));
  } else {
    return unimplemented("{}: {}.rope.scaling.type = \"{}\" is not supported (none, linear, yarn)",
                         file.name(), arch, type);
  }
  std::string factors_name = "rope_freqs.weight";
  if (file.find_tensor("rope_factors_short.weight") != nullptr) {  // longrope
    KILN_ASSIGN_OR_RETURN(const int32_t orig,
                          hparam_int(file, arch + ".rope.scaling.original_context_length", {}));
    KILN_ASSIGN_OR_RETURN(p.attn_factor, hparam_float(file, arch + ".rope.scaling.attn_factor", 1.0f));
    factors_name = n_ctx > orig ? "rope_factors_long.weight" : "rope_factors_short.weight";
  }
  KILN_ASSIGN_OR_RETURN(Tensor factors, weights.get_optional(factors_name, p.n_rot / 2));
  if (factors.data != nullptr) {
    if (factors.type != DType::f32) return invalid_argument("{}: {} must be f32", file.name(), factors_name);
    p.freq_factors = static_cast<const float*>(factors.data);
  }
  return p;
}

StepInfo make_step(const Batch& batch, int32_t block_size) {
  StepInfo s;
  s.batch = &batch;
  s.slots.resize(batch.tokens.size());
  for (size_t t = 0; t < batch.tokens.size(); ++t) {
    const int32_t pos = batch.positions[t];
    s.slots[t] = batch.block_tables[batch.seq[t]][pos / block_size] * block_size + pos % block_size;
  }
  return s;
}

Result<Tensor> attention(Backend& backend, Arena& arena, const Tensor& x, const AttentionWeights& w,
                         const AttentionShape& shape, const ops::RopeParams& rope, const StepInfo& step,
                         KvBuffers& kv, int32_t layer, bool quantize_x) {
  const int64_t n_tokens = x.ne[1], hd = shape.head_dim;
  const Batch& batch = *step.batch;
  KILN_ASSIGN_OR_RETURN(Tensor q, arena.f32(hd, shape.n_heads, n_tokens));
  KILN_ASSIGN_OR_RETURN(Tensor k, arena.f32(hd, shape.n_kv_heads, n_tokens));
  KILN_ASSIGN_OR_RETURN(Tensor v, arena.f32(hd, shape.n_kv_heads, n_tokens));
  KILN_TRY(backend.run(ops::Matmul{w.wq, x, reshape(q, hd * shape.n_heads, n_tokens), quantize_x}));
  KILN_TRY(backend.run(ops::Matmul{w.wk, x, reshape(k, hd * shape.n_kv_heads, n_tokens), quantize_x}));
  KILN_TRY(backend.run(ops::Matmul{w.wv, x, reshape(v, hd * shape.n_kv_heads, n_tokens), quantize_x}));
  for (auto [b, t] : {std::pair{&w.bq, &q}, {&w.bk, &k}, {&w.bv, &v}}) {
    if (b->data == nullptr) continue;
    const Tensor flat = reshape(*t, t->ne[0] * t->ne[1], n_tokens);
    KILN_TRY(backend.run(ops::Binary{flat, *b, ops::BinaryKind::binary_kind_add, flat}));
  }
  if (w.q_norm.data != nullptr) KILN_TRY(backend.run(ops::RmsNorm{q, w.q_norm, shape.norm_eps, false, q}));
  if (w.k_norm.data != nullptr) KILN_TRY(backend.run(ops::RmsNorm{k, w.k_norm, shape.norm_eps, false, k}));
  KILN_TRY(backend.run(ops::Rope{q, batch.positions, rope, q}));
  KILN_TRY(backend.run(ops::Rope{k, batch.positions, rope, k}));
  KILN_TRY(backend.run(ops::KvWrite{k, v, kv.k[layer], kv.v[layer], step.slots}));
  KILN_ASSIGN_OR_RETURN(Tensor a, arena.f32(hd, shape.n_heads, n_tokens));
  ops::Attention att;
  att.q = q;
  att.k_pool = kv.k[layer];
  att.v_pool = kv.v[layer];
  att.positions = batch.positions;
  att.seq = batch.seq;
  att.block_tables = batch.block_tables;
  att.scale = shape.scale;
  att.softcap = shape.softcap;
  att.window = shape.window;
  att.dst = a;
  KILN_TRY(backend.run(att));
  KILN_ASSIGN_OR_RETURN(Tensor out, arena.f32(w.wo.ne[1], n_tokens));
  KILN_TRY(backend.run(ops::Matmul{w.wo, reshape(a, hd * shape.n_heads, n_tokens), out, quantize_x}));
  if (w.bo.data != nullptr)
    KILN_TRY(backend.run(ops::Binary{out, w.bo, ops::BinaryKind::binary_kind_add, out}));
  return out;
}

Result<Tensor> gated_ffn(Backend& backend, Arena& arena, const Tensor& x, const FfnWeights& w,
                         ops::GluKind kind, bool quantize_x) {
  const int64_t n_tokens = x.ne[1], n_ff = w.gate.ne[1];
  KILN_ASSIGN_OR_RETURN(Tensor g, arena.f32(n_ff, n_tokens));
  KILN_ASSIGN_OR_RETURN(Tensor u, arena.f32(n_ff, n_tokens));
  KILN_TRY(backend.run(ops::Matmul{w.gate, x, g, quantize_x}));
  KILN_TRY(backend.run(ops::Matmul{w.up, x, u, quantize_x}));
  KILN_TRY(backend.run(ops::GatedAct{g, u, kind, g}));
  KILN_ASSIGN_OR_RETURN(Tensor out, arena.f32(w.down.ne[1], n_tokens));
  KILN_TRY(backend.run(ops::Matmul{w.down, g, out, quantize_x}));
  return out;
}

Result<EmbeddingWeights> load_embeddings(const gguf::File& file, WeightLoader& weights, ModelInfo& info) {
  const gguf::TensorInfo* embd = file.find_tensor("token_embd.weight");
  if (embd == nullptr || embd->shape.size() != 2) {
    return invalid_argument("{}: token_embd.weight is missing or not 2-d", file.name());
  }
  if (embd->shape[1] <= 0 || embd->shape[1] > (int64_t{1} << 30)) {
    return invalid_argument("{}: token_embd.weight has {} rows", file.name(), embd->shape[1]);
  }
  info.n_vocab = static_cast<int32_t>(embd->shape[1]);
  EmbeddingWeights w;
  KILN_ASSIGN_OR_RETURN(w.tok_embd, weights.get("token_embd.weight", info.n_embd, info.n_vocab));
  KILN_ASSIGN_OR_RETURN(w.output_norm, weights.get("output_norm.weight", info.n_embd));
  KILN_ASSIGN_OR_RETURN(w.output, weights.get_optional("output.weight", info.n_embd, info.n_vocab));
  if (w.output.data == nullptr) w.output = w.tok_embd;  // tied
  return w;
}

Result<AttentionWeights> load_attention(WeightLoader& weights, const std::string& prefix, int64_t n_embd,
                                        const AttentionShape& shape, bool qk_norm) {
  const int64_t hd = shape.head_dim, q_dim = shape.n_heads * hd, kv_dim = shape.n_kv_heads * hd;
  AttentionWeights w;
  KILN_ASSIGN_OR_RETURN(Tensor qkv,
                        weights.get_optional(prefix + "attn_qkv.weight", n_embd, q_dim + 2 * kv_dim));
  if (qkv.data != nullptr) {
    w.wq = slice_rows(qkv, 0, q_dim);
    w.wk = slice_rows(qkv, q_dim, kv_dim);
    w.wv = slice_rows(qkv, q_dim + kv_dim, kv_dim);
  } else {
    KILN_ASSIGN_OR_RETURN(w.wq, weights.get(prefix + "attn_q.weight", n_embd, q_dim));
    KILN_ASSIGN_OR_RETURN(w.wk, weights.get(prefix + "attn_k.weight", n_embd, kv_dim));
    KILN_ASSIGN_OR_RETURN(w.wv, weights.get(prefix + "attn_v.weight", n_embd, kv_dim));
  }
  KILN_ASSIGN_OR_RETURN(w.wo, weights.get(prefix + "attn_output.weight", q_dim, n_embd));
  KILN_ASSIGN_OR_RETURN(w.bq, weights.get_bias(prefix + "attn_q.bias", q_dim));
  KILN_ASSIGN_OR_RETURN(w.bk, weights.get_bias(prefix + "attn_k.bias", kv_dim));
  KILN_ASSIGN_OR_RETURN(w.bv, weights.get_bias(prefix + "attn_v.bias", kv_dim));
  KILN_ASSIGN_OR_RETURN(w.bo, weights.get_bias(prefix + "attn_output.bias", n_embd));
  if (qk_norm) {
    KILN_ASSIGN_OR_RETURN(w.q_norm, weights.get(prefix + "attn_q_norm.weight", hd));
    KILN_ASSIGN_OR_RETURN(w.k_norm, weights.get(prefix + "attn_k_norm.weight", hd));
  }
  return w;
}

Result<FfnWeights> load_ffn(WeightLoader& weights, const std::string& prefix, int64_t n_embd, int64_t n_ff) {
  FfnWeights w;
  KILN_ASSIGN_OR_RETURN(w.gate, weights.get_optional(prefix + "ffn_gate.weight", n_embd, n_ff));
  if (w.gate.data == nullptr) {
    KILN_ASSIGN_OR_RETURN(Tensor gate_up, weights.get(prefix + "ffn_up.weight", n_embd, 2 * n_ff));
    w.gate = slice_rows(gate_up, 0, n_ff);
    w.up = slice_rows(gate_up, n_ff, n_ff);
  } else {
    KILN_ASSIGN_OR_RETURN(w.up, weights.get(prefix + "ffn_up.weight", n_embd, n_ff));
  }
  KILN_ASSIGN_OR_RETURN(w.down, weights.get(prefix + "ffn_down.weight", n_ff, n_embd));
  return w;
}

Status check_forward(const Batch& batch, const KvBuffers& kv, const ModelInfo& info) {
  KILN_TRY(check_batch(batch, info.n_vocab, kv.block_size));
  if (static_cast<int32_t>(kv.k.size()) != info.n_layers) {
    return invalid_argument("forward: KV buffers have {} layers, the model {}", kv.k.size(), info.n_layers);
  }
  return Status::ok_status();
}

Status output_logits(Backend& backend, Arena& arena, const Tensor& x, const Batch& batch,
                     const EmbeddingWeights& w, float eps, int32_t n_vocab, float* logits, bool quantize_x) {
  if (batch.logit_rows.empty()) return Status::ok_status();
  KILN_ASSIGN_OR_RETURN(Tensor sel, select_rows(backend, arena, x, batch.logit_rows));
  KILN_ASSIGN_OR_RETURN(Tensor h, rms_norm(backend, arena, sel, w.output_norm, eps));
  const Tensor out = make_tensor(DType::f32, logits, n_vocab, static_cast<int64_t>(batch.logit_rows.size()));
  KILN_TRY(backend.run(ops::Matmul{w.output, h, out, quantize_x}));
  backend.synchronize();
  return Status::ok_status();
}

Result<Tensor> rms_norm(Backend& backend, Arena& arena, const Tensor& x, const Tensor& w, float eps) {
  KILN_ASSIGN_OR_RETURN(Tensor out, arena.f32(x.ne[0], x.ne[1], x.ne[2]));
  KILN_TRY(backend.run(ops::RmsNorm{x, w, eps, false, out}));
  return out;
}

Result<Tensor> select_rows(Backend& backend, Arena& arena, const Tensor& x, std::span<const int32_t> rows) {
  KILN_ASSIGN_OR_RETURN(Tensor out, arena.f32(x.ne[0], static_cast<int64_t>(rows.size())));
  KILN_TRY(backend.run(ops::GetRows{x, rows, out}));
  return out;
}

}  // namespace kiln::blocks
