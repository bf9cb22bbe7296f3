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

// The candidates in bucket order: cands[seg[j], seg[j + 1]) is segment j, the tokens of one range of a,
// highest first, so that every token of a segment comes before every token of the next in the order of
// stage 3. Within a segment the order is sorted only when a search lands there (sorted[j]).
struct Segments {
  std::vector<Cand>& c;
  std::vector<int32_t>& seg;  // [n_seg + 1]
  std::vector<double>& mass;  // [n_seg] the weights of each segment, summed
  std::vector<uint8_t>& sorted;
  double beyond = 0.0;  // the weight of the candidates past the gathered segments (none gathered)

  size_t n_seg() const { return seg.size() - 1; }
  void sort(size_t j) {
    if (sorted[j] != 0) return;
    std::sort(c.begin() + seg[j], c.begin() + seg[j + 1], by_key_desc);
    sorted[j] = 1;
  }
  // The first position of c[0, n) (in order) whose cumulative weight passes target (> when strict, else >=);
  // n - 1 when rounding leaves none.
  size_t crossing(size_t n, double target, bool strict) {
    double cum = 0.0;
    for (size_t j = 0; j < n_seg() && static_cast<size_t>(seg[j]) < n; ++j) {
      const size_t lo = static_cast<size_t>(seg[j]), hi = std::min(n, static_cast<size_t>(seg[j + 1]));
      double m = mass[j];
      if (hi < static_cast<size_t>(seg[j + 1])) {  // a segment cut by an earlier filter (so already sorted)
        m = 0.0;
        for (size_t i = lo; i < hi; ++i) m += c[i].w;
      }
      if (strict ? cum + m > target : cum + m >= target) {
        sort(j);
        for (size_t i = lo; i < hi; ++i) {
          cum += c[i].w;
          if (strict ? cum > target : cum >= target) return i;
        }
        continue;  // rounding: the scan's sum fell short of the segments'
      }
      cum += m;
    }
    return n - 1;
  }
};

}  // namespace

SampleOut sample_row(std::span<const float> x, const SampleRow& p, std::span<const SampleAdjust> adjust,
                     SampleScratch& scratch) {
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
    float& v = a[static_cast<size_t>(e.id)];
    v = adjusted(v, p, e);
    if (bad_logit(v)) {
      out.token = kSampleBadAdjusted;
      return out;
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
  Segments sg{c, scratch.seg, scratch.mass, scratch.sorted};
  const float t = p.temperature;
  size_t n = 0;
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < n_finite) {
    // Top-k in one pass: a min-heap of the best k keys; a token below its front costs one comparison. The k
    // then form one sorted segment.
    const auto k = static_cast<size_t>(p.top_k);
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
    std::sort(c.begin(), c.begin() + static_cast<ptrdiff_t>(n), by_key_desc);
    double total = 0.0;
    for (size_t i = 0; i < n; ++i) {
      c[i].w = weight(a[static_cast<size_t>(key_id(c[i].key))], a_max, t);
      total += c[i].w;
    }
    sg.seg.assign({0, static_cast<int32_t>(n)});
    sg.mass.assign({total});
    sg.sorted.assign({1});
  } else {
    // Every finite token: the weights in one vectorized pass, and their sums over segments of equal width in
    // a (enough of them that a segment of a flat row holds a few tokens). Which segments a filter or the draw
    // can reach follows from the sums alone; only those tokens are gathered (a counting sort), never the row.
    const size_t n_seg = std::clamp<size_t>(n_finite / 8, 1, 8192);
    const float scale = a_max > a_min ? static_cast<float>(n_seg - 1) / (a_max - a_min) : 0.0f;
    // Segment of a: the highest a in segment 0; monotone in a, so the order is kept. -inf: n_seg (none).
    const float top = static_cast<float>(n_seg - 1);
    const auto segment = [&](float v) {
      const int32_t j = static_cast<int32_t>(n_seg - 1) -
                        static_cast<int32_t>(std::max(0.0f, std::min((v - a_min) * scale, top)));
      return v == kNegInf ? static_cast<int32_t>(n_seg) : j;
    };
    w.resize(n_vocab);
    std::vector<int32_t>& at = scratch.at;
    at.resize(n_vocab);
    for (size_t i = 0; i < n_vocab; ++i) {
      w[i] = exp_nonpositive((a[i] - a_max) / t);
      at[i] = segment(a[i]);
    }
    sg.seg.assign(n_seg + 2, 0);
    sg.mass.assign(n_seg + 1, 0.0);
    sg.sorted.assign(n_seg, 0);
    for (size_t i = 0; i < n_vocab; ++i) {
      const auto j = static_cast<size_t>(at[i]);
      ++sg.seg[j + 1];
      sg.mass[j] += w[i];
    }
    sg.seg.pop_back();  // the -inf tokens' count and weight (0)
    sg.mass.pop_back();
    double total = 0.0;
    for (const double m : sg.mass) total += m;
    for (size_t j = 0; j < n_seg; ++j) sg.seg[j + 1] += sg.seg[j];
    // The last segment any stage reads: one past where top-p's sum crosses (a margin for rounding), or
    // min-p's first segment with a token below it, or one past where the draw's sum crosses.
    const auto crossing_segment = [&](double target) {
      double cum = 0.0;
      for (size_t j = 0; j < n_seg; ++j) {
        cum += sg.mass[j];
        if (cum >= target) return j;
      }
      return n_seg - 1;
    };
    size_t last = n_seg - 1;
    if (p.top_p < 1.0f) {
      last = std::min(n_seg - 1, crossing_segment(static_cast<double>(p.top_p) * total) + 1);
    } else if (p.min_p > 0.0f) {
      // w >= min_p where a >= a_max + T ln(min_p), up to exp's rounding: a segment of margin.
      const float a_cut = a_max + t * std::log(p.min_p);
      last =
          a_cut <= a_min ? n_seg - 1 : std::min<size_t>(n_seg - 1, static_cast<size_t>(segment(a_cut)) + 1);
    } else {
      const double u = sample_uniform(uint64_t{p.seed_hi} << 32 | p.seed_lo, p.counter);
      last = std::min(n_seg - 1, crossing_segment(u * total) + 1);
    }
    n = static_cast<size_t>(sg.seg[last + 1]);
    c.resize(n);
    std::vector<int32_t>& fill = scratch.fill;
    fill.assign(sg.seg.begin(), sg.seg.begin() + static_cast<ptrdiff_t>(last + 1));
    for (size_t i = 0; i < n_vocab; ++i) {
      const auto j = static_cast<size_t>(at[i]);
      if (j <= last) c[static_cast<size_t>(fill[j]++)] = Cand{order_key(a[i], static_cast<int32_t>(i)), w[i]};
    }
    sg.seg.resize(last + 2);
    sg.mass.resize(last + 1);
    sg.sorted.resize(last + 1);
    sg.beyond = total;  // the weight of every candidate, gathered or not (top-p's denominator)
    for (const double m : sg.mass) sg.beyond -= m;
  }
  const auto kept_mass = [&](size_t upto) {
    double m = 0.0;
    for (size_t j = 0; j < sg.n_seg() && static_cast<size_t>(sg.seg[j]) < upto; ++j) {
      if (static_cast<size_t>(sg.seg[j + 1]) <= upto) {
        m += sg.mass[j];
      } else {
        for (size_t i = static_cast<size_t>(sg.seg[j]); i < upto; ++i) m += c[i].w;
      }
    }
    return m;
  };
  double total = kept_mass(n) + sg.beyond;  // every candidate's weight: top-p's denominator
  if (p.top_p < 1.0f) {
    n = sg.crossing(n, static_cast<double>(p.top_p) * total, /*strict=*/false) + 1;
    total = kept_mass(n);
  }
  if (p.min_p > 0.0f) {
    // w falls along the order, so min-p keeps a prefix: the cut is in the first segment holding a token
    // below min_p (sorted, then cut there), or else where the gathered segments end.
    total = kept_mass(n);
    for (size_t j = 0; j < sg.n_seg() && static_cast<size_t>(sg.seg[j]) < n; ++j) {
      const size_t lo = static_cast<size_t>(sg.seg[j]), hi = std::min(n, static_cast<size_t>(sg.seg[j + 1]));
      if (std::all_of(c.begin() + lo, c.begin() + hi, [&](const Cand& e) { return e.w >= p.min_p; }))
        continue;
      sg.sort(j);
      size_t cut = lo;
      while (cut < hi && c[cut].w >= p.min_p) ++cut;
      n = cut;
      total = kept_mass(n);
      break;
    }
  }
  const double u = sample_uniform(uint64_t{p.seed_hi} << 32 | p.seed_lo, p.counter);
  out.token = key_id(c[sg.crossing(n, u * total, /*strict=*/true)].key);
  if (p.logprobs != 0 || p.n_top > 0) report(x, x_max, p, out);
  return out;
}

}  // namespace kiln::ops
