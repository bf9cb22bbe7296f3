// The MoE block (models/moe.h) against a direct scalar computation of its formula: random small weights
// written to an in-memory GGUF, loaded by load_moe, run by moe_ffn on the CPU backend, compared per token
// with f64 loops over the dequantized weights (routing by softmax + top-k, the gated experts, the
// sigmoid-gated shared expert).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "formats/gguf.h"
#include "models/moe.h"

namespace kiln {
namespace {

using blocks::MoeShape;

constexpr int64_t kEmbd = 64, kTokens = 7, kExperts = 8, kFf = 32, kFfShared = 96;

// A weight tensor: its GGUF bytes and, for the scalar reference, its values after dequantization (rows of
// shape[0] values, in storage order).
struct Weight {
  std::vector<int64_t> shape;
  DType type;
  std::vector<uint8_t> bytes;
  std::vector<float> values;
  // Row r (counted over every dim but the first).
  const float* row(int64_t r) const { return values.data() + r * shape[0]; }
};

Weight make_weight(std::vector<int64_t> shape, DType type, std::mt19937_64& gen, float scale) {
  Weight w{std::move(shape), type, {}, {}};
  const int64_t k = w.shape[0];
  int64_t rows = 1;
  for (size_t d = 1; d < w.shape.size(); ++d) rows *= w.shape[d];
  const DTypeInfo& info = dtype_info(type);
  const int64_t row_bytes = dtype_row_bytes(type, k).value();
  w.bytes.resize(row_bytes * rows);
  w.values.resize(k * rows);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(k);
  for (int64_t r = 0; r < rows; ++r) {
    for (float& x : v) x = u(gen);
    uint8_t* dst = w.bytes.data() + r * row_bytes;
    if (type == DType::f32) {
      std::memcpy(dst, v.data(), row_bytes);
      std::copy(v.begin(), v.end(), w.values.begin() + r * k);
    } else {
      info.quantize_row(v.data(), dst, k);
      info.dequantize_row(dst, w.values.data() + r * k, k);
    }
  }
  return w;
}

// A layer's MoE weights, kept for the reference and written into a GGUF (names of layer "blk.3.").
struct Layer {
  Weight router, gate_exps, up_exps, down_exps;
  Weight gate_sh, up_sh, down_sh, gate_inp_sh;
  bool shared = false;
  std::vector<uint8_t> gguf;  // the file's bytes (the parsed File points into them)
};

std::unique_ptr<Layer> make_layer(DType type, bool shared, bool gate_2d, uint64_t seed) {
  std::mt19937_64 gen(seed);
  auto layer = std::make_unique<Layer>();
  Layer& l = *layer;
  l.shared = shared;
  l.router = make_weight({kEmbd, kExperts}, DType::f32, gen, 0.5f);
  l.gate_exps = make_weight({kEmbd, kFf, kExperts}, type, gen, 0.3f);
  l.up_exps = make_weight({kEmbd, kFf, kExperts}, type, gen, 0.3f);
  l.down_exps = make_weight({kFf, kEmbd, kExperts}, type, gen, 0.3f);
  gguf::Writer writer;
  writer.set("general.architecture", gguf::Value::str("test_moe"));
  auto add = [&](const std::string& name, const Weight& w) {
    ASSERT_TRUE(writer.add_tensor("blk.3." + name, w.shape, w.type, w.bytes).ok()) << name;
  };
  add("ffn_gate_inp.weight", l.router);
  add("ffn_gate_exps.weight", l.gate_exps);
  add("ffn_up_exps.weight", l.up_exps);
  add("ffn_down_exps.weight", l.down_exps);
  if (shared) {
    l.gate_sh = make_weight({kEmbd, kFfShared}, type, gen, 0.3f);
    l.up_sh = make_weight({kEmbd, kFfShared}, type, gen, 0.3f);
    l.down_sh = make_weight({kFfShared, kEmbd}, type, gen, 0.3f);
    l.gate_inp_sh = make_weight(gate_2d ? std::vector<int64_t>{kEmbd, 1} : std::vector<int64_t>{kEmbd},
                                DType::f32, gen, 0.5f);
    add("ffn_gate_shexp.weight", l.gate_sh);
    add("ffn_up_shexp.weight", l.up_sh);
    add("ffn_down_shexp.weight", l.down_sh);
    add("ffn_gate_inp_shexp.weight", l.gate_inp_sh);
  }
  l.gguf = writer.to_bytes().value();
  return layer;
}

double dot(const float* w, const std::vector<double>& x) {
  double s = 0.0;
  for (size_t i = 0; i < x.size(); ++i) s += static_cast<double>(w[i]) * x[i];
  return s;
}
double silu(double v) { return v / (1.0 + std::exp(-v)); }

// down(silu(gate x) * (up x)) for matrices whose rows start at row `first` of each weight.
std::vector<double> gated(const Weight& gate, const Weight& up, const Weight& down, int64_t n_ff,
                          int64_t first_ff, int64_t first_out, const std::vector<double>& x) {
  std::vector<double> h(n_ff), y(kEmbd);
  for (int64_t j = 0; j < n_ff; ++j)
    h[j] = silu(dot(gate.row(first_ff + j), x)) * dot(up.row(first_ff + j), x);
  for (int64_t i = 0; i < kEmbd; ++i) y[i] = dot(down.row(first_out + i), h);
  return y;
}

// The formula, token by token, in f64.
std::vector<double> reference(const Layer& l, const MoeShape& shape, const std::vector<float>& x_all) {
  std::vector<double> out(kEmbd * kTokens, 0.0);
  for (int64_t t = 0; t < kTokens; ++t) {
    const std::vector<double> x(x_all.begin() + t * kEmbd, x_all.begin() + (t + 1) * kEmbd);
    std::vector<double> p(kExperts);
    for (int64_t e = 0; e < kExperts; ++e) p[e] = dot(l.router.row(e), x);
    const double mx = *std::max_element(p.begin(), p.end());
    double sum = 0.0;
    for (double& v : p) sum += v = std::exp(v - mx);
    for (double& v : p) v /= sum;
    std::vector<int> order(kExperts);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
    double chosen = 0.0;
    for (int s = 0; s < shape.n_used; ++s) chosen += p[order[s]];
    for (int s = 0; s < shape.n_used; ++s) {
      const int e = order[s];
      const double w = p[e] / (shape.normalize ? chosen : 1.0);
      const std::vector<double> y = gated(l.gate_exps, l.up_exps, l.down_exps, kFf, e * kFf, e * kEmbd, x);
      for (int64_t i = 0; i < kEmbd; ++i) out[t * kEmbd + i] += w * y[i];
    }
    if (l.shared) {
      const double g = 1.0 / (1.0 + std::exp(-dot(l.gate_inp_sh.row(0), x)));
      const std::vector<double> y = gated(l.gate_sh, l.up_sh, l.down_sh, kFfShared, 0, 0, x);
      for (int64_t i = 0; i < kEmbd; ++i) out[t * kEmbd + i] += g * y[i];
    }
  }
  return out;
}

TEST(MoeBlock, MatchesTheFormula) {
  // The exact backend, and the fast one (x rounded to q8 blocks for the products).
  std::unique_ptr<Backend> backends[2];
  for (const bool qx : {false, true}) {
    BackendOptions options;
    options.n_threads = 3;
    options.precision = qx ? ops::Precision::precision_fast : ops::Precision::precision_exact;
    backends[qx] = make_backend("cpu", options).value();
  }
  int seed = 0;
  for (DType type : {DType::f32, DType::q4_0}) {
    for (bool shared : {false, true}) {
      const std::unique_ptr<Layer> layer = make_layer(type, shared, seed % 2 == 1, 100 + seed);
      ++seed;
      const gguf::File file = gguf::File::parse(layer->gguf, "moe.gguf").value();
      for (int32_t n_used : {1, 2}) {
        for (bool normalize : {false, true}) {
          const MoeShape shape{kExperts, n_used, kFf, kFfShared, normalize};
          std::mt19937_64 gen(seed * 31 + n_used);
          std::uniform_real_distribution<float> u(-1.0f, 1.0f);
          std::vector<float> x(kEmbd * kTokens);
          for (float& v : x) v = u(gen);
          const std::vector<double> want = reference(*layer, shape, x);
          for (bool qx : {false, true}) {
            Backend* backend = backends[qx].get();
            blocks::WeightLoader loader(file, *backend);
            Result<blocks::MoeWeights> w = blocks::load_moe(loader, "blk.3.", kEmbd, shape, shared);
            ASSERT_TRUE(w.ok()) << w.status().to_string();
            blocks::Arena arena(*backend);
            Program program;
            const blocks::StepTensors step;  // moe_ffn reads no step metadata
            blocks::Recorder rec{program, arena, step};
            const Tensor xt = make_tensor(DType::f32, x.data(), kEmbd, kTokens);
            Result<Tensor> out = blocks::moe_ffn(rec, xt, *w, shape);
            ASSERT_TRUE(out.ok()) << out.status().to_string();
            ASSERT_TRUE(backend->run(program).ok());
            ASSERT_TRUE(backend->synchronize().ok());
            double diff2 = 0.0, ref2 = 0.0;
            for (int64_t t = 0; t < kTokens; ++t) {
              for (int64_t i = 0; i < kEmbd; ++i) {
                const double d = out->row_as<float>(t)[i] - want[t * kEmbd + i];
                diff2 += d * d;
                ref2 += want[t * kEmbd + i] * want[t * kEmbd + i];
              }
            }
            // f32 accumulation: ~1e-7; precision_fast rounds activations to q8_0 (~0.4% per value) for q4_0.
            const double limit = qx && type != DType::f32 ? 2e-2 : 1e-5;
            EXPECT_LE(std::sqrt(diff2 / ref2), limit)
                << fmt::format("{} shared {} n_used {} normalize {} fast {}", dtype_name(type), shared,
                               n_used, normalize, qx);
            EXPECT_GT(ref2, 1e-3);
          }
        }
      }
    }
  }
}

TEST(MoeBlock, LoadErrorsNameTheTensor) {
  std::unique_ptr<Backend> backend = make_backend("cpu").value();
  const std::unique_ptr<Layer> plain = make_layer(DType::f32, false, false, 7);
  const gguf::File file = gguf::File::parse(plain->gguf, "moe.gguf").value();
  blocks::WeightLoader loader(file, *backend);
  MoeShape shape{kExperts, 2, kFf, kFfShared, true};
  // A shared expert the file does not have.
  Result<blocks::MoeWeights> w = blocks::load_moe(loader, "blk.3.", kEmbd, shape, true);
  EXPECT_EQ(w.status().code(), StatusCode::not_found);
  EXPECT_NE(w.status().message().find("blk.3.ffn_gate_shexp.weight"), std::string::npos)
      << w.status().message();
  // Expert count that does not match the stacked tensors.
  shape.n_expert = 4;
  w = blocks::load_moe(loader, "blk.3.", kEmbd, shape, false);
  EXPECT_EQ(w.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(w.status().message().find("ffn_gate_inp.weight"), std::string::npos) << w.status().message();
  shape = MoeShape{kExperts, 2, 2 * kFf, kFfShared, true};
  w = blocks::load_moe(loader, "blk.3.", kEmbd, shape, false);
  EXPECT_NE(w.status().message().find("ffn_gate_exps.weight"), std::string::npos) << w.status().message();
  // Impossible shapes.
  shape = MoeShape{kExperts, kExperts + 1, kFf, kFfShared, true};
  w = blocks::load_moe(loader, "blk.3.", kEmbd, shape, false);
  EXPECT_EQ(w.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(w.status().message().find("n_used"), std::string::npos) << w.status().message();
}

}  // namespace
}  // namespace kiln
