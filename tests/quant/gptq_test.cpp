// GPTQ (quant/gptq.h) on a synthetic layer whose inputs are strongly correlated: its output error
// ||(W - deq(Q)) X||_F against the row quantizer with importance diag(H) (what `kiln quantize --imatrix`
// does), the same bytes as that quantizer when H = I (no correlation to exploit), the factor's identity, bad
// inputs; f8_e4m3 with a fixed scale per row (FP8 checkpoints) against plain rounding with the same scales.
#include "quant/gptq.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "backends/backend.h"
#include "core/dtype.h"
#include "core/half.h"
#include "core/quant/quant_blocks.h"
#include "core/thread_pool.h"

namespace kiln {
namespace {

constexpr int64_t kRows = 64;       // output features
constexpr int64_t kCols = 512;      // input features (n_per_row)
constexpr int64_t kSamples = 1024;  // calibration inputs
constexpr int64_t kLatent = 64;     // X's columns mix this many latent features, plus noise

struct Layer {
  std::vector<float> w;  // [kRows][kCols]
  std::vector<float> h;  // [kCols][kCols] X^T X
};

// W Gaussian; X = (Z A + 0.1 N) diag(s): Z [kSamples][kLatent], A [kLatent][kCols] and N Gaussian, s_j =
// exp(0.5 g_j), so that X's columns are correlated and of unequal scale.
Layer make_layer(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  Layer l;
  l.w.resize(static_cast<size_t>(kRows * kCols));
  for (float& v : l.w) v = static_cast<float>(normal(rng));
  std::vector<double> a(static_cast<size_t>(kLatent * kCols)), s(static_cast<size_t>(kCols));
  for (double& v : a) v = normal(rng);
  for (double& v : s) v = std::exp(0.5 * normal(rng));
  std::vector<double> x(static_cast<size_t>(kSamples * kCols));  // [kSamples][kCols]
  std::vector<double> z(static_cast<size_t>(kLatent));
  for (int64_t t = 0; t < kSamples; ++t) {
    for (double& v : z) v = normal(rng);
    for (int64_t c = 0; c < kCols; ++c) {
      double v = 0.1 * normal(rng);
      for (int64_t k = 0; k < kLatent; ++k)
        v += z[static_cast<size_t>(k)] * a[static_cast<size_t>(k * kCols + c)];
      x[static_cast<size_t>(t * kCols + c)] = v * s[static_cast<size_t>(c)];
    }
  }
  std::vector<double> h(static_cast<size_t>(kCols * kCols), 0.0);
  for (int64_t t = 0; t < kSamples; ++t) {
    const double* xt = &x[static_cast<size_t>(t * kCols)];
    for (int64_t i = 0; i < kCols; ++i) {
      for (int64_t j = 0; j <= i; ++j) h[static_cast<size_t>(i * kCols + j)] += xt[i] * xt[j];
    }
  }
  l.h.resize(h.size());
  for (int64_t i = 0; i < kCols; ++i) {
    for (int64_t j = 0; j <= i; ++j) {
      const auto v = static_cast<float>(h[static_cast<size_t>(i * kCols + j)]);
      l.h[static_cast<size_t>(i * kCols + j)] = l.h[static_cast<size_t>(j * kCols + i)] = v;
    }
  }
  return l;
}

std::vector<float> identity(int64_t n) {
  std::vector<float> h(static_cast<size_t>(n * n), 0.0f);
  for (int64_t i = 0; i < n; ++i) h[static_cast<size_t>(i * n + i)] = 1.0f;
  return h;
}

// sqrt(sum_r e_r^T H e_r), e = W - deq(q): the layer's output error ||(W - deq) X||_F.
double output_error(const Layer& l, const std::vector<uint8_t>& q, DType type) {
  const DTypeInfo& info = dtype_info(type);
  const int64_t row_bytes = dtype_row_bytes(type, kCols).value();
  std::vector<double> e(static_cast<size_t>(kCols));
  std::vector<float> deq(static_cast<size_t>(kCols));
  double sum = 0.0;
  for (int64_t r = 0; r < kRows; ++r) {
    info.dequantize_row(q.data() + r * row_bytes, deq.data(), kCols);
    for (int64_t c = 0; c < kCols; ++c)
      e[static_cast<size_t>(c)] = l.w[static_cast<size_t>(r * kCols + c)] - deq[static_cast<size_t>(c)];
    for (int64_t i = 0; i < kCols; ++i) {
      double hi = 0.0;
      for (int64_t j = 0; j < kCols; ++j)
        hi += static_cast<double>(l.h[static_cast<size_t>(i * kCols + j)]) * e[static_cast<size_t>(j)];
      sum += e[static_cast<size_t>(i)] * hi;
    }
  }
  return std::sqrt(sum);
}

// The row quantizer with importance diag(H).
std::vector<uint8_t> plain(const Layer& l, DType type) {
  std::vector<float> diag(static_cast<size_t>(kCols));
  for (int64_t c = 0; c < kCols; ++c) diag[static_cast<size_t>(c)] = l.h[static_cast<size_t>(c * kCols + c)];
  std::vector<uint8_t> q(static_cast<size_t>(kRows * dtype_row_bytes(type, kCols).value()));
  dtype_info(type).quantize_rows(l.w.data(), q.data(), kRows, kCols, diag.data());
  return q;
}

std::vector<uint8_t> gptq(const Layer& l, DType type, const GptqOptions& o = {}) {
  std::vector<uint8_t> q(static_cast<size_t>(kRows * dtype_row_bytes(type, kCols).value()));
  const Status s = gptq_quantize(l.w.data(), kRows, kCols, l.h.data(), type, o, q.data());
  EXPECT_TRUE(s.ok()) << s.to_string();
  return q;
}

const Layer& layer() {
  static const Layer l = make_layer(57);
  return l;
}

struct Case {
  DType type;
  double max_ratio;  // GPTQ's output error over the plain quantizer's, at most
};

class GptqTypes : public ::testing::TestWithParam<Case> {};

TEST_P(GptqTypes, BeatsPlainRoundingOnCorrelatedInputs) {
  const Case c = GetParam();
  const Layer& l = layer();
  const double e_plain = output_error(l, plain(l, c.type), c.type);
  const double e_gptq = output_error(l, gptq(l, c.type), c.type);
  GptqOptions act;
  act.act_order = true;
  const double e_act = output_error(l, gptq(l, c.type, act), c.type);
  std::printf("%-5s output error: plain %.4g, gptq %.4g (ratio %.3f), act_order %.4g (ratio %.3f)\n",
              dtype_name(c.type), e_plain, e_gptq, e_gptq / e_plain, e_act, e_act / e_plain);
  EXPECT_LT(e_gptq, c.max_ratio * e_plain);
  EXPECT_LT(e_act, c.max_ratio * e_plain);
}

// With H = I there is nothing to feed forward: each block gets the plain quantizer's parameters and each
// value the nearest level. The K-quants' quantizers end the same way (the bytes are equal); the legacy ones
// keep their search's levels and weigh by the row's mean square rather than the block's (the error is close).
TEST_P(GptqTypes, IdentityHessianMatchesPlainRounding) {
  const DType type = GetParam().type;
  Layer l = layer();
  l.h = identity(kCols);
  const std::vector<uint8_t> p = plain(l, type), g = gptq(l, type);
  const double e_plain = output_error(l, p, type), e_gptq = output_error(l, g, type);
  std::printf("%-5s H = I: plain %.5g, gptq %.5g (ratio %.4f)\n", dtype_name(type), e_plain, e_gptq,
              e_gptq / e_plain);
  // IQ4_XS's quantizer maps values with its block scales before they are rounded to f16: close, not equal.
  if (dtype_info(type).block_size == 256 && type != DType::iq4_xs) {
    EXPECT_EQ(p, g);
  } else {
    EXPECT_LT(e_gptq, 1.01 * e_plain);
    EXPECT_GT(e_gptq, 0.9 * e_plain);
  }
}

// On a backend (GptqOptions::backend; here the CPU's, through the same ops a GPU runs): the factor by
// InverseCholesky, the lazy updates by Matmul and Binary over batches of 256 positions. The same algorithm in
// another summation order: the output error within 1% of the CPU path's, and the rounding the same for most
// weights (a tie broken the other way moves a level, and a K-quant block's later choices with it).
TEST_P(GptqTypes, OnABackendAsOnTheCpu) {
  const DType type = GetParam().type;
  const Layer& l = layer();
  BackendOptions bo;
  bo.n_threads = 3;
  auto backend = make_backend("cpu", bo);
  ASSERT_TRUE(backend.ok()) << backend.status().to_string();
  ThreadPool pool(2);
  for (const bool act_order : {false, true}) {
    GptqOptions cpu, on;
    cpu.act_order = on.act_order = act_order;
    on.backend = backend->get();
    on.pool = &pool;
    const std::vector<uint8_t> a = gptq(l, type, cpu), b = gptq(l, type, on);
    const double ea = output_error(l, a, type), eb = output_error(l, b, type);
    const DTypeInfo& info = dtype_info(type);
    int64_t same = 0, blocks = static_cast<int64_t>(a.size()) / info.type_size;
    for (int64_t i = 0; i < blocks; ++i) {
      same += std::equal(a.begin() + i * info.type_size, a.begin() + (i + 1) * info.type_size,
                         b.begin() + i * info.type_size)
                  ? 1
                  : 0;
    }
    std::printf("%-6s act_order %d: error %.5g on the CPU, %.5g on a backend; %lld of %lld blocks the same\n",
                dtype_name(type), act_order ? 1 : 0, ea, eb, static_cast<long long>(same),
                static_cast<long long>(blocks));
    EXPECT_NEAR(eb / ea, 1.0, 0.01) << dtype_name(type) << " act_order " << act_order;
    EXPECT_GE(same, blocks * 9 / 10) << dtype_name(type) << " act_order " << act_order;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Gptq, GptqTypes,
    // measured (libstdc++'s distributions): 0.26 .. 0.34, q2_k 0.41; act_order 0.15 .. 0.25
    ::testing::Values(Case{DType::q8_0, 0.4}, Case{DType::q4_0, 0.4}, Case{DType::q4_1, 0.4},
                      Case{DType::q5_0, 0.4}, Case{DType::q5_1, 0.4}, Case{DType::q2_k, 0.5},
                      Case{DType::q3_k, 0.4}, Case{DType::q4_k, 0.4}, Case{DType::q5_k, 0.4},
                      Case{DType::q6_k, 0.4}, Case{DType::iq4_nl, 0.4}, Case{DType::iq4_xs, 0.4}),
    [](const auto& p) { return std::string(dtype_name(p.param.type)); });

TEST(Gptq, ThreadsGiveTheSameBytes) {
  ThreadPool pool(3);
  GptqOptions o;
  o.pool = &pool;
  EXPECT_EQ(gptq(layer(), DType::q4_k), gptq(layer(), DType::q4_k, o));
}

// An input that never reached column 7 (H's row and column 7 zero): the weight is dropped, the rest works.
TEST(Gptq, DeadColumn) {
  Layer l = layer();
  for (int64_t i = 0; i < kCols; ++i)
    l.h[static_cast<size_t>(7 * kCols + i)] = l.h[static_cast<size_t>(i * kCols + 7)] = 0.0f;
  const double e_plain = output_error(l, plain(l, DType::q4_0), DType::q4_0);
  const double e_gptq = output_error(l, gptq(l, DType::q4_0), DType::q4_0);
  EXPECT_LT(e_gptq, e_plain);
}

// U upper with U^T U (H + lambda I) = I.
// n = 40: within one of the factor's 64-column blocks; n = 200: blocks, tiles and a partial last block.
TEST(Gptq, FactorInvertsTheDampedHessian) {
  for (const int64_t n : {int64_t{40}, int64_t{200}}) {
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(3 * n * n));
    for (float& v : x) v = normal(rng);
    std::vector<float> h(static_cast<size_t>(n * n), 0.0f);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t t = 0; t < 3 * n; ++t)
          h[static_cast<size_t>(i * n + j)] +=
              x[static_cast<size_t>(t * n + i)] * x[static_cast<size_t>(t * n + j)];
      }
    }
    const Result<GptqFactor> f = gptq_factor(h.data(), n, 0.01);
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    std::vector<double> utu(static_cast<size_t>(n * n), 0.0);  // U^T U
    for (int64_t m = 0; m < n; ++m) {
      for (int64_t i = 0; i < n; ++i) {
        const double umi = f->u[static_cast<size_t>(m * n + i)];
        for (int64_t k = 0; k < n; ++k)
          utu[static_cast<size_t>(i * n + k)] += umi * f->u[static_cast<size_t>(m * n + k)];
      }
    }
    double max_dev = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        if (j < i) {
          EXPECT_EQ(f->u[static_cast<size_t>(i * n + j)], 0.0f);
        }
        double v = 0.0;  // (U^T U (H + lambda I))[i][j]
        for (int64_t k = 0; k < n; ++k)
          v += utu[static_cast<size_t>(i * n + k)] *
               (h[static_cast<size_t>(k * n + j)] + (k == j ? f->lambda : 0.0));
        max_dev = std::max(max_dev, std::fabs(v - (i == j ? 1.0 : 0.0)));
      }
    }
    EXPECT_LT(max_dev, 1e-4) << "n = " << n;
  }
}

Status run(const std::vector<float>& w, int64_t n_rows, int64_t n, const std::vector<float>& h, DType type,
           Backend* backend = nullptr) {
  std::vector<uint8_t> q(static_cast<size_t>(n_rows * n * 4));
  GptqOptions o;
  o.backend = backend;
  return gptq_quantize(w.data(), n_rows, n, h.data(), type, o, q.data());
}

void expect_error(const Status& s, const std::string& needle) {
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.to_string();
}

TEST(Gptq, BadInputs) {
  constexpr int64_t n = 64;
  const std::vector<float> w(static_cast<size_t>(2 * n), 0.5f);
  std::vector<float> h = identity(n);
  EXPECT_TRUE(run(w, 2, n, h, DType::q4_0).ok());

  h[3 * n + 5] = h[5 * n + 3] = NAN;
  expect_error(run(w, 2, n, h, DType::q4_0), "hessian[5][3] is nan");
  h = identity(n);
  h[9 * n + 9] = -1.0f;
  expect_error(run(w, 2, n, h, DType::q4_0), "hessian[9][9] is -1 < 0");
  // On the CPU, and on a backend (InverseCholesky's status read back between the tries).
  auto backend = make_backend("cpu");
  ASSERT_TRUE(backend.ok());
  for (Backend* b : {static_cast<Backend*>(nullptr), backend->get()}) {
    h = identity(n);
    h[1] = h[n] = 50.0f;  // eigenvalue -49: more than three tenfold raises of the dampening cover
    const Status not_pd = run(w, 2, n, h, DType::q4_0, b);
    EXPECT_EQ(not_pd.code(), StatusCode::out_of_range);
    expect_error(not_pd, "not positive definite");
    h = identity(n);
    h[1] = h[n] = 1.5f;  // eigenvalue -0.5: covered once lambda reaches 1 (damp 0.01, raised twice)
    EXPECT_TRUE(run(w, 2, n, h, DType::q4_0, b).ok());
  }

  h = identity(n);
  std::vector<float> w_nan = w;
  w_nan[n + 4] = INFINITY;
  expect_error(run(w_nan, 2, n, h, DType::q4_0), "weight [1][4] is inf");
  expect_error(run(w, 1, 48, identity(48), DType::q4_0), "rows of 48 are not whole blocks of q4_0");
  expect_error(run(w, 2, n, h, DType::q4_k), "rows of 64 are not whole blocks of q4_k");
  const Status s = run(w, 2, n, h, DType::iq3_s);
  EXPECT_EQ(s.code(), StatusCode::unimplemented);
  expect_error(s, "type iq3_s is not supported");
  GptqOptions o;
  o.damp = -1.0;
  std::vector<uint8_t> q(static_cast<size_t>(2 * n * 4));
  expect_error(gptq_quantize(w.data(), 2, n, h.data(), DType::q4_0, o, q.data()), "damp -1 is not >= 0");
}

// --- f8_e4m3 with a fixed scale per row (an FP8 checkpoint's per-channel scale) ------------------------

// Each row's max |w| / 448, as `kiln quantize FOLDER OUT FP8` scales a weight's output channels.
std::vector<float> row_scales(const Layer& l) {
  std::vector<float> s(static_cast<size_t>(kRows));
  for (int64_t r = 0; r < kRows; ++r) {
    float amax = 0.0f;
    for (int64_t c = 0; c < kCols; ++c)
      amax = std::max(amax, std::fabs(l.w[static_cast<size_t>(r * kCols + c)]));
    s[static_cast<size_t>(r)] = amax / kF8E4M3Max;
  }
  return s;
}

// Plain rounding with those scales: every block's d the row's scale, q = e4m3(w / scale) to nearest even.
std::vector<uint8_t> plain_fp8(const Layer& l, const std::vector<float>& scales) {
  std::vector<uint8_t> q(static_cast<size_t>(kRows * dtype_row_bytes(DType::f8_e4m3, kCols).value()));
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t b = 0; b < kCols / quant::kQK; ++b) {
      quant::BlockF8E4M3 blk{};
      blk.d = scales[static_cast<size_t>(r)];
      for (int j = 0; j < quant::kQK; ++j)
        blk.q[j] = f32_to_f8_e4m3(l.w[static_cast<size_t>(r * kCols + b * quant::kQK + j)] / blk.d);
      quant::store_block(q.data(), r * (kCols / quant::kQK) + b, blk);
    }
  }
  return q;
}

std::vector<uint8_t> gptq_fp8(const Layer& l, const std::vector<float>& scales, GptqOptions o = {}) {
  o.row_scales = scales.data();
  return gptq(l, DType::f8_e4m3, o);
}

// Every block of row r has d = scales[r] (bit for bit) and codes that are e4m3fn values, not NaN.
void expect_on_the_grid(const std::vector<uint8_t>& q, const std::vector<float>& scales) {
  int64_t bad = 0;
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t b = 0; b < kCols / quant::kQK; ++b) {
      const auto blk = quant::load_block<quant::BlockF8E4M3>(q.data(), r * (kCols / quant::kQK) + b);
      EXPECT_EQ(std::bit_cast<uint32_t>(blk.d), std::bit_cast<uint32_t>(scales[static_cast<size_t>(r)]))
          << "row " << r << " block " << b;
      for (const uint8_t c : blk.q) bad += (c & 0x7f) == 0x7f ? 1 : 0;
    }
  }
  EXPECT_EQ(bad, 0) << "NaN codes";
}

TEST(GptqFp8, BeatsPlainRoundingWithFixedRowScales) {
  const Layer& l = layer();
  const std::vector<float> scales = row_scales(l);
  const double e_plain = output_error(l, plain_fp8(l, scales), DType::f8_e4m3);
  const std::vector<uint8_t> g = gptq_fp8(l, scales);
  GptqOptions act;
  act.act_order = true;
  const std::vector<uint8_t> ga = gptq_fp8(l, scales, act);
  const double e_gptq = output_error(l, g, DType::f8_e4m3), e_act = output_error(l, ga, DType::f8_e4m3);
  std::printf("f8_e4m3 per-row scales: plain %.4g, gptq %.4g (ratio %.3f), act_order %.4g (ratio %.3f)\n",
              e_plain, e_gptq, e_gptq / e_plain, e_act, e_act / e_plain);
  // measured: 0.25, act_order 0.20; per block (below) 0.25
  EXPECT_LT(e_gptq, 0.4 * e_plain);
  EXPECT_LT(e_act, 0.4 * e_plain);
  expect_on_the_grid(g, scales);
  expect_on_the_grid(ga, scales);
  // Without row scales each block takes max |x| / 448 of its current values: also better than plain blocks.
  std::vector<uint8_t> blocks(g.size());
  dtype_info(DType::f8_e4m3).quantize_row(l.w.data(), blocks.data(), kRows * kCols);
  const double e_blocks = output_error(l, blocks, DType::f8_e4m3);
  const double e_gptq_blocks = output_error(l, gptq(l, DType::f8_e4m3), DType::f8_e4m3);
  std::printf("f8_e4m3 block scales: plain %.4g, gptq %.4g (ratio %.3f)\n", e_blocks, e_gptq_blocks,
              e_gptq_blocks / e_blocks);
  EXPECT_LT(e_gptq_blocks, 0.4 * e_blocks);
}

// A diagonal H (inputs uncorrelated) leaves nothing to feed forward: U is diagonal, each error stays in its
// column, and every weight is rounded to its nearest e4m3 value as plain rounding does, byte for byte
// (act_order only reorders the columns).
TEST(GptqFp8, DiagonalHessianIsPlainRounding) {
  Layer l = layer();
  const std::vector<float> scales = row_scales(l);
  const std::vector<uint8_t> p = plain_fp8(l, scales);
  std::vector<float> h = identity(kCols);
  for (int64_t i = 0; i < kCols; ++i)
    h[static_cast<size_t>(i * kCols + i)] = 0.5f + static_cast<float>(i % 7);
  for (const auto& hessian : {identity(kCols), h}) {
    l.h = hessian;
    for (const bool act_order : {false, true}) {
      GptqOptions o;
      o.act_order = act_order;
      EXPECT_EQ(gptq_fp8(l, scales, o), p) << "act_order " << act_order;
    }
  }
}

// Row scales below max |w| / 448: the weights beyond +-448 * scale take +-448 (codes 0x7e, 0xfe), never NaN.
TEST(GptqFp8, SaturatesAtTheLargestValue) {
  const Layer& l = layer();
  std::vector<float> scales = row_scales(l);
  for (float& s : scales) s *= 0.25f;
  const std::vector<uint8_t> g = gptq_fp8(l, scales);
  expect_on_the_grid(g, scales);
  int64_t saturated = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(g.size() / sizeof(quant::BlockF8E4M3)); ++i) {
    const auto blk = quant::load_block<quant::BlockF8E4M3>(g.data(), i);
    for (const uint8_t c : blk.q) saturated += (c & 0x7f) == 0x7e ? 1 : 0;
  }
  EXPECT_GT(saturated, 0);
}

// On a backend as on the CPU (see OnABackendAsOnTheCpu above).
TEST(GptqFp8, OnABackendAsOnTheCpu) {
  const Layer& l = layer();
  const std::vector<float> scales = row_scales(l);
  auto backend = make_backend("cpu");
  ASSERT_TRUE(backend.ok()) << backend.status().to_string();
  ThreadPool pool(2);
  for (const bool act_order : {false, true}) {
    GptqOptions cpu, on;
    cpu.act_order = on.act_order = act_order;
    on.backend = backend->get();
    on.pool = &pool;
    const std::vector<uint8_t> a = gptq_fp8(l, scales, cpu), b = gptq_fp8(l, scales, on);
    expect_on_the_grid(b, scales);
    const double ea = output_error(l, a, DType::f8_e4m3), eb = output_error(l, b, DType::f8_e4m3);
    int64_t same = 0;
    for (size_t i = 0; i < a.size(); ++i) same += a[i] == b[i] ? 1 : 0;
    std::printf(
        "f8_e4m3 act_order %d: error %.5g on the CPU, %.5g on a backend; %lld of %zu bytes the same\n",
        act_order ? 1 : 0, ea, eb, static_cast<long long>(same), a.size());
    EXPECT_NEAR(eb / ea, 1.0, 0.01) << "act_order " << act_order;
    EXPECT_GE(same, static_cast<int64_t>(a.size()) * 9 / 10) << "act_order " << act_order;
  }
}

TEST(GptqFp8, BadRowScales) {
  const Layer& l = layer();
  std::vector<float> scales = row_scales(l);
  std::vector<uint8_t> q(static_cast<size_t>(kRows * kCols * 2));
  GptqOptions o;
  o.row_scales = scales.data();
  expect_error(gptq_quantize(l.w.data(), kRows, kCols, l.h.data(), DType::q8_0, o, q.data()),
               "row scales are given for f8_e4m3, not q8_0");
  for (const float bad : {0.0f, -1.0f, NAN, INFINITY}) {
    scales[5] = bad;
    expect_error(gptq_quantize(l.w.data(), kRows, kCols, l.h.data(), DType::f8_e4m3, o, q.data()),
                 "row scale [5] is");
  }
}

}  // namespace
}  // namespace kiln
