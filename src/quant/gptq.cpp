// GPTQ over GGUF blocks (gptq.h): the Hessian's inverse factor, the blocks' level grids, the column loop.
#include "quant/gptq.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <type_traits>

#include "backends/backend.h"
#include "backends/cpu/cpu_linalg.h"
#include "core/half.h"
#include "core/quant/quant_blocks.h"
#include "core/thread_pool.h"

namespace kiln {
namespace {

using quant::kQK;
using quant::kQK_K;
using quant::load_block;
using quant::store_block;

constexpr int kMaxBlock = kQK_K;   // the largest block of a supported type
constexpr int kDampRetries = 3;    // lambda raised tenfold at most this many times
constexpr int64_t kTileRows = 16;  // rows rounded together: each row of U is read once per tile

// --- the levels a block decodes ---------------------------------------------------------------------------

// Element e of a block decodes to scale * (q - zero) + offset, q in [lo, hi], in the float operations of the
// type's dequantizer (core/quant); or, with a table (IQ4_NL, IQ4_XS), to scale * table[q], q in [0, 15]. A
// scale of 0 decodes every q alike; q0 is then the one written.
struct Level {
  float scale = 0.0f;
  float offset = 0.0f;
  int zero = 0;
  int lo = 0, hi = 0;
  int q0 = 0;
  const int8_t* table = nullptr;  // [16]
  bool e4m3 = false;              // f8_e4m3: scale * e4m3fn(q), q the 8-bit code
};

// The level of value x: the nearest decodable value (ties to even; in a table, to the lower index), and its
// decoded value.
int nearest_level(const Level& l, float x, float* decoded) {
  if (l.e4m3) {
    // The nearest e4m3fn value of x / scale (ties to even), beyond 448 the largest (core/half.h), decoded as
    // the dequantizer does (quant_float.cpp: d * e4m3fn(q) in f32). A scale of 0 (an all-zero block) is 0.
    const uint8_t code = l.scale != 0.0f ? f32_to_f8_e4m3(x / l.scale) : uint8_t{0};
    *decoded = l.scale * f8_e4m3_to_f32(code);
    return code;
  }
  int q = l.q0;
  if (l.table != nullptr) {
    if (l.scale != 0.0f) {
      float best = INFINITY;
      for (int k = 0; k < 16; ++k) {
        const float dist = std::fabs(x - l.scale * static_cast<float>(l.table[k]));
        if (dist < best) {
          best = dist;
          q = k;
        }
      }
    }
    *decoded = l.scale * static_cast<float>(l.table[q]);
    return q;
  }
  if (l.scale != 0.0f) {
    float v = (x - l.offset) / l.scale;  // finite x, non-zero finite scale: v may be +-inf, not NaN
    v = std::clamp(v, static_cast<float>(l.lo - l.zero), static_cast<float>(l.hi - l.zero));
    q = static_cast<int>(std::nearbyint(v)) + l.zero;
  }
  *decoded = l.scale * static_cast<float>(q - l.zero) + l.offset;
  return q;
}

// A type's blocks as GPTQ uses them: the level grid of each element once the block's parameters are chosen,
// and the block written back with the levels GPTQ picked.
struct Codec {
  int block;  // elements per block
  void (*levels)(const uint8_t* block, Level* out /* [block] */);
  void (*pack)(uint8_t* block, const int* q /* [block] */);  // keeps the parameters, replaces the levels
  // A block whose scale is `scale` (GptqOptions::row_scales), its levels to be packed; null where the type's
  // scale cannot be given.
  void (*pin_scale)(uint8_t* block, float scale);
};

// Q4_0's nibble layout (element j: low nibble of qs[j], j + 16: high nibble of qs[j]); qs starts zeroed.
void put_nibble(uint8_t* qs, int j, int q) {
  if (j < kQK / 2) {
    qs[j] = static_cast<uint8_t>(qs[j] | (q & 0x0F));
  } else {
    qs[j - kQK / 2] = static_cast<uint8_t>(qs[j - kQK / 2] | ((q & 0x0F) << 4));
  }
}

template <class Block>
constexpr bool kIsQ8 = std::is_same_v<Block, quant::BlockQ8_0>;
template <class Block>
constexpr int kLegacyMax = kIsQ8<Block> ? 127 : (requires(Block b) { b.qh; } ? 31 : 15);

// Legacy blocks: Q8_0 y = q * d (q in [-127, 127]); Q4_0 / Q5_0 y = (q - 8 or 16) * d; Q4_1 / Q5_1 y = q * d
// + m.
template <class Block>
void legacy_levels(const uint8_t* p, Level* out) {
  const auto b = load_block<Block>(p, 0);
  Level l;
  l.scale = f16_to_f32(b.d);
  l.hi = kLegacyMax<Block>;
  if constexpr (kIsQ8<Block>) {
    l.lo = -127;
  } else if constexpr (requires { b.m; }) {
    l.offset = f16_to_f32(b.m);
  } else {
    l.zero = l.q0 = (kLegacyMax<Block> + 1) / 2;
  }
  std::fill(out, out + kQK, l);
}

template <class Block>
void legacy_pack(uint8_t* p, const int* q) {
  auto b = load_block<Block>(p, 0);
  if constexpr (kIsQ8<Block>) {
    for (int j = 0; j < kQK; ++j) b.qs[j] = static_cast<int8_t>(q[j]);
  } else {
    std::memset(b.qs, 0, sizeof b.qs);
    for (int j = 0; j < kQK; ++j) put_nibble(b.qs, j, q[j]);
    if constexpr (requires { b.qh; }) {
      std::memset(b.qh, 0, sizeof b.qh);
      for (int j = 0; j < kQK; ++j)
        b.qh[j / 8] = static_cast<uint8_t>(b.qh[j / 8] | (((q[j] >> 4) & 1) << (j % 8)));
    }
  }
  store_block(p, 0, b);
}

// Q2_K / Q3_K: the 2-bit field of element e at bits 2 * ((e % 128) / 32) of qs[(e / 128) * 32 + e % 32].
void put_two_bits(uint8_t* qs, int e, int q) {
  uint8_t& byte = qs[(e / 128) * 32 + e % 32];
  byte = static_cast<uint8_t>(byte | ((q & 3) << (2 * ((e % 128) / 32))));
}

// Q2_K: y = (d * sc) * q - (dmin * m), q in [0, 3], sc and m the 4-bit codes of sub-block e / 16.
void q2_k_levels(const uint8_t* p, Level* out) {
  const auto b = load_block<quant::BlockQ2_K>(p, 0);
  for (int e = 0; e < kQK_K; ++e) {
    const uint8_t code = b.scales[e / 16];
    out[e] = Level{f16_to_f32(b.d) * static_cast<float>(code & 0x0F),
                   -(f16_to_f32(b.dmin) * static_cast<float>(code >> 4)),
                   0,
                   0,
                   3,
                   0};
  }
}
void q2_k_pack(uint8_t* p, const int* q) {
  auto b = load_block<quant::BlockQ2_K>(p, 0);
  std::memset(b.qs, 0, sizeof b.qs);
  for (int e = 0; e < kQK_K; ++e) put_two_bits(b.qs, e, q[e]);
  store_block(p, 0, b);
}

// Q3_K: y = (d * sc) * (q - 4), q in [0, 7] (the low 2 bits in qs, bit 2 in hmask), sc the signed 6-bit code.
void q3_k_levels(const uint8_t* p, Level* out) {
  const auto b = load_block<quant::BlockQ3_K>(p, 0);
  for (int e = 0; e < kQK_K; ++e) {
    const int s = e / 16;
    const int low = (b.scales[s % 8] >> (4 * (s / 8))) & 0x0F;
    const int high = (b.scales[8 + s % 4] >> (2 * (s / 4))) & 0x03;
    out[e] = Level{f16_to_f32(b.d) * static_cast<float>((low | (high << 4)) - 32), 0.0f, 4, 0, 7, 4};
  }
}
void q3_k_pack(uint8_t* p, const int* q) {
  auto b = load_block<quant::BlockQ3_K>(p, 0);
  std::memset(b.qs, 0, sizeof b.qs);
  std::memset(b.hmask, 0, sizeof b.hmask);
  for (int e = 0; e < kQK_K; ++e) {
    put_two_bits(b.qs, e, q[e]);
    b.hmask[e % 32] = static_cast<uint8_t>(b.hmask[e % 32] | (((q[e] >> 2) & 1) << (e / 32)));
  }
  store_block(p, 0, b);
}

// Q4_K / Q5_K: y = (d * sc) * q - (dmin * m), sc and m the 6-bit codes of sub-block e / 32 (quant_blocks.h).
template <class Block>
void q45_k_levels(const uint8_t* p, Level* out) {
  const auto b = load_block<Block>(p, 0);
  constexpr int kMax = std::is_same_v<Block, quant::BlockQ5_K> ? 31 : 15;
  for (int e = 0; e < kQK_K; ++e) {
    const int s = e / 32;
    int sc, m;
    if (s < 4) {
      sc = b.scales[s] & 63;
      m = b.scales[s + 4] & 63;
    } else {
      sc = (b.scales[s + 4] & 0x0F) | ((b.scales[s - 4] >> 6) << 4);
      m = (b.scales[s + 4] >> 4) | ((b.scales[s] >> 6) << 4);
    }
    out[e] = Level{f16_to_f32(b.d) * static_cast<float>(sc),
                   -(f16_to_f32(b.dmin) * static_cast<float>(m)),
                   0,
                   0,
                   kMax,
                   0};
  }
}
template <class Block>
void q45_k_pack(uint8_t* p, const int* q) {
  auto b = load_block<Block>(p, 0);
  std::memset(b.qs, 0, sizeof b.qs);
  if constexpr (requires { b.qh; }) std::memset(b.qh, 0, sizeof b.qh);
  for (int e = 0; e < kQK_K; ++e) {
    uint8_t& byte = b.qs[(e / 64) * 32 + e % 32];
    byte = static_cast<uint8_t>(byte | ((q[e] & 0x0F) << ((e / 32) % 2 == 0 ? 0 : 4)));
    if constexpr (requires { b.qh; })
      b.qh[e % 32] = static_cast<uint8_t>(b.qh[e % 32] | (((q[e] >> 4) & 1) << (e / 32)));
  }
  store_block(p, 0, b);
}

// Q6_K: y = (d * sc) * (q - 32), q in [0, 63], sc the signed 8-bit code of sub-block e / 16.
void q6_k_levels(const uint8_t* p, Level* out) {
  const auto b = load_block<quant::BlockQ6_K>(p, 0);
  for (int e = 0; e < kQK_K; ++e)
    out[e] = Level{f16_to_f32(b.d) * static_cast<float>(b.scales[e / 16]), 0.0f, 32, 0, 63, 32};
}
void q6_k_pack(uint8_t* p, const int* q) {
  auto b = load_block<quant::BlockQ6_K>(p, 0);
  std::memset(b.ql, 0, sizeof b.ql);
  std::memset(b.qh, 0, sizeof b.qh);
  for (int e = 0; e < kQK_K; ++e) {
    const int h = e / 128, k = (e % 128) / 32, l = e % 32;
    uint8_t& ql = b.ql[h * 64 + (k % 2) * 32 + l];
    ql = static_cast<uint8_t>(ql | ((q[e] & 0x0F) << (4 * (k / 2))));
    uint8_t& qh = b.qh[h * 32 + l];
    qh = static_cast<uint8_t>(qh | (((q[e] >> 4) & 3) << (2 * k)));
  }
  store_block(p, 0, b);
}

// IQ4_NL: y = d * kIQ4NLValues[q]; IQ4_XS: y = (d * (scale6[s] - 32)) * kIQ4NLValues[q] for sub-block s = e /
// 32 (quant_blocks.h). q0 = 8, the level nearest 0, as the row quantizer writes for a zero scale.
constexpr int kIq4ZeroIndex = 8;
void iq4_nl_levels(const uint8_t* p, Level* out) {
  const auto b = load_block<quant::BlockIQ4_NL>(p, 0);
  Level l;
  l.scale = f16_to_f32(b.d);
  l.q0 = kIq4ZeroIndex;
  l.table = quant::kIQ4NLValues;
  std::fill(out, out + kQK, l);
}
void iq4_nl_pack(uint8_t* p, const int* q) {
  auto b = load_block<quant::BlockIQ4_NL>(p, 0);
  std::memset(b.qs, 0, sizeof b.qs);
  for (int j = 0; j < kQK; ++j) put_nibble(b.qs, j, q[j]);
  store_block(p, 0, b);
}
void iq4_xs_levels(const uint8_t* p, Level* out) {
  const auto b = load_block<quant::BlockIQ4_XS>(p, 0);
  const float d = f16_to_f32(b.d);
  for (int e = 0; e < kQK_K; ++e) {
    const int s = e / kQK;
    const int low = (b.scales_l[s / 2] >> (4 * (s % 2))) & 0x0F;
    const int high = (b.scales_h >> (2 * s)) & 0x03;
    Level l;
    l.scale = d * static_cast<float>((low | (high << 4)) - 32);
    l.q0 = kIq4ZeroIndex;
    l.table = quant::kIQ4NLValues;
    out[e] = l;
  }
}
void iq4_xs_pack(uint8_t* p, const int* q) {
  auto b = load_block<quant::BlockIQ4_XS>(p, 0);
  std::memset(b.qs, 0, sizeof b.qs);
  for (int e = 0; e < kQK_K; ++e) put_nibble(b.qs + (e / kQK) * (kQK / 2), e % kQK, q[e]);
  store_block(p, 0, b);
}

// f8_e4m3 (kiln's FP8 blocks, quant_blocks.h): y = d * e4m3fn(q[j]), d an f32 scale.
void f8_e4m3_levels(const uint8_t* p, Level* out) {
  const auto b = load_block<quant::BlockF8E4M3>(p, 0);
  Level l;
  l.scale = b.d;
  l.e4m3 = true;
  std::fill(out, out + kQK, l);
}
void f8_e4m3_pack(uint8_t* p, const int* q) {
  auto b = load_block<quant::BlockF8E4M3>(p, 0);
  for (int j = 0; j < kQK; ++j) b.q[j] = static_cast<uint8_t>(q[j]);
  store_block(p, 0, b);
}
void f8_e4m3_pin_scale(uint8_t* p, float scale) {
  quant::BlockF8E4M3 b{};
  b.d = scale;
  store_block(p, 0, b);
}

const Codec* codec_of(DType type) {
  static const Codec q8_0{kQK, legacy_levels<quant::BlockQ8_0>, legacy_pack<quant::BlockQ8_0>, nullptr};
  static const Codec q4_0{kQK, legacy_levels<quant::BlockQ4_0>, legacy_pack<quant::BlockQ4_0>, nullptr};
  static const Codec q4_1{kQK, legacy_levels<quant::BlockQ4_1>, legacy_pack<quant::BlockQ4_1>, nullptr};
  static const Codec q5_0{kQK, legacy_levels<quant::BlockQ5_0>, legacy_pack<quant::BlockQ5_0>, nullptr};
  static const Codec q5_1{kQK, legacy_levels<quant::BlockQ5_1>, legacy_pack<quant::BlockQ5_1>, nullptr};
  static const Codec q2_k{kQK_K, q2_k_levels, q2_k_pack, nullptr};
  static const Codec q3_k{kQK_K, q3_k_levels, q3_k_pack, nullptr};
  static const Codec q4_k{kQK_K, q45_k_levels<quant::BlockQ4_K>, q45_k_pack<quant::BlockQ4_K>, nullptr};
  static const Codec q5_k{kQK_K, q45_k_levels<quant::BlockQ5_K>, q45_k_pack<quant::BlockQ5_K>, nullptr};
  static const Codec q6_k{kQK_K, q6_k_levels, q6_k_pack, nullptr};
  static const Codec iq4_nl{kQK, iq4_nl_levels, iq4_nl_pack, nullptr};
  static const Codec iq4_xs{kQK_K, iq4_xs_levels, iq4_xs_pack, nullptr};
  static const Codec f8_e4m3{kQK, f8_e4m3_levels, f8_e4m3_pack, f8_e4m3_pin_scale};
  switch (type) {
    case DType::q8_0: return &q8_0;
    case DType::q4_0: return &q4_0;
    case DType::q4_1: return &q4_1;
    case DType::q5_0: return &q5_0;
    case DType::q5_1: return &q5_1;
    case DType::q2_k: return &q2_k;
    case DType::q3_k: return &q3_k;
    case DType::q4_k: return &q4_k;
    case DType::q5_k: return &q5_k;
    case DType::q6_k: return &q6_k;
    case DType::iq4_nl: return &iq4_nl;
    case DType::iq4_xs: return &iq4_xs;
    case DType::f8_e4m3: return &f8_e4m3;
    default: return nullptr;
  }
}

// --- the inverse Hessian's factor -------------------------------------------------------------------------

// The checked Hessian, permuted (hp[i][j] = H[perm[i]][perm[j]], full), zero diagonal entries set to 1, and
// lambda = damp * mean(diag hp).
struct Permuted {
  std::vector<float> hp;
  double lambda = 0.0;
};
Result<Permuted> permuted_hessian(const float* hessian, int64_t n, const std::vector<int64_t>& perm,
                                  double damp) {
  if (!(damp >= 0.0) || !std::isfinite(damp)) return invalid_argument("gptq: damp {} is not >= 0", damp);
  Permuted out;
  out.hp.resize(static_cast<size_t>(n * n));
  double diag_sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const int64_t a = std::max(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
      const int64_t b = std::min(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
      const float x = hessian[a * n + b];
      if (!std::isfinite(x)) return invalid_argument("gptq: hessian[{}][{}] is {}, not finite", a, b, x);
      if (a == b && x < 0.0f)
        return invalid_argument("gptq: hessian[{}][{}] is {} < 0: not positive semi-definite", a, a, x);
      out.hp[static_cast<size_t>(i * n + j)] = a == b && x == 0.0f ? 1.0f : x;
    }
    diag_sum += out.hp[static_cast<size_t>(i * n + i)];
  }
  out.lambda = damp * diag_sum / static_cast<double>(n);
  return out;
}

// Tries `factor(lambda)` (true: it succeeded) with lambda as given, then raised tenfold up to kDampRetries
// times; the lambda that succeeded.
template <class Factor>
Result<double> with_retries(int64_t n, double lambda, double damp, Factor&& factor) {
  for (int attempt = 0;; ++attempt) {
    KILN_ASSIGN_OR_RETURN(const bool ok, factor(lambda));
    if (ok) return lambda;
    if (attempt == kDampRetries || lambda == 0.0) {
      return make_status(StatusCode::out_of_range,
                         "gptq: the hessian [{} x {}] is not positive definite, even with {} added to its "
                         "diagonal (damp {}, raised tenfold {} times)",
                         n, n, lambda, damp, attempt);
    }
    lambda *= 10.0;
  }
}

// The factor on the CPU (backends/cpu/cpu_linalg.h).
Result<GptqFactor> factor_permuted(const float* hessian, int64_t n, const std::vector<int64_t>& perm,
                                   double damp, ThreadPool* pool) {
  KILN_ASSIGN_OR_RETURN(const Permuted p, permuted_hessian(hessian, n, perm, damp));
  GptqFactor f;
  f.u.resize(static_cast<size_t>(n * n));
  KILN_ASSIGN_OR_RETURN(f.lambda, with_retries(n, p.lambda, damp, [&](double lambda) -> Result<bool> {
                          return cpu_linalg::inverse_cholesky_upper(p.hp.data(), n, lambda, pool, f.u.data());
                        }));
  return f;
}

// The column order: identity, or (act_order) blocks by decreasing sum of diag(H), columns in a block by
// decreasing H[j][j]; ties keep the file's order.
std::vector<int64_t> column_order(const float* hessian, int64_t n, int block, bool act_order) {
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  if (!act_order) return perm;
  const auto diag = [&](int64_t j) { return static_cast<double>(hessian[j * n + j]); };
  const int64_t nb = n / block;
  std::vector<int64_t> blocks(static_cast<size_t>(nb));
  std::vector<double> sums(static_cast<size_t>(nb), 0.0);
  for (int64_t b = 0; b < nb; ++b) {
    blocks[static_cast<size_t>(b)] = b;
    for (int64_t j = b * block; j < (b + 1) * block; ++j) sums[static_cast<size_t>(b)] += diag(j);
  }
  std::stable_sort(blocks.begin(), blocks.end(), [&](int64_t a, int64_t b) {
    return sums[static_cast<size_t>(a)] > sums[static_cast<size_t>(b)];
  });
  for (int64_t c = 0; c < nb; ++c) {
    auto first = perm.begin() + c * block;
    std::iota(first, first + block, blocks[static_cast<size_t>(c)] * block);
    std::stable_sort(first, first + block, [&](int64_t a, int64_t b) { return diag(a) > diag(b); });
  }
  return perm;
}

// --- the column loop --------------------------------------------------------------------------------------

struct Job {
  const float* w;                    // [n_rows][n]
  int64_t n_rows, n;                 // rows, columns
  const float* importance;           // [n]: diag(H) in the file's order
  const std::vector<int64_t>* perm;  // [n]: position p rounds column perm[p]
  const DTypeInfo* info;
  const Codec* codec;
  uint8_t* dst;  // [n_rows][row_bytes]
  int64_t row_bytes;
  const float* row_scales;  // [n_rows]: every block's scale in row r (GptqOptions::row_scales), or null

  // Row r's value at position p as rounding starts: its weight, or 0 where no input reached the column
  // (H[c][c] = 0).
  float start(int64_t r, int64_t p) const {
    const int64_t c = (*perm)[static_cast<size_t>(p)];
    return importance[c] == 0.0f ? 0.0f : w[r * n + c];
  }
};

// The block state of a tile of rows: the current block's levels, the levels picked, its bytes.
struct TileBlocks {
  std::vector<Level> levels;    // [nr][bs]
  std::vector<int> q;           // [nr][bs], element order
  std::vector<uint8_t> blocks;  // [nr][type_size]
  TileBlocks(const Job& j, int64_t nr)
      : levels(static_cast<size_t>(nr * j.codec->block)),
        q(static_cast<size_t>(nr * j.codec->block)),
        blocks(static_cast<size_t>(nr * j.info->type_size)) {}
};

// Positions [i1, i2) of rows [r0, r0 + nr): row r's current value at position p is w[r * ldw + p - w0] (every
// position of a block that starts in [i1, i2) is there), U[p][k] is u[(p - u0) * ldu + k - u0] for p <= k in
// [i1, i2). Each position is rounded and its scaled error fed into the later positions of [i1, i2) (the
// caller applies it to those after i2) and written to err[r * lde + p - i1]; each block is chosen at its
// first position and written to dst after its last.
void round_positions(const Job& j, int64_t r0, int64_t nr, int64_t i1, int64_t i2, float* w, int64_t ldw,
                     int64_t w0, const float* u, int64_t ldu, int64_t u0, float* err, int64_t lde,
                     TileBlocks& t) {
  const int bs = j.codec->block;
  const int64_t type_size = j.info->type_size;
  const std::vector<int64_t>& perm = *j.perm;
  float x[kMaxBlock];
  for (int64_t p = i1; p < i2; ++p) {
    const int64_t col = perm[static_cast<size_t>(p)];
    const int64_t first = col / bs * bs;  // the block's first column in the file
    const int e = static_cast<int>(col - first);
    if (p % bs == 0) {
      // The block's parameters from its columns' current values.
      for (int64_t r = 0; r < nr; ++r) {
        for (int64_t k = p; k < p + bs; ++k) x[perm[static_cast<size_t>(k)] - first] = w[r * ldw + k - w0];
        uint8_t* blk = &t.blocks[static_cast<size_t>(r * type_size)];
        if (j.row_scales != nullptr) {
          j.codec->pin_scale(blk, j.row_scales[r0 + r]);
        } else if (j.info->quantize_rows != nullptr) {
          j.info->quantize_rows(x, blk, 1, bs, j.importance + first);
        } else {
          j.info->quantize_row(x, blk, bs);  // f8_e4m3: the block's absmax / 448
        }
        j.codec->levels(blk, &t.levels[static_cast<size_t>(r * bs)]);
      }
    }
    const float* up = u + (p - u0) * ldu - u0;  // up[k] = U[p][k]
    for (int64_t r = 0; r < nr; ++r) {
      float* wr = w + r * ldw - w0;  // wr[k]: position k
      float decoded;
      t.q[static_cast<size_t>(r * bs + e)] =
          nearest_level(t.levels[static_cast<size_t>(r * bs + e)], wr[p], &decoded);
      const float e_scaled = (wr[p] - decoded) / up[p];
      err[r * lde + (p - i1)] = e_scaled;
      for (int64_t k = p + 1; k < i2; ++k) wr[k] -= e_scaled * up[k];
    }
    if (p % bs == bs - 1) {
      for (int64_t r = 0; r < nr; ++r) {
        uint8_t* blk = &t.blocks[static_cast<size_t>(r * type_size)];
        j.codec->pack(blk, &t.q[static_cast<size_t>(r * bs)]);
        std::memcpy(j.dst + (r0 + r) * j.row_bytes + first / bs * type_size, blk,
                    static_cast<size_t>(type_size));
      }
    }
  }
}

// On the CPU: rows [r0, r0 + nr) (nr <= kTileRows), all positions, in batches of kGptqBatch, each batch's
// errors fed into the later positions by one product (the lazy update).
void gptq_tile(const Job& j, const float* u, int64_t r0, int64_t nr) {
  const int64_t n = j.n;
  std::vector<float> w(static_cast<size_t>(nr * n));  // [nr][n] current values, position order
  for (int64_t r = 0; r < nr; ++r) {
    for (int64_t p = 0; p < n; ++p) w[static_cast<size_t>(r * n + p)] = j.start(r0 + r, p);
  }
  std::vector<float> err(static_cast<size_t>(nr * kGptqBatch));  // [nr][batch]: scaled errors
  TileBlocks t(j, nr);
  for (int64_t i1 = 0; i1 < n; i1 += kGptqBatch) {
    const int64_t i2 = std::min(n, i1 + kGptqBatch);
    round_positions(j, r0, nr, i1, i2, w.data(), n, 0, u, n, 0, err.data(), kGptqBatch, t);
    cpu_linalg::subtract_product(w.data(), n, nr, err.data(), kGptqBatch, i2 - i1, u + i1 * n, n, i2, n);
  }
}

void for_tiles(ThreadPool* pool, int64_t n_rows, const std::function<void(int64_t, int64_t)>& tile) {
  const auto tiles = [&](int64_t begin, int64_t end, int) {
    for (int64_t r = begin; r < end; r += kTileRows) tile(r, std::min(kTileRows, end - r));
  };
  if (pool != nullptr) {
    pool->parallel_dynamic(n_rows, kTileRows, tiles);
  } else {
    tiles(0, n_rows, 0);
  }
}

// On a backend (GptqOptions::backend): the factor by ops::InverseCholesky, the weights W^T ([n][n_rows],
// position p in row p) in its memory, and per batch of kDeviceBatch positions: their rows and the factor's
// rows downloaded, the batch rounded here, its errors E uploaded and fed into the later positions by
// W^T[i2:] += L[i2:, i1:i2] (-E)^T (a Matmul, then a Binary add in place). Batches of 256 hold every block
// whole, so a block's parameters are chosen on values this side has.
constexpr int64_t kDeviceBatch = 256;
static_assert(kDeviceBatch % kMaxBlock == 0);

Status gptq_on_backend(const Job& j, const Permuted& p, double damp, Backend& b, ThreadPool* pool) {
  const int64_t n = j.n, rows = j.n_rows, nn = n * n;
  const auto alloc = [&](size_t bytes) { return b.allocate(std::max<size_t>(bytes, 4)); };
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> l_buf, alloc(static_cast<size_t>(nn) * 4));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> status_buf, alloc(4));
  const Tensor l = make_tensor(DType::f32, *l_buf, 0, n, n),
               status = make_tensor(DType::i32, *status_buf, 0, 1);
  {
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> a_buf, alloc(static_cast<size_t>(nn) * 4));
    const Tensor a = make_tensor(DType::f32, *a_buf, 0, n, n);
    KILN_TRY(b.upload(a, p.hp.data(), static_cast<size_t>(nn) * 4));
    const auto factor = [&](double lambda) -> Result<bool> {
      int32_t code = -1;
      KILN_TRY(b.run(ops::InverseCholesky{a, lambda, l, status}));
      KILN_TRY(b.download(&code, status, 4));
      KILN_TRY(b.synchronize());
      return code == 0;
    };
    const Result<double> lambda = with_retries(n, p.lambda, damp, factor);
    if (!lambda.ok()) return lambda.status();
  }
  // W^T in position order, the product's result, the batch's errors.
  if (rows == 0) return Status::ok_status();
  std::vector<float> host(static_cast<size_t>(n * rows));
  const auto transpose = [&](int64_t p0, int64_t p1, int) {
    for (int64_t pos = p0; pos < p1; ++pos) {
      for (int64_t r = 0; r < rows; ++r) host[static_cast<size_t>(pos * rows + r)] = j.start(r, pos);
    }
  };
  if (pool != nullptr) {
    pool->parallel_dynamic(n, 64, transpose);
  } else {
    transpose(0, n, 0);
  }
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> wt_buf, alloc(host.size() * 4));
  const Tensor wt = make_tensor(DType::f32, *wt_buf, 0, rows, n);
  KILN_TRY(b.upload(wt, host.data(), host.size() * 4));
  KILN_TRY(b.synchronize());  // the upload has read `host` (Backend: transfers may complete later)
  host = {};
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> prod_buf, alloc(static_cast<size_t>(rows * n) * 4));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> e_buf, alloc(static_cast<size_t>(rows * kDeviceBatch) * 4));
  std::vector<float> wb(static_cast<size_t>(kDeviceBatch * rows));          // the batch's rows of W^T
  std::vector<float> lb(static_cast<size_t>(kDeviceBatch * n));             // the batch's rows of L
  std::vector<float> ub(static_cast<size_t>(kDeviceBatch * kDeviceBatch));  // U within the batch
  std::vector<float> err(static_cast<size_t>(rows * kDeviceBatch));         // [rows][batch]
  for (int64_t i1 = 0; i1 < n; i1 += kDeviceBatch) {
    const int64_t i2 = std::min(n, i1 + kDeviceBatch), nb = i2 - i1;
    Tensor wt_rows = make_tensor(DType::f32, *wt_buf, static_cast<size_t>(i1 * rows) * 4, rows, nb);
    Tensor l_rows = make_tensor(DType::f32, *l_buf, static_cast<size_t>(i1 * n) * 4, n, nb);
    KILN_TRY(b.download(wb.data(), wt_rows, static_cast<size_t>(nb * rows) * 4));
    KILN_TRY(b.download(lb.data(), l_rows, static_cast<size_t>(nb * n) * 4));
    KILN_TRY(b.synchronize());
    for (int64_t q = 0; q < nb; ++q) {  // U[i1 + q][i1 + k] = L[i1 + k][i1 + q]
      for (int64_t k = 0; k < nb; ++k)
        ub[static_cast<size_t>(q * kDeviceBatch + k)] =
            k < q ? 0.0f : lb[static_cast<size_t>(k * n + i1 + q)];
    }
    for_tiles(pool, rows, [&](int64_t r0, int64_t nr) {
      std::vector<float> w(static_cast<size_t>(nr * kDeviceBatch));
      for (int64_t r = 0; r < nr; ++r) {
        for (int64_t q = 0; q < nb; ++q)
          w[static_cast<size_t>(r * kDeviceBatch + q)] = wb[static_cast<size_t>(q * rows + r0 + r)];
      }
      TileBlocks t(j, nr);
      round_positions(j, r0, nr, i1, i2, w.data(), kDeviceBatch, i1, ub.data(), kDeviceBatch, i1,
                      err.data() + r0 * kDeviceBatch, kDeviceBatch, t);
    });
    if (i2 == n) break;
    for (float& e : err) e = -e;
    const Tensor e_all = make_tensor(DType::f32, *e_buf, 0, kDeviceBatch, rows);
    KILN_TRY(b.upload(e_all, err.data(), err.size() * 4));
    Tensor e = e_all;  // [nb, rows], rows kDeviceBatch apart
    e.ne[0] = nb;
    Tensor lx = make_tensor(DType::f32, *l_buf, static_cast<size_t>(i2 * n + i1) * 4, nb, n - i2);
    lx.nb[1] = n * 4;
    lx.nb[2] = lx.nb[3] = lx.nb[1] * (n - i2);
    const Tensor prod = make_tensor(DType::f32, *prod_buf, 0, rows, n - i2);
    const Tensor later = make_tensor(DType::f32, *wt_buf, static_cast<size_t>(i2 * rows) * 4, rows, n - i2);
    KILN_TRY(b.run(ops::Matmul{ops::Weight(e), lx, prod}));
    KILN_TRY(b.run(ops::Binary{later, ops::Weight(prod), ops::BinaryKind::binary_kind_add, later}));
  }
  return b.synchronize();
}

}  // namespace

bool gptq_supports(DType type) { return codec_of(type) != nullptr; }

Result<std::unique_ptr<Backend>> gptq_device(const std::string& device) {
  std::unique_ptr<Backend> b;
  if (device == "cpu" || (device == "auto" && !cuda_available())) return b;
  BackendOptions bo;
  bo.precision = ops::Precision::precision_exact;
  KILN_ASSIGN_OR_RETURN(b, make_backend(device, bo));
  if (b->host_memory()) b.reset();
  return b;
}

Result<GptqFactor> gptq_factor(const float* hessian, int64_t n, double damp) {
  if (n <= 0) return invalid_argument("gptq: hessian size {} is not positive", n);
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  return factor_permuted(hessian, n, perm, damp, nullptr);
}

Status gptq_quantize(const float* w, int64_t n_rows, int64_t n_per_row, const float* hessian, DType type,
                     const GptqOptions& o, void* dst) {
  const Codec* codec = codec_of(type);
  const DTypeInfo& info = dtype_info(type);
  if (codec == nullptr) {
    return unimplemented(
        "gptq: type {} is not supported (q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, "
        "q5_k, q6_k, iq4_nl, iq4_xs, f8_e4m3 are)",
        info.name);
  }
  if (n_rows < 0) return invalid_argument("gptq: n_rows {} is negative", n_rows);
  if (n_per_row <= 0 || n_per_row % codec->block != 0) {
    return invalid_argument("gptq: rows of {} are not whole blocks of {} ({} values)", n_per_row, info.name,
                            codec->block);
  }
  static_assert(kGptqBatch % kQK == 0 && kQK_K % kGptqBatch == 0,
                "a block starts a batch or lies within one");
  KILN_ASSIGN_OR_RETURN(const int64_t row_bytes, dtype_row_bytes(type, n_per_row));
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t c = 0; c < n_per_row; ++c) {
      const float x = w[r * n_per_row + c];
      if (!std::isfinite(x)) return invalid_argument("gptq: weight [{}][{}] is {}, not finite", r, c, x);
    }
  }
  if (o.row_scales != nullptr) {
    if (codec->pin_scale == nullptr)
      return invalid_argument("gptq: row scales are given for f8_e4m3, not {}", info.name);
    for (int64_t r = 0; r < n_rows; ++r) {
      const float d = o.row_scales[r];
      if (!(d > 0.0f) || !std::isfinite(d))
        return invalid_argument("gptq: row scale [{}] is {}, not a finite number > 0", r, d);
    }
  }
  const std::vector<int64_t> perm = column_order(hessian, n_per_row, codec->block, o.act_order);
  std::vector<float> importance(static_cast<size_t>(n_per_row));  // diag(H), the row quantizer's importance
  for (int64_t c = 0; c < n_per_row; ++c) importance[static_cast<size_t>(c)] = hessian[c * n_per_row + c];
  const Job job{w,         n_rows,      n_per_row, importance.data(),
                &perm,     &info,       codec,     static_cast<uint8_t*>(dst),
                row_bytes, o.row_scales};
  if (o.backend != nullptr) {
    KILN_ASSIGN_OR_RETURN(const Permuted p, permuted_hessian(hessian, n_per_row, perm, o.damp));
    return gptq_on_backend(job, p, o.damp, *o.backend, o.pool);
  }
  KILN_ASSIGN_OR_RETURN(const GptqFactor f, factor_permuted(hessian, n_per_row, perm, o.damp, o.pool));
  for_tiles(o.pool, n_rows, [&](int64_t r0, int64_t nr) { gptq_tile(job, f.u.data(), r0, nr); });
  return {};
}

}  // namespace kiln
