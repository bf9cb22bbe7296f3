// matmul on the CPU: dst[j, i] = w[:, j] . x[:, i]. Threads split the weight rows (groups of kRows).
// - f32 activations: each thread dequantizes kRows weight rows at a time into its own f32 buffer and reuses them
//   for every activation row, so a weight byte is read once per call however many tokens the batch holds; f32
//   weights are used in place.
// - quantize_x: the activation rows are quantized once per call to the weight type's activation format; q4_0,
//   q4_1 and q8_0 weights then take integer dot products block by block (vec_dot_*); the other types use the
//   f32 path on the rounded activations (the same result, without the speed).
#include <vector>

#include "backends/cpu/cpu_ops.h"
#include "core/half.h"
#include "core/quant/quant_blocks.h"
#include "ops/ref/ref.h"

namespace kiln::cpu {

using namespace kiln::quant;

namespace {

constexpr int64_t kRows = 4;  // weight rows per group

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
            for (int64_t r = 0; r < nj; ++r) y[r] = dot_f32(rows[r], x, k);
          }
        }
      },
      /*min_chunk=*/4);
}

// Integer block dot products: weight row `w` (nb blocks) with a quantized activation row `x`. `xsum` holds the
// sum of each q8_1 block's quants (the q4_1 minimum multiplies it). Products are exact in int32; each block's
// sum is scaled in f32.
float vec_dot_q4_0_q8_0(const void* w, const void* x, const int32_t*, int64_t nb) {
  const auto* bw = static_cast<const BlockQ4_0*>(w);
  const auto* bx = static_cast<const BlockQ8_0*>(x);
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    int32_t sumi = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      sumi += ((bw[b].qs[j] & 0x0F) - 8) * bx[b].qs[j] + ((bw[b].qs[j] >> 4) - 8) * bx[b].qs[j + kQK / 2];
    }
    acc += f16_to_f32(bw[b].d) * f16_to_f32(bx[b].d) * static_cast<float>(sumi);
  }
  return acc;
}

float vec_dot_q4_1_q8_1(const void* w, const void* x, const int32_t* xsum, int64_t nb) {
  const auto* bw = static_cast<const BlockQ4_1*>(w);
  const auto* bx = static_cast<const BlockQ8_1*>(x);
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    int32_t sumi = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      sumi += (bw[b].qs[j] & 0x0F) * bx[b].qs[j] + (bw[b].qs[j] >> 4) * bx[b].qs[j + kQK / 2];
    }
    const float dx = f16_to_f32(bx[b].d);
    acc += f16_to_f32(bw[b].d) * dx * static_cast<float>(sumi) + f16_to_f32(bw[b].m) * dx * static_cast<float>(xsum[b]);
  }
  return acc;
}

float vec_dot_q8_0_q8_0(const void* w, const void* x, const int32_t*, int64_t nb) {
  const auto* bw = static_cast<const BlockQ8_0*>(w);
  const auto* bx = static_cast<const BlockQ8_0*>(x);
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    int32_t sumi = 0;
    for (int j = 0; j < kQK; ++j) sumi += bw[b].qs[j] * bx[b].qs[j];
    acc += f16_to_f32(bw[b].d) * f16_to_f32(bx[b].d) * static_cast<float>(sumi);
  }
  return acc;
}

using VecDot = float (*)(const void*, const void*, const int32_t*, int64_t);

VecDot vec_dot_for(DType w) {
  switch (w) {
    case DType::q4_0: return vec_dot_q4_0_q8_0;
    case DType::q4_1: return vec_dot_q4_1_q8_1;
    case DType::q8_0: return vec_dot_q8_0_q8_0;
    default: return nullptr;
  }
}

}  // namespace

void matmul(ThreadPool& pool, const ops::Matmul& op) {
  const int64_t k = op.w.ne[0], n = op.w.ne[1], m = op.x.n_rows();
  const DType act = op.quantize_x ? ops::activation_type(op.w.type) : DType::f32;
  if (act == DType::f32) {
    matmul_f32(pool, op, [&](int64_t i) { return reinterpret_cast<const float*>(op.x.flat_row(i)); });
    return;
  }
  // Quantize every activation row once: xq [m, row_bytes]; for q8_1 also each block's sum of quants.
  const DTypeInfo& ai = dtype_info(act);
  const int64_t row_bytes = k / ai.block_size * ai.type_size, nb = k / ai.block_size;
  std::vector<uint8_t> xq(static_cast<size_t>(m * row_bytes));
  std::vector<int32_t> xsum(act == DType::q8_1 ? static_cast<size_t>(m * nb) : 0);
  pool.parallel_for(m, [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i) {
      ai.quantize_row(reinterpret_cast<const float*>(op.x.flat_row(i)), xq.data() + i * row_bytes, k);
      if (act != DType::q8_1) continue;
      const auto* b = reinterpret_cast<const BlockQ8_1*>(xq.data() + i * row_bytes);
      for (int64_t j = 0; j < nb; ++j) {
        int32_t s = 0;
        for (int q = 0; q < kQK; ++q) s += b[j].qs[q];
        xsum[i * nb + j] = s;
      }
    }
  });
  const VecDot dot = vec_dot_for(op.w.type);
  if (dot == nullptr) {
    // No integer kernel for this type yet: the rounded activations through the f32 path.
    std::vector<float> xs(static_cast<size_t>(m * k));
    for (int64_t i = 0; i < m; ++i) ai.dequantize_row(xq.data() + i * row_bytes, xs.data() + i * k, k);
    matmul_f32(pool, op, [&](int64_t i) { return xs.data() + i * k; });
    return;
  }
  pool.parallel_for(
      n,
      [&](int64_t j0, int64_t j1, int) {
        for (int64_t j = j0; j < j1; ++j) {
          const uint8_t* w = op.w.row(j);
          for (int64_t i = 0; i < m; ++i) {
            reinterpret_cast<float*>(op.dst.flat_row(i))[j] =
                dot(w, xq.data() + i * row_bytes, xsum.empty() ? nullptr : xsum.data() + i * nb, nb);
          }
        }
      },
      /*min_chunk=*/16);
}

}  // namespace kiln::cpu
