// The add + RMSNorm and the gated activation that round their results to e4m3 for the FP8 GEMMs after them
// (cuda::E4m3Out: add_norm_gemm_group, glu_gemm_group) give the GEMMs the codes and scales that the rounding
// kernel of the ops one by one gives (fp8_x_rows): an FFN half-layer of FP8 weights in row form, at the
// widths where the kernels take their other paths, run with fusion and without, bit for bit, in steps of at
// least the device's multiprocessors in rows (fewer keep the kernels apart: cuda::produced_e4m3_x). Rows of
// 4096 (a norm's slices in registers, packed into one block a row), 8192 (packed, each slice read twice:
// longer than the 1024-thread kernel's registers hold) and 16384 (a cluster of blocks a row, the row's
// largest value exchanged between them); activation rows of 20,480 (each thread's groups past its registers
// read back from dst) and shorter; per token and with static scales (the checkpoint's input_scale,
// saturating), the activation written apart and over its gate.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/cuda/cuda_backend.h"
#include "cuda_matmul_product.h"

namespace kiln {
namespace {

struct FfnShape {
  int64_t n, ff;
};

// The host operands of one shape: x, att and the norm's weight (f32), gate, up and down (f8_e4m3, a scale a
// row, as f8_blocks makes them).
struct FfnHost {
  std::vector<float> x, att, nw;
  std::vector<uint8_t> wg, wu, wd;
};

FfnHost make_host(const FfnShape& s, int64_t m) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  FfnHost h;
  for (auto* v : {&h.x, &h.att}) {
    v->resize(static_cast<size_t>(s.n * m));
    for (float& e : *v) e = uni(rng);
  }
  h.nw.resize(static_cast<size_t>(s.n));
  for (float& e : h.nw) e = uni(rng);
  h.wg = f8_blocks(s.n, s.ff, 1, rng);
  h.wu = f8_blocks(s.n, s.ff, 1, rng);
  h.wd = f8_blocks(s.ff, s.n, 1, rng);
  return h;
}

struct Scales {
  float gate_up = 0.0f, down = 0.0f;  // input_scale of gate and up, of down; 0: per token
};

// x += att; h = rms_norm(x); g = h Wg; u = h Wu; a = silu(g) u (a = g when in_place); o = a Wd: every
// operand's bytes after two runs (the second replays the first's graph where graphs are on).
std::vector<uint8_t> run_ffn(bool fuse, const FfnShape& s, int64_t m, const FfnHost& host, Scales sc,
                             bool in_place) {
  CudaOptions options = cuda_options_from_env();
  options.fuse = fuse;
  options.precision = ops::Precision::precision_fast;
  auto made = make_cuda_backend(0, options);
  EXPECT_TRUE(made.ok()) << made.status().to_string();
  if (!made.ok()) return {};
  Backend& b = **made;
  const auto prepare = [&](const std::vector<uint8_t>& w, int64_t k, int64_t rows, const char* name,
                           float input_scale) {
    auto h = b.prepare_weight(make_tensor(DType::f8_e4m3, const_cast<uint8_t*>(w.data()), k, rows), name,
                              WeightRole::weight_role_matmul);
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    std::unique_ptr<WeightHandle> handle = std::move(h).value();
    handle->weight.input_scale = input_scale;
    return handle;
  };
  const auto wg = prepare(host.wg, s.n, s.ff, "blk.0.ffn_gate.weight", sc.gate_up);
  const auto wu = prepare(host.wu, s.n, s.ff, "blk.0.ffn_up.weight", sc.gate_up);
  const auto wd = prepare(host.wd, s.ff, s.n, "blk.0.ffn_down.weight", sc.down);
  // One buffer: x, att, h, o of n x m; nw; g, u, a of ff x m (each 256-byte aligned).
  const auto room = [](int64_t elems) { return (elems * 4 + 255) / 256 * 256; };
  const int64_t nm = room(s.n * m), fm = room(s.ff * m), nw_bytes = room(s.n);
  const int64_t bytes = 4 * nm + nw_bytes + 3 * fm;
  auto buf = b.allocate(static_cast<size_t>(bytes)).value();
  std::vector<uint8_t> init(static_cast<size_t>(bytes), 0);
  std::memcpy(init.data(), host.x.data(), host.x.size() * 4);
  std::memcpy(init.data() + nm, host.att.data(), host.att.size() * 4);
  std::memcpy(init.data() + 4 * nm, host.nw.data(), host.nw.size() * 4);
  const Tensor all = make_tensor(DType::i8, *buf, 0, bytes);
  EXPECT_TRUE(b.upload(all, init.data(), init.size()).ok());
  const Tensor x = make_tensor(DType::f32, *buf, 0, s.n, m), att = make_tensor(DType::f32, *buf, nm, s.n, m),
               h = make_tensor(DType::f32, *buf, 2 * nm, s.n, m),
               o = make_tensor(DType::f32, *buf, 3 * nm, s.n, m);
  const Tensor nw = make_tensor(DType::f32, *buf, 4 * nm, s.n);
  const int64_t f0 = 4 * nm + nw_bytes;
  const Tensor g = make_tensor(DType::f32, *buf, f0, s.ff, m),
               u = make_tensor(DType::f32, *buf, f0 + fm, s.ff, m),
               a = in_place ? g : make_tensor(DType::f32, *buf, f0 + 2 * fm, s.ff, m);
  Program p;
  EXPECT_TRUE(p.add(ops::Binary{x, ops::Weight(att), ops::BinaryKind::binary_kind_add, x}).ok());
  EXPECT_TRUE(p.add(ops::RmsNorm{x, ops::Weight(nw), 1e-5f, false, h}).ok());
  EXPECT_TRUE(p.add(ops::Matmul{wg->weight, h, g}).ok());
  EXPECT_TRUE(p.add(ops::Matmul{wu->weight, h, u}).ok());
  EXPECT_TRUE(p.add(ops::GatedAct{g, u, ops::GluKind::glu_kind_silu, a}).ok());
  EXPECT_TRUE(p.add(ops::Matmul{wd->weight, a, o}).ok());
  p.n_tokens = static_cast<int32_t>(m);
  for (int rep = 0; rep < 2; ++rep) EXPECT_TRUE(b.run(p).ok());
  std::vector<uint8_t> out(static_cast<size_t>(bytes));
  EXPECT_TRUE(b.download(out.data(), all, out.size()).ok());
  EXPECT_TRUE(b.synchronize().ok());
  return out;
}

TEST(CudaFp8Fusion, NormAndActivationRoundXAsTheRoundingKernel) {
  // Static scales: h's values reach about 3 (some saturate at 0.005 x 448), the activation's far more.
  const Scales per_token{}, fixed{0.005f, 2.0e4f};
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  for (const FfnShape s : {FfnShape{4096, 20480}, FfnShape{8192, 2048}, FfnShape{16384, 1024}}) {
    for (const int64_t m : {int64_t{sms}, int64_t{sms} * 2 + 5}) {
      const FfnHost host = make_host(s, m);
      for (const Scales sc : {per_token, fixed}) {
        for (const bool in_place : {false, true}) {
          if (in_place && sc.gate_up > 0.0f) continue;  // one in-place case a size
          const std::vector<uint8_t> fused = run_ffn(true, s, m, host, sc, in_place),
                                     alone = run_ffn(false, s, m, host, sc, in_place);
          ASSERT_EQ(fused.size(), alone.size());
          ASSERT_FALSE(fused.empty());
          const auto first_diff =
              std::mismatch(fused.begin(), fused.end(), alone.begin()).first - fused.begin();
          EXPECT_EQ(first_diff, std::ssize(fused))
              << "n " << s.n << " ff " << s.ff << " m " << m << (sc.gate_up > 0.0f ? " static" : " per token")
              << (in_place ? " in place" : "") << ": first differing byte";
        }
      }
    }
  }
}

}  // namespace
}  // namespace kiln
