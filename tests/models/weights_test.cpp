// WeightLoader (models/weights.h): Q, K and V are prepared together (Backend::prepare_weight_group), whether
// the file holds them as three tensors or as row slices of one fused attn_qkv; each row of a fused tensor is
// counted once; a group's errors name the tensor.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "formats/gguf.h"
#include "models/blocks.h"

namespace kiln {
namespace {

constexpr int64_t kEmbd = 32, kHeads = 4, kKvHeads = 2, kHeadDim = 8;
constexpr int64_t kQDim = kHeads * kHeadDim, kKvDim = kKvHeads * kHeadDim;

// The CPU backend, recording the names of each prepare_weight_group call.
class Recording final : public Backend {
 public:
  explicit Recording(std::unique_ptr<Backend> cpu) : cpu_(std::move(cpu)) {}
  std::string_view name() const override { return cpu_->name(); }
  bool host_memory() const override { return cpu_->host_memory(); }
  bool supports(const ops::Op& op) const override { return cpu_->supports(op); }
  using Backend::run;
  Status run(const Program& program) override { return cpu_->run(program); }
  Result<std::unique_ptr<Buffer>> allocate(size_t bytes) override { return cpu_->allocate(bytes); }
  Status upload(const Tensor& dst, const void* src, size_t bytes) override {
    return cpu_->upload(dst, src, bytes);
  }
  Status download(void* dst, const Tensor& src, size_t bytes) override {
    return cpu_->download(dst, src, bytes);
  }
  Status copy(const Tensor& dst, const Tensor& src) override { return cpu_->copy(dst, src); }
  Status synchronize() override { return cpu_->synchronize(); }
  Result<std::unique_ptr<WeightHandle>> prepare_weight(const Tensor& logical, std::string_view name,
                                                       WeightRole role) override {
    return cpu_->prepare_weight(logical, name, role);
  }
  Result<std::vector<std::unique_ptr<WeightHandle>>> prepare_weight_group(
      std::span<const Tensor> logicals, std::span<const std::string> names, WeightRole role,
      const ReadDone& read_done) override {
    groups.emplace_back(names.begin(), names.end());
    return Backend::prepare_weight_group(logicals, names, role, read_done);
  }

  std::vector<std::vector<std::string>> groups;

 private:
  std::unique_ptr<Backend> cpu_;
};

std::vector<uint8_t> f32_bytes(int64_t n, float first) {
  std::vector<uint8_t> bytes(static_cast<size_t>(n) * 4);
  for (int64_t i = 0; i < n; ++i) {
    const float v = first + 0.001f * static_cast<float>(i);
    std::memcpy(bytes.data() + 4 * i, &v, 4);
  }
  return bytes;
}

// A layer's attention weights, Q/K/V as three tensors or one fused attn_qkv.
std::vector<uint8_t> attention_gguf(bool fused) {
  gguf::Writer writer;
  writer.set("general.architecture", gguf::Value::str("llama"));
  const auto add = [&](const std::string& name, int64_t rows, float first) {
    EXPECT_TRUE(
        writer.add_tensor("blk.0." + name, {kEmbd, rows}, DType::f32, f32_bytes(kEmbd * rows, first)).ok());
  };
  if (fused) {
    add("attn_qkv.weight", kQDim + 2 * kKvDim, 1.0f);
  } else {
    add("attn_q.weight", kQDim, 1.0f);
    add("attn_k.weight", kKvDim, 2.0f);
    add("attn_v.weight", kKvDim, 3.0f);
  }
  add("attn_output.weight", kEmbd, 4.0f);
  return writer.to_bytes().value();
}

float first_value(const ops::Weight& w) {
  float v = 0;
  std::memcpy(&v, w.tensor.data, 4);
  return v;
}

const blocks::AttentionShape kShape{static_cast<int32_t>(kHeads), static_cast<int32_t>(kKvHeads),
                                    static_cast<int32_t>(kHeadDim), 0.35f};

TEST(WeightLoader, QkvArePreparedTogether) {
  for (const bool fused : {false, true}) {
    const std::vector<uint8_t> bytes = attention_gguf(fused);
    const gguf::File file = gguf::File::parse(bytes, "attn.gguf").value();
    Recording backend(make_backend("cpu").value());
    blocks::WeightLoader loader(file, backend);
    Result<blocks::AttentionWeights> w = blocks::load_attention(loader, "blk.0.", kEmbd, kShape, false);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    const std::vector<std::string> want =
        fused ? std::vector<std::string>{"blk.0.attn_qkv.weight[q]", "blk.0.attn_qkv.weight[k]",
                                         "blk.0.attn_qkv.weight[v]"}
              : std::vector<std::string>{"blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight"};
    ASSERT_EQ(backend.groups.size(), 1u) << fused;
    EXPECT_EQ(backend.groups[0], want) << fused;
    EXPECT_EQ(w->wq.tensor.ne[1], kQDim);
    EXPECT_EQ(w->wk.tensor.ne[1], kKvDim);
    EXPECT_EQ(w->wv.tensor.ne[1], kKvDim);
    // Each matrix starts at its own rows: in a fused tensor, K after Q's rows and V after K's.
    const float row = 0.001f * kEmbd;
    EXPECT_FLOAT_EQ(first_value(w->wq), 1.0f);
    EXPECT_FLOAT_EQ(first_value(w->wk), fused ? 1.0f + row * kQDim : 2.0f);
    EXPECT_FLOAT_EQ(first_value(w->wv), fused ? 1.0f + row * (kQDim + kKvDim) : 3.0f);
    // Every row counted once, the fused tensor's included.
    EXPECT_EQ(loader.n_params(), kEmbd * (kQDim + 2 * kKvDim) + kEmbd * kEmbd) << fused;
    const std::vector<std::unique_ptr<WeightHandle>> handles = loader.release();
    ASSERT_EQ(handles.size(), 4u);
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(handles[i]->name, want[i]);
  }
}

TEST(WeightLoader, GroupErrorsNameTheTensor) {
  const std::vector<uint8_t> bytes = attention_gguf(true);
  const gguf::File file = gguf::File::parse(bytes, "attn.gguf").value();
  std::unique_ptr<Backend> backend = make_backend("cpu").value();
  blocks::WeightLoader loader(file, *backend);
  const std::string qkv = "blk.0.attn_qkv.weight";
  const int64_t rows = kQDim + 2 * kKvDim;
  // Rows past the tensor's end.
  std::vector<blocks::WeightLoader::GroupPart> parts = {{qkv, "q", rows, 0, kQDim},
                                                        {qkv, "k", rows, kQDim, rows}};
  Result<std::vector<ops::Weight>> w = loader.get_group(parts, WeightRole::weight_role_matmul, kEmbd);
  EXPECT_EQ(w.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(w.status().message().find(qkv), std::string::npos) << w.status().message();
  // A shape the file does not have.
  parts = {{qkv, "q", rows + 1, 0, kQDim}};
  w = loader.get_group(parts, WeightRole::weight_role_matmul, kEmbd);
  EXPECT_EQ(w.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(w.status().message().find(qkv), std::string::npos) << w.status().message();
  // A missing tensor.
  parts = {{"blk.0.attn_q.weight", "", kQDim, 0, kQDim}};
  w = loader.get_group(parts, WeightRole::weight_role_matmul, kEmbd);
  EXPECT_EQ(w.status().code(), StatusCode::not_found);
  EXPECT_NE(w.status().message().find("blk.0.attn_q.weight"), std::string::npos) << w.status().message();
}

// The default prepare_weight_group prepares each weight as prepare_weight does, in order, and wants a name a
// weight.
TEST(WeightLoader, DefaultGroupPreparesEachWeight) {
  std::unique_ptr<Backend> cpu = make_backend("cpu").value();
  const std::vector<uint8_t> a = f32_bytes(kEmbd * 4, 1.0f), b = f32_bytes(kEmbd * 2, 2.0f);
  const std::vector<Tensor> logicals = {make_tensor(DType::f32, const_cast<uint8_t*>(a.data()), kEmbd, 4),
                                        make_tensor(DType::f32, const_cast<uint8_t*>(b.data()), kEmbd, 2)};
  const std::vector<std::string> names = {"q", "k"};
  auto h = cpu->prepare_weight_group(logicals, names, WeightRole::weight_role_matmul, {});
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  ASSERT_EQ(h->size(), 2u);
  EXPECT_EQ((*h)[0]->name, "q");
  EXPECT_EQ((*h)[1]->name, "k");
  EXPECT_EQ((*h)[1]->logical.ne[1], 2);
  EXPECT_FLOAT_EQ(first_value((*h)[1]->weight), 2.0f);
  auto bad =
      cpu->prepare_weight_group(logicals, std::span(names).first(1), WeightRole::weight_role_matmul, {});
  EXPECT_EQ(bad.status().code(), StatusCode::invalid_argument);
}

}  // namespace
}  // namespace kiln
