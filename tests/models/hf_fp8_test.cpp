// FP8 Hugging Face folders (models/hf_fp8.h) through hf_import: small folders written here, one per scheme
// (compressed-tensors per tensor, per channel and per 128x128 block; modelopt in config.json and in
// hf_quant_config.json; "fp8" with weight_scale_inv), each weight's imported f8_e4m3 rows held to the values
// q * scale computed here from the checkpoint's own definition (Q/K rows in GGUF's RoPE order, each expert
// with its own scale), the model run on the CPU against the same weights in f32, and every bad input a
// named error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "core/dtype.h"
#include "core/half.h"
#include "formats/gguf.h"
#include "models/model.h"

namespace kiln {
namespace {

using nlohmann::json;

// The tiny Llama every folder holds: 5 heads of 32, 1 KV head; 160 and 224 are multiples of 32 (kiln's FP8
// block) and not of 128 (the checkpoints' scale block), so the block scales' last blocks are partial.
constexpr int64_t kEmbd = 160, kHeads = 5, kKvHeads = 1, kHeadDim = 32, kFf = 224, kVocab = 96;

// One tensor of a safetensors file.
struct StTensor {
  std::string name, dtype;  // "F32", "BF16", "F8_E4M3"
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

void write_safetensors(const std::filesystem::path& path, const std::vector<StTensor>& tensors) {
  json header = json::object();
  uint64_t at = 0;
  for (const StTensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {at, at + t.bytes.size()}}};
    at += t.bytes.size();
  }
  const std::string text = header.dump();
  const uint64_t n = text.size();
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const StTensor& t : tensors) f.write(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::vector<uint8_t> bf16_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 2);
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t h = f32_to_bf16(v[i]);
    std::memcpy(b.data() + 2 * i, &h, 2);
  }
  return b;
}

enum class Scale { tensor, channel, block };

// How a folder is written.
struct Scheme {
  json quant;  // config.json's quantization_config; null: none
  Scale scale = Scale::channel;
  std::string suffix = ".weight_scale";
  std::string scale_dtype = "F32";  // or "BF16"
  int64_t block_rows = 128, block_cols = 128;
  bool scalar_shape = false;  // a per-tensor scale of shape [] (modelopt) rather than [1]
  bool input_scales = false;  // static activation scales beside the weights
  bool kv_scales = false;     // k_scale / v_scale
};

json compressed_tensors(const char* strategy, json input_activations = nullptr) {
  json weights = {{"num_bits", 8}, {"type", "float"}, {"strategy", strategy}, {"symmetric", true}};
  if (std::string(strategy) == "block") weights["block_structure"] = {128, 128};
  return {{"quant_method", "compressed-tensors"},
          {"format", "float-quantized"},
          {"ignore", {"lm_head"}},
          {"config_groups",
           {{"group_0",
             {{"targets", {"Linear"}}, {"weights", weights}, {"input_activations", input_activations}}}}}};
}

// A folder being built: its tensors (editable before write()) and each FP8 weight's values q * scale.
struct Folder {
  std::filesystem::path dir;
  json config;
  std::vector<StTensor> tensors;
  std::map<std::string, std::vector<float>> values;  // HF weight name -> [out, in] row-major

  StTensor* find(const std::string& name) {
    for (StTensor& t : tensors) {
      if (t.name == name) return &t;
    }
    return nullptr;
  }
  void erase(const std::string& name) {
    std::erase_if(tensors, [&](const StTensor& t) { return t.name == name; });
  }
  std::string write() const {
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "config.json") << config.dump(2);
    write_safetensors(dir / "model.safetensors", tensors);
    return dir.string();
  }
};

// The folders fresh_dir made for the running test, removed when it ends (HfFp8::TearDown).
std::vector<std::filesystem::path>& made_dirs() {
  static std::vector<std::filesystem::path> dirs;
  return dirs;
}

// A folder of its own for each test and name (tests may run in parallel processes).
std::filesystem::path fresh_dir(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::filesystem::path d =
      std::filesystem::temp_directory_path() / ("kiln_hf_fp8_" + std::string(info->test_suite_name()) + "_" +
                                                info->name() + "_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  made_dirs().push_back(d);
  return d;
}

class HfFp8 : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const std::filesystem::path& d : made_dirs()) {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
    }
    made_dirs().clear();
  }
};

// Adds the F8_E4M3 weight `name` [out, in] quantized from random values under `s`, its scale, and its values.
void add_fp8(Folder& f, const Scheme& s, const std::string& name, int64_t out, int64_t in,
             std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(out * in));
  for (int64_t r = 0; r < out; ++r) {
    const float a = 0.02f + 0.1f * static_cast<float>(r % 7) / 7.0f;  // rows of different sizes
    for (int64_t c = 0; c < in; ++c) w[r * in + c] = a * u(rng);
  }
  // The scale grid: one value per (row group, column group).
  const int64_t rg = s.scale == Scale::tensor ? out : s.scale == Scale::channel ? 1 : s.block_rows;
  const int64_t cg = s.scale == Scale::block ? s.block_cols : in;
  const int64_t nr = (out + rg - 1) / rg, nc = (in + cg - 1) / cg;
  std::vector<float> scale(static_cast<size_t>(nr * nc), 0.0f);
  for (int64_t r = 0; r < out; ++r) {
    for (int64_t c = 0; c < in; ++c) {
      float& m = scale[(r / rg) * nc + c / cg];
      m = std::max(m, std::fabs(w[r * in + c]) / 448.0f);
    }
  }
  if (s.scale_dtype == "BF16") {
    for (float& v : scale) v = bf16_to_f32(f32_to_bf16(v));
  }
  StTensor q{name + ".weight", "F8_E4M3", {out, in}, std::vector<uint8_t>(static_cast<size_t>(out * in))};
  std::vector<float>& v = f.values[name + ".weight"];
  v.resize(w.size());
  for (int64_t r = 0; r < out; ++r) {
    for (int64_t c = 0; c < in; ++c) {
      const float d = scale[(r / rg) * nc + c / cg];
      q.bytes[r * in + c] = f32_to_f8_e4m3(w[r * in + c] / d);
      v[r * in + c] = d * f8_e4m3_to_f32(q.bytes[r * in + c]);
    }
  }
  f.tensors.push_back(std::move(q));
  std::vector<int64_t> shape = {nr, nc};
  if (s.scale == Scale::tensor) shape = s.scalar_shape ? std::vector<int64_t>{} : std::vector<int64_t>{1};
  f.tensors.push_back({name + s.suffix, s.scale_dtype, shape,
                       s.scale_dtype == "BF16" ? bf16_bytes(scale) : f32_bytes(scale)});
  if (s.input_scales)
    f.tensors.push_back(
        {name + ".input_scale", "F32", shape.empty() ? shape : std::vector<int64_t>{1}, f32_bytes({0.05f})});
}

std::vector<float> random_f32(int64_t n, float lo, float hi, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

// A one-layer Llama folder with every projection in FP8 under `s`.
Folder llama(const Scheme& s, const std::string& dir_name = "llama", int64_t ff = kFf) {
  std::mt19937 rng(7);
  Folder f;
  f.dir = fresh_dir(dir_name);
  f.config = {{"architectures", {"LlamaForCausalLM"}},
              {"model_type", "llama"},
              {"hidden_size", kEmbd},
              {"num_hidden_layers", 1},
              {"num_attention_heads", kHeads},
              {"num_key_value_heads", kKvHeads},
              {"intermediate_size", ff},
              {"vocab_size", kVocab},
              {"rms_norm_eps", 1e-5},
              {"max_position_embeddings", 64},
              {"tie_word_embeddings", true}};
  if (!s.quant.is_null()) f.config["quantization_config"] = s.quant;
  f.tensors.push_back({"model.embed_tokens.weight",
                       "F32",
                       {kVocab, kEmbd},
                       f32_bytes(random_f32(kVocab * kEmbd, -1, 1, rng))});
  f.tensors.push_back({"model.norm.weight", "F32", {kEmbd}, f32_bytes(random_f32(kEmbd, 0.5f, 1.5f, rng))});
  const std::string l = "model.layers.0.";
  f.tensors.push_back(
      {l + "input_layernorm.weight", "F32", {kEmbd}, f32_bytes(random_f32(kEmbd, 0.5f, 1.5f, rng))});
  f.tensors.push_back(
      {l + "post_attention_layernorm.weight", "F32", {kEmbd}, f32_bytes(random_f32(kEmbd, 0.5f, 1.5f, rng))});
  add_fp8(f, s, l + "self_attn.q_proj", kHeads * kHeadDim, kEmbd, rng);
  add_fp8(f, s, l + "self_attn.k_proj", kKvHeads * kHeadDim, kEmbd, rng);
  add_fp8(f, s, l + "self_attn.v_proj", kKvHeads * kHeadDim, kEmbd, rng);
  add_fp8(f, s, l + "self_attn.o_proj", kEmbd, kHeads * kHeadDim, rng);
  add_fp8(f, s, l + "mlp.gate_proj", ff, kEmbd, rng);
  add_fp8(f, s, l + "mlp.up_proj", ff, kEmbd, rng);
  add_fp8(f, s, l + "mlp.down_proj", kEmbd, ff, rng);
  if (s.kv_scales) {
    f.tensors.push_back({l + "self_attn.k_scale", "F32", {}, f32_bytes({1.0f})});
    f.tensors.push_back({l + "self_attn.v_scale", "F32", {}, f32_bytes({1.0f})});
  }
  return f;
}

// GGUF's order of a Q or K weight's rows: within each head, HF rows i and i + hd/2 become rows 2i and 2i + 1.
// The HF row that GGUF row j holds.
int64_t hf_row(int64_t j, bool permuted) {
  if (!permuted) return j;
  const int64_t h = j / kHeadDim, i = (j % kHeadDim) / 2, b = j % 2;
  return h * kHeadDim + b * (kHeadDim / 2) + i;
}

// The imported `name` [in, out, n_mats] is `type` and holds `want` (HF order, matrix after matrix) exactly.
void expect_values(const gguf::File& file, const std::string& name, DType type,
                   const std::vector<float>& want, int64_t in, int64_t out, bool permuted = false,
                   int64_t n_mats = 1) {
  SCOPED_TRACE(name);
  const gguf::TensorInfo* t = file.find_tensor(name);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->type, type);
  const std::vector<int64_t> shape =
      n_mats == 1 ? std::vector<int64_t>{in, out} : std::vector<int64_t>{in, out, n_mats};
  ASSERT_EQ(t->shape, shape);
  const int64_t row_bytes = dtype_row_bytes(type, in).value();
  ASSERT_EQ(t->n_bytes, static_cast<uint64_t>(row_bytes * out * n_mats));
  std::vector<float> row(static_cast<size_t>(in));
  int64_t wrong = 0;
  for (int64_t j = 0; j < out * n_mats; ++j) {
    const uint8_t* src = t->data + j * row_bytes;
    if (type == DType::f32) {
      std::memcpy(row.data(), src, row.size() * 4);
    } else {
      dtype_info(type).dequantize_row(src, row.data(), in);
    }
    const int64_t from = (j / out) * out + hf_row(j % out, permuted);
    for (int64_t c = 0; c < in; ++c) {
      if (row[c] != want[from * in + c] && wrong++ == 0) {
        ADD_FAILURE() << "row " << j << " column " << c << ": " << row[c] << ", want " << want[from * in + c];
      }
    }
  }
  EXPECT_EQ(wrong, 0);
}

// Every projection of the llama() folder `f` imported as f8_e4m3 (f32 with force_f32) with its values.
void expect_llama(const Folder& f, bool force_f32 = false) {
  auto file = import_hf_folder(f.dir.string(), force_f32);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  const DType type = force_f32 ? DType::f32 : DType::f8_e4m3;
  const std::string l = "model.layers.0.";
  const int64_t ff = f.config["intermediate_size"].get<int64_t>();
  const std::vector<float>& q = f.values.at(l + "self_attn.q_proj.weight");
  expect_values(**file, "blk.0.attn_q.weight", type, q, kEmbd, kHeads * kHeadDim, true);
  expect_values(**file, "blk.0.attn_k.weight", type, f.values.at(l + "self_attn.k_proj.weight"), kEmbd,
                kKvHeads * kHeadDim, true);
  expect_values(**file, "blk.0.attn_v.weight", type, f.values.at(l + "self_attn.v_proj.weight"), kEmbd,
                kKvHeads * kHeadDim);
  expect_values(**file, "blk.0.attn_output.weight", type, f.values.at(l + "self_attn.o_proj.weight"),
                kHeads * kHeadDim, kEmbd);
  expect_values(**file, "blk.0.ffn_gate.weight", type, f.values.at(l + "mlp.gate_proj.weight"), kEmbd, ff);
  expect_values(**file, "blk.0.ffn_up.weight", type, f.values.at(l + "mlp.up_proj.weight"), kEmbd, ff);
  expect_values(**file, "blk.0.ffn_down.weight", type, f.values.at(l + "mlp.down_proj.weight"), ff, kEmbd);
  // The rest as it was; no scale became a tensor.
  EXPECT_EQ((*file)->find_tensor("token_embd.weight")->type, DType::f32);
  EXPECT_EQ((*file)->find_tensor("blk.0.attn_norm.weight")->type, DType::f32);
  EXPECT_EQ((*file)->tensors().size(), 11u);
}

TEST_F(HfFp8, CompressedTensorsPerChannel) {
  Scheme s{compressed_tensors("channel")};
  s.scale_dtype = "BF16";
  s.kv_scales = true;
  const Folder f = llama(s);
  f.write();
  expect_llama(f);
}

TEST_F(HfFp8, CompressedTensorsPerTensor) {
  Scheme s{compressed_tensors(
      "tensor", {{"num_bits", 8}, {"type", "float"}, {"strategy", "tensor"}, {"dynamic", false}})};
  s.scale = Scale::tensor;
  s.input_scales = true;
  const Folder f = llama(s);
  f.write();
  expect_llama(f);
}

// 160 x 224 weights: the last block of 128 rows and of 128 columns is partial.
TEST_F(HfFp8, CompressedTensorsPerBlock) {
  Scheme s{compressed_tensors(
      "block", {{"num_bits", 8}, {"type", "float"}, {"strategy", "token"}, {"dynamic", true}})};
  s.scale = Scale::block;
  const Folder f = llama(s);
  f.write();
  expect_llama(f);
}

TEST_F(HfFp8, ModelOptimizer) {
  Scheme s{{{"quant_method", "modelopt"}, {"quant_algo", "FP8"}, {"kv_cache_quant_algo", "FP8"}}};
  s.scale = Scale::tensor;
  s.scalar_shape = true;
  s.input_scales = true;
  s.kv_scales = true;
  const Folder f = llama(s);
  f.write();
  expect_llama(f);
}

// Older Model Optimizer folders: no quantization_config, an hf_quant_config.json beside config.json.
TEST_F(HfFp8, ModelOptimizerQuantConfigFile) {
  Scheme s;
  s.scale = Scale::tensor;
  s.scalar_shape = true;
  s.input_scales = true;
  const Folder f = llama(s);
  f.write();
  std::ofstream(f.dir / "hf_quant_config.json")
      << json{{"producer", {{"name", "modelopt"}}},
              {"quantization", {{"quant_algo", "FP8"}, {"exclude_modules", {"lm_head"}}}}}
             .dump();
  expect_llama(f);
}

// DeepSeek-V3 / Qwen3-FP8: weight_scale_inv per 128x128 block, multiplying the quants.
TEST_F(HfFp8, Fp8WeightScaleInv) {
  Scheme s{{{"quant_method", "fp8"},
            {"fmt", "e4m3"},
            {"activation_scheme", "dynamic"},
            {"weight_block_size", {128, 128}}}};
  s.scale = Scale::block;
  s.suffix = ".weight_scale_inv";
  const Folder f = llama(s);
  f.write();
  expect_llama(f);
}

// AutoFP8's folders: "fp8" without a weight_block_size, a weight_scale and an input_scale per tensor, both
// 0-d (vLLM reads the same config so); with its static KV-cache scheme, the k and v projections'
// output_scale, which kiln leaves aside as it does other KV-cache scales.
TEST_F(HfFp8, Fp8PerTensor) {
  Scheme s{{{"quant_method", "fp8"},
            {"activation_scheme", "static"},
            {"ignored_layers", {"lm_head"}},
            {"kv_cache_scheme", "static"}}};
  s.scale = Scale::tensor;
  s.scalar_shape = true;
  s.input_scales = true;
  Folder f = llama(s);
  for (const char* proj : {"k_proj", "v_proj"}) {
    f.tensors.push_back(
        {std::string("model.layers.0.self_attn.") + proj + ".output_scale", "F32", {}, f32_bytes({0.02f})});
  }
  f.write();
  expect_llama(f);
  // activation_scheme "static": the engine's import carries each projection's input_scale.
  auto file = import_hf_folder(f.dir.string(), false, /*activation_scales=*/true);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ((*file)->tensors().size(), 18u);
  EXPECT_NE((*file)->find_tensor("blk.0.attn_q.input_scale"), nullptr);

  // A weight_block_size of null is none.
  Scheme n{{{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}, {"weight_block_size", nullptr}}};
  n.scale = Scale::tensor;
  const Folder g = llama(n, "null_block");
  g.write();
  expect_llama(g);
}

// What `kiln convert`'s checks import: the same values as f32.
TEST_F(HfFp8, ForceF32IsTheDequantizedValues) {
  Scheme s{compressed_tensors("block")};
  s.scale = Scale::block;
  const Folder f = llama(s);
  f.write();
  expect_llama(f, /*force_f32=*/true);
}

// Stacked experts: each expert's rows with its own per-channel scale.
TEST_F(HfFp8, ExpertsKeepTheirScales) {
  constexpr int64_t kExperts = 3, kExpertFf = 64;
  const Scheme s{compressed_tensors("channel")};
  std::mt19937 rng(3);
  Folder f;
  f.dir = fresh_dir("moe");
  f.config = {{"architectures", {"Qwen3MoeForCausalLM"}},
              {"model_type", "qwen3_moe"},
              {"hidden_size", kEmbd},
              {"num_hidden_layers", 1},
              {"num_attention_heads", kHeads},
              {"num_key_value_heads", kKvHeads},
              {"head_dim", kHeadDim},
              {"num_experts", kExperts},
              {"num_experts_per_tok", 2},
              {"moe_intermediate_size", kExpertFf},
              {"vocab_size", kVocab},
              {"rms_norm_eps", 1e-6},
              {"tie_word_embeddings", true},
              {"quantization_config", s.quant}};
  f.tensors.push_back({"model.embed_tokens.weight",
                       "F32",
                       {kVocab, kEmbd},
                       f32_bytes(random_f32(kVocab * kEmbd, -1, 1, rng))});
  f.tensors.push_back({"model.layers.0.mlp.gate.weight",
                       "F32",
                       {kExperts, kEmbd},
                       f32_bytes(random_f32(kExperts * kEmbd, -1, 1, rng))});
  for (int64_t e = 0; e < kExperts; ++e) {
    const std::string p = "model.layers.0.mlp.experts." + std::to_string(e) + ".";
    add_fp8(f, s, p + "gate_proj", kExpertFf, kEmbd, rng);
    add_fp8(f, s, p + "up_proj", kExpertFf, kEmbd, rng);
    add_fp8(f, s, p + "down_proj", kEmbd, kExpertFf, rng);
  }
  f.write();
  auto file = import_hf_folder(f.dir.string());
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  for (const auto& [proj, gguf, in, out] : {std::tuple{"gate_proj", "ffn_gate_exps", kEmbd, kExpertFf},
                                            std::tuple{"up_proj", "ffn_up_exps", kEmbd, kExpertFf},
                                            std::tuple{"down_proj", "ffn_down_exps", kExpertFf, kEmbd}}) {
    std::vector<float> all;
    for (int64_t e = 0; e < kExperts; ++e) {
      const std::vector<float>& v =
          f.values.at("model.layers.0.mlp.experts." + std::to_string(e) + "." + proj + ".weight");
      all.insert(all.end(), v.begin(), v.end());
    }
    expect_values(**file, std::string("blk.0.") + gguf + ".weight", DType::f8_e4m3, all, in, out, false,
                  kExperts);
  }
  EXPECT_EQ((*file)->find_tensor("blk.0.ffn_gate_inp.weight")->type, DType::f32);
}

// The logits of `file` for 6 tokens on a fresh CPU backend of `precision`.
std::vector<float> logits(std::shared_ptr<const gguf::File> file, ops::Precision precision) {
  BackendOptions bo;
  bo.n_threads = 2;
  bo.precision = precision;
  auto cpu = make_backend("cpu", bo);
  EXPECT_TRUE(cpu.ok()) << cpu.status().to_string();
  if (!cpu.ok()) return {};
  auto model = load_model(std::move(file), **cpu);
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  if (!model.ok()) return {};
  auto kv = KvBuffers::allocate(**model, 16, 2, DType::f32);
  EXPECT_TRUE(kv.ok()) << kv.status().to_string();
  if (!kv.ok()) return {};
  const std::vector<int32_t> table = {1};
  Batch b;
  b.block_tables = {table};
  for (int32_t i = 0; i < 6; ++i) {
    b.tokens.push_back(7 * i + 3);
    b.positions.push_back(i);
    b.seq.push_back(0);
    b.logit_rows.push_back(i);
  }
  Result<Tensor> t = (*model)->forward(b, *kv);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  std::vector<float> host;
  if (t.ok()) {
    EXPECT_TRUE(read_logits(**cpu, *t, host).ok());
  }
  return host;
}

// Static activation scales become "<weight>.input_scale" tensors when asked for (a model to run), which the
// loaded model's weights carry (the projections on one x their largest); a folder whose config declares
// dynamic activations keeps none of them, nor does an import for a writer.
TEST_F(HfFp8, StaticActivationScalesReachTheWeights) {
  const std::pair<std::string, std::string> projections[] = {
      // HF module, GGUF weight
      {"self_attn.q_proj", "attn_q"},      {"self_attn.k_proj", "attn_k"}, {"self_attn.v_proj", "attn_v"},
      {"self_attn.o_proj", "attn_output"}, {"mlp.gate_proj", "ffn_gate"},  {"mlp.up_proj", "ffn_up"},
      {"mlp.down_proj", "ffn_down"}};
  const auto scale_of = [](size_t i) { return 0.05f + 0.01f * static_cast<float>(i); };
  Scheme st{compressed_tensors(
      "tensor", {{"num_bits", 8}, {"type", "float"}, {"strategy", "tensor"}, {"dynamic", false}})};
  st.scale = Scale::tensor;
  st.input_scales = true;
  Folder f = llama(st, "static");
  for (size_t i = 0; i < std::size(projections); ++i) {
    StTensor* t = f.find("model.layers.0." + projections[i].first + ".input_scale");
    ASSERT_NE(t, nullptr) << projections[i].first;
    t->bytes = f32_bytes({scale_of(i)});
  }
  f.write();
  auto plain = import_hf_folder(f.dir.string());
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_EQ((*plain)->tensors().size(), 11u);
  auto file = import_hf_folder(f.dir.string(), false, /*activation_scales=*/true);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ((*file)->tensors().size(), 18u);
  BackendOptions bo;
  bo.n_threads = 1;
  auto cpu = make_backend("cpu", bo);
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  auto model = load_model(*file, **cpu);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  std::map<std::string, float> got;
  for (const auto& h : (*model)->weights()) got[h->name] = h->weight.input_scale;
  for (size_t i = 0; i < std::size(projections); ++i) {
    const std::string stem = "blk.0." + projections[i].second;
    const gguf::TensorInfo* t = (*file)->find_tensor(stem + ".input_scale");
    ASSERT_NE(t, nullptr) << stem;
    EXPECT_EQ(t->type, DType::f32);
    EXPECT_EQ(t->shape, std::vector<int64_t>{1});
    // Q, K and V take the largest of theirs (V's), gate and up theirs (up's).
    const float want = i < 3 ? scale_of(2) : i == 4 || i == 5 ? scale_of(5) : scale_of(i);
    ASSERT_TRUE(got.contains(stem + ".weight")) << stem;
    EXPECT_FLOAT_EQ(got[stem + ".weight"], want) << stem;
  }
  EXPECT_EQ(got.at("blk.0.attn_norm.weight"), 0.0f);

  // The same tensors under a config of dynamic activations: not static scales, left out.
  Scheme dy{compressed_tensors(
      "tensor", {{"num_bits", 8}, {"type", "float"}, {"strategy", "token"}, {"dynamic", true}})};
  dy.scale = Scale::tensor;
  dy.input_scales = true;
  const Folder g = llama(dy, "dynamic");
  g.write();
  auto dynamic = import_hf_folder(g.dir.string(), false, true);
  ASSERT_TRUE(dynamic.ok()) << dynamic.status().to_string();
  EXPECT_EQ((*dynamic)->tensors().size(), 11u);
  EXPECT_EQ((*dynamic)->find_tensor("blk.0.attn_q.input_scale"), nullptr);
}

// The FP8 model runs on the CPU in both precisions, with the logits of the same weights in f32.
TEST_F(HfFp8, RunsOnTheCpu) {
  Scheme s{compressed_tensors("channel")};
  const Folder f = llama(s);
  f.write();
  auto fp8 = import_hf_folder(f.dir.string());
  auto f32 = import_hf_folder(f.dir.string(), true);
  ASSERT_TRUE(fp8.ok() && f32.ok()) << fp8.status().to_string() << f32.status().to_string();
  for (const ops::Precision p : {ops::Precision::precision_exact, ops::Precision::precision_fast}) {
    const std::vector<float> a = logits(*fp8, p), b = logits(*f32, p);
    ASSERT_EQ(a.size(), static_cast<size_t>(6 * kVocab));
    ASSERT_EQ(b.size(), a.size());
    double diff2 = 0.0, ref2 = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
      diff2 += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
      ref2 += static_cast<double>(b[i]) * b[i];
    }
    EXPECT_LT(std::sqrt(diff2 / ref2), 1e-5) << (p == ops::Precision::precision_fast ? "fast" : "exact");
  }
}

// ---- bad input: each a named error, never a crash

// The import of `f` (written) fails with a message holding every one of `needles`.
void expect_error(const Folder& f, const std::vector<std::string>& needles,
                  StatusCode code = StatusCode::invalid_argument) {
  const std::string dir = f.write();
  auto r = import_hf_folder(dir);
  ASSERT_FALSE(r.ok()) << dir;
  EXPECT_EQ(r.status().code(), code) << r.status().to_string();
  for (const std::string& n : needles)
    EXPECT_NE(r.status().message().find(n), std::string::npos) << r.status().message();
}

const Scheme kChannel{compressed_tensors("channel")};

TEST_F(HfFp8, MissingScale) {
  Folder f = llama(kChannel);
  f.erase("model.layers.0.self_attn.q_proj.weight_scale");
  expect_error(f, {"model.layers.0.self_attn.q_proj.weight has no scale", "q_proj.weight_scale is missing"});
}

TEST_F(HfFp8, ScaleNotFinitePositive) {
  for (const float bad :
       {0.0f, -0.5f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    SCOPED_TRACE(bad);
    Folder f = llama(kChannel, "bad");
    StTensor* t = f.find("model.layers.0.self_attn.k_proj.weight_scale");
    std::memcpy(t->bytes.data() + 3 * 4, &bad, 4);
    expect_error(f, {"model.layers.0.self_attn.k_proj.weight_scale", "at [3, 0]", "finite positive"});
  }
}

TEST_F(HfFp8, ScaleOfNoKnownShape) {
  Folder f = llama(kChannel);
  f.find("model.layers.0.self_attn.q_proj.weight_scale")->shape = {160};  // [out] is not [out, 1]
  expect_error(f, {"model.layers.0.self_attn.q_proj.weight_scale has shape [160]", "[160, 1] per channel"});
  Scheme block{compressed_tensors("block")};
  block.scale = Scale::block;
  Folder g = llama(block, "block");
  StTensor* t = g.find("model.layers.0.mlp.down_proj.weight_scale");  // [2, 2] as [1, 4]
  t->shape = {1, 4};
  expect_error(g, {"mlp.down_proj.weight_scale has shape [1, 4]", "[2, 2] per 128x128 block"});
}

TEST_F(HfFp8, NanCodes) {
  for (const uint8_t nan : {uint8_t{0x7f}, uint8_t{0xff}}) {
    Folder f = llama(kChannel, "nan");
    f.find("model.layers.0.self_attn.v_proj.weight")->bytes[2 * kEmbd + 5] = nan;
    expect_error(
        f, {"model.layers.0.self_attn.v_proj.weight has a NaN", nan == 0x7f ? "0x7f" : "0xff", "at [2, 5]"});
  }
}

TEST_F(HfFp8, Fp8WithoutQuantizationConfig) {
  Folder f = llama(kChannel);
  f.config.erase("quantization_config");
  expect_error(f, {"model.layers.0.self_attn.q_proj.weight is F8_E4M3", "no FP8 quantization_config"});
  Folder g = llama(kChannel, "scale_only");
  g.config.erase("quantization_config");
  for (StTensor& t : g.tensors) {  // BF16 weights beside the leftover scales
    if (t.dtype == "F8_E4M3") t = StTensor{t.name, "BF16", t.shape, std::vector<uint8_t>(t.bytes.size() * 2)};
  }
  expect_error(g, {"q_proj.weight_scale is an FP8 scale", "no FP8 quantization_config"});
}

TEST_F(HfFp8, OneDimensionalFp8) {
  Folder f = llama(kChannel);
  *f.find("model.norm.weight") =
      StTensor{"model.norm.weight", "F8_E4M3", {kEmbd}, std::vector<uint8_t>(kEmbd, 0x38)};
  expect_error(f, {"FP8 weight model.norm.weight has shape [160]", "must be matrices"});
}

TEST_F(HfFp8, ScaleWithoutItsWeight) {
  Folder f = llama(kChannel);
  f.tensors.push_back({"model.layers.0.mlp.extra.weight_scale", "F32", {4, 1}, f32_bytes({1, 1, 1, 1})});
  expect_error(f,
               {"scale model.layers.0.mlp.extra.weight_scale has no weight model.layers.0.mlp.extra.weight"});
  Folder g = llama(kChannel, "not_fp8");
  StTensor* o = g.find("model.layers.0.self_attn.o_proj.weight");
  *o = StTensor{o->name, "BF16", o->shape, std::vector<uint8_t>(o->bytes.size() * 2)};
  expect_error(g, {"o_proj.weight_scale belongs to model.layers.0.self_attn.o_proj.weight, which is BF16"});
}

TEST_F(HfFp8, ColumnsNotAMultipleOf32) {
  Folder f = llama(kChannel, "ff", 200);
  expect_error(f, {"model.layers.0.mlp.down_proj.weight has 200 columns", "multiple of 32"});
  Scheme s{compressed_tensors("block")};
  s.quant["config_groups"]["group_0"]["weights"]["block_structure"] = {128, 48};
  s.scale = Scale::block;
  s.block_cols = 48;
  expect_error(llama(s, "block48"), {"has 128x48 block scales", "multiple of 32"});
}

TEST_F(HfFp8, BadActivationScale) {
  Scheme s{compressed_tensors("tensor", {{"num_bits", 8}, {"type", "float"}, {"strategy", "tensor"}})};
  s.scale = Scale::tensor;
  s.input_scales = true;
  Folder f = llama(s);
  const float zero = 0.0f;
  std::memcpy(f.find("model.layers.0.mlp.up_proj.input_scale")->bytes.data(), &zero, 4);
  expect_error(f, {"activation scale model.layers.0.mlp.up_proj.input_scale is 0"});
}

TEST_F(HfFp8, ScaleOfTheOtherMethodsName) {
  Scheme s{compressed_tensors("channel")};
  s.suffix = ".weight_scale_inv";
  expect_error(llama(s),
               {"q_proj.weight_scale_inv is not the scale this quantization names", "*.weight_scale"});
}

// Any quantization other than the FP8 forms: unimplemented, naming the method or field, listing what loads.
TEST_F(HfFp8, OtherQuantizationsAreNamed) {
  json int_weights = compressed_tensors("channel");
  int_weights["config_groups"]["group_0"]["weights"]["type"] = "int";
  json four_bits = compressed_tensors("channel");
  four_bits["config_groups"]["group_0"]["weights"]["num_bits"] = 4;
  json group = compressed_tensors("channel");
  group["config_groups"]["group_0"]["weights"]["strategy"] = "group";
  json packed = compressed_tensors("channel");
  packed["format"] = "pack-quantized";
  const std::pair<json, std::string> cases[] = {
      {{{"quant_method", "awq"}, {"bits", 4}}, "quant_method \"awq\""},
      {{{"quant_method", "gptq"}, {"bits", 4}}, "quant_method \"gptq\""},
      {{{"quant_method", "bitsandbytes"}, {"load_in_4bit", true}}, "quant_method \"bitsandbytes\""},
      {{{"quant_method", "fp8"}, {"fmt", "e5m2"}}, "fmt \"e5m2\""},
      {{{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}}, "quant_algo \"NVFP4\""},
      {int_weights, "type \"int\""},
      {four_bits, "num_bits 4"},
      {group, "strategy \"group\""},
      {packed, "format \"pack-quantized\""},
  };
  int i = 0;
  for (const auto& [quant, needle] : cases) {
    SCOPED_TRACE(needle);
    Scheme s;
    s.quant = quant;
    expect_error(llama(s, "q" + std::to_string(i++)), {needle, "is not supported", "kiln loads FP8"},
                 StatusCode::unimplemented);
  }
}

}  // namespace
}  // namespace kiln
