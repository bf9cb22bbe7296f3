// GPTQ over GGUF blocks (gptq.h): the Hessian's inverse factor, the blocks' level grids, the column loop.
#include "quant/gptq.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <type_traits>

#include "core/half.h"
#include "core/quant/quant_blocks.h"
#include "core/thread_pool.h"
#include "quant/gptq_linalg.h"

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
};

// The level of value x: the nearest decodable value (ties to even; in a table, to the lower index), and its
// decoded value.
int nearest_level(const Level& l, float x, float* decoded) {
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

const Codec* codec_of(DType type) {
  static const Codec q8_0{kQK, legacy_levels<quant::BlockQ8_0>, legacy_pack<quant::BlockQ8_0>};
  static const Codec q4_0{kQK, legacy_levels<quant::BlockQ4_0>, legacy_pack<quant::BlockQ4_0>};
  static const Codec q4_1{kQK, legacy_levels<quant::BlockQ4_1>, legacy_pack<quant::BlockQ4_1>};
  static const Codec q5_0{kQK, legacy_levels<quant::BlockQ5_0>, legacy_pack<quant::BlockQ5_0>};
  static const Codec q5_1{kQK, legacy_levels<quant::BlockQ5_1>, legacy_pack<quant::BlockQ5_1>};
  static const Codec q2_k{kQK_K, q2_k_levels, q2_k_pack};
  static const Codec q3_k{kQK_K, q3_k_levels, q3_k_pack};
  static const Codec q4_k{kQK_K, q45_k_levels<quant::BlockQ4_K>, q45_k_pack<quant::BlockQ4_K>};
  static const Codec q5_k{kQK_K, q45_k_levels<quant::BlockQ5_K>, q45_k_pack<quant::BlockQ5_K>};
  static const Codec q6_k{kQK_K, q6_k_levels, q6_k_pack};
  static const Codec iq4_nl{kQK, iq4_nl_levels, iq4_nl_pack};
  static const Codec iq4_xs{kQK_K, iq4_xs_levels, iq4_xs_pack};
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
    default: return nullptr;
  }
}

// --- the inverse Hessian's factor -------------------------------------------------------------------------

// hp [n][n] (full, symmetric, finite, diagonal > 0): U upper with U^T U = (hp + lambda I)^-1, or false when
// hp + lambda I is not (numerically) positive definite. With J the order reversal, chol(J (hp + lambda I) J)
// = L gives hp + lambda I = V V^T with V = J L J upper, so (hp + lambda I)^-1 = U^T U with U = V^-1: one
// factorization and one triangular inverse (gptq_linalg.h), in double.
bool inverse_factor(const std::vector<float>& hp, int64_t n, double lambda, ThreadPool* pool,
                    std::vector<float>* u) {
  const int64_t ld = gptq_linalg::padded_ld(n);
  std::vector<double> a(static_cast<size_t>(n * ld), 0.0);  // J (hp + lambda I) J, then L, then V
  for (int64_t i = 0; i < n; ++i) {
    const float* src = &hp[static_cast<size_t>((n - 1 - i) * n)];
    double* dst = &a[static_cast<size_t>(i * ld)];
    for (int64_t j = 0; j <= i; ++j) dst[j] = static_cast<double>(src[n - 1 - j]);
    dst[i] += lambda;
  }
  if (!gptq_linalg::cholesky_lower(a.data(), n, ld, pool)) return false;
  // V[i][j] = L[n-1-i][n-1-j]: the matrix turned half a turn in place (L's lower triangle becomes V's upper).
  for (int64_t i = 0; i <= (n - 1) / 2; ++i) {
    double* top = &a[static_cast<size_t>(i * ld)];
    double* bottom = &a[static_cast<size_t>((n - 1 - i) * ld)];
    const int64_t cols = top == bottom ? n / 2 : n;
    for (int64_t j = 0; j < cols; ++j) std::swap(top[j], bottom[n - 1 - j]);
  }
  u->resize(static_cast<size_t>(n * n));
  return gptq_linalg::upper_inverse(a.data(), n, ld, pool, u->data());
}

// The checked Hessian, permuted (hp[i][j] = H[perm[i]][perm[j]], full), zero diagonal entries set to 1, and
// its factor with the dampening that succeeded.
Result<GptqFactor> factor_permuted(const float* hessian, int64_t n, const std::vector<int64_t>& perm,
                                   double damp, ThreadPool* pool) {
  if (!(damp >= 0.0) || !std::isfinite(damp)) return invalid_argument("gptq: damp {} is not >= 0", damp);
  std::vector<float> hp(static_cast<size_t>(n * n));
  double diag_sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const int64_t a = std::max(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
      const int64_t b = std::min(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
      const float x = hessian[a * n + b];
      if (!std::isfinite(x)) return invalid_argument("gptq: hessian[{}][{}] is {}, not finite", a, b, x);
      if (a == b && x < 0.0f)
        return invalid_argument("gptq: hessian[{}][{}] is {} < 0: not positive semi-definite", a, a, x);
      hp[static_cast<size_t>(i * n + j)] = a == b && x == 0.0f ? 1.0f : x;
    }
    diag_sum += hp[static_cast<size_t>(i * n + i)];
  }
  GptqFactor f;
  f.lambda = damp * diag_sum / static_cast<double>(n);
  for (int attempt = 0;; ++attempt) {
    if (inverse_factor(hp, n, f.lambda, pool, &f.u)) return f;
    if (attempt == kDampRetries || f.lambda == 0.0) {
      return make_status(StatusCode::out_of_range,
                         "gptq: the hessian [{} x {}] is not positive definite, even with {} added to its "
                         "diagonal (damp {}, raised tenfold {} times)",
                         n, n, f.lambda, damp, attempt);
    }
    f.lambda *= 10.0;
  }
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
  int64_t n;                         // columns
  const float* importance;           // [n]: diag(H) in the file's order
  const std::vector<int64_t>* perm;  // [n]: position p rounds column perm[p]
  const std::vector<float>* u;       // [n][n] the factor, in position order
  const DTypeInfo* info;
  const Codec* codec;
  uint8_t* dst;  // [n_rows][row_bytes]
  int64_t row_bytes;
};

// Rows [r0, r0 + nr) (nr <= kTileRows), all columns: GPTQ's loop over positions with lazy batch updates.
void gptq_tile(const Job& j, int64_t r0, int64_t nr) {
  const int64_t n = j.n;
  const int bs = j.codec->block;
  const int64_t type_size = j.info->type_size;
  const std::vector<int64_t>& perm = *j.perm;
  const float* u = j.u->data();
  std::vector<float> w(static_cast<size_t>(nr * n));  // [nr][n] current values, position order
  for (int64_t r = 0; r < nr; ++r) {
    for (int64_t p = 0; p < n; ++p) {
      const int64_t c = perm[static_cast<size_t>(p)];
      // a column no input reached (H[c][c] = 0) has its weight set to 0
      w[static_cast<size_t>(r * n + p)] = j.importance[c] == 0.0f ? 0.0f : j.w[(r0 + r) * n + c];
    }
  }
  std::vector<float> err(static_cast<size_t>(nr * kGptqBatch));  // [nr][batch]: scaled errors
  std::vector<Level> levels(static_cast<size_t>(nr * bs));       // [nr][bs] of the current block
  std::vector<int> q(static_cast<size_t>(nr * bs));              // [nr][bs] levels picked, element order
  std::vector<uint8_t> blocks(static_cast<size_t>(nr * type_size));
  float x[kMaxBlock];
  for (int64_t i1 = 0; i1 < n; i1 += kGptqBatch) {
    const int64_t i2 = std::min(n, i1 + kGptqBatch);
    for (int64_t p = i1; p < i2; ++p) {
      const int64_t col = perm[static_cast<size_t>(p)];
      const int64_t first = col / bs * bs;  // the block's first column in the file
      const int e = static_cast<int>(col - first);
      if (p % bs == 0) {
        // The block's parameters from its columns' current values (positions p .. p + bs - 1 are all up to
        // date here: a block starts a batch or lies within one).
        for (int64_t r = 0; r < nr; ++r) {
          for (int64_t k = p; k < p + bs; ++k)
            x[perm[static_cast<size_t>(k)] - first] = w[static_cast<size_t>(r * n + k)];
          uint8_t* blk = &blocks[static_cast<size_t>(r * type_size)];
          j.info->quantize_rows(x, blk, 1, bs, j.importance + first);
          j.codec->levels(blk, &levels[static_cast<size_t>(r * bs)]);
        }
      }
      const float* up = u + p * n;
      for (int64_t r = 0; r < nr; ++r) {
        float* wr = &w[static_cast<size_t>(r * n)];
        float decoded;
        q[static_cast<size_t>(r * bs + e)] =
            nearest_level(levels[static_cast<size_t>(r * bs + e)], wr[p], &decoded);
        const float e_scaled = (wr[p] - decoded) / up[p];
        err[static_cast<size_t>(r * kGptqBatch + (p - i1))] = e_scaled;
        for (int64_t k = p + 1; k < i2; ++k) wr[k] -= e_scaled * up[k];
      }
      if (p % bs == bs - 1) {
        for (int64_t r = 0; r < nr; ++r) {
          uint8_t* blk = &blocks[static_cast<size_t>(r * type_size)];
          j.codec->pack(blk, &q[static_cast<size_t>(r * bs)]);
          std::memcpy(j.dst + (r0 + r) * j.row_bytes + first / bs * type_size, blk,
                      static_cast<size_t>(type_size));
        }
      }
    }
    // lazy update: the batch's errors into every later position
    gptq_linalg::subtract_product(w.data(), n, nr, err.data(), kGptqBatch, i2 - i1, u + i1 * n, n, i2, n);
  }
}

}  // namespace

bool gptq_supports(DType type) { return codec_of(type) != nullptr; }

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
        "q5_k, q6_k, iq4_nl, iq4_xs are)",
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
  const std::vector<int64_t> perm = column_order(hessian, n_per_row, codec->block, o.act_order);
  KILN_ASSIGN_OR_RETURN(const GptqFactor f, factor_permuted(hessian, n_per_row, perm, o.damp, o.pool));
  std::vector<float> importance(static_cast<size_t>(n_per_row));  // diag(H), the row quantizer's importance
  for (int64_t c = 0; c < n_per_row; ++c) importance[static_cast<size_t>(c)] = hessian[c * n_per_row + c];
  const Job job{w,     n_per_row, importance.data(),          &perm,    &f.u,
                &info, codec,     static_cast<uint8_t*>(dst), row_bytes};
  const auto tiles = [&](int64_t begin, int64_t end, int) {
    for (int64_t r = begin; r < end; r += kTileRows) gptq_tile(job, r, std::min(kTileRows, end - r));
  };
  if (o.pool != nullptr) {
    o.pool->parallel_dynamic(n_rows, kTileRows, tiles);
  } else {
    tiles(0, n_rows, 0);
  }
  return {};
}

}  // namespace kiln
