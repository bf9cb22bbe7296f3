// The op harness: every op of ops/ops.h x every input type it accepts x odd shapes x non-contiguous views x
// every backend make_backend() can give, held to the scalar reference (ops/ref) within a per-op error budget,
// on fixed-seed random inputs. Also: check() rejects malformed calls naming the operand (one test per op),
// and a perf table (backend vs reference, median time per call) when KILN_OPS_PERF=1.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "backends/cpu/cpu_isa.h"
#include "core/half.h"
#include "core/overloaded.h"
#include "core/quant/quant_blocks.h"
#include "ops/collective.h"
#include "ops/ops.h"
#include "ops/ref/ref.h"
#include "ops/sample.h"

namespace kiln {
namespace {

using namespace kiln::ops;  // NOLINT: the op structs

// ---- error budgets ----
// matmul, attention: relative L2 |out - ref| / |ref| over the whole dst. A backend accumulates k (<= 1k) f32
// products against the f64 reference: ~sqrt(k) * 2^-24 ~ 1e-6 expected; 1e-5 leaves room for another
// summation order (SIMD lanes, split-k, online softmax) and still catches any wrong index, which costs O(1).
// A dot product of O(1) terms can cancel to near 0 while its rounding error stays ~sqrt(k) ulp of the terms
// (a 1x1 dst makes that the whole norm): matmul divides by at least unit RMS (its inputs are O(1)).
// moe_matmul: as matmul (each product is one). weighted_sum, moe_route's weights: as the row-wise ops.
// Row-wise ops (get_rows, norms, rope, softmax, gated_act, binary, scale): max |out - ref| / max(1,
// |ref|max). Values are O(1); f32 arithmetic and f32 exp/tanh/cos differ from the f64 reference by a few ulp
// (~2.4e-7).
enum class Metric { rel_l2, max_abs };
struct Budget {
  Metric metric;
  double limit;
  double ref_rms_floor = 0.0;  // rel_l2 divides by max(|ref|, ref_rms_floor * sqrt(N))
  // precision_fast against the exact product (a backend's own tolerance): the floor is at least this, the
  // typical size of the dot products (product_scale()). Rounding x perturbs a product by a fraction of that
  // size, however much its terms cancel, and a case of a single output may cancel down to little.
  double qx_floor = 0.0;
};
constexpr Budget kMatmul{Metric::rel_l2, 1e-5, 1.0};
constexpr Budget kAttention{Metric::rel_l2, 1e-5};
constexpr Budget kRowWise{Metric::max_abs, 1e-6};
// sum_squares: max |out - ref| / max(1, |ref|max) over the sums and counts. A backend sums up to a few
// hundred squares in f32 (in slices, on a GPU) against the f64 reference: a few ulp of the largest sum; a row
// missed or counted twice moves a sum by O(1) of its O(rows) size, and a count by 1.
constexpr Budget kSums{Metric::max_abs, 1e-5};
// argmax, moe_route's ids: exact indices. kv_write: bit-exact pools (f32 copied; f16 rounded to nearest even
// from the same f32).

// Every op the harness has a case for; EveryOpHasACase fails when the Op variant grows without one.
constexpr std::string_view kHarnessOps[] = {"get_rows",    "matmul",           "rms_norm",   "layer_norm",
                                            "rope",        "softmax",          "kv_write",   "attention",
                                            "gated_act",   "binary",           "scale",      "argmax",
                                            "sample",      "moe_route",        "moe_matmul", "weighted_sum",
                                            "sum_squares", "inverse_cholesky", "all_reduce", "all_gather"};

// The weight / table types of matmul and get_rows. f8_e4m3 (FP8 checkpoints) has no kernel of its own on the
// CPU: its tiles are dequantized and take the float products in both precisions; CUDA decodes it in the exact
// GEMV and, at the fast precision, multiplies larger batches on e4m3 tensor cores (OpHarness.MatmulFp8).
constexpr DType kWeightTypes[] = {DType::f32,     DType::f16,    DType::bf16,   DType::q4_0,    DType::q4_1,
                                  DType::q5_0,    DType::q5_1,   DType::q8_0,   DType::q2_k,    DType::q3_k,
                                  DType::q4_k,    DType::q5_k,   DType::q6_k,   DType::iq4_nl,  DType::iq4_xs,
                                  DType::iq2_xxs, DType::iq2_xs, DType::iq2_s,  DType::iq3_xxs, DType::iq3_s,
                                  DType::iq1_s,   DType::iq1_m,  DType::f8_e4m3};

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen_); }
  int32_t integer(int32_t lo, int32_t hi) { return std::uniform_int_distribution<int32_t>(lo, hi)(gen_); }
  std::vector<int32_t> permutation(int64_t n) {  // of [0, n)
    std::vector<int32_t> v(n);
    std::iota(v.begin(), v.end(), 0);
    std::shuffle(v.begin(), v.end(), gen_);
    return v;
  }

 private:
  std::mt19937_64 gen_;
};

// ---- host tensors ----
// An i32 view of `v` (step metadata and ids are tensors; `v` must outlive the view).
Tensor iv(const std::vector<int32_t>& v) {
  return make_tensor(DType::i32, const_cast<int32_t*>(v.data()), static_cast<int64_t>(v.size()));
}

// Block tables flattened as the Attention op takes them (CSR: indptr [n_seqs + 1], indices).
struct Csr {
  std::vector<int32_t> indptr{0}, indices;
};
Csr csr(const std::vector<std::span<const int32_t>>& tables) {
  Csr c;
  for (const auto& t : tables) {
    c.indices.insert(c.indices.end(), t.begin(), t.end());
    c.indptr.push_back(static_cast<int32_t>(c.indices.size()));
  }
  return c;
}

// Storage outside an f32 view holds this NaN: an input read outside its view poisons the result, a dst
// written outside its view is caught by outside_untouched().
constexpr uint32_t kPoisonBits = 0x7fc0dead;
float poison() { return fp32_from_bits(kPoisonBits); }

enum class Layout {
  contiguous,
  strided,  // rows 5 floats apart beyond the row, 3 more floats between matrices
  sliced,   // rows [2, 2 + ne1) of a [ne0, ne1 + 3, ne2] tensor
};
constexpr Layout kLayouts[] = {Layout::contiguous, Layout::strided, Layout::sliced};
const char* layout_name(Layout l) {
  return l == Layout::contiguous ? "contiguous" : l == Layout::strided ? "strided" : "sliced";
}

// A tensor view into its own storage (f32 activations, weights of any type, KV pools). Move-only: t.data
// points into mem.
struct Host {
  std::vector<uint8_t> mem;
  Tensor t;
  Host() = default;
  Host(Host&&) = default;
  Host(const Host&) = delete;
};

Host clone(const Host& h) {
  Host c;
  c.mem = h.mem;
  c.t = h.t;
  c.t.data = c.mem.data() + (static_cast<const uint8_t*>(h.t.data) - h.mem.data());
  return c;
}

template <class Fn>
void for_each_element(const Tensor& t, Fn&& fn) {  // fn(float&), in flat order
  for (int64_t i3 = 0; i3 < t.ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < t.ne[2]; ++i2)
      for (int64_t i1 = 0; i1 < t.ne[1]; ++i1) {
        float* r = t.row_as<float>(i1, i2, i3);
        for (int64_t i0 = 0; i0 < t.ne[0]; ++i0) fn(r[i0]);
      }
}

// sqrt(k) * rms(w) * rms(x): the typical size of a dot product of k terms of a row of w and of x (w
// dequantized; 0 when its type has no reference dequantizer).
double product_scale(const Tensor& w, const Tensor& x) {
  const DTypeInfo& info = dtype_info(w.type);
  if (info.dequantize_row == nullptr) return 0.0;
  const int64_t k = w.ne[0], rows = w.ne[1] * w.ne[2] * w.ne[3];
  std::vector<float> row(k);
  double w2 = 0.0, x2 = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    info.dequantize_row(w.flat_row(r), row.data(), k);
    for (float v : row) w2 += static_cast<double>(v) * v;
  }
  int64_t n_x = 0;
  for_each_element(x, [&](float& v) { x2 += static_cast<double>(v) * v, ++n_x; });
  return std::sqrt(static_cast<double>(k) * w2 / static_cast<double>(rows * k) * x2 /
                   static_cast<double>(std::max<int64_t>(n_x, 1)));
}

// Values uniform in [lo, hi] when rng is given, else zeros; poison outside the view.
Host make_f32(Layout layout, int64_t ne0, int64_t ne1, int64_t ne2, Rng* rng, float lo = -1.0f,
              float hi = 1.0f) {
  int64_t row = ne0, mat = ne0 * ne1, lead = 0;
  if (layout == Layout::strided) row = ne0 + 5, mat = row * ne1 + 3;
  if (layout == Layout::sliced) mat = ne0 * (ne1 + 3), lead = 2 * ne0;
  Host h;
  h.mem.resize(4 * (lead + mat * ne2));
  for (size_t i = 0; i < h.mem.size(); i += 4) std::memcpy(&h.mem[i], &kPoisonBits, 4);
  h.t.type = DType::f32;
  h.t.data = h.mem.data() + 4 * lead;
  h.t.ne = {ne0, ne1, ne2, 1};
  h.t.nb = {4, row * 4, mat * 4, mat * ne2 * 4};
  for_each_element(h.t, [&](float& v) { v = rng ? rng->uniform(lo, hi) : 0.0f; });
  return h;
}

Host dense(int64_t ne0, int64_t ne1, int64_t ne2, Rng* rng, float lo = -1.0f, float hi = 1.0f) {
  return make_f32(Layout::contiguous, ne0, ne1, ne2, rng, lo, hi);
}

std::vector<float> gather(const Tensor& t) {
  std::vector<float> v;
  v.reserve(t.n_elements());
  for_each_element(t, [&](float& x) { v.push_back(x); });
  return v;
}

bool outside_untouched(const Host& h) {
  Host c = clone(h);
  for_each_element(c.t, [](float& v) { v = poison(); });
  for (size_t i = 0; i < c.mem.size(); i += 4) {
    if (std::memcmp(&c.mem[i], &kPoisonBits, 4) != 0) return false;
  }
  return true;
}

// Offsets of the f16 scale fields in a block of the types without a reference quantizer (random blocks).
std::vector<size_t> scale_offsets(DType type) {
  using namespace kiln::quant;  // NOLINT
  switch (type) {
    case DType::q2_k: return {offsetof(BlockQ2_K, d), offsetof(BlockQ2_K, dmin)};
    case DType::q3_k: return {offsetof(BlockQ3_K, d)};
    case DType::q4_k: return {offsetof(BlockQ4_K, d), offsetof(BlockQ4_K, dmin)};
    case DType::q5_k: return {offsetof(BlockQ5_K, d), offsetof(BlockQ5_K, dmin)};
    case DType::q6_k: return {offsetof(BlockQ6_K, d)};
    case DType::iq4_nl: return {offsetof(BlockIQ4_NL, d)};
    case DType::iq4_xs: return {offsetof(BlockIQ4_XS, d)};
    case DType::iq2_xxs: return {offsetof(BlockIQ2_XXS, d)};
    case DType::iq2_xs: return {offsetof(BlockIQ2_XS, d)};
    case DType::iq2_s: return {offsetof(BlockIQ2_S, d)};
    case DType::iq3_xxs: return {offsetof(BlockIQ3_XXS, d)};
    case DType::iq3_s: return {offsetof(BlockIQ3_S, d)};
    case DType::iq1_s: return {offsetof(BlockIQ1_S, d)};
    default: return {};  // iq1_m: set_iq1_m_scale
  }
}

// IQ1_M's f16 scale d lives in the top nibbles of its four 16-bit scale words: bits 4i..4i+3 of d in word i.
void set_iq1_m_scale(uint8_t* block, uint16_t d) {
  for (int i = 0; i < 4; ++i) {
    uint16_t word;
    uint8_t* at = block + offsetof(quant::BlockIQ1_M, scales) + 2 * i;
    std::memcpy(&word, at, sizeof word);
    word = static_cast<uint16_t>((word & 0x0FFF) | (((d >> (4 * i)) & 0xF) << 12));
    std::memcpy(at, &word, sizeof word);
  }
}

// A [k, n] tensor of `type` whose rows are `pad` bytes apart beyond the row (0xff, a NaN in f32/f16). Types
// with a quantizer hold quantized uniform [-1, 1] values; the others random bytes with small finite f16
// scales.
Host make_weights(DType type, int64_t k, int64_t n, int64_t pad, Rng& rng) {
  const DTypeInfo& info = dtype_info(type);
  const int64_t row_bytes = k / info.block_size * info.type_size, stride = row_bytes + pad;
  Host h;
  h.mem.assign(stride * n, 0xff);
  h.t = make_tensor(type, h.mem.data(), k, n);
  h.t.nb[1] = stride;
  h.t.nb[2] = h.t.nb[3] = stride * n;
  const std::vector<size_t> scales = scale_offsets(type);
  EXPECT_TRUE(info.quantize_row != nullptr || !scales.empty() || type == DType::iq1_m)
      << "no generator for " << info.name;
  std::vector<float> v(k);
  for (int64_t j = 0; j < n; ++j) {
    uint8_t* row = h.t.row(j);
    if (info.quantize_row != nullptr) {
      for (float& x : v) x = rng.uniform(-1.0f, 1.0f);
      info.quantize_row(v.data(), row, k);
      continue;
    }
    for (int64_t b = 0; b < row_bytes; ++b) row[b] = static_cast<uint8_t>(rng.integer(0, 255));
    for (int64_t blk = 0; blk < k / info.block_size; ++blk) {
      for (size_t off : scales) {
        const uint16_t d = f32_to_f16(rng.uniform(0.004f, 0.02f) * (rng.integer(0, 1) ? 1.0f : -1.0f));
        std::memcpy(row + blk * info.type_size + off, &d, sizeof d);
      }
      if (type == DType::iq1_m) {
        set_iq1_m_scale(row + blk * info.type_size,
                        f32_to_f16(rng.uniform(0.004f, 0.02f) * (rng.integer(0, 1) ? 1.0f : -1.0f)));
      }
    }
  }
  return h;
}

// A KV pool [head_dim, n_kv, block_size, n_blocks] of f32 or f16 holding uniform [-1, 1] values.
Host make_pool(DType type, int64_t head_dim, int64_t n_kv, int64_t block_size, int64_t n_blocks, Rng& rng) {
  Host h = make_weights(type, head_dim, n_kv * block_size * n_blocks, 0, rng);
  h.t = make_tensor(type, h.mem.data(), head_dim, n_kv, block_size, n_blocks);
  return h;
}

// ---- backends and comparison ----
struct NamedBackend {
  std::string name;  // "cpu/avx2", "cuda"
  std::unique_ptr<Backend> backend;
  bool host_visible = true;  // its buffers are host memory
  std::string kind;          // make_backend's name: "cpu", "cuda"
  BackendOptions options;    // as made, the thread count aside
};

constexpr Precision kExact = Precision::precision_exact;
constexpr Precision kFast = Precision::precision_fast;
Precision precision_of(bool fast) { return fast ? kFast : kExact; }

// Every backend make_backend() gives here at `precision` (BackendOptions::precision), the CPU once per ISA
// level this machine runs (so every level's kernels are held to the references in one run). The harness fills
// inputs in host memory; a backend whose memory the host cannot read (a GPU's) gets each op's operands copied
// over and back (run_on).
std::vector<NamedBackend> make_backends(Precision precision) {
  std::vector<NamedBackend> v;
  std::vector<std::pair<std::string, BackendOptions>> wanted;
  for (cpu::CpuIsa isa : cpu::kCpuIsaLevels) {
    if (!cpu::cpu_isa_supported(isa)) continue;
    BackendOptions options;
    options.cpu_isa = std::string(cpu::cpu_isa_name(isa));
    wanted.emplace_back("cpu", options);
  }
  wanted.emplace_back("cuda", BackendOptions{});
  for (auto& [kind, options] : wanted) {
    options.n_threads = 3;  // odd: uneven chunks
    options.precision = precision;
    Result<std::unique_ptr<Backend>> b = make_backend(kind, options);
    if (!b.ok()) continue;
    Result<std::unique_ptr<Buffer>> probe = (*b)->allocate(64);
    if (!probe.ok()) continue;
    std::string name = options.cpu_isa.empty() ? kind : kind + "/" + options.cpu_isa;
    if (precision == kFast) name += " fast";
    v.push_back({name, std::move(b).value(), (*probe)->host_visible(), kind, options});
  }
  return v;
}
const std::vector<NamedBackend>& backends(Precision precision = kExact) {
  static const std::vector<NamedBackend> exact = make_backends(kExact);
  static const std::vector<NamedBackend> fast = make_backends(kFast);
  return precision == kFast ? fast : exact;
}

// Every tensor operand of an op, weights included (empty ones too: data == nullptr).
std::vector<Tensor*> operands(Op& op) {
  return std::visit(Overloaded{
                        [](GetRows& o) {
                          return std::vector<Tensor*>{&o.table.tensor, &o.ids, &o.dst};
                        },
                        [](Matmul& o) {
                          return std::vector<Tensor*>{&o.w.tensor, &o.x, &o.dst};
                        },
                        [](RmsNorm& o) {
                          return std::vector<Tensor*>{&o.x, &o.w.tensor, &o.dst};
                        },
                        [](LayerNorm& o) {
                          return std::vector<Tensor*>{&o.x, &o.w.tensor, &o.b.tensor, &o.dst};
                        },
                        [](Rope& o) {
                          return std::vector<Tensor*>{&o.x, &o.positions, &o.freq_factors.tensor, &o.dst};
                        },
                        [](Softmax& o) {
                          return std::vector<Tensor*>{&o.x, &o.dst};
                        },
                        [](KvWrite& o) {
                          return std::vector<Tensor*>{&o.k, &o.v, &o.k_pool, &o.v_pool, &o.slots};
                        },
                        [](Attention& o) {
                          return std::vector<Tensor*>{&o.q,   &o.k_pool,    &o.v_pool,     &o.positions,
                                                      &o.seq, &o.bt_indptr, &o.bt_indices, &o.dst};
                        },
                        [](GatedAct& o) {
                          return std::vector<Tensor*>{&o.gate, &o.up, &o.dst};
                        },
                        [](Binary& o) {
                          return std::vector<Tensor*>{&o.a, &o.b.tensor, &o.dst};
                        },
                        [](Scale& o) {
                          return std::vector<Tensor*>{&o.x, &o.dst};
                        },
                        [](Argmax& o) {
                          return std::vector<Tensor*>{&o.x, &o.out};
                        },
                        [](Sample& o) {
                          return std::vector<Tensor*>{&o.x, &o.rows, &o.adjust, &o.out, &o.mask};
                        },
                        [](MoeRoute& o) {
                          return std::vector<Tensor*>{&o.logits, &o.ids, &o.weights};
                        },
                        [](MoeMatmul& o) {
                          return std::vector<Tensor*>{&o.w.tensor, &o.x, &o.ids, &o.dst};
                        },
                        [](WeightedSum& o) {
                          return std::vector<Tensor*>{&o.y, &o.w, &o.dst};
                        },
                        [](SumSquares& o) {
                          return std::vector<Tensor*>{&o.x, &o.ids, &o.sums, &o.counts, &o.gram, &o.amax};
                        },
                        [](InverseCholesky& o) {
                          return std::vector<Tensor*>{&o.a, &o.l, &o.status};
                        },
                        [](AllReduce& o) {
                          return std::vector<Tensor*>{&o.x, &o.dst};
                        },
                        [](AllGather& o) {
                          return std::vector<Tensor*>{&o.x, &o.dst};
                        },
                    },
                    op);
}

// The bytes a view spans, from its first element to the end of its last row.
size_t extent(const Tensor& t) {
  if (t.n_elements() == 0) return 0;
  int64_t end = t.row_bytes();
  for (int d = 1; d < 4; ++d) end += (t.ne[d] - 1) * t.nb[d];
  return static_cast<size_t>(end);
}

// The op's operands in `b`'s memory: the host bytes each spans (overlapping spans merged, so aliased operands
// stay aliased, and the gaps of strided views travel too) uploaded to buffers of `b`, and back to the host
// after the run, so that what the backend wrote, in the view or outside it, is where the host looks.
class DeviceCopy {
 public:
  DeviceCopy(Backend& b, Op& op) : b_(b) {
    std::vector<Tensor*> ts;
    for (Tensor* t : operands(op)) {
      // A prepared weight is already in the backend's memory.
      if (t->buffer != nullptr && !t->buffer->host_visible()) continue;
      if (t->data != nullptr && extent(*t) > 0) ts.push_back(t);
    }
    std::vector<std::pair<uint8_t*, uint8_t*>> spans;
    for (Tensor* t : ts)
      spans.emplace_back(static_cast<uint8_t*>(t->data), static_cast<uint8_t*>(t->data) + extent(*t));
    std::sort(spans.begin(), spans.end());
    for (const auto& [lo, hi] : spans) {
      if (!regions_.empty() && lo <= regions_.back().hi) {
        regions_.back().hi = std::max(regions_.back().hi, hi);
      } else {
        regions_.push_back({lo, hi, nullptr});
      }
    }
    for (Region& r : regions_) {
      Result<std::unique_ptr<Buffer>> buf = b_.allocate(static_cast<size_t>(r.hi - r.lo));
      if (!buf.ok()) {
        status_ = buf.status();
        return;
      }
      r.buf = std::move(buf).value();
      const Tensor whole = make_tensor(DType::i8, *r.buf, 0, static_cast<int64_t>(r.hi - r.lo));
      if (status_ = b_.upload(whole, r.lo, static_cast<size_t>(r.hi - r.lo)); !status_.ok()) return;
    }
    for (Tensor* t : ts) {
      auto* p = static_cast<uint8_t*>(t->data);
      const Region& r = *std::find_if(regions_.begin(), regions_.end(),
                                      [&](const Region& g) { return p >= g.lo && p < g.hi; });
      t->data = static_cast<uint8_t*>(r.buf->data()) + (p - r.lo);
      t->buffer = r.buf.get();
    }
  }
  const Status& status() const { return status_; }
  // Every region back into host memory (the harness owns it all, inputs included: they come back unchanged).
  Status copy_back() {
    for (Region& r : regions_) {
      const Tensor whole = make_tensor(DType::i8, *r.buf, 0, static_cast<int64_t>(r.hi - r.lo));
      KILN_TRY(b_.download(r.lo, whole, static_cast<size_t>(r.hi - r.lo)));
    }
    return b_.synchronize();
  }

 private:
  struct Region {
    uint8_t* lo;
    uint8_t* hi;
    std::unique_ptr<Buffer> buf;
  };
  Backend& b_;
  std::vector<Region> regions_;
  Status status_;
};

// A Matmul's, MoeMatmul's or GetRows's weight replaced by what `b` makes of it at load (prepare_weight: a
// repacked layout, a device copy), which *handle then owns; false for other ops.
bool prepare_product_weight(Backend& b, Op& op, std::unique_ptr<WeightHandle>* handle) {
  ops::Weight* w = nullptr;
  WeightRole role = WeightRole::weight_role_matmul;
  if (auto* mm = std::get_if<Matmul>(&op)) {
    w = &mm->w;
  } else if (auto* moe = std::get_if<MoeMatmul>(&op)) {
    w = &moe->w;
    role = WeightRole::weight_role_expert_matmul;
  } else if (auto* gr = std::get_if<GetRows>(&op)) {
    w = &gr->table;
    role = WeightRole::weight_role_tied_embedding;  // a table that is also a product weight: repacked too
  }
  if (w == nullptr) return false;
  Result<std::unique_ptr<WeightHandle>> h = b.prepare_weight(w->tensor, "w", role);
  EXPECT_TRUE(h.ok()) << h.status().to_string();
  if (!h.ok()) return false;
  *handle = std::move(h).value();
  *w = (*handle)->weight;
  return true;
}

// Runs `op` on `b`: false when the backend does not claim it (run() must then say unimplemented). An op the
// backend claims (supports()) must run: a failure there fails the test, it is never skipped.
bool run_on(const NamedBackend& nb, const Op& op, const std::string& what) {
  Backend& b = *nb.backend;
  const bool supported = b.supports(op);
  Op on_backend = op;
  std::optional<DeviceCopy> copy;
  if (!nb.host_visible && supported) {
    copy.emplace(b, on_backend);
    EXPECT_TRUE(copy->status().ok()) << what << ": " << copy->status().to_string();
    if (!copy->status().ok()) return false;
  }
  const Status s = b.run(on_backend);
  Status synced = b.synchronize();
  if (!supported) {
    EXPECT_EQ(s.code(), StatusCode::unimplemented) << what;
    return false;
  }
  if (copy && synced.ok()) synced = copy->copy_back();
  EXPECT_TRUE(s.ok()) << what << ": the backend claims this op but did not run it: " << s.to_string();
  EXPECT_TRUE(synced.ok()) << what << ": " << synced.to_string();
  return s.ok() && synced.ok();
}

struct Error {
  double rel_l2;   // |out - ref| / max(|ref|, ref_rms_floor * sqrt(N))
  double max_abs;  // max |out - ref| / max(1, max |ref|)
};
Error compare(const std::vector<float>& out, const std::vector<float>& ref, double ref_rms_floor) {
  double diff2 = 0.0, ref2 = 0.0, max_diff = 0.0, max_ref = 1.0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double d = static_cast<double>(out[i]) - ref[i];
    diff2 += d * d;
    ref2 += static_cast<double>(ref[i]) * ref[i];
    max_diff = std::isnan(d) ? INFINITY : std::max(max_diff, std::fabs(d));
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref[i])));
  }
  const double floor2 = ref_rms_floor * ref_rms_floor * static_cast<double>(ref.size());
  return {std::isnan(diff2) ? INFINITY : std::sqrt(diff2 / std::max({ref2, floor2, 1e-30})),
          max_diff / max_ref};
}

// The ops a backend's precision applies to.
bool precision_applies(const Op& op) {
  return std::holds_alternative<Matmul>(op) || std::holds_alternative<MoeMatmul>(op) ||
         std::holds_alternative<Attention>(op);
}

// Runs make_op(dst) with the reference and on every backend of `precision`, each into its own copy of `dst`,
// and holds each backend's dst view to the reference's (at that precision) within `budget`, and the storage
// around the view to be untouched.
// The weight type of a product op (Matmul, MoeMatmul); f32 for the others (Backend::fast_tolerance).
DType product_weight_type(const Op& op) {
  if (const auto* m = std::get_if<Matmul>(&op)) return m->w.tensor.type;
  if (const auto* m = std::get_if<MoeMatmul>(&op)) return m->w.tensor.type;
  return DType::f32;
}

template <class MakeOp>
void expect_matches_ref(const std::string& what, const Host& dst, Budget budget, MakeOp&& make_op,
                        Precision precision = kExact) {
  Host want = clone(dst);
  const Op ref_op = make_op(want.t);
  const Status valid = check(ref_op);
  ASSERT_TRUE(valid.ok()) << what << ": " << valid.to_string();
  ref::run(ref_op, precision);
  const std::vector<float> ref_values = gather(want.t);
  // A backend with its own fast precision is held to the exact product within its tolerance.
  std::vector<float> exact_values;
  if (precision == kFast && precision_applies(ref_op)) {
    Host exact = clone(dst);
    ref::run(make_op(exact.t), kExact);
    exact_values = gather(exact.t);
  }
  for (const NamedBackend& nb : backends(precision)) {
    // The weight as given (a plain tensor), then as the backend prepares it at load (its own layout).
    for (const bool prepared : {false, true}) {
      Host out = clone(dst);
      Op op = make_op(out.t);
      std::unique_ptr<WeightHandle> handle;
      if (prepared && !prepare_product_weight(*nb.backend, op, &handle)) continue;
      const std::string label = nb.name + (prepared ? " (prepared weight)" : "");
      if (!run_on(nb, op, what)) continue;
      const double tolerance = nb.backend->fast_tolerance(product_weight_type(op));
      if (!exact_values.empty() && tolerance > 0.0) {
        const Error e = compare(gather(out.t), exact_values, std::max(budget.ref_rms_floor, budget.qx_floor));
        EXPECT_LE(e.rel_l2, tolerance) << label << " " << what << " (against the exact product)";
      } else {
        const Error e = compare(gather(out.t), ref_values, budget.ref_rms_floor);
        EXPECT_LE(budget.metric == Metric::rel_l2 ? e.rel_l2 : e.max_abs, budget.limit)
            << label << " " << what;
      }
      EXPECT_TRUE(outside_untouched(out)) << label << " " << what << ": wrote outside dst";
    }
  }
}

// ---- one test per op: backend vs reference ----

// op_name() of every alternative of the Op variant.
template <size_t... I>
std::vector<std::string_view> all_op_names(std::index_sequence<I...>) {
  return {op_name(Op(std::in_place_index<I>))...};
}

TEST(OpHarness, EveryOpHasACase) {
  for (std::string_view name : all_op_names(std::make_index_sequence<std::variant_size_v<Op>>())) {
    EXPECT_NE(std::find(std::begin(kHarnessOps), std::end(kHarnessOps), name), std::end(kHarnessOps)) << name;
  }
  EXPECT_FALSE(backends().empty());
  // The CPU once per ISA level this machine runs.
  const auto levels = std::count_if(std::begin(cpu::kCpuIsaLevels), std::end(cpu::kCpuIsaLevels),
                                    [](cpu::CpuIsa isa) { return cpu::cpu_isa_supported(isa); });
  EXPECT_EQ(std::count_if(backends().begin(), backends().end(),
                          [](const NamedBackend& nb) { return nb.kind == "cpu"; }),
            levels);
}

// Matmul{w, x, dst} against the reference at the exact precision and at the fast one (held to the rounded-x
// reference, or to a backend's own tolerance of the exact product).
void expect_matmul_matches(const std::string& what, const Host& w, const Host& x, const Host& dst) {
  for (bool qx : {false, true}) {
    Budget budget = kMatmul;
    budget.qx_floor = product_scale(w.t, x.t);
    expect_matches_ref(
        what + (qx ? " fast" : ""), dst, budget,
        [&](const Tensor& d) {
          return Op(Matmul{w.t, x.t, d});
        },
        precision_of(qx));
  }
}

TEST(OpHarness, Matmul) {
  Rng rng(1);
  struct Shape {
    int64_t n, m1, m2;  // w rows; x rows = m1 * m2 (x is [k, m1, m2])
    Layout layout;
  };
  const Shape shapes[] = {{1, 1, 1, Layout::contiguous}, {3, 3, 1, Layout::strided},
                          {7, 4, 3, Layout::sliced},     {33, 7, 1, Layout::contiguous},
                          {257, 1, 1, Layout::strided},  {257, 5, 1, Layout::sliced}};
  for (DType type : kWeightTypes) {
    const DTypeInfo& info = dtype_info(type);
    // Rows of more than 2048 elements too: CUDA's one-token GEMV takes fewer rows a block there.
    const std::vector<int64_t> ks = info.block_size == 1    ? std::vector<int64_t>{1, 7, 33, 257, 64, 3, 2051}
                                    : info.block_size == 32 ? std::vector<int64_t>{32, 96, 288, 2080}
                                                            : std::vector<int64_t>{256, 512, 2304};
    for (size_t s = 0; s < std::size(shapes) * ks.size(); ++s) {
      const Shape& sh = shapes[s % std::size(shapes)];
      const int64_t k = ks[s / std::size(shapes)];
      const int64_t pad = sh.layout == Layout::contiguous ? 0 : 3 * info.type_size;
      const Host w = make_weights(type, k, sh.n, pad, rng);
      const Host x = make_f32(sh.layout, k, sh.m1, sh.m2, &rng);
      const Host dst = make_f32(sh.layout, sh.n, sh.m1, sh.m2, nullptr);
      expect_matmul_matches(fmt::format("matmul {} w [{}, {}] x [{}, {}, {}] {}", info.name, k, sh.n, k,
                                        sh.m1, sh.m2, layout_name(sh.layout)),
                            w, x, dst);
    }
  }
}

// Batched decode (9 to 64 tokens): the shapes where a GPU multiplies a tile of tokens at a time (CUDA's
// integer tensor-core kernel for the K-quants, whose rows it copies whole 16-byte chunks at a time: Q6_K's
// rows are whole chunks at multiples of 2048 elements). 37 rows: no multiple of a tile.
TEST(OpHarness, MatmulBatches) {
  Rng rng(17);
  struct Shape {
    int64_t m1, m2;
    Layout layout;
  };
  const Shape shapes[] = {{12, 1, Layout::contiguous}, {13, 2, Layout::strided}, {64, 1, Layout::sliced}};
  for (DType type : kWeightTypes) {
    const DTypeInfo& info = dtype_info(type);
    if (info.block_size == 1) continue;  // the float types: OpHarness.MatmulFloatIsBatchInvariant
    const int64_t k = info.block_size == 32 ? 288 : 2048, n = 37;
    for (const Shape& sh : shapes) {
      const int64_t pad = sh.layout == Layout::contiguous ? 0 : 3 * info.type_size;
      const Host w = make_weights(type, k, n, pad, rng);
      const Host x = make_f32(sh.layout, k, sh.m1, sh.m2, &rng);
      const Host dst = make_f32(sh.layout, n, sh.m1, sh.m2, nullptr);
      expect_matmul_matches(fmt::format("matmul {} w [{}, {}] x [{}, {}, {}] {}", info.name, k, n, k, sh.m1,
                                        sh.m2, layout_name(sh.layout)),
                            w, x, dst);
    }
  }
}

// FP8 weights beyond the GEMV's columns, n and k multiples of 16: where a GPU takes its e4m3 tensor cores at
// the fast precision (x rounded per token to e4m3: Backend::fast_tolerance), with one scale a row
// (per-channel checkpoints: the codes as they are) and with a scale a block (rounded again to the row's
// largest).
TEST(OpHarness, MatmulFp8) {
  Rng rng(29);
  for (const bool row_scales : {true, false}) {
    for (const auto& [k, n, m] : {std::tuple<int64_t, int64_t, int64_t>{256, 64, 9},
                                  {2048, 48, 64},
                                  {288, 80, 33},
                                  {512, 1040, 300}}) {
      Host w = make_weights(DType::f8_e4m3, k, n, 0, rng);
      if (row_scales) {
        for (int64_t j = 0; j < n; ++j) {
          const float d = rng.uniform(0.001f, 0.01f);
          for (int64_t b = 0; b < k / 32; ++b) {
            uint8_t* block = w.t.row(j) + b * 36;
            std::memcpy(block, &d, 4);
            for (int e = 0; e < 32; ++e) {
              const int q = rng.integer(0, 253);
              block[4 + e] = static_cast<uint8_t>(q >= 0x7F ? q + 1 : q);  // no NaN codes (0x7F, 0xFF)
            }
          }
        }
      }
      for (const Layout layout : {Layout::contiguous, Layout::strided}) {
        const Host x = make_f32(layout, k, m, 1, &rng);
        const Host dst = make_f32(layout, n, m, 1, nullptr);
        expect_matmul_matches(
            fmt::format("matmul f8_e4m3 ({}) w [{}, {}] x [{}, {}] {}",
                        row_scales ? "row scales" : "block scales", k, n, k, m, layout_name(layout)),
            w, x, dst);
      }
    }
  }
}

// Batch invariance of the quantized products: a token's row of dst is the same bits whether it is multiplied
// alone (decode: straight from the packed blocks), with one other token, or in a batch (unpacked tiles).
TEST(OpHarness, MatmulFastIsBatchInvariant) {
  Rng rng(13);
  for (DType type : kWeightTypes) {
    if (activation_type(type) == DType::f32) continue;
    const DTypeInfo& info = dtype_info(type);
    for (const int64_t k :
         info.block_size == 32 ? std::vector<int64_t>{288, 64} : std::vector<int64_t>{768}) {
      const int64_t n = 9, m = 7;
      const Host w = make_weights(type, k, n, 0, rng);
      const Host x = dense(k, m, 1, &rng);
      for (const NamedBackend& nb : backends(kFast)) {
        if (!nb.host_visible) continue;
        for (const bool prepared : {false, true}) {  // the file's blocks, then the backend's layout
          ops::Weight wt(w.t);
          Result<std::unique_ptr<WeightHandle>> h =
              nb.backend->prepare_weight(w.t, "w", WeightRole::weight_role_matmul);
          ASSERT_TRUE(h.ok());
          if (prepared) wt = (*h)->weight;
          const Host batch = dense(n, m, 1, nullptr);
          ASSERT_TRUE(nb.backend->run(Matmul{wt, x.t, batch.t}).ok());
          for (const int64_t rows : {int64_t{1}, int64_t{2}, int64_t{5}}) {
            for (int64_t i = 0; i + rows <= m; i += rows) {
              const Tensor xi = make_tensor(DType::f32, const_cast<uint8_t*>(x.t.row(i)), k, rows);
              const Host alone = dense(n, rows, 1, nullptr);
              ASSERT_TRUE(nb.backend->run(Matmul{wt, xi, alone.t}).ok());
              EXPECT_EQ(
                  std::memcmp(alone.t.data, batch.t.row(i), static_cast<size_t>(n * rows) * sizeof(float)), 0)
                  << nb.name << (prepared ? " (prepared weight) " : " ") << info.name << " k " << k
                  << ": rows " << i << ".." << i + rows - 1
                  << " alone differ from the same rows in a batch of " << m;
            }
          }
        }
      }
    }
  }
}

// The AMX level's packed products (AMX tiles from 16 consecutive x rows on, a last tile of fewer than 8 rows
// and anything shorter on the vpdpbusd kernel) are the avx512vnni level's bits: the whole batch (45 rows: two
// full tiles and one of 13), and parts of it alone (1, 8, 13 rows: the vpdpbusd kernel; 21: a tile and 5
// rows on the vpdpbusd kernel); k of several chunks, one of them partial.
TEST(OpHarness, MatmulTilesAreTheVnniBits) {
  const NamedBackend* vnni = nullptr;
  const NamedBackend* amx = nullptr;
  for (const NamedBackend& nb : backends(kFast)) {
    if (nb.name == "cpu/avx512vnni fast") vnni = &nb;
    if (nb.name == "cpu/amx fast") amx = &nb;
  }
  if (vnni == nullptr || amx == nullptr) GTEST_SKIP() << "this machine runs no AMX tiles";
  Rng rng(19);
  for (DType type : kWeightTypes) {
    if (activation_type(type) == DType::f32) continue;
    const DTypeInfo& info = dtype_info(type);
    const int64_t k = info.block_size == 32 ? 608 : 768, n = 37, m = 45;
    const Host w = make_weights(type, k, n, 0, rng);
    const Host x = make_f32(Layout::strided, k, m, 1, &rng);
    std::vector<float> bits[2];
    for (int level = 0; level < 2; ++level) {
      const NamedBackend& nb = level == 0 ? *vnni : *amx;
      Result<std::unique_ptr<WeightHandle>> h =
          nb.backend->prepare_weight(w.t, "w", WeightRole::weight_role_matmul);
      ASSERT_TRUE(h.ok());
      if ((*h)->prepared == nullptr) {  // a type the packed layout does not take: the same kernels at both
        EXPECT_EQ(level, 0) << info.name << ": packed at avx512vnni, not at amx";
        break;
      }
      const ops::Weight wt = (*h)->weight;
      const Host batch = dense(n, m, 1, nullptr);
      ASSERT_TRUE(nb.backend->run(Matmul{wt, x.t, batch.t}).ok());
      bits[level] = gather(batch.t);
      for (const int64_t rows : {int64_t{1}, int64_t{8}, int64_t{13}, int64_t{21}}) {
        for (int64_t i = 0; i + rows <= m; i += rows) {
          Tensor xi = x.t;
          xi.data = x.t.row(i);
          xi.ne[1] = rows;
          const Host alone = dense(n, rows, 1, nullptr);
          ASSERT_TRUE(nb.backend->run(Matmul{wt, xi, alone.t}).ok());
          EXPECT_EQ(std::memcmp(alone.t.data, batch.t.row(i), static_cast<size_t>(n * rows) * sizeof(float)),
                    0)
              << nb.name << " " << info.name << ": rows " << i << ".." << i + rows - 1
              << " alone differ from the same rows in a batch of " << m;
        }
      }
    }
    if (bits[1].empty()) continue;
    EXPECT_EQ(std::memcmp(bits[0].data(), bits[1].data(), bits[0].size() * sizeof(float)), 0)
        << info.name << ": the AMX tiles' products differ from the avx512vnni level's";
  }
}

// The float products (f32 / f16 / bf16 weights, and f8_e4m3's, whose packed form sums each 32-element block
// apart; the fast precision does not apply to them on the CPU) on batches large
// enough for every tile shape of the packed kernel (1..8 x rows, 1..6 groups of 16 rows a call; 21 groups
// over 3 threads: runs of 7), held to the reference; a token's row of dst the same bits alone, with one other
// token or in any part of the batch (x rows strided); and on the packed layout the same bits at every level
// that packs, since each product is one FMA chain over k in order.
TEST(OpHarness, MatmulFloatIsBatchInvariant) {
  Rng rng(16);
  for (DType type : {DType::f32, DType::f16, DType::bf16, DType::f8_e4m3}) {
    const std::vector<int64_t> ks =
        type == DType::f8_e4m3 ? std::vector<int64_t>{288, 64, 32} : std::vector<int64_t>{257, 64, 7};
    for (const int64_t k : ks) {
      const int64_t n = 329, m = 21;  // 20 groups of 16 rows and one of 9
      const Host w = make_weights(type, k, n, 0, rng);
      const Host x = make_f32(Layout::strided, k, m, 1, &rng);
      Host want = dense(n, m, 1, nullptr);
      ref::run(Matmul{w.t, x.t, want.t});
      const std::vector<float> ref_values = gather(want.t);
      std::vector<float> packed_bits;  // the batch on the packed layout at the first level that packs
      for (const NamedBackend& nb : backends()) {
        if (!nb.host_visible) continue;
        Result<std::unique_ptr<WeightHandle>> h =
            nb.backend->prepare_weight(w.t, "w", WeightRole::weight_role_matmul);
        ASSERT_TRUE(h.ok());
        for (const bool prepared : {false, true}) {
          if (prepared && (*h)->prepared == nullptr) continue;  // this level keeps the file's layout
          const ops::Weight wt = prepared ? (*h)->weight : ops::Weight(w.t);
          const std::string label =
              fmt::format("{}{} {} k {}", nb.name, prepared ? " (prepared weight)" : "", dtype_name(type), k);
          const Host batch = dense(n, m, 1, nullptr);
          ASSERT_TRUE(nb.backend->run(Matmul{wt, x.t, batch.t}).ok());
          const std::vector<float> got = gather(batch.t);
          EXPECT_LE(compare(got, ref_values, kMatmul.ref_rms_floor).rel_l2, kMatmul.limit) << label;
          if (prepared && packed_bits.empty()) {
            packed_bits = got;
          } else if (prepared) {
            EXPECT_EQ(std::memcmp(got.data(), packed_bits.data(), got.size() * sizeof(float)), 0)
                << label << ": the packed products differ from the first packing level's";
          }
          for (const int64_t rows : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{8}, int64_t{13}}) {
            for (int64_t i = 0; i + rows <= m; i += rows) {
              Tensor xi = x.t;  // rows i .. i + rows - 1 of x, strided as x
              xi.data = x.t.row(i);
              xi.ne[1] = rows;
              const Host alone = dense(n, rows, 1, nullptr);
              ASSERT_TRUE(nb.backend->run(Matmul{wt, xi, alone.t}).ok());
              EXPECT_EQ(
                  std::memcmp(alone.t.data, batch.t.row(i), static_cast<size_t>(n * rows) * sizeof(float)), 0)
                  << label << ": rows " << i << ".." << i + rows - 1
                  << " alone differ from the same rows in a batch of " << m;
            }
          }
        }
      }
    }
  }
}

TEST(OpHarness, GetRows) {
  Rng rng(2);
  for (DType type : kWeightTypes) {
    const DTypeInfo& info = dtype_info(type);
    for (const auto& [n_rows, n_ids] : {std::pair{1, 1}, std::pair{7, 5}, std::pair{33, 17}}) {
      const int64_t k = info.block_size == 1 ? 7 * n_ids : info.block_size * (n_ids % 3 + 1);
      const Layout layout = kLayouts[n_ids % 3];
      const Host table =
          make_weights(type, k, n_rows, layout == Layout::contiguous ? 0 : info.type_size, rng);
      std::vector<int32_t> ids(n_ids);
      for (int32_t& id : ids) id = rng.integer(0, n_rows - 1);  // repeats included
      ids.back() = n_rows - 1;
      const Host dst = make_f32(layout, k, n_ids, 1, nullptr);
      const std::string what = fmt::format("get_rows {} table [{}, {}] {} ids {}", info.name, k, n_rows,
                                           n_ids, layout_name(layout));
      expect_matches_ref(what, dst, kRowWise, [&](const Tensor& d) {
        return Op(GetRows{table.t, iv(ids), d});
      });
    }
  }
}

// The shapes of the row-wise ops: [n, r1, r2].
struct RowShape {
  int64_t n, r1, r2;
};
// 4096 and 8200: rows a block of 1024 threads holds in registers, and one past them
// (backends/cuda/norm_rope/norm.cu).
constexpr RowShape kRowShapes[] = {{1, 1, 1},  {7, 3, 1},    {64, 5, 2},  {257, 3, 1},
                                   {33, 1, 3}, {4096, 2, 1}, {8200, 1, 1}};

TEST(OpHarness, RmsNormAndLayerNorm) {
  Rng rng(3);
  int i = 0;
  for (const RowShape& s : kRowShapes) {
    for (Layout layout : kLayouts) {
      const Host x = make_f32(layout, s.n, s.r1, s.r2, &rng, -2.0f, 2.0f);
      const Host w = dense(s.n, 1, 1, &rng, 0.5f, 1.5f);
      const Host b = dense(s.n, 1, 1, &rng);
      const Host dst = make_f32(layout, s.n, s.r1, s.r2, nullptr);
      const int variant = i++ % 3;  // no weight; weight; weight + 1
      const std::string what =
          fmt::format("[{}, {}, {}] {} variant {}", s.n, s.r1, s.r2, layout_name(layout), variant);
      expect_matches_ref("rms_norm " + what, dst, kRowWise, [&](const Tensor& d) {
        return Op(RmsNorm{x.t, variant ? w.t : Tensor{}, 1e-6f, variant == 2, d});
      });
      expect_matches_ref("layer_norm " + what, dst, kRowWise, [&](const Tensor& d) {
        return Op(LayerNorm{x.t, variant ? w.t : Tensor{}, variant == 2 ? b.t : Tensor{}, 1e-5f, d});
      });
    }
  }
}

TEST(OpHarness, Rope) {
  Rng rng(4);
  // Scalings, and per-pair frequency factors (Llama-3.1's rope_freqs, Phi-3's long/short factors).
  const std::pair<RopeScaling, bool> scalings[] = {{RopeScaling::rope_scaling_none, false},
                                                   {RopeScaling::rope_scaling_linear, false},
                                                   {RopeScaling::rope_scaling_yarn, false},
                                                   {RopeScaling::rope_scaling_none, true}};
  int i = 0;
  for (RopeLayout rl : {RopeLayout::rope_layout_normal, RopeLayout::rope_layout_neox}) {
    for (const auto& [sc, with_factors] : scalings) {
      for (const auto& [head_dim, n_rot] : {std::pair{64, 32}, std::pair{64, 64}, std::pair{40, 24}}) {
        RopeParams p;
        p.n_rot = n_rot;
        p.layout = rl;
        p.scaling = sc;
        p.freq_base = with_factors ? 500000.0f : 10000.0f;
        p.factor = 4.0f;
        p.original_context = 4096;
        const Host factors = make_f32(Layout::contiguous, n_rot / 2, 1, 1, &rng, 1.0f, 8.0f);
        const Weight freq_factors = with_factors ? Weight(factors.t) : Weight{};
        const Layout layout = kLayouts[i % 3];
        const bool in_place = i++ % 2 == 1;
        const int64_t n_heads = 3, n_tokens = 5;
        const Host x = make_f32(layout, head_dim, n_heads, n_tokens, &rng);
        const std::vector<int32_t> pos = {0, 1, rng.integer(2, 4000), rng.integer(4000, 40000), 131071};
        const Host dst = in_place ? clone(x) : make_f32(layout, head_dim, n_heads, n_tokens, nullptr);
        expect_matches_ref(
            fmt::format("rope layout {} scaling {}{} head_dim {} n_rot {} {}{}", static_cast<int>(rl),
                        static_cast<int>(sc), with_factors ? " freq_factors" : "", head_dim, n_rot,
                        layout_name(layout), in_place ? " in place" : ""),
            dst, kRowWise, [&](const Tensor& d) {
              return Op(Rope{in_place ? d : x.t, iv(pos), p, freq_factors, d});
            });
      }
    }
  }
}

TEST(OpHarness, SoftmaxGatedActBinaryScale) {
  Rng rng(5);
  int i = 0;
  for (const RowShape& s : kRowShapes) {
    for (Layout layout : kLayouts) {
      const Host a = make_f32(layout, s.n, s.r1, s.r2, &rng, -6.0f, 6.0f);
      const Host b = make_f32(layout, s.n, s.r1, s.r2, &rng);
      const Host b_row = make_f32(layout, s.n, 1, 1, &rng);                      // broadcast over rows
      const Host gate_row = make_f32(layout, 1, s.r1, s.r2, &rng, -6.0f, 6.0f);  // one gate per row
      const Host dst = make_f32(layout, s.n, s.r1, s.r2, nullptr);
      const float scale = i % 3 == 0 ? 1.0f : i % 3 == 1 ? 0.125f : 1.7f;
      const GluKind glu =
          std::array{GluKind::glu_kind_silu, GluKind::glu_kind_gelu_tanh, GluKind::glu_kind_sigmoid}[i % 3];
      const auto kind = i % 2 ? BinaryKind::binary_kind_mul : BinaryKind::binary_kind_add;
      const bool broadcast = i++ % 4 < 2;
      const std::string what =
          fmt::format("[{}, {}, {}] {} scale {} glu {} binary {}{}", s.n, s.r1, s.r2, layout_name(layout),
                      scale, static_cast<int>(glu), static_cast<int>(kind), broadcast ? " broadcast" : "");
      expect_matches_ref("softmax " + what, dst, kRowWise, [&](const Tensor& d) {
        return Op(Softmax{a.t, scale, d});
      });
      expect_matches_ref("gated_act " + what, dst, kRowWise, [&](const Tensor& d) {
        return Op(GatedAct{a.t, b.t, glu, d});
      });
      expect_matches_ref("gated_act per-row gate " + what, dst, kRowWise, [&](const Tensor& d) {
        return Op(GatedAct{gate_row.t, b.t, glu, d});
      });
      const Tensor& b_used = broadcast ? b_row.t : b.t;
      expect_matches_ref("binary " + what, dst, kRowWise, [&](const Tensor& d) {
        return Op(Binary{a.t, b_used, kind, d});
      });
      expect_matches_ref("scale " + what, dst, kRowWise, [&](const Tensor& d) {
        return Op(Scale{a.t, -scale, d});
      });
    }
  }
}

TEST(OpHarness, Argmax) {
  Rng rng(6);
  // Besides the row shapes, vocabulary-sized rows: a backend may split a row among blocks (ties, NaN and +inf
  // then fall in different parts of it).
  std::vector<RowShape> shapes(std::begin(kRowShapes), std::end(kRowShapes));
  shapes.push_back({49157, 7, 1});
  shapes.push_back({128256, 1, 2});
  for (const RowShape& s : shapes) {
    for (Layout layout : kLayouts) {
      const Host x = make_f32(layout, s.n, s.r1, s.r2, &rng);
      std::vector<int32_t> first(x.t.n_rows(), -1);  // rows with a tie on the maximum: the first index wins
      for (int64_t r = 1; r < x.t.n_rows(); r += 2) {
        auto* row = reinterpret_cast<float*>(x.t.flat_row(r));
        const int32_t a = rng.integer(0, s.n - 1), c = rng.integer(0, s.n - 1);
        row[a] = row[c] = 2.0f;
        first[r] = std::min(a, c);
      }
      // Rows with no token to take: -1. A NaN or +inf anywhere (after the maximum, too), or only -inf.
      constexpr float kInf = std::numeric_limits<float>::infinity();
      const int64_t n_rows = x.t.n_rows();
      if (n_rows >= 6) {
        reinterpret_cast<float*>(x.t.flat_row(2))[s.n - 1] = std::numeric_limits<float>::quiet_NaN();
        reinterpret_cast<float*>(x.t.flat_row(4))[rng.integer(0, s.n - 1)] = kInf;
        auto* row = reinterpret_cast<float*>(x.t.flat_row(n_rows - 2));
        for (int64_t i = 0; i < s.n; ++i) row[i] = -kInf;
      }
      std::vector<int32_t> want(x.t.n_rows(), -2);
      ref::argmax(Argmax{x.t, iv(want)});
      for (size_t r = 1; r < want.size(); r += 2) {
        if (static_cast<int64_t>(r) != n_rows - 2 || n_rows < 6) {
          ASSERT_EQ(want[r], first[r]);
        }
      }
      if (n_rows >= 6) {
        ASSERT_EQ(want[2], -1);
        ASSERT_EQ(want[4], -1);
        ASSERT_EQ(want[static_cast<size_t>(n_rows - 2)], -1);
      }
      for (const NamedBackend& nb : backends()) {
        std::vector<int32_t> got(want.size(), -2);
        const std::string what = fmt::format("argmax [{}, {}, {}] {}", s.n, s.r1, s.r2, layout_name(layout));
        if (run_on(nb, Argmax{x.t, iv(got)}, what)) {
          EXPECT_EQ(got, want) << nb.name << " " << what;
        }
      }
    }
  }
}

// Sample: every backend's words (token, logprob, top pairs) against the reference, row by row, over every
// filter and adjustment, on continuous logits and on logits with many exact ties (rounded to 1/8); two rows
// of three with a mask of allowed tokens (sparse, dense, one token, none), the mask rows in another order
// than the rows.
TEST(OpHarness, Sample) {
  Rng rng(61);
  std::vector<SampleRow> kinds;
  for (const auto& [t, k, p, m] : {std::tuple{0.0f, 0, 1.0f, 0.0f},
                                   {1.0f, 0, 1.0f, 0.0f},
                                   {0.7f, 40, 1.0f, 0.0f},
                                   {1.0f, 1, 1.0f, 0.0f},
                                   {0.8f, 0, 0.95f, 0.0f},
                                   {1.3f, 0, 0.5f, 0.0f},
                                   {1.0f, 0, 1e-6f, 0.0f},
                                   {1.0f, 0, 1.0f, 0.05f},
                                   {0.9f, 50, 0.9f, 0.02f},
                                   {2.0f, 100000000, 0.99f, 0.0f}}) {
    SampleRow r;
    r.temperature = t, r.top_k = k, r.top_p = p, r.min_p = m;
    kinds.push_back(r);
  }
  for (const auto& [n, rows] : {std::pair{7, 5}, {300, 33}, {49152, 12}, {151936, 3}}) {
    for (const bool ties : {false, true}) {
      for (const Layout layout : {kLayouts[0], kLayouts[1]}) {
        Host x = make_f32(layout, n, rows, 1, &rng, -8.0f, 8.0f);
        std::vector<int32_t> row_words;
        std::vector<SampleAdjust> adjust;
        const int64_t n_words = (n + 31) / 32;
        std::vector<int32_t> masks;  // [n_words, n_masks]
        int32_t n_top_max = 0;
        for (int64_t r = 0; r < rows; ++r) {
          auto* xr = reinterpret_cast<float*>(x.t.flat_row(r));
          if (ties) {
            for (int64_t i = 0; i < n; ++i) xr[i] = std::round(xr[i] * 8.0f) / 8.0f;
          }
          if (r % 4 == 3) xr[rng.integer(0, n - 1)] = -std::numeric_limits<float>::infinity();
          SampleRow p = kinds[static_cast<size_t>(r) % kinds.size()];
          p.seed_lo = static_cast<uint32_t>(rng.integer(0, 1 << 30));
          p.counter = static_cast<uint32_t>(r);
          p.n_top = static_cast<int32_t>(r % 3 == 0 ? std::min<int64_t>(r % 21, n) : 0);
          p.logprobs = r % 2;
          p.repeat_penalty = r % 5 == 1 ? 1.3f : 1.0f;
          p.frequency_penalty = r % 5 == 1 ? 0.5f : 0.0f;
          p.presence_penalty = r % 5 == 1 ? 0.25f : 0.0f;
          p.adjust_begin = static_cast<int32_t>(adjust.size());
          if (r % 5 == 1 || r % 5 == 2) {  // penalties and a bias on some tokens; a ban
            for (int32_t id = rng.integer(0, 2); id < n; id += rng.integer(1, std::max<int32_t>(2, n / 16))) {
              adjust.push_back(
                  {id, r % 5 == 2 ? rng.uniform(-2.0f, 2.0f) : 0.0f, rng.integer(0, 3), id % 7 == 3});
            }
          }
          p.adjust_count = static_cast<int32_t>(adjust.size()) - p.adjust_begin;
          if (r % 3 != 0) {
            const int64_t kind = (r / 3) % 4, one = rng.integer(0, static_cast<int32_t>(n - 1));
            std::vector<int32_t> m(static_cast<size_t>(n_words), 0);
            for (int64_t id = 0; id < n; ++id) {
              const bool allowed = kind == 0   ? rng.integer(0, 9) == 0
                                   : kind == 1 ? rng.integer(0, 9) != 0
                                               : kind == 2 && id == one;
              if (allowed) m[static_cast<size_t>(id / 32)] |= static_cast<int32_t>(1u << (id % 32));
            }
            masks.insert(masks.begin(), m.begin(), m.end());  // the newest mask row first
            p.mask_row = static_cast<int32_t>(r);             // renumbered below
          }
          n_top_max = std::max(n_top_max, p.n_top);
          const auto* words = reinterpret_cast<const int32_t*>(&p);
          row_words.insert(row_words.end(), words, words + 16);
        }
        const auto n_masks = static_cast<int32_t>(static_cast<int64_t>(masks.size()) / n_words);
        constexpr size_t kMaskWord = offsetof(SampleRow, mask_row) / 4;
        for (int32_t m = 0, r = 0; r < rows; ++r) {  // mask rows in reverse: row r's is n_masks - 1 - m
          int32_t& mask_row = row_words[static_cast<size_t>(16 * r) + kMaskWord];
          if (mask_row >= 0) mask_row = n_masks - 1 - m++;
        }
        Tensor mask_t = iv(masks);
        mask_t.ne = {n_words, n_masks, 1, 1};
        mask_t.nb = {4, 4 * n_words, 4 * n_words * n_masks, 4 * n_words * n_masks};
        std::vector<int32_t> adjust_words(4 * adjust.size());
        std::memcpy(adjust_words.data(), adjust.data(), adjust_words.size() * sizeof(int32_t));
        Tensor rows_t = iv(row_words);
        rows_t.ne = {16, rows, 1, 1};
        rows_t.nb = {4, 64, 64 * rows, 64 * rows};
        Tensor adjust_t = iv(adjust_words);
        adjust_t.ne = {4, static_cast<int64_t>(adjust.size()), 1, 1};
        adjust_t.nb = {4, 16, 16 * adjust_t.ne[1], 16 * adjust_t.ne[1]};
        const int64_t width = 2 + 2 * n_top_max, n_rows = rows;  // a structured binding: no lambda capture
        const auto out_t = [&](std::vector<int32_t>& v) {
          Tensor t = iv(v);
          t.ne = {width, n_rows, 1, 1};
          t.nb = {4, 4 * width, 4 * width * n_rows, 4 * width * n_rows};
          return t;
        };
        std::vector<int32_t> want(static_cast<size_t>(width * rows), 0);
        ref::sample(Sample{x.t, rows_t, adjust_t, out_t(want), mask_t});
        for (const NamedBackend& nb : backends()) {
          std::vector<int32_t> got(want.size(), 0);
          const std::string what =
              fmt::format("sample [{}, {}] ties {} {}", n, rows, ties, layout_name(layout));
          if (!run_on(nb, Sample{x.t, rows_t, adjust_t, out_t(got), mask_t}, what)) continue;
          for (int64_t r = 0; r < rows; ++r) {
            const int32_t* g = got.data() + width * r;
            const int32_t* w = want.data() + width * r;
            const auto p = std::bit_cast<SampleRow>(
                *reinterpret_cast<const std::array<int32_t, 16>*>(&row_words[16 * r]));
            ASSERT_EQ(g[0], w[0]) << nb.name << " " << what << " row " << r;
            const auto f = [](int32_t v) { return std::bit_cast<float>(v); };
            if (p.logprobs != 0 || p.n_top > 0) {
              EXPECT_NEAR(f(g[1]), f(w[1]), 1e-4f) << nb.name << " " << what << " row " << r;
            }
            for (int32_t j = 0; j < p.n_top; ++j) {
              EXPECT_EQ(g[2 + 2 * j], w[2 + 2 * j]) << nb.name << " " << what << " row " << r << " top " << j;
              EXPECT_NEAR(f(g[3 + 2 * j]), f(w[3 + 2 * j]), 1e-4f) << nb.name << " " << what << " row " << r;
            }
          }
        }
      }
    }
  }
}

TEST(OpHarness, KvWrite) {
  Rng rng(7);
  int i = 0;
  for (DType type : {DType::f32, DType::f16, DType::q8_0, DType::q8_64}) {
    for (int64_t block_size : {1, 4, 16}) {
      for (const auto& [head_dim, n_kv, n_tokens] :
           {std::tuple{16, 1, 1}, std::tuple{7, 3, 5}, std::tuple{64, 2, 20}, std::tuple{32, 3, 4},
            std::tuple{128, 2, 3}, std::tuple{192, 1, 2}}) {
        if (head_dim % dtype_info(type).block_size != 0) continue;  // whole blocks a row
        const int64_t n_blocks = (n_tokens + 2 * block_size - 1) / block_size + 1;
        const Layout layout = kLayouts[i++ % 3];
        const Host k = make_f32(layout, head_dim, n_kv, n_tokens, &rng);
        const Host v = make_f32(layout, head_dim, n_kv, n_tokens, &rng);
        std::vector<int32_t> slots = rng.permutation(n_blocks * block_size);  // distinct, scattered
        slots.resize(n_tokens);
        const Host k_pool = make_pool(type, head_dim, n_kv, block_size, n_blocks, rng);
        const Host v_pool = make_pool(type, head_dim, n_kv, block_size, n_blocks, rng);
        const std::string what =
            fmt::format("kv_write {} pool [{}, {}, {}, {}] {} tokens {}", dtype_name(type), head_dim, n_kv,
                        block_size, n_blocks, n_tokens, layout_name(layout));
        Host k_want = clone(k_pool), v_want = clone(v_pool);
        const KvWrite ref_op{k.t, v.t, k_want.t, v_want.t, iv(slots)};
        ASSERT_TRUE(check(ref_op).ok()) << what;
        ref::kv_write(ref_op);
        // The round trip: exact for f32, within half an f16 ulp of the input for f16, within half a step (its
        // block's largest magnitude / 127, the f16 scale's rounding aside) for q8_0 and q8_64.
        for (int64_t t = 0; t < n_tokens; ++t) {
          for (int64_t h = 0; h < n_kv; ++h) {
            std::vector<float> row(head_dim);
            ref::row_to_f32(k_want.t, k_want.t.row(h, slots[t] % block_size, slots[t] / block_size),
                            row.data());
            const float* in = k.t.row_as<float>(h, t);
            const int64_t blk = dtype_info(type).block_size;
            for (int64_t e = 0; e < head_dim; ++e) {
              float amax = 0.0f;
              for (int64_t j = e / blk * blk; j < std::min<int64_t>(head_dim, e / blk * blk + blk); ++j)
                amax = std::max(amax, std::fabs(in[j]));
              const float bound = type == DType::f32   ? 0.0f
                                  : type == DType::f16 ? std::fabs(in[e]) * 0x1p-11f + 0x1p-25f
                                                       : amax / 127.0f * 0.502f + amax * 0x1p-10f;
              ASSERT_LE(std::fabs(row[e] - in[e]), bound) << what;
            }
          }
        }
        for (const NamedBackend& nb : backends()) {
          Host k_got = clone(k_pool), v_got = clone(v_pool);
          if (!run_on(nb, KvWrite{k.t, v.t, k_got.t, v_got.t, iv(slots)}, what)) continue;
          EXPECT_TRUE(k_got.mem == k_want.mem) << nb.name << " " << what << ": k_pool differs";
          EXPECT_TRUE(v_got.mem == v_want.mem) << nb.name << " " << what << ": v_pool differs";
        }
      }
    }
  }
}

TEST(OpHarness, Attention) {
  Rng rng(8);
  struct Variant {
    float softcap;
    int32_t window;
  };
  const Variant variants[] = {{0.0f, 0}, {5.0f, 0}, {0.0f, 5}, {3.0f, 3}};
  const int64_t seq_len[] = {1, 6, 23, 40};  // K/V positions held per sequence
  int i = 0;
  for (DType type : {DType::f32, DType::f16, DType::q8_0, DType::q8_64}) {
    for (const auto& [n_heads, n_kv] :
         {std::pair{4, 4}, std::pair{6, 2}, std::pair{5, 1}}) {  // group 1, 3, MQA
      for (int64_t block_size : {1, 4, 16}) {
        for (const Variant& var : variants) {
          // q8_0 and q8_64 pools hold whole 32- and 64-value blocks a row.
          const int64_t head_dim = type == DType::q8_0    ? std::array<int64_t, 3>{32, 64, 96}[i % 3]
                                   : type == DType::q8_64 ? std::array<int64_t, 3>{64, 128, 192}[i % 3]
                                                          : std::array<int64_t, 3>{16, 7, 64}[i % 3];
          const Layout layout = kLayouts[i++ % 3];
          // Block tables: each sequence takes ceil(len / block_size) blocks of a shuffled pool with spares.
          int64_t n_blocks = 2;
          for (int64_t len : seq_len) n_blocks += (len + block_size - 1) / block_size;
          const std::vector<int32_t> ids = rng.permutation(n_blocks);
          std::vector<std::span<const int32_t>> tables;
          size_t next = 0;
          for (int64_t len : seq_len) {
            const auto count = static_cast<size_t>((len + block_size - 1) / block_size);
            tables.emplace_back(ids.data() + next, count);
            next += count;
          }
          // Query tokens: a decode token, a prefill chunk, positions before the end (causality), in mixed
          // order.
          std::vector<int32_t> seq = {2, 1, 0, 3, 1, 1, 3}, pos = {22, 3, 0, 39, 5, 4, 17};
          const Csr bt = csr(tables);
          const auto n_tokens = static_cast<int64_t>(seq.size());
          const Host k_pool = make_pool(type, head_dim, n_kv, block_size, n_blocks, rng);
          const Host v_pool = make_pool(type, head_dim, n_kv, block_size, n_blocks, rng);
          const Host q = make_f32(layout, head_dim, n_heads, n_tokens, &rng, -2.0f, 2.0f);
          const Host dst = make_f32(layout, head_dim, n_heads, n_tokens, nullptr);
          const float scale = var.softcap > 0.0f ? 1.0f : 1.0f / std::sqrt(static_cast<float>(head_dim));
          const std::string what = fmt::format(
              "attention {} heads {}/{} head_dim {} block_size {} softcap {} window {} {}", dtype_name(type),
              n_heads, n_kv, head_dim, block_size, var.softcap, var.window, layout_name(layout));
          for (bool qx : {false, true}) {
            expect_matches_ref(
                what + (qx ? " fast" : ""), dst, kAttention,
                [&](const Tensor& d) {
                  return Op(Attention{q.t, k_pool.t, v_pool.t, iv(pos), iv(seq), iv(bt.indptr),
                                      iv(bt.indices), scale, var.softcap, var.window, d});
                },
                precision_of(qx));
          }
        }
      }
    }
  }
}

// Prefill-sized batches (a backend may tile the queries of one sequence to share K/V reads): two prompts
// prefilled from position 0, a chunk continuing a third, a decode token between them; odd head sizes, GQA.
TEST(OpHarness, AttentionPrefill) {
  Rng rng(16);
  struct Variant {
    float softcap;
    int32_t window;
  };
  const Variant variants[] = {{0.0f, 0}, {4.0f, 0}, {0.0f, 9}};
  int i = 0;
  for (DType type : {DType::f32, DType::f16, DType::q8_0, DType::q8_64}) {
    for (const auto& [n_heads, n_kv, head_dim] :
         {std::tuple{8, 2, 64}, std::tuple{4, 4, 80}, std::tuple{12, 1, 128}, std::tuple{6, 2, 256}}) {
      const Variant& var = variants[i % 3];
      const int64_t block_size = i++ % 2 == 0 ? 16 : 4;
      if (head_dim % dtype_info(type).block_size != 0) continue;  // pools hold whole blocks a row
      // Sequences of 40, 23 and 50 positions; the batch: all of 0, 7 of 2's last, a decode token of 1, the
      // rest.
      const int64_t lens[] = {40, 23, 50};
      std::vector<int32_t> seq, pos;
      for (int32_t p = 0; p < 40; ++p) seq.push_back(0), pos.push_back(p);
      for (int32_t p = 43; p < 50; ++p) seq.push_back(2), pos.push_back(p);
      seq.push_back(1), pos.push_back(22);
      for (int32_t p = 0; p < 22; ++p) seq.push_back(1), pos.push_back(p);
      int64_t n_blocks = 1;
      for (int64_t len : lens) n_blocks += (len + block_size - 1) / block_size;
      const std::vector<int32_t> ids = rng.permutation(n_blocks);
      std::vector<std::span<const int32_t>> tables;
      size_t next = 0;
      for (int64_t len : lens) {
        const auto count = static_cast<size_t>((len + block_size - 1) / block_size);
        tables.emplace_back(ids.data() + next, count);
        next += count;
      }
      const Csr bt = csr(tables);
      const auto n_tokens = static_cast<int64_t>(seq.size());
      const Host k_pool = make_pool(type, head_dim, n_kv, block_size, n_blocks, rng);
      const Host v_pool = make_pool(type, head_dim, n_kv, block_size, n_blocks, rng);
      const Host q = make_f32(Layout::contiguous, head_dim, n_heads, n_tokens, &rng, -2.0f, 2.0f);
      const Host dst = make_f32(Layout::strided, head_dim, n_heads, n_tokens, nullptr);
      const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
      const std::string what =
          fmt::format("attention prefill {} heads {}/{} head_dim {} block_size {} softcap {} window {}",
                      dtype_name(type), n_heads, n_kv, head_dim, block_size, var.softcap, var.window);
      for (bool qx : {false, true}) {
        expect_matches_ref(
            what + (qx ? " fast" : ""), dst, kAttention,
            [&](const Tensor& d) {
              return Op(Attention{q.t, k_pool.t, v_pool.t, iv(pos), iv(seq), iv(bt.indptr), iv(bt.indices),
                                  scale, var.softcap, var.window, d});
            },
            precision_of(qx));
      }
    }
  }
}

// Long prefill chunks at precision_fast (a GPU may run them on f16 tensor cores, within its fast
// tolerance of the exact result) and exactly: a 200-token prompt, a 130-token chunk continuing a 260-token
// sequence, and a decode token, so that tiles of query rows span several 64-position chunks, sequences share
// a tile, and windows start mid-chunk; f32, f16, q8_0 and q8_64 pools, GQA, MQA and plain heads, head dims
// 64, 96, 128 and 192. 64 query heads over 32 KV heads give CUDA's tensor-core kernel 352 blocks, more than
// two a multiprocessor of an H100 or H200 (its Hopper form then has the registers of three blocks an SM).
TEST(OpHarness, AttentionPrefillLong) {
  Rng rng(33);
  struct Case {
    DType type;
    int64_t n_heads, n_kv, head_dim, block_size;
    float softcap;
    int32_t window;
  };
  const Case cases[] = {{DType::f16, 8, 2, 64, 16, 0.0f, 0},    {DType::f32, 4, 4, 128, 16, 0.0f, 0},
                        {DType::f16, 8, 1, 128, 8, 4.0f, 0},    {DType::f16, 6, 2, 96, 16, 0.0f, 100},
                        {DType::f32, 4, 2, 128, 32, 0.0f, 70},  {DType::q8_0, 8, 1, 128, 8, 4.0f, 0},
                        {DType::q8_0, 6, 2, 96, 16, 0.0f, 100}, {DType::q8_64, 8, 2, 128, 16, 0.0f, 0},
                        {DType::q8_64, 6, 2, 192, 8, 4.0f, 70}, {DType::f16, 64, 32, 128, 16, 0.0f, 0},
                        {DType::f32, 64, 32, 128, 8, 4.0f, 0}};
  for (const Case& c : cases) {
    for (bool qx : {true, false}) {
      const int64_t lens[] = {200, 260, 71};
      std::vector<int32_t> seq, pos;
      for (int32_t p = 0; p < 200; ++p) seq.push_back(0), pos.push_back(p);
      seq.push_back(2), pos.push_back(70);
      for (int32_t p = 130; p < 260; ++p) seq.push_back(1), pos.push_back(p);
      int64_t n_blocks = 1;
      for (int64_t len : lens) n_blocks += (len + c.block_size - 1) / c.block_size;
      const std::vector<int32_t> ids = rng.permutation(n_blocks);
      std::vector<std::vector<int32_t>> tables;
      size_t next = 0;
      for (int64_t len : lens) {
        const auto count = static_cast<size_t>((len + c.block_size - 1) / c.block_size);
        tables.emplace_back(ids.begin() + static_cast<std::ptrdiff_t>(next),
                            ids.begin() + static_cast<std::ptrdiff_t>(next + count));
        next += count;
      }
      if (c.window > 0) {  // sequence 1's blocks below every window of its chunk are given back
        const int32_t low = 130 - c.window + 1;
        for (int64_t b = 0; (b + 1) * c.block_size <= low; ++b) tables[1][b] = kFreedBlock;
      }
      const Csr bt = csr({tables[0], tables[1], tables[2]});
      const auto n_tokens = static_cast<int64_t>(seq.size());
      const Host k_pool = make_pool(c.type, c.head_dim, c.n_kv, c.block_size, n_blocks, rng);
      const Host v_pool = make_pool(c.type, c.head_dim, c.n_kv, c.block_size, n_blocks, rng);
      const Host q = make_f32(Layout::contiguous, c.head_dim, c.n_heads, n_tokens, &rng, -2.0f, 2.0f);
      const Host dst = make_f32(Layout::strided, c.head_dim, c.n_heads, n_tokens, nullptr);
      const float scale = c.softcap > 0.0f ? 0.5f : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
      const std::string what = fmt::format(
          "attention long prefill {} heads {}/{} head_dim {} block_size {} softcap {} window {}{}",
          dtype_name(c.type), c.n_heads, c.n_kv, c.head_dim, c.block_size, c.softcap, c.window,
          qx ? " fast" : "");
      expect_matches_ref(
          what, dst, kAttention,
          [&](const Tensor& d) {
            return Op(Attention{q.t, k_pool.t, v_pool.t, iv(pos), iv(seq), iv(bt.indptr), iv(bt.indices),
                                scale, c.softcap, c.window, d});
          },
          precision_of(qx));
    }
  }
}

// Decode over long contexts (a backend may split a sequence's positions among threads and merge the partial
// softmaxes): few query tokens, 300 and 1000 positions; with a window, the blocks below every query's window
// are given back (kFreedBlock), and two tokens of one sequence far apart leave positions neither sees.
TEST(OpHarness, AttentionLongContext) {
  Rng rng(21);
  struct Variant {
    float softcap;
    int32_t window;
  };
  const Variant variants[] = {{0.0f, 0}, {4.0f, 0}, {0.0f, 200}};
  int i = 0;
  for (DType type : {DType::f32, DType::f16, DType::q8_0, DType::q8_64}) {
    for (const auto& [n_heads, n_kv, head_dim] :
         {std::tuple{8, 2, 64}, std::tuple{4, 4, 80}, std::tuple{6, 1, 128}, std::tuple{16, 8, 64},
          std::tuple{32, 8, 128}, std::tuple{4, 1, 256}, std::tuple{4, 2, 96}}) {
      const Variant& var = variants[i % 3];
      const int64_t block_size = i++ % 2 == 0 ? 16 : 5;
      if (head_dim % dtype_info(type).block_size != 0) continue;  // pools hold whole blocks a row
      // The batch: the last position of sequence 0 (300 long); positions 300 and 999 of sequence 1. With 8 KV
      // heads, 31 tokens (a decode-shaped batch of 248 blocks or more: more than a GPU has multiprocessors,
      // so that each block walks a long chunk, several of the CUDA kernel's stages): positions 970-999 of
      // sequence 1.
      std::vector<int32_t> seq = {0, 1, 1}, pos = {299, 300, 999};
      if (n_kv == 8) {
        seq.assign(31, 1);
        seq[0] = 0;
        pos.assign(1, 299);
        for (int32_t p = 970; p <= 999; ++p) pos.push_back(p);
      }
      const int64_t lens[] = {300, 1000};
      int64_t n_blocks = 1;
      for (int64_t len : lens) n_blocks += (len + block_size - 1) / block_size;
      const std::vector<int32_t> ids = rng.permutation(n_blocks);
      std::vector<std::vector<int32_t>> tables;
      size_t next = 0;
      for (int s = 0; s < 2; ++s) {
        const auto count = static_cast<size_t>((lens[s] + block_size - 1) / block_size);
        tables.emplace_back(ids.begin() + static_cast<std::ptrdiff_t>(next),
                            ids.begin() + static_cast<std::ptrdiff_t>(next + count));
        next += count;
        // The first position any of the sequence's tokens sees: blocks wholly below it are given back.
        const int32_t low = var.window > 0 ? (s == 0 ? 299 : 300) - var.window + 1 : 0;
        for (int64_t b = 0; (b + 1) * block_size <= low; ++b) tables[s][b] = kFreedBlock;
      }
      const Csr bt = csr({tables[0], tables[1]});
      const auto n_tokens = static_cast<int64_t>(seq.size());
      const Host k_pool = make_pool(type, head_dim, n_kv, block_size, n_blocks, rng);
      const Host v_pool = make_pool(type, head_dim, n_kv, block_size, n_blocks, rng);
      const Host q = make_f32(Layout::sliced, head_dim, n_heads, n_tokens, &rng, -2.0f, 2.0f);
      const Host dst = make_f32(Layout::strided, head_dim, n_heads, n_tokens, nullptr);
      const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
      const std::string what =
          fmt::format("attention long context {} heads {}/{} head_dim {} block_size {} softcap {} window {}",
                      dtype_name(type), n_heads, n_kv, head_dim, block_size, var.softcap, var.window);
      for (bool qx : {false, true}) {
        expect_matches_ref(
            what + (qx ? " fast" : ""), dst, kAttention,
            [&](const Tensor& d) {
              return Op(Attention{q.t, k_pool.t, v_pool.t, iv(pos), iv(seq), iv(bt.indptr), iv(bt.indices),
                                  scale, var.softcap, var.window, d});
            },
            precision_of(qx));
      }
    }
  }
}

// Block tables for sequences of `lens` positions: each takes ceil(len / block_size) blocks of a shuffled pool
// of *n_blocks (one spare); blocks wholly below low[s] are given back (kFreedBlock).
std::vector<std::vector<int32_t>> block_tables(const std::vector<int64_t>& lens,
                                               const std::vector<int64_t>& low, int64_t block_size, Rng& rng,
                                               int64_t* n_blocks) {
  *n_blocks = 1;
  for (int64_t len : lens) *n_blocks += (len + block_size - 1) / block_size;
  const std::vector<int32_t> ids = rng.permutation(*n_blocks);
  std::vector<std::vector<int32_t>> tables;
  size_t next = 0;
  for (size_t s = 0; s < lens.size(); ++s) {
    const auto count = static_cast<size_t>((lens[s] + block_size - 1) / block_size);
    tables.emplace_back(ids.begin() + static_cast<std::ptrdiff_t>(next),
                        ids.begin() + static_cast<std::ptrdiff_t>(next + count));
    next += count;
    for (int64_t b = 0; (b + 1) * block_size <= low[s]; ++b) tables[s][b] = kFreedBlock;
  }
  return tables;
}

// The tiled path (precision_fast) where its tiling has edges: head dims that are no whole vectors (7, 80) or
// large (256); GQA groups 1, 3, 4 and 8 (tiles of 64, 21, 16 and 8 tokens); block sizes that divide no length
// (5, 7) and one position a block; a ragged batch: a prompt from position 0 longer than a tile, a chunk
// continuing a sequence past 1,024 positions (rows cross segments of 512 positions) in two runs with another
// sequence's tokens between them, a decode token, a sequence of one position; softcap; windows that start
// inside a chunk, with the blocks below every window given back; f32, f16, q8_0 and q8_64 pools; and a batch
// of one token over a long context (its segments split among threads).
TEST(OpHarness, AttentionTiled) {
  Rng rng(41);
  struct Case {
    DType type;
    int64_t n_heads, n_kv, head_dim, block_size;
    float softcap;
    int32_t window;
  };
  const Case cases[] = {{DType::f32, 8, 8, 64, 16, 0.0f, 0},     {DType::f16, 8, 2, 80, 5, 0.0f, 0},
                        {DType::f32, 8, 1, 128, 7, 3.0f, 0},     {DType::f16, 4, 1, 256, 16, 0.0f, 300},
                        {DType::f32, 3, 1, 7, 1, 2.0f, 37},      {DType::f16, 6, 2, 96, 16, 0.0f, 600},
                        {DType::f32, 12, 4, 64, 16, 0.0f, 0},    {DType::f16, 16, 2, 128, 16, 5.0f, 0},
                        {DType::q8_0, 8, 2, 64, 5, 0.0f, 0},     {DType::q8_0, 8, 1, 128, 7, 3.0f, 0},
                        {DType::q8_0, 4, 1, 256, 16, 0.0f, 300}, {DType::q8_64, 8, 2, 64, 5, 0.0f, 0},
                        {DType::q8_64, 8, 1, 128, 7, 3.0f, 0},   {DType::q8_64, 4, 1, 192, 16, 0.0f, 300}};
  for (const Case& c : cases) {
    for (const bool single : {false, true}) {
      std::vector<int32_t> seq, pos;
      if (single) {
        seq.push_back(0), pos.push_back(1099);
      } else {
        for (int32_t p = 1000; p < 1050; ++p) seq.push_back(0), pos.push_back(p);
        for (int32_t p = 0; p < 90; ++p) seq.push_back(1), pos.push_back(p);
        for (int32_t p = 1050; p < 1100; ++p) seq.push_back(0), pos.push_back(p);
        seq.push_back(2), pos.push_back(2);
        seq.push_back(3), pos.push_back(0);
      }
      const std::vector<int64_t> lens = {1100, 90, 3, 1};
      const int64_t low0 = c.window > 0 ? (single ? 1099 : 1000) - c.window + 1 : 0;
      int64_t n_blocks = 0;
      const auto tables = block_tables(lens, {low0, 0, 0, 0}, c.block_size, rng, &n_blocks);
      const Csr bt = csr({tables[0], tables[1], tables[2], tables[3]});
      const auto n_tokens = static_cast<int64_t>(seq.size());
      const Host k_pool = make_pool(c.type, c.head_dim, c.n_kv, c.block_size, n_blocks, rng);
      const Host v_pool = make_pool(c.type, c.head_dim, c.n_kv, c.block_size, n_blocks, rng);
      const Host q = make_f32(Layout::strided, c.head_dim, c.n_heads, n_tokens, &rng, -2.0f, 2.0f);
      const Host dst = make_f32(Layout::sliced, c.head_dim, c.n_heads, n_tokens, nullptr);
      const float scale = c.softcap > 0.0f ? 0.5f : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
      const std::string what =
          fmt::format("attention tiled {} heads {}/{} head_dim {} block_size {} softcap {} window {}{}",
                      dtype_name(c.type), c.n_heads, c.n_kv, c.head_dim, c.block_size, c.softcap, c.window,
                      single ? " one token" : "");
      expect_matches_ref(
          what, dst, kAttention,
          [&](const Tensor& d) {
            return Op(Attention{q.t, k_pool.t, v_pool.t, iv(pos), iv(seq), iv(bt.indptr), iv(bt.indices),
                                scale, c.softcap, c.window, d});
          },
          kFast);
    }
  }
}

// Batch invariance of the tiled path: each sequence's rows are the same bits alone, in a batch with the
// others (in either order), fed a token, then 7, then the rest (a lone token over a long context splits its
// segments among threads; a chunk's first tile starts where the chunk does), and on 1 thread or 3. Three
// sequences: 100 tokens continuing one of 1,300 positions (crossing segments), a prompt of 70, a sequence of
// one position.
TEST(OpHarness, AttentionTiledIsBatchInvariant) {
  Rng rng(43);
  const int64_t n_heads = 8, n_kv = 2, head_dim = 80, block_size = 5;
  struct Token {
    int32_t seq, pos;
  };
  std::vector<Token> tokens;  // every query token, by sequence
  for (int32_t p = 1200; p < 1300; ++p) tokens.push_back({0, p});
  for (int32_t p = 0; p < 70; ++p) tokens.push_back({1, p});
  tokens.push_back({2, 0});
  const std::vector<int64_t> lens = {1300, 70, 1};
  const auto n_all = static_cast<int64_t>(tokens.size());
  // Runs: each a list of indices into `tokens`.
  std::vector<std::vector<int64_t>> runs;
  for (int32_t s = 0; s < 3; ++s) {  // alone
    runs.emplace_back();
    for (int64_t i = 0; i < n_all; ++i) {
      if (tokens[i].seq == s) runs.back().push_back(i);
    }
  }
  runs.emplace_back(n_all);  // together
  std::iota(runs.back().begin(), runs.back().end(), 0);
  runs.push_back(runs[2]);  // together, the other order
  runs.back().insert(runs.back().end(), runs[1].begin(), runs[1].end());
  runs.back().insert(runs.back().end(), runs[0].begin(), runs[0].end());
  for (const auto& [b, e] : {std::pair{0, 1}, std::pair{1, 8}, std::pair{8, 100}}) {  // sequence 0 in chunks
    runs.emplace_back(runs[0].begin() + b, runs[0].begin() + e);
  }
  const int n_alone = 3;
  struct Level {
    const NamedBackend* threads3;  // as backends() makes it: 3 threads
    NamedBackend threads1;
  };
  std::vector<Level> levels;  // each CPU level, on 3 threads and on 1
  for (const NamedBackend& nb : backends(kFast)) {
    if (nb.kind != "cpu") continue;
    BackendOptions options = nb.options;
    options.n_threads = 1;
    Result<std::unique_ptr<Backend>> b = make_backend("cpu", options);
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    levels.push_back({&nb, {nb.name + " 1 thread", std::move(b).value(), true, "cpu", options}});
  }
  for (DType type : {DType::f32, DType::f16}) {
    for (const auto& cap_window : {std::pair{0.0f, 0}, std::pair{4.0f, 700}}) {
      const float softcap = cap_window.first;
      const int window = cap_window.second;
      int64_t n_blocks = 0;
      const auto tables = block_tables(lens, {0, 0, 0}, block_size, rng, &n_blocks);
      const Host k_pool = make_pool(type, head_dim, n_kv, block_size, n_blocks, rng);
      const Host v_pool = make_pool(type, head_dim, n_kv, block_size, n_blocks, rng);
      const Host q_all = dense(head_dim, n_heads, n_all, &rng, -2.0f, 2.0f);
      const std::string what = fmt::format("attention tiled batch invariance {} softcap {} window {}",
                                           dtype_name(type), softcap, window);
      // A run's dst rows, by token: [n_all][n_heads * head_dim] (NaN where the run has no such token).
      auto run = [&](const NamedBackend& nb, const std::vector<int64_t>& ids) {
        std::vector<int32_t> seq_of(3, -1), seq, pos;
        std::vector<std::span<const int32_t>> tabs;
        for (int64_t i : ids) {
          if (seq_of[tokens[i].seq] < 0) {
            seq_of[tokens[i].seq] = static_cast<int32_t>(tabs.size());
            tabs.emplace_back(tables[tokens[i].seq]);
          }
          seq.push_back(seq_of[tokens[i].seq]), pos.push_back(tokens[i].pos);
        }
        const Csr bt = csr(tabs);
        const auto n = static_cast<int64_t>(ids.size());
        const Host q = dense(head_dim, n_heads, n, nullptr);
        for (int64_t j = 0; j < n; ++j)
          std::memcpy(q.t.row(0, j), q_all.t.row(0, ids[j]), head_dim * n_heads * 4);
        const Host dst = dense(head_dim, n_heads, n, nullptr);
        std::vector<float> rows(n_all * n_heads * head_dim, std::nanf(""));
        const Op op = Attention{q.t,    k_pool.t, v_pool.t, iv(pos), iv(seq), iv(bt.indptr), iv(bt.indices),
                                0.125f, softcap,  window,   dst.t};
        if (!run_on(nb, op, what)) return rows;
        for (int64_t j = 0; j < n; ++j) {
          std::memcpy(&rows[ids[j] * n_heads * head_dim], dst.t.row(0, j), head_dim * n_heads * 4);
        }
        return rows;
      };
      for (const Level& level : levels) {
        std::vector<float> alone(n_all * n_heads * head_dim);
        for (int s = 0; s < n_alone; ++s) {
          const std::vector<float> rows = run(*level.threads3, runs[s]);
          for (int64_t i : runs[s]) {
            std::copy_n(&rows[i * n_heads * head_dim], n_heads * head_dim, &alone[i * n_heads * head_dim]);
          }
        }
        for (const NamedBackend* nb : {level.threads3, &level.threads1}) {
          for (size_t r = 0; r < runs.size(); ++r) {
            const std::vector<float> rows = run(*nb, runs[r]);
            for (int64_t i : runs[r]) {
              EXPECT_EQ(std::memcmp(&rows[i * n_heads * head_dim], &alone[i * n_heads * head_dim],
                                    n_heads * head_dim * 4),
                        0)
                  << nb->name << " " << what << ": run " << r << ", sequence " << tokens[i].seq
                  << " position " << tokens[i].pos << " differs from the sequence alone";
            }
          }
        }
      }
    }
  }
}

TEST(OpHarness, MoeRoute) {
  Rng rng(13);
  const std::array<int64_t, 3> shapes[] = {{1, 1, 1},  {8, 2, 5},   {8, 8, 3},
                                           {60, 4, 7}, {128, 8, 2}, {3, 2, 33}};
  int i = 0;
  for (const auto& [n_expert, n_used, n_tokens] : shapes) {
    for (bool normalize : {false, true}) {
      const Layout layout = kLayouts[i++ % 3];
      const Host logits = make_f32(layout, n_expert, n_tokens, 1, &rng, -3.0f, 3.0f);
      for (int64_t t = 1; t < n_tokens && n_expert > 1; t += 2) {  // a tie on the largest logit
        const int32_t a = rng.integer(0, n_expert - 1), c = (a + rng.integer(1, n_expert - 1)) % n_expert;
        logits.t.row_as<float>(t)[a] = logits.t.row_as<float>(t)[c] = 4.0f;
      }
      const Host weights = make_f32(layout, n_used, n_tokens, 1, nullptr);
      Host want_w = clone(weights);
      std::vector<int32_t> want(n_used * n_tokens, -1);
      const MoeRoute ref_op{logits.t, iv(want), want_w.t, normalize};
      ASSERT_TRUE(check(ref_op).ok());
      ref::moe_route(ref_op);
      for (int64_t t = 0; t < n_tokens;
           ++t) {  // descending logits, ties by index; normalized weights sum to 1
        const auto* x = logits.t.row_as<const float>(t);
        double sum = 0.0;
        for (int64_t s = 0; s < n_used; ++s) {
          const int32_t e = want[s + n_used * t];
          sum += want_w.t.row_as<float>(t)[s];
          if (s > 0) {
            const int32_t prev = want[s - 1 + n_used * t];
            ASSERT_TRUE(x[prev] > x[e] || (x[prev] == x[e] && prev < e)) << t << " " << s;
          }
        }
        if (normalize) {
          ASSERT_NEAR(sum, 1.0, 1e-6);
        }
      }
      const std::string what = fmt::format("moe_route [{}, {}] n_used {} {}{}", n_expert, n_tokens, n_used,
                                           layout_name(layout), normalize ? " normalize" : "");
      for (const NamedBackend& nb : backends()) {
        std::vector<int32_t> got(want.size(), -1);
        Host got_w = clone(weights);
        if (!run_on(nb, MoeRoute{logits.t, iv(got), got_w.t, normalize}, what)) continue;
        EXPECT_EQ(got, want) << nb.name << " " << what;
        EXPECT_LE(compare(gather(got_w.t), gather(want_w.t), 0.0).max_abs, kRowWise.limit)
            << nb.name << " " << what;
        EXPECT_TRUE(outside_untouched(got_w)) << nb.name << " " << what << ": wrote outside weights";
      }
    }
  }
}

TEST(OpHarness, MoeMatmul) {
  Rng rng(14);
  struct Shape {
    int64_t n, n_expert, n_used, n_tokens;
  };
  const Shape shapes[] = {{1, 1, 1, 1}, {7, 4, 2, 5}, {33, 8, 3, 6}, {5, 60, 4, 3}};
  int i = 0;
  for (DType type : kWeightTypes) {
    const DTypeInfo& info = dtype_info(type);
    const std::vector<int64_t> ks = info.block_size == 1    ? std::vector<int64_t>{7, 33}
                                    : info.block_size == 32 ? std::vector<int64_t>{32, 96}
                                                            : std::vector<int64_t>{256};
    for (int64_t k : ks) {
      for (const Shape& sh : shapes) {
        const Layout layout = kLayouts[i % 3];
        const bool shared_x = i++ % 2 == 0;  // x [k, 1, n_tokens] or [k, n_used, n_tokens]
        Host w =
            make_weights(type, k, sh.n * sh.n_expert, layout == Layout::contiguous ? 0 : info.type_size, rng);
        w.t.ne = {k, sh.n, sh.n_expert, 1};
        w.t.nb[2] = w.t.nb[1] * sh.n;
        w.t.nb[3] = w.t.nb[2] * sh.n_expert;
        std::vector<int32_t> ids(sh.n_used * sh.n_tokens);  // repeats and unused experts included
        for (int32_t& id : ids) id = rng.integer(0, static_cast<int32_t>(sh.n_expert) - 1);
        ids.back() = static_cast<int32_t>(sh.n_expert) - 1;
        const Host x = make_f32(layout, k, shared_x ? 1 : sh.n_used, sh.n_tokens, &rng);
        const Host dst = make_f32(layout, sh.n, sh.n_used, sh.n_tokens, nullptr);
        for (bool qx : {false, true}) {
          const std::string what =
              fmt::format("moe_matmul {} w [{}, {}, {}] x {} n_used {} {}{}", info.name, k, sh.n, sh.n_expert,
                          x.t.describe(), sh.n_used, layout_name(layout), qx ? " fast" : "");
          Budget budget = kMatmul;
          budget.qx_floor = product_scale(w.t, x.t);
          expect_matches_ref(
              what, dst, budget,
              [&](const Tensor& d) {
                return Op(MoeMatmul{w.t, x.t, iv(ids), d});
              },
              precision_of(qx));
        }
      }
    }
  }
}

TEST(OpHarness, WeightedSum) {
  Rng rng(15);
  int i = 0;
  for (const RowShape& s : kRowShapes) {  // [n, n_slots, n_tokens]
    for (Layout layout : kLayouts) {
      const Host y = make_f32(layout, s.n, s.r1, s.r2 + i++ % 3, &rng, -2.0f, 2.0f);
      const Host w = make_f32(layout, s.r1, y.t.ne[2], 1, &rng, 0.0f, 1.0f);
      const Host dst = make_f32(layout, s.n, y.t.ne[2], 1, nullptr);
      expect_matches_ref(fmt::format("weighted_sum y {} {}", y.t.describe(), layout_name(layout)), dst,
                         kRowWise, [&](const Tensor& d) {
                           return Op(WeightedSum{y.t, w.t, d});
                         });
    }
  }
}

// A group of one rank (tensor parallelism's collectives on one device): the sum and the gather are x. Groups
// of several ranks: tests/ops/collective_test.cpp (host), tests/cuda/cuda_collective_test.cpp (NCCL).
TEST(OpHarness, Collectives) {
  Rng rng(16);
  HostGroup group(1);
  for (const auto& [n, rows] : {std::pair<int64_t, int64_t>{1, 1}, {37, 1}, {576, 3}, {4099, 7}}) {
    const Host x = dense(n, rows, 1, &rng, -4.0f, 4.0f);
    const Host dst = dense(n, rows, 1, nullptr);
    const std::string shape = x.t.describe();
    expect_matches_ref("all_reduce " + shape, dst, kRowWise, [&](const Tensor& d) {
      return Op(AllReduce{x.t, d, &group.rank(0)});
    });
    expect_matches_ref("all_gather " + shape, dst, kRowWise, [&](const Tensor& d) {
      return Op(AllGather{x.t, d, &group.rank(0)});
    });
    const std::vector<float> want = gather(x.t);
    for (const NamedBackend& nb : backends()) {  // in place
      Host inout = clone(x);
      if (!run_on(nb, Op(AllReduce{inout.t, inout.t, &group.rank(0)}), "all_reduce in place")) continue;
      EXPECT_EQ(gather(inout.t), want) << nb.name << " all_reduce in place " << shape;
    }
  }
}

// sum_squares accumulates into sums f32 [n, n_mat] and counts f32 [1, n_mat], held as the views of one
// [n + 1, n_mat] tensor (so one dst compares both): columns 0..n-1 the sums, column n the count. They start
// from earlier sums (positive values) and whole counts.
struct SumsAndCounts {
  Tensor sums, counts;
};
SumsAndCounts sums_and_counts(const Tensor& acc) {
  const int64_t n = acc.ne[0] - 1, n_mat = acc.ne[1];
  SumsAndCounts v{acc, acc};
  v.sums.ne = {n, n_mat, 1, 1};
  v.counts.data = acc.row_as<float>(0) + n;
  v.counts.ne = {1, n_mat, 1, 1};
  return v;
}
Host make_accumulators(Layout layout, int64_t n, int64_t n_mat, Rng& rng) {
  Host h = make_f32(layout, n + 1, n_mat, 1, &rng, 0.0f, 4.0f);
  for (int64_t m = 0; m < n_mat; ++m) h.t.row_as<float>(m)[n] = static_cast<float>(rng.integer(0, 9));
  return h;
}

TEST(OpHarness, SumSquares) {
  Rng rng(16);
  int i = 0;
  // Dense: every row of x to one matrix (a Matmul's x); 300 rows: a GPU's several slices of rows.
  for (const RowShape& s : {RowShape{1, 1, 1}, RowShape{7, 3, 2}, RowShape{257, 3, 1}, RowShape{64, 300, 1},
                            RowShape{33, 1, 3}, RowShape{4096, 2, 1}}) {
    for (Layout layout : kLayouts) {
      const Host x = make_f32(layout, s.n, s.r1, s.r2, &rng);
      const Host acc = make_accumulators(kLayouts[i++ % 3], s.n, 1, rng);
      expect_matches_ref(fmt::format("sum_squares x {} {}", x.t.describe(), layout_name(layout)), acc, kSums,
                         [&](const Tensor& d) {
                           const SumsAndCounts v = sums_and_counts(d);
                           return Op(SumSquares{x.t, Tensor{}, v.sums, v.counts});
                         });
    }
  }
  // With the Gram matrix (kiln imatrix --full): dst [n, n + 2], rows 0..n-1 the Gram matrix, row n the sums,
  // row n + 1 the count; n a multiple of the CPU's 16-row blocks or not, rows from 1 to 600 (the CPU's runs
  // of 256). Summed in f32 over at most a few hundred products, as the sums.
  for (const RowShape& s : {RowShape{1, 1, 1}, RowShape{7, 5, 1}, RowShape{33, 3, 2}, RowShape{100, 300, 1},
                            RowShape{48, 300, 2}}) {
    const Layout layout = kLayouts[i++ % 3];
    const Host x = make_f32(layout, s.n, s.r1, s.r2, &rng);
    const Host acc = make_f32(Layout::contiguous, s.n, s.n + 2, 1, &rng, 0.0f, 4.0f);
    expect_matches_ref(fmt::format("sum_squares gram x {} {}", x.t.describe(), layout_name(layout)), acc,
                       kSums, [&](const Tensor& d) {
                         Tensor gram = d, sums = d, counts = d;
                         gram.ne = {s.n, s.n, 1, 1};
                         sums.data = d.row_as<float>(s.n);
                         sums.ne = {s.n, 1, 1, 1};
                         counts.data = d.row_as<float>(s.n + 1);
                         counts.ne = {1, 1, 1, 1};
                         return Op(SumSquares{x.t, Tensor{}, sums, counts, gram});
                       });
  }
  // With the ranges (amax, kiln imatrix): dst [n + 2, n_mat], column n the count, column n + 1 the largest
  // |x| so far (from 0 to 0.5, below most rows' largest), dense and routed.
  const auto with_ranges = [](const Tensor& d) {
    const int64_t n = d.ne[0] - 2, n_mat = d.ne[1];
    Tensor sums = d, counts = d, amax = d;
    sums.ne = {n, n_mat, 1, 1};
    counts.data = d.row_as<float>(0) + n;
    counts.ne = {1, n_mat, 1, 1};
    amax.data = d.row_as<float>(0) + n + 1;
    amax.ne = {1, n_mat, 1, 1};
    return std::array<Tensor, 3>{sums, counts, amax};
  };
  for (const RowShape& s :
       {RowShape{1, 1, 1}, RowShape{7, 3, 2}, RowShape{257, 3, 1}, RowShape{64, 300, 1}}) {
    const Layout layout = kLayouts[i++ % 3];
    const Host x = make_f32(layout, s.n, s.r1, s.r2, &rng);
    Host acc = make_f32(Layout::contiguous, s.n + 2, 1, 1, &rng, 0.0f, 4.0f);
    acc.t.row_as<float>(0)[s.n] = 3.0f;
    acc.t.row_as<float>(0)[s.n + 1] = 0.5f * static_cast<float>(rng.integer(0, 1));
    expect_matches_ref(fmt::format("sum_squares amax x {} {}", x.t.describe(), layout_name(layout)), acc,
                       kSums, [&](const Tensor& d) {
                         const auto [sums, counts, amax] = with_ranges(d);
                         SumSquares op{x.t, Tensor{}, sums, counts};
                         op.amax = amax;
                         return Op(op);
                       });
  }
  {
    constexpr int64_t n = 300, n_mat = 6, n_used = 2, n_tokens = 40;
    std::vector<int32_t> ids(n_used * n_tokens);
    for (int32_t& id : ids) id = rng.integer(0, static_cast<int32_t>(n_mat) - 2);  // matrix 5: no rows
    const Host x = make_f32(Layout::contiguous, n, n_used, n_tokens, &rng);
    Host acc = make_f32(Layout::contiguous, n + 2, n_mat, 1, &rng, 0.0f, 4.0f);
    for (int64_t m = 0; m < n_mat; ++m) {
      acc.t.row_as<float>(m)[n] = 1.0f;
      acc.t.row_as<float>(m)[n + 1] = 0.25f * static_cast<float>(m % 3);
    }
    expect_matches_ref("sum_squares amax routed", acc, kSums, [&](const Tensor& d) {
      const auto [sums, counts, amax] = with_ranges(d);
      SumSquares op{x.t, reshape(iv(ids), n_used, n_tokens), sums, counts};
      op.amax = amax;
      return Op(op);
    });
  }
  // Routed: slot s of token t to matrix ids[s + n_used t] (a MoeMatmul's x and ids), repeats and unused
  // matrices included; n = 300: more than a GPU block's columns.
  struct Shape {
    int64_t n, n_mat, n_used, n_tokens;
  };
  for (const Shape& sh : {Shape{1, 1, 1, 1}, Shape{7, 4, 2, 5}, Shape{33, 8, 3, 6}, Shape{300, 60, 4, 37}}) {
    for (const bool shared_x : {true, false}) {  // x [n, 1, n_tokens] or [n, n_used, n_tokens]
      const Layout layout = kLayouts[i++ % 3];
      std::vector<int32_t> ids(sh.n_used * sh.n_tokens);
      for (int32_t& id : ids) id = rng.integer(0, static_cast<int32_t>(sh.n_mat) - 1);
      ids.back() = static_cast<int32_t>(sh.n_mat) - 1;
      const Host x = make_f32(layout, sh.n, shared_x ? 1 : sh.n_used, sh.n_tokens, &rng);
      const Host acc = make_accumulators(layout, sh.n, sh.n_mat, rng);
      expect_matches_ref(
          fmt::format("sum_squares x {} n_mat {} n_used {} {}", x.t.describe(), sh.n_mat, sh.n_used,
                      layout_name(layout)),
          acc, kSums, [&](const Tensor& d) {
            const SumsAndCounts v = sums_and_counts(d);
            return Op(SumSquares{x.t, reshape(iv(ids), sh.n_used, sh.n_tokens), v.sums, v.counts});
          });
    }
  }
}

// InverseCholesky: l l^T = (a + lambda I)^-1 on Gram matrices of random inputs (X^T X of 2n + 3 rows, a few
// dead columns, as GPTQ's Hessians have), each size a multiple of the CPU's 64-row panels or not. The
// reference is checked against its definition first (l l^T (a + lambda I) = I, l lower), then every backend
// against it: both compute in f64 and round once, so they agree to a few f32 ulp. Matrices that are not
// positive definite (negative, rank one, NaN) give status 1 everywhere.
TEST(OpHarness, InverseCholesky) {
  Rng rng(77);
  constexpr float kDirty = 12345.0f;  // l's initial values: every entry must be written
  const auto run_all = [&](const std::string& what, const Host& a, double lambda, int32_t want_status,
                           const std::vector<float>* want_l) {
    const int64_t n = a.t.ne[0];
    for (const NamedBackend& nb : backends()) {
      Host l = dense(n, n, 1, nullptr, kDirty, kDirty);
      std::vector<int32_t> status = {-7};
      if (!run_on(nb, InverseCholesky{a.t, lambda, l.t, iv(status)}, what)) continue;
      EXPECT_EQ(status[0], want_status) << nb.name << " " << what;
      if (want_l == nullptr || status[0] != 0) continue;
      const Error e = compare(gather(l.t), *want_l, 0.0);
      EXPECT_LE(e.rel_l2, 1e-6) << nb.name << " " << what;
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = i + 1; j < n; ++j)
          ASSERT_EQ(l.t.row_as<float>(i)[j], 0.0f) << nb.name << " " << what;
      }
    }
  };
  for (const int64_t n : {1, 2, 7, 64, 65, 130, 257}) {
    const int64_t m = 2 * n + 3;
    const Host x = dense(n, m, 1, &rng);
    for (int64_t r = 0; r < m && n > 4; ++r) x.t.row_as<float>(r)[n / 3] = 0.0f;  // a dead input
    Host a = dense(n, n, 1, nullptr);
    double diag = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double g = 0.0;
        for (int64_t r = 0; r < m; ++r)
          g += static_cast<double>(x.t.row_as<float>(r)[i]) * x.t.row_as<float>(r)[j];
        a.t.row_as<float>(i)[j] = static_cast<float>(g);
      }
      diag += a.t.row_as<float>(i)[i];
    }
    const double lambda = 0.01 * diag / static_cast<double>(n);
    Host want = dense(n, n, 1, nullptr);
    std::vector<int32_t> status = {-7};
    ref::inverse_cholesky(InverseCholesky{a.t, lambda, want.t, iv(status)});
    ASSERT_EQ(status[0], 0) << n;
    // l l^T (a + lambda I) = I, to f32 rounding of l times the condition number.
    double worst = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t k = 0; k < n; ++k) {
        double v = 0.0;
        for (int64_t j = 0; j < n; ++j) {
          double llt = 0.0;
          for (int64_t p = 0; p <= std::min(i, j); ++p)
            llt += static_cast<double>(want.t.row_as<float>(i)[p]) * want.t.row_as<float>(j)[p];
          v += llt * (a.t.row_as<float>(std::max(j, k))[std::min(j, k)] + (j == k ? lambda : 0.0));
        }
        worst = std::max(worst, std::fabs(v - (i == k ? 1.0 : 0.0)));
      }
    }
    EXPECT_LE(worst, 1e-3) << "the reference's l for n = " << n;
    // Only the lower triangle is read: poison above it.
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = i + 1; j < n; ++j) a.t.row_as<float>(i)[j] = std::numeric_limits<float>::quiet_NaN();
    }
    const std::vector<float> want_l = gather(want.t);
    run_all(fmt::format("inverse_cholesky n {}", n), a, lambda, 0, &want_l);
  }
  // Not positive definite: -I; v v^T (rank one); a NaN on the diagonal.
  for (const int64_t n : {1, 5, 70}) {
    Host neg = dense(n, n, 1, nullptr), rank1 = dense(n, n, 1, nullptr), nan = dense(n, n, 1, nullptr);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        neg.t.row_as<float>(i)[j] = i == j ? -1.0f : 0.0f;
        rank1.t.row_as<float>(i)[j] = static_cast<float>((i % 3 + 1) * (j % 3 + 1));
        nan.t.row_as<float>(i)[j] = i == j ? 2.0f : 0.0f;
      }
    }
    nan.t.row_as<float>(n / 2)[n / 2] = std::numeric_limits<float>::quiet_NaN();
    for (const auto& [name, a] : {std::pair<const char*, const Host*>{"negative", &neg}, {"nan", &nan}}) {
      std::vector<int32_t> status = {-7};
      Host l = dense(n, n, 1, nullptr);
      ref::inverse_cholesky(InverseCholesky{a->t, 0.0, l.t, iv(status)});
      ASSERT_EQ(status[0], 1) << name << " " << n;
      run_all(fmt::format("inverse_cholesky {} n {}", name, n), *a, 0.0, 1, nullptr);
    }
    if (n > 1) {
      std::vector<int32_t> status = {-7};
      Host l = dense(n, n, 1, nullptr);
      ref::inverse_cholesky(InverseCholesky{rank1.t, 0.0, l.t, iv(status)});
      ASSERT_EQ(status[0], 1) << "rank one " << n;
      run_all(fmt::format("inverse_cholesky rank one n {}", n), rank1, 0.0, 1, nullptr);
    }
  }
}

// ---- typed activations: f16 / bf16 destinations ----

// The ops whose contract allows a float destination (f32, f16, bf16). The reference computes in f32 and
// rounds once to nearest even: its f16 / bf16 output is exactly its f32 output rounded. A backend that
// declares such a destination in supports() is held to the reference's rounded output (one rounding step,
// 2^-8 relative for bf16, of the values' magnitude); one that does not must refuse it with unimplemented.
TEST(OpHarness, FloatDestinations) {
  Rng rng(21);
  const Host a = dense(64, 5, 1, &rng), b = dense(64, 5, 1, &rng), w = dense(64, 1, 1, &rng);
  const Host wm = make_weights(DType::q4_0, 64, 24, 0, rng);
  const std::vector<int32_t> ids = {3, 0, 3, 1};
  const Host table = dense(64, 4, 1, &rng);
  struct Case {
    std::string name;
    int64_t ne0, ne1;
    std::function<Op(const Tensor&)> make;
  };
  const std::vector<Case> cases = {
      {"get_rows", 64, 4,
       [&](const Tensor& d) {
         return Op(GetRows{table.t, iv(ids), d});
       }},
      {"matmul", 24, 5,
       [&](const Tensor& d) {
         return Op(Matmul{wm.t, a.t, d});
       }},
      {"rms_norm", 64, 5,
       [&](const Tensor& d) {
         return Op(RmsNorm{a.t, w.t, 1e-6f, false, d});
       }},
      {"gated_act", 64, 5,
       [&](const Tensor& d) {
         return Op(GatedAct{a.t, b.t, GluKind::glu_kind_silu, d});
       }},
      {"binary", 64, 5,
       [&](const Tensor& d) {
         return Op(Binary{a.t, b.t, BinaryKind::binary_kind_mul, d});
       }},
  };
  for (const Case& c : cases) {
    Host f32 = dense(c.ne0, c.ne1, 1, nullptr);
    ASSERT_TRUE(check(c.make(f32.t)).ok()) << c.name;
    ref::run(c.make(f32.t));
    const std::vector<float> want32 = gather(f32.t);
    for (DType type : {DType::f16, DType::bf16}) {
      const std::string what = fmt::format("{} into {}", c.name, dtype_name(type));
      std::vector<uint16_t> mem(static_cast<size_t>(c.ne0 * c.ne1), 0xFFFF);
      const Tensor dst = make_tensor(type, mem.data(), c.ne0, c.ne1);
      const Op op = c.make(dst);
      ASSERT_TRUE(check(op).ok()) << what;
      ref::run(op);
      for (size_t i = 0; i < mem.size(); ++i) {
        const uint16_t rounded = type == DType::f16 ? f32_to_f16(want32[i]) : f32_to_bf16(want32[i]);
        ASSERT_EQ(mem[i], rounded) << what << " element " << i;
      }
      for (const NamedBackend& nb : backends()) {
        std::vector<uint16_t> got(mem.size(), 0xFFFF);
        const Op bop = c.make(make_tensor(type, got.data(), c.ne0, c.ne1));
        if (!run_on(nb, bop, what)) continue;
        double worst = 0.0, scale = 1.0;
        for (size_t i = 0; i < got.size(); ++i) {
          const auto to_f32 = [&](uint16_t h) { return type == DType::f16 ? f16_to_f32(h) : bf16_to_f32(h); };
          worst = std::max(worst, std::fabs(static_cast<double>(to_f32(got[i])) - to_f32(mem[i])));
          scale = std::max(scale, std::fabs(static_cast<double>(want32[i])));
        }
        EXPECT_LE(worst / scale, type == DType::f16 ? 1e-3 : 8e-3) << nb.name << " " << what;
      }
    }
  }
  // An f32 destination runs on every backend: the CPU backend supports all of these.
  for (const NamedBackend& nb : backends()) {
    if (nb.kind != "cpu") continue;
    for (const Case& c : cases) {
      const Host d = dense(c.ne0, c.ne1, 1, nullptr);
      EXPECT_TRUE(nb.backend->supports(c.make(d.t))) << c.name;
    }
  }
}

// ---- check(): malformed calls are rejected, naming the operand ----

// check() and every backend's run() reject `op` with `code` and a message naming the op and `operand`.
void expect_rejected(const Op& op, StatusCode code, std::string_view operand) {
  const Status s = check(op);
  EXPECT_EQ(s.code(), code) << s.to_string();
  EXPECT_NE(s.message().find(op_name(op)), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(operand), std::string::npos)
      << "\"" << s.message() << "\" does not name " << operand;
  for (const NamedBackend& nb : backends())
    EXPECT_EQ(nb.backend->run(op).code(), code) << nb.name << " " << s.message();
}
constexpr StatusCode kInvalid = StatusCode::invalid_argument;
constexpr StatusCode kRange = StatusCode::out_of_range;

struct Operands {  // f32 operands for the malformed calls
  Rng rng{9};
  Host x = dense(8, 4, 2, &rng), y = dense(8, 4, 2, &rng);
  Host small = dense(8, 3, 2, &rng), vec = dense(7, 1, 1, &rng);
  Host half = make_pool(DType::f16, 8, 4, 2, 1, rng);  // f16 [8, 4, 2]
};

TEST(OpCheck, GetRows) {
  Operands o;
  const std::vector<int32_t> ids = {0, 3, 1, 2, 0, 1, 2, 3};
  Tensor table = reshape(o.x.t, 8, 8), none_table = table;
  none_table.type = DType::f64;  // no dequantizer
  ASSERT_TRUE(check(GetRows{table, iv(ids), o.y.t}).ok());
  expect_rejected(GetRows{none_table, iv(ids), o.y.t}, kInvalid, "table");
  expect_rejected(GetRows{table, iv(ids), o.small.t}, kInvalid, "dst");
  expect_rejected(GetRows{table, o.x.t, o.y.t}, kInvalid, "ids must be i32");
  // check() is O(1): an id out of range is the step builder's to refuse (check_batch), not the op's.
  const std::vector<int32_t> bad = {0, 8, 1, 2, 0, 1, 2, 3};
  EXPECT_TRUE(check(GetRows{table, iv(bad), o.y.t}).ok());
}

TEST(OpCheck, Matmul) {
  Operands o;
  const Tensor w = reshape(o.x.t, 8, 8), w_none = [&] {
    Tensor t = w;
    t.type = DType::f64;  // no dequantizer
    return t;
  }();
  Tensor w_gaps = w;
  w_gaps.nb[0] = 8;
  ASSERT_TRUE(check(Matmul{w, o.y.t, o.x.t}).ok());
  expect_rejected(Matmul{w_none, o.y.t, o.x.t}, kInvalid, "weight");
  expect_rejected(Matmul{w_gaps, o.y.t, o.x.t}, kInvalid, "w must");
  expect_rejected(Matmul{w, o.half.t, o.x.t}, kInvalid, "x must be f32");
  expect_rejected(Matmul{w, o.vec.t, o.x.t}, kInvalid, "x is");
  expect_rejected(Matmul{w, o.y.t, o.small.t}, kInvalid, "dst");
}

TEST(OpCheck, RmsNormAndLayerNorm) {
  Operands o;
  ASSERT_TRUE(check(RmsNorm{o.x.t, Tensor{}, 1e-6f, false, o.y.t}).ok());
  expect_rejected(RmsNorm{o.half.t, Tensor{}, 1e-6f, false, o.y.t}, kInvalid, "x must");
  expect_rejected(RmsNorm{o.x.t, Tensor{}, 1e-6f, false, o.small.t}, kInvalid, "dst");
  expect_rejected(RmsNorm{o.x.t, o.vec.t, 1e-6f, false, o.y.t}, kInvalid, "w is");
  expect_rejected(RmsNorm{o.x.t, Tensor{}, -1.0f, false, o.y.t}, kInvalid, "eps");
  ASSERT_TRUE(check(LayerNorm{o.x.t, Tensor{}, Tensor{}, 1e-5f, o.y.t}).ok());
  expect_rejected(LayerNorm{o.x.t, o.vec.t, Tensor{}, 1e-5f, o.y.t}, kInvalid, "w is");
  expect_rejected(LayerNorm{o.x.t, Tensor{}, o.vec.t, 1e-5f, o.y.t}, kInvalid, "b is");
  expect_rejected(LayerNorm{o.x.t, Tensor{}, Tensor{}, 1e-5f, o.half.t}, kInvalid, "dst");
}

TEST(OpCheck, Rope) {
  Operands o;
  const std::vector<int32_t> pos = {0, 7}, short_pos = {0};
  RopeParams p;
  p.n_rot = 8;
  ASSERT_TRUE(check(Rope{o.x.t, iv(pos), p, {}, o.y.t}).ok());
  expect_rejected(Rope{o.half.t, iv(pos), p, {}, o.y.t}, kInvalid, "x must");
  expect_rejected(Rope{o.x.t, iv(pos), p, {}, o.small.t}, kInvalid, "dst");
  expect_rejected(Rope{o.x.t, iv(short_pos), p, {}, o.y.t}, kInvalid, "positions");
  expect_rejected(Rope{o.x.t, iv(pos), p, o.vec.t, o.y.t}, kInvalid, "freq_factors");  // [7], not n_rot/2
  RopeParams bad = p;
  bad.n_rot = 5;
  expect_rejected(Rope{o.x.t, iv(pos), bad, {}, o.y.t}, kInvalid, "n_rot");
  bad = p;
  bad.scaling = RopeScaling::rope_scaling_yarn;
  expect_rejected(Rope{o.x.t, iv(pos), bad, {}, o.y.t}, kInvalid, "original_context");
}

TEST(OpCheck, SoftmaxGatedActBinaryScaleArgmax) {
  Operands o;
  expect_rejected(Softmax{o.half.t, 1.0f, o.y.t}, kInvalid, "x must");
  expect_rejected(Softmax{o.x.t, 1.0f, o.small.t}, kInvalid, "dst");
  expect_rejected(Softmax{o.x.t, INFINITY, o.y.t}, kInvalid, "scale");
  expect_rejected(GatedAct{o.x.t, o.small.t, GluKind::glu_kind_silu, o.y.t}, kInvalid, "up");
  expect_rejected(GatedAct{o.x.t, o.x.t, GluKind::glu_kind_silu, o.small.t}, kInvalid, "dst");
  expect_rejected(Binary{o.half.t, o.x.t, BinaryKind::binary_kind_add, o.y.t}, kInvalid, "a must");
  expect_rejected(Binary{o.x.t, o.small.t, BinaryKind::binary_kind_add, o.y.t}, kInvalid, "b is");
  expect_rejected(Scale{o.x.t, NAN, o.y.t}, kInvalid, "scale");
  expect_rejected(Scale{o.x.t, 2.0f, o.small.t}, kInvalid, "dst");
  std::vector<int32_t> out(8), short_out(3);
  ASSERT_TRUE(check(Argmax{o.x.t, iv(out)}).ok());
  expect_rejected(Argmax{o.x.t, iv(short_out)}, kInvalid, "out");
  expect_rejected(Argmax{o.half.t, iv(out)}, kInvalid, "x must");
}

TEST(OpCheck, MoeRouteMoeMatmulWeightedSum) {
  Operands o;  // logits [8, 8 tokens]; w [8, 4, 2 experts]; y [8, 4 slots, 2 tokens]
  const Host weights = dense(2, 8, 1, &o.rng), few = dense(2, 7, 1, &o.rng), many = dense(9, 8, 1, &o.rng);
  std::vector<int32_t> ids(16), short_ids(15);
  ASSERT_TRUE(check(MoeRoute{o.x.t, iv(ids), weights.t, true}).ok());
  expect_rejected(MoeRoute{o.half.t, iv(ids), weights.t, true}, kInvalid, "logits must");
  expect_rejected(MoeRoute{o.x.t, iv(ids), few.t, true}, kInvalid, "weights is");
  expect_rejected(MoeRoute{o.x.t, iv(ids), many.t, true}, kInvalid, "weights is");
  expect_rejected(MoeRoute{o.x.t, iv(short_ids), weights.t, true}, kInvalid, "ids is");
  const Tensor w = reshape(o.x.t, 8, 4, 2);
  Tensor w_none = w, w_gaps = w;
  w_none.type = DType::f64;  // no dequantizer
  w_gaps.nb[0] = 8;
  const Host x1 = dense(8, 1, 3, &o.rng), x2 = dense(8, 2, 3, &o.rng), x3 = dense(8, 3, 3, &o.rng);
  const Host dst = dense(4, 2, 3, nullptr), wide = dense(5, 2, 3, nullptr);
  const std::vector<int32_t> e = {0, 1, 1, 1, 0, 0}, e_short = {0, 1};
  ASSERT_TRUE(check(MoeMatmul{w, x1.t, iv(e), dst.t}).ok());
  ASSERT_TRUE(check(MoeMatmul{w, x2.t, iv(e), dst.t}).ok());
  expect_rejected(MoeMatmul{w_none, x1.t, iv(e), dst.t}, kInvalid, "weight type");
  expect_rejected(MoeMatmul{w_gaps, x1.t, iv(e), dst.t}, kInvalid, "w must");
  expect_rejected(MoeMatmul{w, o.half.t, iv(e), dst.t}, kInvalid, "x must be f32");
  expect_rejected(MoeMatmul{w, x3.t, iv(e), dst.t}, kInvalid, "x is");
  expect_rejected(MoeMatmul{w, x1.t, iv(e), wide.t}, kInvalid, "dst is");
  expect_rejected(MoeMatmul{w, x1.t, iv(e_short), dst.t}, kInvalid, "ids is");
  const Host mix = dense(4, 2, 1, &o.rng), mix3 = dense(3, 2, 1, &o.rng), out = dense(8, 2, 1, nullptr);
  Tensor y4 = o.x.t;
  y4.ne = {8, 4, 1, 2};
  ASSERT_TRUE(check(WeightedSum{o.x.t, mix.t, out.t}).ok());
  expect_rejected(WeightedSum{o.half.t, mix.t, out.t}, kInvalid, "y must");
  expect_rejected(WeightedSum{o.x.t, mix3.t, out.t}, kInvalid, "w is");
  expect_rejected(WeightedSum{o.x.t, mix.t, o.small.t}, kInvalid, "dst is");
  expect_rejected(WeightedSum{y4, mix.t, out.t}, kInvalid, "expected 3-d");
  const Host gate_row = dense(1, 4, 2, &o.rng), gate_bad = dense(2, 4, 2, &o.rng);
  ASSERT_TRUE(check(GatedAct{gate_row.t, o.x.t, GluKind::glu_kind_sigmoid, o.y.t}).ok());
  expect_rejected(GatedAct{gate_bad.t, o.x.t, GluKind::glu_kind_sigmoid, o.y.t}, kInvalid, "gate is");
}

TEST(OpCheck, InverseCholesky) {
  Rng rng(5);
  const Host a = dense(6, 6, 1, &rng), l = dense(6, 6, 1, nullptr), wide = dense(7, 6, 1, nullptr),
             strided = make_f32(Layout::strided, 6, 6, 1, &rng),
             half = make_weights(DType::f16, 32, 32, 0, rng);
  std::vector<int32_t> status = {0}, two = {0, 0};
  ASSERT_TRUE(check(InverseCholesky{a.t, 0.5, l.t, iv(status)}).ok());
  expect_rejected(InverseCholesky{wide.t, 0.5, l.t, iv(status)}, kInvalid, "a is");
  expect_rejected(InverseCholesky{strided.t, 0.5, l.t, iv(status)}, kInvalid, "a is");
  expect_rejected(InverseCholesky{half.t, 0.5, l.t, iv(status)}, kInvalid, "a must");
  expect_rejected(InverseCholesky{a.t, 0.5, wide.t, iv(status)}, kInvalid, "l is");
  expect_rejected(InverseCholesky{a.t, 0.5, a.t, iv(status)}, kInvalid, "l overlaps");
  expect_rejected(InverseCholesky{a.t, 0.5, l.t, iv(two)}, kInvalid, "status is");
  expect_rejected(InverseCholesky{a.t, -1.0, l.t, iv(status)}, kInvalid, "lambda");
  expect_rejected(InverseCholesky{a.t, std::numeric_limits<double>::quiet_NaN(), l.t, iv(status)}, kInvalid,
                  "lambda");
}

TEST(OpCheck, Collectives) {
  Operands o;
  HostGroup two(2);
  const Collective* g = &two.rank(0);
  Tensor strided = o.x.t;
  strided.nb[1] *= 2;
  const Host wide = dense(16, 4, 1, nullptr), narrow = dense(8, 4, 1, nullptr);
  ASSERT_TRUE(check(AllReduce{o.x.t, o.y.t, g}).ok());
  ASSERT_TRUE(check(AllReduce{o.x.t, o.x.t, g}).ok());
  ASSERT_TRUE(check(AllGather{narrow.t, wide.t, g}).ok());
  expect_rejected(AllReduce{o.x.t, o.small.t, g}, kInvalid, "dst is");
  expect_rejected(AllReduce{o.half.t, o.half.t, g}, kInvalid, "x must be f32");
  expect_rejected(AllReduce{o.x.t, o.y.t, nullptr}, kInvalid, "no group");
  expect_rejected(AllReduce{strided, strided, g}, kInvalid, "x (");
  expect_rejected(AllGather{narrow.t, narrow.t, g}, kInvalid, "dst");
  expect_rejected(AllGather{o.x.t, wide.t, g}, kInvalid, "expected dst");
}

TEST(OpCheck, SumSquares) {
  Operands o;  // x [8, 4, 2]
  const Host sums = dense(8, 1, 1, nullptr), sums3 = dense(8, 3, 1, nullptr),
             narrow = dense(7, 1, 1, nullptr);
  const Host counts = dense(1, 1, 1, nullptr), counts3 = dense(1, 3, 1, nullptr),
             wide = dense(2, 1, 1, nullptr);
  ASSERT_TRUE(check(SumSquares{o.x.t, Tensor{}, sums.t, counts.t}).ok());
  expect_rejected(SumSquares{o.half.t, Tensor{}, sums.t, counts.t}, kInvalid, "x must");
  expect_rejected(SumSquares{o.x.t, Tensor{}, narrow.t, counts.t}, kInvalid, "sums is");
  expect_rejected(SumSquares{o.x.t, Tensor{}, sums.t, wide.t}, kInvalid, "counts is");
  expect_rejected(SumSquares{o.x.t, Tensor{}, sums.t, counts3.t}, kInvalid, "counts is");
  expect_rejected(SumSquares{o.x.t, Tensor{}, sums3.t, counts3.t}, kInvalid, "without ids");
  expect_rejected(SumSquares{o.x.t, Tensor{}, sums.t, o.half.t}, kInvalid, "counts must");
  // The Gram matrix: f32 [8, 8], one matrix only.
  const Host gram = dense(8, 8, 1, nullptr), gram_bad = dense(8, 7, 1, nullptr);
  ASSERT_TRUE(check(SumSquares{o.x.t, Tensor{}, sums.t, counts.t, gram.t}).ok());
  expect_rejected(SumSquares{o.x.t, Tensor{}, sums.t, counts.t, gram_bad.t}, kInvalid, "gram is");
  // The ranges: f32 [1, n_mat].
  const Host amax = dense(1, 1, 1, nullptr);
  ASSERT_TRUE(check(SumSquares{o.x.t, Tensor{}, sums.t, counts.t, Tensor{}, amax.t}).ok());
  expect_rejected(SumSquares{o.x.t, Tensor{}, sums.t, counts.t, Tensor{}, wide.t}, kInvalid, "amax is");
  // Routed: ids [n_used = 4, n_tokens = 2] for x [8, 4 slots, 2 tokens] or [8, 1, 2].
  const std::vector<int32_t> ids = {0, 1, 2, 0, 1, 1, 2, 2}, ids_short = {0, 1, 2};
  const Tensor ids2 = reshape(iv(ids), 4, 2), ids_odd = reshape(iv(ids), 2, 4);
  const Host x1 = dense(8, 1, 2, &o.rng);
  ASSERT_TRUE(check(SumSquares{o.x.t, ids2, sums3.t, counts3.t}).ok());
  ASSERT_TRUE(check(SumSquares{x1.t, ids2, sums3.t, counts3.t}).ok());
  expect_rejected(SumSquares{o.x.t, ids_odd, sums3.t, counts3.t}, kInvalid, "x is");
  expect_rejected(SumSquares{o.x.t, iv(ids_short), sums3.t, counts3.t}, kInvalid, "x is");
  expect_rejected(SumSquares{o.x.t, o.x.t, sums3.t, counts3.t}, kInvalid, "ids must be i32");
  const Host gram3 = dense(8, 8, 1, nullptr);
  expect_rejected(SumSquares{o.x.t, ids2, sums3.t, counts3.t, gram3.t}, kInvalid, "not with ids");
}

TEST(OpCheck, KvWrite) {
  Operands o;  // k, v [8, 4, 2]; pools [8, 4, 2, 3]
  Rng rng(10);
  const Host pool = make_pool(DType::f32, 8, 4, 2, 3, rng), pool_h = make_pool(DType::f16, 8, 4, 2, 3, rng);
  const Host narrow = make_pool(DType::f32, 8, 2, 2, 3, rng);
  Host bf = make_pool(DType::f16, 8, 4, 2, 3, rng);
  bf.t.type = DType::bf16;
  const std::vector<int32_t> slots = {0, 5}, one = {0};
  ASSERT_TRUE(check(KvWrite{o.x.t, o.y.t, pool.t, pool.t, iv(slots)}).ok());
  expect_rejected(KvWrite{o.x.t, o.half.t, pool.t, pool.t, iv(slots)}, kInvalid, "v must");
  expect_rejected(KvWrite{o.x.t, o.small.t, pool.t, pool.t, iv(slots)}, kInvalid, "v is");
  expect_rejected(KvWrite{o.x.t, o.y.t, bf.t, pool.t, iv(slots)}, kInvalid, "k_pool");
  Host q8 = make_pool(DType::f32, 8, 4, 2, 3, rng);  // head_dim 8: no whole q8_0 block
  q8.t.type = DType::q8_0;
  expect_rejected(KvWrite{o.x.t, o.y.t, q8.t, q8.t, iv(slots)}, kInvalid, "not a multiple of its 32-value");
  expect_rejected(KvWrite{o.x.t, o.y.t, pool.t, narrow.t, iv(slots)}, kInvalid, "v_pool");
  expect_rejected(KvWrite{o.x.t, o.y.t, pool.t, pool_h.t, iv(slots)}, kInvalid, "types differ");
  expect_rejected(KvWrite{o.x.t, o.y.t, pool.t, pool.t, iv(one)}, kInvalid, "slots");
  Tensor k4 = o.x.t;
  k4.ne[3] = 2;
  k4.ne[2] = 1;
  expect_rejected(KvWrite{k4, k4, pool.t, pool.t, iv(one)}, kInvalid, "expected 3-d");
}

TEST(OpCheck, Attention) {
  Operands o;  // q [8, 4, 2]; pools [8, 2, 2, 3]: 2 kv heads, block_size 2, 3 blocks
  Rng rng(11);
  const Host pool = make_pool(DType::f32, 8, 2, 2, 3, rng), pool3 = make_pool(DType::f32, 8, 3, 2, 3, rng);
  const std::vector<int32_t> t0 = {0}, t1 = {2, 1};
  const Csr bt = csr({t0, t1});
  const std::vector<int32_t> pos = {1, 3}, seq = {0, 1}, one = {1};
  auto op = [&](auto&&... changes) {
    Attention a{o.x.t,          pool.t, pool.t, iv(pos), iv(seq), iv(bt.indptr),
                iv(bt.indices), 0.35f,  0.0f,   0,       o.y.t};
    (changes(a), ...);
    return Op(a);
  };
  ASSERT_TRUE(check(op()).ok());
  expect_rejected(op([&](Attention& a) { a.q = o.half.t; }), kInvalid, "q must");
  expect_rejected(op([&](Attention& a) { a.dst = o.small.t; }), kInvalid, "dst");
  expect_rejected(op([&](Attention& a) { a.k_pool = a.v_pool = pool3.t; }), kInvalid, "kv heads");
  expect_rejected(op([&](Attention& a) { a.v_pool = pool3.t; }), kInvalid, "v_pool");
  expect_rejected(op([&](Attention& a) { a.positions = iv(one); }), kInvalid, "positions");
  expect_rejected(op([&](Attention& a) { a.seq = iv(one); }), kInvalid, "seq");
  expect_rejected(op([&](Attention& a) { a.bt_indptr = iv(one); }), kInvalid, "bt_indptr");
  expect_rejected(op([&](Attention& a) { a.bt_indices = o.x.t; }), kInvalid, "bt_indices must be i32");
  Tensor no_blocks = pool.t;  // block_size 0: rejected before any position / block_size
  no_blocks.ne[2] = 0;
  no_blocks.nb[3] = 0;
  expect_rejected(op([&](Attention& a) { a.k_pool = a.v_pool = no_blocks; }), kInvalid, "block_size");
  expect_rejected(op([&](Attention& a) { a.window = -1; }), kInvalid, "window");
  expect_rejected(op([&](Attention& a) { a.softcap = -1.0f; }), kInvalid, "softcap");
  const Host pool_h = make_pool(DType::f16, 8, 2, 2, 3, rng);
  expect_rejected(op([&](Attention& a) { a.v_pool = pool_h.t; }), kInvalid, "v_pool is f16");
  Tensor q4 = o.x.t;  // a 4-d q: the kernels read only the first [.., .., ..] slice
  q4.ne[3] = 2;
  q4.ne[2] = 1;
  expect_rejected(op([&](Attention& a) { a.q = a.dst = q4; }), kInvalid, "expected 3-d");
}

// ---- perf: KILN_OPS_PERF=1 ----

// Median wall time of fn() in microseconds over `reps` runs after one warm-up.
double median_us(const std::function<void()>& fn, int reps) {
  fn();
  std::vector<double> t(reps);
  for (double& v : t) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    v = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  }
  std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
  return t[reps / 2];
}

TEST(OpHarness, Perf) {
  const char* env = std::getenv("KILN_OPS_PERF");
  if (env == nullptr || std::string_view(env) != "1") return;
  Rng rng(12);
  std::vector<NamedBackend> timed;  // default options: the thread count a user gets
  for (const Precision precision : {kExact, kFast}) {
    for (const NamedBackend& nb : backends(precision)) {
      // Host-memory backends only: a device backend's time here would be the operands' copies.
      if (!nb.host_visible) continue;
      BackendOptions options = nb.options;
      options.n_threads = 0;
      timed.push_back({nb.name, make_backend(nb.kind, options).value(), true, nb.kind, options});
    }
  }
  for (const NamedBackend& nb : timed) fmt::print("{}: {} threads\n", nb.name, nb.backend->n_threads());
  fmt::print("{:<10} {:<7} {:<34} {:<15} {:>12} {:>12} {:>8}\n", "op", "type", "shape", "back", "backend us",
             "ref us", "ref/back");
  // `run_op` on the timed backends of `precision`.
  auto row = [&](std::string_view op, std::string_view type, const std::string& shape, const Op& run_op,
                 Precision precision = kExact) {
    for (const NamedBackend& nb : timed) {
      if (nb.options.precision != precision || !nb.backend->supports(run_op)) continue;
      const double back = median_us(
          [&] {
            EXPECT_TRUE(nb.backend->run(run_op).ok());
            EXPECT_TRUE(nb.backend->synchronize().ok());
          },
          15);
      const double ref_us = median_us([&] { ref::run(run_op, precision); }, 3);
      fmt::print("{:<10} {:<7} {:<34} {:<15} {:>12.1f} {:>12.1f} {:>8.1f}\n", op, type, shape, nb.name, back,
                 ref_us, ref_us / back);
    }
  };
  // matmul: w [1536, 576] (an FFN down projection of a 576-wide model; k a multiple of 256 for the k-quants).
  for (DType type : kWeightTypes) {
    const Host w = make_weights(type, 1536, 576, 0, rng);
    for (int64_t m : {1, 64}) {
      const Host x = dense(1536, m, 1, &rng), d = dense(576, m, 1, nullptr);
      row("matmul", dtype_name(type), fmt::format("w [1536, 576] x [1536, {}]", m), Matmul{w.t, x.t, d.t});
      if (ops::activation_type(type) != DType::f32) {
        row("matmul", dtype_name(type), fmt::format("w [1536, 576] x [1536, {}] qx", m),
            Matmul{w.t, x.t, d.t}, kFast);
      }
    }
  }
  const Host a = dense(576, 64, 1, &rng), b = dense(576, 64, 1, &rng);
  const Host d = dense(576, 64, 1, nullptr), w = dense(576, 1, 1, &rng);
  const std::string shape = "[576, 64]";
  std::vector<int32_t> ids(64);
  for (int32_t& id : ids) id = rng.integer(0, 4095);
  for (DType type : {DType::f32, DType::f16, DType::q8_0, DType::q4_k, DType::q6_k}) {
    const Host table = make_weights(type, 512, 4096, 0, rng);
    const Host rows = dense(512, 64, 1, nullptr);
    row("get_rows", dtype_name(type), "table [512, 4096] 64 ids", GetRows{table.t, iv(ids), rows.t});
  }
  row("rms_norm", "f32", shape, RmsNorm{a.t, w.t, 1e-6f, false, d.t});
  row("layer_norm", "f32", shape, LayerNorm{a.t, w.t, w.t, 1e-5f, d.t});
  row("softmax", "f32", shape, Softmax{a.t, 1.0f, d.t});
  row("gated_act", "f32", shape, GatedAct{a.t, b.t, GluKind::glu_kind_silu, d.t});
  row("binary", "f32", shape, Binary{a.t, b.t, BinaryKind::binary_kind_add, d.t});
  row("scale", "f32", shape, Scale{a.t, 0.5f, d.t});
  const Host sums = dense(576, 1, 1, nullptr), counts = dense(1, 1, 1, nullptr);
  row("sum_squares", "f32", shape, SumSquares{a.t, Tensor{}, sums.t, counts.t});
  std::vector<int32_t> best(1);
  const Host logits = dense(49152, 1, 1, &rng);
  row("argmax", "f32", "[49152, 1]", Argmax{logits.t, iv(best)});
  // sample: 8 rows of temperature 0.8, top_p 0.95, repetition penalty 1.1 over 64 tokens, no top-k (top-p
  // sees the whole row): logits flat (uniform in [-1, 1]: top-p keeps most of the row) and peaked (x 12).
  {
    Host many = dense(49152, 8, 1, &rng);
    std::vector<int32_t> words, adjust_words, out(2 * 8);
    for (int32_t r = 0; r < 8; ++r) {
      SampleRow p;
      p.temperature = 0.8f, p.top_p = 0.95f, p.repeat_penalty = 1.1f, p.counter = static_cast<uint32_t>(r);
      p.adjust_begin = 64 * r, p.adjust_count = 64;
      const auto* pw = reinterpret_cast<const int32_t*>(&p);
      words.insert(words.end(), pw, pw + 16);
      for (int32_t j = 0; j < 64; ++j) {
        const SampleAdjust e{j * 700 + r, 0.0f, 1, 0};
        const auto* ew = reinterpret_cast<const int32_t*>(&e);
        adjust_words.insert(adjust_words.end(), ew, ew + 4);
      }
    }
    Tensor rows_t = iv(words), adjust_t = iv(adjust_words), out_t = iv(out);
    rows_t.ne = {16, 8, 1, 1}, rows_t.nb = {4, 64, 512, 512};
    adjust_t.ne = {4, 512, 1, 1}, adjust_t.nb = {4, 16, 8192, 8192};
    out_t.ne = {2, 8, 1, 1}, out_t.nb = {4, 8, 64, 64};
    row("sample", "f32", "[49152, 8] top-p, flat", Sample{many.t, rows_t, adjust_t, out_t, Tensor{}});
    for (int64_t r = 0; r < 8; ++r) {
      auto* xr = reinterpret_cast<float*>(many.t.flat_row(r));
      for (int64_t i = 0; i < 49152; ++i) xr[i] *= 12.0f;
    }
    row("sample", "f32", "[49152, 8] top-p, peaked", Sample{many.t, rows_t, adjust_t, out_t, Tensor{}});
    // The same rows, each with a mask that allows one token in four (a grammar's).
    std::vector<int32_t> masks(1536 * 8);
    for (size_t j = 0; j < masks.size(); ++j) masks[j] = static_cast<int32_t>(0x11111111u << (j % 4));
    for (int32_t r = 0; r < 8; ++r)
      words[static_cast<size_t>(16 * r) + offsetof(SampleRow, mask_row) / 4] = r;
    Tensor mask_t = iv(masks);
    mask_t.ne = {1536, 8, 1, 1}, mask_t.nb = {4, 6144, 6144 * 8, 6144 * 8};
    row("sample", "f32", "[49152, 8] top-p, peaked, masked", Sample{many.t, rows_t, adjust_t, out_t, mask_t});
  }
  // Attention: 9 heads / 3 KV heads, head_dim 64, one sequence of 512 positions in blocks of 16.
  const Host q = dense(64, 9, 64, &rng), o = dense(64, 9, 64, nullptr);
  std::vector<int32_t> pos(64), seq(64, 0), table(32), slots(64);
  std::iota(table.begin(), table.end(), 0);
  std::iota(pos.begin(), pos.end(), 448);
  std::iota(slots.begin(), slots.end(), 448);
  const Csr bt = csr({table});
  RopeParams p;
  p.n_rot = 64;
  p.layout = RopeLayout::rope_layout_neox;
  row("rope", "f32", "[64, 9, 64] neox", Rope{q.t, iv(pos), p, {}, o.t});
  for (DType type : {DType::f32, DType::f16, DType::q8_0, DType::q8_64}) {
    const Host k_pool = make_pool(type, 64, 3, 16, 32, rng), v_pool = make_pool(type, 64, 3, 16, 32, rng);
    const Host kv = dense(64, 3, 64, &rng);
    row("kv_write", dtype_name(type), "[64, 3, 64] into [64, 3, 16, 32]",
        KvWrite{kv.t, kv.t, k_pool.t, v_pool.t, iv(slots)});
    // The last n positions of the 512 as n query tokens: a decode step, a chunk, the whole causal prefill;
    // exact and tiled (qx). Then a decode step and a chunk over 4,096 positions.
    const Host k_long = make_pool(type, 64, 3, 16, 256, rng), v_long = make_pool(type, 64, 3, 16, 256, rng);
    std::vector<int32_t> long_table(256);
    std::iota(long_table.begin(), long_table.end(), 0);
    const Csr long_bt = csr({long_table});
    for (const int64_t len : {512, 4096}) {
      std::vector<int32_t> all_pos(len);
      std::iota(all_pos.begin(), all_pos.end(), 0);
      const Tensor& kp = len == 512 ? k_pool.t : k_long.t;
      const Tensor& vp = len == 512 ? v_pool.t : v_long.t;
      const Csr& bts = len == 512 ? bt : long_bt;
      for (int64_t n : {1, 64, 512}) {
        if (len > 512 && n == 512) continue;
        const Host qn = dense(64, 9, n, &rng), on = dense(64, 9, n, nullptr);
        const std::vector<int32_t> pn(all_pos.end() - n, all_pos.end()), sn(n, 0);
        for (bool qx : {false, true}) {
          row("attention", dtype_name(type),
              fmt::format("9/3 heads x 64, {} tokens, {} pos{}", n, len, qx ? " qx" : ""),
              Attention{qn.t, kp, vp, iv(pn), iv(sn), iv(bts.indptr), iv(bts.indices), 0.125f, 0.0f, 0, on.t},
              precision_of(qx));
        }
      }
    }
  }
}

}  // namespace
}  // namespace kiln
