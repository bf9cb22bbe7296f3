// Builds the search lattices of iq_lattice.h from the format grids of iq_grids.h.
#include "core/quant/iq_lattice.h"

#include <algorithm>
#include <climits>

#include "core/quant/iq_grids.h"
#include "core/status.h"

namespace kiln::quant {
namespace {

struct LatticeSpec {
  int dim, bits, grid_size;
  int n_levels;   // levels 0..n_levels-1 occur in the grid (and in the quantizers' keys)
  int n_nearest;  // distinct distances kept in a neighbour list (ggml's nwant)
};

// The level of format byte v: its position in the ascending list of the values the grid uses.
int level_of(uint8_t v, const uint8_t* values, int n_values) {
  for (int l = 0; l < n_values; ++l) {
    if (values[l] == v) return l;
  }
  KILN_ASSERT(false && "grid byte outside the format's values");
  return 0;
}

// [grid_size][dim] levels from a format grid of 64-bit (dim 8) or 32-bit (dim 4) entries.
template <class Entry>
std::vector<uint8_t> grid_levels(const Entry* grid, int grid_size, int dim, const uint8_t* values,
                                 int n_values) {
  std::vector<uint8_t> levels(static_cast<size_t>(grid_size) * dim);
  for (int g = 0; g < grid_size; ++g) {
    for (int k = 0; k < dim; ++k) {
      const auto byte = static_cast<uint8_t>((static_cast<uint64_t>(grid[g]) >> (8 * k)) & 0xFF);
      levels[static_cast<size_t>(g) * dim + k] = static_cast<uint8_t>(level_of(byte, values, n_values));
    }
  }
  return levels;
}

// Fills map and neighbours. A key holding a level >= n_levels is never formed by a quantizer; its map
// entry points at the first list.
void build_neighbours(const LatticeSpec& spec, IqLattice* lat) {
  const int n_keys = 1 << (spec.bits * spec.dim);
  lat->map.assign(n_keys, -1);
  for (int g = 0; g < spec.grid_size; ++g) {
    uint32_t key = 0;
    for (int k = 0; k < spec.dim; ++k) key |= static_cast<uint32_t>(lat->level(g, k)) << (spec.bits * k);
    lat->map[key] = g;
  }
  std::vector<int> d2(spec.grid_size);
  std::vector<int> digits(spec.dim);
  std::vector<int> cost(static_cast<size_t>(spec.dim) * spec.n_levels);  // [dim][n_levels]
  for (int key = 0; key < n_keys; ++key) {
    if (lat->map[key] >= 0) continue;
    bool formed = true;
    for (int k = 0; k < spec.dim; ++k) {
      digits[k] = (key >> (spec.bits * k)) & ((1 << spec.bits) - 1);
      formed = formed && digits[k] < spec.n_levels;
    }
    if (!formed) {
      lat->map[key] = -1;
      continue;
    }
    for (int k = 0; k < spec.dim; ++k) {
      for (int v = 0; v < spec.n_levels; ++v) {
        const int diff = (2 * v + 1) - (2 * digits[k] + 1);
        cost[k * spec.n_levels + v] = diff * diff;
      }
    }
    // The n_nearest smallest distinct distances, ascending.
    int nearest[4] = {INT_MAX, INT_MAX, INT_MAX, INT_MAX};
    int n_found = 0;
    for (int g = 0; g < spec.grid_size; ++g) {
      int d = 0;
      for (int k = 0; k < spec.dim; ++k) d += cost[k * spec.n_levels + lat->level(g, k)];
      d2[g] = d;
      int pos = 0;
      while (pos < n_found && nearest[pos] < d) ++pos;
      if (pos == spec.n_nearest || (pos < n_found && nearest[pos] == d)) continue;
      for (int r = std::min(n_found, spec.n_nearest - 1); r > pos; --r) nearest[r] = nearest[r - 1];
      nearest[pos] = d;
      n_found = std::min(n_found + 1, spec.n_nearest);
    }
    const size_t start = lat->neighbours.size();
    lat->map[key] = -1 - static_cast<int32_t>(start);
    lat->neighbours.push_back(0);
    for (int r = 0; r < n_found; ++r) {
      for (int g = 0; g < spec.grid_size; ++g) {
        if (d2[g] == nearest[r]) lat->neighbours.push_back(static_cast<uint16_t>(g));
      }
    }
    lat->neighbours[start] = static_cast<uint16_t>(lat->neighbours.size() - start - 1);
  }
}

IqLattice build(IqLatticeKind kind) {
  static constexpr uint8_t kIQ2Values[3] = {0x08, 0x19, 0x2B};
  static constexpr uint8_t kIQ1Values[3] = {0xFF, 0x00, 0x01};  // -1, 0, 1
  static constexpr uint8_t kIQ3XXSValues[8] = {4, 12, 20, 28, 36, 44, 52, 62};
  static constexpr uint8_t kIQ3SValues[8] = {1, 3, 5, 7, 9, 11, 13, 15};
  LatticeSpec spec{};
  IqLattice lat;
  switch (kind) {
    case IqLatticeKind::iq2_xxs:
      spec = {8, 2, 256, 3, 2};
      lat.levels = grid_levels(kIQ2XXSGrid, 256, 8, kIQ2Values, 3);
      break;
    case IqLatticeKind::iq2_xs:
      spec = {8, 2, 512, 3, 2};
      lat.levels = grid_levels(kIQ2XSGrid, 512, 8, kIQ2Values, 3);
      break;
    case IqLatticeKind::iq2_s:
      spec = {8, 2, 1024, 3, 1};
      lat.levels = grid_levels(kIQ2SGrid, 1024, 8, kIQ2Values, 3);
      break;
    case IqLatticeKind::iq3_xxs:
      spec = {4, 3, 256, 8, 2};
      lat.levels = grid_levels(kIQ3XXSGrid, 256, 4, kIQ3XXSValues, 8);
      break;
    case IqLatticeKind::iq3_s:
      spec = {4, 3, 512, 8, 3};
      lat.levels = grid_levels(kIQ3SGrid, 512, 4, kIQ3SValues, 8);
      break;
    case IqLatticeKind::iq1:
      spec = {8, 2, 2048, 3, 3};
      lat.levels = grid_levels(kIQ1SGrid, 2048, 8, kIQ1Values, 3);
      break;
  }
  lat.dim = spec.dim;
  lat.bits = spec.bits;
  lat.grid_size = spec.grid_size;
  lat.values.resize(lat.levels.size());
  for (size_t i = 0; i < lat.levels.size(); ++i) lat.values[i] = static_cast<float>(2 * lat.levels[i] + 1);
  build_neighbours(spec, &lat);
  return lat;
}

}  // namespace

const IqLattice& iq_lattice(IqLatticeKind kind) {
  // Function-local statics: built on first use, once, thread-safe.
  switch (kind) {
    case IqLatticeKind::iq2_xxs: {
      static const IqLattice lat = build(kind);
      return lat;
    }
    case IqLatticeKind::iq2_xs: {
      static const IqLattice lat = build(kind);
      return lat;
    }
    case IqLatticeKind::iq2_s: {
      static const IqLattice lat = build(kind);
      return lat;
    }
    case IqLatticeKind::iq3_xxs: {
      static const IqLattice lat = build(kind);
      return lat;
    }
    case IqLatticeKind::iq3_s: {
      static const IqLattice lat = build(kind);
      return lat;
    }
    case IqLatticeKind::iq1: {
      static const IqLattice lat = build(kind);
      return lat;
    }
  }
  KILN_ASSERT(false && "unknown IqLatticeKind");
  return iq_lattice(IqLatticeKind::iq1);
}

}  // namespace kiln::quant
