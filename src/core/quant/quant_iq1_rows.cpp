// Row quantizers of IQ1_S and IQ1_M (ggml: quantize_row_iq1_s_impl, quantize_row_iq1_m_impl).
//
// A sub-block (32 elements for IQ1_S, 16 for IQ1_M) takes the values scale * (v + shift), v in {-1, 0, 1},
// shift = +-1/8 (kIQ1Delta). With the elements sorted by value, every assignment that can be optimal splits
// the sorted order in three runs (-1, 0, +1); the search tries all splits (i1, i2) with prefix sums of
// w x and w, for both shifts (IQ1_M: a shift per half), keeping the least-squares best. The levels are then
// moved onto the grid (a neighbour where they are off it) and the scale refit.
#include "core/quant/fp_contract_off.h"
// (the line above must stay first)
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "core/half.h"
#include "core/quant/iq_search.h"
#include "core/quant/quant_blocks.h"
#include "core/status.h"

namespace kiln::quant {
namespace {

using iq::max_of;

// The three values v + shift for each shift.
constexpr float kShiftPlus[3] = {-1 + kIQ1Delta, kIQ1Delta, 1 + kIQ1Delta};
constexpr float kShiftMinus[3] = {-1 - kIQ1Delta, -kIQ1Delta, 1 - kIQ1Delta};

// order[0..n) = element indices by ascending x; equal values keep their index order (ggml sorts with the C
// library's qsort, which glibc implements as a stable merge sort for arrays this small).
void sort_by_value(const float* x, int n, int* order) {
  for (int j = 0; j < n; ++j) order[j] = j;
  std::stable_sort(order, order + n, [x](int a, int b) { return x[a] < x[b]; });
}

// Levels from the best split: 0 before i1, 1 up to i2, 2 after, in sorted order.
void split_levels(const int* order, int n, int i1, int i2, int8_t* L) {
  for (int j = 0; j < n; ++j) L[order[j]] = static_cast<int8_t>(j < i1 ? 0 : j < i2 ? 1 : 2);
}

// Of the neighbours of an off-grid key, the entry minimizing sum w (scale * xx[g] - x)^2 over a group of 8
// (ggml: iq1_find_best_neighbour2; the first on ties). Where no distance compares below FLT_MAX (overflow or
// NaN), the first neighbour, where ggml's fallback reads out of bounds or aborts.
int iq1_best_neighbour(const IqLattice& lat, uint32_t key, const float* x, const float* weight, float scale,
                       const float* xx, int8_t* L) {
  const uint16_t* list = lat.neighbour_list(key);
  float best_d2 = FLT_MAX;
  int best = -1;
  for (int j = 1; j <= list[0]; ++j) {
    float d2 = 0;
    for (int i = 0; i < 8; ++i) {
      const float q = xx[lat.level(list[j], i)];
      const float w = weight[i];
      const float diff = scale * q - x[i];
      d2 += w * diff * diff;
    }
    if (d2 < best_d2) {
      best_d2 = d2;
      best = list[j];
    }
  }
  if (best < 0) best = list[1];
  for (int i = 0; i < 8; ++i) L[i] = static_cast<int8_t>(lat.level(best, i));
  return best;
}

// Grid indices for the groups of 8 of a sub-block's levels L (moved to the best neighbour where off the
// grid, using the shifted values xx_of(k) of group k), and the refit scale when any group moved.
template <class XX>
void snap_to_grid(const IqLattice& lat, int n, const float* xb, const float* weight, XX xx_of, int8_t* L,
                  uint16_t* index, float* scale) {
  bool all_on_grid = true;
  for (int k = 0; k < n / 8; ++k) {
    const uint32_t key = iq::key_of(lat, L + 8 * k);
    int g = lat.grid_index(key);
    if (g < 0) {
      all_on_grid = false;
      g = iq1_best_neighbour(lat, key, xb + 8 * k, weight + 8 * k, *scale, xx_of(k), L + 8 * k);
    }
    index[k] = static_cast<uint16_t>(g);
  }
  if (all_on_grid) return;
  float sumqx = 0, sumq2 = 0;
  for (int k = 0; k < n / 8; ++k) {
    const float* xx = xx_of(k);
    for (int j = 0; j < 8; ++j) {
      const float w = weight[8 * k + j];
      const float q = xx[lat.level(index[k], j)];
      sumqx += w * q * xb[8 * k + j];
      sumq2 += w * q * q;
    }
  }
  if (sumqx > 0 && sumq2 > 0) *scale = sumqx / sumq2;
}

void weights_of(const float* qw, const float* xb, float sigma2, int n, float* weight) {
  if (qw != nullptr) {
    iq::importance_weights(qw, xb, sigma2, n, weight);
  } else {
    for (int i = 0; i < n; ++i) weight[i] = xb[i] * xb[i];
  }
}

float max_abs(const float* x, int n) {
  float max = std::fabs(x[0]);
  for (int i = 1; i < n; ++i) max = max_of(max, std::fabs(x[i]));
  return max;
}

void quantize_row_iq1_s(const float* x, void* y, int64_t n, const float* qw_row) {
  constexpr int kBlock = 32;
  const IqLattice& lat = iq_lattice(IqLatticeKind::iq1);
  for (int64_t ibl = 0; ibl < n / kQK_K; ++ibl) {
    const float* xbl = x + kQK_K * ibl;
    BlockIQ1_S b{};
    float scales[kQK_K / kBlock];
    int8_t shifts[kQK_K / kBlock];
    float max_scale = 0;
    const float sigma2 = 2 * iq::sum_squares(xbl, kQK_K) / kQK_K;
    for (int ib = 0; ib < kQK_K / kBlock; ++ib) {
      const float* xb = xbl + kBlock * ib;
      float weight[kBlock];
      iq::importance_weights(qw_row + kQK_K * ibl + kBlock * ib, xb, sigma2, kBlock, weight);
      scales[ib] = 0;
      shifts[ib] = 1;
      const float max = max_abs(xb, kBlock);
      if (max < 1e-12f) continue;
      int order[kBlock];
      sort_by_value(xb, kBlock, order);
      float sumx[kBlock + 1], sumw[kBlock + 1];  // prefix sums of w x and w in sorted order
      sumx[0] = sumw[0] = 0;
      for (int j = 0; j < kBlock; ++j) {
        const int i = order[j];
        sumx[j + 1] = sumx[j] + weight[i] * xb[i];
        sumw[j + 1] = sumw[j] + weight[i];
      }
      float best_score = -FLT_MAX, scale = max;
      int best_i1 = -1, best_i2 = -1, best_shift = 0;
      for (int i1 = 0; i1 <= kBlock; ++i1) {
        for (int i2 = i1; i2 <= kBlock; ++i2) {
          for (const int shift : {1, -1}) {
            const float* v = shift == 1 ? kShiftPlus : kShiftMinus;
            const float sumqx =
                (sumx[i1] - sumx[0]) * v[0] + (sumx[i2] - sumx[i1]) * v[1] + (sumx[kBlock] - sumx[i2]) * v[2];
            const float sumq2 = (sumw[i1] - sumw[0]) * v[0] * v[0] + (sumw[i2] - sumw[i1]) * v[1] * v[1] +
                                (sumw[kBlock] - sumw[i2]) * v[2] * v[2];
            if (sumq2 > 0 && sumqx * sumqx > best_score * sumq2) {
              scale = sumqx / sumq2;
              best_score = scale * sumqx;
              best_i1 = i1;
              best_i2 = i2;
              best_shift = shift;
            }
          }
        }
      }
      if (best_i1 < 0 || best_i2 < 0 || best_shift == 0) continue;
      int8_t L[kBlock];
      split_levels(order, kBlock, best_i1, best_i2, L);
      if (scale < 0) {
        for (auto& l : L) l = static_cast<int8_t>(2 - l);
        scale = -scale;
        best_shift = -best_shift;
      }
      const float* xx = best_shift == 1 ? kShiftPlus : kShiftMinus;
      uint16_t index[kBlock / 8];
      snap_to_grid(
          lat, kBlock, xb, weight, [xx](int) { return xx; }, L, index, &scale);
      uint16_t h = 0;
      for (int k = 0; k < kBlock / 8; ++k) {
        b.qs[(kBlock / 8) * ib + k] = static_cast<uint8_t>(index[k] & 255);
        h = static_cast<uint16_t>(h | (index[k] >> 8) << (3 * k));
      }
      b.qh[ib] = h;
      scales[ib] = scale;
      shifts[ib] = static_cast<int8_t>(best_shift);
      max_scale = max_of(max_scale, scale);
    }
    if (max_scale != 0) {
      const float d = max_scale / 15;
      b.d = f32_to_f16(d * 1.125f);
      const float id = 1 / d;
      for (int ib = 0; ib < kQK_K / kBlock; ++ib) {
        int l = iq::clamp_level(nearest_int(0.5f * (id * scales[ib] - 1)), 7);
        if (shifts[ib] == -1) l |= 8;
        b.qh[ib] = static_cast<uint16_t>(b.qh[ib] | l << 12);
      }
    }
    store_block(y, ibl, b);
  }
}

// The shifted values of group k (0 or 1) of an IQ1_M sub-block with shift code c: bit 1 of c is the shift of
// group 0, bit 0 that of group 1 (set: -1/8).
const float* iq1m_values(int c, int k) {
  const bool minus = k == 0 ? c >= 2 : c % 2 != 0;
  return minus ? kShiftMinus : kShiftPlus;
}

// The best split of an IQ1_M sub-block of 16 for each of the 4 shift codes: prefix sums are kept per half
// (the halves may shift differently); for both value sets v[0] - v[1] = v[1] - v[2] = -1, so a split's
// sum of w x q collapses to T v[2] - (P[i1] + P[i2]). Returns the best code (-1 when none scores) with its
// split and least-squares scale.
int iq1m_best_split(const float* xb, const float* weight, const int* order, float* scale, int* best_i1,
                    int* best_i2) {
  constexpr int kBlock = 16;
  float px[2][kBlock + 1], pw[2][kBlock + 1];
  px[0][0] = px[1][0] = 0;
  pw[0][0] = pw[1][0] = 0;
  for (int j = 0; j < kBlock; ++j) {
    const int i = order[j];
    const int h = i < kBlock / 2 ? 0 : 1;
    px[h][j + 1] = px[h][j] + weight[i] * xb[i];
    px[1 - h][j + 1] = px[1 - h][j];
    pw[h][j + 1] = pw[h][j] + weight[i];
    pw[1 - h][j + 1] = pw[1 - h][j];
  }
  const float txs[2] = {px[0][kBlock], px[1][kBlock]};
  const float tws[2] = {pw[0][kBlock], pw[1][kBlock]};
  const float p2 = kShiftPlus[2], m2 = kShiftMinus[2];
  const float cp1 = kShiftPlus[0] * kShiftPlus[0] - kShiftPlus[1] * kShiftPlus[1];
  const float cp2 = kShiftPlus[1] * kShiftPlus[1] - kShiftPlus[2] * kShiftPlus[2];
  const float cm1 = kShiftMinus[0] * kShiftMinus[0] - kShiftMinus[1] * kShiftMinus[1];
  const float cm2 = kShiftMinus[1] * kShiftMinus[1] - kShiftMinus[2] * kShiftMinus[2];
  float best_score = -FLT_MAX;
  int best_c = -1;
  for (int i1 = 0; i1 <= kBlock; ++i1) {
    for (int i2 = i1; i2 <= kBlock; ++i2) {
      float qx_p[2], qx_m[2], q2_p[2], q2_m[2];
      for (int h = 0; h < 2; ++h) {
        const float sx = px[h][i1] + px[h][i2];
        qx_p[h] = txs[h] * p2 - sx;
        qx_m[h] = txs[h] * m2 - sx;
        q2_p[h] = tws[h] * p2 * p2 + pw[h][i1] * cp1 + pw[h][i2] * cp2;
        q2_m[h] = tws[h] * m2 * m2 + pw[h][i1] * cm1 + pw[h][i2] * cm2;
      }
      const float sumqx[4] = {qx_p[0] + qx_p[1], qx_p[0] + qx_m[1], qx_m[0] + qx_p[1], qx_m[0] + qx_m[1]};
      const float sumq2[4] = {q2_p[0] + q2_p[1], q2_p[0] + q2_m[1], q2_m[0] + q2_p[1], q2_m[0] + q2_m[1]};
      for (int c = 0; c < 4; ++c) {
        if (sumq2[c] > 0 && sumqx[c] * sumqx[c] > best_score * sumq2[c]) {
          *scale = sumqx[c] / sumq2[c];
          best_score = *scale * sumqx[c];
          *best_i1 = i1;
          *best_i2 = i2;
          best_c = c;
        }
      }
    }
  }
  return best_c;
}

// The f16 super-block scale of IQ1_M: the least-squares fit of all sub-blocks at their coded scales, packed
// as four nibbles into the top of the four uint16 of `scales`.
void iq1m_pack(const IqLattice& lat, const float* xbl, const float* qw, float sigma2, const float* scales,
               const int8_t* shifts, float max_scale, BlockIQ1_M* b) {
  constexpr int kBlock = 16;
  static constexpr uint8_t kShiftMasks[4] = {0x00, 0x80, 0x08, 0x88};
  uint16_t sc[4] = {};
  float d = max_scale / 15;
  const float id = 1 / d;
  float sumqx = 0, sumq2 = 0;
  for (int ib = 0; ib < kQK_K / kBlock; ++ib) {
    const int l = iq::clamp_level(nearest_int(0.5f * (id * scales[ib] - 1)), 7);
    sc[ib / 4] = static_cast<uint16_t>(sc[ib / 4] | l << (3 * (ib % 4)));
    b->qh[ib] |= kShiftMasks[shifts[ib]];
    const float* xb = xbl + kBlock * ib;
    float weight[kBlock];
    weights_of(qw != nullptr ? qw + kBlock * ib : nullptr, xb, sigma2, kBlock, weight);
    for (int k = 0; k < 2; ++k) {
      const float* xx = iq1m_values(shifts[ib], k);
      const int g = b->qs[2 * ib + k] + ((b->qh[ib] << (8 - 4 * k)) & 0x700);
      for (int j = 0; j < 8; ++j) {
        const float w = weight[8 * k + j];
        const float q = xx[lat.level(g, j)] * static_cast<float>(2 * l + 1);
        sumqx += w * q * xb[8 * k + j];
        sumq2 += w * q * q;
      }
    }
  }
  if (sumq2 > 0) d = sumqx / sumq2;
  const uint16_t s = f32_to_f16(d * 1.1125f);
  sc[0] = static_cast<uint16_t>(sc[0] | (s & 0x000F) << 12);
  sc[1] = static_cast<uint16_t>(sc[1] | (s & 0x00F0) << 8);
  sc[2] = static_cast<uint16_t>(sc[2] | (s & 0x0F00) << 4);
  sc[3] = static_cast<uint16_t>(sc[3] | (s & 0xF000));
  std::memcpy(b->scales, sc, sizeof(sc));
}

void quantize_row_iq1_m(const float* x, void* y, int64_t n, const float* qw_row) {
  constexpr int kBlock = 16;
  const IqLattice& lat = iq_lattice(IqLatticeKind::iq1);
  for (int64_t ibl = 0; ibl < n / kQK_K; ++ibl) {
    const float* xbl = x + kQK_K * ibl;
    const float* qw = qw_row != nullptr ? qw_row + kQK_K * ibl : nullptr;
    BlockIQ1_M b{};
    float scales[kQK_K / kBlock];
    int8_t shifts[kQK_K / kBlock];
    float max_scale = 0;
    const float sigma2 = 2 * iq::sum_squares(xbl, kQK_K) / kQK_K;
    for (int ib = 0; ib < kQK_K / kBlock; ++ib) {
      const float* xb = xbl + kBlock * ib;
      float weight[kBlock];
      weights_of(qw != nullptr ? qw + kBlock * ib : nullptr, xb, sigma2, kBlock, weight);
      scales[ib] = 0;
      shifts[ib] = 0;
      const float max = max_abs(xb, kBlock);
      if (max < 1e-7f) continue;
      int order[kBlock];
      sort_by_value(xb, kBlock, order);
      float scale = max;
      int i1 = -1, i2 = -1;
      int c = iq1m_best_split(xb, weight, order, &scale, &i1, &i2);
      if (i1 < 0 || i2 < 0 || c < 0) continue;
      int8_t L[kBlock];
      split_levels(order, kBlock, i1, i2, L);
      if (scale < 0) {
        for (auto& l : L) l = static_cast<int8_t>(2 - l);
        scale = -scale;
        c = 3 - c;
      }
      uint16_t index[kBlock / 8];
      snap_to_grid(
          lat, kBlock, xb, weight, [c](int k) { return iq1m_values(c, k); }, L, index, &scale);
      b.qs[2 * ib] = static_cast<uint8_t>(index[0] & 255);
      b.qs[2 * ib + 1] = static_cast<uint8_t>(index[1] & 255);
      b.qh[ib] = static_cast<uint8_t>((index[0] >> 8) | ((index[1] >> 8) << 4));
      scales[ib] = scale;
      shifts[ib] = static_cast<int8_t>(c);
      max_scale = max_of(max_scale, scale);
    }
    if (max_scale != 0) iq1m_pack(lat, xbl, qw, sigma2, scales, shifts, max_scale, &b);
    store_block(y, ibl, b);
  }
}

}  // namespace

void quantize_rows_iq1_s(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                         const float* importance) {
  KILN_ASSERT(importance != nullptr);
  iq::quantize_rows_with<BlockIQ1_S>(quantize_row_iq1_s, src, dst, n_rows, n_per_row, importance);
}

void quantize_rows_iq1_m(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                         const float* importance) {
  iq::quantize_rows_with<BlockIQ1_M>(quantize_row_iq1_m, src, dst, n_rows, n_per_row, importance);
}

}  // namespace kiln::quant
