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
                   std::span<const uint32_t> mask, std::vector<float>& a, float& x_max) {
  x_max = kNegInf;
  for (const float v : x) {
    if (bad_logit(v)) return kSampleBadLogits;
    x_max = std::max(x_max, v);
  }
  if (x_max == kNegInf) return kSampleBadLogits;
  a.assign(x.begin(), x.end());
  bool any = false;
  for (const SampleAdjust& e : adjust) {
    if (!mask.empty() && !sample_mask_allows(mask.data(), e.id)) continue;  // -inf below, whatever it was
    float& v = a[static_cast<size_t>(e.id)];
    v = adjusted(v, p, e);
    if (bad_logit(v)) return kSampleBadAdjusted;
  }
  if (!mask.empty()) {
    for (size_t i = 0; i < a.size(); ++i) {
      if (!sample_mask_allows(mask.data(), static_cast<int64_t>(i))) a[i] = kNegInf;
    }
  }
  for (const float v : a) any = any || v != kNegInf;
  return any ? 0 : kSampleAllMasked;
}

}  // namespace

SampleOut sample_row_reference(std::span<const float> x, const SampleRow& p,
                               std::span<const SampleAdjust> adjust, std::span<const uint32_t> mask) {
  SampleOut out;
  std::vector<float> a;
  float x_max = kNegInf;
  if (const int32_t err = adjust_row(x, p, adjust, mask, a, x_max); err != 0) {
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

bool sample_op_has_mask(const Sample& op) { return op.mask.data != nullptr && op.mask.n_elements() > 0; }

std::span<const uint32_t> sample_op_mask(const Sample& op, const SampleRow& p) {
  if (p.mask_row < 0 || !sample_op_has_mask(op)) return {};
  const auto* base = reinterpret_cast<const uint32_t*>(op.mask.span_as<int32_t>().data());
  return {base + op.mask.ne[0] * p.mask_row, static_cast<size_t>(op.mask.ne[0])};
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

// exp(x) for x <= 0 within about an ulp of std::exp, 0 below -87.3 (where f32 runs out): no branches and no
// calls, so a loop of it vectorizes. Cody-Waite reduction to r in [-ln2/2, ln2/2], a degree-6 polynomial, and
// 2^n put into the exponent.
float exp_nonpositive(float x) {
  const float xc = std::max(x, -87.3f);
  const float n = (xc * 1.44269504f + 12582912.0f) - 12582912.0f;  // round to nearest (1.5 * 2^23)
  float r = xc - n * 0.693359375f;
  r -= n * -2.12194440e-4f;
  float q = 1.9875691500e-4f;
  q = q * r + 1.3981999507e-3f;
  q = q * r + 8.3334519073e-3f;
  q = q * r + 4.1665795894e-2f;
  q = q * r + 1.6666665459e-1f;
  q = q * r + 5.0000001201e-1f;
  q = q * r * r + r + 1.0f;
  const float v = q * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);  // n in [-126, 0]
  return x < -87.3f ? 0.0f : v;
}

// The candidates in segments: segment j holds the tokens of one range of a (the highest range first), so
// every token of a segment comes before every token of the next in the order of stage 3. A segment is known
// by its count and weight; its tokens are gathered and sorted only when a search lands in it.
struct Segments {
  struct Pos {
    size_t seg, i;  // token i (in order) of segment seg
  };
  std::vector<double>& mass;    // [n_seg] weight of each segment
  std::vector<int32_t>& count;  // [n_seg] tokens of each segment
  std::vector<int32_t>& first;  // [n_seg] where its sorted tokens start in c, or -1 (not gathered yet)
  std::vector<Cand>& c;         // the gathered segments
  const std::vector<int32_t>* at = nullptr;  // each token's segment (null: the one segment is gathered)
  const std::vector<float>* a = nullptr;
  const std::vector<float>* w = nullptr;

  size_t n_seg() const { return mass.size(); }
  const Cand* tokens(size_t j) {
    if (first[j] < 0) {
      first[j] = static_cast<int32_t>(c.size());
      for (size_t i = 0; i < at->size(); ++i) {
        if (static_cast<size_t>((*at)[i]) == j)
          c.push_back(Cand{order_key((*a)[i], static_cast<int32_t>(i)), (*w)[i]});
      }
      std::sort(c.begin() + first[j], c.end(), by_key_desc);
    }
    return c.data() + first[j];
  }
  // Tokens of segment j inside the prefix that ends before `end`.
  size_t in(size_t j, Pos end) const {
    return j < end.seg ? static_cast<size_t>(count[j]) : j == end.seg ? end.i : 0;
  }
  // The weight of the prefix that ends before `end`.
  double weight_before(Pos end) {
    double m = 0.0;
    for (size_t j = 0; j < end.seg && j < n_seg(); ++j) m += mass[j];
    if (end.seg < n_seg() && end.i > 0) {
      const Cand* t = tokens(end.seg);
      for (size_t i = 0; i < end.i; ++i) m += t[i].w;
    }
    return m;
  }
  // The first token of the prefix before `end` whose cumulative weight passes target (> when strict, else
  // >=); the prefix's last token when rounding leaves none.
  Pos crossing(Pos end, double target, bool strict) {
    double cum = 0.0;
    Pos last{0, 0};
    for (size_t j = 0; j <= end.seg && j < n_seg(); ++j) {
      const size_t n = in(j, end);
      if (n == 0) continue;
      last = {j, n - 1};
      double m = mass[j];
      if (n < static_cast<size_t>(count[j])) {
        m = 0.0;
        const Cand* t = tokens(j);
        for (size_t i = 0; i < n; ++i) m += t[i].w;
      }
      if (strict ? cum + m > target : cum + m >= target) {
        const Cand* t = tokens(j);
        for (size_t i = 0; i < n; ++i) {
          cum += t[i].w;
          if (strict ? cum > target : cum >= target) return {j, i};
        }
        continue;  // rounding: the scan's sum fell short of the segment's
      }
      cum += m;
    }
    return last;
  }
  int32_t id(Pos pos) { return key_id(tokens(pos.seg)[pos.i].key); }
};

}  // namespace

SampleOut sample_row(std::span<const float> x, const SampleRow& p, std::span<const SampleAdjust> adjust,
                     SampleScratch& scratch, std::span<const uint32_t> mask) {
  SampleOut out;
  const size_t n_vocab = x.size();
  std::vector<float>& a = scratch.a;
  a.resize(n_vocab);
  // The loops over the row are written to vectorize: counts instead of flags, selects instead of branches.
  // Reductions keep kLanes partial results (a float max is no reduction the compiler may reorder).
  constexpr size_t kLanes = 8;
  float lane_max[kLanes], lane_min[kLanes];
  int32_t lane_n[kLanes];
  const auto reduce = [&](float init, auto&& body) {
    std::fill(lane_max, lane_max + kLanes, init);
    std::fill(lane_min, lane_min + kLanes, kPosInf);
    std::fill(lane_n, lane_n + kLanes, 0);
    size_t i = 0;
    for (; i + kLanes <= n_vocab; i += kLanes) {
      for (size_t j = 0; j < kLanes; ++j) body(i + j, j);
    }
    for (; i < n_vocab; ++i) body(i, 0);
  };
  reduce(kNegInf, [&](size_t i, size_t j) {
    const float v = x[i];
    lane_n[j] += !(v < kPosInf) ? 1 : 0;  // NaN or +inf
    lane_max[j] = std::max(lane_max[j], v);
    a[i] = v;
  });
  const float x_max = *std::max_element(lane_max, lane_max + kLanes);
  if (std::accumulate(lane_n, lane_n + kLanes, 0) > 0 || x_max == kNegInf) return out;  // kSampleBadLogits
  for (const SampleAdjust& e : adjust) {
    if (!mask.empty() && !sample_mask_allows(mask.data(), e.id)) continue;  // -inf below
    float& v = a[static_cast<size_t>(e.id)];
    v = adjusted(v, p, e);
    if (bad_logit(v)) {
      out.token = kSampleBadAdjusted;
      return out;
    }
  }
  if (!mask.empty()) {
    // A word at a time: 32 selects, no branch (the inner loop vectorizes); the last word's tail apart.
    const size_t full = n_vocab / 32;
    for (size_t w = 0; w < full; ++w) {
      const uint32_t bits = mask[w];
      if (bits == ~0u) continue;
      float* aw = a.data() + 32 * w;
      for (uint32_t j = 0; j < 32; ++j) aw[j] = ((bits >> j) & 1u) != 0 ? aw[j] : kNegInf;
    }
    for (size_t i = 32 * full; i < n_vocab; ++i) {
      if (!sample_mask_allows(mask.data(), static_cast<int64_t>(i))) a[i] = kNegInf;
    }
  }
  // The best adjusted logit, the lowest finite one and the number of candidates (a loop that vectorizes),
  // then the first token at the best.
  reduce(kNegInf, [&](size_t i, size_t j) {
    const float v = a[i];
    lane_max[j] = std::max(lane_max[j], v);
    lane_min[j] = std::min(lane_min[j], v == kNegInf ? kPosInf : v);
    lane_n[j] += v == kNegInf ? 1 : 0;
  });
  const float a_max = *std::max_element(lane_max, lane_max + kLanes);
  const float a_min = *std::min_element(lane_min, lane_min + kLanes);
  const size_t n_finite = n_vocab - static_cast<size_t>(std::accumulate(lane_n, lane_n + kLanes, 0));
  int32_t best = -1;
  if (a_max != kNegInf) best = static_cast<int32_t>(std::find(a.begin(), a.end(), a_max) - a.begin());
  if (best < 0) {
    out.token = kSampleAllMasked;
    return out;
  }
  if (p.temperature == 0.0f) {
    out.token = best;
    if (p.logprobs != 0 || p.n_top > 0) report(x, x_max, p, out);
    return out;
  }

  std::vector<Cand>& c = scratch.cands;
  std::vector<float>& w = scratch.w;
  Segments sg{scratch.mass, scratch.count, scratch.first, c};
  c.clear();
  const float t = p.temperature;
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < n_finite) {
    // Top-k in one pass: a min-heap of the best k keys; a token below its front costs one comparison. The k
    // then form one segment, gathered and sorted.
    const auto k = static_cast<size_t>(p.top_k);
    size_t n = 0;
    c.resize(k);
    const auto worse_first = [](const Cand& l, const Cand& r) { return l.key > r.key; };
    for (size_t i = 0; i < n_vocab; ++i) {
      if (a[i] == kNegInf || (n == k && a[i] < a[static_cast<size_t>(key_id(c[0].key))])) continue;
      const uint64_t key = order_key(a[i], static_cast<int32_t>(i));
      if (n < k) {
        c[n++] = Cand{key, 0.0f};
        std::push_heap(c.begin(), c.begin() + static_cast<ptrdiff_t>(n), worse_first);
      } else if (key > c[0].key) {
        std::pop_heap(c.begin(), c.begin() + static_cast<ptrdiff_t>(n), worse_first);
        c[n - 1] = Cand{key, 0.0f};
        std::push_heap(c.begin(), c.begin() + static_cast<ptrdiff_t>(n), worse_first);
      }
    }
    std::sort(c.begin(), c.end(), by_key_desc);
    double total = 0.0;
    for (Cand& e : c) {
      e.w = weight(a[static_cast<size_t>(key_id(e.key))], a_max, t);
      total += e.w;
    }
    sg.mass.assign({total});
    sg.count.assign({static_cast<int32_t>(k)});
    sg.first.assign({0});
  } else {
    // Every finite token: the weights in one vectorized pass, and the count and weight of each segment
    // (ranges of equal width in a, enough of them that a segment of a flat row holds a few tokens).
    const size_t n_seg = std::clamp<size_t>(n_finite / 8, 1, 8192);
    const float scale = a_max > a_min ? static_cast<float>(n_seg - 1) / (a_max - a_min) : 0.0f;
    const float top = static_cast<float>(n_seg - 1);
    // Segment of a: the highest range first; monotone in a, so the order is kept. -inf: n_seg (none).
    const auto segment = [&](float v) {
      return static_cast<int32_t>(n_seg - 1) -
             static_cast<int32_t>(std::max(0.0f, std::min((v - a_min) * scale, top)));
    };
    std::vector<int32_t>& at = scratch.at;
    w.resize(n_vocab);
    at.resize(n_vocab);
    for (size_t i = 0; i < n_vocab; ++i) {
      const float v = a[i];
      w[i] = exp_nonpositive((v - a_max) / t);
      at[i] = v == kNegInf ? static_cast<int32_t>(n_seg) : segment(v);
    }
    sg.count.assign(n_seg + 1, 0);
    sg.mass.assign(n_seg + 1, 0.0);
    for (size_t i = 0; i < n_vocab; ++i) {
      const auto j = static_cast<size_t>(at[i]);
      ++sg.count[j];
      sg.mass[j] += w[i];
    }
    sg.count.pop_back();  // the -inf tokens
    sg.mass.pop_back();
    sg.first.assign(n_seg, -1);
    sg.at = &at, sg.a = &a, sg.w = &w;
  }
  Segments::Pos end{sg.n_seg(), 0};  // the kept prefix: every candidate
  if (p.top_p < 1.0f) {
    const Segments::Pos cross = sg.crossing(end, static_cast<double>(p.top_p) * sg.weight_before(end), false);
    end = {cross.seg, cross.i + 1};
  }
  if (p.min_p > 0.0f) {
    // w falls along the order, so min-p keeps a prefix. Its cut is near a = a_max + T ln(min_p): the
    // segments before that one's neighbour pass by a margin far above exp's rounding, and from there the
    // tokens are compared one by one, up to the segment after it (the rest fail).
    size_t j0 = 0, j1 = sg.n_seg();
    if (sg.at != nullptr && sg.n_seg() > 1) {
      const float a_cut = std::max(a_max + t * std::log(p.min_p), a_min);
      const auto j = static_cast<size_t>(std::min<int32_t>(
          static_cast<int32_t>(sg.n_seg() - 1),
          static_cast<int32_t>(sg.n_seg() - 1) -
              static_cast<int32_t>(std::max(
                  0.0f, std::min((a_cut - a_min) * (static_cast<float>(sg.n_seg() - 1) / (a_max - a_min)),
                                 static_cast<float>(sg.n_seg() - 1))))));
      j0 = j > 0 ? j - 1 : 0;
      j1 = j + 2;
    }
    for (size_t j = j0; j <= end.seg && j < sg.n_seg(); ++j) {
      if (j >= j1) {
        end = {j, 0};
        break;
      }
      const size_t n = sg.in(j, end);
      if (n == 0) continue;
      const Cand* tok = sg.tokens(j);
      size_t i = 0;
      while (i < n && tok[i].w >= p.min_p) ++i;
      if (i < n) {
        end = {j, i};
        break;
      }
    }
  }
  const double u = sample_uniform(uint64_t{p.seed_hi} << 32 | p.seed_lo, p.counter);
  out.token = sg.id(sg.crossing(end, u * sg.weight_before(end), /*strict=*/true));
  if (p.logprobs != 0 || p.n_top > 0) report(x, x_max, p, out);
  return out;
}

}  // namespace kiln::ops
