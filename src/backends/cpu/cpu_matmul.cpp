// matmul and moe_matmul on the CPU, one driver for both: a list of products (weight matrix, x row, dst row)
// grouped by matrix (one group for matmul; one per expert in use for moe_matmul, so each expert's weights are
// read once per call however many tokens chose it). Threads split (group, weight rows) work items.
// - f32 activations: each thread dequantizes kRows weight rows at a time into its own f32 buffer and reuses
//   them for every x row of the group; f32 weights are used in place.
// - quantize_x: the x rows are quantized once per call to the weight type's activation format; q4_0, q4_1 and
//   q8_0 weights then take integer dot products block by block (dot_int8_rows); the other types use the f32
//   path on the rounded activations (the same result, without the speed).
#include <cstdint>
#include <numeric>
#include <vector>

#include "backends/cpu/cpu_ops.h"
#include "core/half.h"
#include "core/quant/quant_blocks.h"
#include "ops/ref/ref.h"

namespace kiln::cpu {

using namespace kiln::quant;

namespace {

constexpr int64_t kRows = 4;  // weight rows per group

// dot_f32, compiled per ISA (see KILN_CPU_CLONES).
KILN_CPU_CLONES float dot_f32_dispatch(const float* a, const float* b, int64_t n) { return dot_f32(a, b, n); }

// The products of one call: group a multiplies weight matrix w[:, :, mats[a]] with the x rows
// x_rows[start[a] .. start[a+1]) into the dst rows y_rows[same]. Rows are flat row indices of x and dst.
struct Products {
  Tensor w;  // [k, n, n_mats], rows contiguous
  std::vector<int32_t> mats;
  std::vector<int64_t> start;  // [mats.size() + 1]
  std::vector<int64_t> x_rows, y_rows;
  const uint8_t* w_row(int64_t a, int64_t j) const { return w.row(j, mats[a]); }
};

// f32 activations: x row i is x_row(i), dst row i is y_row(i) (i a flat row index of x / dst).
template <class XRow, class YRow>
void matmul_f32(ThreadPool& pool, const Products& pr, XRow x_row, YRow y_row) {
  const int64_t k = pr.w.ne[0], n = pr.w.ne[1];
  const bool in_place = pr.w.type == DType::f32;
  const int64_t n_groups = (n + kRows - 1) / kRows;
  pool.parallel_for(
      static_cast<int64_t>(pr.mats.size()) * n_groups,
      [&](int64_t g0, int64_t g1, int) {
        // [kRows, k], 64-byte aligned: the dot products' 32-byte loads then never straddle a cache line (with
        // malloc's 16-byte alignment, whether they did changed with the allocation history, by ~7% of a prefill).
        std::vector<float> storage(in_place ? 0 : kRows * k + 16);
        float* buf = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(storage.data()) + 63) & ~uintptr_t{63});
        const float* rows[kRows];
        for (int64_t item = g0; item < g1; ++item) {
          const int64_t a = item / n_groups, j0 = item % n_groups * kRows, nj = std::min(kRows, n - j0);
          for (int64_t r = 0; r < nj; ++r) {
            if (in_place) {
              rows[r] = reinterpret_cast<const float*>(pr.w_row(a, j0 + r));
            } else {
              ops::ref::row_to_f32(pr.w, pr.w_row(a, j0 + r), buf + r * k);
              rows[r] = buf + r * k;
            }
          }
          for (int64_t e = pr.start[a]; e < pr.start[a + 1]; ++e) {
            const float* x = x_row(pr.x_rows[e]);
            float* y = y_row(pr.y_rows[e]) + j0;
            for (int64_t r = 0; r < nj; ++r) y[r] = dot_f32_dispatch(rows[r], x, k);
          }
        }
      },
      /*min_chunk=*/4);
}

// The integer path works on unpacked rows: int8 quants [k], one f32 scale per 32-block [nb], and for weights
// with a minimum (q4_1) one f32 minimum per block. A weight row is unpacked once and reused for every token.
struct Int8Row {
  std::vector<int8_t> q;  // [k]
  std::vector<float> d;   // [nb] block scales
  std::vector<float> m;   // [nb] weight minimums (q4_1), or activation d * sum(q) (q8_1); empty when unused
};

// Unpacks weight row `src` of type `t` (q4_0, q4_1, q8_0); false for any other type.
bool unpack_weight_row(DType t, const uint8_t* src, int64_t nb, Int8Row& out) {
  out.q.resize(nb * kQK);
  out.d.resize(nb);
  out.m.resize(t == DType::q4_1 ? nb : 0);
  for (int64_t b = 0; b < nb; ++b) {
    int8_t* q = out.q.data() + b * kQK;
    if (t == DType::q4_0) {
      const auto* blk = reinterpret_cast<const BlockQ4_0*>(src) + b;
      for (int j = 0; j < kQK / 2; ++j) {
        q[j] = static_cast<int8_t>((blk->qs[j] & 0x0F) - 8);
        q[j + kQK / 2] = static_cast<int8_t>((blk->qs[j] >> 4) - 8);
      }
      out.d[b] = f16_to_f32(blk->d);
    } else if (t == DType::q4_1) {
      const auto* blk = reinterpret_cast<const BlockQ4_1*>(src) + b;
      for (int j = 0; j < kQK / 2; ++j) {
        q[j] = static_cast<int8_t>(blk->qs[j] & 0x0F);
        q[j + kQK / 2] = static_cast<int8_t>(blk->qs[j] >> 4);
      }
      out.d[b] = f16_to_f32(blk->d);
      out.m[b] = f16_to_f32(blk->m);
    } else if (t == DType::q8_0) {
      const auto* blk = reinterpret_cast<const BlockQ8_0*>(src) + b;
      std::copy(blk->qs, blk->qs + kQK, q);
      out.d[b] = f16_to_f32(blk->d);
    } else {
      return false;
    }
  }
  return true;
}

// Unpacks an activation row quantized to q8_0 or q8_1; for q8_1, m[b] = d * sum of the block's quants (exact
// sum).
void unpack_activation_row(DType t, const uint8_t* src, int64_t nb, Int8Row& out) {
  out.q.resize(nb * kQK);
  out.d.resize(nb);
  out.m.resize(t == DType::q8_1 ? nb : 0);
  for (int64_t b = 0; b < nb; ++b) {
    const int8_t* qs = t == DType::q8_1 ? reinterpret_cast<const BlockQ8_1*>(src)[b].qs
                                        : reinterpret_cast<const BlockQ8_0*>(src)[b].qs;
    const uint16_t d = t == DType::q8_1 ? reinterpret_cast<const BlockQ8_1*>(src)[b].d
                                        : reinterpret_cast<const BlockQ8_0*>(src)[b].d;
    std::copy(qs, qs + kQK, out.q.data() + b * kQK);
    out.d[b] = f16_to_f32(d);
    if (t == DType::q8_1) {
      int32_t sum = 0;
      for (int j = 0; j < kQK; ++j) sum += qs[j];
      out.m[b] = out.d[b] * static_cast<float>(sum);
    }
  }
}

// sum over blocks of w.d * x.d * (w.q . x.q) (+ w.m * x.m): products exact in int32, scales in f32.
// Compiled twice (AVX2 and baseline x86-64), picked at load time from the CPU's features.
KILN_CPU_CLONES float dot_int8_rows(const Int8Row& w, const Int8Row& x, int64_t nb) {
  float acc = 0.0f;
  const bool has_min = !w.m.empty();
  for (int64_t b = 0; b < nb; ++b) {
    const int8_t* wq = w.q.data() + b * kQK;
    const int8_t* xq = x.q.data() + b * kQK;
    int32_t sumi = 0;
    for (int j = 0; j < kQK; ++j) sumi += static_cast<int16_t>(wq[j]) * static_cast<int16_t>(xq[j]);
    acc += w.d[b] * x.d[b] * static_cast<float>(sumi);
    if (has_min) acc += w.m[b] * x.m[b];
  }
  return acc;
}

bool has_int8_kernel(DType w) { return w == DType::q4_0 || w == DType::q4_1 || w == DType::q8_0; }

// Runs the products: x: f32 [k, ...] and dst: f32 [n, ...], addressed by flat row.
void run_products(ThreadPool& pool, const Products& pr, const Tensor& x_t, const Tensor& dst_t,
                  bool quantize_x) {
  const int64_t k = pr.w.ne[0], m = x_t.n_rows();
  auto y_row = [&](int64_t i) { return reinterpret_cast<float*>(dst_t.flat_row(i)); };
  const DType act = quantize_x ? ops::activation_type(pr.w.type) : DType::f32;
  if (act == DType::f32) {
    auto x_row = [&](int64_t i) { return reinterpret_cast<const float*>(x_t.flat_row(i)); };
    matmul_f32(pool, pr, x_row, y_row);
    return;
  }
  // Quantize every x row once and unpack it: [m] rows of int8 quants + block scales (+ sums).
  const DTypeInfo& ai = dtype_info(act);
  const int64_t row_bytes = k / ai.block_size * ai.type_size;
  std::vector<uint8_t> xq(static_cast<size_t>(m * row_bytes));
  pool.parallel_for(m, [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i) {
      ai.quantize_row(reinterpret_cast<const float*>(x_t.flat_row(i)), xq.data() + i * row_bytes, k);
    }
  });
  if (!has_int8_kernel(pr.w.type)) {
    // No integer kernel for this type yet: the rounded activations through the f32 path (the same result).
    std::vector<float> xs(static_cast<size_t>(m * k));
    for (int64_t i = 0; i < m; ++i) ai.dequantize_row(xq.data() + i * row_bytes, xs.data() + i * k, k);
    auto x_row = [&](int64_t i) { return static_cast<const float*>(xs.data() + i * k); };
    matmul_f32(pool, pr, x_row, y_row);
    return;
  }
  const int64_t nb = k / kQK, n = pr.w.ne[1];
  std::vector<Int8Row> xr(static_cast<size_t>(m));
  pool.parallel_for(m, [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i) unpack_activation_row(act, xq.data() + i * row_bytes, nb, xr[i]);
  });
  pool.parallel_for(
      static_cast<int64_t>(pr.mats.size()) * n,
      [&](int64_t i0, int64_t i1, int) {
        Int8Row wr;
        for (int64_t item = i0; item < i1; ++item) {
          const int64_t a = item / n, j = item % n;
          unpack_weight_row(pr.w.type, pr.w_row(a, j), nb, wr);
          for (int64_t e = pr.start[a]; e < pr.start[a + 1]; ++e) {
            y_row(pr.y_rows[e])[j] = dot_int8_rows(wr, xr[pr.x_rows[e]], nb);
          }
        }
      },
      /*min_chunk=*/16);
}

}  // namespace

void matmul(ThreadPool& pool, const ops::Matmul& op) {
  const int64_t m = op.x.n_rows();
  Products pr{op.w.tensor, {0}, {0, m}, std::vector<int64_t>(m), {}};
  std::iota(pr.x_rows.begin(), pr.x_rows.end(), 0);
  pr.y_rows = pr.x_rows;
  run_products(pool, pr, op.x, op.dst, op.quantize_x);
}

void moe_matmul(ThreadPool& pool, const ops::MoeMatmul& op) {
  const int64_t n_expert = op.w.tensor.ne[2], n_used = op.dst.ne[1];
  const auto ids = op.ids.span_as<const int32_t>();
  const auto n_pairs = static_cast<int64_t>(ids.size());
  const bool shared_x = op.x.ne[1] == 1;  // x [k, 1, n_tokens]: x row t serves every slot of token t
  // Group the pairs p = s + n_used * t (dst flat row p) by expert: a counting sort, p ascending per expert.
  // Expert e's pairs are entries [first[e], first[e + 1]) of the sorted list.
  std::vector<int64_t> first(n_expert + 1, 0);
  for (int32_t e : ids) ++first[e + 1];
  for (int64_t e = 0; e < n_expert; ++e) first[e + 1] += first[e];
  Products pr{op.w.tensor, {}, {0}, std::vector<int64_t>(n_pairs), std::vector<int64_t>(n_pairs)};
  std::vector<int64_t> fill(first.begin(), first.end() - 1);
  for (int64_t p = 0; p < n_pairs; ++p) {
    const int64_t at = fill[ids[p]]++;
    pr.x_rows[at] = shared_x ? p / n_used : p;
    pr.y_rows[at] = p;
  }
  for (int64_t e = 0; e < n_expert; ++e) {
    if (first[e + 1] == first[e]) continue;  // unused experts cost nothing
    pr.mats.push_back(static_cast<int32_t>(e));
    pr.start.push_back(first[e + 1]);
  }
  run_products(pool, pr, op.x, op.dst, op.quantize_x);
}

}  // namespace kiln::cpu
