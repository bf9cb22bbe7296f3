// Batch-invariant mode (CudaOptions::batch_invariant, docs/cuda.md): a token's result is the same bits
// whatever else the step holds. For every Matmul weight type and both precisions, a row of x multiplied alone
// and at positions inside batches of 2 to 200 rows; an add + RMSNorm and the Q/K/V matmuls on its result (the
// fused kernels); MoeMatmul's token alone and among 64; Attention's decode token alone, among 64 decoding
// sequences and beside a prefill chunk, and that chunk alone and among the decodes. And the teeth: without
// the mode, the kernel changes with the batch where the table of docs/cuda.md says so, and the bits with it.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "backends/cuda/cuda_backend.h"

namespace kiln {
namespace {

std::unique_ptr<Backend> cuda_backend(ops::Precision precision, bool invariant) {
  CudaOptions o = cuda_options_from_env();
  o.precision = precision;
  o.batch_invariant = invariant;
  auto made = make_cuda_backend(0, o);
  EXPECT_TRUE(made.ok()) << made.status().to_string();
  return made.ok() ? std::move(made).value() : nullptr;
}

const char* precision_name(ops::Precision p) {
  return p == ops::Precision::precision_fast ? "fast" : "exact";
}

constexpr ops::Precision kPrecisions[] = {ops::Precision::precision_exact, ops::Precision::precision_fast};

// The Matmul weight types of the CUDA backend (backends/cuda/matmul/dequant.cuh's KILN_CUDA_WEIGHT_TYPES).
constexpr DType kWeightTypes[] = {DType::f32,   DType::f16,     DType::bf16,   DType::q4_0,   DType::q4_1,
                                  DType::q5_0,  DType::q5_1,    DType::q8_0,   DType::q2_k,   DType::q3_k,
                                  DType::q4_k,  DType::q5_k,    DType::q6_k,   DType::iq4_nl, DType::iq4_xs,
                                  DType::mxfp4, DType::iq2_xxs, DType::iq2_xs, DType::iq2_s,  DType::iq3_xxs,
                                  DType::iq3_s, DType::iq1_s,   DType::iq1_m};

// `rows` random rows of k elements of `type`: float types from uniform values; block types random bytes
// with their f16 scales (d, and the minimum's where there is one) random positive normals in 2^-9 .. 2^-8
// (IQ1_M's d in the top nibbles of its four scale words) and MXFP4's shared exponent 2^-9 .. 2^-6, so that
// no product overflows (kiln has no quantizer of most of these types).
std::vector<uint8_t> random_rows(DType type, int64_t k, int64_t rows, std::mt19937_64& rng) {
  const auto row_bytes = static_cast<size_t>(dtype_row_bytes(type, k).value());
  std::vector<uint8_t> w(row_bytes * static_cast<size_t>(rows));
  if (!dtype_info(type).is_quantized) {
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    std::vector<float> v(static_cast<size_t>(k));
    for (int64_t r = 0; r < rows; ++r) {
      for (float& e : v) e = uni(rng);
      dtype_info(type).quantize_row(v.data(), w.data() + static_cast<size_t>(r) * row_bytes, k);
    }
    return w;
  }
  std::uniform_int_distribution<int> byte(0, 255), mant(0, 0x3FF), exponent(118, 121);
  for (uint8_t& b : w) b = static_cast<uint8_t>(byte(rng));
  std::vector<size_t> f16_at;  // the f16 scales' offsets in a block
  switch (type) {
    case DType::q4_1:
    case DType::q5_1:
    case DType::q4_k:
    case DType::q5_k: f16_at = {0, 2}; break;
    case DType::q2_k: f16_at = {80, 82}; break;
    case DType::q3_k: f16_at = {108}; break;
    case DType::q6_k: f16_at = {208}; break;
    case DType::mxfp4:
    case DType::iq1_m: break;
    default: f16_at = {0}; break;  // q4_0, q5_0, q8_0, iq4_nl, iq4_xs, the other i-quants
  }
  const auto block = static_cast<size_t>(dtype_info(type).type_size);
  for (size_t b = 0; b < w.size() / block; ++b) {
    if (type == DType::mxfp4) w[b * block] = static_cast<uint8_t>(exponent(rng));
    for (const size_t at : f16_at) {
      const auto bits = static_cast<uint16_t>(0x1800 + mant(rng));
      std::memcpy(w.data() + b * block + at, &bits, 2);
    }
    if (type == DType::iq1_m) {  // scale words at 48: bits 4i..4i+3 of d on top of word i
      const auto bits = static_cast<uint16_t>(0x1800 + mant(rng));
      for (size_t i = 0; i < 4; ++i) {
        uint8_t& top = w[b * block + 48 + 2 * i + 1];
        top = static_cast<uint8_t>((top & 0x0F) | (((bits >> (4 * i)) & 0xF) << 4));
      }
    }
  }
  return w;
}

std::vector<float> uniform(size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& e : v) e = uni(rng);
  return v;
}

// Device tensors of one step, alive while it is.
struct Step {
  explicit Step(Backend& backend) : b(backend) {}
  Backend& b;
  std::vector<std::unique_ptr<Buffer>> buffers;
  Tensor tensor(DType type, const void* host, size_t bytes, int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1,
                int64_t ne3 = 1) {
    buffers.push_back(b.allocate(std::max<size_t>(bytes, 16)).value());
    const Tensor t = make_tensor(type, *buffers.back(), 0, ne0, ne1, ne2, ne3);
    if (host != nullptr) {
      EXPECT_TRUE(b.upload(t, host, bytes).ok());
    }
    return t;
  }
  Tensor f32(const float* host, int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1) {
    return tensor(DType::f32, host, static_cast<size_t>(ne0 * ne1 * ne2) * 4, ne0, ne1, ne2);
  }
  Tensor i32(const std::vector<int32_t>& host, int64_t ne0, int64_t ne1 = 1) {
    return tensor(DType::i32, host.data(), host.size() * 4, ne0, ne1);
  }
  // Runs `p` (n_tokens tokens) and brings back the f32 tensors `outs`.
  std::vector<std::vector<float>> run(Program& p, int32_t n_tokens, std::initializer_list<Tensor> outs) {
    p.n_tokens = n_tokens;
    const Status s = b.run(p);
    EXPECT_TRUE(s.ok()) << s.to_string();
    std::vector<std::vector<float>> got;
    for (const Tensor& t : outs) {
      got.emplace_back(static_cast<size_t>(t.n_elements()));
      EXPECT_TRUE(b.download(got.back().data(), t, got.back().size() * 4).ok());
    }
    EXPECT_TRUE(b.synchronize().ok());
    return got;
  }
};

// The outputs of rows first .. first + m - 1 of a batch (each output's rows consecutive, of one length).
using BatchFn = std::function<std::vector<std::vector<float>>(int64_t first, int64_t m)>;

// Of `total` rows, each of `probes` computed alone against the same row inside batches of each of `sizes`
// rows (two batches of each size: the first rows, and the last, so that a probe sits at different
// positions): the number of (probe, batch) pairs whose bits differ, and the first such in `first_diff`.
int differing(const BatchFn& run, int64_t total, std::initializer_list<int64_t> sizes,
              std::initializer_list<int64_t> probes, std::string& first_diff) {
  std::vector<std::pair<int64_t, std::vector<std::vector<float>>>> alone;
  for (const int64_t r : probes) alone.emplace_back(r, run(r, 1));
  int n = 0;
  for (const int64_t m : sizes) {
    for (const int64_t first : {int64_t{0}, total - m}) {
      const auto batch = run(first, m);
      for (const auto& [r, one] : alone) {
        if (r < first || r >= first + m) continue;
        for (size_t o = 0; o < one.size(); ++o) {
          const size_t len = one[o].size();
          if (std::memcmp(one[o].data(), batch[o].data() + static_cast<size_t>(r - first) * len, len * 4) !=
              0) {
            if (n++ == 0) {
              first_diff = fmt::format("row {} (output {}) alone and at {} of a batch of {} from row {}", r,
                                       o, r - first, m, first);
            }
          }
        }
      }
      if (m == total) break;
    }
  }
  return n;
}

constexpr int64_t kRows = 200;  // x rows
constexpr int64_t kOut = 37;    // weight rows: not a multiple of any rows a block or tile

// One Matmul of `type` [k, kOut] (prepared as a model's weight) on rows of a kRows x k pool of x.
BatchFn matmul_batches(Backend& b, DType type, int64_t k, std::mt19937_64& rng,
                       std::vector<std::unique_ptr<WeightHandle>>& keep) {
  const std::vector<uint8_t> host_w = random_rows(type, k, kOut, rng);
  auto made = b.prepare_weight(make_tensor(type, const_cast<uint8_t*>(host_w.data()), k, kOut), "w",
                               WeightRole::weight_role_matmul);
  EXPECT_TRUE(made.ok()) << made.status().to_string();
  if (!made.ok()) return nullptr;
  keep.push_back(std::move(made).value());
  const ops::Weight w = keep.back()->weight;
  auto x = std::make_shared<std::vector<float>>(uniform(static_cast<size_t>(k * kRows), rng));
  return [&b, w, x, k](int64_t first, int64_t m) {
    Step s{b};
    const Tensor xt = s.f32(x->data() + first * k, k, m), dst = s.f32(nullptr, kOut, m);
    Program p;
    EXPECT_TRUE(p.add(ops::Matmul{w, xt, dst}).ok());
    return s.run(p, static_cast<int32_t>(m), {dst});
  };
}

TEST(CudaInvariant, MatmulRowsAloneAndInBatches) {
  for (const ops::Precision precision : kPrecisions) {
    auto b = cuda_backend(precision, true);
    ASSERT_NE(b, nullptr);
    std::mt19937_64 rng(41);
    std::vector<std::unique_ptr<WeightHandle>> keep;
    for (const DType type : kWeightTypes) {
      // k: whole super-blocks (the K-quants' tensor-core kernel takes them), and an odd number of 32s.
      for (const int64_t k :
           {int64_t{1024}, dtype_info(type).block_size == 256 ? int64_t{2304} : int64_t{608}}) {
        const BatchFn run = matmul_batches(*b, type, k, rng, keep);
        ASSERT_TRUE(run);
        std::string diff;
        EXPECT_EQ(differing(run, kRows, {2, 7, 9, 16, 33, 64, 200}, {0, 1, 6, 8, 15, 40, 63, 150, 199}, diff),
                  0)
            << dtype_name(type) << " k " << k << " " << precision_name(precision) << ": " << diff;
      }
    }
  }
}

// A residual add, the RMSNorm of its sum (rows of 4096: cut into slices, a cluster a row alone, packed into
// a block among as many rows as multiprocessors), then Q, K and V on the norm's result, their weights
// prepared together as a model's (stacked): the fused kernels of docs/cuda.md's table, each row's outputs
// alone and in batches.
TEST(CudaInvariant, NormAndQkvRowsAloneAndInBatches) {
  constexpr int64_t kEmbd = 4096, kQ = 64, kKv = 32;
  for (const ops::Precision precision : kPrecisions) {
    auto b = cuda_backend(precision, true);
    ASSERT_NE(b, nullptr);
    std::mt19937_64 rng(43);
    const std::vector<float> xa = uniform(static_cast<size_t>(kEmbd * kRows), rng),
                             xb = uniform(static_cast<size_t>(kEmbd * kRows), rng),
                             nw = uniform(static_cast<size_t>(kEmbd), rng);
    for (const DType type : {DType::bf16, DType::f32, DType::q4_0, DType::q8_0, DType::q4_k, DType::q6_k}) {
      std::vector<std::vector<uint8_t>> host;
      std::vector<Tensor> logicals;
      for (const int64_t rows : {kQ, kKv, kKv}) {
        host.push_back(random_rows(type, kEmbd, rows, rng));
        logicals.push_back(make_tensor(type, host.back().data(), kEmbd, rows));
      }
      const std::vector<std::string> names = {"q", "k", "v"};
      auto made =
          b->prepare_weight_group(logicals, names, WeightRole::weight_role_matmul, Backend::ReadDone{});
      ASSERT_TRUE(made.ok()) << made.status().to_string();
      const std::vector<std::unique_ptr<WeightHandle>> w = std::move(made).value();
      const BatchFn run = [&](int64_t first, int64_t m) {
        Step s{*b};
        const Tensor a = s.f32(xa.data() + first * kEmbd, kEmbd, m),
                     bias = s.f32(xb.data() + first * kEmbd, kEmbd, m), sum = s.f32(nullptr, kEmbd, m),
                     h = s.f32(nullptr, kEmbd, m), nwt = s.f32(nw.data(), kEmbd), q = s.f32(nullptr, kQ, m),
                     k = s.f32(nullptr, kKv, m), v = s.f32(nullptr, kKv, m);
        Program p;
        EXPECT_TRUE(p.add(ops::Binary{a, ops::Weight(bias), ops::BinaryKind::binary_kind_add, sum}).ok());
        EXPECT_TRUE(p.add(ops::RmsNorm{sum, ops::Weight(nwt), 1e-6f, false, h}).ok());
        EXPECT_TRUE(p.add(ops::Matmul{w[0]->weight, h, q}).ok());
        EXPECT_TRUE(p.add(ops::Matmul{w[1]->weight, h, k}).ok());
        EXPECT_TRUE(p.add(ops::Matmul{w[2]->weight, h, v}).ok());
        return s.run(p, static_cast<int32_t>(m), {sum, h, q, k, v});
      };
      std::string diff;
      EXPECT_EQ(differing(run, kRows, {2, 9, 64, 200}, {0, 8, 63, 150, 199}, diff), 0)
          << dtype_name(type) << " " << precision_name(precision) << ": " << diff;
    }
  }
}

TEST(CudaInvariant, MoeMatmulTokensAloneAndAmongOthers) {
  constexpr int64_t kK = 1024, kExperts = 8, kUsed = 2, kTokens = 64;
  for (const ops::Precision precision : kPrecisions) {
    auto b = cuda_backend(precision, true);
    ASSERT_NE(b, nullptr);
    std::mt19937_64 rng(47);
    std::uniform_int_distribution<int32_t> expert(0, kExperts - 1);
    for (const DType type :
         {DType::f32, DType::bf16, DType::q4_0, DType::q8_0, DType::q4_k, DType::q6_k, DType::iq4_nl}) {
      const std::vector<uint8_t> host_w = random_rows(type, kK, kOut * kExperts, rng);
      auto made =
          b->prepare_weight(make_tensor(type, const_cast<uint8_t*>(host_w.data()), kK, kOut, kExperts),
                            "experts", WeightRole::weight_role_expert_matmul);
      ASSERT_TRUE(made.ok()) << made.status().to_string();
      const std::unique_ptr<WeightHandle> w = std::move(made).value();
      const std::vector<float> x = uniform(static_cast<size_t>(kK * kTokens), rng);
      std::vector<int32_t> ids(static_cast<size_t>(kUsed * kTokens));
      for (int32_t& e : ids) e = expert(rng);
      const BatchFn run = [&](int64_t first, int64_t m) {
        Step s{*b};
        const Tensor xt = s.f32(x.data() + first * kK, kK, 1, m),
                     it = s.i32(
                         std::vector<int32_t>(ids.begin() + first * kUsed, ids.begin() + (first + m) * kUsed),
                         kUsed, m),
                     dst = s.f32(nullptr, kOut, kUsed, m);
        Program p;
        EXPECT_TRUE(p.add(ops::MoeMatmul{w->weight, xt, it, dst}).ok());
        return s.run(p, static_cast<int32_t>(m), {dst});
      };
      std::string diff;
      EXPECT_EQ(differing(run, kTokens, {2, 9, 33, 64}, {0, 5, 31, 63}, diff), 0)
          << dtype_name(type) << " " << precision_name(precision) << ": " << diff;
    }
  }
}

// ---- Attention ----

constexpr int64_t kHeadDim = 128, kHeads = 8, kKvHeads = 2, kBlock = 16;
constexpr int64_t kDecodes = 64;  // decoding sequences 0 .. 63; sequence 64 takes a prefill chunk
constexpr int64_t kChunk = 48;    // the chunk's tokens, the last of its sequence's positions

// Sequences of various lengths (one long enough for the split-KV kernel's most chunks) in pools of random
// K/V, each sequence its own blocks; a query row for each decode token and each token of the chunk.
struct Sequences {
  std::vector<int64_t> len;                  // positions a sequence holds, its step's tokens' included
  std::vector<std::vector<int32_t>> blocks;  // its block table
  int64_t n_blocks = 0;
  std::vector<float> k, v;  // [head_dim, n_kv, block, n_blocks]
  std::vector<float> q_decode, q_chunk;

  explicit Sequences(std::mt19937_64& rng) {
    for (int64_t s = 0; s < kDecodes; ++s) len.push_back(s == 0 ? 5000 : 1 + (s * 97) % 1500);
    len.push_back(300 + kChunk);
    for (const int64_t l : len) {
      std::vector<int32_t> table;
      for (int64_t i = 0; i < (l + kBlock - 1) / kBlock; ++i)
        table.push_back(static_cast<int32_t>(n_blocks++));
      blocks.push_back(std::move(table));
    }
    const auto pool = static_cast<size_t>(kHeadDim * kKvHeads * kBlock * n_blocks);
    k = uniform(pool, rng);
    v = uniform(pool, rng);
    q_decode = uniform(static_cast<size_t>(kHeadDim * kHeads * kDecodes), rng);
    q_chunk = uniform(static_cast<size_t>(kHeadDim * kHeads * kChunk), rng);
  }
};

// A token of a step: its sequence, and its index in the chunk (-1: the sequence's decode token).
struct Token {
  int64_t seq;
  int64_t chunk_index;
};

// The K/V pools of `seqs` on a backend, f32, f16 or q8_0, uploaded once.
struct Pools {
  std::unique_ptr<Buffer> kb, vb;
  Tensor k, v;
  Pools(Backend& b, DType type, const Sequences& seqs) {
    const auto upload = [&](const std::vector<float>& values, std::unique_ptr<Buffer>& buf) {
      const auto n = static_cast<int64_t>(values.size());
      const auto bytes = static_cast<size_t>(dtype_row_bytes(type, n).value());
      buf = b.allocate(bytes).value();
      const Tensor t = make_tensor(type, *buf, 0, kHeadDim, kKvHeads, kBlock, seqs.n_blocks);
      if (type == DType::f32) {
        EXPECT_TRUE(b.upload(t, values.data(), bytes).ok());
      } else {
        std::vector<uint8_t> packed(bytes);
        dtype_info(type).quantize_row(values.data(), packed.data(), n);
        EXPECT_TRUE(b.upload(t, packed.data(), bytes).ok());
      }
      return t;
    };
    k = upload(seqs.k, kb);
    v = upload(seqs.v, vb);
  }
};

// The attention of `tokens` (one step) over `pools`, holding `seqs`' K/V; dst rows as tokens.
std::vector<float> attention_step(Backend& b, const Pools& pools, const Sequences& seqs,
                                  const std::vector<Token>& tokens) {
  Step s{b};
  const auto n = static_cast<int64_t>(tokens.size());
  std::vector<float> q;
  std::vector<int32_t> positions, seq, indptr = {0}, indices;
  std::vector<int64_t> step_seq(seqs.len.size(), -1);  // a sequence's index in the step's block tables
  for (const Token& t : tokens) {
    const float* from = t.chunk_index < 0
                            ? &seqs.q_decode[static_cast<size_t>(t.seq * kHeadDim * kHeads)]
                            : &seqs.q_chunk[static_cast<size_t>(t.chunk_index * kHeadDim * kHeads)];
    q.insert(q.end(), from, from + kHeadDim * kHeads);
    const int64_t l = seqs.len[static_cast<size_t>(t.seq)];
    positions.push_back(static_cast<int32_t>(t.chunk_index < 0 ? l - 1 : l - kChunk + t.chunk_index));
    int64_t& at = step_seq[static_cast<size_t>(t.seq)];
    if (at < 0) {
      at = static_cast<int64_t>(indptr.size()) - 1;
      const auto& table = seqs.blocks[static_cast<size_t>(t.seq)];
      indices.insert(indices.end(), table.begin(), table.end());
      indptr.push_back(static_cast<int32_t>(indices.size()));
    }
    seq.push_back(static_cast<int32_t>(at));
  }
  ops::Attention a;
  a.q = s.f32(q.data(), kHeadDim, kHeads, n);
  a.k_pool = pools.k;
  a.v_pool = pools.v;
  a.positions = s.i32(positions, n);
  a.seq = s.i32(seq, n);
  a.bt_indptr = s.i32(indptr, static_cast<int64_t>(indptr.size()));
  a.bt_indices = s.i32(indices, static_cast<int64_t>(indices.size()));
  a.scale = 1.0f / 11.3137085f;  // 1 / sqrt(head_dim)
  a.dst = s.f32(nullptr, kHeadDim, kHeads, n);
  Program p;
  EXPECT_TRUE(p.add(a).ok());
  return s.run(p, static_cast<int32_t>(n), {a.dst}).front();
}

// Token i's dst row of a step's result.
std::vector<float> token_row(const std::vector<float>& dst, int64_t i) {
  const auto len = static_cast<size_t>(kHeadDim * kHeads);
  return {dst.begin() + static_cast<std::ptrdiff_t>(i * len),
          dst.begin() + static_cast<std::ptrdiff_t>((i + 1) * len)};
}

// Of the decode tokens and the chunk's, the number whose bits differ between their steps alone (a decode
// token a step; the chunk a step) and the steps that mix them: 64 decodes; the same in reverse order; 32
// decodes, the chunk, the 32 others.
int attention_differing(Backend& b, DType pool_type, const Sequences& seqs, std::string& first_diff) {
  const Pools pool(b, pool_type, seqs);
  std::vector<Token> decodes, reversed, mixed, chunk;
  for (int64_t s = 0; s < kDecodes; ++s) decodes.push_back({s, -1});
  reversed.assign(decodes.rbegin(), decodes.rend());
  for (int64_t i = 0; i < kChunk; ++i) chunk.push_back({kDecodes, i});
  mixed.assign(decodes.begin(), decodes.begin() + kDecodes / 2);
  mixed.insert(mixed.end(), chunk.begin(), chunk.end());
  mixed.insert(mixed.end(), decodes.begin() + kDecodes / 2, decodes.end());
  const std::vector<float> chunk_alone = attention_step(b, pool, seqs, chunk);
  // Each token's row alone: the decode tokens' of their own steps (a few of them), the chunk's of its step.
  std::vector<std::pair<Token, std::vector<float>>> alone;
  for (const int64_t s : {0, 1, 2, 17, 31, 32, 50, 63})
    alone.push_back({{s, -1}, attention_step(b, pool, seqs, {{s, -1}})});
  for (int64_t i = 0; i < kChunk; ++i) alone.push_back({{kDecodes, i}, token_row(chunk_alone, i)});
  int n = 0;
  for (const auto& [name, step] : {std::pair<const char*, const std::vector<Token>*>{"64 decodes", &decodes},
                                   {"64 decodes reversed", &reversed},
                                   {"decodes and the chunk", &mixed}}) {
    const std::vector<float> got = attention_step(b, pool, seqs, *step);
    for (const auto& [token, row] : alone) {
      for (size_t i = 0; i < step->size(); ++i) {
        const Token& t = (*step)[i];
        if (t.seq != token.seq || t.chunk_index != token.chunk_index) continue;
        const std::vector<float> in_step = token_row(got, static_cast<int64_t>(i));
        if (std::memcmp(in_step.data(), row.data(), row.size() * 4) != 0) {
          if (n++ == 0) {
            first_diff = fmt::format("sequence {}'s {} alone and at {} of the step of {}", token.seq,
                                     token.chunk_index < 0 ? std::string("decode token")
                                                           : fmt::format("chunk token {}", token.chunk_index),
                                     i, name);
          }
        }
      }
    }
  }
  return n;
}

TEST(CudaInvariant, AttentionTokensAloneAndAmongOthers) {
  std::mt19937_64 rng(53);
  const Sequences seqs(rng);
  for (const ops::Precision precision : kPrecisions) {
    auto b = cuda_backend(precision, true);
    ASSERT_NE(b, nullptr);
    for (const DType pool : {DType::f16, DType::f32, DType::q8_0}) {
      std::string diff;
      EXPECT_EQ(attention_differing(*b, pool, seqs, diff), 0)
          << dtype_name(pool) << " pools " << precision_name(precision) << ": " << diff;
    }
  }
}

// Without the mode the comparisons above have teeth: at the fast precision a prefill chunk alone takes the
// tensor-core prefill kernel and among 64 decodes the split-KV kernel; a bf16 matmul of one row the exact
// GEMV and of 200 rows cuBLAS on x rounded to bf16.
TEST(CudaInvariant, WithoutTheModeTheKernelChangesWithTheBatch) {
  auto b = cuda_backend(ops::Precision::precision_fast, false);
  ASSERT_NE(b, nullptr);
  std::mt19937_64 rng(53);
  const Sequences seqs(rng);
  std::string diff;
  EXPECT_GT(attention_differing(*b, DType::f16, seqs, diff), 0);
  std::vector<std::unique_ptr<WeightHandle>> keep;
  const BatchFn run = matmul_batches(*b, DType::bf16, 1024, rng, keep);
  ASSERT_TRUE(run);
  EXPECT_GT(differing(run, kRows, {200}, {0, 199}, diff), 0);
}

}  // namespace
}  // namespace kiln
