// What the CUDA matmul tests share: one Matmul run on a backend, its f32 result brought back.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
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

}  // namespace kiln
