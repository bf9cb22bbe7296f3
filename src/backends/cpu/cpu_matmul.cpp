// matmul and moe_matmul on the CPU, one driver for both: a list of products (weight matrix, x row, dst row)
// grouped by matrix (one group for matmul; one per expert in use for moe_matmul, so each expert's weights are
// read once per call however many tokens chose it). Threads split (group, tile of kTileRows weight rows) work
// items; each item runs every x row of its group through the tile, kTileCols x rows per micro-kernel call,
// so a weight block is read once per kTileCols tokens (prefill is a tiled GEMM, decode the same code with
// one column). The kernels are those of the backend's ISA level (kernels/cpu_kernels.h).
// - precision_fast (the default of kiln run/chat/bench): the x rows are quantized once per call to the weight
//   type's activation format; each tile of weight rows is unpacked once to int8 sub-blocks and multiplied
//   with integer dot products. Types without an activation format (f32, f16, bf16) take the float path.
// - f32 activations: f32/f16/bf16 weights go through the packed float layout (cpu_pack.h) when the backend
//   made one at load, else are read in place; a quantized tile is dequantized by the reference dequantizer
//   (this is the exact path, --exact).
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/cpu_pack.h"
#include "backends/cpu/kernels/cpu_kernels.h"
#include "ops/ref/ref.h"

namespace kiln::cpu {

namespace {

static_assert(static_cast<uint32_t>(DType::f32) == 0 && static_cast<uint32_t>(DType::f16) == 1 &&
                  static_cast<uint32_t>(DType::q4_0) == 2 && static_cast<uint32_t>(DType::q4_1) == 3 &&
                  static_cast<uint32_t>(DType::q5_0) == 6 && static_cast<uint32_t>(DType::q5_1) == 7 &&
                  static_cast<uint32_t>(DType::q8_0) == 8 && static_cast<uint32_t>(DType::q8_1) == 9 &&
                  static_cast<uint32_t>(DType::q2_k) == 10 && static_cast<uint32_t>(DType::q3_k) == 11 &&
                  static_cast<uint32_t>(DType::q4_k) == 12 && static_cast<uint32_t>(DType::q5_k) == 13 &&
                  static_cast<uint32_t>(DType::q6_k) == 14 && static_cast<uint32_t>(DType::q8_k) == 15 &&
                  static_cast<uint32_t>(DType::iq2_xxs) == 16 && static_cast<uint32_t>(DType::iq2_xs) == 17 &&
                  static_cast<uint32_t>(DType::iq3_xxs) == 18 && static_cast<uint32_t>(DType::iq1_s) == 19 &&
                  static_cast<uint32_t>(DType::iq4_nl) == 20 && static_cast<uint32_t>(DType::iq3_s) == 21 &&
                  static_cast<uint32_t>(DType::iq2_s) == 22 && static_cast<uint32_t>(DType::iq4_xs) == 23 &&
                  static_cast<uint32_t>(DType::iq1_m) == 29 && static_cast<uint32_t>(DType::bf16) == 30 &&
                  static_cast<uint32_t>(DType::f8_e4m3) == 100 && static_cast<uint32_t>(DType::q8_64) == 101,
              "the kernels name types by these ids (kernels/cpu_kernels_impl.h)");

int64_t padded_k(int64_t k) { return (k + kKPad - 1) / kKPad * kKPad; }

// Elements of k per cache block of the batched products (a multiple of kKPad): kTileRows weight rows and
// kTileCols x rows of it fit in a 32 KiB L1 with room to spare (f32: 16 KiB).
constexpr int64_t kBlockK = 512;

// The products of one call: group a multiplies weight matrix w[:, :, mats[a]] with the x rows
// x_rows[start[a] .. start[a+1]) into the dst rows y_rows[same]. Rows are flat row indices of x and dst.
struct Products {
  Tensor w;  // [k, n, n_mats], rows contiguous
  std::vector<int32_t> mats;
  std::vector<int64_t> start;  // [mats.size() + 1]
  std::vector<int64_t> x_rows, y_rows;
  const uint8_t* w_row(int64_t a, int64_t j) const { return w.row(j, mats[a]); }
};

// A std::vector<T> whose data starts on a 64-byte boundary (the kernels' loads then never straddle a line).
template <class T>
class Aligned {
 public:
  explicit Aligned(int64_t n) : storage_(static_cast<size_t>(n) * sizeof(T) + 64) {}
  T* data() {
    return reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(storage_.data()) + 63) & ~uintptr_t{63});
  }

 private:
  std::vector<uint8_t> storage_;
};

// fn(a, j0, rows) for every (group a, tile of weight rows j0 .. j0 + kTileRows) in parallel; rows[r] is
// weight row min(j0 + r, n - 1) (a short last tile repeats the last row; those results are dropped).
template <class Fn>
void for_tiles(ThreadPool& pool, const Products& pr, Fn&& fn) {
  const int64_t n = pr.w.ne[1];
  const int64_t n_tiles = (n + kTileRows - 1) / kTileRows;
  pool.parallel_for(
      static_cast<int64_t>(pr.mats.size()) * n_tiles,
      [&](int64_t i0, int64_t i1, int) {
        for (int64_t item = i0; item < i1; ++item) {
          const int64_t a = item / n_tiles, j0 = item % n_tiles * kTileRows;
          const uint8_t* rows[kTileRows];
          for (int r = 0; r < kTileRows; ++r) rows[r] = pr.w_row(a, std::min(j0 + r, n - 1));
          fn(a, j0, rows);
        }
      },
      /*min_chunk=*/4);
}

// Writes out[c * kTileRows + r] (product entries e0 .. e0 + n_x, weight rows j0 + r) to dst.
void store_tile(const Products& pr, const Tensor& dst, int64_t e0, int n_x, int64_t j0, const float* out) {
  const int64_t nr = std::min<int64_t>(kTileRows, pr.w.ne[1] - j0);
  for (int c = 0; c < n_x; ++c) {
    float* y = reinterpret_cast<float*>(dst.flat_row(pr.y_rows[e0 + c])) + j0;
    for (int64_t r = 0; r < nr; ++r) y[r] = out[c * kTileRows + r];
  }
}

// f32 activations: x [k, ...] f32, dst [n, ...] f32, addressed by flat row.
void products_f32(ThreadPool& pool, const CpuKernels& kern, const Products& pr, const Tensor& x_t,
                  const Tensor& dst_t) {
  const int64_t k = pr.w.ne[0];
  const DType wt = pr.w.type;
  const bool in_place = wt == DType::f32 || wt == DType::f16 || wt == DType::bf16;
  for_tiles(pool, pr, [&](int64_t a, int64_t j0, const uint8_t* const* rows) {
    // Dequantized rows of a quantized weight: [kTileRows, k], per thread (no allocation per item: decode's
    // items are a few KiB of weights each).
    thread_local std::vector<float> buf_storage;
    float* buf = nullptr;
    if (!in_place) {
      buf_storage.resize(static_cast<size_t>(kTileRows * k + 16));
      buf = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(buf_storage.data()) + 63) & ~uintptr_t{63});
    }
    const uint8_t* w_rows[kTileRows];
    for (int r = 0; r < kTileRows; ++r) {
      if (in_place) {
        w_rows[r] = rows[r];
      } else {
        ops::ref::row_to_f32(pr.w, rows[r], buf + r * k);
        w_rows[r] = reinterpret_cast<const uint8_t*>(buf + r * k);
      }
    }
    const auto kt = static_cast<uint32_t>(in_place ? wt : DType::f32);
    const int64_t w_elem = in_place ? static_cast<int64_t>(dtype_info(wt).type_size) : 4;  // bytes
    const int64_t e_begin = pr.start[a], e_end = pr.start[a + 1];
    // k in cache blocks: the tile's rows and kTileCols x rows of one block stay in L1 while every x tile
    // passes; partial sums [e_end - e_begin, kTileRows].
    thread_local std::vector<float> sums;
    sums.assign(static_cast<size_t>((e_end - e_begin) * kTileRows), 0.0f);
    float out[kTileRows * kTileCols];
    for (int64_t k0 = 0; k0 < k; k0 += kBlockK) {
      const int64_t kn = std::min(kBlockK, k - k0);
      const uint8_t* w_blk[kTileRows];
      for (int r = 0; r < kTileRows; ++r) w_blk[r] = w_rows[r] + k0 * w_elem;
      for (int64_t e0 = e_begin; e0 < e_end; e0 += kTileCols) {
        const int n_x = static_cast<int>(std::min<int64_t>(kTileCols, e_end - e0));
        const float* xs[kTileCols];
        for (int c = 0; c < n_x; ++c) {
          xs[c] = reinterpret_cast<const float*>(x_t.flat_row(pr.x_rows[e0 + c])) + k0;
        }
        kern.fdot(kt, w_blk, xs, n_x, kn, out);
        float* acc = sums.data() + (e0 - e_begin) * kTileRows;
        for (int i = 0; i < n_x * kTileRows; ++i) acc[i] += out[i];
      }
    }
    for (int64_t e0 = e_begin; e0 < e_end; e0 += kTileCols) {
      const int n_x = static_cast<int>(std::min<int64_t>(kTileCols, e_end - e0));
      store_tile(pr, dst_t, e0, n_x, j0, sums.data() + (e0 - e_begin) * kTileRows);
    }
  });
}

// The types whose unpacked quants are int8: q8_0, and the non-linear ones, whose levels (and signs) the
// unpacker writes as values.
bool weight_is_signed(DType t) {
  switch (t) {
    case DType::q8_0:
    case DType::iq4_nl:
    case DType::iq4_xs:
    case DType::iq2_xxs:
    case DType::iq2_xs:
    case DType::iq2_s:
    case DType::iq3_xxs:
    case DType::iq3_s:
    case DType::iq1_s:
    case DType::iq1_m: return true;
    default: return false;
  }
}

// The x rows of a call quantized to `act`, in the QRowX layout: quants [m, kp], lane scales [m, kp / 4],
// half-block sums [m, kp / 16].
struct QuantizedRows {
  Aligned<int8_t> q;
  Aligned<float> d, s;
  QuantizedRows(ThreadPool& pool, const CpuKernels& kern, DType act, const Tensor& x_t, int64_t k, int64_t kp)
      : q(x_t.n_rows() * kp), d(x_t.n_rows() * kp / 4), s(x_t.n_rows() * kp / 16) {
    pool.parallel_for(x_t.n_rows(), [&](int64_t i0, int64_t i1, int) {
      for (int64_t i = i0; i < i1; ++i) {
        kern.quantize_x(static_cast<uint32_t>(act), reinterpret_cast<const float*>(x_t.flat_row(i)), k,
                        q.data() + i * kp, d.data() + i * kp / 4, s.data() + i * kp / 16);
      }
    });
  }
};

// Quantized activations: x rows to `act` once, then integer products against unpacked weight tiles.
void products_quantized(ThreadPool& pool, const CpuKernels& kern, const Products& pr, DType act,
                        const Tensor& x_t, const Tensor& dst_t) {
  const int64_t k = pr.w.ne[0], kp = padded_k(k);
  QuantizedRows xr_all(pool, kern, act, x_t, k, kp);
  const int8_t* xq = xr_all.q.data();
  const float *xd = xr_all.d.data(), *xs = xr_all.s.data();
  const auto wt = static_cast<uint32_t>(pr.w.type);
  const bool is_signed = weight_is_signed(pr.w.type), has_m = !is_signed;
  for_tiles(pool, pr, [&](int64_t a, int64_t j0, const uint8_t* const* rows) {
    float out[kTileRows * kTileCols];
    QRowX xr[kTileCols];
    auto x_tile = [&](int64_t e0) {
      const int n_x = static_cast<int>(std::min<int64_t>(kTileCols, pr.start[a + 1] - e0));
      for (int c = 0; c < n_x; ++c) {
        const int64_t i = pr.x_rows[e0 + c];
        xr[c] = {xq + i * kp, xd + i * kp / 4, xs + i * kp / 16};
      }
      return n_x;
    };
    const int64_t e_begin = pr.start[a], e_end = pr.start[a + 1];
    if (e_end - e_begin <= kTileCols) {  // few tokens (decode): straight from the packed blocks
      const int n_x = x_tile(e_begin);
      thread_local std::vector<float> offsets;  // [kTileRows, kp / 16]
      offsets.resize(static_cast<size_t>(kTileRows * kp / 16));
      if (kern.qdot_direct(wt, rows, k, xr, n_x, offsets.data(), out)) {
        store_tile(pr, dst_t, e_begin, n_x, j0, out);
        return;
      }
    }
    // The tile unpacked: [kTileRows, kp] quants, [kTileRows, kp / 4] lane scales, [kTileRows, kp / 16]
    // offsets.
    thread_local std::vector<uint8_t> storage;
    const auto bytes =
        static_cast<size_t>(kTileRows * kp + kTileRows * kp / 4 * 4 + kTileRows * kp / 16 * 4 + 64);
    if (storage.size() < bytes) storage.resize(bytes);
    auto* base =
        reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(storage.data()) + 63) & ~uintptr_t{63});
    auto* wq = base;
    auto* wd = reinterpret_cast<float*>(wq + kTileRows * kp);
    auto* wm = wd + kTileRows * kp / 4;
    kern.unpack_w(wt, rows, k, wq, wd, wm);
    // The whole row in one pass (no k blocks): each product then rounds exactly as qdot_direct's does, so a
    // token's result does not depend on its batch.
    const QTileW tile{wq, wd, wm, kp, 0, kp};
    for (int64_t e0 = e_begin; e0 < e_end; e0 += kTileCols) {
      const int n_x = x_tile(e0);
      kern.qdot(tile, xr, n_x, is_signed, has_m, out);
      store_tile(pr, dst_t, e0, n_x, j0, out);
    }
  });
}

// The packed products' work items (row groups) go to the threads in chunks from a shared counter
// (ThreadPool::parallel_dynamic), about kChunksAThread a thread: on a machine whose cores other processes
// also use, a thread that loses its core for a while no longer holds the others at the end of each matmul.
// Each chunk is a run of consecutive groups, a sequential read. A group's results do not depend on the
// thread.
constexpr int64_t kChunksAThread = 8;
// The fewest x rows worth an AMX call (below them the vpdpbusd kernel is as fast), and the fewest a last,
// partial tile takes (fewer go to the vpdpbusd kernel: a tile of 1 row costs what one of 16 does).
constexpr int64_t kPackTileMin = 16, kPackTileTail = 8;
int64_t dynamic_chunk(const ThreadPool& pool, int64_t n_items) {
  return std::max<int64_t>(1, n_items / (kChunksAThread * pool.n_threads()));
}

// The x rows of one matrix for the AMX packed kernel (QTilesX): n_x rows from x row i0 of QuantizedRows, and
// their scalars for w's form. n_x 0: none.
struct TiledRows {
  int64_t n_x = 0;
  const int8_t* q = nullptr;
  int64_t kp = 0;
  std::vector<float> dx, s0, s1;

  void make(const PackedMatrix& w, const int8_t* xq, const float* xs, const float* d1, int64_t i0,
            int64_t rows, int64_t kp_) {
    n_x = rows;
    kp = kp_;
    q = xq + i0 * kp;
    const int64_t n_sub = kp / kSub, n_t = (rows + kPackTileCols - 1) / kPackTileCols;
    const auto size = static_cast<size_t>(n_t * n_sub * kPackTileCols);
    dx.assign(size, 0.0f);
    s0.assign(size, 0.0f);
    const bool halves = w.scales == kPackK16 || w.scales == kPackKM16;
    s1.assign(halves ? size : 0, 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = i0 + r, t = r / kPackTileCols, j = r % kPackTileCols;
      for (int64_t s = 0; s < n_sub; ++s) {
        const auto at = static_cast<size_t>((t * n_sub + s) * kPackTileCols + j);
        const float s_lo = xs[i * kp / 16 + 2 * s], s_hi = xs[i * kp / 16 + 2 * s + 1];
        dx[at] = d1[i * n_sub + s];
        // As the packed kernels make them (the same bits).
        if (w.scales == kPackK16) {
          s0[at] = w.c * s_lo;
          s1[at] = w.c * s_hi;
        } else if (w.scales == kPackKM16) {
          s0[at] = s_lo;
          s1[at] = s_hi;
        } else if (w.scales == kPackD) {
          s0[at] = w.c * (s_lo + s_hi);
        } else {
          s0[at] = s_lo + s_hi;
        }
      }
    }
  }
  QTilesX x() const { return {q, kp, dx.data(), s0.data(), s1.empty() ? s0.data() : s1.data()}; }
};

// Quantized activations against the packed layout (cpu_pack.h): x rows quantized once, then per (group,
// kPackRows-row group) item every x row of the group through the packed kernel, kPackCols at a time.
void products_packed(ThreadPool& pool, const CpuKernels& kern, const Products& pr, const PackedWeight& pw,
                     DType act, const Tensor& x_t, const Tensor& dst_t) {
  const int64_t k = pr.w.ne[0], n = pr.w.ne[1], kp = padded_k(k);
  QuantizedRows xr_all(pool, kern, act, x_t, k, kp);
  const int8_t* xq = xr_all.q.data();
  const float *xd = xr_all.d.data(), *xs = xr_all.s.data();
  // Each sub-block's scale once (QRowX::d1), not once per lane.
  const int64_t x_rows = x_t.n_rows(), n_sub = kp / 32;
  std::vector<float> d1(static_cast<size_t>(x_rows * n_sub));
  for (int64_t i = 0; i < x_rows; ++i) {
    for (int64_t b = 0; b < n_sub; ++b) d1[static_cast<size_t>(i * n_sub + b)] = xd[i * kp / 4 + b * 8];
  }
  const int64_t n_groups = (n + kPackRows - 1) / kPackRows;
  const int64_t n_items = static_cast<int64_t>(pr.mats.size()) * n_groups;
  // Where this level has AMX tiles, a matrix's x rows go through them all at once (the group unpacked once)
  // when there are at least kPackTileMin of them, one after another in x (QuantizedRows then holds them at a
  // stride of kp: what an A tile loads), but for a short last tile's. Both kernels give the same bits.
  std::vector<TiledRows> tiled(pr.mats.size());
  if (kern.qdot_packed_tiles != nullptr) {
    for (size_t a = 0; a < pr.mats.size(); ++a) {
      const int64_t e0 = pr.start[a], e1 = pr.start[a + 1];
      bool consecutive = e1 - e0 >= kPackTileMin;
      for (int64_t e = e0 + 1; consecutive && e < e1; ++e)
        consecutive = pr.x_rows[e] == pr.x_rows[e0] + e - e0;
      if (consecutive) {
        const int64_t tail = (e1 - e0) % kPackTileCols;  // a last tile this short goes to packed_group
        tiled[a].make(pw.mats[static_cast<size_t>(pr.mats[a])], xq, xs, d1.data(), pr.x_rows[e0],
                      e1 - e0 - (tail < kPackTileTail ? tail : 0), kp);
      }
    }
  }
  pool.parallel_dynamic(n_items, dynamic_chunk(pool, n_items), [&](int64_t i0, int64_t i1, int) {
    float out[kPackRows * kPackCols];
    QRowX xr[kPackCols];
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t a = item / n_groups, g = item % n_groups, j0 = g * kPackRows;
      const PackedMatrix& w = pw.mats[static_cast<size_t>(pr.mats[a])];
      const int64_t nr = std::min<int64_t>(kPackRows, n - j0);
      int64_t e_from = pr.start[a];  // the rows from here on go through packed_group
      if (const TiledRows& t = tiled[static_cast<size_t>(a)]; t.n_x > 0) {
        const int64_t e0 = pr.start[a], n_x = t.n_x;
        thread_local std::vector<uint8_t> scratch;
        thread_local std::vector<float> tile_out;
        scratch.resize(static_cast<size_t>(n_sub * 512 + 64));
        tile_out.resize(static_cast<size_t>(n_x * kPackRows));
        kern.qdot_packed_tiles(w, g, t.x(), n_x, scratch.data(), tile_out.data());
        for (int64_t c = 0; c < n_x; ++c) {
          float* y = reinterpret_cast<float*>(dst_t.flat_row(pr.y_rows[e0 + c])) + j0;
          for (int64_t r = 0; r < nr; ++r) y[r] = tile_out[static_cast<size_t>(c * kPackRows + r)];
        }
        e_from += n_x;
      }
      for (int64_t e0 = e_from; e0 < pr.start[a + 1]; e0 += kPackCols) {
        const int n_x = static_cast<int>(std::min<int64_t>(kPackCols, pr.start[a + 1] - e0));
        for (int c = 0; c < n_x; ++c) {
          const int64_t i = pr.x_rows[e0 + c];
          xr[c] = {xq + i * kp, xd + i * kp / 4, xs + i * kp / 16, d1.data() + i * n_sub};
        }
        kern.qdot_packed(w, g, xr, n_x, out);
        for (int c = 0; c < n_x; ++c) {
          float* y = reinterpret_cast<float*>(dst_t.flat_row(pr.y_rows[e0 + c])) + j0;
          for (int64_t r = 0; r < nr; ++r) y[r] = out[c * kPackRows + r];
        }
      }
    }
  });
}

// f32 activations against the packed float layout (f32 / f16 / bf16 weights): threads split the (group,
// kPackRows-row group) items; each thread's run of consecutive groups of one matrix goes to the kernel
// kFPackGroups groups at a time, with every x row of the group.
void products_float_packed(ThreadPool& pool, const CpuKernels& kern, const Products& pr,
                           const PackedWeight& pw, const Tensor& x_t, const Tensor& dst_t) {
  const int64_t n_groups = (pr.w.ne[1] + kPackRows - 1) / kPackRows;
  const auto n_e = static_cast<int64_t>(pr.x_rows.size());
  std::vector<const float*> xs(static_cast<size_t>(n_e));
  std::vector<float*> ys(static_cast<size_t>(n_e));
  for (int64_t e = 0; e < n_e; ++e) {
    xs[e] = reinterpret_cast<const float*>(x_t.flat_row(pr.x_rows[e]));
    ys[e] = reinterpret_cast<float*>(dst_t.flat_row(pr.y_rows[e]));
  }
  const int64_t n_items = static_cast<int64_t>(pr.mats.size()) * n_groups;
  pool.parallel_dynamic(n_items, dynamic_chunk(pool, n_items), [&](int64_t i0, int64_t i1, int) {
    for (int64_t item = i0; item < i1;) {
      const int64_t a = item / n_groups, g = item % n_groups;
      const int ng = static_cast<int>(std::min<int64_t>({kFPackGroups, n_groups - g, i1 - item}));
      const PackedFloatMatrix& w = pw.fmats[static_cast<size_t>(pr.mats[a])];
      const int64_t e0 = pr.start[a];
      kern.fdot_packed(w, g, ng, xs.data() + e0, ys.data() + e0, static_cast<int>(pr.start[a + 1] - e0));
      item += ng;
    }
  });
}

void run_products(ThreadPool& pool, const CpuKernels& kern, const Products& pr, const PackedWeight* packed,
                  const Tensor& x_t, const Tensor& dst_t, ops::Precision precision) {
  const DType act =
      precision == ops::Precision::precision_fast ? ops::activation_type(pr.w.type) : DType::f32;
  const bool packed_fits = packed != nullptr && static_cast<int64_t>(packed->mats.size()) == pr.w.ne[2] &&
                           packed->mats[0].k == pr.w.ne[0] && packed->mats[0].n == pr.w.ne[1];
  const bool float_packed_fits = packed != nullptr &&
                                 static_cast<int64_t>(packed->fmats.size()) == pr.w.ne[2] &&
                                 packed->fmats[0].k == pr.w.ne[0] && packed->fmats[0].n == pr.w.ne[1] &&
                                 packed->fmats[0].type == static_cast<uint32_t>(pr.w.type);
  if (act == DType::f32 && float_packed_fits) {
    products_float_packed(pool, kern, pr, *packed, x_t, dst_t);
  } else if (act == DType::f32) {
    products_f32(pool, kern, pr, x_t, dst_t);
  } else if (packed_fits) {
    products_packed(pool, kern, pr, *packed, act, x_t, dst_t);
  } else {
    products_quantized(pool, kern, pr, act, x_t, dst_t);
  }
}

}  // namespace

void matmul(ThreadPool& pool, const CpuKernels& kern, const ops::Matmul& op, ops::Precision precision) {
  const int64_t m = op.x.n_rows();
  Products pr{op.w.tensor, {0}, {0, m}, std::vector<int64_t>(m), {}};
  std::iota(pr.x_rows.begin(), pr.x_rows.end(), 0);
  pr.y_rows = pr.x_rows;
  run_products(pool, kern, pr, packed_form(op.w), op.x, op.dst, precision);
}

void moe_matmul(ThreadPool& pool, const CpuKernels& kern, const ops::MoeMatmul& op,
                ops::Precision precision) {
  const int64_t n_expert = op.w.tensor.ne[2], n_used = op.dst.ne[1];
  const auto ids = op.ids.span_as<const int32_t>();
  const auto n_pairs = static_cast<int64_t>(ids.size());
  const bool shared_x = op.x.ne[1] == 1;  // x [k, 1, n_tokens]: x row t serves every slot of token t
  // Group the pairs p = s + n_used * t (dst flat row p) by expert: a counting sort, p ascending per expert.
  // Expert e's pairs are entries [first[e], first[e + 1]) of the sorted list.
  std::vector<int64_t> first(n_expert + 1, 0);
  for (int32_t e : ids) ++first[e + 1];
  for (int64_t e = 0; e < n_expert; ++e) first[e + 1] += first[e];
  Products pr{op.w.tensor, {}, {0}, std::vector<int64_t>(n_pairs), std::vector<int64_t>(n_pairs)};
  std::vector<int64_t> fill(first.begin(), first.end() - 1);
  for (int64_t p = 0; p < n_pairs; ++p) {
    const int64_t at = fill[ids[p]]++;
    pr.x_rows[at] = shared_x ? p / n_used : p;
    pr.y_rows[at] = p;
  }
  for (int64_t e = 0; e < n_expert; ++e) {
    if (first[e + 1] == first[e]) continue;  // unused experts cost nothing
    pr.mats.push_back(static_cast<int32_t>(e));
    pr.start.push_back(first[e + 1]);
  }
  run_products(pool, kern, pr, packed_form(op.w), op.x, op.dst, precision);
}

}  // namespace kiln::cpu
