// Matmul weights prepared together (Backend::prepare_weight_group: a layer's Q, K and V) are held on the
// device as one matrix, each one's rows right after the previous one's (CudaOptions::stack_weights false:
// apart). Three matmuls on one x over such weights run as one GEMM at more than 8 tokens, and give the
// products of the weights held apart: the same bits through the GEMV (1-8 tokens, the integer GEMV up to 16),
// within f32 rounding of sums taken in another order through cuBLAS, at f32 and bf16 destinations, at widths
// the split kernel moves 8 at a time and at widths it cannot. Beyond 64 tokens (prefill) the GEMMs run apart,
// with the same bits.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/cuda/cuda_backend.h"
#include "core/half.h"

namespace kiln {
namespace {

std::unique_ptr<Backend> cuda_backend(bool stack, bool fast = false) {
  CudaOptions options = cuda_options_from_env();
  options.stack_weights = stack;
  options.precision = fast ? ops::Precision::precision_fast : ops::Precision::precision_exact;
  auto made = make_cuda_backend(0, options);
  EXPECT_TRUE(made.ok()) << made.status().to_string();
  return made.ok() ? std::move(made).value() : nullptr;
}

// The three matrices' file bytes, rows of k values quantized by the type's own quantizer; f8_e4m3 with one
// scale a row (a per-channel checkpoint's: the backend's row form).
std::vector<std::vector<uint8_t>> make_weights(DType type, int64_t k, const std::vector<int64_t>& ns,
                                               std::mt19937_64& rng) {
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  const auto row = static_cast<size_t>(dtype_row_bytes(type, k).value());
  std::vector<std::vector<uint8_t>> out;
  std::vector<float> values(static_cast<size_t>(k));
  for (const int64_t n : ns) {
    std::vector<uint8_t> w(row * static_cast<size_t>(n));
    for (int64_t r = 0; r < n; ++r) {
      for (float& v : values) v = uni(rng) * 0.1f;
      uint8_t* out_row = w.data() + r * row;
      if (type != DType::f8_e4m3) {
        dtype_info(type).quantize_row(values.data(), out_row, k);
        continue;
      }
      float amax = 0.0f;
      for (const float v : values) amax = std::max(amax, std::fabs(v));
      const float d = amax / kF8E4M3Max;
      for (int64_t b = 0; b < k / 32; ++b) {
        std::memcpy(out_row + b * 36, &d, 4);
        for (int e = 0; e < 32; ++e) out_row[b * 36 + 4 + e] = f32_to_f8_e4m3(values[b * 32 + e] / d);
      }
    }
    out.push_back(std::move(w));
  }
  return out;
}

std::vector<std::unique_ptr<WeightHandle>> prepare(Backend& b, DType type, int64_t k,
                                                   const std::vector<int64_t>& ns,
                                                   std::vector<std::vector<uint8_t>>& bytes) {
  std::vector<Tensor> logicals;
  for (size_t i = 0; i < ns.size(); ++i) logicals.push_back(make_tensor(type, bytes[i].data(), k, ns[i]));
  const std::vector<std::string> names = {"blk.0.attn_q.weight", "blk.0.attn_k.weight",
                                          "blk.0.attn_v.weight"};
  auto h =
      b.prepare_weight_group(logicals, std::span(names).first(ns.size()), WeightRole::weight_role_matmul, {});
  EXPECT_TRUE(h.ok()) << h.status().to_string();
  return h.ok() ? std::move(h).value() : std::vector<std::unique_ptr<WeightHandle>>{};
}

// Each matmul's product (as f32), the three run as one program on x [k, m].
std::vector<std::vector<float>> products(Backend& b, const std::vector<std::unique_ptr<WeightHandle>>& w,
                                         const std::vector<float>& x, int64_t m, DType dst_type) {
  const int64_t k = w[0]->weight.tensor.ne[0];
  const int elem = dst_type == DType::f32 ? 4 : 2;
  auto xb = b.allocate(x.size() * 4).value();
  const Tensor xt = make_tensor(DType::f32, *xb, 0, k, m);
  EXPECT_TRUE(b.upload(xt, x.data(), x.size() * 4).ok());
  std::vector<std::unique_ptr<Buffer>> dbs;
  Program p;
  for (const auto& h : w) {
    const int64_t n = h->weight.tensor.ne[1];
    dbs.push_back(b.allocate(static_cast<size_t>(n * m * elem)).value());
    EXPECT_TRUE(p.add(ops::Matmul{h->weight, xt, make_tensor(dst_type, *dbs.back(), 0, n, m)}).ok());
  }
  p.n_tokens = static_cast<int32_t>(m);
  EXPECT_TRUE(b.run(p).ok());
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < w.size(); ++i) {
    const int64_t n = w[i]->weight.tensor.ne[1];
    std::vector<uint8_t> raw(static_cast<size_t>(n * m * elem));
    EXPECT_TRUE(b.download(raw.data(), make_tensor(dst_type, *dbs[i], 0, n, m), raw.size()).ok());
    EXPECT_TRUE(b.synchronize().ok());
    std::vector<float> v(static_cast<size_t>(n * m));
    for (size_t j = 0; j < v.size(); ++j) {
      if (dst_type == DType::f32) {
        std::memcpy(&v[j], raw.data() + 4 * j, 4);
      } else {
        uint16_t bits = 0;
        std::memcpy(&bits, raw.data() + 2 * j, 2);
        v[j] = bf16_to_f32(bits);
      }
    }
    out.push_back(std::move(v));
  }
  return out;
}

TEST(CudaStack, WeightsPreparedTogetherAreOneMatrix) {
  std::unique_ptr<Backend> b = cuda_backend(true);
  ASSERT_NE(b, nullptr);
  std::mt19937_64 rng(5);
  const std::vector<int64_t> ns = {256, 64, 64};
  for (const DType t : {DType::bf16, DType::f16, DType::f32, DType::q8_0, DType::q4_0, DType::f8_e4m3}) {
    std::vector<std::vector<uint8_t>> bytes = make_weights(t, 256, ns, rng);
    const std::vector<std::unique_ptr<WeightHandle>> w = prepare(*b, t, 256, ns, bytes);
    ASSERT_EQ(w.size(), 3u) << dtype_name(t);
    for (size_t i = 1; i < w.size(); ++i) {
      const Tensor& prev = w[i - 1]->weight.tensor;
      EXPECT_EQ(w[i]->weight.tensor.data, static_cast<const char*>(prev.data) + prev.ne[1] * prev.nb[1])
          << dtype_name(t) << " part " << i;
      EXPECT_NE(w[i]->weight.prepared, nullptr) << dtype_name(t);
      EXPECT_EQ(w[i]->name, std::string(i == 1 ? "blk.0.attn_k.weight" : "blk.0.attn_v.weight"));
    }
  }
  // Weights of different types are held apart, each as prepare_weight holds it.
  std::vector<std::vector<uint8_t>> a = make_weights(DType::bf16, 256, {64}, rng),
                                    c = make_weights(DType::f16, 256, {64}, rng);
  const std::vector<Tensor> mixed = {make_tensor(DType::bf16, a[0].data(), 256, 64),
                                     make_tensor(DType::f16, c[0].data(), 256, 64)};
  const std::vector<std::string> names = {"q", "k"};
  auto w = b->prepare_weight_group(mixed, names, WeightRole::weight_role_matmul, {});
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  for (const auto& h : *w) EXPECT_EQ(h->weight.prepared, nullptr);
}

TEST(CudaStack, OneGemmGivesTheProductsOfTheMatricesApart) {
  // Each exact ([0]) and fast ([1]).
  std::unique_ptr<Backend> stacked[2] = {cuda_backend(true), cuda_backend(true, true)};
  std::unique_ptr<Backend> apart[2] = {cuda_backend(false), cuda_backend(false, true)};
  for (int q = 0; q < 2; ++q) ASSERT_TRUE(stacked[q] != nullptr && apart[q] != nullptr);
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  struct Shape {
    int64_t k;
    std::vector<int64_t> ns;
  };
  // Q/K/V-like widths (8-element moves), widths that are not multiples of 8 (one conversion a part), and two
  // matrices.
  const std::vector<Shape> shapes = {{512, {512, 128, 128}}, {96, {36, 12, 12}}, {256, {64, 192}}};
  for (const DType t : {DType::bf16, DType::f16, DType::f32, DType::q8_0, DType::q4_0, DType::f8_e4m3}) {
    for (const Shape& s : shapes) {
      if (t == DType::f8_e4m3 && s.k % 32 != 0) continue;
      std::vector<std::vector<uint8_t>> bytes = make_weights(t, s.k, s.ns, rng);
      std::vector<std::unique_ptr<WeightHandle>> ws[2], wa[2];
      for (int q = 0; q < 2; ++q) {
        ws[q] = prepare(*stacked[q], t, s.k, s.ns, bytes);
        wa[q] = prepare(*apart[q], t, s.k, s.ns, bytes);
        ASSERT_EQ(ws[q].size(), s.ns.size());
        ASSERT_EQ(wa[q].size(), s.ns.size());
      }
      for (const int64_t m : {1, 3, 8, 9, 12, 20, 64, 65}) {
        std::vector<float> x(static_cast<size_t>(s.k * m));
        for (float& v : x) v = uni(rng);
        for (const bool qx : {false, true}) {
          for (const DType dst : {DType::f32, DType::bf16}) {
            const auto a = products(*stacked[qx], ws[qx], x, m, dst);
            const auto b = products(*apart[qx], wa[qx], x, m, dst);
            ASSERT_EQ(a.size(), b.size());
            // The GEMV (and the integer GEMV of the legacy types at the fast precision, up to 16 tokens)
            // reads each matrix as before; cuBLAS sums in an order of its own choosing per shape.
            const bool legacy = t == DType::q8_0 || t == DType::q4_0;
            const bool gemv = m <= 8 || (qx && legacy && m <= 16);
            // More than 64 tokens (a prefill): the GEMMs run apart there too.
            const bool one_gemm = !gemv && m <= 64;
            for (size_t i = 0; i < a.size(); ++i) {
              const std::string what = fmt::format("{} k {} part {} m {}{} dst {}", dtype_name(t), s.k, i, m,
                                                   qx ? " fast" : "", dtype_name(dst));
              if (!one_gemm) {
                EXPECT_TRUE(a[i] == b[i]) << what;
                continue;
              }
              double num = 0, den = 0;
              for (size_t j = 0; j < a[i].size(); ++j) {
                num += (double{a[i][j]} - b[i][j]) * (double{a[i][j]} - b[i][j]);
                den += double{b[i][j]} * b[i][j];
              }
              ASSERT_GT(den, 0.0) << what;
              // f32 destinations: sums of the same products in another order (TF32 inputs for f32 weights
              // at the fast precision, the e4m3 tensor cores' own accumulators for FP8); bf16 ones: the same,
              // then one rounding to 8 bits that may fall either way.
              const bool fp8 = t == DType::f8_e4m3 && qx;
              const double tol = dst == DType::bf16 ? 4e-3
                                 : fp8              ? 1e-3
                                                    : (t == DType::f32 && qx ? 1e-4 : 1e-5);
              EXPECT_LE(std::sqrt(num / den), tol) << what;
            }
            // The one e4m3 GEMM takes the stack's vector of row scales: against the exact products (each
            // row's own scale, x not rounded), within the rounding of x to e4m3 (about 2.5% a product).
            if (t == DType::f8_e4m3 && qx && one_gemm) {
              const auto e = products(*stacked[0], ws[0], x, m, dst);
              for (size_t i = 0; i < a.size(); ++i) {
                double num = 0, den = 0;
                for (size_t j = 0; j < a[i].size(); ++j) {
                  num += (double{a[i][j]} - e[i][j]) * (double{a[i][j]} - e[i][j]);
                  den += double{e[i][j]} * e[i][j];
                }
                EXPECT_LE(std::sqrt(num / den), 0.05) << "f8_e4m3 against exact, part " << i << " m " << m;
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kiln
