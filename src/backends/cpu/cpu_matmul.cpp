// matmul on the CPU: dst[j, i] = w[:, j] . x[:, i]. Threads split the weight rows (groups of kRows).
// - f32 activations: each thread dequantizes kRows weight rows at a time into its own f32 buffer and reuses
// them
//   for every activation row, so a weight byte is read once per call however many tokens the batch holds; f32
//   weights are used in place.
// - quantize_x: the activation rows are quantized once per call to the weight type's activation format; q4_0,
//   q4_1 and q8_0 weights then take integer dot products block by block (dot_int8_rows); the other types use
//   the f32 path on the rounded activations (the same result, without the speed).
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

// f32 activations [k, m] (rows `x_row(i)`), weights dequantized per group.
template <class XRow>
void matmul_f32(ThreadPool& pool, const ops::Matmul& op, XRow x_row) {
  const int64_t k = op.w.ne[0], n = op.w.ne[1], m = op.x.n_rows();
  const bool in_place = op.w.type == DType::f32;
  const int64_t n_groups = (n + kRows - 1) / kRows;
  pool.parallel_for(
      n_groups,
      [&](int64_t g0, int64_t g1, int) {
        std::vector<float> buf(in_place ? 0 : kRows * k);  // [kRows, k]
        const float* rows[kRows];
        for (int64_t g = g0; g < g1; ++g) {
          const int64_t j0 = g * kRows, nj = std::min(kRows, n - j0);
          for (int64_t r = 0; r < nj; ++r) {
            if (in_place) {
              rows[r] = op.w.row_as<const float>(j0 + r);
            } else {
              ops::ref::row_to_f32(op.w, op.w.row(j0 + r), buf.data() + r * k);
              rows[r] = buf.data() + r * k;
            }
          }
          for (int64_t i = 0; i < m; ++i) {
            const float* x = x_row(i);
            auto* y = reinterpret_cast<float*>(op.dst.flat_row(i)) + j0;
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

}  // namespace

void matmul(ThreadPool& pool, const ops::Matmul& op) {
  const int64_t k = op.w.ne[0], n = op.w.ne[1], m = op.x.n_rows();
  const DType act = op.quantize_x ? ops::activation_type(op.w.type) : DType::f32;
  if (act == DType::f32) {
    matmul_f32(pool, op, [&](int64_t i) { return reinterpret_cast<const float*>(op.x.flat_row(i)); });
    return;
  }
  // Quantize every activation row once and unpack it: [m] rows of int8 quants + block scales (+ sums).
  const DTypeInfo& ai = dtype_info(act);
  const int64_t row_bytes = k / ai.block_size * ai.type_size;
  std::vector<uint8_t> xq(static_cast<size_t>(m * row_bytes));
  pool.parallel_for(m, [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i) {
      ai.quantize_row(reinterpret_cast<const float*>(op.x.flat_row(i)), xq.data() + i * row_bytes, k);
    }
  });
  if (!has_int8_kernel(op.w.type)) {
    // No integer kernel for this type yet: the rounded activations through the f32 path (the same result).
    std::vector<float> xs(static_cast<size_t>(m * k));
    for (int64_t i = 0; i < m; ++i) ai.dequantize_row(xq.data() + i * row_bytes, xs.data() + i * k, k);
    matmul_f32(pool, op, [&](int64_t i) { return xs.data() + i * k; });
    return;
  }
  const int64_t nb = k / kQK;
  std::vector<Int8Row> xr(static_cast<size_t>(m));
  pool.parallel_for(m, [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i) unpack_activation_row(act, xq.data() + i * row_bytes, nb, xr[i]);
  });
  pool.parallel_for(
      n,
      [&](int64_t j0, int64_t j1, int) {
        Int8Row wr;
        for (int64_t j = j0; j < j1; ++j) {
          unpack_weight_row(op.w.type, op.w.row(j), nb, wr);
          for (int64_t i = 0; i < m; ++i)
            reinterpret_cast<float*>(op.dst.flat_row(i))[j] = dot_int8_rows(wr, xr[i], nb);
        }
      },
      /*min_chunk=*/16);
}

}  // namespace kiln::cpu
