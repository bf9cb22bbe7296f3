// The e4m3 GEMM of FP8 weights at the fast precision beyond the GEMV's 8 columns (backends/cuda/matmul/
// fp8_gemm.cu; on Hopper, 9 to 64 rows take fp8_wgmma.cu's kernel, split over k in thread-block clusters).
// x is rounded per token to e4m3 (scale amax / 448), so the GEMM's exact result is known on the host: the
// products of two sets of codes, summed in double. The device sums them in f32 on the tensor cores, whose
// additions keep fewer bits than f32's; anything but the right pairs of codes (a wrong layout, a stage or a
// cluster rank lost) misses by the size of the products themselves.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/cuda/cuda_backend.h"
#include "core/half.h"
#include "cuda_matmul_product.h"

namespace kiln {
namespace {

TEST(CudaFp8Gemm, GivesTheExactProductsOfTheRoundedCodes) {
  CudaOptions options = cuda_options_from_env();
  options.precision = ops::Precision::precision_fast;
  auto made = make_cuda_backend(0, options);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  Backend& b = **made;
  int major = 0, minor = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0), cudaSuccess);
  const bool hopper = major == 9 && minor == 0;
  std::mt19937_64 rng(17);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  struct Shape {
    int64_t k, n;
  };
  // Rows a multiple of 16 (cuBLASLt's e4m3 GEMM and this kernel take no other). On an H100's 132
  // multiprocessors: 9 tiles of 128 rows, the last partial, over clusters of 8 slices of 4 stages; 2 tiles
  // (the second of 80 rows) over 8 slices of 4 or 5 stages, the last stage a quarter of one; 64 tiles over
  // slices of one or two stages; 2 slices of a single stage each.
  for (const Shape s : {Shape{4096, 1040}, Shape{4128, 208}, Shape{512, 8192}, Shape{256, 4096}}) {
    const std::vector<uint8_t> w = f8_blocks(s.k, s.n, 1, rng);
    auto h = b.prepare_weight(make_tensor(DType::f8_e4m3, const_cast<uint8_t*>(w.data()), s.k, s.n),
                              "blk.0.ffn_up.weight", WeightRole::weight_role_matmul);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    // The weight's values: one scale a row times its codes' values.
    std::vector<double> wv(static_cast<size_t>(s.k * s.n));
    for (int64_t j = 0; j < s.n; ++j) {
      for (int64_t e = 0; e < s.k; ++e) {
        const uint8_t* block = w.data() + (j * (s.k / 32) + e / 32) * 36;
        float d = 0;
        std::memcpy(&d, block, 4);
        wv[static_cast<size_t>(j * s.k + e)] = double{d} * f8_e4m3_to_f32(block[4 + e % 32]);
      }
    }
    // Each batch's first 9 rows of x are the m = 9 batch's: on Hopper their products are the same bits in
    // every batch of up to 64 rows (the split depends on the weight's shape alone).
    std::vector<float> first_x, first_rows;
    for (const int64_t m : {9, 16, 33, 64, 65}) {
      const std::string what = fmt::format("k {} n {} m {}", s.k, s.n, m);
      std::vector<float> x(static_cast<size_t>(s.k * m));
      for (float& v : x) v = uni(rng);
      if (m == 9) first_x = x;
      std::copy(first_x.begin(), first_x.end(), x.begin());
      const std::vector<float> got = matmul_product(b, h.value()->weight, x.data(), m);
      double worst = 0;
      for (int64_t i = 0; i < m; ++i) {
        const float* row = x.data() + i * s.k;
        float amax = 0;
        for (int64_t e = 0; e < s.k; ++e) amax = std::max(amax, std::fabs(row[e]));
        const float scale = amax > 0 ? amax / kF8E4M3Max : 1.0f;
        std::vector<double> xv(static_cast<size_t>(s.k));
        for (int64_t e = 0; e < s.k; ++e)
          xv[static_cast<size_t>(e)] = f8_e4m3_to_f32(f32_to_f8_e4m3(row[e] / scale));
        for (int64_t j = 0; j < s.n; ++j) {
          double sum = 0, size = 0;
          const double* wr = wv.data() + j * s.k;
          for (int64_t e = 0; e < s.k; ++e) {
            sum += wr[e] * xv[static_cast<size_t>(e)];
            size += std::fabs(wr[e] * xv[static_cast<size_t>(e)]);
          }
          const double err = std::fabs(got[static_cast<size_t>(i * s.n + j)] - scale * sum) / (scale * size);
          worst = std::max(worst, err);
        }
      }
      EXPECT_LE(worst, 1e-3) << what;
      if (m == 9) {
        first_rows = got;
      } else if (m <= 64 && hopper) {
        EXPECT_TRUE(std::equal(first_rows.begin(), first_rows.end(), got.begin())) << what;
      }
    }
  }
}

// A checkpoint's static activation scale (ops::Weight::input_scale): x is rounded as x / scale, saturating at
// 448, for one matmul, and a group on one x (Q, K and V) rounds it with the largest of their scales, as one
// stacked GEMM (9 to 64 rows) and as GEMMs apart (a prefill). x holds values past 448 times the scale, so a
// per-token rounding misses the exact products by far more than the tolerance.
TEST(CudaFp8Gemm, StaticActivationScalesRoundXAsTheCheckpointSays) {
  CudaOptions options = cuda_options_from_env();
  options.precision = ops::Precision::precision_fast;
  options.fuse = true;  // Q, K and V as a group (apart, each would round by its own scale)
  auto made = make_cuda_backend(0, options);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  Backend& b = **made;
  std::mt19937_64 rng(23);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  const int64_t k = 512;
  const std::vector<int64_t> ns = {256, 64, 64};
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<Tensor> logicals;
  for (const int64_t n : ns) {
    bytes.push_back(f8_blocks(k, n, 1, rng));
    logicals.push_back(make_tensor(DType::f8_e4m3, bytes.back().data(), k, n));
  }
  const std::vector<std::string> names = {"blk.0.attn_q.weight", "blk.0.attn_k.weight",
                                          "blk.0.attn_v.weight"};
  auto group = b.prepare_weight_group(logicals, names, WeightRole::weight_role_matmul, {});
  ASSERT_TRUE(group.ok()) << group.status().to_string();
  const float scales[3] = {2.0f / kF8E4M3Max, 3.0f / kF8E4M3Max, 2.5f / kF8E4M3Max};
  std::vector<ops::Weight> w;
  for (size_t i = 0; i < ns.size(); ++i) {
    w.push_back((*group)[i]->weight);
    w.back().input_scale = scales[i];
  }
  // Weight i's values: one scale a row times its codes' values.
  const auto value = [&](size_t i, int64_t j, int64_t e) {
    const uint8_t* block = bytes[i].data() + (j * (k / 32) + e / 32) * 36;
    float d = 0;
    std::memcpy(&d, block, 4);
    return double{d} * f8_e4m3_to_f32(block[4 + e % 32]);
  };
  for (const int64_t m : {9, 64, 100}) {
    std::vector<float> x(static_cast<size_t>(k * m));
    for (float& v : x) v = uni(rng) * (uni(rng) > 0.9f ? 4.0f : 1.0f);  // a tenth up to 4: past 2 and 3
    // x as the given scale rounds it: the codes' values times the scale.
    const auto rounded = [&](float scale) {
      std::vector<double> xv(x.size());
      for (size_t e = 0; e < x.size(); ++e) {
        const float q = std::clamp(x[e] / scale, -kF8E4M3Max, kF8E4M3Max);
        xv[e] = double{scale} * f8_e4m3_to_f32(f32_to_f8_e4m3(q));
      }
      return xv;
    };
    // Worst error of `got` (weight i's product) against the exact products on x rounded by `scale`.
    const auto worst = [&](size_t i, const std::vector<float>& got, float scale) {
      const std::vector<double> xv = rounded(scale);
      double out = 0;
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t j = 0; j < ns[i]; ++j) {
          double sum = 0, size = 0;
          for (int64_t e = 0; e < k; ++e) {
            const double p = value(i, j, e) * xv[static_cast<size_t>(r * k + e)];
            sum += p;
            size += std::fabs(p);
          }
          out = std::max(out, std::fabs(got[static_cast<size_t>(r * ns[i] + j)] - sum) / size);
        }
      }
      return out;
    };
    // One matmul: its own scale.
    EXPECT_LE(worst(0, matmul_product(b, w[0], x.data(), m), scales[0]), 1e-3) << "m " << m;
    // Q, K and V on one x, as one program: the largest scale, 3 / 448.
    auto xb = b.allocate(x.size() * 4).value();
    const Tensor xt = make_tensor(DType::f32, *xb, 0, k, m);
    ASSERT_TRUE(b.upload(xt, x.data(), x.size() * 4).ok());
    std::vector<std::unique_ptr<Buffer>> dbs;
    Program p;
    for (size_t i = 0; i < ns.size(); ++i) {
      dbs.push_back(b.allocate(static_cast<size_t>(ns[i] * m * 4)).value());
      ASSERT_TRUE(p.add(ops::Matmul{w[i], xt, make_tensor(DType::f32, *dbs.back(), 0, ns[i], m)}).ok());
    }
    p.n_tokens = static_cast<int32_t>(m);
    ASSERT_TRUE(b.run(p).ok());
    for (size_t i = 0; i < ns.size(); ++i) {
      std::vector<float> got(static_cast<size_t>(ns[i] * m));
      ASSERT_TRUE(b.download(got.data(), make_tensor(DType::f32, *dbs[i], 0, ns[i], m), got.size() * 4).ok());
      ASSERT_TRUE(b.synchronize().ok());
      EXPECT_LE(worst(i, got, scales[1]), 1e-3) << "part " << i << " m " << m;
    }
  }
}

}  // namespace
}  // namespace kiln
