// cuda::run_fused, cuda::fused_length and cuda::weights_ahead: the sequences of ops that run as one kernel
// (a GEMV's matmuls on one x, the Q/K/V GEMV with RoPE and the KV write, a gate and up GEMV with their
// activation, an add + norm or an activation or an attention with the matmuls that read its result, RoPE with
// the KV write), found by the operands they share, and the weights a GEMV sends toward L2 for the next ones.
#include <algorithm>
#include <cstdint>
#include <utility>

#include "backends/cuda/cuda_kernels.h"

namespace kiln::cuda {

namespace {

bool same_view(const Tensor& a, const Tensor& b) {
  if (a.data != b.data || a.type != b.type) return false;
  for (int d = 0; d < 4; ++d) {
    if (a.ne[d] != b.ne[d] || a.nb[d] != b.nb[d]) return false;
  }
  return true;
}
bool same_shape(const Tensor& a, const Tensor& b) {
  for (int d = 0; d < 4; ++d) {
    if (a.ne[d] != b.ne[d]) return false;
  }
  return true;
}
// Whether the bytes the two views span overlap (conservatively: from first to last byte).
bool overlap(const Tensor& a, const Tensor& b) {
  const auto span = [](const Tensor& t) {
    int64_t end = t.row_bytes();
    for (int d = 1; d < 4; ++d) end += (t.ne[d] - 1) * t.nb[d];
    const auto* p = static_cast<const char*>(t.data);
    return std::pair{p, p + end};
  };
  const auto [a0, a1] = span(a);
  const auto [b0, b1] = span(b);
  return a0 < b1 && b0 < a1;
}
bool same_rope(const ops::Rope& a, const ops::Rope& b) {
  const ops::RopeParams &p = a.p, &q = b.p;
  return same_view(a.positions, b.positions) && a.freq_factors.tensor.data == b.freq_factors.tensor.data &&
         p.n_rot == q.n_rot && p.layout == q.layout && p.freq_base == q.freq_base && p.scaling == q.scaling &&
         p.factor == q.factor && p.original_context == q.original_context && p.beta_fast == q.beta_fast &&
         p.beta_slow == q.beta_slow && p.attn_factor == q.attn_factor;
}

// The matmuls that start `ops` (up to three; one counts), each writing its own destination that is not x:
// the first where takes_gemv says `gemv`, and the next ones on the same x that join(first, next) allows.
template <class Join>
size_t matmul_run(const Context& ctx, std::span<const ops::Op> ops, bool gemv, const ops::Matmul* (&group)[3],
                  Join join) {
  if (ops.empty()) return 0;  // an add + norm that ends the program
  const auto* first = std::get_if<ops::Matmul>(&ops[0]);
  if (first == nullptr || takes_gemv(ctx, *first) != gemv || overlap(first->dst, first->x)) return 0;
  size_t n = 1;
  group[0] = first;
  while (n < 3 && n < ops.size()) {
    const auto* mm = std::get_if<ops::Matmul>(&ops[n]);
    if (mm == nullptr || !same_view(mm->x, first->x) || !join(*first, *mm) || overlap(mm->dst, first->x)) {
      break;
    }
    bool disjoint = true;
    for (size_t i = 0; i < n; ++i) disjoint = disjoint && !overlap(mm->dst, group[i]->dst);
    if (!disjoint) break;
    group[n++] = mm;
  }
  return n;
}
// ... at GEMV size, with one weight type, k, destination type and weight form: one launch.
size_t gemv_run(const Context& ctx, std::span<const ops::Op> ops, const ops::Matmul* (&group)[3]) {
  return matmul_run(ctx, ops, true, group, [](const ops::Matmul& first, const ops::Matmul& mm) {
    return mm.w.tensor.type == first.w.tensor.type && mm.w.tensor.ne[0] == first.w.tensor.ne[0] &&
           mm.dst.type == first.dst.type && grouped(mm.w) == grouped(first.w);
  });
}
// ... that take the GEMM, with one input type.
size_t gemm_run(const Context& ctx, std::span<const ops::Op> ops, const ops::Matmul* (&group)[3]) {
  return matmul_run(ctx, ops, false, group, [&](const ops::Matmul& first, const ops::Matmul& mm) {
    return !takes_gemv(ctx, mm) && same_gemm_input(ctx, mm, first);
  });
}
// gemm_run of two or three matmuls.
size_t gemm_group(const Context& ctx, std::span<const ops::Op> ops, const ops::Matmul* (&group)[3]) {
  const size_t n = gemm_run(ctx, ops, group);
  return n > 1 ? n : 0;
}
// gemv_run of two or three matmuls.
size_t gemv_group(const Context& ctx, std::span<const ops::Op> ops, const ops::Matmul* (&group)[3]) {
  const size_t n = gemv_run(ctx, ops, group);
  return n > 1 ? n : 0;
}

}  // namespace

namespace {

constexpr int64_t kAttentionRoundsMaxK = 2048;

// Whether x is t's elements viewed as rows of x.ne[0] (both contiguous): a matmul's view of a [head_dim,
// heads, tokens] result as [head_dim * heads, tokens].
bool flat_view_of(const Tensor& x, const Tensor& t) {
  return x.data == t.data && x.type == t.type && x.is_contiguous() && t.is_contiguous() &&
         x.n_elements() == t.n_elements() && x.ne[0] % t.ne[0] == 0;
}

// x = x + y; h = rms_norm(x): the residual add and the next norm (no broadcast; all f32 but h).
bool add_norm_pair(const ops::Op& a, const ops::Op& b) {
  const auto* add = std::get_if<ops::Binary>(&a);
  const auto* norm = std::get_if<ops::RmsNorm>(&b);
  return add != nullptr && norm != nullptr && add->kind == ops::BinaryKind::binary_kind_add &&
         add->dst.type == DType::f32 && same_shape(add->a, add->b.tensor) && same_shape(add->a, add->dst) &&
         same_view(norm->x, add->dst) && !overlap(norm->dst, add->a) && !overlap(norm->dst, add->b.tensor) &&
         !overlap(norm->dst, add->dst) && !overlap(add->dst, add->b.tensor);
}

// RoPE of q and of k, then the KV write of that k into the pools rope_kv_write writes (rope_kv_write_pools:
// f16, f32, or q8_0 or q8_64 both; rope_after, which asks here, gives 8-bit pools a GEMV that stores plainly
// and rope_kv_write after it).
bool rope_kv_triple(const ops::Op& a, const ops::Op& b, const ops::Op& c) {
  const auto* rq = std::get_if<ops::Rope>(&a);
  const auto* rk = std::get_if<ops::Rope>(&b);
  const auto* kv = std::get_if<ops::KvWrite>(&c);
  return rq != nullptr && rk != nullptr && kv != nullptr && same_rope(*rq, *rk) && rope_supported(rq->p) &&
         rq->x.ne[0] == rk->x.ne[0] && rq->x.ne[2] == rk->x.ne[2] && rq->x.ne[3] == 1 && rk->x.ne[3] == 1 &&
         same_view(kv->k, rk->dst) && same_shape(kv->v, kv->k) && !overlap(rq->dst, rk->x) &&
         !overlap(rq->dst, rk->dst) && !overlap(rq->dst, kv->v) && !overlap(rk->dst, kv->v) &&
         !overlap(rq->x, rk->dst) && rope_kv_write_pools(*kv);
}

// The RoPE of q and k and the KV write (rope_kv_triple) that start `ops`, on the results of `group`, the Q,
// K and V matmuls of one GEMV (n of them): q and k rotated in place, the matmuls' destinations their views
// as [head_dim * heads, tokens] (gemv_rope_ok: the rest). 3 when the GEMV takes them, else 0.
size_t rope_after(const Context& ctx, std::span<const ops::Op> ops, const ops::Matmul* const (&group)[3],
                  size_t n) {
  if (n != 3 || ops.size() < 3 || !rope_kv_triple(ops[0], ops[1], ops[2])) return 0;
  const auto& rq = std::get<ops::Rope>(ops[0]);
  const auto& rk = std::get<ops::Rope>(ops[1]);
  const auto& kv = std::get<ops::KvWrite>(ops[2]);
  const bool views = same_view(rq.x, rq.dst) && same_view(rk.x, rk.dst) &&
                     flat_view_of(group[0]->dst, rq.x) && flat_view_of(group[1]->dst, rk.x) &&
                     flat_view_of(group[2]->dst, kv.v) && group[0]->dst.ne[0] == rq.x.ne[0] * rq.x.ne[1] &&
                     group[1]->dst.ne[0] == rk.x.ne[0] * rk.x.ne[1] &&
                     group[2]->dst.ne[0] == kv.v.ne[0] * kv.v.ne[1] && kv.v.ne[0] == rq.x.ne[0];
  return views && gemv_rope_ok(ctx, std::span(group, n), RopeOps{&rq, &rk, &kv}) ? 3 : 0;
}

// After Q and K of one GEMV launch (group, n == 2), V on the same x with a weight of another type (and the
// same k, and like them on the integer GEMV: gemv_rope_ok) and the RoPE + KV write of the three (rope_after),
// which start `ops`: 4, else 0.
size_t v_rope_after(const Context& ctx, std::span<const ops::Op> ops, const ops::Matmul* const (&group)[3],
                    size_t n) {
  if (n != 2 || ops.empty()) return 0;
  const auto* v = std::get_if<ops::Matmul>(&ops[0]);
  const ops::Matmul& q = *group[0];
  if (v == nullptr || !same_view(v->x, q.x) || v->w.tensor.type == q.w.tensor.type || overlap(v->dst, q.x) ||
      overlap(v->dst, group[0]->dst) || overlap(v->dst, group[1]->dst)) {
    return 0;
  }
  const ops::Matmul* const qkv[3] = {group[0], group[1], v};
  return rope_after(ctx, ops.subspan(1), qkv, 3) > 0 ? 4 : 0;
}

// A gate and an up matmul (gemv_pairs) and the gated activation of exactly their results, f32 of their shape,
// written over the gate or up or apart from them and x: gemv_act_pair.
bool act_pair(const Context& ctx, std::span<const ops::Op> ops) {
  if (ops.size() < 3) return false;
  const ops::Matmul* group[3] = {};
  const auto* glu = std::get_if<ops::GatedAct>(&ops[2]);
  if (glu == nullptr || gemv_run(ctx, ops, group) < 2 || !gemv_pairs(ctx, *group[0], *group[1])) return false;
  const Tensor &g = group[0]->dst, &u = group[1]->dst, &x = group[0]->x;
  return same_view(glu->gate, g) && same_view(glu->up, u) && same_shape(g, u) &&
         glu->dst.type == DType::f32 && same_shape(glu->dst, g) &&
         (same_view(glu->dst, g) || same_view(glu->dst, u) ||
          (!overlap(glu->dst, g) && !overlap(glu->dst, u) && !overlap(glu->dst, x)));
}

}  // namespace

size_t fused_length(const Context& ctx, std::span<const ops::Op> ops) {
  if (ops.size() < 2) return 0;
  if (act_pair(ctx, ops)) return 3;
  if (const ops::Matmul * group[3]; const size_t n = gemv_group(ctx, ops, group)) {
    if (const size_t v = v_rope_after(ctx, ops.subspan(n), group, n)) return n + v;
    return n + rope_after(ctx, ops.subspan(n), group, n);
  }
  if (const ops::Matmul * group[3]; const size_t n = gemm_group(ctx, ops, group)) return n;
  if (add_norm_pair(ops[0], ops[1])) {
    const auto& norm = std::get<ops::RmsNorm>(ops[1]);
    if (norm.dst.type != DType::f32) return 2;
    // ... and the integer GEMVs that read the norm's f32 result, which the norm's kernel rounds for them,
    const ops::Matmul* group[3] = {};
    if (const size_t n = gemv_run(ctx, ops.subspan(2), group);
        n > 0 && same_view(group[0]->x, norm.dst) && takes_q8(ctx, *group[0])) {
      if (const size_t v = v_rope_after(ctx, ops.subspan(2 + n), group, n)) return 2 + n + v;
      return 2 + n + rope_after(ctx, ops.subspan(2 + n), group, n);
    }
    // ... or the GEMMs that read it in 16 bits, which the norm's kernel writes for them, or in e4m3, which it
    // rounds it to for them.
    if (const size_t n = gemm_run(ctx, ops.subspan(2), group);
        n > 0 && same_view(group[0]->x, norm.dst) &&
        (gemm_takes_half_x(ctx, *group[0]) || produced_e4m3_x(ctx, std::span(group, n)))) {
      return 2 + n;
    }
    return 2;
  }
  if (const auto* glu = std::get_if<ops::GatedAct>(&ops[0]); glu != nullptr && glu->dst.type == DType::f32) {
    // A gated activation and the integer GEMVs that read its result, which its kernel rounds for them, or the
    // GEMMs that read it in 16 bits or e4m3, which its kernel writes for them.
    const ops::Matmul* group[3] = {};
    if (const size_t n = gemv_run(ctx, ops.subspan(1), group);
        n > 0 && same_view(group[0]->x, glu->dst) && takes_q8(ctx, *group[0]) && glu->up.ne[0] % 32 == 0) {
      return 1 + n;
    }
    if (const size_t n = gemm_run(ctx, ops.subspan(1), group);
        n > 0 && same_view(group[0]->x, glu->dst) &&
        (gemm_takes_half_x(ctx, *group[0]) ||
         (produced_e4m3_x(ctx, std::span(group, n)) && gated_act_rounds_e4m3(*glu)))) {
      return 1 + n;
    }
  }
  if (const auto* att = std::get_if<ops::Attention>(&ops[0]);
      att != nullptr && attention_writes_half(ctx, *att)) {
    // A prefill's attention and the GEMM that reads its result (the output projection) in 16 bits, which
    // its kernel writes for it.
    const ops::Matmul* group[3] = {};
    if (const size_t n = gemm_run(ctx, ops.subspan(1), group);
        n > 0 && flat_view_of(group[0]->x, att->dst) && gemm_takes_half_x(ctx, *group[0])) {
      return 1 + n;
    }
  }
  // A decode's attention and the integer GEMV that reads its result (the output projection), which its
  // kernel rounds for it, where that GEMV's rows are short (k <= kAttentionRoundsMaxK): such a GEMV is bound
  // by its launch and fixed costs, and one kernel fewer pays. On the H200 (`kiln bench -p 0 -n 128 --batch
  // 1,4`, three interleaved rounds, tokens/s) the 135M-shaped Q4_0 model's decode went from 1,072-1,100 to
  // 1,120-1,126, and 4 requests from 3,140-3,193 to 3,235-3,309; on the 8B (k = 4096), where the rounding
  // lands on the attention's merge, the last block of a split, Q8_0 went from 312-314 to 308-310 and Q4_0
  // from 404-408 to 399-405, hence the bound.
  if (const auto* att = std::get_if<ops::Attention>(&ops[0]);
      att != nullptr && attention_rounds_q8(ctx, *att)) {
    const ops::Matmul* group[3] = {};
    if (const size_t n = gemv_run(ctx, ops.subspan(1), group); n > 0 && flat_view_of(group[0]->x, att->dst) &&
                                                               takes_q8(ctx, *group[0]) &&
                                                               group[0]->x.ne[0] <= kAttentionRoundsMaxK) {
      return 1 + n;
    }
  }
  if (ops.size() >= 3 && rope_kv_triple(ops[0], ops[1], ops[2])) return 3;
  return 0;
}

L2Ahead weights_ahead(const Context& ctx, std::span<const ops::Op> ops, int64_t cap) {
  L2Ahead ahead;
  size_t i = 0;
  while (i < ops.size() && !std::holds_alternative<ops::Matmul>(ops[i])) ++i;
  const ops::Matmul* group[3] = {};
  const size_t n = cap > 0 && i < ops.size() ? gemv_run(ctx, ops.subspan(i), group) : 0;
  int64_t total = 0;
  for (size_t j = 0; j < n; ++j) {
    const Tensor& w = group[j]->w.tensor;
    const auto begin = reinterpret_cast<uintptr_t>(w.data);
    const uintptr_t end = begin + static_cast<uintptr_t>(w.row_bytes() + (w.ne[1] - 1) * w.nb[1]);
    const uintptr_t first = (begin + 15) & ~uintptr_t{15};
    ahead.p[j] = reinterpret_cast<const void*>(first);
    ahead.bytes[j] = end > first ? static_cast<int64_t>((end - first) & ~uintptr_t{15}) : 0;
    total += ahead.bytes[j];
  }
  return total <= cap ? ahead : L2Ahead{};
}

cudaError_t run_fused(const Context& ctx, std::span<const ops::Op> ops, size_t& consumed) {
  consumed = fused_length(ctx, ops);
  if (consumed == 0) return cudaSuccess;
  if (act_pair(ctx, ops)) {
    return gemv_act_pair(ctx, std::get<ops::Matmul>(ops[0]), std::get<ops::Matmul>(ops[1]),
                         std::get<ops::GatedAct>(ops[2]));
  }
  // The matmuls of ops[from, to), and the RoPE + KV write after them when the sequence goes on past them.
  const ops::Matmul* group[3] = {};
  RopeOps rope{};
  const auto matmuls = [&](size_t from, size_t to) {
    size_t n = 0;
    while (from + n < to && n < 3 && std::holds_alternative<ops::Matmul>(ops[from + n])) {
      group[n] = &std::get<ops::Matmul>(ops[from + n]);
      ++n;
    }
    if (from + n < to) {
      rope = {&std::get<ops::Rope>(ops[from + n]), &std::get<ops::Rope>(ops[from + n + 1]),
              &std::get<ops::KvWrite>(ops[from + n + 2])};
    }
    return std::span<const ops::Matmul* const>(group, n);
  };
  if (std::holds_alternative<ops::Matmul>(ops[0])) {
    const auto mms = matmuls(0, consumed);
    if (rope.q != nullptr) return matmul_gemv_rope_group(ctx, mms, rope);
    return takes_gemv(ctx, *group[0]) ? matmul_gemv_group(ctx, mms) : matmul_gemm_group(ctx, mms);
  }
  if (std::holds_alternative<ops::Binary>(ops[0])) {
    const auto& add = std::get<ops::Binary>(ops[0]);
    const auto& norm = std::get<ops::RmsNorm>(ops[1]);
    if (consumed == 2) return add_rms_norm(ctx, add, norm);
    const auto mms = matmuls(2, consumed);
    if (rope.q != nullptr) return add_norm_gemv_rope_group(ctx, add, norm, mms, rope);
    return takes_gemv(ctx, *group[0]) ? add_norm_gemv_group(ctx, add, norm, mms)
                                      : add_norm_gemm_group(ctx, add, norm, mms);
  }
  if (const auto* glu = std::get_if<ops::GatedAct>(&ops[0])) {
    const auto mms = matmuls(1, consumed);
    return takes_gemv(ctx, *group[0]) ? glu_gemv_group(ctx, *glu, mms) : glu_gemm_group(ctx, *glu, mms);
  }
  if (const auto* att = std::get_if<ops::Attention>(&ops[0])) {
    const auto mms = matmuls(1, consumed);
    return takes_gemv(ctx, *group[0]) ? attention_gemv_group(ctx, *att, mms)
                                      : attention_gemm_group(ctx, *att, mms);
  }
  return rope_kv_write(ctx, std::get<ops::Rope>(ops[0]), std::get<ops::Rope>(ops[1]),
                       std::get<ops::KvWrite>(ops[2]));
}

}  // namespace kiln::cuda
