// The integer tensor-core matmul of K-quant weights (backends/cuda/matmul/mmq.cu), which batches of
// kMmqMinCols to kMmqMaxCols tokens take under quantize_x (from 2 with CudaOptions::mmq_min_cols 2): a
// token's products are the same bits alone (in a batch of its own size) or among others, and they are the
// integer GEMV's products (batches of up to 8) summed in another order.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "backends/cuda/cuda_backend.h"
#include "cuda_matmul_product.h"

namespace kiln {
namespace {

constexpr int64_t kRows = 45;  // two full tiles of 16 and a partial one

// Random K-quant super-blocks: quants any bytes, the f16 super-block scales (d, and dmin where there is one)
// positive normals in 2^-9 .. 2^-8, so that no product overflows.
std::vector<uint8_t> k_quant_rows(DType type, int64_t k, int64_t n, std::mt19937_64& rng) {
  std::vector<uint8_t> w(static_cast<size_t>(dtype_row_bytes(type, k).value() * n));
  std::uniform_int_distribution<int> byte(0, 255), mant(0, 0x3FF);
  for (uint8_t& v : w) v = static_cast<uint8_t>(byte(rng));
  const auto sb = static_cast<size_t>(dtype_info(type).type_size);
  const std::vector<size_t> f16_at =
      type == DType::q6_k ? std::vector<size_t>{208} : std::vector<size_t>{0, 2};
  for (size_t b = 0; b < w.size() / sb; ++b) {
    for (const size_t at : f16_at) {
      const auto bits = static_cast<uint16_t>(0x1800 + mant(rng));
      std::memcpy(w.data() + b * sb + at, &bits, 2);
    }
  }
  return w;
}

// dst (f32 [n, m]) of w x[:, first .. first + m) on `b`, a backend of the fast precision.
std::vector<float> product(Backend& b, const Tensor& w, const std::vector<float>& x, int64_t first,
                           int64_t m) {
  return matmul_product(b, ops::Weight(w), x.data() + first * w.ne[0], m);
}

TEST(CudaMmq, BatchesGetTheSameBitsAndTheGemvsProducts) {
  CudaOptions fast = cuda_options_from_env();
  fast.precision = ops::Precision::precision_fast;
  auto made = make_cuda_backend(0, fast);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  Backend& b = **made;
  // A second backend whose batches of 2 tokens and more take the kernel (CudaOptions::mmq_min_cols), for
  // the small batches.
  CudaOptions from_two = fast;
  from_two.mmq_min_cols = 2;
  auto made_small = make_cuda_backend(0, from_two);
  ASSERT_TRUE(made_small.ok()) << made_small.status().to_string();
  Backend& small = **made_small;
  // And one without it (CudaOptions::mmq off), whose batches of 8 take the integer GEMV.
  CudaOptions no_mmq = fast;
  no_mmq.mmq = false;
  auto made_gemv = make_cuda_backend(0, no_mmq);
  ASSERT_TRUE(made_gemv.ok()) << made_gemv.status().to_string();
  Backend& gemv_backend = **made_gemv;
  std::mt19937_64 rng(23);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  // Q4_K / Q5_K at 2 and 17 super-blocks (k split over warps or not); Q6_K at multiples of 2048 (rows of
  // whole 16-byte chunks).
  const struct {
    DType type;
    int64_t k;
  } cases[] = {{DType::q4_k, 512},  {DType::q4_k, 4352}, {DType::q5_k, 512},
               {DType::q5_k, 4352}, {DType::q6_k, 2048}, {DType::q6_k, 6144}};
  constexpr int64_t kTokens = 64;
  for (const auto& c : cases) {
    const std::vector<uint8_t> host_w = k_quant_rows(c.type, c.k, kRows, rng);
    auto wb = b.allocate(host_w.size()).value();
    const Tensor w = make_tensor(c.type, *wb, 0, c.k, kRows);
    ASSERT_TRUE(b.upload(w, host_w.data(), host_w.size()).ok());
    std::vector<float> x(static_cast<size_t>(c.k * kTokens));
    for (float& v : x) v = uni(rng);
    auto wb_small = small.allocate(host_w.size()).value();
    const Tensor w_small = make_tensor(c.type, *wb_small, 0, c.k, kRows);
    ASSERT_TRUE(small.upload(w_small, host_w.data(), host_w.size()).ok());
    auto wb_gemv = gemv_backend.allocate(host_w.size()).value();
    const Tensor w_gemv = make_tensor(c.type, *wb_gemv, 0, c.k, kRows);
    ASSERT_TRUE(gemv_backend.upload(w_gemv, host_w.data(), host_w.size()).ok());
    const std::vector<float> all = product(b, w, x, 0, kTokens);
    const std::string what = fmt::format("{} k {}", dtype_name(c.type), c.k);
    // The same tokens in batches of 9, 23 and 32 (tiles of 16, 32 and 64 tokens), 5 (kMmqMinCols), and 2 on
    // the backend that takes it there: the same bits.
    for (const auto& [first, m] : {std::pair<int64_t, int64_t>{0, 9}, {9, 23}, {32, 32}, {41, 2}, {50, 5}}) {
      const std::vector<float> part =
          m < 5 ? product(small, w_small, x, first, m) : product(b, w, x, first, m);
      EXPECT_EQ(std::memcmp(part.data(), all.data() + first * kRows, part.size() * 4), 0)
          << what << ": tokens " << first << ".." << first + m - 1 << " differ from the batch of " << kTokens;
    }
    // The integer GEMV, 8 tokens at a time: the same integer dot products, scaled and summed in another
    // order.
    double err = 0.0, norm = 0.0;
    for (int64_t first = 0; first < kTokens; first += 8) {
      const std::vector<float> gemv = product(gemv_backend, w_gemv, x, first, 8);
      for (size_t i = 0; i < gemv.size(); ++i) {
        const double d = gemv[i] - all[static_cast<size_t>(first * kRows) + i];
        err += d * d;
        norm += static_cast<double>(gemv[i]) * gemv[i];
      }
    }
    EXPECT_GT(norm, 0.0) << what;
    EXPECT_LT(std::sqrt(err / norm), 1e-5) << what << ": relative L2 distance to the integer GEMV";
  }
}

}  // namespace
}  // namespace kiln
