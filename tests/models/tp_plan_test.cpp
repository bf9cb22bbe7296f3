// Tensor parallelism's partition (models/tp_plan.h), checked on the CPU: a Llama-shaped layer's weights (8
// query heads, 2 KV heads, f32 and Q4_0), a MoE layer's stacked experts and shared expert, a Phi-3 layer's
// fused Q/K/V and gate+up, the embedding and the output head split over 1, 2 and 4 ranks and put back
// together give every weight's bytes again (KV heads replicated over 4 ranks written twice, the same bytes),
// and ranks' parts put back in another order do not; the replicated weights are exactly the norms, the
// embedding, the routers and the biases added after an all-reduce. The products of the parts are the
// layer's: each rank's Q/K/V, gate/up, expert gate/up and output-head rows are those of the whole product
// (a fused weight's: its Q, then K, then V rows), and the ranks' output-projection, down and expert-down
// partial sums add up to the whole product (the all-reduce). Shapes that do not divide, a weight of another
// extent or expert count, an expert bias and a column split inside a quantized block are refused with the
// numbers.
#include "models/tp_plan.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace kiln {
namespace {

using tp::Axis;
using tp::Part;
using tp::Plan;
using tp::Range;
using tp::Shape;

constexpr int64_t kEmbd = 256, kHd = 32, kFf = 512, kFfExp = 128, kShexp = 256, kVocab = 1000;
constexpr int32_t kExperts = 4;
const Shape kShape{.n_heads = 8,
                   .n_kv_heads = 2,
                   .head_dim = kHd,
                   .n_ff = kFf,
                   .n_experts = kExperts,
                   .n_ff_exp = kFfExp,
                   .n_vocab = kVocab};

struct Weight {
  std::string name;
  DType type;
  int64_t ne[4];
  std::vector<uint8_t> bytes;
  Tensor tensor() { return make_tensor(type, bytes.data(), ne[0], ne[1], ne[2], ne[3]); }
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

// A layer of every kind of weight the plan splits or replicates: a dense layer (blk.0), a MoE layer with a
// shared expert (blk.1), a Phi-3 layer's fused weights (blk.2).
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
  w.push_back(random_weight("blk.0.attn_output.bias", DType::f32, kEmbd, 1, 1, rng));
  w.push_back(random_weight("blk.0.ffn_gate.weight", type, kEmbd, kFf, 1, rng));
  w.push_back(random_weight("blk.0.ffn_up.weight", type, kEmbd, kFf, 1, rng));
  w.push_back(random_weight("blk.0.ffn_down.weight", type, kFf, kEmbd, 1, rng));
  w.push_back(random_weight("blk.0.ffn_down.bias", DType::f32, kEmbd, 1, 1, rng));
  w.push_back(random_weight("blk.1.ffn_gate_inp.weight", DType::f32, kEmbd, kExperts, 1, rng));
  w.push_back(random_weight("blk.1.ffn_gate_exps.weight", type, kEmbd, kFfExp, kExperts, rng));
  w.push_back(random_weight("blk.1.ffn_up_exps.weight", type, kEmbd, kFfExp, kExperts, rng));
  w.push_back(random_weight("blk.1.ffn_down_exps.weight", type, kFfExp, kEmbd, kExperts, rng));
  w.push_back(random_weight("blk.1.ffn_gate_shexp.weight", type, kEmbd, kShexp, 1, rng));
  w.push_back(random_weight("blk.1.ffn_up_shexp.weight", type, kEmbd, kShexp, 1, rng));
  w.push_back(random_weight("blk.1.ffn_down_shexp.weight", type, kShexp, kEmbd, 1, rng));
  w.push_back(random_weight("blk.1.ffn_gate_inp_shexp.weight", DType::f32, kEmbd, 1, 1, rng));
  w.push_back(random_weight("blk.2.attn_qkv.weight", type, kEmbd, q + 2 * kv, 1, rng));
  w.push_back(random_weight("blk.2.attn_qkv.bias", DType::f32, q + 2 * kv, 1, 1, rng));
  w.push_back(random_weight("blk.2.ffn_up.weight", type, kEmbd, 2 * kFf, 1, rng));
  w.push_back(random_weight("output_norm.weight", DType::f32, kEmbd, 1, 1, rng));
  w.push_back(random_weight("output.weight", type, kEmbd, kVocab, 1, rng));
  return w;
}

// The weights every rank holds whole.
const std::set<std::string> kReplicated = {"token_embd.weight",         "blk.0.attn_norm.weight",
                                           "blk.0.attn_output.bias",    "blk.0.ffn_down.bias",
                                           "blk.1.ffn_gate_inp.weight", "blk.1.ffn_gate_inp_shexp.weight",
                                           "output_norm.weight"};

std::vector<Range> ranges_of(const Part& p) {
  std::vector<Range> r{{p.begin, p.end}};
  r.insert(r.end(), p.more.begin(), p.more.end());
  return r;
}

// The parts put back where they came from: each rank's rows of each matrix, or columns of each row, range by
// range. Empty when two parts put different bytes in one place, or some place gets none.
std::vector<uint8_t> recombine(const Weight& w, const std::vector<Part>& parts,
                               const std::vector<std::vector<uint8_t>>& bytes) {
  std::vector<uint8_t> out(w.bytes.size());
  std::vector<bool> written(w.bytes.size(), false);
  const auto put = [&](size_t at, const uint8_t* from, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      if (written[at + i] && out[at + i] != from[i]) return false;
      out[at + i] = from[i];
      written[at + i] = true;
    }
    return true;
  };
  const size_t row = static_cast<size_t>(dtype_row_bytes(w.type, w.ne[0]).value());
  for (size_t r = 0; r < parts.size(); ++r) {
    const uint8_t* from = bytes[r].data();
    if (parts[r].axis == Axis::rows) {
      for (int64_t m = 0; m < w.ne[2] * w.ne[3]; ++m) {
        for (const Range& g : ranges_of(parts[r])) {
          const size_t n = static_cast<size_t>(g.end - g.begin) * row;
          if (!put((static_cast<size_t>(m * w.ne[1] + g.begin)) * row, from, n)) return {};
          from += n;
        }
      }
    } else {
      for (int64_t j = 0; j < w.ne[1] * w.ne[2] * w.ne[3]; ++j) {
        for (const Range& g : ranges_of(parts[r])) {
          const size_t skip = static_cast<size_t>(dtype_row_bytes(w.type, g.begin).value());
          const size_t n = static_cast<size_t>(dtype_row_bytes(w.type, g.end - g.begin).value());
          if (!put(static_cast<size_t>(j) * row + skip, from, n)) return {};
          from += n;
        }
      }
    }
  }
  for (const bool b : written) {
    if (!b) return {};
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
        EXPECT_EQ(parts[0].axis == Axis::replicated, kReplicated.count(w.name) == 1) << what;
        if (parts[0].axis == Axis::replicated) {
          for (const auto& b : bytes) EXPECT_EQ(b, w.bytes) << what;
          continue;
        }
        EXPECT_EQ(recombine(w, parts, bytes), w.bytes) << what;
        if (world == 1) continue;
        EXPECT_LT(bytes[0].size(), w.bytes.size()) << what << ": not split";
        // The ranks' bytes in another order are not the weight: the check sees where each part goes.
        std::vector<std::vector<uint8_t>> rotated(bytes.begin() + 1, bytes.end());
        rotated.push_back(bytes[0]);
        EXPECT_NE(recombine(w, parts, rotated), w.bytes) << what;
      }
    }
  }
}

// y = W x for a GGUF-layout f32 weight (ne[0] inputs, ne[1] outputs; matrix `m` of a stacked one).
std::vector<double> product(const Weight& w, const std::vector<float>& x, int64_t m = 0) {
  std::vector<double> y(static_cast<size_t>(w.ne[1]), 0.0);
  const auto* mat = reinterpret_cast<const float*>(w.bytes.data()) + m * w.ne[0] * w.ne[1];
  for (int64_t j = 0; j < w.ne[1]; ++j) {
    for (int64_t i = 0; i < w.ne[0]; ++i) y[static_cast<size_t>(j)] += double{mat[j * w.ne[0] + i]} * x[i];
  }
  return y;
}

// The same from a rank's part (its own contiguous bytes): its rows, or its columns (and x's).
std::vector<double> part_product(const Weight& w, const Part& p, const std::vector<uint8_t>& bytes,
                                 const std::vector<float>& x, int64_t m = 0) {
  Weight part = w;
  part.bytes = bytes;
  if (p.axis == Axis::rows) {
    part.ne[1] = p.size();
    return product(part, x, m);
  }
  part.ne[0] = p.size();
  std::vector<float> xs;
  for (const Range& g : ranges_of(p)) xs.insert(xs.end(), x.begin() + g.begin, x.begin() + g.end);
  return product(part, xs, m);
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
  const auto random = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& f : v) f = normal(rng);
    return v;
  };
  const std::vector<float> x = random(kEmbd);
  const std::vector<float> a = random(kShape.n_heads * kHd);  // attention's output, heads one after another
  const std::vector<float> h = random(kFf), he = random(kFfExp), hs = random(kShexp);  // gated activations
  for (const int32_t world : {2, 4}) {
    const Plan plan = Plan::make(kShape, world).value();
    // Row splits: each rank's outputs are the whole product's rows of its heads / features / vocabulary, a
    // fused weight's range by range; an expert weight's, expert by expert.
    for (const char* n :
         {"blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight", "blk.0.ffn_gate.weight",
          "blk.0.ffn_up.weight", "blk.1.ffn_gate_exps.weight", "blk.1.ffn_up_exps.weight",
          "blk.1.ffn_gate_shexp.weight", "blk.1.ffn_up_shexp.weight", "blk.2.attn_qkv.weight",
          "blk.2.ffn_up.weight", "output.weight"}) {
      Weight& w = find(n);
      for (int64_t m = 0; m < w.ne[2]; ++m) {
        const std::vector<double> whole = product(w, x, m);
        for (int32_t r = 0; r < world; ++r) {
          const Part p = plan.part(n, w.type, w.ne, r).value();
          ASSERT_EQ(p.axis, Axis::rows) << n;
          const std::vector<double> got = part_product(w, p, tp::slice(w.tensor(), p).value(), x, m);
          std::vector<double> want;
          for (const Range& g : ranges_of(p))
            want.insert(want.end(), whole.begin() + g.begin, whole.begin() + g.end);
          EXPECT_EQ(got, want) << n << " matrix " << m << " rank " << r << " of " << world;
        }
      }
    }
    // A rank's K/V heads are those its query heads read (heads of a group share one), in the fused weight
    // too: its Q rows, then its K and V rows, as many as its shape's.
    const int32_t group = kShape.n_heads / kShape.n_kv_heads;
    for (int32_t r = 0; r < world; ++r) {
      for (int32_t hq = plan.first_head(r); hq < plan.first_head(r) + plan.heads_per_rank(); ++hq) {
        const int32_t kvh = hq / group;
        EXPECT_GE(kvh, plan.first_kv_head(r));
        EXPECT_LT(kvh, plan.first_kv_head(r) + plan.kv_heads_per_rank());
      }
      const Weight& qkv = find("blk.2.attn_qkv.weight");
      const Part p = plan.part(qkv.name, qkv.type, qkv.ne, r).value();
      const int64_t q = kShape.n_heads * kHd, kv = kShape.n_kv_heads * kHd, k0 = plan.first_kv_head(r) * kHd;
      ASSERT_EQ(p.more.size(), 2u);
      EXPECT_EQ(p.begin, plan.first_head(r) * kHd);
      EXPECT_EQ(p.more[0].begin, q + k0);
      EXPECT_EQ(p.more[1].begin, q + kv + k0);
      EXPECT_EQ(p.size(), (plan.heads_per_rank() + 2 * plan.kv_heads_per_rank()) * kHd);
    }
    // Column splits: the ranks' partial products add up to the whole (the all-reduce), expert by expert.
    for (const auto& [n, in] :
         {std::pair{"blk.0.attn_output.weight", &a}, std::pair{"blk.0.ffn_down.weight", &h},
          std::pair{"blk.1.ffn_down_exps.weight", &he}, std::pair{"blk.1.ffn_down_shexp.weight", &hs}}) {
      Weight& w = find(n);
      for (int64_t m = 0; m < w.ne[2]; ++m) {
        const std::vector<double> whole = product(w, *in, m);
        std::vector<double> sum(whole.size(), 0.0);
        for (int32_t r = 0; r < world; ++r) {
          const Part p = plan.part(n, w.type, w.ne, r).value();
          ASSERT_EQ(p.axis, Axis::cols);
          const std::vector<double> got = part_product(w, p, tp::slice(w.tensor(), p).value(), *in, m);
          for (size_t i = 0; i < sum.size(); ++i) sum[i] += got[i];
        }
        for (size_t i = 0; i < sum.size(); ++i)
          EXPECT_NEAR(sum[i], whole[i], 1e-9 * (1 + std::fabs(whole[i]))) << n << " matrix " << m;
      }
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
  s.n_ff_exp = 130;
  refused(s, 4, "130 features of each expert");
  s = kShape;
  s.n_ff_exp = 0;
  refused(s, 2, "4 experts of 0 features");
  s = kShape;
  s.n_vocab = 1001;
  refused(s, 2, "vocabulary of 1001");
  s = kShape;
  s.n_experts = 6;  // experts are split by their features: any count
  EXPECT_TRUE(Plan::make(s, 4).ok());

  const auto part_refused = [](const Plan& plan, const std::string& name, DType type, std::vector<int64_t> ne,
                               const std::string& needle) {
    ne.resize(4, 1);
    auto p = plan.part(name, type, ne.data(), 1);
    ASSERT_FALSE(p.ok()) << name;
    EXPECT_NE(p.status().message().find(needle), std::string::npos) << p.status().message();
  };
  // A weight whose extent is not the shape's, a fused weight of another width, a stack of other experts, an
  // expert bias, and a cut inside a quantized block.
  const Plan plan = Plan::make(kShape, 2).value();
  part_refused(plan, "blk.0.attn_q.weight", DType::f32, {kEmbd, 300},
               "has 300 along its split axis, expected 256");
  part_refused(plan, "blk.0.attn_qkv.weight", DType::f32, {kEmbd, 400},
               "has 400 along its split axis, expected 384");
  part_refused(plan, "blk.0.ffn_up_exps.weight", DType::f32, {kEmbd, kFfExp, 8},
               "stacks 8 experts, expected 4");
  part_refused(plan, "blk.0.ffn_down_exps.bias", DType::f32, {kEmbd, kExperts}, "expert bias");
  part_refused(plan, "blk.0.ffn_gate_shexp.weight", DType::f32, {kEmbd, 257}, "has 257 along its split axis");
  Shape wide = kShape;
  wide.head_dim = 48;  // 8 heads of 48 over 4: 96 columns a rank, not whole blocks of 256
  part_refused(Plan::make(wide, 4).value(), "blk.0.attn_output.weight", DType::q4_k, {8 * 48, kEmbd},
               "inside a block of 256");
  Shape experts = kShape;
  experts.n_ff_exp = 384;  // 192 columns of each expert's down a rank
  part_refused(Plan::make(experts, 2).value(), "blk.0.ffn_down_exps.weight", DType::q4_k,
               {384, kEmbd, kExperts}, "cut at column 192, inside a block of 256");
}

}  // namespace
}  // namespace kiln
