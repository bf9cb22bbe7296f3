#include "models/moe.h"

namespace kiln::blocks {

Result<MoeWeights> load_moe(WeightLoader& weights, const std::string& prefix, int64_t n_embd,
                            const MoeShape& shape, bool shared_expert) {
  if (shape.n_expert <= 0)
    return invalid_argument("{}: moe n_expert = {} must be > 0", prefix, shape.n_expert);
  if (shape.n_used <= 0 || shape.n_used > shape.n_expert) {
    return invalid_argument("{}: moe n_used = {} must be in [1, n_expert = {}]", prefix, shape.n_used,
                            shape.n_expert);
  }
  if (shape.n_ff_exp <= 0)
    return invalid_argument("{}: moe n_ff_exp = {} must be > 0", prefix, shape.n_ff_exp);
  if (shared_expert && shape.n_ff_shexp <= 0) {
    return invalid_argument("{}: moe n_ff_shexp = {} must be > 0 with a shared expert", prefix,
                            shape.n_ff_shexp);
  }
  const int64_t n_exp = shape.n_expert, n_ff = shape.n_ff_exp;
  constexpr WeightRole mm = WeightRole::weight_role_matmul, ex = WeightRole::weight_role_expert_matmul;
  MoeWeights w;
  KILN_ASSIGN_OR_RETURN(w.router, weights.get(prefix + "ffn_gate_inp.weight", mm, n_embd, n_exp));
  KILN_ASSIGN_OR_RETURN(w.gate_exps, weights.get(prefix + "ffn_gate_exps.weight", ex, n_embd, n_ff, n_exp));
  KILN_ASSIGN_OR_RETURN(w.up_exps, weights.get(prefix + "ffn_up_exps.weight", ex, n_embd, n_ff, n_exp));
  KILN_ASSIGN_OR_RETURN(w.down_exps, weights.get(prefix + "ffn_down_exps.weight", ex, n_ff, n_embd, n_exp));
  if (!shared_expert) return w;
  const int64_t n_sh = shape.n_ff_shexp;
  KILN_ASSIGN_OR_RETURN(w.shared.gate, weights.get(prefix + "ffn_gate_shexp.weight", mm, n_embd, n_sh));
  KILN_ASSIGN_OR_RETURN(w.shared.up, weights.get(prefix + "ffn_up_shexp.weight", mm, n_embd, n_sh));
  KILN_ASSIGN_OR_RETURN(w.shared.down, weights.get(prefix + "ffn_down_shexp.weight", mm, n_sh, n_embd));
  // The gate vector is stored as [n_embd] or [n_embd, 1]; either loads as the matrix [n_embd, 1].
  const std::string gate_name = prefix + "ffn_gate_inp_shexp.weight";
  const gguf::TensorInfo* gi = weights.file().find_tensor(gate_name);
  const bool flat = gi != nullptr && gi->shape.size() == 1;
  KILN_ASSIGN_OR_RETURN(w.shared_gate, weights.get(gate_name, mm, n_embd, flat ? 0 : 1));
  return w;
}

Result<Tensor> moe_ffn(Recorder& r, const Tensor& x, const MoeWeights& w, const MoeShape& shape) {
  const int64_t n_embd = x.ne[0], n_tokens = x.ne[1], n_used = shape.n_used, n_ff = shape.n_ff_exp;
  Program& p = r.program;
  KILN_ASSIGN_OR_RETURN(Tensor out, r.arena.f32(n_embd, n_tokens));  // outlives the scope
  Arena::Scope scope(r.arena);
  // Routing: logits f32 [n_expert, n_tokens] -> ids i32 [n_used, n_tokens], weights f32 [n_used, n_tokens].
  KILN_ASSIGN_OR_RETURN(Tensor logits, r.arena.f32(shape.n_expert, n_tokens));
  KILN_TRY(p.add(ops::Matmul{w.router, x, logits}));
  KILN_ASSIGN_OR_RETURN(Tensor ids, r.arena.i32(n_used, n_tokens));
  KILN_ASSIGN_OR_RETURN(Tensor mix, r.arena.f32(n_used, n_tokens));
  KILN_TRY(p.add(ops::MoeRoute{logits, ids, mix, shape.normalize}));
  // The chosen experts: x as [n_embd, 1, n_tokens] (every slot reads its token's row), hidden [n_ff, n_used,
  // n_tokens], outputs [n_embd, n_used, n_tokens].
  Tensor x_slots = x;
  x_slots.ne = {n_embd, 1, n_tokens, 1};
  x_slots.nb = {x.nb[0], x.nb[1] * n_tokens, x.nb[1], x.nb[1] * n_tokens};
  KILN_ASSIGN_OR_RETURN(Tensor g, r.arena.f32(n_ff, n_used, n_tokens));
  KILN_ASSIGN_OR_RETURN(Tensor u, r.arena.f32(n_ff, n_used, n_tokens));
  KILN_TRY(p.add(ops::MoeMatmul{w.gate_exps, x_slots, ids, g}));
  KILN_TRY(p.add(ops::MoeMatmul{w.up_exps, x_slots, ids, u}));
  KILN_TRY(p.add(ops::GatedAct{g, u, ops::GluKind::glu_kind_silu, g}));
  KILN_ASSIGN_OR_RETURN(Tensor y, r.arena.f32(n_embd, n_used, n_tokens));
  KILN_TRY(p.add(ops::MoeMatmul{w.down_exps, g, ids, y}));
  KILN_TRY(p.add(ops::WeightedSum{y, mix, out}));
  // Under tensor parallelism each rank holds part of every expert's features (and of the shared expert's):
  // its sums are partial, and one all-reduce adds them up.
  if (w.shared.gate.tensor.data == nullptr) {
    KILN_TRY(reduce(r, out));
    return out;
  }
  KILN_ASSIGN_OR_RETURN(Tensor sh, gated_ffn(r, x, w.shared, ops::GluKind::glu_kind_silu, false));
  if (w.shared_gate.tensor.data != nullptr) {
    KILN_ASSIGN_OR_RETURN(Tensor gate, r.arena.f32(1, n_tokens));  // [1, n_tokens]: one gate per token
    KILN_TRY(p.add(ops::Matmul{w.shared_gate, x, gate}));
    KILN_TRY(p.add(ops::GatedAct{gate, sh, ops::GluKind::glu_kind_sigmoid, sh}));
  }
  KILN_TRY(p.add(ops::Binary{out, sh, ops::BinaryKind::binary_kind_add, out}));
  KILN_TRY(reduce(r, out));
  return out;
}

}  // namespace kiln::blocks
