// The GEMV's ways of reading weights (backends/cuda/matmul/matmul.cu, matmul/gemv_staged.cu).
// - The integer GEMV of Q4_K, Q5_K and of rows in grouped form reads through shared memory, a
//   segment of every row in flight ahead of its use (the default where rows are 16-byte aligned), or straight
//   from global memory (CudaOptions::staged_gemv false). Each thread takes the same units in the same order
//   either way, so the results are the same bits, at lengths with a partial last segment and at 1 to 16
//   tokens.
// - Matmul weights of the legacy block types and of Q6_K are held in grouped form (prepare_weight;
//   CudaOptions::grouped_weights false keeps the file's). The exact paths (GEMV and GEMM) give the same bits
//   from either form, and so does Q6_K's integer GEMV and tensor-core matmul; the legacy types' integer GEMV
//   sums a block's products in one piece instead of four, the same integers scaled in another order.
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
#include "core/half.h"
#include "cuda_matmul_product.h"

namespace kiln {
namespace {

constexpr int64_t kRowsOut = 37;  // not a multiple of any rows-a-block

struct Case {
  DType type;
  int64_t k;
  int64_t m;
};

// The environment's options with the staged GEMV on or off, `rows` rows a block (0: by shape) and at most
// `grid` blocks a staged launch (0: the device's fill).
CudaOptions gemv_options(bool staged, int rows = 0, int grid = 0) {
  CudaOptions o = cuda_options_from_env();
  o.staged_gemv = staged;
  o.gemv_rows = rows;
  o.staged_gemv_grid = grid;
  o.precision = ops::Precision::precision_fast;
  return o;
}

// dst's bytes of w x at the fast precision, on a backend made with `options` and mmq off (so that 9 to 16
// tokens take the GEMV in two column groups); weights and x drawn from `seed`.
std::vector<uint8_t> run(CudaOptions options, const Case& c, uint64_t seed) {
  options.mmq = false;
  options.precision = ops::Precision::precision_fast;
  auto made = make_cuda_backend(0, options);
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
  const std::vector<int64_t> f16_at{0, 2};
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
  EXPECT_TRUE(p.add(ops::Matmul{ops::Weight(make_tensor(c.type, *buf, w_at, c.k, kRowsOut)), x, d}).ok());
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
  // Q4_K / Q5_K segments are 4096 elements (128 units of 32): 6144 ends in a partial one. The staged kernel
  // runs with a block for each item (kRows rows, a column group) and on a grid of 2 blocks, which walk
  // several items each: the next item's first segment in flight while the last one's is multiplied; one
  // column at every rows a block (CudaOptions::gemv_rows; more columns take 4). (Q6_K's staged GEMV reads
  // grouped rows: StagedGroupedRowsGiveTheDirectLoadsBits.)
  for (const DType t : {DType::q4_k, DType::q5_k}) {
    for (const int64_t k : {4096, 6144}) {
      for (const int64_t m : {1, 3, 12}) {
        const Case c{t, k, m};
        const std::vector<uint8_t> direct = run(gemv_options(false), c, 7);
        ASSERT_FALSE(direct.empty());
        const auto* f = reinterpret_cast<const float*>(direct.data());
        bool written = false;  // the destination started as zeros
        for (int64_t i = 0; i < kRowsOut * m; ++i) written = written || f[i] != 0.0f;
        EXPECT_TRUE(written) << dtype_name(t) << " k " << k << " m " << m;
        for (const int rows : {0, 1, 2, 4, 8}) {
          if (m > 1 && rows != 0) continue;
          for (const int grid : {0, 2}) {
            EXPECT_TRUE(run(gemv_options(true, rows, grid), c, 7) == direct)
                << dtype_name(t) << " k " << k << " m " << m << " rows " << rows << " grid " << grid;
          }
        }
      }
    }
  }
}

// Random blocks of a grouped type: quants (and Q6_K's int8 scales) any bytes, the f16 scale (and q4_1 /
// q5_1's f16 minimum) positive normals in 2^-9 .. 2^-8.
std::vector<uint8_t> grouped_type_blocks(DType type, int64_t k, int64_t n, std::mt19937_64& rng) {
  const auto row = static_cast<size_t>(dtype_row_bytes(type, k).value());
  std::vector<uint8_t> w(row * static_cast<size_t>(n));
  std::uniform_int_distribution<int> byte(0, 255), mant(0, 0x3FF);
  for (uint8_t& v : w) v = static_cast<uint8_t>(byte(rng));
  const auto block = static_cast<size_t>(dtype_info(type).type_size);
  const std::vector<size_t> f16_at = type == DType::q6_k                          ? std::vector<size_t>{208}
                                     : type == DType::q4_1 || type == DType::q5_1 ? std::vector<size_t>{0, 2}
                                                                                  : std::vector<size_t>{0};
  for (size_t b = 0; b < w.size() / block; ++b) {
    for (const size_t at : f16_at) {
      const auto bits = static_cast<uint16_t>(0x1800 + mant(rng));
      std::memcpy(w.data() + b * block + at, &bits, 2);
    }
  }
  return w;
}

// A CUDA backend made with `options`.
std::unique_ptr<Backend> cuda_backend_with(const CudaOptions& options) {
  auto made = make_cuda_backend(0, options);
  EXPECT_TRUE(made.ok()) << made.status().to_string();
  return made.ok() ? std::move(made).value() : nullptr;
}

std::unique_ptr<Backend> cuda_backend(bool grouped, bool fast) {
  CudaOptions o = cuda_options_from_env();
  o.grouped_weights = grouped;
  o.precision = fast ? ops::Precision::precision_fast : ops::Precision::precision_exact;
  return cuda_backend_with(o);
}

TEST(CudaGemv, StagedGroupedRowsGiveTheDirectLoadsBits) {
  // Rows in grouped form through shared memory against their direct loads. The legacy types' (one column of
  // x; more are read directly either way): a segment is 16 runs of 8 blocks (q8_0: 8 runs). k = 288: one
  // partial segment ending in a partial run (9 blocks); 4096: whole runs; 6368: a partial last segment ending
  // in a partial run (199 blocks). Q6_K's (any columns): a segment is one run of 8 super-blocks; k = 256: one
  // super-block, 2304: a whole run and a run of 1, 4096: whole runs. Once more on a grid of 2 blocks that
  // walk many items each, and at 2, 4 and 8 rows a block (CudaOptions::gemv_rows; one column: more take 4).
  std::unique_ptr<Backend> staged = cuda_backend_with(gemv_options(true)),
                           direct = cuda_backend_with(gemv_options(false)),
                           walked = cuda_backend_with(gemv_options(true, 0, 2));
  ASSERT_TRUE(staged != nullptr && direct != nullptr && walked != nullptr);
  std::vector<std::pair<std::string, std::unique_ptr<Backend>>> shapes;
  for (const int rows : {2, 4, 8}) {
    shapes.emplace_back(fmt::format("rows {}", rows), cuda_backend_with(gemv_options(true, rows)));
    ASSERT_TRUE(shapes.back().second != nullptr);
  }
  std::mt19937_64 rng(13);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  constexpr int64_t n = 37;
  for (const DType t : {DType::q4_0, DType::q4_1, DType::q5_0, DType::q5_1, DType::q8_0, DType::q6_k}) {
    const std::vector<int64_t> ks =
        t == DType::q6_k ? std::vector<int64_t>{256, 2304, 4096} : std::vector<int64_t>{288, 4096, 6368};
    for (const int64_t k : ks) {
      const std::vector<uint8_t> w = grouped_type_blocks(t, k, n, rng);
      const Tensor logical = make_tensor(t, const_cast<uint8_t*>(w.data()), k, n);
      const std::string what = fmt::format("{} k {}", dtype_name(t), k);
      auto hs = staged->prepare_weight(logical, "blk.0.ffn_up.weight", WeightRole::weight_role_matmul);
      auto hd = direct->prepare_weight(logical, "blk.0.ffn_up.weight", WeightRole::weight_role_matmul);
      auto hw = walked->prepare_weight(logical, "blk.0.ffn_up.weight", WeightRole::weight_role_matmul);
      ASSERT_TRUE(hs.ok() && hd.ok() && hw.ok()) << what;
      std::vector<std::unique_ptr<WeightHandle>> hshapes;
      for (auto& [name, backend] : shapes) {
        auto h = backend->prepare_weight(logical, "blk.0.ffn_up.weight", WeightRole::weight_role_matmul);
        ASSERT_TRUE(h.ok()) << what << ", " << name;
        hshapes.push_back(std::move(h).value());
      }
      EXPECT_NE((*hs)->weight.prepared, nullptr) << what << ": not in grouped form";
      for (const int64_t m : {1, 3, 8, 12}) {
        std::vector<float> x(static_cast<size_t>(k * m));
        for (float& v : x) v = uni(rng);
        const std::vector<float> a = matmul_product(*staged, (*hs)->weight, x.data(), m),
                                 b = matmul_product(*direct, (*hd)->weight, x.data(), m),
                                 c = matmul_product(*walked, (*hw)->weight, x.data(), m);
        EXPECT_TRUE(a == b) << what << " m " << m;
        EXPECT_TRUE(c == b) << what << " m " << m << ", 2 blocks";
        for (size_t i = 0; i < shapes.size() && m == 1; ++i) {
          EXPECT_TRUE(matmul_product(*shapes[i].second, hshapes[i]->weight, x.data(), m) == b)
              << what << " m " << m << ", " << shapes[i].first;
        }
        bool written = false;
        for (const float v : a) written = written || v != 0.0f;
        EXPECT_TRUE(written) << what << " m " << m;
      }
    }
  }
}

// The exact ([0]) and fast ([1]) backends, each holding matmul weights in grouped form and in the file's.
struct Forms {
  std::unique_ptr<Backend> grouped[2] = {cuda_backend(true, false), cuda_backend(true, true)};
  std::unique_ptr<Backend> file[2] = {cuda_backend(false, false), cuda_backend(false, true)};
  bool ok() const { return grouped[0] && grouped[1] && file[0] && file[1]; }
  // `logical` as a matmul weight on each: g[q] on grouped[q], f[q] on file[q].
  void prepare(const Tensor& logical, std::unique_ptr<WeightHandle> (&g)[2],
               std::unique_ptr<WeightHandle> (&f)[2]) {
    for (int q = 0; q < 2; ++q) {
      auto hg = grouped[q]->prepare_weight(logical, "blk.0.ffn_up.weight", WeightRole::weight_role_matmul);
      auto hf = file[q]->prepare_weight(logical, "blk.0.ffn_up.weight", WeightRole::weight_role_matmul);
      ASSERT_TRUE(hg.ok() && hf.ok());
      g[q] = std::move(hg).value();
      f[q] = std::move(hf).value();
    }
  }
};

// ||a - b|| / ||b|| (NaN when b is all zeros, which fails any bound).
double relative_rms(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
    den += double{b[i]} * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::nan("");
}

TEST(CudaGemv, GroupedRowsGiveTheFileFormsProducts) {
  Forms forms;
  ASSERT_TRUE(forms.ok());
  auto& [grouped, file] = forms;
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  constexpr int64_t n = 37;
  for (const DType t : {DType::q4_0, DType::q4_1, DType::q5_0, DType::q5_1, DType::q8_0, DType::q6_k}) {
    // 2, 9 and 18 blocks a row: a last run of 2, 1 and 2 blocks; 4096: whole runs only. Q6_K: 1, 9 and 18
    // super-blocks, and whole runs.
    const std::vector<int64_t> ks = t == DType::q6_k ? std::vector<int64_t>{256, 2304, 4608, 8192}
                                                     : std::vector<int64_t>{64, 288, 576, 4096};
    for (const int64_t k : ks) {
      const std::vector<uint8_t> w = grouped_type_blocks(t, k, n, rng);
      const Tensor logical = make_tensor(t, const_cast<uint8_t*>(w.data()), k, n);
      const std::string what = fmt::format("{} k {}", dtype_name(t), k);
      std::unique_ptr<WeightHandle> hg[2], hf[2];  // on the exact backends, and the fast ones
      ASSERT_NO_FATAL_FAILURE(forms.prepare(logical, hg, hf));
      for (int q = 0; q < 2; ++q) {
        EXPECT_NE(hg[q]->weight.prepared, nullptr) << what;
        EXPECT_EQ(hf[q]->weight.prepared, nullptr) << what;
        EXPECT_EQ(hg[q]->weight.tensor.nb[1] % 16, 0) << what;
      }
      // An embedding table keeps the file's form (GetRows reads it).
      auto he = grouped[0]->prepare_weight(logical, "token_embd.weight", WeightRole::weight_role_embedding);
      ASSERT_TRUE(he.ok());
      EXPECT_EQ((*he)->weight.prepared, nullptr) << what;
      // 1-8 tokens: the GEMV; 12 and 40: the integer GEMV at the fast precision, else cuBLAS on dequantized
      // rows. Q6_K from 5 tokens at the fast precision: the tensor-core matmul, which takes grouped rows
      // always and the file's only where they are whole 16-byte chunks (k a multiple of 2048); elsewhere the
      // file's form takes the integer GEMV (12 tokens: the same integers summed in another order) or cuBLAS
      // (40: x not rounded).
      for (const int64_t m : {1, 3, 8, 12, 40}) {
        std::vector<float> x(static_cast<size_t>(k * m));
        for (float& v : x) v = uni(rng);
        for (const bool qx : {false, true}) {
          const std::vector<float> a = matmul_product(*grouped[qx], hg[qx]->weight, x.data(), m),
                                   b = matmul_product(*file[qx], hf[qx]->weight, x.data(), m);
          const bool q6_mmq_alone = t == DType::q6_k && qx && m >= 5 && k % 2048 != 0;
          const bool integer = qx && m <= 16 && (t != DType::q6_k || q6_mmq_alone);
          if (!integer && !q6_mmq_alone) {
            EXPECT_TRUE(a == b) << what << " m " << m << (qx ? " fast" : "");
            continue;
          }
          // x rounded to 8 bits against x in f32: well under 1% apart.
          EXPECT_LE(relative_rms(a, b), integer ? 1e-5 : 2e-2) << what << " m " << m << " integer GEMV";
        }
      }
    }
  }
}

TEST(CudaGemv, Fp8RowFormGivesTheFileFormsProducts) {
  // A weight of one scale a row is held in row form (its codes a plain e4m3 matrix); one of several keeps the
  // file's form. Exact: the same bits as the file's form for every m (the GEMV to 8 tokens, dequantized rows
  // and cublasSgemm beyond). Fast: the same bits to 4 tokens; from 5 to 8 the row form takes the tensor cores
  // on sm_90 (x in f16, Fp8RowsOnTensorCoresKeepTheExactProducts), the file's form the CUDA-core GEMV; beyond
  // 8, both take
  // cuBLASLt's e4m3 GEMM on the same codes and scales (the file's form rewritten into scratch first), which
  // may sum in another order.
  Forms forms;
  ASSERT_TRUE(forms.ok());
  auto& [grouped, file] = forms;
  std::mt19937_64 rng(13);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  constexpr int64_t n = 48;
  for (const int scales : {1, 4}) {
    for (const int64_t k : {int64_t{128}, int64_t{640}, int64_t{4096}}) {
      const std::vector<uint8_t> w = f8_blocks(k, n, scales, rng);
      const Tensor logical = make_tensor(DType::f8_e4m3, const_cast<uint8_t*>(w.data()), k, n);
      const std::string what = fmt::format("f8_e4m3 k {}, {} scale(s) a row", k, scales);
      std::unique_ptr<WeightHandle> hg[2], hf[2];
      ASSERT_NO_FATAL_FAILURE(forms.prepare(logical, hg, hf));
      for (int q = 0; q < 2; ++q) {
        EXPECT_EQ(hg[q]->weight.prepared != nullptr, scales == 1) << what;
        if (scales == 1) {
          EXPECT_EQ(hg[q]->weight.tensor.nb[1], k + 16) << what;
        }
      }
      for (const int64_t m : {1, 3, 8, 12, 40}) {
        std::vector<float> x(static_cast<size_t>(k * m));
        for (float& v : x) v = uni(rng);
        for (const bool fast : {false, true}) {
          const std::vector<float> a = matmul_product(*grouped[fast], hg[fast]->weight, x.data(), m),
                                   b = matmul_product(*file[fast], hf[fast]->weight, x.data(), m);
          if (fast && m >= 5 && m <= 8 && scales == 1) {
            EXPECT_LE(relative_rms(a, b), 1e-3) << what << " m " << m << " fast";
            continue;
          }
          if (!fast || m <= 8) {
            EXPECT_TRUE(a == b) << what << " m " << m << (fast ? " fast" : "");
            continue;
          }
          EXPECT_LE(relative_rms(a, b), 1e-5) << what << " m " << m << " fast";
        }
      }
    }
  }
}

TEST(CudaGemv, Fp8RowsOnTensorCoresKeepTheExactProducts) {
  // The GEMV of FP8 rows in row form at the fast precision on the tensor cores (rows of 16 a block, x scaled
  // by 2^-4 and rounded to f16, f32 sums; 1, 3 and 8 tokens) against the exact products (exact precision)
  // and the CUDA-core GEMV (CudaOptions::gemv_rows 8): rows past the last block of 16 (40 rows), k of one
  // warp step (64), of a partial unroll (640) and of many (4096, 14336), and x of magnitudes 1e-2 to 3e5 (f16
  // alone would overflow past 65504). Every value stays within f16's rounding of x of the exact sum, and a
  // token's values do not depend on the tokens beside it.
  CudaOptions o = cuda_options_from_env();
  o.precision = ops::Precision::precision_fast;
  o.gemv_rows = 16;  // the tensor cores for any tokens (by default from 5)
  std::unique_ptr<Backend> exact = cuda_backend(true, false), tensor = cuda_backend_with(o);
  o.gemv_rows = 8;
  std::unique_ptr<Backend> cores = cuda_backend_with(o);
  ASSERT_TRUE(exact && tensor && cores);
  std::mt19937_64 rng(17);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  constexpr int64_t n = 40;
  for (const int64_t k : {int64_t{64}, int64_t{640}, int64_t{4096}, int64_t{14336}}) {
    const std::vector<uint8_t> w = f8_blocks(k, n, 1, rng);
    const Tensor logical = make_tensor(DType::f8_e4m3, const_cast<uint8_t*>(w.data()), k, n);
    std::unique_ptr<WeightHandle> h[3];
    Backend* const backends[3] = {exact.get(), tensor.get(), cores.get()};
    for (int i = 0; i < 3; ++i) {
      auto made =
          backends[i]->prepare_weight(logical, "blk.0.ffn_down.weight", WeightRole::weight_role_matmul);
      ASSERT_TRUE(made.ok());
      h[i] = std::move(made).value();
      ASSERT_EQ(h[i]->weight.tensor.nb[1], k + 16) << "row form";
    }
    for (const float magnitude : {1e-2f, 1.0f, 3e5f}) {
      std::vector<float> x(static_cast<size_t>(k * 8));
      for (float& v : x) v = magnitude * uni(rng);
      std::vector<float> alone;  // token 0's values, alone
      for (const int64_t m : {1, 3, 8}) {
        const std::vector<float> want = matmul_product(*exact, h[0]->weight, x.data(), m),
                                 got = matmul_product(*tensor, h[1]->weight, x.data(), m),
                                 cuda_cores = matmul_product(*cores, h[2]->weight, x.data(), m);
        const std::string what = fmt::format("k {}, {} token(s), |x| up to {}", k, m, magnitude);
        EXPECT_LE(relative_rms(got, want), 1e-3) << what;
        EXPECT_LE(relative_rms(cuda_cores, want), 1e-6) << what;
        if (m == 1) alone = got;
        EXPECT_TRUE(std::equal(alone.begin(), alone.end(), got.begin())) << what << ": token 0 moved";
        // A value's bound: f16's relative step (2^-11) on each |w x| term, and 2^-21 absolute on x below
        // 2^-10.
        double worst = 0;
        for (int64_t q = 0; q < m; ++q) {
          for (int64_t j = 0; j < n; ++j) {
            float d;
            std::memcpy(&d, w.data() + j * (k / 32) * 36, 4);
            double bound = 0;
            for (int64_t i = 0; i < k; ++i) {
              const uint8_t code = w[static_cast<size_t>((j * (k / 32) + i / 32) * 36 + 4 + i % 32)];
              const double wx = std::fabs(double{d} * f8_e4m3_to_f32(code));
              bound += wx * (std::fabs(x[static_cast<size_t>(q * k + i)]) * 0x1p-11 + 0x1p-21);
            }
            const size_t at = static_cast<size_t>(q * n + j);
            worst = std::max(worst, std::fabs(double{got[at]} - want[at]) / (bound + 1e-30));
          }
        }
        EXPECT_LE(worst, 1.0) << what << ": a value past f16's rounding of x";
      }
    }
  }
}

}  // namespace
}  // namespace kiln
