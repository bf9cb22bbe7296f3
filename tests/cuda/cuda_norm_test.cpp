// RMSNorm's two shapes on CUDA (backends/cuda/norm_rope/norm.cu, norm_shape): a few rows (decode) cut into
// slices, one block of a thread-block cluster each; many rows (prefill) with a row's slices packed into one
// block. Both take the same per-thread elements and sum in the same order, so a row gets the same bits alone
// or among many, fused with the residual add or not.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backends/backend.h"

namespace kiln {
namespace {

constexpr int64_t kMany = 300;  // rows: more than any device's multiprocessors, so the packed shape

// The norm's output bytes for rows [0, rows) of x (and of x + y when `add`), from one program.
std::vector<uint8_t> norm_rows(Backend& b, const std::vector<float>& x, const std::vector<float>& y,
                               const std::vector<float>& w, int64_t n, int64_t rows, bool add) {
  const size_t row_bytes = static_cast<size_t>(n) * 4;
  const size_t x_at = 0, y_at = x_at + row_bytes * rows, w_at = y_at + row_bytes * rows,
               s_at = w_at + row_bytes, d_at = s_at + row_bytes * rows, total = d_at + row_bytes * rows;
  std::vector<uint8_t> host(total, 0);
  std::memcpy(host.data() + x_at, x.data(), row_bytes * rows);
  std::memcpy(host.data() + y_at, y.data(), row_bytes * rows);
  std::memcpy(host.data() + w_at, w.data(), row_bytes);
  auto buf = b.allocate(total).value();
  EXPECT_TRUE(
      b.upload(make_tensor(DType::i8, *buf, 0, static_cast<int64_t>(total)), host.data(), total).ok());
  const Tensor xt = make_tensor(DType::f32, *buf, x_at, n, rows);
  const Tensor yt = make_tensor(DType::f32, *buf, y_at, n, rows);
  const Tensor st = make_tensor(DType::f32, *buf, s_at, n, rows);
  const Tensor dt = make_tensor(DType::f32, *buf, d_at, n, rows);
  const ops::Weight wt(make_tensor(DType::f32, *buf, w_at, n));
  Program p;
  if (add) {
    EXPECT_TRUE(p.add(ops::Binary{xt, ops::Weight(yt), ops::BinaryKind::binary_kind_add, st}).ok());
    EXPECT_TRUE(p.add(ops::RmsNorm{st, wt, 1e-6f, false, dt}).ok());
  } else {
    EXPECT_TRUE(p.add(ops::RmsNorm{xt, wt, 1e-6f, false, dt}).ok());
  }
  p.n_tokens = static_cast<int32_t>(rows);
  EXPECT_TRUE(b.run(p).ok());
  std::vector<uint8_t> out(row_bytes * rows);
  EXPECT_TRUE(
      b.download(out.data(), make_tensor(DType::i8, *buf, d_at, static_cast<int64_t>(out.size())), out.size())
          .ok());
  EXPECT_TRUE(b.synchronize().ok());
  return out;
}

TEST(CudaNorm, ARowAloneAndAmongManyGetTheSameBits) {
  auto made = make_backend("cuda");
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  Backend& b = **made;
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> uni(-4.0f, 4.0f);
  // 4096: 8 slices of 512; 2880: 6 of 480; 1000: 2 of 512 (a short last one); 4000 elements past the
  // registers' 8 a thread for no shape; 256: one slice; 8192: 8 slices of 1024, in registers alone (8 a
  // thread) and read twice among many (the packed kernel holds 4 a thread).
  for (const int64_t n : {4096, 2880, 1000, 256, 8192}) {
    std::vector<float> x(static_cast<size_t>(n * kMany)), y(x.size()), w(static_cast<size_t>(n));
    for (float& v : x) v = uni(rng);
    for (float& v : y) v = uni(rng);
    for (float& v : w) v = uni(rng);
    for (const bool add : {false, true}) {
      const std::vector<uint8_t> many = norm_rows(b, x, y, w, n, kMany, add);
      for (const int64_t r : {int64_t{0}, int64_t{1}, kMany - 1}) {
        const std::vector<float> xr(x.begin() + r * n, x.begin() + (r + 1) * n);
        const std::vector<float> yr(y.begin() + r * n, y.begin() + (r + 1) * n);
        const std::vector<uint8_t> alone = norm_rows(b, xr, yr, w, n, 1, add);
        EXPECT_EQ(0, std::memcmp(alone.data(), many.data() + r * n * 4, alone.size()))
            << "n = " << n << ", row " << r << (add ? ", after the residual add" : "");
      }
    }
  }
}

}  // namespace
}  // namespace kiln
