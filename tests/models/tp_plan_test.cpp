// Tensor parallelism's partition (models/tp_plan.h), checked on the CPU: a Llama-shaped layer's weights (8
// query heads, 2 KV heads, f32 and Q4_0, a MoE layer's stacked experts, the embedding and the output head)
// split over 2 and 4 ranks and put back together give every weight's bytes again (KV heads replicated over 4
// ranks counted once); the products of the parts are the layer's: each rank's Q/K/V and gate/up rows are
// those of the whole product, and the ranks' output-projection and down partial sums add up to the whole
// product (the all-reduce); the logits of the output head's parts are the whole logits. Shapes that do not
// divide, a fused weight and a column split inside a quantized block are refused with the numbers.
#include "models/tp_plan.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace kiln {
namespace {

using tp::Axis;
using tp::Part;
using tp::Plan;
using tp::Shape;

constexpr int64_t kEmbd = 256, kHd = 32, kFf = 512, kVocab = 1000;
const Shape kShape{
    .n_heads = 8, .n_kv_heads = 2, .head_dim = kHd, .n_ff = kFf, .n_experts = 4, .n_vocab = kVocab};

struct Weight {
  std::string name;
  DType type;
  int64_t ne[4];
  std::vector<uint8_t> bytes;
  Tensor tensor() {
    Tensor t = make_tensor(type, bytes.data(), ne[0], ne[1], ne[2], ne[3]);
    return t;
  }
};

Weight random_weight(const std::string& name, DType type, int64_t ne0, int64_t ne1, int64_t ne2,
                     std::mt19937& rng) {
  Weight w{name, type, {ne0, ne1, ne2, 1}, {}};
  const int64_t row = dtype_row_bytes(type, ne0).value();
  w.bytes.resize(static_cast<size_t>(row * ne1 * ne2));
  if (type == DType::f32) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (size_t i = 0; i < w.bytes.size(); i += 4) {
      const float v = normal(rng);
      std::memcpy(w.bytes.data() + i, &v, 4);
    }
  } else {
    std::vector<float> values(static_cast<size_t>(ne0));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t r = 0; r < ne1 * ne2; ++r) {
      for (float& v : values) v = normal(rng);
      dtype_info(type).quantize_row(values.data(), w.bytes.data() + r * row, ne0);
    }
  }
  return w;
}

// A layer of every kind of weight the plan splits or replicates.
std::vector<Weight> layer_weights(DType type, std::mt19937& rng) {
  const int64_t q = kShape.n_heads * kHd, kv = kShape.n_kv_heads * kHd;
  std::vector<Weight> w;
  w.push_back(random_weight("token_embd.weight", type, kEmbd, kVocab, 1, rng));
  w.push_back(random_weight("blk.0.attn_norm.weight", DType::f32, kEmbd, 1, 1, rng));
  w.push_back(random_weight("blk.0.attn_q.weight", type, kEmbd, q, 1, rng));
  w.push_back(random_weight("blk.0.attn_k.weight", type, kEmbd, kv, 1, rng));
  w.push_back(random_weight("blk.0.attn_v.weight", type, kEmbd, kv, 1, rng));
  w.push_back(random_weight("blk.0.attn_q.bias", DType::f32, q, 1, 1, rng));
  w.push_back(random_weight("blk.0.attn_k.bias", DType::f32, kv, 1, 1, rng));
  w.push_back(random_weight("blk.0.attn_output.weight", type, q, kEmbd, 1, rng));
  w.push_back(random_weight("blk.0.ffn_gate.weight", type, kEmbd, kFf, 1, rng));
  w.push_back(random_weight("blk.0.ffn_up.weight", type, kEmbd, kFf, 1, rng));
  w.push_back(random_weight("blk.0.ffn_down.weight", type, kFf, kEmbd, 1, rng));
  w.push_back(random_weight("blk.1.ffn_gate_inp.weight", DType::f32, kEmbd, kShape.n_experts, 1, rng));
  w.push_back(random_weight("blk.1.ffn_gate_exps.weight", type, kEmbd, 64, kShape.n_experts, rng));
  w.push_back(random_weight("blk.1.ffn_down_exps.weight", type, 64, kEmbd, kShape.n_experts, rng));
  w.push_back(random_weight("output_norm.weight", DType::f32, kEmbd, 1, 1, rng));
  w.push_back(random_weight("output.weight", type, kEmbd, kVocab, 1, rng));
  return w;
}

// The parts put back together along their axis: rows and experts one rank's after another's, columns within
// each row; parts that are equal (replicated KV heads, replicated weights) counted once.
std::vector<uint8_t> recombine(const Weight& w, const std::vector<Part>& parts,
                               const std::vector<std::vector<uint8_t>>& bytes) {
  std::vector<size_t> distinct;
  std::set<std::pair<int64_t, int64_t>> seen;
  for (size_t r = 0; r < parts.size(); ++r) {
    if (seen.insert({parts[r].begin, parts[r].end}).second) distinct.push_back(r);
  }
  std::vector<uint8_t> out;
  if (parts[0].axis != Axis::cols) {
    for (const size_t r : distinct) out.insert(out.end(), bytes[r].begin(), bytes[r].end());
    return out;
  }
  const int64_t rows = w.ne[1] * w.ne[2] * w.ne[3];
  for (int64_t row = 0; row < rows; ++row) {
    for (const size_t r : distinct) {
      const size_t width = bytes[r].size() / static_cast<size_t>(rows);
      out.insert(out.end(), bytes[r].begin() + row * width, bytes[r].begin() + (row + 1) * width);
    }
  }
  return out;
}

TEST(TpPlan, PartsPutBackTogetherAreTheWeights) {
  std::mt19937 rng(3);
  for (const DType type : {DType::f32, DType::q4_0}) {
    std::vector<Weight> weights = layer_weights(type, rng);
    for (const int32_t world : {1, 2, 4}) {
      auto plan = Plan::make(kShape, world);
      ASSERT_TRUE(plan.ok()) << plan.status().message();
      EXPECT_EQ(plan->kv_replicated(), world == 4);
      for (Weight& w : weights) {
        std::vector<Part> parts;
        std::vector<std::vector<uint8_t>> bytes;
        for (int32_t r = 0; r < world; ++r) {
          auto p = plan->part(w.name, w.type, w.ne, r);
          ASSERT_TRUE(p.ok()) << w.name << ": " << p.status().message();
          auto b = tp::slice(w.tensor(), *p);
          ASSERT_TRUE(b.ok()) << w.name << ": " << b.status().message();
          parts.push_back(*p);
          bytes.push_back(std::move(*b));
        }
        const std::string what = w.name + " " + dtype_name(type) + " over " + std::to_string(world);
        if (parts[0].axis == Axis::replicated) {
          for (const auto& b : bytes) EXPECT_EQ(b, w.bytes) << what;
          continue;
        }
        EXPECT_EQ(recombine(w, parts, bytes), w.bytes) << what;
        if (world > 1 && w.name.find(".ffn_gate_inp.") == std::string::npos &&
            w.name.find("norm") == std::string::npos) {
          EXPECT_LT(bytes[0].size(), w.bytes.size()) << what << ": not split";
        }
      }
    }
  }
}

// y = W x for a GGUF-layout f32 weight (ne[0] inputs, ne[1] outputs), rows [r0, r1) of W, columns [c0, c1)
// of W and of x.
std::vector<double> product(const Weight& w, const std::vector<float>& x, int64_t r0, int64_t r1, int64_t c0,
                            int64_t c1) {
  std::vector<double> y(static_cast<size_t>(r1 - r0), 0.0);
  for (int64_t j = r0; j < r1; ++j) {
    const auto* row = reinterpret_cast<const float*>(w.bytes.data()) + j * w.ne[0];
    for (int64_t i = c0; i < c1; ++i)
      y[static_cast<size_t>(j - r0)] += double{row[i]} * x[static_cast<size_t>(i)];
  }
  return y;
}

// The same from a rank's part (its own contiguous bytes: part.end - part.begin rows, or columns).
std::vector<double> part_product(const Weight& w, const Part& p, const std::vector<uint8_t>& bytes,
                                 const std::vector<float>& x) {
  Weight part = w;
  part.bytes = bytes;
  if (p.axis == Axis::rows) {
    part.ne[1] = p.end - p.begin;
    return product(part, x, 0, part.ne[1], 0, w.ne[0]);
  }
  part.ne[0] = p.end - p.begin;
  const std::vector<float> xs(x.begin() + p.begin, x.begin() + p.end);
  return product(part, xs, 0, w.ne[1], 0, part.ne[0]);
}

TEST(TpPlan, TheProductsOfThePartsAreTheLayers) {
  std::mt19937 rng(5);
  std::vector<Weight> weights = layer_weights(DType::f32, rng);
  const auto find = [&](const std::string& n) -> Weight& {
    for (Weight& w : weights)
      if (w.name == n) return w;
    throw std::runtime_error(n);
  };
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(kEmbd), a(static_cast<size_t>(kShape.n_heads * kHd)), h(kFf);
  for (float& v : x) v = normal(rng);
  for (float& v : a) v = normal(rng);  // attention's output, heads one after another
  for (float& v : h) v = normal(rng);  // the gated activation's output
  for (const int32_t world : {2, 4}) {
    const Plan plan = Plan::make(kShape, world).value();
    // Row splits: each rank's outputs are the whole product's rows of its heads / features / vocabulary.
    for (const char* n : {"blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight",
                          "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight", "output.weight"}) {
      Weight& w = find(n);
      const std::vector<double> whole = product(w, x, 0, w.ne[1], 0, w.ne[0]);
      for (int32_t r = 0; r < world; ++r) {
        const Part p = plan.part(n, w.type, w.ne, r).value();
        const std::vector<double> got = part_product(w, p, tp::slice(w.tensor(), p).value(), x);
        const std::vector<double> want(whole.begin() + p.begin, whole.begin() + p.end);
        EXPECT_EQ(got, want) << n << " rank " << r << " of " << world;
      }
    }
    // A rank's K/V heads are those its query heads read (heads of a group share one).
    const int32_t group = kShape.n_heads / kShape.n_kv_heads;
    for (int32_t r = 0; r < world; ++r) {
      for (int32_t hq = plan.first_head(r); hq < plan.first_head(r) + plan.heads_per_rank(); ++hq) {
        const int32_t kvh = hq / group;
        EXPECT_GE(kvh, plan.first_kv_head(r));
        EXPECT_LT(kvh, plan.first_kv_head(r) + plan.kv_heads_per_rank());
      }
    }
    // Column splits: the ranks' partial products add up to the whole (the all-reduce).
    for (const auto& [n, in] :
         {std::pair{"blk.0.attn_output.weight", &a}, std::pair{"blk.0.ffn_down.weight", &h}}) {
      Weight& w = find(n);
      const std::vector<double> whole = product(w, *in, 0, w.ne[1], 0, w.ne[0]);
      std::vector<double> sum(whole.size(), 0.0);
      for (int32_t r = 0; r < world; ++r) {
        const Part p = plan.part(n, w.type, w.ne, r).value();
        ASSERT_EQ(p.axis, Axis::cols);
        const std::vector<double> got = part_product(w, p, tp::slice(w.tensor(), p).value(), *in);
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += got[i];
      }
      for (size_t i = 0; i < sum.size(); ++i)
        EXPECT_NEAR(sum[i], whole[i], 1e-9 * (1 + std::fabs(whole[i]))) << n;
    }
  }
}

TEST(TpPlan, ShapesThatDoNotSplitAreRefused) {
  const auto refused = [](Shape s, int32_t world, const std::string& needle) {
    auto p = Plan::make(s, world);
    ASSERT_FALSE(p.ok()) << needle;
    EXPECT_NE(p.status().message().find(needle), std::string::npos) << p.status().message();
  };
  refused(kShape, 0, "a world of 0");
  Shape s = kShape;
  s.n_heads = 9, s.n_kv_heads = 3;
  refused(s, 2, "9 attention heads");
  s = kShape;
  s.n_heads = 12, s.n_kv_heads = 3;
  refused(s, 4, "3 KV heads");
  s = kShape;
  s.n_ff = 510;
  refused(s, 4, "510 FFN features");
  s = kShape;
  s.n_experts = 6;
  refused(s, 4, "6 experts");
  s = kShape;
  s.n_vocab = 1001;
  refused(s, 2, "vocabulary of 1001");

  // A weight whose extent is not the shape's, a fused weight, and a cut inside a quantized block.
  const Plan plan = Plan::make(kShape, 2).value();
  const int64_t q_ne[4] = {kEmbd, 300, 1, 1};
  auto p = plan.part("blk.0.attn_q.weight", DType::f32, q_ne, 0);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("has 300 along its split axis, expected 256"), std::string::npos)
      << p.status().message();
  const int64_t qkv_ne[4] = {kEmbd, 384, 1, 1};
  p = plan.part("blk.0.attn_qkv.weight", DType::f32, qkv_ne, 0);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("fused"), std::string::npos) << p.status().message();
  Shape wide = kShape;
  wide.head_dim = 48;  // 8 heads of 48 over 4: 96 columns a rank, not whole blocks of 256
  const Plan plan4 = Plan::make(wide, 4).value();
  const int64_t o_ne[4] = {8 * 48, kEmbd, 1, 1};
  p = plan4.part("blk.0.attn_output.weight", DType::q4_k, o_ne, 1);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("inside a block of 256"), std::string::npos) << p.status().message();
}

}  // namespace
}  // namespace kiln
