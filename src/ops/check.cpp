// check(): operand validation for every op contract in ops.h.
#include <algorithm>
#include <cmath>
#include <numbers>

#include "ops/collective.h"
#include "ops/ops.h"
#include "ops/sample.h"

namespace kiln::ops {

namespace {

bool same_shape(const Tensor& a, const Tensor& b) { return a.ne == b.ne; }

Status need_f32(std::string_view op, std::string_view name, const Tensor& t) {
  if (t.data == nullptr) return invalid_argument("{}: {} has no data", op, name);
  if (t.type != DType::f32)
    return invalid_argument("{}: {} must be f32, not {}", op, name, dtype_name(t.type));
  if (t.nb[0] != 4) return invalid_argument("{}: {} must be contiguous in its first dimension", op, name);
  return Status::ok_status();
}

// A float activation destination: f32, f16 or bf16, contiguous in its first dimension.
Status need_float(std::string_view op, std::string_view name, const Tensor& t) {
  if (t.data == nullptr) return invalid_argument("{}: {} has no data", op, name);
  if (!is_float_activation(t.type))
    return invalid_argument("{}: {} must be f32, f16 or bf16, not {}", op, name, dtype_name(t.type));
  if (t.nb[0] != dtype_info(t.type).type_size)
    return invalid_argument("{}: {} must be contiguous in its first dimension", op, name);
  return Status::ok_status();
}

// A contiguous i32 tensor of n elements (step metadata, ids).
Status need_i32(std::string_view op, std::string_view name, const Tensor& t, int64_t n) {
  if (t.data == nullptr) return invalid_argument("{}: {} has no data", op, name);
  if (t.type != DType::i32)
    return invalid_argument("{}: {} must be i32, not {}", op, name, dtype_name(t.type));
  if (!t.is_contiguous()) return invalid_argument("{}: {} must be contiguous", op, name);
  if (n >= 0 && t.n_elements() != n)
    return invalid_argument("{}: {} is {}, expected {} elements", op, name, t.describe(), n);
  return Status::ok_status();
}

Status need_same(std::string_view op, std::string_view a_name, const Tensor& a, std::string_view b_name,
                 const Tensor& b) {
  if (!same_shape(a, b)) {
    return invalid_argument("{}: {} is {} but {} is {}", op, a_name, a.describe(), b_name, b.describe());
  }
  return Status::ok_status();
}

Status need_vector(std::string_view op, std::string_view name, const Tensor& t, int64_t n) {
  if (t.data == nullptr) return Status::ok_status();
  KILN_TRY(need_f32(op, name, t));
  if (t.n_elements() != n || t.ne[0] != n) {
    return invalid_argument("{}: {} is {}, expected f32[{}]", op, name, t.describe(), n);
  }
  return Status::ok_status();
}

Status need_pool(std::string_view op, std::string_view name, const Tensor& pool, int64_t head_dim,
                 int64_t n_kv) {
  if (pool.data == nullptr) return invalid_argument("{}: {} has no data", op, name);
  if (pool.type != DType::f32 && pool.type != DType::f16 && pool.type != DType::q8_0 &&
      pool.type != DType::q8_64) {
    return invalid_argument("{}: {} must be f32, f16, q8_0 or q8_64, not {}", op, name,
                            dtype_name(pool.type));
  }
  if (const int64_t block = dtype_info(pool.type).block_size; head_dim % block != 0) {
    return invalid_argument("{}: {} is {} but head_dim {} is not a multiple of its {}-value blocks", op, name,
                            dtype_name(pool.type), head_dim, block);
  }
  if (!pool.is_contiguous()) return invalid_argument("{}: {} must be contiguous", op, name);
  if (pool.ne[0] != head_dim || pool.ne[1] != n_kv) {
    return invalid_argument("{}: {} is {}, expected [{}, {}, block_size, n_blocks]", op, name,
                            pool.describe(), head_dim, n_kv);
  }
  if (pool.ne[2] <= 0) return invalid_argument("{}: {} block_size = {} must be > 0", op, name, pool.ne[2]);
  return Status::ok_status();
}

}  // namespace

Status check(const GetRows& op) {
  const Tensor& table = op.table.tensor;
  if (table.data == nullptr) return invalid_argument("get_rows: table has no data");
  if (dtype_info(table.type).dequantize_row == nullptr && table.type != DType::f32) {
    return invalid_argument("get_rows: table type {} has no dequantizer", dtype_name(table.type));
  }
  KILN_TRY(need_float("get_rows", "dst", op.dst));
  if (table.ne[2] != 1 || table.ne[3] != 1)
    return invalid_argument("get_rows: table must be 2-d, not {}", table.describe());
  KILN_TRY(need_i32("get_rows", "ids", op.ids, -1));
  if (op.dst.ne[0] != table.ne[0] || op.dst.n_rows() != op.ids.n_elements()) {
    return invalid_argument("get_rows: dst is {}, expected [{}, {}]", op.dst.describe(), table.ne[0],
                            op.ids.n_elements());
  }
  return Status::ok_status();
}

Status check(const Matmul& op) {
  const Tensor& w = op.w.tensor;
  if (w.data == nullptr) return invalid_argument("matmul: w has no data");
  const DTypeInfo& info = dtype_info(w.type);
  if (info.dequantize_row == nullptr && w.type != DType::f32) {
    return invalid_argument("matmul: weight type {} has no dequantizer", info.name);
  }
  if (w.nb[0] != info.type_size || w.ne[2] != 1 || w.ne[3] != 1) {
    return invalid_argument("matmul: w must be a 2-d tensor with contiguous rows, not {}", w.describe());
  }
  KILN_TRY(need_f32("matmul", "x", op.x));
  KILN_TRY(need_float("matmul", "dst", op.dst));
  if (op.x.ne[0] != w.ne[0]) {
    return invalid_argument("matmul: x is {} but w is {} (inner dimensions differ)", op.x.describe(),
                            w.describe());
  }
  if (op.dst.ne[0] != w.ne[1] || op.dst.n_rows() != op.x.n_rows()) {
    return invalid_argument("matmul: dst is {}, expected [{}, {}]", op.dst.describe(), w.ne[1],
                            op.x.n_rows());
  }
  return Status::ok_status();
}

Status check(const RmsNorm& op) {
  KILN_TRY(need_f32("rms_norm", "x", op.x));
  KILN_TRY(need_float("rms_norm", "dst", op.dst));
  KILN_TRY(need_same("rms_norm", "x", op.x, "dst", op.dst));
  KILN_TRY(need_vector("rms_norm", "w", op.w.tensor, op.x.ne[0]));
  if (!(op.eps >= 0.0f) || !std::isfinite(op.eps))
    return invalid_argument("rms_norm: eps = {} is not >= 0", op.eps);
  return Status::ok_status();
}

Status check(const LayerNorm& op) {
  KILN_TRY(need_f32("layer_norm", "x", op.x));
  KILN_TRY(need_f32("layer_norm", "dst", op.dst));
  KILN_TRY(need_same("layer_norm", "x", op.x, "dst", op.dst));
  KILN_TRY(need_vector("layer_norm", "w", op.w.tensor, op.x.ne[0]));
  KILN_TRY(need_vector("layer_norm", "b", op.b.tensor, op.x.ne[0]));
  if (!(op.eps >= 0.0f) || !std::isfinite(op.eps))
    return invalid_argument("layer_norm: eps = {} is not >= 0", op.eps);
  return Status::ok_status();
}

Status check(const Rope& op) {
  KILN_TRY(need_f32("rope", "x", op.x));
  KILN_TRY(need_f32("rope", "dst", op.dst));
  KILN_TRY(need_same("rope", "x", op.x, "dst", op.dst));
  const RopeParams& p = op.p;
  if (p.n_rot <= 0 || p.n_rot % 2 != 0 || p.n_rot > op.x.ne[0]) {
    return invalid_argument("rope: n_rot = {} must be even and in (0, head_dim = {}]", p.n_rot, op.x.ne[0]);
  }
  if (!(p.freq_base > 0.0f) || !std::isfinite(p.freq_base))
    return invalid_argument("rope: freq_base = {} is not > 0", p.freq_base);
  if (!(p.factor > 0.0f) || !std::isfinite(p.factor))
    return invalid_argument("rope: scaling factor = {} is not > 0", p.factor);
  if (p.scaling == RopeScaling::rope_scaling_yarn && p.original_context <= 0) {
    return invalid_argument("rope: original_context = {} must be > 0 for yarn scaling", p.original_context);
  }
  if (op.x.ne[3] != 1) return invalid_argument("rope: x is {}, expected 3-d", op.x.describe());
  KILN_TRY(need_i32("rope", "positions", op.positions, op.x.ne[2]));
  KILN_TRY(need_vector("rope", "freq_factors", op.freq_factors.tensor, p.n_rot / 2));
  return Status::ok_status();
}

Status check(const Softmax& op) {
  KILN_TRY(need_f32("softmax", "x", op.x));
  KILN_TRY(need_f32("softmax", "dst", op.dst));
  KILN_TRY(need_same("softmax", "x", op.x, "dst", op.dst));
  if (!std::isfinite(op.scale)) return invalid_argument("softmax: scale = {} is not finite", op.scale);
  return Status::ok_status();
}

Status check(const KvWrite& op) {
  KILN_TRY(need_f32("kv_write", "k", op.k));
  KILN_TRY(need_f32("kv_write", "v", op.v));
  KILN_TRY(need_same("kv_write", "k", op.k, "v", op.v));
  if (op.k.ne[3] != 1)
    return invalid_argument("kv_write: k is {}, expected 3-d [head_dim, n_kv_heads, n_tokens]",
                            op.k.describe());
  KILN_TRY(need_pool("kv_write", "k_pool", op.k_pool, op.k.ne[0], op.k.ne[1]));
  KILN_TRY(need_pool("kv_write", "v_pool", op.v_pool, op.k.ne[0], op.k.ne[1]));
  KILN_TRY(need_same("kv_write", "k_pool", op.k_pool, "v_pool", op.v_pool));
  if (op.k_pool.type != op.v_pool.type) return invalid_argument("kv_write: k_pool and v_pool types differ");
  KILN_TRY(need_i32("kv_write", "slots", op.slots, op.k.ne[2]));
  return Status::ok_status();
}

Status check(const Attention& op) {
  KILN_TRY(need_f32("attention", "q", op.q));
  KILN_TRY(need_f32("attention", "dst", op.dst));
  KILN_TRY(need_same("attention", "q", op.q, "dst", op.dst));
  const int64_t head_dim = op.q.ne[0], n_heads = op.q.ne[1], n_tokens = op.q.ne[2];
  const int64_t n_kv = op.k_pool.ne[1];
  KILN_TRY(need_pool("attention", "k_pool", op.k_pool, head_dim, n_kv));
  KILN_TRY(need_pool("attention", "v_pool", op.v_pool, head_dim, n_kv));
  KILN_TRY(need_same("attention", "k_pool", op.k_pool, "v_pool", op.v_pool));
  if (op.k_pool.type != op.v_pool.type) {
    return invalid_argument("attention: k_pool is {} but v_pool is {}", dtype_name(op.k_pool.type),
                            dtype_name(op.v_pool.type));
  }
  if (op.q.ne[3] != 1)
    return invalid_argument("attention: q is {}, expected 3-d [head_dim, n_heads, n_tokens]",
                            op.q.describe());
  if (n_kv <= 0 || n_heads % n_kv != 0) {
    return invalid_argument("attention: {} query heads are not a multiple of {} kv heads", n_heads, n_kv);
  }
  KILN_TRY(need_i32("attention", "positions", op.positions, n_tokens));
  KILN_TRY(need_i32("attention", "seq", op.seq, n_tokens));
  KILN_TRY(need_i32("attention", "bt_indptr", op.bt_indptr, -1));
  KILN_TRY(need_i32("attention", "bt_indices", op.bt_indices, -1));
  if (op.bt_indptr.n_elements() < 2) {
    return invalid_argument("attention: bt_indptr is {}, expected [n_seqs + 1] with n_seqs >= 1",
                            op.bt_indptr.describe());
  }
  if (!std::isfinite(op.scale) || !(op.softcap >= 0.0f) || op.window < 0) {
    return invalid_argument("attention: scale = {}, softcap = {}, window = {} out of range", op.scale,
                            op.softcap, op.window);
  }
  return Status::ok_status();
}

Status check(const GatedAct& op) {
  KILN_TRY(need_f32("gated_act", "gate", op.gate));
  KILN_TRY(need_f32("gated_act", "up", op.up));
  KILN_TRY(need_float("gated_act", "dst", op.dst));
  KILN_TRY(need_same("gated_act", "up", op.up, "dst", op.dst));
  if (!same_shape(op.gate, op.up) && !(op.gate.ne[0] == 1 && op.gate.n_rows() == op.up.n_rows())) {
    return invalid_argument("gated_act: gate is {} but up is {} (expected the same shape or [1, {}])",
                            op.gate.describe(), op.up.describe(), op.up.n_rows());
  }
  return Status::ok_status();
}

Status check(const Binary& op) {
  const Tensor& b = op.b.tensor;
  KILN_TRY(need_f32("binary", "a", op.a));
  KILN_TRY(need_f32("binary", "b", b));
  KILN_TRY(need_float("binary", "dst", op.dst));
  KILN_TRY(need_same("binary", "a", op.a, "dst", op.dst));
  if (!same_shape(op.a, b) && !(b.ne[0] == op.a.ne[0] && b.n_rows() == 1)) {
    return invalid_argument("binary: b is {}, expected {} or [{}]", b.describe(), op.a.describe(),
                            op.a.ne[0]);
  }
  return Status::ok_status();
}

Status check(const Scale& op) {
  KILN_TRY(need_f32("scale", "x", op.x));
  KILN_TRY(need_f32("scale", "dst", op.dst));
  KILN_TRY(need_same("scale", "x", op.x, "dst", op.dst));
  if (!std::isfinite(op.scale)) return invalid_argument("scale: scale = {} is not finite", op.scale);
  return Status::ok_status();
}

Status check(const Argmax& op) {
  KILN_TRY(need_f32("argmax", "x", op.x));
  if (op.x.ne[0] <= 0) return invalid_argument("argmax: x is {}", op.x.describe());
  KILN_TRY(need_i32("argmax", "out", op.out, op.x.n_rows()));
  return Status::ok_status();
}

Status check(const Sample& op) {
  KILN_TRY(need_f32("sample", "x", op.x));
  const int64_t rows = op.x.n_rows();
  if (op.x.ne[0] <= 0) return invalid_argument("sample: x is {}", op.x.describe());
  KILN_TRY(need_i32("sample", "rows", op.rows, 16 * rows));
  if (op.rows.ne[0] != 16)
    return invalid_argument("sample: rows is {}, expected i32[16, {}]", op.rows.describe(), rows);
  if (op.adjust.n_elements() > 0) {
    KILN_TRY(need_i32("sample", "adjust", op.adjust, -1));
    if (op.adjust.ne[0] != 4)
      return invalid_argument("sample: adjust is {}, expected i32[4, n]", op.adjust.describe());
  }
  KILN_TRY(need_i32("sample", "out", op.out, -1));
  if (op.out.ne[0] < 2 || op.out.ne[0] % 2 != 0 || op.out.ne[0] > 2 + 2 * kSampleMaxTop ||
      op.out.n_rows() != rows) {
    return invalid_argument("sample: out is {}, expected i32[2 + 2 * n_top (n_top <= {}), {}]",
                            op.out.describe(), kSampleMaxTop, rows);
  }
  if (sample_op_has_mask(op)) {
    KILN_TRY(need_i32("sample", "mask", op.mask, -1));
    if (op.mask.ne[0] != (op.x.ne[0] + 31) / 32 || op.mask.ne[2] != 1 || op.mask.ne[3] != 1) {
      return invalid_argument("sample: mask is {}, expected i32[{}, n_mask_rows]", op.mask.describe(),
                              (op.x.ne[0] + 31) / 32);
    }
  }
  return Status::ok_status();
}

Status check(const MoeRoute& op) {
  KILN_TRY(need_f32("moe_route", "logits", op.logits));
  KILN_TRY(need_f32("moe_route", "weights", op.weights));
  const int64_t n_expert = op.logits.ne[0], n_used = op.weights.ne[0], n_tokens = op.logits.n_rows();
  if (n_used < 1 || n_used > n_expert || op.weights.n_rows() != n_tokens) {
    return invalid_argument("moe_route: weights is {}, expected f32[n_used in [1, {}], {}]",
                            op.weights.describe(), n_expert, n_tokens);
  }
  KILN_TRY(need_i32("moe_route", "ids", op.ids, n_used * n_tokens));
  return Status::ok_status();
}

Status check(const MoeMatmul& op) {
  const Tensor& w = op.w.tensor;
  if (w.data == nullptr) return invalid_argument("moe_matmul: w has no data");
  const DTypeInfo& info = dtype_info(w.type);
  if (info.dequantize_row == nullptr && w.type != DType::f32) {
    return invalid_argument("moe_matmul: weight type {} has no dequantizer", info.name);
  }
  if (w.nb[0] != info.type_size || w.ne[3] != 1) {
    return invalid_argument(
        "moe_matmul: w must be a 3-d tensor [k, n, n_expert] with contiguous rows, not {}", w.describe());
  }
  KILN_TRY(need_f32("moe_matmul", "x", op.x));
  KILN_TRY(need_f32("moe_matmul", "dst", op.dst));
  const int64_t n_used = op.dst.ne[1], n_tokens = op.dst.ne[2];
  if (op.dst.ne[0] != w.ne[1] || op.dst.ne[3] != 1) {
    return invalid_argument("moe_matmul: dst is {}, expected f32[{}, n_used, n_tokens]", op.dst.describe(),
                            w.ne[1]);
  }
  if (op.x.ne[0] != w.ne[0] || (op.x.ne[1] != 1 && op.x.ne[1] != n_used) || op.x.ne[2] != n_tokens ||
      op.x.ne[3] != 1) {
    return invalid_argument("moe_matmul: x is {}, expected f32[{}, 1 or {}, {}] for w {} and dst {}",
                            op.x.describe(), w.ne[0], n_used, n_tokens, w.describe(), op.dst.describe());
  }
  KILN_TRY(need_i32("moe_matmul", "ids", op.ids, n_used * n_tokens));
  return Status::ok_status();
}

Status check(const WeightedSum& op) {
  KILN_TRY(need_f32("weighted_sum", "y", op.y));
  KILN_TRY(need_f32("weighted_sum", "w", op.w));
  KILN_TRY(need_f32("weighted_sum", "dst", op.dst));
  const int64_t n = op.y.ne[0], n_slots = op.y.ne[1], n_tokens = op.y.ne[2];
  if (op.y.ne[3] != 1) {
    return invalid_argument("weighted_sum: y is {}, expected 3-d [n, n_slots, n_tokens]", op.y.describe());
  }
  if (op.w.ne[0] != n_slots || op.w.n_rows() != n_tokens) {
    return invalid_argument("weighted_sum: w is {}, expected f32[{}, {}]", op.w.describe(), n_slots,
                            n_tokens);
  }
  if (op.dst.ne[0] != n || op.dst.n_rows() != n_tokens) {
    return invalid_argument("weighted_sum: dst is {}, expected f32[{}, {}]", op.dst.describe(), n, n_tokens);
  }
  return Status::ok_status();
}

Status check(const SumSquares& op) {
  KILN_TRY(need_f32("sum_squares", "x", op.x));
  KILN_TRY(need_f32("sum_squares", "sums", op.sums));
  KILN_TRY(need_f32("sum_squares", "counts", op.counts));
  const int64_t n = op.x.ne[0], n_mat = op.sums.ne[1];
  if (op.sums.ne[0] != n || n_mat < 1 || op.sums.ne[2] != 1 || op.sums.ne[3] != 1) {
    return invalid_argument("sum_squares: sums is {}, expected f32[{}, n_mat]", op.sums.describe(), n);
  }
  if (op.counts.ne[0] != 1 || op.counts.ne[1] != n_mat || op.counts.ne[2] != 1 || op.counts.ne[3] != 1) {
    return invalid_argument("sum_squares: counts is {}, expected f32[1, {}]", op.counts.describe(), n_mat);
  }
  if (op.amax.data != nullptr) {
    KILN_TRY(need_f32("sum_squares", "amax", op.amax));
    if (op.amax.ne[0] != 1 || op.amax.ne[1] != n_mat || op.amax.ne[2] != 1 || op.amax.ne[3] != 1)
      return invalid_argument("sum_squares: amax is {}, expected f32[1, {}]", op.amax.describe(), n_mat);
  }
  if (op.ids.data == nullptr) {
    if (n_mat != 1) {
      return invalid_argument("sum_squares: sums is {} but without ids every row goes to one matrix",
                              op.sums.describe());
    }
    if (op.gram.data != nullptr) {
      KILN_TRY(need_f32("sum_squares", "gram", op.gram));
      if (op.gram.ne[0] != n || op.gram.ne[1] != n || op.gram.ne[2] != 1 || op.gram.ne[3] != 1) {
        return invalid_argument("sum_squares: gram is {}, expected f32[{}, {}]", op.gram.describe(), n, n);
      }
    }
    return Status::ok_status();
  }
  if (op.gram.data != nullptr)
    return invalid_argument("sum_squares: a Gram matrix is collected for one matrix only, not with ids");
  KILN_TRY(need_i32("sum_squares", "ids", op.ids, -1));
  if (op.ids.ne[2] != 1 || op.ids.ne[3] != 1) {
    return invalid_argument("sum_squares: ids is {}, expected i32[n_used, n_tokens]", op.ids.describe());
  }
  const int64_t n_used = op.ids.ne[0], n_tokens = op.ids.ne[1];
  if ((op.x.ne[1] != 1 && op.x.ne[1] != n_used) || op.x.ne[2] != n_tokens || op.x.ne[3] != 1) {
    return invalid_argument("sum_squares: x is {}, expected f32[{}, 1 or {}, {}] for ids {}", op.x.describe(),
                            n, n_used, n_tokens, op.ids.describe());
  }
  return Status::ok_status();
}

Status check(const InverseCholesky& op) {
  KILN_TRY(need_f32("inverse_cholesky", "a", op.a));
  KILN_TRY(need_f32("inverse_cholesky", "l", op.l));
  KILN_TRY(need_i32("inverse_cholesky", "status", op.status, 1));
  const int64_t n = op.a.ne[0];
  if (n < 1 || op.a.ne[1] != n || op.a.ne[2] != 1 || op.a.ne[3] != 1 || !op.a.is_contiguous())
    return invalid_argument("inverse_cholesky: a is {}, expected a contiguous f32[n, n]", op.a.describe());
  if (op.l.ne != op.a.ne || !op.l.is_contiguous()) {
    return invalid_argument("inverse_cholesky: l is {}, expected a contiguous f32[{}, {}]", op.l.describe(),
                            n, n);
  }
  const auto* a0 = static_cast<const uint8_t*>(op.a.data);
  const auto* l0 = static_cast<const uint8_t*>(op.l.data);
  const size_t bytes = static_cast<size_t>(n * n) * sizeof(float);
  if (a0 < l0 + bytes && l0 < a0 + bytes) return invalid_argument("inverse_cholesky: l overlaps a");
  if (!(op.lambda >= 0.0) || !std::isfinite(op.lambda))
    return invalid_argument("inverse_cholesky: lambda = {} is not a finite number >= 0", op.lambda);
  return Status::ok_status();
}

namespace {

// Whether two contiguous tensors share a byte.
bool overlap(const Tensor& a, const Tensor& b) {
  const auto* a0 = static_cast<const uint8_t*>(a.data);
  const auto* b0 = static_cast<const uint8_t*>(b.data);
  return a0 < b0 + b.n_rows() * b.row_bytes() && b0 < a0 + a.n_rows() * a.row_bytes();
}

// The operands every collective takes: f32 contiguous x and dst, and a group.
Status check_collective(std::string_view op, const Tensor& x, const Tensor& dst, const Collective* group) {
  KILN_TRY(need_f32(op, "x", x));
  KILN_TRY(need_f32(op, "dst", dst));
  if (!x.is_contiguous()) return invalid_argument("{}: x ({}) must be contiguous", op, x.describe());
  if (!dst.is_contiguous()) return invalid_argument("{}: dst ({}) must be contiguous", op, dst.describe());
  if (group == nullptr) return invalid_argument("{}: no group", op);
  return Status::ok_status();
}

}  // namespace

Status check(const AllReduce& op) {
  KILN_TRY(check_collective("all_reduce", op.x, op.dst, op.group));
  if (!same_shape(op.x, op.dst))
    return invalid_argument("all_reduce: dst is {}, x {}", op.dst.describe(), op.x.describe());
  if (op.dst.data != op.x.data && overlap(op.x, op.dst))
    return invalid_argument("all_reduce: dst overlaps x");
  return Status::ok_status();
}

Status check(const AllGather& op) {
  KILN_TRY(check_collective("all_gather", op.x, op.dst, op.group));
  const int64_t world = op.group->world();
  if (op.x.ne[2] != 1 || op.x.ne[3] != 1 || op.dst.ne[0] != op.x.ne[0] * world ||
      op.dst.ne[1] != op.x.ne[1] || op.dst.ne[2] != 1 || op.dst.ne[3] != 1) {
    return invalid_argument("all_gather: x is {} and dst {}, expected dst [{} * {}, {}]", op.x.describe(),
                            op.dst.describe(), op.x.ne[0], world, op.x.ne[1]);
  }
  if (overlap(op.x, op.dst)) return invalid_argument("all_gather: dst overlaps x");
  return Status::ok_status();
}

Status check(const Op& op) {
  return std::visit([](const auto& o) { return check(o); }, op);
}

bool is_float_activation(DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16; }

const Tensor* float_dst(const Op& op) {
  return std::visit(
      []<class T>(const T& o) -> const Tensor* {
        if constexpr (requires { o.dst; }) {
          return &o.dst;
        } else {
          return nullptr;
        }
      },
      op);
}

std::string_view op_name(const Op& op) {
  static constexpr std::string_view names[] = {
      "get_rows",     "matmul",      "rms_norm",         "layer_norm", "rope",
      "softmax",      "kv_write",    "attention",        "gated_act",  "binary",
      "scale",        "argmax",      "sample",           "moe_route",  "moe_matmul",
      "weighted_sum", "sum_squares", "inverse_cholesky", "all_reduce", "all_gather"};
  static_assert(std::size(names) == std::variant_size_v<Op>);
  return names[op.index()];
}

DType activation_type(DType w) {
  switch (w) {
    case DType::q4_0:
    case DType::q5_0:
    case DType::q8_0:
    case DType::iq4_nl: return DType::q8_0;
    case DType::q4_1:
    case DType::q5_1: return DType::q8_1;
    case DType::q2_k:
    case DType::q3_k:
    case DType::q4_k:
    case DType::q5_k:
    case DType::q6_k:
    case DType::iq2_xxs:
    case DType::iq2_xs:
    case DType::iq2_s:
    case DType::iq3_xxs:
    case DType::iq3_s:
    case DType::iq1_s:
    case DType::iq1_m:
    case DType::iq4_xs: return DType::q8_k;
    default: return DType::f32;
  }
}

}  // namespace kiln::ops
