// The integer GEMV's two ways of reading weights (cuda_matmul.cu): through shared memory, a segment of every
// row in flight ahead of its use (the default where rows are 16-byte aligned), and straight from global
// memory (KILN_CUDA_GEMV_STAGED=0). Each thread takes the same units in the same order either way, so the
// results are the same bits, for every type with an integer path, at lengths with a partial last segment, at
// 1 to 16 tokens, and with the gated-activation epilogue.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "backends/backend.h"

namespace kiln {
namespace {

constexpr int64_t kRowsOut = 37;  // not a multiple of any rows-a-block

struct Case {
  DType type;
  int64_t k;
  int64_t m;
};

// dst's bytes of w x with quantize_x, on a backend made with KILN_CUDA_GEMV_STAGED=staged; weights and x
// drawn from `seed`.
std::vector<uint8_t> run(bool staged, const Case& c, uint64_t seed) {
  setenv("KILN_CUDA_GEMV_STAGED", staged ? "1" : "0", 1);
  auto made = make_backend("cuda");
  unsetenv("KILN_CUDA_GEMV_STAGED");
  EXPECT_TRUE(made.ok()) << made.status().to_string();
  if (!made.ok()) return {};
  Backend& b = **made;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  const auto row_w = static_cast<size_t>(dtype_row_bytes(c.type, c.k).value());
  const size_t w_bytes = row_w * kRowsOut, x_bytes = static_cast<size_t>(c.k * c.m) * 4,
               d_bytes = static_cast<size_t>(kRowsOut * c.m) * 4;
  const size_t w_at = 0, x_at = w_bytes, d_at = x_at + x_bytes;
  const size_t total = d_at + d_bytes;
  std::vector<uint8_t> host(total, 0);
  // Random quants and sub-block scales (kiln has no K-quant quantizer); the f16 super-block scales (d, and
  // dmin where there is one) random positive normals, so that no product overflows.
  std::uniform_int_distribution<int> byte(0, 255), mant(0, 0x3FF);
  for (size_t i = 0; i < w_bytes; ++i) host[w_at + i] = static_cast<uint8_t>(byte(rng));
  const int64_t sb_bytes = dtype_info(c.type).type_size;
  const std::vector<int64_t> f16_at =
      c.type == DType::q6_k ? std::vector<int64_t>{208} : std::vector<int64_t>{0, 2};
  for (size_t sb = 0; sb < w_bytes / sb_bytes; ++sb) {
    for (const int64_t at : f16_at) {
      const auto bits = static_cast<uint16_t>(0x1800 + mant(rng));  // 2^-9 .. 2^-8
      std::memcpy(host.data() + w_at + sb * sb_bytes + at, &bits, 2);
    }
  }
  for (int64_t i = 0; i < c.k * c.m; ++i) {
    const float v = uni(rng);
    std::memcpy(host.data() + x_at + 4 * i, &v, 4);
  }
  auto buf = b.allocate(total).value();
  EXPECT_TRUE(
      b.upload(make_tensor(DType::i8, *buf, 0, static_cast<int64_t>(total)), host.data(), total).ok());
  const Tensor x = make_tensor(DType::f32, *buf, x_at, c.k, c.m);
  const Tensor d = make_tensor(DType::f32, *buf, d_at, kRowsOut, c.m);
  Program p;
  EXPECT_TRUE(
      p.add(ops::Matmul{ops::Weight(make_tensor(c.type, *buf, w_at, c.k, kRowsOut)), x, d, true}).ok());
  p.n_tokens = static_cast<int32_t>(c.m);
  EXPECT_TRUE(b.run(p).ok());
  std::vector<uint8_t> out(d_bytes);
  EXPECT_TRUE(
      b.download(out.data(), make_tensor(DType::i8, *buf, d_at, static_cast<int64_t>(out.size())), out.size())
          .ok());
  EXPECT_TRUE(b.synchronize().ok());
  return out;
}

TEST(CudaGemv, StagedWeightsGiveTheDirectLoadsBits) {
  // Q4_K / Q5_K segments are 4096 elements (128 units of 32): 6144 ends in a partial one. Q6_K's are 2048,
  // and its rows are whole 16-byte chunks only at multiples of 2048.
  for (const DType t : {DType::q4_k, DType::q5_k, DType::q6_k}) {
    for (const int64_t k : {4096, 6144}) {
      for (const int64_t m : {1, 3, 12}) {
        const Case c{t, k, m};
        const std::vector<uint8_t> staged = run(true, c, 7), direct = run(false, c, 7);
        ASSERT_FALSE(staged.empty());
        EXPECT_TRUE(staged == direct) << dtype_name(t) << " k " << k << " m " << m;
        const auto* f = reinterpret_cast<const float*>(staged.data());
        bool written = false;  // the destination started as zeros
        for (int64_t i = 0; i < kRowsOut * m; ++i) written = written || f[i] != 0.0f;
        EXPECT_TRUE(written) << dtype_name(t) << " k " << k << " m " << m;
      }
    }
  }
}

}  // namespace
}  // namespace kiln
