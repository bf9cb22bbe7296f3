// The scale searches of the row quantizers (see quant_k_search.h). Groups have a compile-time size, so every
// scratch array lives on the stack. Where a search tries independent candidates (the symmetric search's trial
// scales, the scale-and-minimum search's groups), they are evaluated side by side with the candidate
// innermost: each candidate's sums still add in element order, so the results are the sequential search's,
// while the CPU overlaps the candidates' dependent additions and the compiler vectorises across them.
#include "core/quant/fp_contract_off.h"
// (the line above must stay first)
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/quant/quant_blocks.h"
#include "core/quant/quant_k_search.h"
#include "core/status.h"

namespace kiln::quant {
namespace {

int clamp_int(int v, int lo, int hi) { return std::max(lo, std::min(hi, v)); }

// The signed value of largest magnitude (the first one on ties) and that magnitude.
float signed_max(int n, const float* x, float* amax) {
  float max = 0.0f;
  *amax = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > *amax) {
      *amax = ax;
      max = x[i];
    }
  }
  return max;
}

template <int n>
float search_scale_symmetric_n(int nmax, const float* x, const float* weights, int8_t* L) {
  float amax;
  const float max = signed_max(n, x, &amax);
  if (amax < kGroupMaxEps) {
    std::memset(L, 0, static_cast<size_t>(n));
    return 0.0f;
  }
  // w * x is the same in every trial: (w * x) * l is ggml's w * x * l
  float w[n], wx[n];
  for (int i = 0; i < n; ++i) {
    w[i] = weights != nullptr ? weights[i] : x[i] * x[i];
    wx[i] = w[i] * x[i];
  }

  // The 19 trial scales 1 / iscale[t] are independent of each other: their sums are computed side by side
  // (t innermost, each sum still accumulated in element order), then judged in ggml's order.
  constexpr int kTrials = 19;  // t = 0: -nmax / max; t = 1..18: is = -9..-1, 1..9
  constexpr int kLanes = 20;   // kTrials rounded up to whole 4-float vectors; the last lane repeats t = 0
  float iscale[kLanes];
  iscale[0] = static_cast<float>(-nmax) / max;
  iscale[kLanes - 1] = iscale[0];
  for (int t = 1; t < kTrials; ++t) {
    const int is = t <= 9 ? t - 10 : t - 9;
    iscale[t] = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(is)) / max;
  }
  auto level = [&](float is, float xi) { return clamp_int(nearest_int(is * xi), -nmax, nmax - 1); };
  float sumlx[kLanes] = {}, suml2[kLanes] = {};
  for (int i = 0; i < n; ++i) {
    for (int t = 0; t < kLanes; ++t) {
      const auto fl = static_cast<float>(level(iscale[t], x[i]));
      sumlx[t] += wx[i] * fl;
      suml2[t] += w[i] * fl * fl;
    }
  }
  int chosen = 0;
  float scale = suml2[0] != 0.0f ? sumlx[0] / suml2[0] : 0.0f;
  float best = scale * sumlx[0];
  for (int t = 1; t < kTrials; ++t) {
    if (suml2[t] > 0.0f && sumlx[t] * sumlx[t] > best * suml2[t]) {
      chosen = t;
      scale = sumlx[t] / suml2[t];
      best = scale * sumlx[t];
    }
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(level(iscale[chosen], x[i]) + nmax);
  return scale;
}

}  // namespace

float search_scale_symmetric(int n, int nmax, const float* x, const float* weights, int8_t* L) {
  switch (n) {
    case 16: return search_scale_symmetric_n<16>(nmax, x, weights, L);
    case 32: return search_scale_symmetric_n<32>(nmax, x, weights, L);
    default: KILN_ASSERT(false && "group size"); return 0.0f;
  }
}

float search_scale_q3(int n, int nmax, const float* x, int8_t* L) {
  float amax;
  const float max = signed_max(n, x, &amax);
  if (amax < kGroupMaxEps) {
    std::memset(L, 0, static_cast<size_t>(n));
    return 0.0f;
  }
  const float iscale = static_cast<float>(-nmax) / max;
  float sumlx = 0.0f, suml2 = 0.0f;
  for (int i = 0; i < n; ++i) {
    const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * static_cast<float>(l);
    suml2 += w * static_cast<float>(l) * static_cast<float>(l);
  }
  // Move one level at a time to the value that is optimal given the others, while the fit improves.
  for (int pass = 0; pass < 5; ++pass) {
    int n_changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      const float li = static_cast<float>(L[i]);
      float slx = sumlx - w * x[i] * li;
      if (!(slx > 0.0f)) continue;
      float sl2 = suml2 - w * li * li;
      const int new_l = clamp_int(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
      if (new_l == L[i]) continue;
      const float fl = static_cast<float>(new_l);
      slx += w * x[i] * fl;
      sl2 += w * fl * fl;
      if (sl2 > 0.0f && slx * slx * suml2 > sumlx * sumlx * sl2) {
        L[i] = static_cast<int8_t>(new_l);
        sumlx = slx;
        suml2 = sl2;
        ++n_changed;
      }
    }
    if (n_changed == 0) break;
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

namespace {

// Put before a loop over lanes nested in a loop over elements. Without it GCC -O3 unrolls the short lane loop
// completely and vectorises the element loop instead, with in-order reductions: 3x slower than vectorising
// across the lanes, which -O2 does.
#define KILN_LANE_LOOP _Pragma("GCC unroll 1")
// search_scale_min, its kLanes groups side by side: transposed copies [n][kLanes] put the lanes innermost.
template <int kLanes, int n, bool kMad>
void search_scale_min_lanes(int nmax, const float* x, const float* weights, float rmin, float rdelta,
                            int nstep, uint8_t* L, float* scales, float* neg_mins) {
  float xt[n][kLanes], wt[n][kLanes];
  for (int s = 0; s < kLanes; ++s) {
    for (int i = 0; i < n; ++i) {
      xt[i][s] = x[s * n + i];
      wt[i][s] = weights[s * n + i];
    }
  }
  float min[kLanes], max[kLanes], sum_w[kLanes], sum_x[kLanes];
  for (int s = 0; s < kLanes; ++s) {
    min[s] = max[s] = xt[0][s];
    sum_w[s] = wt[0][s];
    sum_x[s] = sum_w[s] * xt[0][s];
  }
  for (int i = 1; i < n; ++i) {
    KILN_LANE_LOOP
    for (int s = 0; s < kLanes; ++s) {
      min[s] = xt[i][s] < min[s] ? xt[i][s] : min[s];
      max[s] = xt[i][s] > max[s] ? xt[i][s] : max[s];
      sum_w[s] += wt[i][s];
      sum_x[s] += wt[i][s] * xt[i][s];
    }
  }
  bool flat[kLanes];  // max == min: levels 0, scale 0
  float iscale[kLanes], scale[kLanes], best_error[kLanes] = {};
  for (int s = 0; s < kLanes; ++s) {
    min[s] = min[s] > 0.0f ? 0.0f : min[s];
    flat[s] = max[s] == min[s];
    iscale[s] = static_cast<float>(nmax) / (max[s] - min[s]);
    scale[s] = 1.0f / iscale[s];
  }
  // The weighted error of levels q under y = sc * q + mn.
  auto add_error = [&](float diff, float w, float* err) {
    diff = kMad ? std::fabs(diff) : diff * diff;
    *err += w * diff;
  };
  // The levels under trial, kept as floats: nearest_int's integer is clamped to [0, nmax] in float arithmetic
  // (exact for these integers), which vectorises without SSE4.1's integer min and max.
  float lt[n][kLanes];
  const auto fmax_level = static_cast<float>(nmax);
  auto level = [&](int i, int s) {
    const auto l = static_cast<float>(nearest_int(iscale[s] * (xt[i][s] - min[s])));
    const float lo = l > 0.0f ? l : 0.0f;
    return lo < fmax_level ? lo : fmax_level;
  };
  auto keep_levels = [&](int s) {
    for (int i = 0; i < n; ++i) L[s * n + i] = static_cast<uint8_t>(lt[i][s]);
  };
  for (int i = 0; i < n; ++i) {
    KILN_LANE_LOOP
    for (int s = 0; s < kLanes; ++s) {
      lt[i][s] = level(i, s);
      add_error(scale[s] * lt[i][s] + min[s] - xt[i][s], wt[i][s], &best_error[s]);
    }
  }
  for (int s = 0; s < kLanes; ++s) keep_levels(s);
  for (int is = 0; nstep >= 1 && is <= nstep; ++is) {
    // min is each lane's best fit so far: later trials start from it
    for (int s = 0; s < kLanes; ++s)
      iscale[s] = (rmin + rdelta * static_cast<float>(is) + static_cast<float>(nmax)) / (max[s] - min[s]);
    float sum_l[kLanes] = {}, sum_l2[kLanes] = {}, sum_xl[kLanes] = {};
    for (int i = 0; i < n; ++i) {
      KILN_LANE_LOOP
      for (int s = 0; s < kLanes; ++s) {
        lt[i][s] = level(i, s);
        const float fl = lt[i][s];
        sum_l[s] += wt[i][s] * fl;
        sum_l2[s] += wt[i][s] * fl * fl;
        sum_xl[s] += wt[i][s] * fl * xt[i][s];
      }
    }
    // Each lane's weighted least-squares scale and minimum for these levels (the minimum at most 0).
    bool fits[kLanes];
    float this_scale[kLanes], this_min[kLanes];
    for (int s = 0; s < kLanes; ++s) {
      const float D = sum_w[s] * sum_l2[s] - sum_l[s] * sum_l[s];
      fits[s] = D > 0.0f && !flat[s];
      this_scale[s] = (sum_w[s] * sum_xl[s] - sum_x[s] * sum_l[s]) / D;
      this_min[s] = (sum_l2[s] * sum_x[s] - sum_l[s] * sum_xl[s]) / D;
      if (this_min[s] > 0.0f) {
        this_min[s] = 0.0f;
        this_scale[s] = sum_xl[s] / sum_l2[s];
      }
    }
    float cur_error[kLanes] = {};
    for (int i = 0; i < n; ++i) {
      KILN_LANE_LOOP
      for (int s = 0; s < kLanes; ++s)
        add_error(this_scale[s] * lt[i][s] + this_min[s] - xt[i][s], wt[i][s], &cur_error[s]);
    }
    for (int s = 0; s < kLanes; ++s) {
      if (fits[s] && cur_error[s] < best_error[s]) {
        keep_levels(s);
        best_error[s] = cur_error[s];
        scale[s] = this_scale[s];
        min[s] = this_min[s];
      }
    }
  }
  for (int s = 0; s < kLanes; ++s) {
    if (flat[s]) std::memset(L + s * n, 0, static_cast<size_t>(n));
    scales[s] = flat[s] ? 0.0f : scale[s];
    neg_mins[s] = -min[s];
  }
}

}  // namespace

template <int kLanes, int n>
void search_scale_min(int nmax, const float* x, const float* weights, float rmin, float rdelta, int nstep,
                      bool use_mad, uint8_t* L, float* scales, float* neg_mins) {
  if (use_mad) {
    search_scale_min_lanes<kLanes, n, true>(nmax, x, weights, rmin, rdelta, nstep, L, scales, neg_mins);
  } else {
    search_scale_min_lanes<kLanes, n, false>(nmax, x, weights, rmin, rdelta, nstep, L, scales, neg_mins);
  }
}

template void search_scale_min<16, 16>(int, const float*, const float*, float, float, int, bool, uint8_t*,
                                       float*, float*);
template void search_scale_min<8, 32>(int, const float*, const float*, float, float, int, bool, uint8_t*,
                                      float*, float*);

#undef KILN_LANE_LOOP

float search_scale_positive(int n, int nmax, const float* x, const float* weights, uint8_t* L) {
  float max = 0.0f;
  for (int i = 0; i < n; ++i) max = max > x[i] ? max : x[i];
  if (max < kGroupMaxEps) {
    std::memset(L, 0, static_cast<size_t>(n));
    return 0.0f;
  }
  float iscale = static_cast<float>(nmax) / max;
  for (int i = 0; i < n; ++i) L[i] = static_cast<uint8_t>(nearest_int(iscale * x[i]));
  const float scale = 1.0f / iscale;
  float best_mse = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float diff = x[i] - scale * static_cast<float>(L[i]);
    best_mse += weights[i] * diff * diff;
  }
  for (int is = -4; is <= 4; ++is) {
    if (is == 0) continue;
    const float iscale_is = (0.1f * static_cast<float>(is) + static_cast<float>(nmax)) / max;
    const float scale_is = 1.0f / iscale_is;
    float mse = 0.0f;
    for (int i = 0; i < n; ++i) {
      const int l = std::min(nmax, nearest_int(iscale_is * x[i]));
      const float diff = x[i] - scale_is * static_cast<float>(l);
      mse += weights[i] * diff * diff;
    }
    if (mse < best_mse) {
      best_mse = mse;
      iscale = iscale_is;
    }
  }
  float sumlx = 0.0f, suml2 = 0.0f;
  for (int i = 0; i < n; ++i) {
    const int l = std::min(nmax, nearest_int(iscale * x[i]));
    L[i] = static_cast<uint8_t>(l);  // the sums below use l itself, the later passes the stored byte
    const float fl = static_cast<float>(l);
    sumlx += weights[i] * x[i] * fl;
    suml2 += weights[i] * fl * fl;
  }
  for (int pass = 0; pass < 5; ++pass) {
    int n_changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = weights[i];
      const float li = static_cast<float>(L[i]);
      float slx = sumlx - w * x[i] * li;
      float sl2 = suml2 - w * li * li;
      if (!(slx > 0.0f && sl2 > 0.0f)) continue;
      const int new_l = std::min(nmax, nearest_int(x[i] * sl2 / slx));
      if (new_l == L[i]) continue;
      const float fl = static_cast<float>(new_l);
      slx += w * x[i] * fl;
      sl2 += w * fl * fl;
      if (slx * slx * suml2 > sumlx * sumlx * sl2) {
        L[i] = static_cast<uint8_t>(new_l);
        sumlx = slx;
        suml2 = sl2;
        ++n_changed;
      }
    }
    if (n_changed == 0) break;
  }
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

int iq4nl_index(float v) {
  auto level = [](int i) { return static_cast<float>(kIQ4NLValues[i]); };
  if (v <= level(0)) return 0;
  if (v >= level(15)) return 15;
  // The bisection's bracket level(lo) <= v < level(lo + 1), found without branches: lo counts the inner
  // levels that v is not below (14 for NaN, as the bisection ends there).
  int lo = 0;
  for (int i = 1; i < 15; ++i) lo += !(v < level(i));
  return v - level(lo) < level(lo + 1) - v ? lo : lo + 1;
}

}  // namespace kiln::quant
