// The CUDA backend's fused sequences (cuda::run_fused): a layer's program run with fusion gives bit for bit
// what it gives with every op as its own kernel (CudaOptions::fuse off against on), for decode-sized and
// prefill-sized steps, and the sequences fuse where they should and nowhere else (q8_0 weights: the norm
// and the gated activation that round x for the integer GEMV, or write it in 16 bits for the GEMM; as the
// file holds them, and as the backend prepares them at load, in grouped form; RoPE and the KV write, in the
// Q/K/V GEMV's stores or as their own kernel, then the attention that reads them, over f16 and f32 pools
// (q8_0 and q8_64 pools: the RoPE + KV-write kernel after the GEMV), one or several chunks of positions;
// Q4_K, Q5_K, Q6_K and Q4_0 weights, random blocks of them, on the staged integer GEMV; float weights: the
// gate/up GEMV that applies the activation, at each of its block shapes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_kernels.h"
#include "core/half.h"

namespace kiln {
namespace {

// The context of a backend of the fast precision, as the layers here run (their matmuls and attention at
// lower precision: the integer GEMV, tensor cores), for the fusion decisions alone.
cuda::Context fast_context() {
  cuda::Context ctx;
  ctx.fast = true;
  return ctx;
}
// The same with a cuBLASLt handle (a stand-in, never called), which the e4m3 GEMM of FP8 weights needs, on a
// device of `sms` multiprocessors (a step of as many rows rounds x for the e4m3 GEMM in the kernel that
// produces it).
cuda::Context fp8_context(int sms = 16) {
  cuda::Context ctx = fast_context();
  ctx.n_sms = sms;
  ctx.lt_fn = [](void*) -> void* {
    static int handle;
    return &handle;
  };
  return ctx;
}

constexpr int64_t kEmbd = 256, kHead = 64, kHeads = 4, kKvHeads = 2, kFf = 384, kBlock = 16;
// Token t of a step is at position 37 + 29t: from t = 8 on, a span of more than 256 positions, which a decode
// attention splits into chunks (at least two) and merges. Every sequence's blocks before its token's are the
// shared blocks 0 .. kShared - 1 (as a common prefix: read, never written); the token's own block is kShared
// + t.
constexpr int64_t kStride = 29, kMaxTokens = 100, kShared = (37 + kStride * (kMaxTokens - 1)) / kBlock,
                  kBlocks = kShared + kMaxTokens;

struct LayerOptions {
  DType pool = DType::f16;  // the K and V pools' type
  int32_t n_rot = kHead;
  ops::RopeLayout layout = ops::RopeLayout::rope_layout_normal;
  bool factors = false;       // per-pair frequency factors (Llama 3.1's rope_freqs), each 1 to 8
  bool act_in_place = false;  // the gated activation writes over the gate (as the models' layers do)
  // A prefill: the step's tokens one sequence at positions 37 + t (blocks 0, 1, ... of the pools, the first
  // positions as context), the attention on tensor cores (the fast precision), which writes the output
  // projection's x in 16 bits.
  bool prefill = false;
  int64_t ff = kFf;             // the gate and up matmuls' rows (down's k)
  std::optional<DType> v_type;  // V's weight type when not the layer's (a Q4_K_M layer's Q6_K V)
  // FP8 weights' static activation scale (ops::Weight::input_scale; one for the layer, as Q/K/V's and gate
  // and up's are one at import); 0: x rounded per token.
  float input_scale = 0.0f;
};

// One attention + FFN input half of a layer, laid out in one device buffer: the same offsets on every
// backend, so two programs can be compared buffer to buffer.
struct Layout {
  size_t bytes = 0;
  size_t take(size_t n) {
    const size_t at = bytes;
    bytes += (n + 255) / 256 * 256;
    return at;
  }
};

struct Layer {
  std::unique_ptr<Buffer> buf;
  size_t bytes = 0;
  Program program;
  std::vector<std::unique_ptr<WeightHandle>> weights;  // prepared: the weights as prepare_weight made them
};

// Rows of a block type made from random bytes (the K-quants, which kiln does not quantize to): quants and
// Q6_K's int8 scales any bytes, the f16 scales (and minimums) positive normals in 2^-9 .. 2^-8.
void random_blocks(DType type, uint8_t* w, size_t bytes, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> byte(0, 255), mant(0, 0x3FF);
  for (size_t i = 0; i < bytes; ++i) w[i] = static_cast<uint8_t>(byte(rng));
  const auto block = static_cast<size_t>(dtype_info(type).type_size);
  const std::vector<size_t> f16_at = type == DType::q6_k                          ? std::vector<size_t>{208}
                                     : type == DType::q4_k || type == DType::q5_k ? std::vector<size_t>{0, 2}
                                                                                  : std::vector<size_t>{0};
  for (size_t b = 0; b < bytes / block; ++b) {
    for (const size_t at : f16_at) {
      const auto bits = static_cast<uint16_t>(0x1800 + mant(rng));
      std::memcpy(w + b * block + at, &bits, 2);
    }
  }
}

// Every operand random (weights bf16, f16, f32, q8_0 or another block type (random_blocks), norms,
// activations and pools f32, or pools f16 or q8_0), then the ops: x += att; h = rms_norm(x); q, k, v = h W;
// rope q, k; kv_write; y = attention(q, pools); att = y W; x += att; h = rms_norm(x); g, u = h W; a = silu(g)
// u (a: g itself when act_in_place); o = a W; x += o. prepared: the weights as b.prepare_weight() makes them
// for a matmul, else views of the buffer in the file's form.
Layer make_layer(Backend& b, int64_t m, DType wtype, uint64_t seed, bool prepared = false,
                 const LayerOptions& opt = {}) {
  const int64_t ff = opt.ff;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  Layout lay;
  const DType v_type = opt.v_type.value_or(wtype);
  const auto row_w = static_cast<size_t>(dtype_row_bytes(wtype, kEmbd).value()),
             row_d = static_cast<size_t>(dtype_row_bytes(wtype, ff).value()),
             row_v = static_cast<size_t>(dtype_row_bytes(v_type, kEmbd).value());
  const size_t x_at = lay.take(kEmbd * m * 4), att_at = lay.take(kEmbd * m * 4),
               h_at = lay.take(kEmbd * m * 4);
  const size_t nw_at = lay.take(kEmbd * 4);
  const size_t wq_at = lay.take(row_w * kHead * kHeads), wk_at = lay.take(row_w * kHead * kKvHeads),
               wv_at = lay.take(row_v * kHead * kKvHeads), wg_at = lay.take(row_w * ff),
               wu_at = lay.take(row_w * ff), wd_at = lay.take(row_d * kEmbd), wo_at = lay.take(row_w * kEmbd);
  const size_t q_at = lay.take(kHead * kHeads * m * 4), k_at = lay.take(kHead * kKvHeads * m * 4),
               v_at = lay.take(kHead * kKvHeads * m * 4), g_at = lay.take(ff * m * 4),
               u_at = lay.take(ff * m * 4), a_at = lay.take(ff * m * 4), o_at = lay.take(kEmbd * m * 4);
  const int64_t pool_elems = kHead * kKvHeads * kBlock * kBlocks;
  const auto pool_bytes = static_cast<size_t>(dtype_row_bytes(opt.pool, pool_elems).value());
  const size_t kp_at = lay.take(pool_bytes), vp_at = lay.take(pool_bytes);
  const size_t pos_at = lay.take(m * 4), slot_at = lay.take(m * 4), seq_at = lay.take(m * 4),
               indptr_at = lay.take((m + 1) * 4), y_at = lay.take(kHead * kHeads * m * 4),
               factors_at = lay.take(kHead / 2 * 4);
  // Each token's table: the shared blocks up to its position's, then its own. A prefill's one sequence:
  // blocks 0, 1, ...
  std::vector<int32_t> indptr{0}, indices;
  const auto position = [&](int64_t t) {
    return static_cast<int32_t>(opt.prefill ? 37 + t : 37 + kStride * t);
  };
  if (opt.prefill) {
    for (int64_t j = 0; j <= position(m - 1) / kBlock; ++j) indices.push_back(static_cast<int32_t>(j));
    indptr.push_back(static_cast<int32_t>(indices.size()));
  }
  for (int64_t t = 0; t < m && !opt.prefill; ++t) {
    const int64_t pos = position(t);
    for (int64_t j = 0; j < pos / kBlock; ++j) indices.push_back(static_cast<int32_t>(j));
    indices.push_back(static_cast<int32_t>(kShared + t));
    indptr.push_back(static_cast<int32_t>(indices.size()));
  }
  const size_t indices_at = lay.take(indices.size() * 4);

  std::vector<uint8_t> host(lay.bytes);
  const auto fill_f32 = [&](size_t at, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      const float v = uni(rng);
      std::memcpy(host.data() + at + 4 * i, &v, 4);
    }
  };
  const auto fill_weight = [&](size_t at, int64_t rows, int64_t k = kEmbd,
                               std::optional<DType> other = std::nullopt) {
    const DType type = other.value_or(wtype);
    std::vector<float> row(static_cast<size_t>(k));
    const auto row_bytes = static_cast<size_t>(dtype_row_bytes(type, k).value());
    if (type == DType::f8_e4m3) {  // one scale a row (a per-channel checkpoint's: the backend's row form)
      for (int64_t r = 0; r < rows; ++r) {
        for (float& v : row) v = uni(rng) * 0.1f;
        float amax = 0.0f;
        for (const float v : row) amax = std::max(amax, std::fabs(v));
        const float d = amax / kF8E4M3Max;
        uint8_t* out = host.data() + at + r * row_bytes;
        for (int64_t blk = 0; blk < k / 32; ++blk) {
          std::memcpy(out + blk * 36, &d, 4);
          for (int e = 0; e < 32; ++e) out[blk * 36 + 4 + e] = f32_to_f8_e4m3(row[blk * 32 + e] / d);
        }
      }
      return;
    }
    if (dtype_info(type).quantize_row == nullptr) {
      random_blocks(type, host.data() + at, row_bytes * static_cast<size_t>(rows), rng);
      return;
    }
    for (int64_t r = 0; r < rows; ++r) {
      for (float& v : row) v = uni(rng) * 0.1f;
      dtype_info(type).quantize_row(row.data(), host.data() + at + r * row_bytes, k);
    }
  };
  fill_f32(x_at, kEmbd * m);
  fill_f32(att_at, kEmbd * m);
  fill_f32(nw_at, kEmbd);
  for (int64_t i = 0; i < kHead / 2; ++i) {
    const float f = 4.5f + 3.5f * uni(rng);
    std::memcpy(host.data() + factors_at + 4 * i, &f, 4);
  }
  fill_weight(wq_at, kHead * kHeads);
  fill_weight(wk_at, kHead * kKvHeads);
  fill_weight(wv_at, kHead * kKvHeads, kEmbd, v_type);
  fill_weight(wg_at, ff);
  fill_weight(wu_at, ff);
  fill_weight(wd_at, kEmbd, ff);
  fill_weight(wo_at, kEmbd);
  for (const size_t at : {kp_at, vp_at}) {
    if (opt.pool == DType::f32) {
      fill_f32(at, pool_elems);
      continue;
    }
    if (opt.pool == DType::q8_0 || opt.pool == DType::q8_64) {
      std::vector<float> values(static_cast<size_t>(pool_elems));
      for (float& v : values) v = uni(rng);
      dtype_info(opt.pool).quantize_row(values.data(), host.data() + at, pool_elems);
      continue;
    }
    for (int64_t i = 0; i < pool_elems; ++i) {
      const uint16_t h = f32_to_f16(uni(rng));
      std::memcpy(host.data() + at + 2 * i, &h, 2);
    }
  }
  for (int64_t t = 0; t < m; ++t) {
    const int32_t pos = position(t),
                  slot = opt.prefill ? pos : static_cast<int32_t>((kShared + t) * kBlock + pos % kBlock),
                  seq = opt.prefill ? 0 : static_cast<int32_t>(t);
    std::memcpy(host.data() + pos_at + 4 * t, &pos, 4);
    std::memcpy(host.data() + slot_at + 4 * t, &slot, 4);
    std::memcpy(host.data() + seq_at + 4 * t, &seq, 4);
  }
  std::memcpy(host.data() + indptr_at, indptr.data(), indptr.size() * 4);
  std::memcpy(host.data() + indices_at, indices.data(), indices.size() * 4);

  Layer L;
  L.bytes = lay.bytes;
  L.buf = b.allocate(lay.bytes).value();
  EXPECT_TRUE(
      b.upload(make_tensor(DType::i8, *L.buf, 0, static_cast<int64_t>(lay.bytes)), host.data(), lay.bytes)
          .ok());
  Buffer& buf = *L.buf;
  const Tensor x = make_tensor(DType::f32, buf, x_at, kEmbd, m),
               att = make_tensor(DType::f32, buf, att_at, kEmbd, m),
               h = make_tensor(DType::f32, buf, h_at, kEmbd, m);
  const ops::Weight nw(make_tensor(DType::f32, buf, nw_at, kEmbd));
  const auto weight = [&](size_t at, int64_t rows, int64_t k = kEmbd,
                          std::optional<DType> other = std::nullopt) {
    const DType type = other.value_or(wtype);
    const float input_scale = type == DType::f8_e4m3 ? opt.input_scale : 0.0f;
    if (!prepared) {
      ops::Weight w(make_tensor(type, buf, at, k, rows));
      w.input_scale = input_scale;
      return w;
    }
    auto made =
        b.prepare_weight(make_tensor(type, host.data() + at, k, rows), "w", WeightRole::weight_role_matmul);
    EXPECT_TRUE(made.ok()) << made.status().to_string();
    if (!made.ok()) return ops::Weight();
    L.weights.push_back(std::move(made).value());
    L.weights.back()->weight.input_scale = input_scale;
    return L.weights.back()->weight;
  };
  const Tensor q = make_tensor(DType::f32, buf, q_at, kHead, kHeads, m),
               k = make_tensor(DType::f32, buf, k_at, kHead, kKvHeads, m),
               v = make_tensor(DType::f32, buf, v_at, kHead, kKvHeads, m);
  const Tensor g = make_tensor(DType::f32, buf, g_at, ff, m), u = make_tensor(DType::f32, buf, u_at, ff, m),
               a = make_tensor(DType::f32, buf, a_at, ff, m),
               o = make_tensor(DType::f32, buf, o_at, kEmbd, m);
  const Tensor kp = make_tensor(opt.pool, buf, kp_at, kHead, kKvHeads, kBlock, kBlocks),
               vp = make_tensor(opt.pool, buf, vp_at, kHead, kKvHeads, kBlock, kBlocks);
  const Tensor pos = make_tensor(DType::i32, buf, pos_at, m),
               slots = make_tensor(DType::i32, buf, slot_at, m);
  ops::Attention attn;
  attn.q = q;
  attn.k_pool = kp;
  attn.v_pool = vp;
  attn.positions = pos;
  attn.seq = make_tensor(DType::i32, buf, seq_at, m);
  attn.bt_indptr = make_tensor(DType::i32, buf, indptr_at, static_cast<int64_t>(indptr.size()));
  attn.bt_indices = make_tensor(DType::i32, buf, indices_at, static_cast<int64_t>(indices.size()));
  attn.scale = 0.125f;
  attn.dst = make_tensor(DType::f32, buf, y_at, kHead, kHeads, m);
  const auto flat = [](Tensor t) {
    t.ne[0] *= t.ne[1];
    t.ne[1] = t.ne[2];
    t.ne[2] = 1;
    t.nb[1] = t.nb[2];
    t.nb[2] = t.nb[3];
    return t;
  };
  ops::RopeParams rp;
  rp.n_rot = opt.n_rot;
  rp.layout = opt.layout;
  rp.freq_base = 10000.0f;
  Program& p = L.program;
  EXPECT_TRUE(p.add(ops::Binary{x, ops::Weight(att), ops::BinaryKind::binary_kind_add, x}).ok());
  EXPECT_TRUE(p.add(ops::RmsNorm{x, nw, 1e-5f, false, h}).ok());
  EXPECT_TRUE(p.add(ops::Matmul{weight(wq_at, kHead * kHeads), h, flat(q)}).ok());
  EXPECT_TRUE(p.add(ops::Matmul{weight(wk_at, kHead * kKvHeads), h, flat(k)}).ok());
  EXPECT_TRUE(p.add(ops::Matmul{weight(wv_at, kHead * kKvHeads, kEmbd, v_type), h, flat(v)}).ok());
  const ops::Weight factors =
      opt.factors ? ops::Weight(make_tensor(DType::f32, buf, factors_at, opt.n_rot / 2)) : ops::Weight();
  EXPECT_TRUE(p.add(ops::Rope{q, pos, rp, factors, q}).ok());
  EXPECT_TRUE(p.add(ops::Rope{k, pos, rp, factors, k}).ok());
  EXPECT_TRUE(p.add(ops::KvWrite{k, v, kp, vp, slots}).ok());
  EXPECT_TRUE(p.add(attn).ok());
  static_assert(kHead * kHeads == kEmbd, "the output projection's rows are kEmbd long");
  EXPECT_TRUE(p.add(ops::Matmul{weight(wo_at, kEmbd), flat(attn.dst), att}).ok());
  EXPECT_TRUE(p.add(ops::Binary{x, ops::Weight(att), ops::BinaryKind::binary_kind_add, x}).ok());
  EXPECT_TRUE(p.add(ops::RmsNorm{x, nw, 1e-5f, true, h}).ok());
  EXPECT_TRUE(p.add(ops::Matmul{weight(wg_at, ff), h, g}).ok());
  EXPECT_TRUE(p.add(ops::Matmul{weight(wu_at, ff), h, u}).ok());
  const Tensor act = opt.act_in_place ? g : a;
  EXPECT_TRUE(p.add(ops::GatedAct{g, u, ops::GluKind::glu_kind_silu, act}).ok());
  EXPECT_TRUE(p.add(ops::Matmul{weight(wd_at, kEmbd, ff), act, o}).ok());
  EXPECT_TRUE(p.add(ops::Binary{o, ops::Weight(x), ops::BinaryKind::binary_kind_add, x}).ok());
  p.n_tokens = static_cast<int32_t>(m);
  return L;
}

// The layer's buffer after `reps` runs of its program (x accumulates, so each run differs): with graphs, the
// first run grows scratch (ops one by one), the second is captured, the third replayed. tweak: more options
// of the backend, named for the failure message.
struct Tweak {
  const char* name = nullptr;
  void (*apply)(CudaOptions&) = nullptr;
};
std::vector<uint8_t> run_layer(bool fuse, int64_t m, DType wtype, bool graphs = true, int reps = 2,
                               bool prepared = false, const LayerOptions& opt = {}, const Tweak& tweak = {}) {
  CudaOptions options = cuda_options_from_env();
  options.fuse = fuse;
  options.graphs = graphs;
  options.precision = ops::Precision::precision_fast;
  if (tweak.apply != nullptr) tweak.apply(options);
  auto b = make_cuda_backend(0, options);
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  if (!b.ok()) return {};
  Layer L = make_layer(**b, m, wtype, 42, prepared, opt);
  std::vector<uint8_t> out(L.bytes);
  for (int rep = 0; rep < reps; ++rep) EXPECT_TRUE((*b)->run(L.program).ok());
  EXPECT_TRUE(
      (*b)->download(out.data(), make_tensor(DType::i8, *L.buf, 0, static_cast<int64_t>(L.bytes)), L.bytes)
          .ok());
  EXPECT_TRUE((*b)->synchronize().ok());
  return out;
}

// Three runs: the last replays the graph the second captured.
void expect_fused_as_alone(int64_t m, DType wtype, bool prepared, const LayerOptions& opt = {},
                           const Tweak& tweak = {}) {
  const std::vector<uint8_t> fused = run_layer(true, m, wtype, true, 3, prepared, opt, tweak),
                             alone = run_layer(false, m, wtype, true, 3, prepared, opt, tweak);
  ASSERT_EQ(fused.size(), alone.size());
  ASSERT_FALSE(fused.empty());
  size_t first_diff = fused.size();
  for (size_t i = 0; i < fused.size() && first_diff == fused.size(); ++i) {
    if (fused[i] != alone[i]) first_diff = i;
  }
  EXPECT_EQ(first_diff, fused.size())
      << dtype_name(wtype) << (prepared ? " prepared" : "") << " m " << m << " pool " << dtype_name(opt.pool)
      << " n_rot " << opt.n_rot << (opt.layout == ops::RopeLayout::rope_layout_neox ? " neox" : "")
      << (opt.factors ? " factors" : "") << (opt.act_in_place ? " act in place" : "")
      << (opt.prefill ? " prefill" : "") << " ff " << opt.ff
      << (opt.input_scale > 0.0f ? " static scales" : "") << (tweak.name == nullptr ? "" : " with ")
      << (tweak.name == nullptr ? "" : tweak.name) << ": first differing byte";
}

TEST(CudaFusion, FusedLayerIsBitIdenticalToOpByOp) {
  // bf16, q8_0 in the file's form, q8_0 prepared (grouped). Up to 8 tokens: each token's positions in one
  // chunk (the block rounds x for the integer GEMV after reading its rows back); 12 and 20: the last tokens'
  // in several, merged by the last block (which rounds x). 100 bf16 rows: past the GEMMs of decode batches,
  // where the gated activation still writes the down projection's x in bf16.
  // Up to 8 tokens, Q/K/V's GEMV applies RoPE and writes the pools as it stores (the exact GEMV, the integer
  // one in grouped form: staged for one token, not for more); q8_0 in the file's form takes an integer GEMV
  // that does not, so the RoPE kernel runs after it.
  for (const auto& [wtype, prepared] :
       {std::pair{DType::bf16, false}, {DType::q8_0, false}, {DType::q8_0, true}}) {
    for (const int64_t m : {1, 3, 8, 12, 20}) expect_fused_as_alone(m, wtype, prepared);
  }
  expect_fused_as_alone(100, DType::bf16, false);
  // The staged GEMV's blocks taking several items each (the cos/sin of an item after the first made at its
  // store), and the RoPE kernel after the GEMV by choice.
  // With frequency factors, which the GEMV and the RoPE kernels make the frequencies from on the device.
  const Tweak few_blocks{"staged_gemv_grid 3", [](CudaOptions&o) { o.staged_gemv_grid = 3; }},
      no_rope{"gemv_rope off", [](CudaOptions&o) { o.gemv_rope = false; }};
  expect_fused_as_alone(1, DType::q8_0, true, {}, few_blocks);
  for (const int64_t m : {1, 3}) expect_fused_as_alone(m, DType::bf16, false, {}, no_rope);
  LayerOptions factors;
  factors.factors = true;
  for (const int64_t m : {1, 4}) {
    expect_fused_as_alone(m, DType::bf16, false, factors);
    expect_fused_as_alone(m, DType::q8_0, true, factors);
  }
  expect_fused_as_alone(1, DType::q8_0, true, factors, few_blocks);
  // RoPE + KV write over f32 pools, with all dims rotated as NeoX pairs (the 16-byte units of the kernel for
  // whole heads), and with half the dims rotated as NeoX pairs (the kernel of any shape).
  LayerOptions f32_pools;
  f32_pools.pool = DType::f32;
  LayerOptions neox;
  neox.layout = ops::RopeLayout::rope_layout_neox;
  LayerOptions neox_half = neox;
  neox_half.n_rot = kHead / 2;
  for (const int64_t m : {1, 5, 64}) {
    for (const LayerOptions& opt : {f32_pools, neox, neox_half}) {
      expect_fused_as_alone(m, DType::bf16, false, opt);
    }
  }
  // FP8 weights in row form (prepared): Q/K/V's GEMV rotates and writes the pools, gate and up's applies the
  // activation, as for the float types; 12 tokens: the e4m3 GEMMs.
  LayerOptions fp8_in_place;
  fp8_in_place.act_in_place = true;
  for (const int64_t m : {1, 3, 8, 12}) expect_fused_as_alone(m, DType::f8_e4m3, true);
  expect_fused_as_alone(1, DType::f8_e4m3, true, fp8_in_place);
  // Beyond the GEMV, x rounded apart for the e4m3 GEMMs: decode batches (kiln's e4m3 kernel on Hopper) and
  // a prefill, per token or by the static scales; from as many rows as the device has multiprocessors the
  // add + norm and the gated activation round it as they write it (prefills of 160 and 200 tokens).
  LayerOptions fp8_static;
  fp8_static.input_scale = 0.004f;
  LayerOptions fp8_prefill;
  fp8_prefill.prefill = true;
  LayerOptions fp8_prefill_static = fp8_prefill;
  fp8_prefill_static.input_scale = 0.004f;
  for (const int64_t m : {20, 64}) {
    for (const LayerOptions& opt : {LayerOptions{}, fp8_static, fp8_in_place}) {
      expect_fused_as_alone(m, DType::f8_e4m3, true, opt);
    }
  }
  for (const int64_t m : {40, 160, 200}) {
    for (const LayerOptions& opt : {fp8_prefill, fp8_prefill_static}) {
      expect_fused_as_alone(m, DType::f8_e4m3, true, opt);
    }
  }
  // f16 and f32 weights (the GEMV's matmul groups), and a gated activation written over its gate.
  for (const int64_t m : {1, 3}) {
    for (const DType wtype : {DType::f16, DType::f32}) expect_fused_as_alone(m, wtype, false);
  }
  LayerOptions in_place;
  in_place.act_in_place = true;
  for (const int64_t m : {1, 4, 8}) expect_fused_as_alone(m, DType::bf16, false, in_place);
  // Prefills, whose attention writes the output projection's x in bf16 (f16 weights: in f16), one tile of
  // tokens or several.
  LayerOptions prefill;
  prefill.prefill = true;
  for (const int64_t m : {40, 100}) expect_fused_as_alone(m, DType::bf16, false, prefill);
  expect_fused_as_alone(40, DType::f16, false, prefill);
  // q8_0 pools: RoPE and the KV write as one kernel after Q/K/V's GEMV (rope_kv_write_q8_kernel: a warp a
  // head row), against rope, rope and the KV write apart; NeoX pairs (32 dims apart), half the dims rotated,
  // frequency factors, 1 to 64 tokens. The attention that reads the pools rounds the output projection's x
  // for the integer GEMV (decode, one chunk or several) or writes it in bf16 (a prefill on tensor cores).
  LayerOptions q8_pools;
  q8_pools.pool = DType::q8_0;
  for (const int64_t m : {1, 3, 12}) {
    expect_fused_as_alone(m, DType::bf16, false, q8_pools);
    expect_fused_as_alone(m, DType::q8_0, true, q8_pools);
  }
  expect_fused_as_alone(1, DType::f8_e4m3, true, q8_pools);
  for (LayerOptions opt : {neox, neox_half, factors}) {
    opt.pool = DType::q8_0;
    for (const int64_t m : {1, 5, 64}) expect_fused_as_alone(m, DType::bf16, false, opt);
  }
  q8_pools.prefill = true;
  expect_fused_as_alone(40, DType::bf16, false, q8_pools);
  // q8_64 pools (blocks of 64: a lane two values of a block), the same.
  LayerOptions q8_64_pools;
  q8_64_pools.pool = DType::q8_64;
  for (const int64_t m : {1, 3, 12}) {
    expect_fused_as_alone(m, DType::bf16, false, q8_64_pools);
    expect_fused_as_alone(m, DType::q8_0, true, q8_64_pools);
  }
  for (LayerOptions opt : {neox, neox_half, factors}) {
    opt.pool = DType::q8_64;
    for (const int64_t m : {1, 64}) expect_fused_as_alone(m, DType::bf16, false, opt);
  }
  q8_64_pools.prefill = true;
  expect_fused_as_alone(40, DType::bf16, false, q8_64_pools);
}

// Layers of block-quantized weights beyond q8_0: Q4_K and Q5_K in the file's form (the staged integer GEMV
// for 1-4 tokens, Q/K/V's rotating), Q6_K and Q4_0 in grouped form, with gate and up of 512 rows each (their
// launch's blocks of 2 rows for one token) and of 2048 (8 rows); with the activation written over its gate,
// and with the staged blocks taking many items each.
TEST(CudaFusion, BlockQuantizedLayersAreBitIdenticalToOpByOp) {
  LayerOptions narrow, wide;
  narrow.ff = 512;
  wide.ff = 2048;
  for (const LayerOptions& opt : {narrow, wide}) {
    for (const int64_t m : {1, 2, 4}) expect_fused_as_alone(m, DType::q4_k, false, opt);
    for (const int64_t m : {1, 3}) expect_fused_as_alone(m, DType::q6_k, true, opt);
    for (const int64_t m : {1, 2}) expect_fused_as_alone(m, DType::q4_0, true, opt);
  }
  expect_fused_as_alone(1, DType::q5_k, false, wide);
  LayerOptions in_place = wide;
  in_place.act_in_place = true;
  expect_fused_as_alone(1, DType::q4_k, false, in_place);
  expect_fused_as_alone(1, DType::q8_0, true, in_place);
  const Tweak few_blocks{"staged_gemv_grid 3", [](CudaOptions& o) { o.staged_gemv_grid = 3; }};
  for (const int64_t m : {1, 3}) expect_fused_as_alone(m, DType::q4_k, false, wide, few_blocks);
  expect_fused_as_alone(1, DType::q8_0, true, narrow, few_blocks);
  // One token's launches at 4 rows a block (CudaOptions::gemv_rows), Q/K/V's rotating.
  const Tweak four_rows{"gemv_rows 4", [](CudaOptions& o) { o.gemv_rows = 4; }};
  expect_fused_as_alone(1, DType::q4_k, false, wide, four_rows);
  expect_fused_as_alone(1, DType::q4_0, true, wide, four_rows);
  // V's weight of another type than Q and K's (a Q4_K_M layer's Q6_K V): Q and K's GEMV and V's, on one
  // rounding of x, rotate and write the pools in two launches (Q6_K in grouped form), or neither does and the
  // RoPE kernel follows (Q6_K in the file's form, which the staged GEMV does not take; the split switched
  // off).
  LayerOptions q6_v = wide;
  q6_v.v_type = DType::q6_k;
  for (const bool prepared : {false, true}) {
    for (const int64_t m : {1, 3}) expect_fused_as_alone(m, DType::q4_k, prepared, q6_v);
  }
  expect_fused_as_alone(1, DType::q4_k, true, q6_v,
                        {"gemv_rope_split off", [](CudaOptions& o) { o.gemv_rope_split = false; }});
  expect_fused_as_alone(1, DType::q4_k, true, q6_v, few_blocks);
  expect_fused_as_alone(1, DType::q4_k, true, q6_v, four_rows);
  LayerOptions q4_v;
  q4_v.v_type = DType::q4_0;
  expect_fused_as_alone(1, DType::q8_0, true, q4_v);
}

// Gate and up (bf16 [k, n] each) on m tokens, then silu(g) u written over g: the buffer after two
// runs, fused (the paired GEMV) or op by op.
std::vector<uint8_t> run_gate_up(bool fuse, int64_t k, int64_t n, int64_t m) {
  CudaOptions options = cuda_options_from_env();
  options.fuse = fuse;
  options.precision = ops::Precision::precision_fast;
  auto made = make_cuda_backend(0, options);
  EXPECT_TRUE(made.ok()) << made.status().to_string();
  if (!made.ok()) return {};
  Backend& b = **made;
  std::mt19937_64 rng(static_cast<uint64_t>(k * 7 + n * 31 + m));
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  Layout lay;
  const auto row = static_cast<size_t>(dtype_row_bytes(DType::bf16, k).value());
  const size_t wg_at = lay.take(row * n), wu_at = lay.take(row * n), x_at = lay.take(k * m * 4),
               g_at = lay.take(n * m * 4), u_at = lay.take(n * m * 4);
  std::vector<uint8_t> host(lay.bytes);
  std::vector<float> values(static_cast<size_t>(k));
  for (const size_t at : {wg_at, wu_at}) {
    for (int64_t r = 0; r < n; ++r) {
      for (float& v : values) v = uni(rng) * 0.1f;
      dtype_info(DType::bf16).quantize_row(values.data(), host.data() + at + r * row, k);
    }
  }
  for (int64_t i = 0; i < k * m; ++i) {
    const float v = uni(rng);
    std::memcpy(host.data() + x_at + 4 * i, &v, 4);
  }
  auto buf = b.allocate(lay.bytes).value();
  EXPECT_TRUE(
      b.upload(make_tensor(DType::i8, *buf, 0, static_cast<int64_t>(lay.bytes)), host.data(), lay.bytes)
          .ok());
  const Tensor x = make_tensor(DType::f32, *buf, x_at, k, m), g = make_tensor(DType::f32, *buf, g_at, n, m),
               u = make_tensor(DType::f32, *buf, u_at, n, m);
  Program p;
  EXPECT_TRUE(p.add(ops::Matmul{ops::Weight(make_tensor(DType::bf16, *buf, wg_at, k, n)), x, g}).ok());
  EXPECT_TRUE(p.add(ops::Matmul{ops::Weight(make_tensor(DType::bf16, *buf, wu_at, k, n)), x, u}).ok());
  EXPECT_TRUE(p.add(ops::GatedAct{g, u, ops::GluKind::glu_kind_silu, g}).ok());
  p.n_tokens = static_cast<int32_t>(m);
  EXPECT_EQ(cuda::fused_length(fast_context(), p.ops()), 3u);
  for (int rep = 0; rep < 2; ++rep) EXPECT_TRUE(b.run(p).ok());
  std::vector<uint8_t> out(lay.bytes);
  EXPECT_TRUE(
      b.download(out.data(), make_tensor(DType::i8, *buf, 0, static_cast<int64_t>(lay.bytes)), lay.bytes)
          .ok());
  EXPECT_TRUE(b.synchronize().ok());
  return out;
}

// The paired gate/up GEMV at each of its block shapes (one token: rows of more than 2048 elements 2 a block
// below 1024 rows in all, 8 from 4096, shorter rows 8 a block whatever their count, with a partial last
// block; 2-8 tokens: 4 rows, 4 or 8 columns) gives the bytes of the ops one by one.
TEST(CudaFusion, GateUpWithTheActivationGivesTheOpsBits) {
  for (const int64_t k : {256, 2304}) {
    for (const int64_t n : {300, 700, 2051, 4096}) {
      for (const int64_t m : {1, 2, 5, 8}) {
        const std::vector<uint8_t> fused = run_gate_up(true, k, n, m), alone = run_gate_up(false, k, n, m);
        ASSERT_FALSE(fused.empty());
        EXPECT_TRUE(fused == alone) << "k " << k << " n " << n << " m " << m;
      }
    }
  }
}

// Batched decode steps (9-64 tokens: cuBLAS GEMMs) captured and replayed as graphs give the bytes of the same
// steps launched op by op.
TEST(CudaFusion, GemmStepsReplayAsLaunchedOneByOne) {
  for (const DType wtype : {DType::bf16, DType::q8_0}) {
    for (const int64_t m : {9, 20, 64}) {
      const std::vector<uint8_t> graphed = run_layer(true, m, wtype, true, 3),
                                 launched = run_layer(true, m, wtype, false, 3);
      ASSERT_EQ(graphed.size(), launched.size());
      ASSERT_FALSE(graphed.empty());
      EXPECT_TRUE(graphed == launched) << dtype_name(wtype) << " m " << m;
    }
  }
}

// A server's steps change size as requests come and go: each size keeps its own graph (CudaOptions::graphs
// of them), so steps that alternate replay instead of capturing each time, and give the bytes the ops give
// launched one by one.
TEST(CudaFusion, AlternatingStepsKeepAGraphEach) {
  const auto run = [](int graphs, std::string* summary) {
    CudaOptions options = cuda_options_from_env();
    options.graphs = graphs;
    options.precision = ops::Precision::precision_fast;
    auto b = make_cuda_backend(0, options);
    EXPECT_TRUE(b.ok()) << b.status().to_string();
    std::vector<uint8_t> out;
    if (!b.ok()) return out;
    Layer one = make_layer(**b, 1, DType::q8_0, 7), three = make_layer(**b, 3, DType::q8_0, 8);
    for (int rep = 0; rep < 4; ++rep) {
      EXPECT_TRUE((*b)->run(one.program).ok());
      EXPECT_TRUE((*b)->run(three.program).ok());
    }
    for (const Layer* L : {&one, &three}) {
      std::vector<uint8_t> bytes(L->bytes);
      EXPECT_TRUE((*b)->download(bytes.data(),
                                 make_tensor(DType::i8, *L->buf, 0, static_cast<int64_t>(L->bytes)), L->bytes)
                      .ok());
      out.insert(out.end(), bytes.begin(), bytes.end());
    }
    EXPECT_TRUE((*b)->synchronize().ok());
    *summary = (*b)->profile_summary();
    return out;
  };
  std::string kept, last, none;
  const std::vector<uint8_t> a = run(16, &kept), b = run(1, &last), c = run(0, &none);
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == c);
  EXPECT_TRUE(b == c);
  // Two shapes on a fresh backend: each shape's first step grows the scratch, so it runs op by op, its second
  // is captured, the other two replay; keeping one graph, no step replays (each captures, or runs op by op
  // where a capture found the scratch too small).
  EXPECT_NE(kept.find("4 programs replayed as graphs, 2 captured"), std::string::npos) << kept;
  EXPECT_NE(kept.find("2 launched op by op"), std::string::npos) << kept;
  EXPECT_NE(last.find("0 programs replayed as graphs"), std::string::npos) << last;
  EXPECT_NE(none.find("8 launched op by op"), std::string::npos) << none;
}

// Decode steps are padded to 1, 2, 4 and multiples of 8 rows up to the largest graphed step, so that a
// server's batches, changing size each step, replay 11 graphs; without graphs nothing is padded.
TEST(CudaFusion, DecodeStepsArePaddedToGraphSizes) {
  for (const int graphs : {16, 0}) {
    CudaOptions options = cuda_options_from_env();
    options.graphs = graphs;
    auto b = make_cuda_backend(0, options);
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    std::set<int32_t> sizes;
    for (int32_t rows = 1; rows <= 64; ++rows) {
      const int32_t padded = (*b)->padded_rows(rows);
      EXPECT_GE(padded, rows);
      EXPECT_LE(padded, graphs > 0 ? std::max(rows + 7, 2 * rows - 1) : rows) << rows;
      sizes.insert(padded);
    }
    EXPECT_EQ(sizes.size(), graphs > 0 ? 11u : 64u);
    EXPECT_EQ((*b)->padded_rows(65), 65);  // past the graphs' steps
  }
}

// The length of each fused sequence (0: an op alone) in the order a backend would run the program.
std::vector<size_t> fused_lengths(const Program& program, const cuda::Context& ctx = fast_context()) {
  const std::vector<ops::Op>& ops = program.ops();
  std::vector<size_t> lengths;
  for (size_t i = 0; i < ops.size();) {
    const size_t n = cuda::fused_length(ctx, std::span(ops).subspan(i));
    lengths.push_back(n);
    i += n > 0 ? n : 1;
  }
  return lengths;
}

TEST(CudaFusion, SequencesFuseWhereTheyShould) {
  auto b = make_backend("cpu");  // the program only: fused_length reads operands, launches nothing
  ASSERT_TRUE(b.ok());
  // One token: add+norm, qkv with rope q+k and the kv write (one GEMV launch), the attention and the output
  // projection alone, add+norm, gate+up with the activation (one GEMV launch), down and the last add alone.
  // 20 tokens (GEMMs on x in bf16): the add+norm and the activation write x in bf16 for the GEMMs that read
  // it, which join them: add+norm+qkv, rope q+k+kv write, the attention, the output projection alone (the
  // attention of 20 sequences of a token takes the decode kernel), add+norm+gate+up, activation+down, the
  // last add alone. The same with the activation written over its gate.
  for (const bool in_place : {false, true}) {
    LayerOptions opt;
    opt.act_in_place = in_place;
    for (const int64_t m : {1, 20}) {
      Layer L = make_layer(**b, m, DType::bf16, 1, false, opt);
      const std::vector<size_t> lengths = fused_lengths(L.program);
      const std::vector<size_t> want =
          m == 1 ? std::vector<size_t>{2, 6, 0, 0, 2, 3, 0, 0} : std::vector<size_t>{5, 3, 0, 0, 4, 2, 0};
      EXPECT_EQ(lengths, want) << "m " << m << (in_place ? " act in place" : "");
    }
  }
  {
    // A prefill of 40 tokens: the attention (tensor cores) writes the output projection's x in bf16, which
    // joins it.
    LayerOptions opt;
    opt.prefill = true;
    Layer L = make_layer(**b, 40, DType::bf16, 1, false, opt);
    EXPECT_EQ(fused_lengths(L.program), (std::vector<size_t>{5, 3, 2, 4, 2, 0})) << "prefill";
    // Not when the projection reads something else.
    std::vector<ops::Op> ops = L.program.ops();
    std::get<ops::Matmul>(ops[9]).x = std::get<ops::RmsNorm>(ops[1]).dst;
    EXPECT_EQ(cuda::fused_length(fast_context(), std::span(ops).subspan(8)), 0u);
  }
  {
    // With the activation's gate and up swapped, gate+up run as one GEMV launch and the activation as its own
    // kernel.
    Layer L = make_layer(**b, 1, DType::bf16, 1);
    std::vector<ops::Op> ops = L.program.ops();
    auto& glu = std::get<ops::GatedAct>(ops[14]);
    std::swap(glu.gate, glu.up);
    EXPECT_EQ(cuda::fused_length(fast_context(), std::span(ops).subspan(12)), 2u);
  }
  // Integer GEMVs (q8_0 weights, up to 16 tokens) join the add+norm, the decode attention or the activation
  // whose result they read, and up to 8 tokens the RoPE and KV write join Q/K/V's; the GEMMs beyond (x in
  // f16) join the add+norm and the activation.
  for (const int64_t m : {1, 8, 12, 20}) {
    Layer L = make_layer(**b, m, DType::q8_0, 1);
    const std::vector<size_t> lengths = fused_lengths(L.program);
    const std::vector<size_t> want = m <= 8    ? std::vector<size_t>{8, 2, 4, 2, 0}
                                     : m <= 16 ? std::vector<size_t>{5, 3, 2, 4, 2, 0}
                                               : std::vector<size_t>{5, 3, 0, 0, 4, 2, 0};
    EXPECT_EQ(lengths, want) << "q8_0 m " << m;
    // A matmul that reads something other than the activation's result does not join it.
    std::vector<ops::Op> ops = L.program.ops();
    std::get<ops::Matmul>(ops[15]).x = std::get<ops::GatedAct>(ops[14]).up;
    EXPECT_EQ(cuda::fused_length(fast_context(), std::span(ops).subspan(14)), 0u) << "q8_0 m " << m;
  }
  // FP8 weights beyond the GEMV (the e4m3 GEMM), a step of at least the device's multiprocessors in rows: the
  // add + norm and the activation round x to e4m3 for the GEMMs that read it, which join them, per token or
  // by static scales, the activation written apart or over its gate; the prefill's attention writes nothing
  // for the output projection, which rounds its own x. Fewer rows: the norm and the activation alone, Q/K/V
  // and gate/up each one group on x rounded apart.
  {
    for (const float input_scale : {0.0f, 0.004f}) {
      for (const bool in_place : {false, true}) {
        LayerOptions opt;
        opt.input_scale = input_scale;
        opt.act_in_place = in_place;
        Layer L = make_layer(**b, 20, DType::f8_e4m3, 1, false, opt);
        EXPECT_EQ(fused_lengths(L.program, fp8_context()), (std::vector<size_t>{5, 3, 0, 0, 4, 2, 0}))
            << "fp8, scale " << input_scale << (in_place ? ", act in place" : "");
      }
    }
    LayerOptions prefill;
    prefill.prefill = true;
    Layer P = make_layer(**b, 40, DType::f8_e4m3, 1, false, prefill);
    EXPECT_EQ(fused_lengths(P.program, fp8_context()), (std::vector<size_t>{5, 3, 0, 0, 4, 2, 0}))
        << "fp8 prefill";
    Layer F = make_layer(**b, 20, DType::f8_e4m3, 1);
    EXPECT_EQ(fused_lengths(F.program, fp8_context(132)), (std::vector<size_t>{2, 3, 3, 0, 0, 2, 2, 0, 0, 0}))
        << "fp8, fewer rows than multiprocessors";
    // Without cuBLASLt the FP8 matmuls take the dequantizing GEMM: the norm and the activation write x in
    // f16.
    Layer D = make_layer(**b, 20, DType::f8_e4m3, 1);
    EXPECT_EQ(fused_lengths(D.program), (std::vector<size_t>{5, 3, 0, 0, 4, 2, 0})) << "fp8 dequantized";
    // A gated activation whose rows are not 16-byte aligned rounds nothing: it and down run apart.
    std::vector<ops::Op> ops = P.program.ops();
    auto& glu = std::get<ops::GatedAct>(ops[14]);
    auto& down = std::get<ops::Matmul>(ops[15]);
    ASSERT_EQ(down.x.data, glu.dst.data);
    glu.dst.data = static_cast<char*>(glu.dst.data) + 4;
    down.x = glu.dst;
    EXPECT_EQ(cuda::fused_length(fp8_context(), std::span(ops).subspan(14)), 0u) << "fp8, act misaligned";
  }
  // q8_0 pools: the same sequences as f16 pools (Q/K/V's GEMV then the RoPE + KV-write kernel, in one
  // sequence), for bf16 and q8_0 weights; a prefill's RoPE q, RoPE k and KV write as one kernel.
  {
    LayerOptions q8_pools;
    q8_pools.pool = DType::q8_0;
    Layer L = make_layer(**b, 1, DType::bf16, 1, false, q8_pools);
    EXPECT_EQ(fused_lengths(L.program), (std::vector<size_t>{2, 6, 0, 0, 2, 3, 0, 0})) << "q8_0 pools";
    Layer Q = make_layer(**b, 1, DType::q8_0, 1, false, q8_pools);
    EXPECT_EQ(fused_lengths(Q.program), (std::vector<size_t>{8, 2, 4, 2, 0})) << "q8_0 pools, q8_0";
    q8_pools.prefill = true;
    Layer P = make_layer(**b, 40, DType::bf16, 1, false, q8_pools);
    EXPECT_EQ(fused_lengths(P.program), (std::vector<size_t>{5, 3, 2, 4, 2, 0})) << "q8_0 pools, prefill";
    LayerOptions q8_64_pools;
    q8_64_pools.pool = DType::q8_64;
    Layer L64 = make_layer(**b, 1, DType::bf16, 1, false, q8_64_pools);
    EXPECT_EQ(fused_lengths(L64.program), (std::vector<size_t>{2, 6, 0, 0, 2, 3, 0, 0})) << "q8_64 pools";
  }
  // V's weight of another type (q4_0 beside q8_0): the same sequences, V's GEMV a launch of its own; with the
  // split switched off, V and the RoPE + KV write run apart.
  {
    LayerOptions q4_v;
    q4_v.v_type = DType::q4_0;
    Layer L = make_layer(**b, 1, DType::q8_0, 1, false, q4_v);
    EXPECT_EQ(fused_lengths(L.program), (std::vector<size_t>{8, 2, 4, 2, 0})) << "v q4_0";
    const std::vector<ops::Op>& ops = L.program.ops();
    EXPECT_EQ(cuda::fused_length(fast_context(), std::span(ops).subspan(2)), 6u) << "v q4_0, no norm";
    cuda::Context off = fast_context();
    off.options.gemv_rope_split = false;
    EXPECT_EQ(cuda::fused_length(off, std::span(ops)), 4u) << "v q4_0, split off";
    EXPECT_EQ(cuda::fused_length(off, std::span(ops).subspan(4)), 0u) << "v q4_0, split off";
    EXPECT_EQ(cuda::fused_length(off, std::span(ops).subspan(5)), 3u) << "v q4_0, split off";
  }
  // A norm of something other than the sum, and a KV write of another k, do not fuse.
  Layer L = make_layer(**b, 1, DType::bf16, 1);
  std::vector<ops::Op> ops = L.program.ops();
  std::get<ops::RmsNorm>(ops[1]).x = std::get<ops::Binary>(ops[0]).b.tensor;
  EXPECT_EQ(cuda::fused_length(fast_context(), std::span(ops)), 0u);
  std::get<ops::KvWrite>(ops[7]).k = std::get<ops::Rope>(ops[5]).dst;  // q's, not k's
  EXPECT_EQ(cuda::fused_length(fast_context(), std::span(ops).subspan(5)), 0u);
  EXPECT_EQ(cuda::fused_length(fast_context(), std::span(ops).subspan(2)), 3u);  // Q/K/V alone
  // Q/K/V's GEMV rotates q and k in place, in the normal layout, every dim of a head, with or without
  // frequency factors; a RoPE of a view other than q's, NeoX pairs, half the dims rotated or the switch off
  // leave the RoPE and the KV write to their own kernel.
  const auto qkv_rope = [&](const std::vector<ops::Op>& o, const cuda::Context& ctx = fast_context()) {
    return cuda::fused_length(ctx, std::span(o).subspan(2));
  };
  ops = L.program.ops();
  EXPECT_EQ(qkv_rope(ops), 6u);
  {
    std::vector<ops::Op> o = ops;
    std::get<ops::Rope>(o[5]).dst = std::get<ops::Matmul>(o[2]).dst;  // q's bytes, another view: not in place
    EXPECT_EQ(qkv_rope(o), 3u);
    o = ops;
    std::get<ops::Rope>(o[5]).p.layout = ops::RopeLayout::rope_layout_neox;
    std::get<ops::Rope>(o[6]).p.layout = ops::RopeLayout::rope_layout_neox;
    EXPECT_EQ(qkv_rope(o), 3u);
    o = ops;
    std::get<ops::Rope>(o[5]).p.n_rot = kHead / 2;
    std::get<ops::Rope>(o[6]).p.n_rot = kHead / 2;
    EXPECT_EQ(qkv_rope(o), 3u);
    o = ops;
    std::get<ops::Rope>(o[5]).freq_factors = ops::Weight(std::get<ops::RmsNorm>(o[1]).w.tensor);
    std::get<ops::Rope>(o[6]).freq_factors = std::get<ops::Rope>(o[5]).freq_factors;
    EXPECT_EQ(qkv_rope(o), 6u);
    cuda::Context off = fast_context();
    off.options.gemv_rope = false;
    EXPECT_EQ(qkv_rope(ops, off), 3u);
  }
}

// What a GEMV sends toward L2 for the matmuls after it: the weights of the next group (Q/K/V, o, gate and up)
// whole, when they take at most the cap; nothing when they take more, or when the next matmul takes no GEMV.
TEST(CudaFusion, WeightsAheadAreTheNextGroupWhole) {
  auto b = make_backend("cpu");  // the program only: weights_ahead reads operands, launches nothing
  ASSERT_TRUE(b.ok());
  const auto bytes_of = [](const Tensor& w) { return w.row_bytes() + (w.ne[1] - 1) * w.nb[1]; };
  for (const DType type : {DType::bf16, DType::q8_0}) {
    Layer L = make_layer(**b, 1, type, 1);
    const std::vector<ops::Op> ops = L.program.ops();
    const std::span<const ops::Op> all(ops);
    const auto w = [&](size_t i) -> const Tensor& { return std::get<ops::Matmul>(ops[i]).w.tensor; };
    const int64_t cap = int64_t{1} << 40;
    struct Case {
      size_t from;                  // the ops after a GEMV sequence
      std::vector<size_t> matmuls;  // the next group's matmuls
    };
    for (const Case& c : {Case{0, {2, 3, 4}}, Case{5, {9}}, Case{10, {12, 13}}, Case{14, {15}}}) {
      const cuda::L2Ahead ahead = cuda::weights_ahead(fast_context(), all.subspan(c.from), cap);
      int64_t total = 0;
      for (size_t j = 0; j < 3; ++j) {
        if (j >= c.matmuls.size()) {
          EXPECT_EQ(ahead.bytes[j], 0) << dtype_name(type) << " from " << c.from << " range " << j;
          continue;
        }
        const Tensor& t = w(c.matmuls[j]);
        const auto at = reinterpret_cast<uintptr_t>(t.data);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(ahead.p[j]), (at + 15) & ~uintptr_t{15}) << c.from << " " << j;
        EXPECT_EQ(ahead.bytes[j] % 16, 0);
        EXPECT_GT(ahead.bytes[j], bytes_of(t) - 32)
            << dtype_name(type) << " from " << c.from << " range " << j;
        EXPECT_LE(reinterpret_cast<uintptr_t>(ahead.p[j]) + ahead.bytes[j], at + bytes_of(t));
        total += ahead.bytes[j];
      }
      // A cap below the group's bytes: nothing; no matmul after the ops: nothing.
      const cuda::L2Ahead none = cuda::weights_ahead(fast_context(), all.subspan(c.from), total - 16);
      EXPECT_EQ(none.bytes[0] + none.bytes[1] + none.bytes[2], 0) << dtype_name(type) << " from " << c.from;
    }
    const cuda::L2Ahead end = cuda::weights_ahead(fast_context(), all.subspan(16), cap);
    EXPECT_EQ(end.bytes[0], 0) << dtype_name(type);
  }
  // The next matmul taking the GEMM (20 tokens): nothing.
  Layer L = make_layer(**b, 20, DType::bf16, 1);
  const std::vector<ops::Op> ops = L.program.ops();
  const cuda::L2Ahead gemm =
      cuda::weights_ahead(fast_context(), std::span<const ops::Op>(ops).subspan(5), int64_t{1} << 40);
  EXPECT_EQ(gemm.bytes[0], 0);
}

}  // namespace
}  // namespace kiln
