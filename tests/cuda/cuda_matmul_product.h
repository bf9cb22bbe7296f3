// What the CUDA matmul tests share: one Matmul run on a backend, its f32 result brought back; FP8 weights.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backends/backend.h"

namespace kiln {

// dst (f32 [n, m]) of w x on `b` (at its precision), x the m rows of k floats at `x` (host memory).
inline std::vector<float> matmul_product(Backend& b, const ops::Weight& w, const float* x, int64_t m) {
  const int64_t k = w.tensor.ne[0], n = w.tensor.ne[1];
  auto xb = b.allocate(static_cast<size_t>(k * m) * 4).value();
  auto db = b.allocate(static_cast<size_t>(n * m) * 4).value();
  const Tensor xt = make_tensor(DType::f32, *xb, 0, k, m), dt = make_tensor(DType::f32, *db, 0, n, m);
  EXPECT_TRUE(b.upload(xt, x, static_cast<size_t>(k * m) * 4).ok());
  Program p;
  EXPECT_TRUE(p.add(ops::Matmul{w, xt, dt}).ok());
  p.n_tokens = static_cast<int32_t>(m);
  EXPECT_TRUE(b.run(p).ok());
  std::vector<float> out(static_cast<size_t>(n * m));
  EXPECT_TRUE(b.download(out.data(), dt, out.size() * 4).ok());
  EXPECT_TRUE(b.synchronize().ok());
  return out;
}

// f8_e4m3 rows of `scales` scales each (1: a per-channel checkpoint's; 4: 128-element blocks'), each scale a
// positive normal, the codes any but NaN (0x7F, 0xFF).
inline std::vector<uint8_t> f8_blocks(int64_t k, int64_t n, int scales, std::mt19937_64& rng) {
  std::vector<uint8_t> w(static_cast<size_t>(k / 32 * 36 * n));
  std::uniform_int_distribution<int> code(0, 253);
  std::uniform_real_distribution<float> scale(1e-3f, 1e-2f);
  for (int64_t j = 0; j < n; ++j) {
    std::vector<float> d(static_cast<size_t>(scales));
    for (float& v : d) v = scale(rng);
    for (int64_t b = 0; b < k / 32; ++b) {
      uint8_t* block = w.data() + (j * (k / 32) + b) * 36;
      std::memcpy(block, &d[static_cast<size_t>(b * scales / (k / 32))], 4);
      for (int e = 0; e < 32; ++e) {
        const int q = code(rng);
        block[4 + e] = static_cast<uint8_t>(q >= 0x7F ? q + 1 : q);
      }
    }
  }
  return w;
}

}  // namespace kiln
