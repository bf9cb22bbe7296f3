#include "ops/ref/ref.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <vector>

#include "core/half.h"
#include "core/overloaded.h"
#include "ops/collective.h"
#include "ops/rope_freq.h"
#include "ops/sample.h"

namespace kiln::ops::ref {

void row_to_f32(const Tensor& t, const uint8_t* row, float* out) {
  if (t.type == DType::f32) {
    std::memcpy(out, row, t.ne[0] * sizeof(float));
    return;
  }
  dtype_info(t.type).dequantize_row(row, out, t.ne[0]);
}

void store_row(const Tensor& dst, uint8_t* row, const float* v) {
  const int64_t n = dst.ne[0];
  auto* h = reinterpret_cast<uint16_t*>(row);
  switch (dst.type) {
    case DType::f32: std::memcpy(row, v, n * sizeof(float)); return;
    case DType::f16:
      for (int64_t i = 0; i < n; ++i) h[i] = f32_to_f16(v[i]);
      return;
    case DType::bf16:
      for (int64_t i = 0; i < n; ++i) h[i] = f32_to_bf16(v[i]);
      return;
    default: KILN_ASSERT(false && "store_row: not a float activation type");
  }
}

double glu_act(GluKind kind, double x) {
  if (kind == GluKind::glu_kind_silu) return x / (1.0 + std::exp(-x));
  if (kind == GluKind::glu_kind_sigmoid) return 1.0 / (1.0 + std::exp(-x));
  const double c = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
}

void get_rows(const GetRows& op) {
  const auto ids = op.ids.span_as<const int32_t>();
  std::vector<float> row(op.dst.ne[0]);
  for (size_t i = 0; i < ids.size(); ++i) {
    row_to_f32(op.table.tensor, op.table.tensor.row(ids[i]), row.data());
    store_row(op.dst, op.dst.flat_row(static_cast<int64_t>(i)), row.data());
  }
}

void matmul(const Matmul& op, Precision precision) {
  const Tensor& wt = op.w.tensor;
  const int64_t k = wt.ne[0], n = wt.ne[1], m = op.x.n_rows();
  // x as the products see it: rounded through the activation format under precision_fast.
  std::vector<float> xs(static_cast<size_t>(k * m));
  const DType act = precision == Precision::precision_fast ? activation_type(wt.type) : DType::f32;
  std::vector<uint8_t> q(act == DType::f32 ? 0 : static_cast<size_t>(dtype_row_bytes(act, k).value()));
  for (int64_t i = 0; i < m; ++i) {
    const auto* x = reinterpret_cast<const float*>(op.x.flat_row(i));
    if (act == DType::f32) {
      std::copy(x, x + k, xs.data() + i * k);
    } else {
      dtype_info(act).quantize_row(x, q.data(), k);
      dtype_info(act).dequantize_row(q.data(), xs.data() + i * k, k);
    }
  }
  std::vector<float> w(k), y(static_cast<size_t>(n * m));  // y: [n, m]
  for (int64_t j = 0; j < n; ++j) {
    row_to_f32(wt, wt.row(j), w.data());
    for (int64_t i = 0; i < m; ++i) {
      const float* x = xs.data() + i * k;
      double acc = 0.0;
      for (int64_t c = 0; c < k; ++c) acc += static_cast<double>(w[c]) * x[c];
      y[i * n + j] = static_cast<float>(acc);
    }
  }
  for (int64_t i = 0; i < m; ++i) store_row(op.dst, op.dst.flat_row(i), y.data() + i * n);
}

void rms_norm(const RmsNorm& op) {
  const int64_t n = op.x.ne[0];
  const auto* w = static_cast<const float*>(op.w.tensor.data);
  std::vector<float> y(n);
  for (int64_t r = 0; r < op.x.n_rows(); ++r) {
    const auto* x = reinterpret_cast<const float*>(op.x.flat_row(r));
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
    const double inv = 1.0 / std::sqrt(ss / n + op.eps);
    for (int64_t i = 0; i < n; ++i) {
      const double g = w == nullptr ? 1.0 : w[i] + (op.add_one ? 1.0 : 0.0);
      y[i] = static_cast<float>(x[i] * inv * g);
    }
    store_row(op.dst, op.dst.flat_row(r), y.data());
  }
}

void layer_norm(const LayerNorm& op) {
  const int64_t n = op.x.ne[0];
  const auto* w = static_cast<const float*>(op.w.tensor.data);
  const auto* b = static_cast<const float*>(op.b.tensor.data);
  for (int64_t r = 0; r < op.x.n_rows(); ++r) {
    const auto* x = reinterpret_cast<const float*>(op.x.flat_row(r));
    auto* y = reinterpret_cast<float*>(op.dst.flat_row(r));
    double mean = 0.0, var = 0.0;
    for (int64_t i = 0; i < n; ++i) mean += x[i];
    mean /= n;
    for (int64_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
    const double inv = 1.0 / std::sqrt(var / n + op.eps);
    for (int64_t i = 0; i < n; ++i) {
      y[i] = static_cast<float>((x[i] - mean) * inv * (w ? w[i] : 1.0) + (b ? b[i] : 0.0));
    }
  }
}

void rope(const Rope& op) {
  const int64_t head_dim = op.x.ne[0], n_heads = op.x.ne[1], n_tokens = op.x.ne[2];
  const int32_t half = op.p.n_rot / 2;
  const auto positions = op.positions.span_as<const int32_t>();
  const auto* factors = static_cast<const float*>(op.freq_factors.tensor.data);
  std::vector<double> in(head_dim);
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t h = 0; h < n_heads; ++h) {
      const auto* x = op.x.row_as<const float>(h, t);
      auto* y = op.dst.row_as<float>(h, t);
      for (int64_t i = 0; i < head_dim; ++i) in[i] = x[i];
      for (int64_t i = op.p.n_rot; i < head_dim; ++i) y[i] = static_cast<float>(in[i]);
      for (int32_t i = 0; i < half; ++i) {
        const RopeFreq f = rope_freq(op.p, i, factors != nullptr ? factors[i] : 1.0f);
        const double angle = static_cast<double>(positions[t]) * f.theta_scale;
        const double c = std::cos(angle) * f.mscale, s = std::sin(angle) * f.mscale;
        const int64_t a = op.p.layout == RopeLayout::rope_layout_normal ? 2 * i : i;
        const int64_t b = op.p.layout == RopeLayout::rope_layout_normal ? 2 * i + 1 : i + half;
        y[a] = static_cast<float>(in[a] * c - in[b] * s);
        y[b] = static_cast<float>(in[a] * s + in[b] * c);
      }
    }
  }
}

void softmax(const Softmax& op) {
  const int64_t n = op.x.ne[0];
  for (int64_t r = 0; r < op.x.n_rows(); ++r) {
    const auto* x = reinterpret_cast<const float*>(op.x.flat_row(r));
    auto* y = reinterpret_cast<float*>(op.dst.flat_row(r));
    double mx = -INFINITY;
    for (int64_t i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(x[i]) * op.scale);
    double sum = 0.0;
    std::vector<double> e(n);
    for (int64_t i = 0; i < n; ++i) sum += e[i] = std::exp(static_cast<double>(x[i]) * op.scale - mx);
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(e[i] / sum);
  }
}

namespace {

// The pool row (head, slot), as row_to_f32 reads a tensor's row (f16 converted, q8_0 and q8_64 dequantized).
void pool_row(const Tensor& pool, int64_t head, int64_t slot, float* out) {
  const int64_t block_size = pool.ne[2];
  row_to_f32(pool, pool.row(head, slot % block_size, slot / block_size), out);
}

void pool_store(const Tensor& pool, int64_t head, int64_t slot, const float* src) {
  const int64_t block_size = pool.ne[2];
  // f32 copied, f16 rounded to nearest even, q8_0 and q8_64 as llama.cpp's reference rounds q8_0.
  dtype_info(pool.type).quantize_row(src, pool.row(head, slot % block_size, slot / block_size), pool.ne[0]);
}

}  // namespace

void kv_write(const KvWrite& op) {
  const auto slots = op.slots.span_as<const int32_t>();
  for (int64_t t = 0; t < op.k.ne[2]; ++t) {
    for (int64_t h = 0; h < op.k.ne[1]; ++h) {
      pool_store(op.k_pool, h, slots[t], op.k.row_as<const float>(h, t));
      pool_store(op.v_pool, h, slots[t], op.v.row_as<const float>(h, t));
    }
  }
}

void attention(const Attention& op) {
  const int64_t head_dim = op.q.ne[0], n_heads = op.q.ne[1], n_tokens = op.q.ne[2];
  const int64_t group = n_heads / op.k_pool.ne[1], block_size = op.k_pool.ne[2];
  const auto positions = op.positions.span_as<const int32_t>(), seq = op.seq.span_as<const int32_t>();
  const auto indptr = op.bt_indptr.span_as<const int32_t>(), indices = op.bt_indices.span_as<const int32_t>();
  std::vector<double> scores, out(head_dim);
  std::vector<float> row(static_cast<size_t>(head_dim));
  for (int64_t t = 0; t < n_tokens; ++t) {
    const auto table = indices.subspan(indptr[seq[t]], indptr[seq[t] + 1] - indptr[seq[t]]);
    const int64_t last = positions[t];
    const int64_t first = op.window > 0 ? std::max<int64_t>(0, last - op.window + 1) : 0;
    for (int64_t h = 0; h < n_heads; ++h) {
      const auto* q = op.q.row_as<const float>(h, t);
      const int64_t kv_head = h / group;
      scores.assign(last - first + 1, 0.0);
      double mx = -INFINITY;
      for (int64_t p = first; p <= last; ++p) {
        const int64_t slot = table[p / block_size] * block_size + p % block_size;
        pool_row(op.k_pool, kv_head, slot, row.data());
        double s = 0.0;
        for (int64_t i = 0; i < head_dim; ++i) s += q[i] * static_cast<double>(row[i]);
        s *= op.scale;
        if (op.softcap > 0.0f) s = op.softcap * std::tanh(s / op.softcap);
        scores[p - first] = s;
        mx = std::max(mx, s);
      }
      double sum = 0.0;
      for (double& s : scores) sum += s = std::exp(s - mx);
      std::fill(out.begin(), out.end(), 0.0);
      for (int64_t p = first; p <= last; ++p) {
        const int64_t slot = table[p / block_size] * block_size + p % block_size;
        const double w = scores[p - first] / sum;
        pool_row(op.v_pool, kv_head, slot, row.data());
        for (int64_t i = 0; i < head_dim; ++i) out[i] += w * row[i];
      }
      auto* y = op.dst.row_as<float>(h, t);
      for (int64_t i = 0; i < head_dim; ++i) y[i] = static_cast<float>(out[i]);
    }
  }
}

void gated_act(const GatedAct& op) {
  const int64_t n = op.up.ne[0];
  const bool per_row = op.gate.ne[0] == 1;  // one gate per row (or n == 1: the same)
  std::vector<float> y(n);
  for (int64_t r = 0; r < op.up.n_rows(); ++r) {
    const auto* g = reinterpret_cast<const float*>(op.gate.flat_row(r));
    const auto* u = reinterpret_cast<const float*>(op.up.flat_row(r));
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(glu_act(op.kind, g[per_row ? 0 : i]) * u[i]);
    store_row(op.dst, op.dst.flat_row(r), y.data());
  }
}

void binary(const Binary& op) {
  const int64_t n = op.a.ne[0];
  const Tensor& bt = op.b.tensor;
  const bool broadcast = bt.n_rows() == 1;
  std::vector<float> y(n);
  for (int64_t r = 0; r < op.a.n_rows(); ++r) {
    const auto* a = reinterpret_cast<const float*>(op.a.flat_row(r));
    const auto* b = reinterpret_cast<const float*>(bt.flat_row(broadcast ? 0 : r));
    for (int64_t i = 0; i < n; ++i) y[i] = op.kind == BinaryKind::binary_kind_add ? a[i] + b[i] : a[i] * b[i];
    store_row(op.dst, op.dst.flat_row(r), y.data());
  }
}

void scale(const Scale& op) {
  for (int64_t r = 0; r < op.x.n_rows(); ++r) {
    const auto* x = reinterpret_cast<const float*>(op.x.flat_row(r));
    auto* y = reinterpret_cast<float*>(op.dst.flat_row(r));
    for (int64_t i = 0; i < op.x.ne[0]; ++i) y[i] = x[i] * op.scale;
  }
}

void argmax(const Argmax& op) {
  for (int64_t r = 0; r < op.x.n_rows(); ++r) {
    const auto* x = reinterpret_cast<const float*>(op.x.flat_row(r));
    int32_t best = 0;
    bool bad = false;
    for (int64_t i = 0; i < op.x.ne[0]; ++i) {
      bad = bad || std::isnan(x[i]) || x[i] == std::numeric_limits<float>::infinity();
      if (x[i] > x[best]) best = static_cast<int32_t>(i);
    }
    op.out.span_as<int32_t>()[r] = bad || x[best] == -std::numeric_limits<float>::infinity() ? -1 : best;
  }
}

void sample(const Sample& op) {
  for (int64_t r = 0; r < op.x.n_rows(); ++r) {
    const SampleRow p = sample_op_row(op, r);
    const auto* x = reinterpret_cast<const float*>(op.x.flat_row(r));
    write_sample_out(op, r,
                     sample_row_reference({x, static_cast<size_t>(op.x.ne[0])}, p, sample_op_adjust(op, p),
                                          sample_op_mask(op, p)));
  }
}

void moe_route(const MoeRoute& op) {
  const int64_t n_expert = op.logits.ne[0], n_used = op.weights.ne[0];
  std::vector<double> p(n_expert);
  std::vector<bool> taken(n_expert);
  for (int64_t t = 0; t < op.logits.n_rows(); ++t) {
    const auto* x = reinterpret_cast<const float*>(op.logits.flat_row(t));
    double mx = -INFINITY, sum = 0.0;
    for (int64_t e = 0; e < n_expert; ++e) mx = std::max(mx, static_cast<double>(x[e]));
    for (int64_t e = 0; e < n_expert; ++e) sum += p[e] = std::exp(x[e] - mx);
    for (int64_t e = 0; e < n_expert; ++e) p[e] /= sum;
    // Selection by repeated maximum: the first untaken expert, replaced only by a strictly larger logit.
    std::fill(taken.begin(), taken.end(), false);
    int32_t* ids = op.ids.span_as<int32_t>().data() + n_used * t;
    double chosen = 0.0;
    for (int64_t s = 0; s < n_used; ++s) {
      int64_t best = 0;
      while (taken[best]) ++best;
      for (int64_t e = best + 1; e < n_expert; ++e) {
        if (!taken[e] && x[e] > x[best]) best = e;
      }
      taken[best] = true;
      ids[s] = static_cast<int32_t>(best);
      chosen += p[best];
    }
    auto* w = reinterpret_cast<float*>(op.weights.flat_row(t));
    for (int64_t s = 0; s < n_used; ++s) w[s] = static_cast<float>(p[ids[s]] / (op.normalize ? chosen : 1.0));
  }
}

void moe_matmul(const MoeMatmul& op, Precision precision) {
  // Each (slot, token) is a Matmul of its expert's slab with one x row.
  const int64_t n_used = op.dst.ne[1], n_tokens = op.dst.ne[2];
  const auto ids = op.ids.span_as<const int32_t>();
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t s = 0; s < n_used; ++s) {
      Tensor w = op.w.tensor;
      w.data = op.w.tensor.row(0, ids[s + n_used * t]);
      w.ne[2] = 1;
      Tensor x = op.x, dst = op.dst;
      x.data = op.x.row(op.x.ne[1] == 1 ? 0 : s, t);
      x.ne[1] = x.ne[2] = 1;
      dst.data = op.dst.row(s, t);
      dst.ne[1] = dst.ne[2] = 1;
      matmul(Matmul{w, x, dst}, precision);
    }
  }
}

void weighted_sum(const WeightedSum& op) {
  const int64_t n = op.y.ne[0], n_slots = op.y.ne[1];
  std::vector<double> acc(n);
  for (int64_t t = 0; t < op.y.ne[2]; ++t) {
    const auto* w = reinterpret_cast<const float*>(op.w.flat_row(t));
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t s = 0; s < n_slots; ++s) {
      const auto* y = op.y.row_as<const float>(s, t);
      for (int64_t i = 0; i < n; ++i) acc[i] += static_cast<double>(w[s]) * y[i];
    }
    auto* d = reinterpret_cast<float*>(op.dst.flat_row(t));
    for (int64_t i = 0; i < n; ++i) d[i] = static_cast<float>(acc[i]);
  }
}

void sum_squares(const SumSquares& op) {
  // The op's rows summed in f64 per matrix, then added to the f32 sums and counts once.
  const int64_t n = op.x.ne[0], n_mat = op.sums.ne[1];
  std::vector<double> acc(static_cast<size_t>(n * n_mat), 0.0);
  std::vector<int64_t> rows(static_cast<size_t>(n_mat), 0);
  const auto add = [&](const float* x, int64_t m) {
    double* a = acc.data() + m * n;
    for (int64_t i = 0; i < n; ++i) a[i] += static_cast<double>(x[i]) * x[i];
    ++rows[m];
    if (op.amax.data != nullptr) {
      float& mx = *op.amax.row_as<float>(m);
      for (int64_t i = 0; i < n; ++i) {
        const float v = std::fabs(x[i]);
        mx = std::isnan(v) || std::isnan(mx) ? std::numeric_limits<float>::quiet_NaN() : std::max(mx, v);
      }
    }
  };
  if (op.ids.data == nullptr) {
    for (int64_t r = 0; r < op.x.n_rows(); ++r) add(reinterpret_cast<const float*>(op.x.flat_row(r)), 0);
    if (op.gram.data != nullptr) {  // f64 sums over the rows, added to the f32 matrix once
      std::vector<double> g(static_cast<size_t>(n * n), 0.0);
      for (int64_t r = 0; r < op.x.n_rows(); ++r) {
        const auto* x = reinterpret_cast<const float*>(op.x.flat_row(r));
        for (int64_t j = 0; j < n; ++j)
          for (int64_t i = 0; i < n; ++i) g[i + n * j] += static_cast<double>(x[i]) * x[j];
      }
      for (int64_t j = 0; j < n; ++j) {
        auto* row = op.gram.row_as<float>(j);
        for (int64_t i = 0; i < n; ++i) row[i] = static_cast<float>(row[i] + g[i + n * j]);
      }
    }
  } else {
    const int64_t n_used = op.ids.ne[0];
    const auto ids = op.ids.span_as<const int32_t>();
    for (int64_t t = 0; t < op.ids.ne[1]; ++t) {
      for (int64_t s = 0; s < n_used; ++s)
        add(op.x.row_as<const float>(op.x.ne[1] == 1 ? 0 : s, t), ids[s + n_used * t]);
    }
  }
  for (int64_t m = 0; m < n_mat; ++m) {
    auto* sums = op.sums.row_as<float>(m);
    for (int64_t i = 0; i < n; ++i) sums[i] = static_cast<float>(sums[i] + acc[m * n + i]);
    auto* count = op.counts.row_as<float>(m);
    count[0] = static_cast<float>(count[0] + static_cast<double>(rows[m]));
  }
}

void inverse_cholesky(const InverseCholesky& op) {
  // Another road to the same factor than the backends take: C = J (a + lambda I) J (J the order reversal)
  // factored C = L0 L0^T with the contract's pivot test, the inverse (a + lambda I)^-1 = J C^-1 J formed from
  // two triangular solves, and its own Cholesky factor taken.
  const int64_t n = op.a.ne[0];
  const auto at = [n](std::vector<double>& m, int64_t i, int64_t j) -> double& { return m[i * n + j]; };
  std::vector<double> c(static_cast<size_t>(n * n));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j <= i; ++j) {
      const double v = static_cast<double>(op.a.row_as<const float>(i)[j]) + (i == j ? op.lambda : 0.0);
      at(c, n - 1 - i, n - 1 - j) = at(c, n - 1 - j, n - 1 - i) = v;
    }
  }
  auto* status = static_cast<int32_t*>(op.status.data);
  std::vector<double> l0(static_cast<size_t>(n * n), 0.0);
  for (int64_t j = 0; j < n; ++j) {
    double s = at(c, j, j);
    for (int64_t k = 0; k < j; ++k) s -= at(l0, j, k) * at(l0, j, k);
    if (!(s > 1e-10 * at(c, j, j)) || !std::isfinite(s)) {
      status[0] = 1;
      return;
    }
    at(l0, j, j) = std::sqrt(s);
    for (int64_t i = j + 1; i < n; ++i) {
      double t = at(c, i, j);
      for (int64_t k = 0; k < j; ++k) t -= at(l0, i, k) * at(l0, j, k);
      at(l0, i, j) = t / at(l0, j, j);
    }
  }
  // C^-1 column by column: L0 y = e_col, then L0^T z = y.
  std::vector<double> inv(static_cast<size_t>(n * n)), y(static_cast<size_t>(n));
  for (int64_t col = 0; col < n; ++col) {
    for (int64_t i = 0; i < n; ++i) {
      double t = i == col ? 1.0 : 0.0;
      for (int64_t k = 0; k < i; ++k) t -= at(l0, i, k) * y[k];
      y[i] = t / at(l0, i, i);
    }
    for (int64_t i = n - 1; i >= 0; --i) {
      double t = y[i];
      for (int64_t k = i + 1; k < n; ++k) t -= at(l0, k, i) * at(inv, k, col);
      at(inv, i, col) = t / at(l0, i, i);
    }
  }
  // (a + lambda I)^-1 = J C^-1 J, and its lower Cholesky factor (positive definite as an inverse is).
  std::vector<double> b(static_cast<size_t>(n * n)), l(static_cast<size_t>(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) at(b, i, j) = at(inv, n - 1 - i, n - 1 - j);
  bool finite = true;
  for (int64_t j = 0; j < n; ++j) {
    double s = at(b, j, j);
    for (int64_t k = 0; k < j; ++k) s -= at(l, j, k) * at(l, j, k);
    at(l, j, j) = std::sqrt(std::max(s, 0.0));
    for (int64_t i = j + 1; i < n; ++i) {
      double t = at(b, i, j);
      for (int64_t k = 0; k < j; ++k) t -= at(l, i, k) * at(l, j, k);
      at(l, i, j) = t / at(l, j, j);
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    auto* row = op.l.row_as<float>(i);
    for (int64_t j = 0; j < n; ++j) {
      row[j] = j <= i ? static_cast<float>(at(l, i, j)) : 0.0f;
      finite &= std::isfinite(row[j]);
    }
  }
  status[0] = finite ? 0 : 1;
}

Status all_reduce(const AllReduce& op) {
  const int64_t n = op.x.n_elements();
  if (op.group->world() == 1) {
    std::memmove(op.dst.data, op.x.data, sizeof(float) * static_cast<size_t>(n));
    return Status::ok_status();
  }
  auto* host = dynamic_cast<HostCollective*>(const_cast<Collective*>(op.group));
  if (host == nullptr) return unimplemented("all_reduce: the reference exchanges host memory only");
  return host->all_reduce(static_cast<const float*>(op.x.data), static_cast<float*>(op.dst.data), n);
}

Status all_gather(const AllGather& op) {
  auto* host = dynamic_cast<HostCollective*>(const_cast<Collective*>(op.group));
  if (op.group->world() == 1) {
    std::memcpy(op.dst.data, op.x.data, sizeof(float) * static_cast<size_t>(op.x.n_elements()));
    return Status::ok_status();
  }
  if (host == nullptr) return unimplemented("all_gather: the reference exchanges host memory only");
  return host->all_gather(static_cast<const float*>(op.x.data), op.x.ne[0], op.x.ne[1],
                          static_cast<float*>(op.dst.data));
}

namespace {

// A collective that failed leaves NaNs, which no comparison passes.
void or_nan(const Status& s, const Tensor& dst) {
  if (s.ok()) return;
  std::fill_n(static_cast<float*>(dst.data), dst.n_elements(), std::numeric_limits<float>::quiet_NaN());
}

}  // namespace

void run(const Op& op, Precision precision) {
  // One case per op: an op without its reference does not compile.
  std::visit(Overloaded{
                 [](const GetRows& o) { get_rows(o); },
                 [&](const Matmul& o) { matmul(o, precision); },
                 [](const RmsNorm& o) { rms_norm(o); },
                 [](const LayerNorm& o) { layer_norm(o); },
                 [](const Rope& o) { rope(o); },
                 [](const Softmax& o) { softmax(o); },
                 [](const KvWrite& o) { kv_write(o); },
                 [](const Attention& o) { attention(o); },
                 [](const GatedAct& o) { gated_act(o); },
                 [](const Binary& o) { binary(o); },
                 [](const Scale& o) { scale(o); },
                 [](const Argmax& o) { argmax(o); },
                 [](const Sample& o) { sample(o); },
                 [](const MoeRoute& o) { moe_route(o); },
                 [&](const MoeMatmul& o) { moe_matmul(o, precision); },
                 [](const WeightedSum& o) { weighted_sum(o); },
                 [](const SumSquares& o) { sum_squares(o); },
                 [](const InverseCholesky& o) { inverse_cholesky(o); },
                 [](const AllReduce& o) { or_nan(all_reduce(o), o.dst); },
                 [](const AllGather& o) { or_nan(all_gather(o), o.dst); },
             },
             op);
}

}  // namespace kiln::ops::ref
