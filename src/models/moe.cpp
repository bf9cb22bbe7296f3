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
  MoeWeights w;
  KILN_ASSIGN_OR_RETURN(w.router, weights.get(prefix + "ffn_gate_inp.weight", n_embd, n_exp));
  KILN_ASSIGN_OR_RETURN(w.gate_exps, weights.get(prefix + "ffn_gate_exps.weight", n_embd, n_ff, n_exp));
  KILN_ASSIGN_OR_RETURN(w.up_exps, weights.get(prefix + "ffn_up_exps.weight", n_embd, n_ff, n_exp));
  KILN_ASSIGN_OR_RETURN(w.down_exps, weights.get(prefix + "ffn_down_exps.weight", n_ff, n_embd, n_exp));
  if (!shared_expert) return w;
  const int64_t n_sh = shape.n_ff_shexp;
  KILN_ASSIGN_OR_RETURN(w.shared.gate, weights.get(prefix + "ffn_gate_shexp.weight", n_embd, n_sh));
  KILN_ASSIGN_OR_RETURN(w.shared.up, weights.get(prefix + "ffn_up_shexp.weight", n_embd, n_sh));
  KILN_ASSIGN_OR_RETURN(w.shared.down, weights.get(prefix + "ffn_down_shexp.weight", n_sh, n_embd));
  // The gate vector is stored as [n_embd] or [n_embd, 1]; either loads as the matrix [n_embd, 1].
  const std::string gate_name = prefix + "ffn_gate_inp_shexp.weight";
  Result<Tensor> gate = weights.get(gate_name, n_embd);
  if (!gate.ok() && gate.status().code() == StatusCode::invalid_argument)
    gate = weights.get(gate_name, n_embd, 1);
  KILN_ASSIGN_OR_RETURN(w.shared_gate, std::move(gate));
  return w;
}

Result<Tensor> moe_ffn(Backend& backend, Arena& arena, const Tensor& x, const MoeWeights& w,
                       const MoeShape& shape, bool quantize_x) {
  const int64_t n_embd = x.ne[0], n_tokens = x.ne[1], n_used = shape.n_used, n_ff = shape.n_ff_exp;
  // Routing: logits [n_expert, n_tokens] -> ids [n_used * n_tokens], weights [n_used, n_tokens].
  KILN_ASSIGN_OR_RETURN(Tensor logits, arena.f32(shape.n_expert, n_tokens));
  KILN_TRY(backend.run(ops::Matmul{w.router, x, logits, quantize_x}));
  KILN_ASSIGN_OR_RETURN(std::span<int32_t> ids, arena.i32(n_used * n_tokens));
  KILN_ASSIGN_OR_RETURN(Tensor mix, arena.f32(n_used, n_tokens));
  KILN_TRY(backend.run(ops::MoeRoute{logits, ids, mix, shape.normalize}));
  // The chosen experts: x as [n_embd, 1, n_tokens] (every slot reads its token's row), hidden [n_ff, n_used,
  // n_tokens], outputs [n_embd, n_used, n_tokens].
  Tensor x_slots = x;
  x_slots.ne = {n_embd, 1, n_tokens, 1};
  x_slots.nb = {x.nb[0], x.nb[1] * n_tokens, x.nb[1], x.nb[1] * n_tokens};
  KILN_ASSIGN_OR_RETURN(Tensor g, arena.f32(n_ff, n_used, n_tokens));
  KILN_ASSIGN_OR_RETURN(Tensor u, arena.f32(n_ff, n_used, n_tokens));
  KILN_TRY(backend.run(ops::MoeMatmul{w.gate_exps, x_slots, ids, g, quantize_x}));
  KILN_TRY(backend.run(ops::MoeMatmul{w.up_exps, x_slots, ids, u, quantize_x}));
  KILN_TRY(backend.run(ops::GatedAct{g, u, ops::GluKind::glu_kind_silu, g}));
  KILN_ASSIGN_OR_RETURN(Tensor y, arena.f32(n_embd, n_used, n_tokens));
  KILN_TRY(backend.run(ops::MoeMatmul{w.down_exps, g, ids, y, quantize_x}));
  KILN_ASSIGN_OR_RETURN(Tensor out, arena.f32(n_embd, n_tokens));
  KILN_TRY(backend.run(ops::WeightedSum{y, mix, out}));
  if (w.shared.gate.data == nullptr) return out;
  KILN_ASSIGN_OR_RETURN(Tensor sh,
                        gated_ffn(backend, arena, x, w.shared, ops::GluKind::glu_kind_silu, quantize_x));
  if (w.shared_gate.data != nullptr) {
    KILN_ASSIGN_OR_RETURN(Tensor gate, arena.f32(1, n_tokens));  // [1, n_tokens]: one gate per token
    KILN_TRY(backend.run(ops::Matmul{w.shared_gate, x, gate, quantize_x}));
    KILN_TRY(backend.run(ops::GatedAct{gate, sh, ops::GluKind::glu_kind_sigmoid, sh}));
  }
  KILN_TRY(backend.run(ops::Binary{out, sh, ops::BinaryKind::binary_kind_add, out}));
  return out;
}

}  // namespace kiln::blocks
