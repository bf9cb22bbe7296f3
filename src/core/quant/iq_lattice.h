// The i-quant grids as the quantizers search them (ggml: iq2xs_init_impl, iq3xs_init_impl).
//
// A grid entry is `dim` levels l_k in [0, n_levels), standing for the odd values 2 l_k + 1. A "key" packs any
// dim levels (not only grid entries) as sum l_k << (bits * k). For a key that is not a grid entry, the
// neighbour list holds the grid entries at the `n_nearest` smallest distinct squared distances
// sum (2 l_k + 1 - 2 g_k - 1)^2, nearest first and, at equal distance, in grid order: the candidates that the
// quantizers score. IQ1_S and IQ1_M share one lattice (their levels 0, 1, 2 stand for -1, 0, 1).
//
// Each lattice is built once, on first use, and is safe to share between threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kiln::quant {

enum class IqLatticeKind { iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, iq1 };

struct IqLattice {
  int dim;                      // levels per grid entry: 8 (IQ2, IQ1) or 4 (IQ3)
  int bits;                     // bits per level in a key: 2 (IQ2, IQ1) or 3 (IQ3)
  int grid_size;                // entries: 256, 512, 1024 or 2048
  std::vector<uint8_t> levels;  // [grid_size][dim] the level of each element of each entry
  std::vector<float> values;    // [grid_size][dim] 2 * level + 1, the value the searches score
  std::vector<int32_t> map;     // [1 << (bits * dim)] by key: the grid index (>= 0), or -1 - the offset of
                                // the key's list in `neighbours`
  std::vector<uint16_t> neighbours;  // lists, each a count n > 0 then n grid indices

  // The grid index of a key, or -1 when the key is not a grid entry.
  int grid_index(uint32_t key) const { return map[key] >= 0 ? map[key] : -1; }
  // The neighbour list (count first) of a key that is not a grid entry.
  const uint16_t* neighbour_list(uint32_t key) const { return neighbours.data() + (-1 - map[key]); }
  // Level k of grid entry g.
  int level(int g, int k) const { return levels[static_cast<size_t>(g) * dim + k]; }
  // The dim values 2 l + 1 of grid entry g.
  const float* entry_values(int g) const { return values.data() + static_cast<size_t>(g) * dim; }
};

const IqLattice& iq_lattice(IqLatticeKind kind);

}  // namespace kiln::quant
