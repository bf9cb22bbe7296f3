#include "ops/sample.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/status.h"

namespace kiln::ops {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();

bool bad_logit(float v) { return std::isnan(v) || v == kPosInf; }

// The order of stage 3 as one integer: a larger key comes first (a descending, then id ascending). Keys of
// tokens at -inf are never compared (they are not candidates).
uint64_t order_key(float a, int32_t id) {
  uint32_t bits = std::bit_cast<uint32_t>(a);
  bits = (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;  // monotone in a
  return (static_cast<uint64_t>(bits) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(id));
}
int32_t key_id(uint64_t key) { return static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(key)); }

}  // namespace

float sample_adjusted(float x, const SampleRow& p, const SampleAdjust& e) {
  float a = x + e.bias;
  if (e.count > 0) {
    if (p.repeat_penalty != 1.0f) a = a > 0.0f ? a / p.repeat_penalty : a * p.repeat_penalty;
    a -= p.frequency_penalty * static_cast<float>(e.count) + p.presence_penalty;
  }
  return e.banned != 0 ? kNegInf : a;
}

namespace {

float adjusted(float x, const SampleRow& p, const SampleAdjust& e) { return sample_adjusted(x, p, e); }

float weight(float a, float a_max, float temperature) { return std::exp((a - a_max) / temperature); }

// Stage 9: the raw logprob of out.token and the n_top best raw logits.
void report(std::span<const float> x, float x_max, const SampleRow& p, SampleOut& out) {
  double sum = 0.0;
  for (const float v : x) sum += static_cast<double>(std::exp(v - x_max));
  const double lse = static_cast<double>(x_max) + std::log(sum);
  out.logprob = static_cast<float>(static_cast<double>(x[static_cast<size_t>(out.token)]) - lse);
  const auto n_top = static_cast<size_t>(std::clamp(p.n_top, 0, kSampleMaxTop));
  out.n_top = static_cast<int32_t>(std::min(n_top, x.size()));
  // The n_top best keys, kept sorted in a list of at most 20.
  uint64_t best[kSampleMaxTop + 1];
  size_t n = 0;
  for (size_t i = 0; i < x.size() && n_top > 0; ++i) {
    if (x[i] == kNegInf && n == n_top) continue;
    const uint64_t k = order_key(x[i], static_cast<int32_t>(i));
    if (n == n_top && k <= best[n - 1]) continue;
    size_t j = n < n_top ? n++ : n - 1;
    for (; j > 0 && best[j - 1] < k; --j) best[j] = best[j - 1];
    best[j] = k;
  }
  for (size_t j = 0; j < static_cast<size_t>(out.n_top); ++j) {
    const int32_t id = key_id(best[j]);
    out.top_id[j] = id;
    out.top_logprob[j] = static_cast<float>(static_cast<double>(x[static_cast<size_t>(id)]) - lse);
  }
}

// Stages 1-2 into a (the adjusted row); returns the row's error code, or 0. x_max: the raw maximum.
int32_t adjust_row(std::span<const float> x, const SampleRow& p, std::span<const SampleAdjust> adjust,
                   std::vector<float>& a, float& x_max) {
  x_max = kNegInf;
  for (const float v : x) {
    if (bad_logit(v)) return kSampleBadLogits;
    x_max = std::max(x_max, v);
  }
  if (x_max == kNegInf) return kSampleBadLogits;
  a.assign(x.begin(), x.end());
  bool any = false;
  for (const SampleAdjust& e : adjust) {
    float& v = a[static_cast<size_t>(e.id)];
    v = adjusted(v, p, e);
    if (bad_logit(v)) return kSampleBadAdjusted;
  }
  for (const float v : a) any = any || v != kNegInf;
  return any ? 0 : kSampleAllMasked;
}

}  // namespace

SampleOut sample_row_reference(std::span<const float> x, const SampleRow& p,
                               std::span<const SampleAdjust> adjust) {
  SampleOut out;
  std::vector<float> a;
  float x_max = kNegInf;
  if (const int32_t err = adjust_row(x, p, adjust, a, x_max); err != 0) {
    out.token = err;
    return out;
  }
  // Stage 3: every candidate, sorted.
  std::vector<uint64_t> order;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != kNegInf) order.push_back(order_key(a[i], static_cast<int32_t>(i)));
  }
  std::sort(order.begin(), order.end(), std::greater<>());
  const auto a_of = [&](uint64_t k) { return a[static_cast<size_t>(key_id(k))]; };
  if (p.temperature == 0.0f) {
    out.token = key_id(order[0]);
  } else {
    size_t n = order.size();
    if (p.top_k > 0) n = std::min(n, static_cast<size_t>(p.top_k));
    const float a_max = a_of(order[0]);
    std::vector<float> w(n);
    for (size_t i = 0; i < n; ++i) w[i] = weight(a_of(order[i]), a_max, p.temperature);
    if (p.top_p < 1.0f) {
      const double total = std::accumulate(w.begin(), w.end(), 0.0);
      double cum = 0.0;
      for (size_t i = 0; i < n; ++i) {
        cum += w[i];
        if (cum >= static_cast<double>(p.top_p) * total) {
          n = i + 1;
          break;
        }
      }
    }
    if (p.min_p > 0.0f) {
      size_t kept = 0;
      while (kept < n && w[kept] >= p.min_p) ++kept;  // w falls along the order: min-p keeps a prefix
      n = kept;
    }
    const double total = std::accumulate(w.begin(), w.begin() + static_cast<ptrdiff_t>(n), 0.0);
    const double target = sample_uniform(uint64_t{p.seed_hi} << 32 | p.seed_lo, p.counter) * total;
    double cum = 0.0;
    out.token = key_id(order[n - 1]);  // u * total rounded up to total
    for (size_t i = 0; i < n; ++i) {
      cum += w[i];
      if (cum > target) {
        out.token = key_id(order[i]);
        break;
      }
    }
  }
  if (p.logprobs != 0 || p.n_top > 0) report(x, x_max, p, out);
  return out;
}

SampleRow sample_op_row(const Sample& op, int64_t r) {
  return std::bit_cast<SampleRow>(
      *reinterpret_cast<const std::array<int32_t, 16>*>(op.rows.span_as<int32_t>().data() + 16 * r));
}

std::span<const SampleAdjust> sample_op_adjust(const Sample& op, const SampleRow& p) {
  if (p.adjust_count == 0) return {};
  const auto* base = reinterpret_cast<const SampleAdjust*>(op.adjust.span_as<int32_t>().data());
  return {base + p.adjust_begin, static_cast<size_t>(p.adjust_count)};
}

void write_sample_out(const Sample& op, int64_t r, const SampleOut& o) {
  int32_t* out = op.out.span_as<int32_t>().data() + op.out.ne[0] * r;
  out[0] = o.token;
  out[1] = std::bit_cast<int32_t>(o.logprob);
  for (int32_t j = 0; j < o.n_top && 2 + 2 * j < op.out.ne[0]; ++j) {
    out[2 + 2 * j] = o.top_id[j];
    out[3 + 2 * j] = std::bit_cast<int32_t>(o.top_logprob[j]);
  }
}

}  // namespace kiln::ops

namespace kiln::ops {
namespace {

using Cand = SampleScratch::Cand;

bool by_key_desc(const Cand& x, const Cand& y) { return x.key > y.key; }

// c[0, sorted) is in order (descending key) and its weights sum to cum. Sorts further, 4x at a time (a
// selection of the next part, then a sort of it only), until the first index whose cumulative weight passes
// target (> target when strict, >= otherwise); returns it (n - 1 when none does: rounding).
size_t crossing(std::vector<Cand>& c, size_t n, size_t& sorted, double target, bool strict) {
  double cum = 0.0;
  size_t i = 0;
  size_t k = std::max<size_t>(sorted, std::min<size_t>(n, 64));
  const auto first = c.begin();
  for (;;) {
    if (k > sorted) {
      const auto lo = first + static_cast<ptrdiff_t>(sorted), mid = first + static_cast<ptrdiff_t>(k);
      if (k < n) std::nth_element(lo, mid, first + static_cast<ptrdiff_t>(n), by_key_desc);
      std::sort(lo, mid, by_key_desc);
      sorted = k;
    }
    for (; i < k; ++i) {
      cum += c[i].w;
      if (strict ? cum > target : cum >= target) return i;
    }
    if (k == n) return n - 1;
    k = std::min(n, k * 4);
  }
}

}  // namespace

SampleOut sample_row(std::span<const float> x, const SampleRow& p, std::span<const SampleAdjust> adjust,
                     SampleScratch& scratch) {
  SampleOut out;
  const size_t n_vocab = x.size();
  std::vector<float>& a = scratch.a;
  a.resize(n_vocab);
  float x_max = kNegInf;
  bool bad = false;
  for (size_t i = 0; i < n_vocab; ++i) {
    const float v = x[i];
    bad |= !(v < kPosInf);  // NaN or +inf
    x_max = std::max(x_max, v);
    a[i] = v;
  }
  if (bad || x_max == kNegInf) return out;  // kSampleBadLogits
  for (const SampleAdjust& e : adjust) {
    float& v = a[static_cast<size_t>(e.id)];
    v = adjusted(v, p, e);
    if (bad_logit(v)) {
      out.token = kSampleBadAdjusted;
      return out;
    }
  }
  // The best adjusted token (the first maximum) and the number of candidates.
  float a_max = kNegInf;
  int32_t best = -1;
  size_t n_finite = 0;
  for (size_t i = 0; i < n_vocab; ++i) {
    n_finite += a[i] != kNegInf;
    if (a[i] > a_max) a_max = a[i], best = static_cast<int32_t>(i);
  }
  if (best < 0) {
    out.token = kSampleAllMasked;
    return out;
  }
  if (p.temperature == 0.0f) {
    out.token = best;
  } else {
    std::vector<Cand>& c = scratch.cands;
    size_t n = 0, sorted = 0;
    const float t = p.temperature;
    if (p.top_k > 0 && static_cast<size_t>(p.top_k) < n_finite) {
      // Top-k in one pass: a min-heap of the best k keys; a token below its front costs one comparison.
      const auto k = static_cast<size_t>(p.top_k);
      c.resize(k);
      const auto greater = [](const Cand& l, const Cand& r) { return l.key > r.key; };  // front: the worst
      for (size_t i = 0; i < n_vocab; ++i) {
        if (a[i] == kNegInf) continue;
        const uint64_t key = order_key(a[i], static_cast<int32_t>(i));
        if (n < k) {
          c[n++] = Cand{key, 0.0f};
          std::push_heap(c.begin(), c.begin() + static_cast<ptrdiff_t>(n), greater);
        } else if (key > c[0].key) {
          std::pop_heap(c.begin(), c.begin() + static_cast<ptrdiff_t>(n), greater);
          c[n - 1] = Cand{key, 0.0f};
          std::push_heap(c.begin(), c.begin() + static_cast<ptrdiff_t>(n), greater);
        }
      }
      std::sort(c.begin(), c.begin() + static_cast<ptrdiff_t>(n), by_key_desc);
      sorted = n;
      for (size_t i = 0; i < n; ++i) c[i].w = weight(a[static_cast<size_t>(key_id(c[i].key))], a_max, t);
    } else {
      c.resize(n_finite);
      for (size_t i = 0; i < n_vocab; ++i) {
        if (a[i] != kNegInf) c[n++] = Cand{order_key(a[i], static_cast<int32_t>(i)), weight(a[i], a_max, t)};
      }
    }
    double total = 0.0;
    for (size_t i = 0; i < n; ++i) total += c[i].w;
    if (p.top_p < 1.0f) {
      n = crossing(c, n, sorted, static_cast<double>(p.top_p) * total, /*strict=*/false) + 1;
      total = 0.0;
      for (size_t i = 0; i < n; ++i) total += c[i].w;
    }
    if (p.min_p > 0.0f) {
      // w falls along the order, so min-p keeps a prefix of it: a cut inside the sorted part, or else the
      // sorted part and the unsorted tokens that pass, gathered behind it.
      size_t kept = 0;
      while (kept < sorted && c[kept].w >= p.min_p) ++kept;
      if (kept == sorted) {
        for (size_t i = sorted; i < n; ++i) {
          if (c[i].w >= p.min_p) c[kept++] = c[i];
        }
      }
      sorted = std::min(sorted, kept);
      if (kept < n) {
        n = kept;
        total = 0.0;
        for (size_t i = 0; i < n; ++i) total += c[i].w;
      }
    }
    const double u = sample_uniform(uint64_t{p.seed_hi} << 32 | p.seed_lo, p.counter);
    out.token = key_id(c[crossing(c, n, sorted, u * total, /*strict=*/true)].key);
  }
  if (p.logprobs != 0 || p.n_top > 0) report(x, x_max, p, out);
  return out;
}

}  // namespace kiln::ops
