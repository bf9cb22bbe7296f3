// The packer: each group of kPackRows rows is unpacked by the level's own unpack_w (every type's quants as
// bytes, its scale and offset per 16 elements as f32), and those are written in the packed layout. Every
// scale is checked to come back bit for bit from what the layout stores (an f16, or the super-block's f16
// times a small integer), so the packed products are the unpacked ones; a tensor with any scale that does not
// (a NaN, say) is not packed.
#include "core/quant/fp_contract_off.h"  // dequantize_packed_row rounds as the reference dequantizers
//
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "backends/cpu/cpu_pack.h"
#include "core/half.h"
#include "core/quant/quant_blocks.h"

namespace kiln::cpu {

PackedWeight::PackedWeight(size_t bytes)
    : data_(static_cast<uint8_t*>(std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64))),
      bytes_(bytes) {}

PackedWeight::~PackedWeight() { std::free(data_); }

const PackedWeight* packed_form(const ops::Weight& w) {
  return w.prepared == nullptr ? nullptr : dynamic_cast<const PackedWeight*>(w.prepared);
}

namespace {

using namespace kiln::quant;

struct Spec {
  int bits;             // bits a packed quant: 2, 4, 5, 6 or 8
  uint32_t scales;      // PackScales
  float c;              // offset of the stored quants (kPackD, kPackK16)
  bool is_signed;       // unpack_w gives int8 quants: stored + 128
  float unit = 1.0f;    // PackedMatrix::unit: unpack_w's scales are unit * the packed ones
  bool levels = false;  // PackedMatrix::levels: unpack_w's int8 quants are IQ4_NL's levels, stored as indices
};

std::optional<Spec> spec_of(DType t) {
  switch (t) {
    case DType::q4_0: return Spec{4, kPackD, -8.0f, false};
    case DType::q4_1: return Spec{4, kPackDM, 0.0f, false};
    case DType::q5_0: return Spec{5, kPackD, -16.0f, false};
    case DType::q5_1: return Spec{5, kPackDM, 0.0f, false};
    case DType::q8_0: return Spec{8, kPackD, -128.0f, true};
    // The 4-bit indices of IQ4_NL's levels (half the bytes of the levels as int8); IQ4_XS's under the block's
    // f16 times its signed 6-bit scale per 32 (s - 32).
    case DType::iq4_nl: return Spec{4, kPackD, -128.0f, true, 1.0f, true};
    case DType::iq4_xs: return Spec{4, kPackK16, -128.0f, true, 1.0f, true};
    // Quants 0..3 at 2 bits, the 4-bit scale and min per 16 as they stand under the block's d and -dmin.
    case DType::q2_k: return Spec{2, kPackKM16, 0.0f, false};
    case DType::q4_k: return Spec{4, kPackK32, 0.0f, false};
    case DType::q5_k: return Spec{5, kPackK32, 0.0f, false};
    case DType::q3_k: return Spec{4, kPackK16, -4.0f, false};  // quants 0..7
    case DType::q6_k: return Spec{6, kPackK16, -32.0f, false};
    // The grid i-quants: int8 values (grid value times sign); a scale per 16 is unit * d * (2s + 1), d the
    // block's f16 (IQ2: d (0.5 + s) / 4; IQ3_XXS: d (0.5 + s) / 2; IQ3_S: d (1 + 2s); IQ1: d (2s + 1) / 8,
    // its shift folded into the quants).
    case DType::iq2_xxs:
    case DType::iq2_xs:
    case DType::iq2_s:
    case DType::iq1_s:
    case DType::iq1_m: return Spec{8, kPackK16, -128.0f, true, 0.125f};
    case DType::iq3_xxs: return Spec{8, kPackK16, -128.0f, true, 0.25f};
    case DType::iq3_s: return Spec{8, kPackK16, -128.0f, true, 1.0f};
    default: return std::nullopt;  // float types: the packed float layout
  }
}

// The index of each int8 value among IQ4_NL's levels; -1 where it is none.
const std::array<int8_t, 256>& level_index() {
  static const std::array<int8_t, 256> index = [] {
    std::array<int8_t, 256> a;
    a.fill(-1);
    for (int i = 0; i < 16; ++i) a[static_cast<uint8_t>(kIQ4NLValues[i])] = static_cast<int8_t>(i);
    return a;
  }();
  return index;
}

// The f16 scale of grid i-quant block b (IQ1_M: from the top nibbles of its four scale words).
uint16_t iq_header(DType t, const uint8_t* row, int64_t b) {
  switch (t) {
    case DType::iq2_xxs: return load_block<BlockIQ2_XXS>(row, b).d;
    case DType::iq2_xs: return load_block<BlockIQ2_XS>(row, b).d;
    case DType::iq2_s: return load_block<BlockIQ2_S>(row, b).d;
    case DType::iq3_xxs: return load_block<BlockIQ3_XXS>(row, b).d;
    case DType::iq3_s: return load_block<BlockIQ3_S>(row, b).d;
    case DType::iq1_s: return load_block<BlockIQ1_S>(row, b).d;
    default: {
      uint16_t sc[4];
      std::memcpy(sc, load_block<BlockIQ1_M>(row, b).scales, sizeof(sc));
      return static_cast<uint16_t>((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) |
                                   (sc[3] & 0xF000));
    }
  }
}

// The f16 super-block scale (and negated min scale) of K block b of a row; a grid i-quant's header.
void k_header(DType t, const uint8_t* row, int64_t b, uint16_t* d, uint16_t* neg_dmin) {
  *neg_dmin = 0;
  switch (t) {
    case DType::q2_k: {
      const auto blk = load_block<BlockQ2_K>(row, b);
      *d = blk.d, *neg_dmin = blk.dmin ^ 0x8000;
      break;
    }
    case DType::q4_k: {
      const auto blk = load_block<BlockQ4_K>(row, b);
      *d = blk.d, *neg_dmin = blk.dmin ^ 0x8000;
      break;
    }
    case DType::q5_k: {
      const auto blk = load_block<BlockQ5_K>(row, b);
      *d = blk.d, *neg_dmin = blk.dmin ^ 0x8000;
      break;
    }
    case DType::q3_k: *d = load_block<BlockQ3_K>(row, b).d; break;
    case DType::q6_k: *d = load_block<BlockQ6_K>(row, b).d; break;
    case DType::iq4_xs: *d = load_block<BlockIQ4_XS>(row, b).d; break;
    default: *d = iq_header(t, row, b);
  }
}

// The f16 that holds v exactly, if there is one.
bool exact_f16(float v, uint16_t* h) {
  *h = f32_to_f16(v);
  return f16_to_f32(*h) == v;
}

// The integer i in [lo, hi] with base * i == v exactly (f32), if there is one.
bool exact_multiple(float v, float base, int lo, int hi, int* i) {
  if (base == 0.0f) {
    *i = 0;
    return v == 0.0f;
  }
  const float r = std::nearbyint(v / base);
  if (!(r >= static_cast<float>(lo) && r <= static_cast<float>(hi))) return false;
  *i = static_cast<int>(r);
  return base * static_cast<float>(*i) == v;
}

// Group g of matrix `mat` into `out` (packed_group_bytes); false if a scale does not fit the layout.
bool pack_group(const CpuKernels& kern, const Tensor& w, int64_t mat, int64_t g, const Spec& sp,
                uint8_t* out) {
  const int64_t k = w.ne[0], n = w.ne[1], kp = (k + kKPad - 1) / kKPad * kKPad, n_sub = k / kSub;
  thread_local std::vector<uint8_t> q;
  thread_local std::vector<float> d, m;
  q.resize(static_cast<size_t>(kPackRows * kp));
  d.resize(static_cast<size_t>(kPackRows * kp / 4));
  m.resize(static_cast<size_t>(kPackRows * kp / 16));
  const uint8_t* rows[kPackRows];
  bool valid[kPackRows];
  for (int r = 0; r < kPackRows; ++r) {
    const int64_t j = g * kPackRows + r;
    valid[r] = j < n;
    rows[r] = w.row(std::min(j, n - 1), mat);
  }
  for (int r0 = 0; r0 < kPackRows; r0 += kTileRows) {
    kern.unpack_w(static_cast<uint32_t>(w.type), rows + r0, k, q.data() + r0 * kp, d.data() + r0 * kp / 4,
                  m.data() + r0 * kp / 16);
  }
  const bool k_quant = packed_has_header(sp.scales);
  const int64_t scale_bytes = sp.scales == kPackDM ? 64 : 32, quant_bytes = packed_quant_bytes(sp.bits);
  uint8_t* p = out;
  for (int64_t s0 = 0; s0 < n_sub; s0 += kPackChunk) {
    const int64_t ns = std::min(kPackChunk, n_sub - s0);
    float hd[kPackRows] = {}, hm[kPackRows] = {};
    if (k_quant) {
      auto* h = reinterpret_cast<uint16_t*>(p);
      std::memset(p, 0, 64);
      for (int r = 0; r < kPackRows; ++r) {
        if (!valid[r]) continue;
        k_header(w.type, rows[r], s0 / kPackChunk, &h[r], &h[16 + r]);
        hd[r] = f16_to_f32(h[r]);
        hm[r] = f16_to_f32(h[16 + r]);
      }
      p += 64;
    }
    const int64_t span = (ns * scale_bytes + 63) / 64 * 64 + ns * quant_bytes;
    std::memset(p, 0, static_cast<size_t>(std::max<int64_t>(span, 0)));
    for (int64_t i = 0; i < ns; ++i) {
      const int64_t s = s0 + i;
      uint8_t* sc = p + packed_scale_offset(i, scale_bytes, quant_bytes);
      for (int r = 0; r < kPackRows; ++r) {
        if (!valid[r]) continue;
        const float d_lo = d[r * kp / 4 + s * 8], d_hi = d[r * kp / 4 + s * 8 + 4];
        const float m_lo = m[r * kp / 16 + 2 * s], m_hi = m[r * kp / 16 + 2 * s + 1];
        uint16_t h0, h1;
        int i0, i1, j0, j1;
        switch (sp.scales) {
          case kPackD:
            if (d_lo != d_hi || !exact_f16(d_lo, &h0)) return false;
            if (m_lo != m_hi || m_lo != (sp.is_signed ? 0.0f : sp.c * d_lo)) return false;
            std::memcpy(sc + 2 * r, &h0, 2);
            break;
          case kPackDM:
            if (d_lo != d_hi || m_lo != m_hi || !exact_f16(d_lo, &h0) || !exact_f16(m_lo, &h1)) return false;
            std::memcpy(sc + 2 * r, &h0, 2);
            std::memcpy(sc + 32 + 2 * r, &h1, 2);
            break;
          case kPackK32:
            if (d_lo != d_hi || m_lo != m_hi || !exact_multiple(d_lo, hd[r], 0, 255, &i0) ||
                !exact_multiple(m_lo, hm[r], 0, 255, &i1)) {
              return false;
            }
            sc[r] = static_cast<uint8_t>(i0);
            sc[16 + r] = static_cast<uint8_t>(i1);
            break;
          case kPackKM16:
            if (!exact_multiple(d_lo, hd[r], 0, 15, &i0) || !exact_multiple(d_hi, hd[r], 0, 15, &i1) ||
                !exact_multiple(m_lo, hm[r], 0, 15, &j0) || !exact_multiple(m_hi, hm[r], 0, 15, &j1)) {
              return false;
            }
            sc[r] = static_cast<uint8_t>(i0 | j0 << 4);
            sc[16 + r] = static_cast<uint8_t>(i1 | j1 << 4);
            break;
          default:  // kPackK16
            // d / unit: exact (a power of two), as the kernels' final multiply by unit is.
            if (!exact_multiple(d_lo / sp.unit, hd[r], -128, 127, &i0) ||
                !exact_multiple(d_hi / sp.unit, hd[r], -128, 127, &i1) ||
                m_lo != (sp.is_signed ? 0.0f : sp.c * d_lo) || m_hi != (sp.is_signed ? 0.0f : sp.c * d_hi)) {
              return false;
            }
            sc[r] = static_cast<uint8_t>(static_cast<int8_t>(i0));
            sc[16 + r] = static_cast<uint8_t>(static_cast<int8_t>(i1));
        }
      }
    }
    // 4 bytes at a time: piece pc of row r is 4 consecutive quants (under 8 bits: their low nibbles, and the
    // 4 of the other half in the high nibbles; the bits above in the planes after the pieces; 2 bits: 4 runs
    // of 4 quants each).
    const uint32_t flip = sp.is_signed ? 0x80808080u : 0u;
    const uint32_t over = sp.bits == 8 ? 0u : 0x01010101u * static_cast<uint32_t>(0xFF << sp.bits & 0xFF);
    for (int64_t i = 0; i < ns; ++i) {
      uint8_t* qs = p + packed_quant_offset(i, scale_bytes, quant_bytes);
      const int64_t e0 = (s0 + i) * kSub;
      for (int r = 0; r < kPackRows; ++r) {
        if (!valid[r]) continue;
        const uint8_t* qr = q.data() + r * kp + e0;
        uint8_t index[kSub];
        if (sp.levels) {
          for (int e = 0; e < kSub; ++e) {
            const int8_t at = level_index()[qr[e]];
            if (at < 0) return false;
            index[e] = static_cast<uint8_t>(at);
          }
          qr = index;
        }
        if (sp.bits == 2) {
          for (int pc = 0; pc < 2; ++pc) {
            uint32_t v = 0;
            for (int t = 0; t < 4; ++t) {
              uint32_t run;
              std::memcpy(&run, qr + 4 * (2 * t + pc), 4);
              if ((run & over) != 0) return false;
              v |= run << 2 * t;
            }
            std::memcpy(qs + pc * 64 + r * 4, &v, 4);
          }
          continue;
        }
        for (int pc = 0; pc < (sp.bits == 8 ? 8 : 4); ++pc) {
          uint32_t v;
          std::memcpy(&v, qr + 4 * pc, 4);
          if (sp.bits < 8) {
            uint32_t hi;
            std::memcpy(&hi, qr + 16 + 4 * pc, 4);
            if (((v | hi) & over) != 0) return false;
            const uint32_t top_v = v >> 4 & 0x0F0F0F0Fu, top_hi = hi >> 4 & 0x0F0F0F0Fu;
            v = (v & 0x0F0F0F0Fu) | (hi & 0x0F0F0F0Fu) << 4;
            uint32_t plane[2] = {};
            if (sp.bits == 5) {
              std::memcpy(&plane[0], qs + 256 + r * 4, 4);
              plane[0] |= top_v << pc | top_hi << (4 + pc);
              std::memcpy(qs + 256 + r * 4, &plane[0], 4);
            } else if (sp.bits == 6) {
              std::memcpy(plane, qs + 256 + r * 4, 4);
              std::memcpy(plane + 1, qs + 320 + r * 4, 4);
              plane[0] |= top_v << 2 * pc;
              plane[1] |= top_hi << 2 * pc;
              std::memcpy(qs + 256 + r * 4, &plane[0], 4);
              std::memcpy(qs + 320 + r * 4, &plane[1], 4);
            }
          } else {
            v ^= flip;
          }
          std::memcpy(qs + pc * 64 + r * 4, &v, 4);
        }
      }
    }
    p += span;
  }
  return true;
}

// Tells `read_done` of the rows of each packed item (item i: group i % groups of matrix i / groups), in runs
// of contiguous bytes of at least kRun (and what is left at the end). Items come in increasing order, one
// thread's run of them per reporter. Nothing is told for a tensor whose rows are not contiguous.
class ReadReporter {
 public:
  ReadReporter(const Tensor& w, int64_t groups, const std::function<void(const void*, size_t)>& read_done)
      : w_(w), groups_(groups), read_done_(read_done) {}
  ReadReporter(const ReadReporter&) = delete;
  ReadReporter& operator=(const ReadReporter&) = delete;
  ~ReadReporter() { flush(); }

  void done(int64_t item) {
    if (!read_done_ || w_.nb[1] != w_.row_bytes()) return;
    const int64_t mat = item / groups_, r0 = item % groups_ * kPackRows;
    const int64_t r1 = std::min<int64_t>(r0 + kPackRows, w_.ne[1]);
    const uint8_t* lo = w_.row(r0, mat);
    if (lo != hi_) flush();
    if (lo_ == nullptr) lo_ = lo;
    hi_ = w_.row(r1 - 1, mat) + w_.row_bytes();
    if (hi_ - lo_ >= kRun) flush();
  }

 private:
  static constexpr int64_t kRun = int64_t{4} << 20;
  void flush() {
    if (lo_ != nullptr && hi_ > lo_) read_done_(lo_, static_cast<size_t>(hi_ - lo_));
    lo_ = hi_ = nullptr;
  }
  const Tensor& w_;
  int64_t groups_;
  const std::function<void(const void*, size_t)>& read_done_;
  const uint8_t *lo_ = nullptr, *hi_ = nullptr;
};

// Group g of an f8_e4m3 matrix `mat` into `out` (packed_f8_group_bytes): codes [k][kPackRows], then each
// block's scale times 256 [k / 32][kPackRows]; rows past n zero.
void pack_f8_group(const Tensor& w, int64_t mat, int64_t g, int64_t group_bytes, uint8_t* out) {
  const int64_t k = w.ne[0], n = w.ne[1];
  std::memset(out, 0, static_cast<size_t>(group_bytes));
  auto* scales = reinterpret_cast<float*>(out + packed_f8_scales_offset(k));
  for (int64_t r = 0; r < kPackRows && g * kPackRows + r < n; ++r) {
    const uint8_t* src = w.row(g * kPackRows + r, mat);
    for (int64_t b = 0; b < k / quant::kQK; ++b) {
      const auto blk = quant::load_block<quant::BlockF8E4M3>(src, b);
      scales[b * kPackRows + r] = blk.d * 256.0f;
      for (int e = 0; e < quant::kQK; ++e) out[(b * quant::kQK + e) * kPackRows + r] = blk.q[e];
    }
  }
}

// Group g of float matrix `mat` into `out` (group_bytes): [k][kPackRows] elements, rows past n zero.
void pack_float_group(const Tensor& w, int64_t mat, int64_t g, int64_t group_bytes, uint8_t* out) {
  if (w.type == DType::f8_e4m3) {
    pack_f8_group(w, mat, g, group_bytes, out);
    return;
  }
  const int64_t k = w.ne[0], n = w.ne[1], es = static_cast<int64_t>(dtype_info(w.type).type_size);
  std::memset(out, 0, static_cast<size_t>(group_bytes));
  for (int64_t r = 0; r < kPackRows && g * kPackRows + r < n; ++r) {
    const uint8_t* src = w.row(g * kPackRows + r, mat);
    uint8_t* dst = out + r * es;
    if (es == 2) {
      for (int64_t i = 0; i < k; ++i) std::memcpy(dst + i * kPackRows * 2, src + 2 * i, 2);
    } else {
      for (int64_t i = 0; i < k; ++i) std::memcpy(dst + i * kPackRows * 4, src + 4 * i, 4);
    }
  }
}

// `w` [k, n, n_mats] of f32 / f16 / bf16 in the packed float layout, a group per item of `pool`'s threads.
std::unique_ptr<PackedWeight> pack_float_weight(ThreadPool& pool, const Tensor& w,
                                                const std::function<void(const void*, size_t)>& read_done) {
  const int64_t k = w.ne[0], n = w.ne[1], n_mats = w.ne[2];
  const int64_t groups = (n + kPackRows - 1) / kPackRows;
  const int64_t group_bytes =
      w.type == DType::f8_e4m3
          ? packed_f8_group_bytes(k)
          : packed_float_group_bytes(k, static_cast<int64_t>(dtype_info(w.type).type_size));
  auto pw = std::make_unique<PackedWeight>(static_cast<size_t>(groups * group_bytes * n_mats));
  if (pw->data() == nullptr) return nullptr;
  for (int64_t a = 0; a < n_mats; ++a) {
    pw->fmats.push_back(
        {pw->data() + a * groups * group_bytes, k, n, group_bytes, static_cast<uint32_t>(w.type)});
  }
  pool.parallel_for(groups * n_mats, [&](int64_t i0, int64_t i1, int) {
    ReadReporter report(w, groups, read_done);
    for (int64_t i = i0; i < i1; ++i) {
      pack_float_group(w, i / groups, i % groups, group_bytes, pw->data() + i * group_bytes);
      report.done(i);
    }
  });
  return pw;
}

}  // namespace

std::unique_ptr<PackedWeight> pack_weight(ThreadPool& pool, const CpuKernels& kern, const Tensor& w,
                                          const std::function<void(const void*, size_t)>& read_done) {
  if (w.ne[3] != 1 || w.ne[1] <= 0 || w.ne[0] <= 0) return nullptr;
  if (w.type == DType::f32 || w.type == DType::f16 || w.type == DType::bf16 || w.type == DType::f8_e4m3) {
    return kern.fdot_packed == nullptr ? nullptr : pack_float_weight(pool, w, read_done);
  }
  if (kern.qdot_packed == nullptr) return nullptr;
  const std::optional<Spec> sp = spec_of(w.type);
  if (!sp || w.ne[0] % kSub != 0) return nullptr;
  const int64_t k = w.ne[0], n = w.ne[1], n_mats = w.ne[2];
  const int64_t groups = (n + kPackRows - 1) / kPackRows;
  const int64_t group_bytes = packed_group_bytes(k, sp->bits, sp->scales);
  auto pw = std::make_unique<PackedWeight>(static_cast<size_t>(groups * group_bytes * n_mats));
  if (pw->data() == nullptr) return nullptr;
  for (int64_t a = 0; a < n_mats; ++a) {
    pw->mats.push_back({pw->data() + a * groups * group_bytes, k, n, group_bytes, sp->bits, sp->scales, sp->c,
                        sp->is_signed, sp->unit, sp->levels});
  }
  std::atomic<bool> ok{true};
  pool.parallel_for(groups * n_mats, [&](int64_t i0, int64_t i1, int) {
    ReadReporter report(w, groups, read_done);
    for (int64_t i = i0; i < i1 && ok.load(std::memory_order_relaxed); ++i) {
      const int64_t a = i / groups, g = i % groups;
      if (!pack_group(kern, w, a, g, *sp, pw->data() + (a * groups + g) * group_bytes)) ok = false;
      report.done(i);
    }
  });
  return ok ? std::move(pw) : nullptr;
}

void dequantize_packed_row(const PackedMatrix& w, int64_t j, float* out) {
  const bool k_quant = packed_has_header(w.scales);
  const int64_t scale_bytes = w.scales == kPackDM ? 64 : 32, quant_bytes = packed_quant_bytes(w.bits),
                n_sub = w.k / kSub;
  const int r = static_cast<int>(j % kPackRows);
  const uint8_t* p = w.data + j / kPackRows * w.group_bytes;
  const auto f16_at = [](const uint8_t* at) {
    uint16_t h;
    std::memcpy(&h, at, 2);
    return f16_to_f32(h);
  };
  for (int64_t s0 = 0; s0 < n_sub; s0 += kPackChunk) {
    const int64_t ns = std::min(kPackChunk, n_sub - s0);
    float hd = 0.0f, hm = 0.0f;
    if (k_quant) {
      hd = f16_at(p + 2 * r);
      hm = f16_at(p + 32 + 2 * r);
      p += 64;
    }
    const uint8_t* base = p;
    p += (ns * scale_bytes + 63) / 64 * 64 + ns * quant_bytes;
    for (int64_t i = 0; i < ns; ++i) {
      const uint8_t* sc = base + packed_scale_offset(i, scale_bytes, quant_bytes);
      const uint8_t* qs = base + packed_quant_offset(i, scale_bytes, quant_bytes);
      int q[kSub];
      for (int e = 0; e < kSub; ++e) {
        const int pc = e % 16 / 4, b = e % 4;
        if (w.bits == 8) {
          q[e] = qs[(e / 4) * 64 + r * 4 + b];
          continue;
        }
        if (w.bits == 2) {
          q[e] = qs[(e / 4) % 2 * 64 + r * 4 + b] >> 2 * (e / 8) & 3;
          continue;
        }
        q[e] = (qs[pc * 64 + r * 4 + b] >> (e < 16 ? 0 : 4)) & 0x0F;
        if (w.levels) q[e] = kIQ4NLValues[q[e]] + 128;
        if (w.bits == 5) q[e] |= (qs[256 + r * 4 + b] >> (e / 4) & 1) << 4;
        if (w.bits == 6) q[e] |= (qs[(e < 16 ? 256 : 320) + r * 4 + b] >> 2 * pc & 3) << 4;
      }
      float* y = out + (s0 + i) * kSub;
      const int c = static_cast<int>(w.c);
      switch (w.scales) {
        case kPackD: {
          const float d = f16_at(sc + 2 * r);
          for (int e = 0; e < kSub; ++e) y[e] = static_cast<float>(q[e] + c) * d;
          break;
        }
        case kPackDM: {
          const float d = f16_at(sc + 2 * r), m = f16_at(sc + 32 + 2 * r);
          for (int e = 0; e < kSub; ++e) y[e] = static_cast<float>(q[e]) * d + m;
          break;
        }
        case kPackK32: {
          const float dl = hd * static_cast<float>(sc[r]), ml = hm * static_cast<float>(sc[16 + r]);
          for (int e = 0; e < kSub; ++e) y[e] = dl * static_cast<float>(q[e]) + ml;
          break;
        }
        case kPackKM16: {
          for (int e = 0; e < kSub; ++e) {
            const int sm = sc[e < 16 ? r : 16 + r];
            const float dl = hd * static_cast<float>(sm & 0x0F), ml = hm * static_cast<float>(sm >> 4);
            y[e] = dl * static_cast<float>(q[e]) + ml;
          }
          break;
        }
        default: {  // kPackK16
          for (int e = 0; e < kSub; ++e) {
            const float dl = hd * static_cast<float>(static_cast<int8_t>(sc[e < 16 ? r : 16 + r]));
            y[e] = dl * static_cast<float>(q[e] + c) * w.unit;
          }
        }
      }
    }
  }
}

void packed_float_row(const PackedFloatMatrix& w, int64_t j, float* out) {
  const uint8_t* p = w.data + j / kPackRows * w.group_bytes;
  const int64_t r = j % kPackRows;
  if (w.type == static_cast<uint32_t>(DType::f32)) {
    for (int64_t i = 0; i < w.k; ++i) std::memcpy(out + i, p + (i * kPackRows + r) * 4, 4);
    return;
  }
  if (w.type == static_cast<uint32_t>(DType::f8_e4m3)) {  // scale * value, as the reference dequantizes
    const auto* scales = reinterpret_cast<const float*>(p + packed_f8_scales_offset(w.k));
    for (int64_t i = 0; i < w.k; ++i) {
      out[i] = scales[i / quant::kQK * kPackRows + r] / 256.0f * f8_e4m3_to_f32(p[i * kPackRows + r]);
    }
    return;
  }
  const bool f16 = w.type == static_cast<uint32_t>(DType::f16);
  for (int64_t i = 0; i < w.k; ++i) {
    uint16_t h;
    std::memcpy(&h, p + (i * kPackRows + r) * 2, 2);
    out[i] = f16 ? f16_to_f32(h) : bf16_to_f32(h);
  }
}

}  // namespace kiln::cpu
