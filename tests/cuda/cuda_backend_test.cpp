// The CUDA backend's memory model on a real device (built with a `cuda` preset; run by scripts/gpu-check.sh
// on the GPU machine): device buffers, uploads, downloads and copies round-trip bit for bit in stream order,
// prepare_weight keeps a device copy of the weight, an op without a kernel is unimplemented naming it, and
// bad transfers and device names are errors that say what is wrong.
#include "backends/cuda/cuda_backend.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "backends/backend.h"

namespace kiln {
namespace {

std::unique_ptr<Backend> cuda() {
  auto b = make_backend("cuda");
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  return b.ok() ? std::move(b).value() : nullptr;
}

TEST(CudaBackend, TransfersRoundTripInStreamOrder) {
  auto b = cuda();
  ASSERT_NE(b, nullptr);
  constexpr int64_t n = 1 << 20;  // 4 MiB of f32
  std::vector<float> host(n), back(n, 0.0f);
  std::iota(host.begin(), host.end(), 0.5f);
  auto a = b->allocate(n * sizeof(float)).value();
  auto c = b->allocate(n * sizeof(float)).value();
  EXPECT_FALSE(a->host_visible());
  const Tensor ta = make_tensor(DType::f32, *a, 0, n), tc = make_tensor(DType::f32, *c, 0, n);
  ASSERT_TRUE(b->upload(ta, host.data(), n * sizeof(float)).ok());
  ASSERT_TRUE(b->copy(tc, ta).ok());
  ASSERT_TRUE(b->download(back.data(), tc, n * sizeof(float)).ok());
  ASSERT_TRUE(b->synchronize().ok());
  EXPECT_EQ(back, host);
}

TEST(CudaBackend, PreparedWeightsLiveOnTheDevice) {
  auto b = cuda();
  ASSERT_NE(b, nullptr);
  std::vector<uint16_t> w(64 * 8);
  std::iota(w.begin(), w.end(), uint16_t{1});
  const Tensor logical = make_tensor(DType::f16, w.data(), 64, 8);
  auto h = b->prepare_weight(logical, "blk.0.attn_q.weight", WeightRole::weight_role_matmul);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  const Tensor& dev = (*h)->weight.tensor;
  EXPECT_NE(dev.data, logical.data);
  EXPECT_EQ(dev.buffer, (*h)->storage.get());
  EXPECT_EQ(dev.type, DType::f16);
  EXPECT_EQ(dev.ne, logical.ne);
  EXPECT_EQ((*h)->name, "blk.0.attn_q.weight");
  std::vector<uint16_t> back(w.size());
  ASSERT_TRUE(b->download(back.data(), dev, back.size() * 2).ok());
  ASSERT_TRUE(b->synchronize().ok());
  EXPECT_EQ(back, w);
}

TEST(CudaBackend, ErrorsSayWhatIsWrong) {
  auto b = cuda();
  ASSERT_NE(b, nullptr);
  auto buf = b->allocate(256).value();
  const Tensor t = make_tensor(DType::f32, *buf, 0, 64);
  std::vector<float> host(64);
  EXPECT_EQ(b->upload(t, host.data(), 100).code(), StatusCode::invalid_argument);
  // An op the kernels do not take (attention past 256 dims a head) is refused, by name, and nothing runs.
  auto big = b->allocate(4 * 512 * 4).value();
  std::vector<int32_t> zero = {0, 0}, indptr = {0, 1};
  const auto i32 = [&](int32_t* p, int64_t n) { return make_tensor(DType::i32, p, n); };
  const Tensor q = make_tensor(DType::f32, *big, 0, 512, 1, 1);
  const Tensor dst = make_tensor(DType::f32, *big, 2048, 512, 1, 1);
  const Tensor pool = make_tensor(DType::f32, *big, 4096, 512, 1, 1, 1);
  const ops::Op op = ops::Attention{q,
                                    pool,
                                    pool,
                                    i32(zero.data(), 1),
                                    i32(zero.data(), 1),
                                    i32(indptr.data(), 2),
                                    i32(zero.data(), 1),
                                    1.0f,
                                    0.0f,
                                    0,
                                    dst};
  ASSERT_TRUE(ops::check(op).ok()) << ops::check(op).to_string();
  EXPECT_FALSE(b->supports(op));
  const Status s = b->run(op);
  EXPECT_EQ(s.code(), StatusCode::unimplemented);
  EXPECT_NE(s.message().find("attention"), std::string::npos) << s.message();
  auto far = make_backend("cuda:99");
  EXPECT_EQ(far.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(far.status().message().find("cuda:99"), std::string::npos) << far.status().message();
  EXPECT_EQ(make_backend("cuda:x").status().code(), StatusCode::invalid_argument);
}

// A buffer may outlive its backend (the stream is shared): it is freed in order, without an error left
// behind.
TEST(CudaBackend, BuffersMayOutliveTheBackend) {
  auto b = cuda();
  ASSERT_NE(b, nullptr);
  std::unique_ptr<Buffer> kept = b->allocate(1 << 20).value();
  b.reset();
  kept.reset();
  auto again = cuda();
  ASSERT_NE(again, nullptr);
  EXPECT_TRUE(again->synchronize().ok());
}

// KILN_CUDA_PROFILE (CudaOptions::profile): the ops run one by one, and the table printed when the backend
// goes away gives each kind of op its calls, its kernels' time and the host's time to enqueue it.
TEST(CudaBackend, TheOpProfileTimesKernelsAndTheirEnqueueing) {
  CudaOptions options = cuda_options_from_env();
  options.profile = true;
  auto made = make_cuda_backend(0, options);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  std::unique_ptr<Backend> b = std::move(made).value();
  auto buf = b->allocate(2 * 16 * 4).value();
  const Tensor x = make_tensor(DType::f32, *buf, 0, 16), y = make_tensor(DType::f32, *buf, 64, 16);
  Program p;
  ASSERT_TRUE(p.add(ops::Scale{x, 2.0f, y}).ok());
  p.n_tokens = 1;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(b->run(p).ok());
  ASSERT_TRUE(b->synchronize().ok());
  testing::internal::CaptureStderr();
  b.reset();
  const std::string table = testing::internal::GetCapturedStderr();
  EXPECT_NE(table.find("ms enqueueing them"), std::string::npos) << table;
  EXPECT_NE(table.find("enqueue us"), std::string::npos) << table;
  EXPECT_NE(table.find("scale"), std::string::npos) << table;
  EXPECT_NE(table.find(" 3 "), std::string::npos) << table;  // its calls: every run op by op, none graphed
}

// A decode-sized program runs as a CUDA graph, replayed while it is the same program: the replay reads the
// data in the operands as they are now, and a changed parameter is captured anew.
TEST(CudaBackend, GraphReplaySeesNewDataAndNewParameters) {
  auto b = cuda();
  ASSERT_NE(b, nullptr);
  auto buf = b->allocate(2 * 16 * 4).value();
  const Tensor x = make_tensor(DType::f32, *buf, 0, 16), y = make_tensor(DType::f32, *buf, 64, 16);
  std::vector<float> in(16), out(16);
  const auto step = [&](float scale, float fill) {
    for (size_t i = 0; i < in.size(); ++i) in[i] = fill + static_cast<float>(i);
    EXPECT_TRUE(b->upload(x, in.data(), 64).ok());
    Program p;
    EXPECT_TRUE(p.add(ops::Scale{x, scale, y}).ok());
    p.n_tokens = 1;
    EXPECT_TRUE(b->run(p).ok());
    EXPECT_TRUE(b->download(out.data(), y, 64).ok());
    EXPECT_TRUE(b->synchronize().ok());
    for (size_t i = 0; i < out.size(); ++i)
      EXPECT_EQ(out[i], scale * in[i]) << "scale " << scale << " fill " << fill;
  };
  step(2.0f, 1.0f);  // captured
  step(2.0f, 5.0f);  // replayed, new data
  step(2.0f, 9.0f);
  step(3.0f, 9.0f);  // a new parameter: captured anew
  step(3.0f, -4.0f);
}

// The same Program object run again unchanged replays its graph without a signature (Program::version());
// changed in place, cleared and recorded with another parameter or with an op more, it is captured anew.
TEST(CudaBackend, AProgramChangedInPlaceIsCapturedAnew) {
  auto b = cuda();
  ASSERT_NE(b, nullptr);
  auto buf = b->allocate(3 * 16 * 4).value();
  const Tensor x = make_tensor(DType::f32, *buf, 0, 16), y = make_tensor(DType::f32, *buf, 64, 16),
               z = make_tensor(DType::f32, *buf, 128, 16);
  std::vector<float> in(16), out_y(16), out_z(16);
  Program p;
  p.n_tokens = 1;
  const auto run = [&](float fill, float want_y, float want_z) {
    for (size_t i = 0; i < in.size(); ++i) in[i] = fill + static_cast<float>(i);
    EXPECT_TRUE(b->upload(x, in.data(), 64).ok());
    EXPECT_TRUE(b->run(p).ok());
    EXPECT_TRUE(b->download(out_y.data(), y, 64).ok());
    EXPECT_TRUE(b->download(out_z.data(), z, 64).ok());
    EXPECT_TRUE(b->synchronize().ok());
    for (size_t i = 0; i < in.size(); ++i) {
      EXPECT_EQ(out_y[i], want_y * in[i]) << "fill " << fill;
      if (want_z != 0.0f) {
        EXPECT_EQ(out_z[i], want_z * in[i]) << "fill " << fill;
      }
    }
  };
  ASSERT_TRUE(p.add(ops::Scale{x, 2.0f, y}).ok());
  run(1.0f, 2.0f, 0.0f);  // captured
  run(5.0f, 2.0f, 0.0f);  // the same program: replayed, new data
  p.clear();
  ASSERT_TRUE(p.add(ops::Scale{x, 3.0f, y}).ok());
  run(7.0f, 3.0f, 0.0f);  // recorded anew with another parameter
  run(8.0f, 3.0f, 0.0f);
  ASSERT_TRUE(p.add(ops::Scale{y, 0.5f, z}).ok());
  run(9.0f, 3.0f, 1.5f);  // an op more
  run(-2.0f, 3.0f, 1.5f);
  p.clear();
  ASSERT_TRUE(p.add(ops::Scale{x, 3.0f, y}).ok());
  ASSERT_TRUE(p.add(ops::Scale{y, 0.5f, z}).ok());
  run(4.0f, 3.0f, 1.5f);  // the same ops recorded again: the graph captured last, by its signature
}

}  // namespace
}  // namespace kiln
