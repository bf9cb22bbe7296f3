// The searches shared by the i-quant row quantizers (quant_iq*_rows.cpp). Each follows ggml's code of the
// same purpose operation for operation (named beside it): the same float expressions in the same order, the
// same comparisons (MAX(a, b) is a > b ? a : b), so that the chosen grid points and the f16 scales, and with
// them a model file's bytes, equal llama-quantize's. Including .cpp files include fp_contract_off.h first.
//
// Notation: a sub-block of n elements x (32 or 16) is quantized as scale * (2 L + 1) * sign with levels L
// from grid entries of the type's lattice (iq_lattice.h); xval = |x| after the sign step; weight and waux
// (its square root) are per-element weights of the squared error.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/quant/iq_lattice.h"
#include "core/quant/quant_blocks.h"
#include "core/quant/quant_k_search.h"  // nearest_int, search_scale_positive (ggml: make_qp_quants)

namespace kiln::quant::iq {

// ggml's MAX macro on floats (the order of the comparison decides NaN and signed-zero results).
inline float max_of(float a, float b) { return a > b ? a : b; }
// l clamped to [0, hi].
inline int clamp_level(int l, int hi) { return l < 0 ? 0 : (l > hi ? hi : l); }

// sum x^2 over n elements, in order.
inline float sum_squares(const float* x, int n) {
  float s = 0;
  for (int i = 0; i < n; ++i) s += x[i] * x[i];
  return s;
}

// The weights of a sub-block with importance qw: qw * sqrt(sigma2 + x^2), sigma2 a super-block's mean
// square (times 2 for most types).
inline void importance_weights(const float* qw, const float* x, float sigma2, int n, float* weight) {
  for (int i = 0; i < n; ++i) weight[i] = qw[i] * std::sqrt(sigma2 + x[i] * x[i]);
}

// xval = |x| for a group of 8 and the sign bits (bit i set: x[i] < 0). With even_parity (the 7-bit sign codes
// of IQ2_XXS, IQ2_XS, IQ3_XXS), an odd count of negatives flips the element of least weight * x^2 (the
// first such) so that the count is even, and returns the low 7 bits.
uint8_t group_signs(const float* x, const float* weight, float* xval, bool even_parity);

// Of the neighbour list of an off-grid key, the grid entry that minimizes sum waux * (scale * (2 g + 1) -
// xval)^2 over its dim elements (the first on ties); writes its levels to L and returns its index
// (ggml: iq2_find_best_neighbour, iq3_find_best_neighbour). Where no distance compares (NaN input), the first
// neighbour, where ggml aborts.
int best_neighbour(const IqLattice& lat, uint32_t key, const float* xval, const float* waux, float scale,
                   int8_t* L);

// The scale search of IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S (ggml: the body of quantize_row_iq2_xs_impl and
// its siblings between the sign step and the packing).
struct GridSearch {
  int k_max_q;         // levels per element: 3 (IQ2) or 8 (IQ3)
  int is_lo, is_hi;    // trial steps: scales (2 k_max_q - 1 + is * is_step) / max, is = is_lo..is_hi
  float is_step;       // 0.1 (IQ2) or 0.2 (IQ3)
  bool start_on_grid;  // the groups count as on the grid before any trial is kept (all but IQ3_S)
  bool refit_all;      // the final fit re-picks every group, not only the off-grid ones (IQ2_XXS, IQ3_S)
  bool refit_always;   // the final fit runs whenever the scale is positive (IQ2_XXS)
};
// Levels L[0..n) (groups of lat.dim elements) and the scale of a sub-block; `max` is the divisor of the
// trial scales and `scale` the scale kept when no trial improves on zero. L holds the levels kept when no
// trial improves (zeros, or IQ2_XXS's first guess).
float grid_search(const IqLattice& lat, const GridSearch& p, int n, const float* xval, const float* weight,
                  const float* waux, float max, float scale, int8_t* L);

// The key of dim levels: sum L[k] << (bits * k).
inline uint32_t key_of(const IqLattice& lat, const int8_t* L) {
  uint32_t key = 0;
  for (int k = 0; k < lat.dim; ++k) key |= static_cast<uint32_t>(L[k]) << (lat.bits * k);
  return key;
}

// The grid index of a group's levels; where they are off the grid (only after non-finite input, where ggml
// aborts), a neighbour or entry 0.
inline int grid_index_of(const IqLattice& lat, const int8_t* L) {
  const uint32_t key = key_of(lat, L);
  if (key >= lat.map.size()) return 0;
  const int g = lat.grid_index(key);
  return g >= 0 ? g : lat.neighbour_list(key)[1];
}

// quantize_rows from a one-row quantizer row_fn(src, dst, n, importance): the importance weights index a
// row's columns, the same for every row.
template <class Block>
void quantize_rows_with(void (*row_fn)(const float*, void*, int64_t, const float*), const float* src,
                        void* dst, int64_t n_rows, int64_t n_per_row, const float* importance) {
  const int64_t row_bytes = n_per_row / kQK_K * static_cast<int64_t>(sizeof(Block));
  for (int64_t r = 0; r < n_rows; ++r) {
    row_fn(src + r * n_per_row, static_cast<uint8_t*>(dst) + r * row_bytes, n_per_row, importance);
  }
}

}  // namespace kiln::quant::iq
