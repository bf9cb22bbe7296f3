// The row-wise ops on the CPU (get_rows, norms, rope, softmax, kv_write, gated activations, add/mul, scale,
// argmax, moe_route, weighted_sum): threads split the rows; arithmetic in f32 except the norms' and
// softmaxes' sums (f64, one per row, cheap). sum_squares: threads split the columns.
#include "backends/cpu/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "backends/cpu/cpu_linalg.h"
#include "backends/cpu/cpu_pack.h"
#include "core/half.h"
#include "core/overloaded.h"
#include "ops/ref/ref.h"
#include "ops/rope_freq.h"
#include "ops/sample.h"

namespace kiln::cpu {

using namespace kiln::ops;

namespace {

// fn(row) over the rows of a tensor with `n_rows` rows, in parallel.
template <class Fn>
void for_rows(ThreadPool& pool, int64_t n_rows, Fn&& fn) {
  pool.parallel_for(
      n_rows,
      [&](int64_t b, int64_t e, int) {
        for (int64_t r = b; r < e; ++r) fn(r);
      },
      /*min_chunk=*/8);
}

const float* f32_row(const Tensor& t, int64_t r) { return reinterpret_cast<const float*>(t.flat_row(r)); }
float* f32_row_mut(const Tensor& t, int64_t r) { return reinterpret_cast<float*>(t.flat_row(r)); }

void get_rows(ThreadPool& pool, const GetRows& op) {
  const auto ids = op.ids.span_as<const int32_t>();
  const Tensor& table = op.table.tensor;
  // A table the backend repacked (a tied embedding): its packed copy, so that the file's pages stay unread.
  const PackedWeight* packed = packed_form(op.table);
  if (packed != nullptr && packed->mats.size() == 1 && packed->mats[0].k == table.ne[0] &&
      packed->mats[0].n == table.ne[1]) {
    for_rows(pool, static_cast<int64_t>(ids.size()),
             [&](int64_t i) { dequantize_packed_row(packed->mats[0], ids[i], f32_row_mut(op.dst, i)); });
    return;
  }
  if (packed != nullptr && packed->fmats.size() == 1 && packed->fmats[0].k == table.ne[0] &&
      packed->fmats[0].n == table.ne[1] && packed->fmats[0].type == static_cast<uint32_t>(table.type)) {
    for_rows(pool, static_cast<int64_t>(ids.size()),
             [&](int64_t i) { packed_float_row(packed->fmats[0], ids[i], f32_row_mut(op.dst, i)); });
    return;
  }
  for_rows(pool, static_cast<int64_t>(ids.size()),
           [&](int64_t i) { ref::row_to_f32(table, table.row(ids[i]), f32_row_mut(op.dst, i)); });
}

void rms_norm(ThreadPool& pool, const RmsNorm& op) {
  const int64_t n = op.x.ne[0];
  const auto* w = static_cast<const float*>(op.w.tensor.data);
  const float one = op.add_one ? 1.0f : 0.0f;
  for_rows(pool, op.x.n_rows(), [&](int64_t r) {
    const float* x = f32_row(op.x, r);
    float* y = f32_row_mut(op.dst, r);
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
    const auto inv = static_cast<float>(1.0 / std::sqrt(ss / n + op.eps));
    for (int64_t i = 0; i < n; ++i) y[i] = w ? x[i] * inv * (w[i] + one) : x[i] * inv;
  });
}

void layer_norm(ThreadPool& pool, const LayerNorm& op) {
  const int64_t n = op.x.ne[0];
  const auto* w = static_cast<const float*>(op.w.tensor.data);
  const auto* b = static_cast<const float*>(op.b.tensor.data);
  for_rows(pool, op.x.n_rows(), [&](int64_t r) {
    const float* x = f32_row(op.x, r);
    float* y = f32_row_mut(op.dst, r);
    double mean = 0.0, var = 0.0;
    for (int64_t i = 0; i < n; ++i) mean += x[i];
    mean /= n;
    for (int64_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
    const auto inv = static_cast<float>(1.0 / std::sqrt(var / n + op.eps));
    const auto m = static_cast<float>(mean);
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) * inv * (w ? w[i] : 1.0f) + (b ? b[i] : 0.0f);
  });
}

void rope(ThreadPool& pool, const Rope& op) {
  const int64_t head_dim = op.x.ne[0], n_heads = op.x.ne[1], n_tokens = op.x.ne[2];
  const int32_t half = op.p.n_rot / 2;
  const auto positions = op.positions.span_as<const int32_t>();
  const auto* factors = static_cast<const float*>(op.freq_factors.tensor.data);
  std::vector<RopeFreq> freq(half);
  for (int32_t i = 0; i < half; ++i) freq[i] = rope_freq(op.p, i, factors != nullptr ? factors[i] : 1.0f);
  const bool normal = op.p.layout == RopeLayout::rope_layout_normal;
  pool.parallel_for(n_tokens, [&](int64_t t0, int64_t t1, int) {
    std::vector<float> cs(2 * half);
    for (int64_t t = t0; t < t1; ++t) {
      for (int32_t i = 0; i < half; ++i) {
        // Angles in f64: positions reach 1e5+ and f32 would lose the fraction.
        const double angle = static_cast<double>(positions[t]) * freq[i].theta_scale;
        cs[2 * i] = static_cast<float>(std::cos(angle) * freq[i].mscale);
        cs[2 * i + 1] = static_cast<float>(std::sin(angle) * freq[i].mscale);
      }
      for (int64_t h = 0; h < n_heads; ++h) {
        const auto* x = op.x.row_as<const float>(h, t);
        auto* y = op.dst.row_as<float>(h, t);
        if (x != y) std::memcpy(y + op.p.n_rot, x + op.p.n_rot, (head_dim - op.p.n_rot) * sizeof(float));
        for (int32_t i = 0; i < half; ++i) {
          const int64_t a = normal ? 2 * i : i, b = normal ? 2 * i + 1 : i + half;
          const float xa = x[a], xb = x[b], c = cs[2 * i], s = cs[2 * i + 1];
          y[a] = xa * c - xb * s;
          y[b] = xa * s + xb * c;
        }
      }
    }
  });
}

void softmax(ThreadPool& pool, const Softmax& op) {
  const int64_t n = op.x.ne[0];
  for_rows(pool, op.x.n_rows(), [&](int64_t r) {
    const float* x = f32_row(op.x, r);
    float* y = f32_row_mut(op.dst, r);
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i] * op.scale);
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += y[i] = std::exp(x[i] * op.scale - mx);
    const auto inv = static_cast<float>(1.0 / sum);
    for (int64_t i = 0; i < n; ++i) y[i] *= inv;
  });
}

void kv_write(ThreadPool& pool, const KvWrite& op) {
  const int64_t head_dim = op.k.ne[0], n_kv = op.k.ne[1], block_size = op.k_pool.ne[2];
  const auto slots = op.slots.span_as<const int32_t>();
  for_rows(pool, op.k.ne[2] * n_kv, [&](int64_t th) {
    const int64_t t = th / n_kv, h = th % n_kv, slot = slots[t];
    for (const auto& [src, pool_t] : {std::pair{&op.k, &op.k_pool}, std::pair{&op.v, &op.v_pool}}) {
      const auto* x = src->row_as<const float>(h, t);
      uint8_t* dst = pool_t->row(h, slot % block_size, slot / block_size);
      if (pool_t->type == DType::f32) {
        std::memcpy(dst, x, head_dim * sizeof(float));
      } else if (pool_t->type == DType::f16) {
        auto* d = reinterpret_cast<uint16_t*>(dst);
        for (int64_t i = 0; i < head_dim; ++i) d[i] = f32_to_f16(x[i]);
      } else {
        dtype_info(pool_t->type).quantize_row(x, dst, head_dim);  // q8_0, q8_64: as the reference rounds them
      }
    }
  });
}

void gated_act(ThreadPool& pool, const GatedAct& op) {
  const int64_t n = op.up.ne[0];
  const bool per_row = op.gate.ne[0] == 1;  // one gate per row (or n == 1)
  for_rows(pool, op.up.n_rows(), [&](int64_t r) {
    const float* g = f32_row(op.gate, r);
    const float* u = f32_row(op.up, r);
    float* y = f32_row_mut(op.dst, r);
    if (per_row) {
      const float a = static_cast<float>(ref::glu_act(op.kind, g[0]));
      for (int64_t i = 0; i < n; ++i) y[i] = a * u[i];
    } else if (op.kind == GluKind::glu_kind_silu) {
      for (int64_t i = 0; i < n; ++i) y[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    } else if (op.kind == GluKind::glu_kind_sigmoid) {
      for (int64_t i = 0; i < n; ++i) y[i] = u[i] / (1.0f + std::exp(-g[i]));
    } else {
      constexpr float c = 0.7978845608028654f;  // sqrt(2 / pi)
      for (int64_t i = 0; i < n; ++i) {
        const float x = g[i];
        y[i] = 0.5f * x * (1.0f + std::tanh(c * (x + 0.044715f * x * x * x))) * u[i];
      }
    }
  });
}

void binary(ThreadPool& pool, const Binary& op) {
  const int64_t n = op.a.ne[0];
  const Tensor& bt = op.b.tensor;
  const bool broadcast = bt.n_rows() == 1, add = op.kind == BinaryKind::binary_kind_add;
  for_rows(pool, op.a.n_rows(), [&](int64_t r) {
    const float* a = f32_row(op.a, r);
    const float* b = f32_row(bt, broadcast ? 0 : r);
    float* y = f32_row_mut(op.dst, r);
    if (add) {
      for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
    } else {
      for (int64_t i = 0; i < n; ++i) y[i] = a[i] * b[i];
    }
  });
}

void scale(ThreadPool& pool, const Scale& op) {
  for_rows(pool, op.x.n_rows(), [&](int64_t r) {
    const float* x = f32_row(op.x, r);
    float* y = f32_row_mut(op.dst, r);
    for (int64_t i = 0; i < op.x.ne[0]; ++i) y[i] = x[i] * op.scale;
  });
}

void argmax(ThreadPool& pool, const Argmax& op) {
  for_rows(pool, op.x.n_rows(), [&](int64_t r) {
    const float* x = f32_row(op.x, r);
    constexpr float kInf = std::numeric_limits<float>::infinity();
    // The running best stays in a register (a vocabulary's row is 50-260k logits, read once); a NaN or +inf
    // anywhere (!(v < inf)) makes the row bad whatever the best. Ties keep the lower index.
    int32_t best = 0;
    float best_v = x[0];
    bool bad = false;
    for (int64_t i = 0; i < op.x.ne[0]; ++i) {
      const float v = x[i];
      bad |= !(v < kInf);
      if (v > best_v) best_v = v, best = static_cast<int32_t>(i);
    }
    op.out.span_as<int32_t>()[r] = bad || best_v == -kInf ? -1 : best;
  });
}

void sample(ThreadPool& pool, const Sample& op) {
  // A row is 50-260k logits: rows go to the threads one by one (not for_rows' chunks of 8), each thread
  // with its own scratch.
  pool.parallel_for(
      op.x.n_rows(),
      [&](int64_t b, int64_t e, int) {
        thread_local SampleScratch scratch;
        for (int64_t r = b; r < e; ++r) {
          const SampleRow p = sample_op_row(op, r);
          write_sample_out(op, r,
                           sample_row({f32_row(op.x, r), static_cast<size_t>(op.x.ne[0])}, p,
                                      sample_op_adjust(op, p), scratch, sample_op_mask(op, p)));
        }
      },
      /*min_chunk=*/1);
}

void moe_route(ThreadPool& pool, const MoeRoute& op) {
  const int64_t n_expert = op.logits.ne[0], n_used = op.weights.ne[0];
  for_rows(pool, op.logits.n_rows(), [&](int64_t t) {
    const float* x = f32_row(op.logits, t);
    float mx = -INFINITY;
    for (int64_t e = 0; e < n_expert; ++e) mx = std::max(mx, x[e]);
    double sum = 0.0;
    for (int64_t e = 0; e < n_expert; ++e) sum += std::exp(x[e] - mx);
    // Top n_used by repeated maximum over the untaken experts (ties: the lower index), as the reference.
    int32_t* ids = op.ids.span_as<int32_t>().data() + n_used * t;
    float* w = f32_row_mut(op.weights, t);
    double chosen = 0.0;
    for (int64_t s = 0; s < n_used; ++s) {
      auto taken = [&](int64_t e) { return std::find(ids, ids + s, e) != ids + s; };
      int64_t best = 0;
      while (taken(best)) ++best;
      for (int64_t e = best + 1; e < n_expert; ++e) {
        if (x[e] > x[best] && !taken(e)) best = e;
      }
      ids[s] = static_cast<int32_t>(best);
      chosen += w[s] = std::exp(x[best] - mx);
    }
    const auto inv = static_cast<float>(1.0 / (op.normalize ? chosen : sum));
    for (int64_t s = 0; s < n_used; ++s) w[s] *= inv;
  });
}

void weighted_sum(ThreadPool& pool, const WeightedSum& op) {
  const int64_t n = op.y.ne[0], n_slots = op.y.ne[1];
  for_rows(pool, op.y.ne[2], [&](int64_t t) {
    const float* w = f32_row(op.w, t);
    float* d = f32_row_mut(op.dst, t);
    for (int64_t s = 0; s < n_slots; ++s) {
      const auto* y = op.y.row_as<const float>(s, t);
      if (s == 0) {
        for (int64_t i = 0; i < n; ++i) d[i] = w[0] * y[i];
      } else {
        for (int64_t i = 0; i < n; ++i) d[i] += w[s] * y[i];
      }
    }
    if (n_slots == 0) std::fill(d, d + n, 0.0f);
  });
}

// Eight floats (GCC's vector extension: one AVX register, two SSE ones in the baseline build).
typedef float GramVec __attribute__((vector_size(32)));

// The Gram matrix's register tile: s[k][0 .. 15] (rows ld apart, k < 4) plus x[r][j + k] * x[r][i .. i + 15]
// for the rows r in [r0, r1) in their order. `a` [r][4]: x[r][j .. j + 3] packed.
KILN_CPU_CLONES void gram_tile(float* s, int64_t ld, const float* const* xr, const float* a, int64_t r0,
                               int64_t r1, int64_t i) {
  GramVec acc[4][2];
  for (int k = 0; k < 4; ++k) {
    std::memcpy(&acc[k][0], s + k * ld, sizeof(GramVec));
    std::memcpy(&acc[k][1], s + k * ld + 8, sizeof(GramVec));
  }
  for (int64_t r = r0; r < r1; ++r) {
    GramVec b0, b1;
    std::memcpy(&b0, xr[r] + i, sizeof(GramVec));
    std::memcpy(&b1, xr[r] + i + 8, sizeof(GramVec));
    const float* ar = a + (r - r0) * 4;
    for (int k = 0; k < 4; ++k) {
      acc[k][0] += ar[k] * b0;
      acc[k][1] += ar[k] * b1;
    }
  }
  for (int k = 0; k < 4; ++k) {
    std::memcpy(s + k * ld, &acc[k][0], sizeof(GramVec));
    std::memcpy(s + k * ld + 8, &acc[k][1], sizeof(GramVec));
  }
}

// The inputs' Gram matrix (SumSquares::gram), symmetric. Threads take blocks of 16 rows j; a block's sums
// s[j][i] = sum_r x[r, j] * x[r, i], for its columns i from its first on, gather in a scratch in the rows'
// order, then each is added to gram[j][i] and, below the block, to gram[i][j] as well: half the products, and
// an exactly symmetric result. The rows of x go by in runs of kRun, and every 16 columns i of a run serve
// four register tiles of 4 rows j from the L1 cache; columns past the last whole tile, and a last partial
// block, take the scalar loop in the same order.
void gram(ThreadPool& pool, const SumSquares& op) {
  constexpr int64_t kBlock = 16, kRun = 256;
  const int64_t n = op.x.ne[0], n_rows = op.x.n_rows();
  std::vector<const float*> xr(static_cast<size_t>(n_rows));
  for (int64_t r = 0; r < n_rows; ++r) xr[static_cast<size_t>(r)] = f32_row(op.x, r);
  pool.parallel_dynamic((n + kBlock - 1) / kBlock, 1, [&](int64_t b0, int64_t b1, int) {
    std::vector<float> a(static_cast<size_t>(kRun * kBlock)), sums;
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t j0 = b * kBlock, m = std::min(kBlock, n - j0), w = n - j0;
      const int64_t w_tiled = m == kBlock ? w / kBlock * kBlock : 0;  // columns in whole tiles
      sums.assign(static_cast<size_t>(kBlock * w), 0.0f);             // [j - j0][i - j0]
      for (int64_t r0 = 0; r0 < n_rows; r0 += kRun) {
        const int64_t r1 = std::min(n_rows, r0 + kRun);
        if (w_tiled > 0) {
          for (int64_t q = 0; q < kBlock / 4; ++q) {  // x[r][j0 + 4q ..] packed per tile: [q][r][4]
            for (int64_t r = r0; r < r1; ++r) {
              for (int64_t k = 0; k < 4; ++k)
                a[static_cast<size_t>((q * kRun + (r - r0)) * 4 + k)] =
                    xr[static_cast<size_t>(r)][j0 + 4 * q + k];
            }
          }
          for (int64_t i = 0; i < w_tiled; i += kBlock) {
            for (int64_t q = 0; q < kBlock / 4; ++q) {
              gram_tile(sums.data() + 4 * q * w + i, w, xr.data(), a.data() + q * kRun * 4, r0, r1, j0 + i);
            }
          }
        }
        for (int64_t k = 0; k < m; ++k) {
          for (int64_t i = w_tiled; i < w; ++i) {
            float v = sums[static_cast<size_t>(k * w + i)];
            for (int64_t r = r0; r < r1; ++r)
              v += xr[static_cast<size_t>(r)][j0 + k] * xr[static_cast<size_t>(r)][j0 + i];
            sums[static_cast<size_t>(k * w + i)] = v;
          }
        }
      }
      for (int64_t k = 0; k < m; ++k) {
        float* g = f32_row_mut(op.gram, j0 + k) + j0;
        const float* s = sums.data() + k * w;
        for (int64_t i = 0; i < w; ++i) g[i] += s[i];
        for (int64_t i = m; i < w; ++i) f32_row_mut(op.gram, j0 + i)[j0 + k] += s[i];
      }
    }
  });
}

// cpu_linalg's U, then l = U^T in 64 x 64 tiles.
void inverse_cholesky(ThreadPool& pool, const InverseCholesky& op) {
  constexpr int64_t kTile = 64;
  const int64_t n = op.a.ne[0];
  std::vector<float> u(static_cast<size_t>(n * n));
  const bool ok =
      cpu_linalg::inverse_cholesky_upper(static_cast<const float*>(op.a.data), n, op.lambda, &pool, u.data());
  auto* l = static_cast<float*>(op.l.data);
  pool.parallel_dynamic((n + kTile - 1) / kTile, 1, [&](int64_t t0, int64_t t1, int) {
    for (int64_t i0 = t0 * kTile; i0 < std::min(n, t1 * kTile); i0 += kTile) {
      for (int64_t j0 = 0; j0 < n; j0 += kTile) {
        for (int64_t i = i0; i < std::min(n, i0 + kTile); ++i) {
          for (int64_t j = j0; j < std::min(n, j0 + kTile); ++j)
            l[i * n + j] = u[static_cast<size_t>(j * n + i)];
        }
      }
    }
  });
  *static_cast<int32_t*>(op.status.data) = ok ? 0 : 1;
}

// Threads split the columns (in 16-float blocks), so each owns its slice of every matrix's sums: no two
// threads add to one sum, and a column's order of additions is the rows' order whatever the threads.
// max(a, |v|), NaN once either is (SumSquares::amax).
inline float abs_max(float a, float v) {
  v = std::fabs(v);
  return std::isnan(a) || std::isnan(v) ? std::numeric_limits<float>::quiet_NaN() : std::max(a, v);
}

void sum_squares(ThreadPool& pool, const SumSquares& op) {
  constexpr int64_t kBlock = 16;
  const int64_t n = op.x.ne[0], n_blocks = (n + kBlock - 1) / kBlock, n_mat = op.sums.ne[1];
  const bool routed = op.ids.data != nullptr, ranges = op.amax.data != nullptr;
  const int64_t n_used = routed ? op.ids.ne[0] : 0;
  const auto ids = routed ? op.ids.span_as<const int32_t>() : std::span<const int32_t>();
  // Each block of columns' largest |x| per matrix, folded into amax after.
  std::vector<float> block_max(ranges ? static_cast<size_t>(n_blocks * n_mat) : 0, 0.0f);
  pool.parallel_for(
      n_blocks,
      [&](int64_t b0, int64_t b1, int) {
        const int64_t c0 = b0 * kBlock, c1 = std::min(n, b1 * kBlock), w = c1 - c0;
        float* mx = ranges ? block_max.data() + b0 * n_mat : nullptr;  // the first block's slots serve all
        if (!routed) {  // one matrix: the rows summed in a local slice, added once
          std::vector<float> acc(static_cast<size_t>(w), 0.0f);
          for (int64_t r = 0; r < op.x.n_rows(); ++r) {
            const float* x = f32_row(op.x, r) + c0;
            for (int64_t i = 0; i < w; ++i) acc[i] += x[i] * x[i];
            if (ranges) {
              for (int64_t i = 0; i < w; ++i) mx[0] = abs_max(mx[0], x[i]);
            }
          }
          float* sums = f32_row_mut(op.sums, 0) + c0;
          for (int64_t i = 0; i < w; ++i) sums[i] += acc[i];
          return;
        }
        for (int64_t t = 0; t < op.ids.ne[1]; ++t) {
          for (int64_t s = 0; s < n_used; ++s) {
            const float* x = op.x.row_as<const float>(op.x.ne[1] == 1 ? 0 : s, t) + c0;
            const int32_t m = ids[s + n_used * t];
            float* sums = op.sums.row_as<float>(m) + c0;
            for (int64_t i = 0; i < w; ++i) sums[i] += x[i] * x[i];
            if (ranges) {
              for (int64_t i = 0; i < w; ++i) mx[m] = abs_max(mx[m], x[i]);
            }
          }
        }
      },
      /*min_chunk=*/4);
  if (ranges) {
    for (int64_t m = 0; m < n_mat; ++m) {
      float& a = *op.amax.row_as<float>(m);
      for (int64_t b = 0; b < n_blocks; ++b) {
        const float v = block_max[static_cast<size_t>(b * n_mat + m)];
        a = std::isnan(v) ? v : abs_max(a, v);
      }
    }
  }
  if (!routed) {
    *op.counts.row_as<float>(0) += static_cast<float>(op.x.n_rows());
    if (op.gram.data != nullptr) gram(pool, op);
    return;
  }
  for (const int32_t m : ids) *op.counts.row_as<float>(m) += 1.0f;
}

}  // namespace

void run(ThreadPool& pool, const CpuKernels& kern, const Op& op, Precision precision) {
  // One case per op: an op without a CPU kernel does not compile.
  std::visit(Overloaded{
                 [&](const GetRows& o) { get_rows(pool, o); },
                 [&](const Matmul& o) { matmul(pool, kern, o, precision); },
                 [&](const RmsNorm& o) { rms_norm(pool, o); },
                 [&](const LayerNorm& o) { layer_norm(pool, o); },
                 [&](const Rope& o) { rope(pool, o); },
                 [&](const Softmax& o) { softmax(pool, o); },
                 [&](const KvWrite& o) { kv_write(pool, o); },
                 [&](const Attention& o) { attention(pool, kern, o, precision); },
                 [&](const GatedAct& o) { gated_act(pool, o); },
                 [&](const Binary& o) { binary(pool, o); },
                 [&](const Scale& o) { scale(pool, o); },
                 [&](const Argmax& o) { argmax(pool, o); },
                 [&](const Sample& o) { sample(pool, o); },
                 [&](const MoeRoute& o) { moe_route(pool, o); },
                 [&](const MoeMatmul& o) { moe_matmul(pool, kern, o, precision); },
                 [&](const WeightedSum& o) { weighted_sum(pool, o); },
                 [&](const SumSquares& o) { sum_squares(pool, o); },
                 [&](const InverseCholesky& o) { inverse_cholesky(pool, o); },
                 // CpuBackend::run runs these itself, so that their errors are its run's.
                 [&](const AllReduce& o) { (void)ref::all_reduce(o); },
                 [&](const AllGather& o) { (void)ref::all_gather(o); },
             },
             op);
}

}  // namespace kiln::cpu
