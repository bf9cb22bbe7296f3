#include "models/blocks.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <vector>

namespace kiln::blocks {

Result<EmbeddingWeights> load_embeddings(const gguf::File& file, WeightLoader& weights, ModelInfo& info,
                                         Backend& head, int32_t ranks) {
  const gguf::TensorInfo* embd = file.find_tensor("token_embd.weight");
  if (embd == nullptr || embd->shape.size() != 2) {
    return invalid_argument("{}: token_embd.weight is missing or not 2-d", file.name());
  }
  if (embd->shape[1] <= 0 || embd->shape[1] > (int64_t{1} << 30)) {
    return invalid_argument("{}: token_embd.weight has {} rows", file.name(), embd->shape[1]);
  }
  info.n_vocab = static_cast<int32_t>(embd->shape[1]);
  EmbeddingWeights w;
  const bool tied = !weights.has("output.weight");
  const bool split = &weights.backend() != &head;
  KILN_ASSIGN_OR_RETURN(w.tok_embd, weights.get("token_embd.weight",
                                                tied && !split ? WeightRole::weight_role_tied_embedding
                                                               : WeightRole::weight_role_embedding,
                                                info.n_embd, info.n_vocab));
  weights.place_on(head);
  KILN_ASSIGN_OR_RETURN(w.output_norm,
                        weights.get("output_norm.weight", WeightRole::weight_role_norm, info.n_embd));
  if (ranks < 1 || info.n_vocab % ranks != 0)
    return invalid_argument("{}: a vocabulary of {} in {} parts", file.name(), info.n_vocab, ranks);
  KILN_ASSIGN_OR_RETURN(w.output, weights.get_optional("output.weight", WeightRole::weight_role_matmul,
                                                       info.n_embd, info.n_vocab / ranks));
  if (ranks > 1 && tied)
    return invalid_argument("{}: a rank's view has no output head of its own", file.name());
  if (tied && split) {  // the table again, as the head's matrix, on the head's backend
    weights.place_on(head, /*copies=*/true);
    KILN_ASSIGN_OR_RETURN(w.output, weights.get("token_embd.weight", WeightRole::weight_role_matmul,
                                                info.n_embd, info.n_vocab));
    weights.place_on(head);
  } else if (tied) {
    w.output = w.tok_embd;
  }
  return w;
}

Result<AttentionWeights> load_attention(WeightLoader& weights, const std::string& prefix, int64_t n_embd,
                                        const AttentionShape& shape, bool qk_norm) {
  const int64_t hd = shape.head_dim, q_dim = shape.n_heads * hd, kv_dim = shape.n_kv_heads * hd;
  constexpr WeightRole mm = WeightRole::weight_role_matmul;
  AttentionWeights w;
  // Q, K and V read the same x: prepared together, so that a backend may hold them as one matrix.
  std::vector<WeightLoader::GroupPart> parts;
  if (const std::string qkv = prefix + "attn_qkv.weight"; weights.has(qkv)) {
    const int64_t rows = q_dim + 2 * kv_dim;
    parts = {{qkv, "q", rows, 0, q_dim},
             {qkv, "k", rows, q_dim, kv_dim},
             {qkv, "v", rows, q_dim + kv_dim, kv_dim}};
  } else {
    parts = {{prefix + "attn_q.weight", "", q_dim, 0, q_dim},
             {prefix + "attn_k.weight", "", kv_dim, 0, kv_dim},
             {prefix + "attn_v.weight", "", kv_dim, 0, kv_dim}};
  }
  KILN_ASSIGN_OR_RETURN(const std::vector<ops::Weight> qkv_w, weights.get_group(parts, mm, n_embd));
  w.wq = qkv_w[0];
  w.wk = qkv_w[1];
  w.wv = qkv_w[2];
  KILN_ASSIGN_OR_RETURN(w.wo, weights.get(prefix + "attn_output.weight", mm, q_dim, n_embd));
  KILN_ASSIGN_OR_RETURN(w.bq, weights.get_bias(prefix + "attn_q.bias", q_dim));
  KILN_ASSIGN_OR_RETURN(w.bk, weights.get_bias(prefix + "attn_k.bias", kv_dim));
  KILN_ASSIGN_OR_RETURN(w.bv, weights.get_bias(prefix + "attn_v.bias", kv_dim));
  KILN_ASSIGN_OR_RETURN(w.bo, weights.get_bias(prefix + "attn_output.bias", n_embd));
  if (qk_norm) {
    KILN_ASSIGN_OR_RETURN(w.q_norm,
                          weights.get(prefix + "attn_q_norm.weight", WeightRole::weight_role_norm, hd));
    KILN_ASSIGN_OR_RETURN(w.k_norm,
                          weights.get(prefix + "attn_k_norm.weight", WeightRole::weight_role_norm, hd));
  }
  return w;
}

Result<FfnWeights> load_ffn(WeightLoader& weights, const std::string& prefix, int64_t n_embd, int64_t n_ff) {
  constexpr WeightRole mm = WeightRole::weight_role_matmul;
  FfnWeights w;
  if (weights.has(prefix + "ffn_gate.weight")) {
    KILN_ASSIGN_OR_RETURN(w.gate, weights.get(prefix + "ffn_gate.weight", mm, n_embd, n_ff));
    KILN_ASSIGN_OR_RETURN(w.up, weights.get(prefix + "ffn_up.weight", mm, n_embd, n_ff));
  } else {
    const std::string gate_up = prefix + "ffn_up.weight";
    KILN_ASSIGN_OR_RETURN(w.gate, weights.get_rows_of(gate_up, "gate", mm, n_embd, 2 * n_ff, 0, n_ff));
    KILN_ASSIGN_OR_RETURN(w.up, weights.get_rows_of(gate_up, "up", mm, n_embd, 2 * n_ff, n_ff, n_ff));
  }
  KILN_ASSIGN_OR_RETURN(w.down, weights.get(prefix + "ffn_down.weight", mm, n_ff, n_embd));
  return w;
}

Result<Tensor> embed(Recorder& r, const EmbeddingWeights& w, int64_t n_embd) {
  KILN_ASSIGN_OR_RETURN(Tensor x, r.arena.f32(n_embd, r.step.n_tokens));
  KILN_TRY(r.program.add(ops::GetRows{w.tok_embd, r.step.tokens, x}));
  return x;
}

Status reduce(Recorder& r, const Tensor& t) {
  if (r.tp == nullptr || r.tp->world() == 1) return Status::ok_status();
  return r.program.add(ops::AllReduce{t, t, r.tp});
}

Result<Tensor> attention(Recorder& r, const Tensor& x, const AttentionWeights& w, const AttentionShape& shape,
                         const RopeConfig& rope, KvBuffers& kv, int32_t layer) {
  const int64_t n_tokens = x.ne[1], hd = shape.head_dim;
  Program& p = r.program;
  KILN_ASSIGN_OR_RETURN(Tensor out, r.arena.f32(w.wo.tensor.ne[1], n_tokens));  // outlives the scope
  Arena::Scope scope(r.arena);
  KILN_ASSIGN_OR_RETURN(Tensor q, r.arena.f32(hd, shape.n_heads, n_tokens));
  KILN_ASSIGN_OR_RETURN(Tensor k, r.arena.f32(hd, shape.n_kv_heads, n_tokens));
  KILN_ASSIGN_OR_RETURN(Tensor v, r.arena.f32(hd, shape.n_kv_heads, n_tokens));
  KILN_TRY(p.add(ops::Matmul{w.wq, x, reshape(q, hd * shape.n_heads, n_tokens)}));
  KILN_TRY(p.add(ops::Matmul{w.wk, x, reshape(k, hd * shape.n_kv_heads, n_tokens)}));
  KILN_TRY(p.add(ops::Matmul{w.wv, x, reshape(v, hd * shape.n_kv_heads, n_tokens)}));
  for (auto [b, t] : {std::pair{&w.bq, &q}, {&w.bk, &k}, {&w.bv, &v}}) {
    if (b->tensor.data == nullptr) continue;
    const Tensor flat = reshape(*t, t->ne[0] * t->ne[1], n_tokens);
    KILN_TRY(p.add(ops::Binary{flat, *b, ops::BinaryKind::binary_kind_add, flat}));
  }
  if (w.q_norm.tensor.data != nullptr) KILN_TRY(p.add(ops::RmsNorm{q, w.q_norm, shape.norm_eps, false, q}));
  if (w.k_norm.tensor.data != nullptr) KILN_TRY(p.add(ops::RmsNorm{k, w.k_norm, shape.norm_eps, false, k}));
  KILN_TRY(p.add(ops::Rope{q, r.step.positions, rope.params, rope.freq_factors, q}));
  KILN_TRY(p.add(ops::Rope{k, r.step.positions, rope.params, rope.freq_factors, k}));
  KILN_TRY(p.add(ops::KvWrite{k, v, kv.k[layer], kv.v[layer], r.step.slots}));
  KILN_ASSIGN_OR_RETURN(Tensor a, r.arena.f32(hd, shape.n_heads, n_tokens));
  ops::Attention att;
  att.q = q;
  att.k_pool = kv.k[layer];
  att.v_pool = kv.v[layer];
  att.positions = r.step.positions;
  att.seq = r.step.seq;
  att.bt_indptr = r.step.bt_indptr;
  att.bt_indices = r.step.bt_indices;
  att.scale = shape.scale;
  att.softcap = shape.softcap;
  att.window = shape.window;
  att.dst = a;
  KILN_TRY(p.add(att));
  KILN_TRY(p.add(ops::Matmul{w.wo, reshape(a, hd * shape.n_heads, n_tokens), out}));
  KILN_TRY(reduce(r, out));
  if (w.bo.tensor.data != nullptr)
    KILN_TRY(p.add(ops::Binary{out, w.bo, ops::BinaryKind::binary_kind_add, out}));
  return out;
}

Result<Tensor> gated_ffn(Recorder& r, const Tensor& x, const FfnWeights& w, ops::GluKind kind, bool reduced) {
  const int64_t n_tokens = x.ne[1], n_ff = w.gate.tensor.ne[1];
  KILN_ASSIGN_OR_RETURN(Tensor out, r.arena.f32(w.down.tensor.ne[1], n_tokens));  // outlives the scope
  Arena::Scope scope(r.arena);
  KILN_ASSIGN_OR_RETURN(Tensor g, r.arena.f32(n_ff, n_tokens));
  KILN_ASSIGN_OR_RETURN(Tensor u, r.arena.f32(n_ff, n_tokens));
  KILN_TRY(r.program.add(ops::Matmul{w.gate, x, g}));
  KILN_TRY(r.program.add(ops::Matmul{w.up, x, u}));
  KILN_TRY(r.program.add(ops::GatedAct{g, u, kind, g}));
  KILN_TRY(r.program.add(ops::Matmul{w.down, g, out}));
  if (reduced) KILN_TRY(reduce(r, out));
  return out;
}

Result<Tensor> rms_norm(Recorder& r, const Tensor& x, const ops::Weight& w, float eps) {
  KILN_ASSIGN_OR_RETURN(Tensor out, r.arena.f32(x.ne[0], x.ne[1], x.ne[2]));
  KILN_TRY(r.program.add(ops::RmsNorm{x, w, eps, false, out}));
  return out;
}

Result<Tensor> output_logits(Recorder& r, const Tensor& x, const EmbeddingWeights& w, float eps,
                             int32_t n_vocab) {
  if (r.step.n_logits == 0) return Tensor{DType::f32, nullptr, {n_vocab, 0, 1, 1}, {4, 0, 0, 0}};
  KILN_ASSIGN_OR_RETURN(Tensor logits, r.arena.f32(n_vocab, r.step.n_logits));  // outlives the scope
  Tensor ids;
  if (r.step.argmax_vocab > 0) {
    KILN_ASSIGN_OR_RETURN(ids, r.arena.i32(r.step.n_logits));
  } else if (r.step.sample_vocab > 0) {
    KILN_ASSIGN_OR_RETURN(ids, r.arena.i32(2 + 2 * int64_t{r.step.sample_n_top}, r.step.n_logits));
  }
  Arena::Scope scope(r.arena);
  KILN_ASSIGN_OR_RETURN(Tensor sel, r.arena.f32(x.ne[0], r.step.n_logits));
  KILN_TRY(r.program.add(ops::GetRows{ops::Weight(x), r.step.logit_rows, sel}));
  KILN_ASSIGN_OR_RETURN(Tensor h, rms_norm(r, sel, w.output_norm, eps));
  const int32_t world = r.tp != nullptr ? r.tp->world() : 1;
  if (world == 1) {
    KILN_TRY(r.program.add(ops::Matmul{w.output, h, logits}));
  } else {  // this rank's rows of the vocabulary, then every rank's
    const int64_t part = w.output.tensor.ne[1];
    if (part * world != n_vocab) {
      return invalid_argument("tensor parallelism: the output head has {} rows on each of {} ranks, not {}",
                              part, world, n_vocab);
    }
    KILN_ASSIGN_OR_RETURN(Tensor mine, r.arena.f32(part, r.step.n_logits));
    KILN_TRY(r.program.add(ops::Matmul{w.output, h, mine}));
    KILN_TRY(r.program.add(ops::AllGather{mine, logits, r.tp}));
  }
  if (r.step.argmax_vocab == 0 && r.step.sample_vocab == 0) return logits;
  Tensor considered = logits;  // a view of each row's first argmax_vocab / sample_vocab logits
  if (r.step.argmax_vocab > 0) {
    considered.ne[0] = r.step.argmax_vocab;
    KILN_TRY(r.program.add(ops::Argmax{considered, ids}));
  } else {
    considered.ne[0] = r.step.sample_vocab;
    KILN_TRY(r.program.add(
        ops::Sample{considered, r.step.sample_rows, r.step.sample_adjust, ids, r.step.sample_mask}));
  }
  return ids;
}

StepModel::StepModel(Backend& backend, const ModelOptions& options) : backend_(backend), options_(options) {
  stages_.push_back(std::make_unique<Stage>(backend, nullptr));
}

StepModel::~StepModel() = default;

Status StepModel::place_layers() {
  if (options_.rest == nullptr || options_.rest == &backend_) return Status::ok_status();
  if (options_.n_first_layers < 0) {
    return invalid_argument("the first backend's layers: n_first_layers = {} must be >= 0",
                            options_.n_first_layers);
  }
  if (options_.n_first_layers >= info_.n_layers || stages_.size() > 1) return Status::ok_status();
  if (options_.collective != nullptr)
    return unimplemented("tensor parallelism with some layers on another backend (partial offload)");
  offload_matmuls_ = options_.host_stage != nullptr && backend_.device_memory_free() > 0 &&
                     options_.rest->device_memory_free() == 0;
  // Offloading, the host stage's scratch is the device's page-locked memory: x and the products cross the
  // link without staging.
  stages_.push_back(std::make_unique<Stage>(*options_.rest, offload_matmuls_ ? &backend_ : nullptr));
  stages_.back()->first_layer = options_.n_first_layers;
  return Status::ok_status();
}

size_t StepModel::peak_scratch_bytes() const {
  size_t total = 0;
  for (const auto& s : stages_) total += s->arena.peak_bytes();
  if (offload_matmuls_) total += options_.host_stage->scratch_bytes();
  return total;
}

void StepModel::step_key(const KvBuffers& kv, std::vector<uint64_t>& key) const {
  key.clear();
  const auto put = [&](const Tensor& t) {
    key.push_back(reinterpret_cast<uint64_t>(t.data));
    key.push_back(static_cast<uint64_t>(t.type));
    for (int i = 0; i < 4; ++i) key.push_back(static_cast<uint64_t>(t.ne[i]));
  };
  for (const auto& s : stages_) {
    const StepTensors& st = s->step;
    for (const int32_t v :
         {st.n_tokens, st.n_seqs, st.n_logits, st.argmax_vocab, st.sample_vocab, st.sample_n_top})
      key.push_back(static_cast<uint64_t>(static_cast<uint32_t>(v)));
    for (const Tensor* t : {&st.tokens, &st.positions, &st.slots, &st.seq, &st.bt_indptr, &st.bt_indices,
                            &st.logit_rows, &st.sample_rows, &st.sample_adjust, &st.sample_mask})
      put(*t);
  }
  for (const auto& s : stages_) key.push_back(s->arena.generation());
  key.push_back(static_cast<uint64_t>(kv.block_size));
  key.push_back(static_cast<uint64_t>(kv.n_blocks));
  key.push_back(kv.k.size());
  for (size_t l = 0; l < kv.k.size(); ++l) put(kv.k[l]), put(l < kv.v.size() ? kv.v[l] : Tensor{});
}

const Program& StepModel::last_program() const {
  static const Program none;
  return current_ < recorded_.size() ? recorded_[current_].programs.front() : none;
}

Status StepModel::record(KvBuffers& kv, Recorded& into) {
  into.key.clear();  // until recorded whole
  into.programs.resize(stages_.size());
  for (size_t s = 0; s < stages_.size(); ++s) {
    stages_[s]->arena.reset();
    into.programs[s].clear();
    into.programs[s].n_tokens = stages_[s]->step.n_tokens;
  }
  // Recorded stage by stage; the residual stream of the stage before is copied into `into.hops[s -
  // 1].second`, stage s's own, before stage s runs.
  Tensor x;
  into.hops.clear();
  for (size_t s = 0; s < stages_.size(); ++s) {
    Stage& st = *stages_[s];
    Recorder r{into.programs[s], st.arena, st.step, options_.collective};
    if (s == 0) {
      KILN_ASSIGN_OR_RETURN(x, record_embedding(r));
    } else {
      KILN_ASSIGN_OR_RETURN(Tensor to, st.arena.f32(x.ne[0], x.ne[1]));
      into.hops.emplace_back(x, to);
      x = to;
    }
    const int32_t end = s + 1 < stages_.size() ? stages_[s + 1]->first_layer : info_.n_layers;
    for (int32_t l = st.first_layer; l < end; ++l) {
      Arena::Scope layer(st.arena);  // the layer's scratch is the next layer's
      KILN_TRY(record_layer(r, l, x, kv));
    }
    if (s + 1 == stages_.size()) {
      KILN_ASSIGN_OR_RETURN(into.logits, record_output(r, x));
    }
  }
  if (options_.program_hook != nullptr) {
    for (size_t s = 0; s < stages_.size(); ++s) {
      KILN_TRY(options_.program_hook->recorded(into.programs[s], stages_[s]->backend));
    }
  }
  // The arenas may have grown while recording (a new generation): the key of what is recorded is taken after.
  step_key(kv, into.key);
  return Status::ok_status();
}

Result<Tensor> StepModel::forward(const Batch& batch, KvBuffers& kv) {
  for (const auto& s : stages_) {
    KILN_ASSIGN_OR_RETURN(s->step, s->steps.build(batch, kv, info_));
  }
  step_key(kv, next_key_);
  size_t hit = recorded_.size();
  if (options_.reuse_program) {
    for (size_t i = 0; i < recorded_.size() && hit == recorded_.size(); ++i) {
      if (!recorded_[i].key.empty() && recorded_[i].key == next_key_) hit = i;
    }
  }
  if (hit == recorded_.size()) {
    // A new entry while there is room, else the least recently run one.
    if (recorded_.size() < (options_.reuse_program ? kRecordedSteps : 1)) {
      recorded_.emplace_back();
    } else {
      hit = 0;
      for (size_t i = 1; i < recorded_.size(); ++i) {
        if (recorded_[i].used < recorded_[hit].used) hit = i;
      }
    }
    KILN_TRY(record(kv, recorded_[hit]));
  }
  current_ = hit;
  Recorded& rec = recorded_[hit];
  rec.used = ++clock_;
  for (size_t s = 0; s < stages_.size(); ++s) {
    if (s > 0) {
      const auto& [from, to] = rec.hops[s - 1];
      Backend& before = stages_[s - 1]->backend;
      const size_t bytes = static_cast<size_t>(from.n_elements()) * sizeof(float);
      if (to.buffer != nullptr && to.buffer->host_visible()) {  // a host stage's tensor
        KILN_TRY(before.download(to.data, from, bytes));
        KILN_TRY(before.synchronize());  // the first stage's asynchronous errors surface here
      } else {
        carry_.resize(bytes / sizeof(float));
        KILN_TRY(before.download(carry_.data(), from, bytes));
        KILN_TRY(before.synchronize());
        KILN_TRY(stages_[s]->backend.upload(to, carry_.data(), bytes));
      }
    }
    Stage& st = *stages_[s];
    if (s > 0 && offload_matmuls_) {
      KILN_TRY(options_.host_stage->run(rec.programs[s], st.backend, stages_[0]->backend));
    } else {
      KILN_TRY(st.backend.run(rec.programs[s]));
    }
  }
  return rec.logits;
}

}  // namespace kiln::blocks
