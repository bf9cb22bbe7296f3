// The scale searches behind the row quantizers (quantize_rows): for a group of n values x (a sub-block)
// and optional per-element weights w, find a scale (and a minimum) and the integer levels L that make the
// weighted squared error sum(w * (scale * L - x)^2) small. Each follows ggml's search of the same purpose
// (named beside it) operation for operation, so that the chosen levels and the f32 scales round identically
// and a model file's bytes equal llama-quantize's. Levels are returned already offset to be non-negative.
//
// Float expressions are written in ggml's evaluation order (a * b * c is (a * b) * c; int levels convert to
// float where ggml's would); the including .cpp files include fp_contract_off.h first.
#pragma once

#include <bit>
#include <cstdint>

namespace kiln::quant {

// Groups whose largest magnitude is below this are all zero (scale 0, levels 0).
inline constexpr float kGroupMaxEps = 1e-15f;

// Round to nearest, ties to even, for |v| <= 2^22 - 1: adding 1.5 * 2^23 leaves the integer in the low
// mantissa bits. Outside that range the result is the same wrapped value as ggml's nearest_int.
inline int nearest_int(float v) {
  return (std::bit_cast<int32_t>(v + 12582912.0f) & 0x007fffff) - 0x00400000;
}

// Symmetric levels q in [-nmax, nmax - 1], stored as L = q + nmax (ggml: make_qx_quants, rmse_type 1).
// Weights: `weights` when given, else x^2. Starts from scale max / -nmax (max: the signed value of largest
// magnitude), then tries 18 nearby scales -(nmax + 0.1 is) / max, is = -9..9, keeping the least-squares scale
// of the best levels. Returns that scale (0 for an all-zero group). n is 16 or 32.
float search_scale_symmetric(int n, int nmax, const float* x, const float* weights, int8_t* L);

// Q3_K without importance: levels q in [-nmax, nmax - 1] (L = q + nmax) from scale max / -nmax, then up to 5
// passes that move single levels while the x^2-weighted fit improves (ggml: make_q3_quants, do_rmse).
float search_scale_q3(int n, int nmax, const float* x, int8_t* L);

// Asymmetric levels L in [0, nmax] with y = scale * L - min, min >= 0 (ggml: make_qkx2_quants, and
// make_qkx3_quants, which computes the same with its weights given), for kLanes independent groups of n
// values at once: group s is x[s * n ..], weights[s * n ..], L[s * n ..], scales[s], neg_mins[s] (its min).
// The range [min(x, 0), max(x)] is split in nmax steps, then nstep + 1 scales (rmin + rdelta * is + nmax) /
// range are tried, each with its weighted least-squares scale and minimum (the range's low end moves to the
// best minimum so far); the smallest error wins (absolute error when use_mad, else squared). Instantiated for
// 16 groups of 16 and 8 groups of 32.
template <int kLanes, int n>
void search_scale_min(int nmax, const float* x, const float* weights, float rmin, float rdelta, int nstep,
                      bool use_mad, uint8_t* L, float* scales, float* neg_mins);

// Non-negative levels L in [0, nmax] for non-negative x (the sub-block scales and mins of the K-quants
// with importance; ggml: make_qp_quants): scale max / nmax and 8 nearby ones, the best by weighted squared
// error, then up to 5 passes of single-level moves. Returns the least-squares scale (0 for an all-zero
// group). Levels are stored as ggml stores them, in a byte (a negative x wraps).
float search_scale_positive(int n, int nmax, const float* x, const float* weights, uint8_t* L);

// The index (0..15) of the IQ4_NL level nearest to v, by bisection; the upper one on a tie, 15 for NaN
// (ggml: best_index_int8).
int iq4nl_index(float v);

}  // namespace kiln::quant
