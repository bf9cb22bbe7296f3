// The shared i-quant searches (see iq_search.h).
#include "core/quant/fp_contract_off.h"
// (the line above must stay first)
#include <cfloat>

#include "core/quant/iq_search.h"
#include "core/status.h"

namespace kiln::quant::iq {

uint8_t group_signs(const float* x, const float* weight, float* xval, bool even_parity) {
  int n_negative = 0;
  uint8_t s = 0;
  for (int i = 0; i < 8; ++i) {
    if (x[i] >= 0) {
      xval[i] = x[i];
    } else {
      xval[i] = -x[i];
      ++n_negative;
      s |= static_cast<uint8_t>(1 << i);
    }
  }
  if (!even_parity) return s;
  if (n_negative % 2 != 0) {
    int imin = 0;
    float min = weight[0] * x[0] * x[0];
    for (int i = 1; i < 8; ++i) {
      const float ax = weight[i] * x[i] * x[i];
      if (ax < min) {
        min = ax;
        imin = i;
      }
    }
    xval[imin] = -xval[imin];
    s ^= static_cast<uint8_t>(1 << imin);
  }
  return s & 127;
}

namespace {

template <int kDim>
int best_neighbour_dim(const IqLattice& lat, const uint16_t* list, const float* xval, const float* waux,
                       float scale) {
  float best_d2 = FLT_MAX;
  int best = -1;
  for (int j = 1; j <= list[0]; ++j) {
    const float* q = lat.entry_values(list[j]);
    float d2 = 0;
    for (int i = 0; i < kDim; ++i) {
      const float diff = scale * q[i] - xval[i];
      d2 += waux[i] * diff * diff;
    }
    if (d2 < best_d2) {
      best_d2 = d2;
      best = list[j];
    }
  }
  return best;
}

}  // namespace

int best_neighbour(const IqLattice& lat, uint32_t key, const float* xval, const float* waux, float scale,
                   int8_t* L) {
  const uint16_t* list = lat.neighbour_list(key);
  int best = lat.dim == 8 ? best_neighbour_dim<8>(lat, list, xval, waux, scale)
                          : best_neighbour_dim<4>(lat, list, xval, waux, scale);
  if (best < 0) best = list[1];
  for (int i = 0; i < lat.dim; ++i) L[i] = static_cast<int8_t>(lat.level(best, i));
  return best;
}

namespace {

// Levels of every group for the inverse scale id: nearest odd value, clamped, then the best neighbour for
// off-grid groups at `scale`. on_grid[k] records whether group k's rounded levels were a grid entry. Only the
// groups with redo[k] (all when redo is null) are written. kDim = lat.dim, kBits = lat.bits.
template <int kDim, int kBits>
void pick_levels_dim(const IqLattice& lat, int k_max_q, int n, const float* xval, const float* waux, float id,
                     float scale, const bool* redo, int8_t* L, bool* on_grid) {
  for (int k = 0; k < n / kDim; ++k) {
    if (redo != nullptr && !redo[k]) continue;
    int8_t* Lk = L + kDim * k;
    uint32_t key = 0;
    for (int i = 0; i < kDim; ++i) {
      const int l = clamp_level(nearest_int(0.5f * (id * xval[kDim * k + i] - 1)), k_max_q - 1);
      Lk[i] = static_cast<int8_t>(l);
      key |= static_cast<uint32_t>(l) << (kBits * i);
    }
    on_grid[k] = lat.map[key] >= 0;
    if (!on_grid[k]) best_neighbour(lat, key, xval + kDim * k, waux + kDim * k, scale, Lk);
  }
}

void pick_levels(const IqLattice& lat, int k_max_q, int n, const float* xval, const float* waux, float id,
                 float scale, const bool* redo, int8_t* L, bool* on_grid) {
  if (lat.dim == 8) {
    KILN_ASSERT(lat.bits == 2);
    pick_levels_dim<8, 2>(lat, k_max_q, n, xval, waux, id, scale, redo, L, on_grid);
  } else {
    KILN_ASSERT(lat.dim == 4 && lat.bits == 3);
    pick_levels_dim<4, 3>(lat, k_max_q, n, xval, waux, id, scale, redo, L, on_grid);
  }
}

// sum w x q and sum w q^2 with q = 2 L + 1.
void fit_sums(int n, const float* xval, const float* weight, const int8_t* L, float* sumqx, float* sumq2) {
  float sx = 0, s2 = 0;
  for (int i = 0; i < n; ++i) {
    const float w = weight[i];
    const auto q = static_cast<float>(2 * L[i] + 1);
    sx += w * xval[i] * q;
    s2 += w * q * q;
  }
  *sumqx = sx;
  *sumq2 = s2;
}

}  // namespace

float grid_search(const IqLattice& lat, const GridSearch& p, int n, const float* xval, const float* weight,
                  const float* waux, float max, float scale, int8_t* L) {
  constexpr int kMaxGroups = 8;
  const int n_groups = n / lat.dim;
  bool on_grid[kMaxGroups], on_grid_trial[kMaxGroups];
  for (int k = 0; k < n_groups; ++k) on_grid[k] = p.start_on_grid;
  int8_t Ltrial[32];
  float best = 0;
  for (int is = p.is_lo; is <= p.is_hi; ++is) {
    const float id = (static_cast<float>(2 * p.k_max_q - 1) + static_cast<float>(is) * p.is_step) / max;
    const float this_scale = 1 / id;
    pick_levels(lat, p.k_max_q, n, xval, waux, id, this_scale, nullptr, Ltrial, on_grid_trial);
    float sumqx, sumq2;
    fit_sums(n, xval, weight, Ltrial, &sumqx, &sumq2);
    if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
      scale = sumqx / sumq2;
      best = scale * sumqx;
      std::memcpy(L, Ltrial, static_cast<size_t>(n));
      for (int k = 0; k < n_groups; ++k) on_grid[k] = on_grid_trial[k];
    }
  }
  bool redo[kMaxGroups];
  bool any = false;
  for (int k = 0; k < n_groups; ++k) {
    redo[k] = p.refit_all || !on_grid[k];
    any = any || !on_grid[k];
  }
  if ((any || p.refit_always) && scale > 0) {
    pick_levels(lat, p.k_max_q, n, xval, waux, 1 / scale, scale, redo, L, on_grid_trial);
    float sumqx, sumq2;
    fit_sums(n, xval, weight, L, &sumqx, &sumq2);
    if (sumq2 > 0) scale = sumqx / sumq2;
  }
  return scale;
}

}  // namespace kiln::quant::iq
