// A rank's view of a GGUF file (models/tp_shard.h), checked on small files built in memory: a Llama layer (8
// heads, 2 KV heads, head size 8, biases; f32 and Q8_0), the same with a tied output head, a Phi-3 layer's
// fused Q/K/V and gate+up, a Qwen2-MoE layer (experts and a shared expert) and a Mixtral-like one (the
// experts' width from feed_forward_length), each split over 1, 2 and 4 ranks. Each view's metadata holds the
// rank's heads and widths and the whole model's head size, attention scale and RoPE dimensions; each
// tensor's bytes are the rank's rows or columns, computed here apart from the plan (the fused ones: its Q,
// K and V rows; a tied head: its rows of the embedding); the row ranges, replicated weights and the
// embedding point into the whole file and the column splits are copies; world 1 is the file's tensors
// unchanged. A world that does not divide, a rank out of range, a per-layer head count, a column split
// inside a Q8_0 block and a shared expert's width that does not divide are refused with the numbers.
#include "models/tp_shard.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace kiln {
namespace {

constexpr int64_t kEmbd = 64, kHeads = 8, kKv = 2, kHd = 8, kFf = 128, kFfExp = 64, kVocab = 96;
constexpr int64_t kQ = kHeads * kHd, kKvDim = kKv * kHd;

// A GGUF file built in memory: metadata, and tensors of random values.
class Builder {
 public:
  void set(const std::string& key, gguf::Value v) { md_.emplace_back(key, std::move(v)); }
  void tensor(const std::string& name, DType type, std::vector<int64_t> shape) {
    int64_t rows = 1;
    for (size_t i = 1; i < shape.size(); ++i) rows *= shape[i];
    const int64_t row = dtype_row_bytes(type, shape[0]).value();
    std::vector<uint8_t>& b = bytes_->emplace_back(static_cast<size_t>(row * rows));
    std::vector<float> values(static_cast<size_t>(shape[0]));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t r = 0; r < rows; ++r) {
      for (float& v : values) v = normal(rng_);
      if (type == DType::f32) {
        std::memcpy(b.data() + r * row, values.data(), static_cast<size_t>(row));
      } else {
        dtype_info(type).quantize_row(values.data(), b.data() + r * row, shape[0]);
      }
    }
    gguf::TensorInfo t;
    t.name = name;
    t.shape = std::move(shape);
    t.type = type;
    t.data = b.data();
    t.n_bytes = b.size();
    tensors_.push_back(std::move(t));
  }
  std::shared_ptr<const gguf::File> file(const std::string& name) {
    auto f = gguf::File::assemble(name, md_, tensors_, bytes_);
    EXPECT_TRUE(f.ok()) << f.status().to_string();
    return std::make_shared<const gguf::File>(std::move(f).value());
  }

 private:
  std::vector<std::pair<std::string, gguf::Value>> md_;
  std::vector<gguf::TensorInfo> tensors_;
  std::shared_ptr<std::vector<std::vector<uint8_t>>> bytes_ =
      std::make_shared<std::vector<std::vector<uint8_t>>>();
  std::mt19937 rng_{7};
};

// The attention shape's metadata of architecture `a` (key_length left to default: n_embd / n_heads).
void attention_metadata(Builder& b, const std::string& a) {
  b.set("general.architecture", gguf::Value::str(a));
  b.set(a + ".embedding_length", gguf::Value::u32(kEmbd));
  b.set(a + ".block_count", gguf::Value::u32(1));
  b.set(a + ".context_length", gguf::Value::u32(256));
  b.set(a + ".attention.head_count", gguf::Value::u32(kHeads));
  b.set(a + ".attention.head_count_kv", gguf::Value::u32(kKv));
  b.set(a + ".attention.layer_norm_rms_epsilon", gguf::Value::f32(1e-5f));
  b.set(a + ".rope.freq_base", gguf::Value::f32(10000.0f));
  std::vector<gguf::Value> tokens;
  for (int64_t i = 0; i < kVocab; ++i) tokens.push_back(gguf::Value::str("t" + std::to_string(i)));
  b.set("tokenizer.ggml.tokens", gguf::Value::array(gguf::ValueType::string, std::move(tokens)));
}

void embedding_tensors(Builder& b, DType type, bool tied) {
  b.tensor("token_embd.weight", type, {kEmbd, kVocab});
  b.tensor("output_norm.weight", DType::f32, {kEmbd});
  if (!tied) b.tensor("output.weight", type, {kEmbd, kVocab});
}

// A Llama layer with biases (Q/K/V and the output projection's), and Llama 3.1's RoPE factors.
std::shared_ptr<const gguf::File> llama(DType type, bool tied) {
  Builder b;
  attention_metadata(b, "llama");
  b.set("llama.feed_forward_length", gguf::Value::u32(kFf));
  embedding_tensors(b, type, tied);
  b.tensor("rope_freqs.weight", DType::f32, {kHd / 2});
  b.tensor("blk.0.attn_norm.weight", DType::f32, {kEmbd});
  b.tensor("blk.0.attn_q.weight", type, {kEmbd, kQ});
  b.tensor("blk.0.attn_k.weight", type, {kEmbd, kKvDim});
  b.tensor("blk.0.attn_v.weight", type, {kEmbd, kKvDim});
  b.tensor("blk.0.attn_q.bias", DType::f32, {kQ});
  b.tensor("blk.0.attn_k.bias", DType::f32, {kKvDim});
  b.tensor("blk.0.attn_v.bias", DType::f32, {kKvDim});
  b.tensor("blk.0.attn_output.weight", type, {kQ, kEmbd});
  b.tensor("blk.0.attn_output.bias", DType::f32, {kEmbd});
  b.tensor("blk.0.ffn_norm.weight", DType::f32, {kEmbd});
  b.tensor("blk.0.ffn_gate.weight", type, {kEmbd, kFf});
  b.tensor("blk.0.ffn_up.weight", type, {kEmbd, kFf});
  b.tensor("blk.0.ffn_down.weight", type, {kFf, kEmbd});
  return b.file(std::string("llama-") + dtype_name(type) + (tied ? "-tied" : ""));
}

std::shared_ptr<const gguf::File> phi3() {
  Builder b;
  attention_metadata(b, "phi3");
  b.set("general.name", gguf::Value::str("phi"));
  b.set("phi3.feed_forward_length", gguf::Value::u32(kFf));
  b.set("phi3.rope.scaling.original_context_length", gguf::Value::u32(128));
  embedding_tensors(b, DType::f32, false);
  b.tensor("rope_factors_short.weight", DType::f32, {kHd / 2});
  b.tensor("rope_factors_long.weight", DType::f32, {kHd / 2});
  b.tensor("blk.0.attn_norm.weight", DType::f32, {kEmbd});
  b.tensor("blk.0.attn_qkv.weight", DType::f32, {kEmbd, kQ + 2 * kKvDim});
  b.tensor("blk.0.attn_output.weight", DType::f32, {kQ, kEmbd});
  b.tensor("blk.0.ffn_norm.weight", DType::f32, {kEmbd});
  b.tensor("blk.0.ffn_up.weight", DType::f32, {kEmbd, 2 * kFf});
  b.tensor("blk.0.ffn_down.weight", DType::f32, {kFf, kEmbd});
  return b.file("phi3");
}

// Qwen2-MoE's experts (their width explicit) and shared expert, or Mixtral's (their width that of
// feed_forward_length, no shared expert).
std::shared_ptr<const gguf::File> moe(bool mixtral, int64_t shared_width = 2 * kFfExp) {
  Builder b;
  const std::string a = mixtral ? "llama" : "qwen2moe";
  attention_metadata(b, a);
  b.set(a + ".attention.key_length", gguf::Value::u32(kHd));
  b.set(a + ".expert_count", gguf::Value::u32(4));
  b.set(a + ".expert_used_count", gguf::Value::u32(2));
  if (mixtral) {
    b.set(a + ".feed_forward_length", gguf::Value::u32(kFfExp));
  } else {
    b.set(a + ".feed_forward_length", gguf::Value::u32(kFf));
    b.set(a + ".expert_feed_forward_length", gguf::Value::u32(kFfExp));
    b.set(a + ".expert_shared_feed_forward_length", gguf::Value::u32(static_cast<uint32_t>(shared_width)));
  }
  embedding_tensors(b, DType::f32, false);
  b.tensor("blk.0.attn_norm.weight", DType::f32, {kEmbd});
  b.tensor("blk.0.attn_q.weight", DType::f32, {kEmbd, kQ});
  b.tensor("blk.0.attn_k.weight", DType::f32, {kEmbd, kKvDim});
  b.tensor("blk.0.attn_v.weight", DType::f32, {kEmbd, kKvDim});
  b.tensor("blk.0.attn_output.weight", DType::f32, {kQ, kEmbd});
  b.tensor("blk.0.ffn_norm.weight", DType::f32, {kEmbd});
  b.tensor("blk.0.ffn_gate_inp.weight", DType::f32, {kEmbd, 4});
  b.tensor("blk.0.ffn_gate_exps.weight", DType::f32, {kEmbd, kFfExp, 4});
  b.tensor("blk.0.ffn_up_exps.weight", DType::f32, {kEmbd, kFfExp, 4});
  b.tensor("blk.0.ffn_down_exps.weight", DType::f32, {kFfExp, kEmbd, 4});
  if (!mixtral) {
    b.tensor("blk.0.ffn_gate_shexp.weight", DType::f32, {kEmbd, 2 * kFfExp});
    b.tensor("blk.0.ffn_up_shexp.weight", DType::f32, {kEmbd, 2 * kFfExp});
    b.tensor("blk.0.ffn_down_shexp.weight", DType::f32, {2 * kFfExp, kEmbd});
    b.tensor("blk.0.ffn_gate_inp_shexp.weight", DType::f32, {kEmbd});
  }
  return b.file(a);
}

std::shared_ptr<const gguf::File> view_of(const std::shared_ptr<const gguf::File>& whole, int32_t world,
                                          int32_t rank) {
  auto v = tp::shard_file(whole, world, rank);
  EXPECT_TRUE(v.ok()) << whole->name() << " over " << world << ": " << v.status().to_string();
  return v.ok() ? *v : nullptr;
}

struct Span {
  int64_t begin, end;
};

// Rows `ranges` of each matrix of `t`, one range after another, as the test computes them.
std::vector<uint8_t> rows_of(const gguf::TensorInfo& t, std::vector<Span> ranges) {
  const int64_t row = dtype_row_bytes(t.type, t.shape[0]).value();
  const int64_t ne1 = t.shape.size() > 1 ? t.shape[1] : 1, mats = t.shape.size() > 2 ? t.shape[2] : 1;
  std::vector<uint8_t> out;
  for (int64_t m = 0; m < mats; ++m) {
    for (const Span& s : ranges) {
      out.insert(out.end(), t.data + (m * ne1 + s.begin) * row, t.data + (m * ne1 + s.end) * row);
    }
  }
  return out;
}

// Columns [begin, end) (whole blocks) of every row of `t`.
std::vector<uint8_t> cols_of(const gguf::TensorInfo& t, Span s) {
  int64_t rows = 1;
  for (size_t i = 1; i < t.shape.size(); ++i) rows *= t.shape[i];
  const int64_t row = dtype_row_bytes(t.type, t.shape[0]).value();
  const int64_t skip = dtype_row_bytes(t.type, s.begin).value(),
                take = dtype_row_bytes(t.type, s.end - s.begin).value();
  std::vector<uint8_t> out;
  for (int64_t r = 0; r < rows; ++r)
    out.insert(out.end(), t.data + r * row + skip, t.data + r * row + skip + take);
  return out;
}

std::vector<uint8_t> bytes_of(const gguf::TensorInfo& t) { return {t.data, t.data + t.n_bytes}; }

// Whether `view`'s tensor points into `whole`'s tensor `name`.
bool inside(const gguf::TensorInfo& view, const gguf::TensorInfo& whole) {
  return view.data >= whole.data && view.data + view.n_bytes <= whole.data + whole.n_bytes;
}

// Whether it points into any of the whole file's tensors.
bool inside_file(const gguf::TensorInfo& view, const gguf::File& whole) {
  for (const gguf::TensorInfo& t : whole.tensors()) {
    if (inside(view, t)) return true;
  }
  return false;
}

// A tensor of the view: its shape and bytes, and whether it points into the whole file's tensor `from`.
void expect_part(const gguf::File& view, const gguf::File& whole, const std::string& name,
                 std::vector<int64_t> shape, const std::vector<uint8_t>& bytes, bool zero_copy,
                 const std::string& from = "") {
  const gguf::TensorInfo* v = view.find_tensor(name);
  ASSERT_NE(v, nullptr) << view.name() << ": " << name;
  const std::string what = view.name() + ": " + name;
  EXPECT_EQ(v->shape, shape) << what;
  EXPECT_EQ(bytes_of(*v), bytes) << what;
  if (zero_copy) {
    EXPECT_TRUE(inside(*v, *whole.find_tensor(from.empty() ? name : from))) << what << " is a copy";
  } else {
    EXPECT_FALSE(inside_file(*v, whole)) << what << " points into the file";
  }
}

uint64_t uint_of(const gguf::File& f, const std::string& key) {
  auto v = f.get_uint(key);
  EXPECT_TRUE(v.ok()) << key << ": " << v.status().to_string();
  return v.ok() ? *v : 0;
}

// The metadata every view pins: the rank's heads, the whole model's head size, scale and RoPE dimensions.
void expect_attention_metadata(const gguf::File& view, const gguf::File& whole, const std::string& a,
                               int32_t world) {
  EXPECT_EQ(uint_of(view, a + ".attention.head_count"), static_cast<uint64_t>(kHeads / world));
  EXPECT_EQ(uint_of(view, a + ".attention.head_count_kv"),
            world <= kKv ? static_cast<uint64_t>(kKv / world) : 1u);
  EXPECT_EQ(uint_of(view, a + ".attention.key_length"), static_cast<uint64_t>(kHd));
  EXPECT_EQ(uint_of(view, a + ".attention.value_length"), static_cast<uint64_t>(kHd));
  EXPECT_EQ(uint_of(view, a + ".rope.dimension_count"), static_cast<uint64_t>(kHd));
  EXPECT_EQ(view.get_float(a + ".attention.scale").value(), 1.0f / std::sqrt(static_cast<float>(kHd)));
  EXPECT_EQ(uint_of(view, a + ".embedding_length"), static_cast<uint64_t>(kEmbd));
  EXPECT_EQ(view.get_string_array("tokenizer.ggml.tokens").value(),
            whole.get_string_array("tokenizer.ggml.tokens").value());
  const std::string name = whole.get_string_or("general.name", whole.name()).value();
  EXPECT_EQ(view.get_string("general.name").value(), name);
}

// Every tensor of world 1's view is the file's: the same shape, type and bytes, in place.
void expect_unchanged(const std::shared_ptr<const gguf::File>& whole) {
  const auto view = view_of(whole, 1, 0);
  ASSERT_NE(view, nullptr);
  for (const gguf::TensorInfo& t : whole->tensors()) {
    const gguf::TensorInfo* v = view->find_tensor(t.name);
    ASSERT_NE(v, nullptr) << t.name;
    EXPECT_EQ(v->shape, t.shape) << t.name;
    EXPECT_EQ(v->type, t.type) << t.name;
    EXPECT_EQ(v->data, t.data) << t.name;
    EXPECT_EQ(v->n_bytes, t.n_bytes) << t.name;
  }
}

TEST(TpShard, LlamaLayerSplitsByHeadsAndFeatures) {
  for (const DType type : {DType::f32, DType::q8_0}) {
    const auto whole = llama(type, /*tied=*/false);
    expect_unchanged(whole);
    // Q8_0's blocks of 32 columns: 4 ranks' 16 columns of the output projection would cut them (below).
    for (const int32_t world : type == DType::f32 ? std::vector{1, 2, 4} : std::vector{1, 2}) {
      for (int32_t r = 0; r < world; ++r) {
        const auto view = view_of(whole, world, r);
        ASSERT_NE(view, nullptr);
        const gguf::File& w = *whole;
        expect_attention_metadata(*view, w, "llama", world);
        EXPECT_EQ(uint_of(*view, "llama.feed_forward_length"), static_cast<uint64_t>(kFf / world));
        EXPECT_EQ(view->tensors().size(), w.tensors().size());
        const auto t = [&](const char* n) -> const gguf::TensorInfo& { return *w.find_tensor(n); };
        const int64_t q = kQ / world, f = kFf / world, v = kVocab / world;
        const int64_t kv = world <= kKv ? kKvDim / world : kHd,
                      kv0 = world <= kKv ? r * kv : r / (world / kKv) * kHd;
        const bool split = world > 1;
        for (const char* n : {"token_embd.weight", "output_norm.weight", "rope_freqs.weight",
                              "blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "blk.0.attn_output.bias"}) {
          expect_part(*view, w, n, t(n).shape, bytes_of(t(n)), true);
        }
        expect_part(*view, w, "output.weight", {kEmbd, v},
                    rows_of(t("output.weight"), {{r * v, (r + 1) * v}}), true);
        expect_part(*view, w, "blk.0.attn_q.weight", {kEmbd, q},
                    rows_of(t("blk.0.attn_q.weight"), {{r * q, (r + 1) * q}}), true);
        for (const char* n : {"blk.0.attn_k.weight", "blk.0.attn_v.weight"})
          expect_part(*view, w, n, {kEmbd, kv}, rows_of(t(n), {{kv0, kv0 + kv}}), true);
        expect_part(*view, w, "blk.0.attn_q.bias", {q}, cols_of(t("blk.0.attn_q.bias"), {r * q, (r + 1) * q}),
                    true);
        expect_part(*view, w, "blk.0.attn_k.bias", {kv}, cols_of(t("blk.0.attn_k.bias"), {kv0, kv0 + kv}),
                    true);
        for (const char* n : {"blk.0.ffn_gate.weight", "blk.0.ffn_up.weight"})
          expect_part(*view, w, n, {kEmbd, f}, rows_of(t(n), {{r * f, (r + 1) * f}}), true);
        expect_part(*view, w, "blk.0.attn_output.weight", {q, kEmbd},
                    cols_of(t("blk.0.attn_output.weight"), {r * q, (r + 1) * q}), !split);
        expect_part(*view, w, "blk.0.ffn_down.weight", {f, kEmbd},
                    cols_of(t("blk.0.ffn_down.weight"), {r * f, (r + 1) * f}), !split);
      }
    }
  }
}

TEST(TpShard, TiedHeadIsTheRanksRowsOfTheEmbedding) {
  const auto whole = llama(DType::q8_0, /*tied=*/true);
  ASSERT_EQ(whole->find_tensor("output.weight"), nullptr);
  for (const int32_t world : {1, 2}) {
    for (int32_t r = 0; r < world; ++r) {
      const auto view = view_of(whole, world, r);
      ASSERT_NE(view, nullptr);
      EXPECT_EQ(view->tensors().size(), whole->tensors().size() + 1);
      const gguf::TensorInfo& embd = *whole->find_tensor("token_embd.weight");
      const int64_t v = kVocab / world;
      expect_part(*view, *whole, "token_embd.weight", embd.shape, bytes_of(embd), true);
      expect_part(*view, *whole, "output.weight", {kEmbd, v}, rows_of(embd, {{r * v, (r + 1) * v}}), true,
                  "token_embd.weight");
      const gguf::TensorInfo* head = view->find_tensor("output.weight");
      ASSERT_NE(head, nullptr);
      EXPECT_EQ(head->type, DType::q8_0);
    }
  }
}

TEST(TpShard, Phi3FusedWeightsGiveEachRankItsRowsOfEach) {
  const auto whole = phi3();
  expect_unchanged(whole);
  for (const int32_t world : {2, 4}) {
    for (int32_t r = 0; r < world; ++r) {
      const auto view = view_of(whole, world, r);
      ASSERT_NE(view, nullptr);
      expect_attention_metadata(*view, *whole, "phi3", world);
      EXPECT_EQ(uint_of(*view, "phi3.feed_forward_length"), static_cast<uint64_t>(kFf / world));
      const int64_t q = kQ / world, f = kFf / world;
      const int64_t kv = world <= kKv ? kKvDim / world : kHd,
                    kv0 = world <= kKv ? r * kv : r / (world / kKv) * kHd;
      const gguf::TensorInfo& qkv = *whole->find_tensor("blk.0.attn_qkv.weight");
      expect_part(*view, *whole, "blk.0.attn_qkv.weight", {kEmbd, q + 2 * kv},
                  rows_of(qkv, {{r * q, (r + 1) * q},
                                {kQ + kv0, kQ + kv0 + kv},
                                {kQ + kKvDim + kv0, kQ + kKvDim + kv0 + kv}}),
                  false);
      const gguf::TensorInfo& up = *whole->find_tensor("blk.0.ffn_up.weight");
      expect_part(*view, *whole, "blk.0.ffn_up.weight", {kEmbd, 2 * f},
                  rows_of(up, {{r * f, (r + 1) * f}, {kFf + r * f, kFf + (r + 1) * f}}), false);
      for (const char* n : {"rope_factors_short.weight", "rope_factors_long.weight"})
        expect_part(*view, *whole, n, {kHd / 2}, bytes_of(*whole->find_tensor(n)), true);
    }
  }
}

TEST(TpShard, ExpertsSplitByTheirFeatures) {
  for (const bool mixtral : {false, true}) {
    const auto whole = moe(mixtral);
    expect_unchanged(whole);
    const std::string a = whole->architecture();
    for (const int32_t world : {2, 4}) {
      for (int32_t r = 0; r < world; ++r) {
        const auto view = view_of(whole, world, r);
        ASSERT_NE(view, nullptr);
        expect_attention_metadata(*view, *whole, a, world);
        const int64_t fe = kFfExp / world, fs = 2 * kFfExp / world;
        EXPECT_EQ(uint_of(*view, a + ".expert_count"), 4u);
        EXPECT_EQ(uint_of(*view, a + ".expert_used_count"), 2u);
        EXPECT_EQ(uint_of(*view, a + ".expert_feed_forward_length"), static_cast<uint64_t>(fe));
        EXPECT_EQ(uint_of(*view, a + ".feed_forward_length"),
                  static_cast<uint64_t>((mixtral ? kFfExp : kFf) / world));
        EXPECT_EQ(uint_of(*view, a + ".expert_shared_feed_forward_length"),
                  static_cast<uint64_t>(mixtral ? fe : fs));  // Mixtral's: the default, the experts' own
        const auto t = [&](const char* n) -> const gguf::TensorInfo& { return *whole->find_tensor(n); };
        expect_part(*view, *whole, "blk.0.ffn_gate_inp.weight", {kEmbd, 4},
                    bytes_of(t("blk.0.ffn_gate_inp.weight")), true);
        for (const char* n : {"blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight"})
          expect_part(*view, *whole, n, {kEmbd, fe, 4}, rows_of(t(n), {{r * fe, (r + 1) * fe}}), false);
        expect_part(*view, *whole, "blk.0.ffn_down_exps.weight", {fe, kEmbd, 4},
                    cols_of(t("blk.0.ffn_down_exps.weight"), {r * fe, (r + 1) * fe}), false);
        if (mixtral) continue;
        expect_part(*view, *whole, "blk.0.ffn_gate_inp_shexp.weight", {kEmbd},
                    bytes_of(t("blk.0.ffn_gate_inp_shexp.weight")), true);
        for (const char* n : {"blk.0.ffn_gate_shexp.weight", "blk.0.ffn_up_shexp.weight"})
          expect_part(*view, *whole, n, {kEmbd, fs}, rows_of(t(n), {{r * fs, (r + 1) * fs}}), true);
        expect_part(*view, *whole, "blk.0.ffn_down_shexp.weight", {fs, kEmbd},
                    cols_of(t("blk.0.ffn_down_shexp.weight"), {r * fs, (r + 1) * fs}), false);
      }
    }
  }
}

TEST(TpShard, ShapeFollowsTheMetadataAsTheModelReadsIt) {
  Builder b;
  b.set("general.architecture", gguf::Value::str("gemma3"));
  b.set("gemma3.embedding_length", gguf::Value::u32(kEmbd));
  b.set("gemma3.attention.head_count", gguf::Value::u32(kHeads));
  b.set("gemma3.attention.scale", gguf::Value::f32(0.125f));
  b.tensor("token_embd.weight", DType::f32, {kEmbd, kVocab});
  const auto gemma = b.file("gemma3");
  const tp::Shape s = tp::shape_of(*gemma).value();
  EXPECT_EQ(s.head_dim, 256);  // Gemma 3's default head size, not n_embd / n_heads
  EXPECT_EQ(s.n_kv_heads, kHeads);
  EXPECT_EQ(s.n_ff, 0);
  EXPECT_EQ(s.n_experts, 0);
  EXPECT_EQ(s.n_vocab, kVocab);
  const auto view = view_of(gemma, 2, 1);
  ASSERT_NE(view, nullptr);
  EXPECT_EQ(uint_of(*view, "gemma3.attention.key_length"), 256u);
  EXPECT_EQ(view->get_float("gemma3.attention.scale").value(), 0.125);  // the file's, kept
  EXPECT_EQ(uint_of(*view, "gemma3.rope.dimension_count"), 256u);

  const tp::Shape m = tp::shape_of(*moe(false)).value();
  EXPECT_EQ(m.n_experts, 4);
  EXPECT_EQ(m.n_ff_exp, kFfExp);
  EXPECT_EQ(m.n_ff, kFf);
  EXPECT_EQ(tp::shape_of(*moe(true)).value().n_ff_exp, kFfExp);  // feed_forward_length's
}

TEST(TpShard, WhatDoesNotSplitIsRefused) {
  const auto refused = [](const Result<std::shared_ptr<const gguf::File>>& v, const std::string& needle) {
    ASSERT_FALSE(v.ok()) << needle;
    EXPECT_NE(v.status().message().find(needle), std::string::npos) << v.status().message();
  };
  const auto f32 = llama(DType::f32, false);
  refused(tp::shard_file(f32, 0, 0), "a world of 0");
  refused(tp::shard_file(f32, 3, 0), "over 3: 8 attention heads do not divide");
  refused(tp::shard_file(f32, 2, 2), "rank 2 of 2");
  refused(tp::shard_file(f32, 2, -1), "rank -1 of 2");
  refused(tp::shard_file(nullptr, 2, 0), "no file");
  refused(tp::shard_file(llama(DType::q8_0, false), 4, 1),
          "blk.0.attn_output.weight (q8_0) would be cut at column 16, inside a block of 32");
  refused(tp::shard_file(moe(false, 2 * kFfExp + 2), 4, 0),
          "expert_shared_feed_forward_length 130 does not divide");

  Builder b;
  attention_metadata(b, "llama");
  b.set("llama.feed_forward_length",
        gguf::Value::array(gguf::ValueType::uint32, {gguf::Value::u32(kFf), gguf::Value::u32(kFf)}));
  b.tensor("token_embd.weight", DType::f32, {kEmbd, kVocab});
  auto per_layer = tp::shard_file(b.file("per-layer"), 2, 0);
  refused(per_layer, "llama.feed_forward_length is given per layer");
  EXPECT_EQ(per_layer.status().code(), StatusCode::unimplemented);

  Builder e;
  attention_metadata(e, "llama");
  e.tensor("output_norm.weight", DType::f32, {kEmbd});
  refused(tp::shard_file(e.file("no-embedding"), 2, 0), "token_embd.weight is missing");
}

}  // namespace
}  // namespace kiln
