// Paged causal attention on the CPU: threads split the (token, head) pairs; each computes the scores of its
// query against the positions it may see (read through the block table), a softmax in f32 with the max
// subtracted, and the weighted sum of the V rows. K/V rows are f32 or f16 (converted per row).
//
// The loop is compiled twice: for the baseline ISA and, on x86-64, for AVX2 without FMA, picked at run time.
// The arithmetic is written once (attend_range) and holds no fused multiply-add and no reassociation, so the
// wider vectors compute the same bits: each of dot_f32's 8 sums is one lane, each output element its own.
#include <cmath>
#include <vector>

#include "backends/cpu/cpu_ops.h"
#include "core/half.h"

namespace kiln::cpu {

namespace {

// Pool row (kv_head, slot) as f32: in place for f32, converted into `tmp` for f16.
const float* pool_row(const Tensor& pool, int64_t kv_head, int64_t slot, float* tmp) {
  const int64_t block_size = pool.ne[2];
  const uint8_t* row = pool.row(kv_head, slot % block_size, slot / block_size);
  if (pool.type == DType::f32) return reinterpret_cast<const float*>(row);
  const auto* h = reinterpret_cast<const uint16_t*>(row);
  for (int64_t i = 0; i < pool.ne[0]; ++i) tmp[i] = f16_to_f32(h[i]);
  return tmp;
}

// The (token, head) pairs [begin, end).
[[gnu::always_inline]] inline void attend_range(const ops::Attention& op, int64_t begin, int64_t end) {
  const int64_t head_dim = op.q.ne[0], n_heads = op.q.ne[1];
  const int64_t group = n_heads / op.k_pool.ne[1], block_size = op.k_pool.ne[2];
  const auto positions = op.positions.span_as<const int32_t>(), seq = op.seq.span_as<const int32_t>();
  const auto indptr = op.bt_indptr.span_as<const int32_t>(), indices = op.bt_indices.span_as<const int32_t>();
  std::vector<float> scores, out(head_dim), tmp(head_dim);
  for (int64_t th = begin; th < end; ++th) {
    const int64_t t = th / n_heads, h = th % n_heads, kv_head = h / group;
    const auto table = indices.subspan(indptr[seq[t]], indptr[seq[t] + 1] - indptr[seq[t]]);
    const int64_t last = positions[t];
    const int64_t first = op.window > 0 ? std::max<int64_t>(0, last - op.window + 1) : 0;
    const auto* q = op.q.row_as<const float>(h, t);
    scores.resize(last - first + 1);
    float mx = -INFINITY;
    for (int64_t p = first; p <= last; ++p) {
      const int64_t slot = table[p / block_size] * block_size + p % block_size;
      float s = dot_f32(q, pool_row(op.k_pool, kv_head, slot, tmp.data()), head_dim) * op.scale;
      if (op.softcap > 0.0f) s = op.softcap * std::tanh(s / op.softcap);
      scores[p - first] = s;
      mx = std::max(mx, s);
    }
    float sum = 0.0f;
    for (float& s : scores) sum += s = std::exp(s - mx);
    const float inv = 1.0f / sum;
    std::fill(out.begin(), out.end(), 0.0f);
    for (int64_t p = first; p <= last; ++p) {
      const int64_t slot = table[p / block_size] * block_size + p % block_size;
      const float* v = pool_row(op.v_pool, kv_head, slot, tmp.data());
      const float w = scores[p - first] * inv;
      for (int64_t i = 0; i < head_dim; ++i) out[i] += w * v[i];
    }
    std::copy(out.begin(), out.end(), op.dst.row_as<float>(h, t));
  }
}

void attend_baseline(const ops::Attention& op, int64_t begin, int64_t end) { attend_range(op, begin, end); }

#if defined(__x86_64__)
// AVX2 alone: no FMA, so the compiler cannot contract a product and a sum into one rounding.
[[gnu::target("avx2")]] void attend_avx2(const ops::Attention& op, int64_t begin, int64_t end) {
  attend_range(op, begin, end);
}
#endif

}  // namespace

void attention(ThreadPool& pool, const ops::Attention& op) {
  const int64_t n_heads = op.q.ne[1], n_tokens = op.q.ne[2];
  auto* attend = &attend_baseline;
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) attend = &attend_avx2;
#endif
  pool.parallel_for(n_tokens * n_heads, [&](int64_t begin, int64_t end, int) { attend(op, begin, end); });
}

}  // namespace kiln::cpu
