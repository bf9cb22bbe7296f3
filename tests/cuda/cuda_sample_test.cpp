// ops::Sample on CUDA (backends/cuda/sampling/sample.cu): the token of every row as the scalar reference
// draws it (ops::sample_row_reference) over many parameter sets, vocabularies and kinds of logits; the error
// codes; the draws' distribution against the filtered distribution computed here from the contract (a
// chi-square test, and the same test failing against a boundary moved by one token); a row's result alone
// and among others; rows with a mask of allowed tokens among rows without.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "../ops/sample_stats.h"
#include "backends/backend.h"
#include "ops/sample.h"

namespace kiln {
namespace {

using ops::SampleAdjust;
using ops::SampleRow;
using sample_stats::chi_square;
using sample_stats::ChiSquare;
using sample_stats::filtered;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int64_t kOutWords = 2 + 2 * ops::kSampleMaxTop;

// One Sample call: rows of n logits, `stride` floats apart (stride >= n: a narrower view).
struct Call {
  int64_t n = 0, stride = 0;
  std::vector<float> x;  // [stride * rows]
  std::vector<SampleRow> rows;
  std::vector<SampleAdjust> adjust;
  std::vector<uint32_t> masks;  // [words(), n_masks]: a row's when its mask_row >= 0
  int64_t words() const { return (n + 31) / 32; }
  std::span<const float> row_x(size_t r) const { return {x.data() + r * stride, static_cast<size_t>(n)}; }
  std::span<const uint32_t> row_mask(size_t r) const {
    if (rows[r].mask_row < 0) return {};
    return {masks.data() + words() * rows[r].mask_row, static_cast<size_t>(words())};
  }
  std::span<const SampleAdjust> row_adjust(size_t r) const {
    const SampleRow& p = rows[r];
    return {adjust.data() + p.adjust_begin, static_cast<size_t>(p.adjust_count)};
  }
};

size_t up16(size_t v) { return (v + 15) / 16 * 16; }

// The op's out rows (kOutWords each; words it does not write keep a sentinel).
std::vector<int32_t> run_sample(Backend& b, const Call& c) {
  const size_t n_rows = c.rows.size(), n_adj = std::max<size_t>(c.adjust.size(), 1);
  const size_t x_at = 0, r_at = up16(x_at + c.x.size() * 4), a_at = up16(r_at + n_rows * sizeof(SampleRow)),
               m_at = up16(a_at + n_adj * sizeof(SampleAdjust)), o_at = up16(m_at + c.masks.size() * 4),
               total = o_at + n_rows * kOutWords * 4;
  std::vector<uint8_t> host(total, 0);
  std::memcpy(host.data() + x_at, c.x.data(), c.x.size() * 4);
  std::memcpy(host.data() + r_at, c.rows.data(), n_rows * sizeof(SampleRow));
  if (!c.adjust.empty())
    std::memcpy(host.data() + a_at, c.adjust.data(), c.adjust.size() * sizeof(SampleAdjust));
  if (!c.masks.empty()) std::memcpy(host.data() + m_at, c.masks.data(), c.masks.size() * 4);
  std::fill(host.begin() + static_cast<ptrdiff_t>(o_at), host.end(), uint8_t{0x7E});
  auto buf = b.allocate(total).value();
  EXPECT_TRUE(
      b.upload(make_tensor(DType::i8, *buf, 0, static_cast<int64_t>(total)), host.data(), total).ok());
  Tensor xt = make_tensor(DType::f32, *buf, x_at, c.stride, static_cast<int64_t>(n_rows));
  xt.ne[0] = c.n;  // a view of the first n of each row
  const auto rows = static_cast<int64_t>(n_rows);
  const ops::Sample op{xt, make_tensor(DType::i32, *buf, r_at, 16, rows),
                       make_tensor(DType::i32, *buf, a_at, 4, static_cast<int64_t>(n_adj)),
                       make_tensor(DType::i32, *buf, o_at, kOutWords, rows),
                       c.masks.empty() ? Tensor{}
                                       : make_tensor(DType::i32, *buf, m_at, c.words(),
                                                     static_cast<int64_t>(c.masks.size()) / c.words())};
  Program p;
  EXPECT_TRUE(p.add(op).ok());
  p.n_tokens = static_cast<int32_t>(std::min<int64_t>(rows, 1 << 30));
  EXPECT_TRUE(b.run(p).ok());
  std::vector<int32_t> out(n_rows * kOutWords);
  EXPECT_TRUE(b.download(out.data(), make_tensor(DType::i8, *buf, o_at, static_cast<int64_t>(out.size() * 4)),
                         out.size() * 4)
                  .ok());
  EXPECT_TRUE(b.synchronize().ok());
  return out;
}

std::unique_ptr<Backend> cuda() {
  auto made = make_backend("cuda");
  EXPECT_TRUE(made.ok()) << made.status().to_string();
  return made.ok() ? std::move(*made) : nullptr;
}

// Every row of the call against the reference: token, logprob (1e-4) and the top pairs.
void expect_reference(Backend& b, const Call& c, const std::string& what) {
  const std::vector<int32_t> out = run_sample(b, c);
  int mismatches = 0;
  for (size_t r = 0; r < c.rows.size(); ++r) {
    const ops::SampleOut want =
        ops::sample_row_reference(c.row_x(r), c.rows[r], c.row_adjust(r), c.row_mask(r));
    const int32_t* o = out.data() + r * kOutWords;
    const bool ok_token = o[0] == want.token;
    mismatches += ok_token ? 0 : 1;
    EXPECT_TRUE(ok_token) << what << ", row " << r << ": token " << o[0] << ", reference " << want.token;
    if (!ok_token) continue;
    EXPECT_NEAR(std::bit_cast<float>(o[1]), want.logprob, 1e-4) << what << ", row " << r;
    for (int32_t j = 0; j < want.n_top; ++j) {
      EXPECT_EQ(o[2 + 2 * j], want.top_id[j]) << what << ", row " << r << ", top " << j;
      EXPECT_NEAR(std::bit_cast<float>(o[3 + 2 * j]), want.top_logprob[j], 1e-4) << what << ", row " << r;
    }
    if (want.n_top < ops::kSampleMaxTop) {
      EXPECT_EQ(o[2 + 2 * want.n_top], 0x7E7E7E7E) << what << ", row " << r;  // nothing past the row's n_top
    }
  }
  EXPECT_EQ(mismatches, 0) << what;
}

enum class Logits { continuous, quarters, bf16 };

float round_bf16(float v) {
  uint32_t b = std::bit_cast<uint32_t>(v);
  b = (b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u;
  return std::bit_cast<float>(b);
}

// A row of n logits: normal with a few outliers above, some -inf; ties where asked.
void fill_row(float* x, int64_t n, Logits kind, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 2.5f);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  for (int64_t i = 0; i < n; ++i) {
    float v = normal(rng);
    if (uni(rng) < 0.002f) v += 8.0f;
    if (kind == Logits::quarters) v = std::round(v * 4.0f) / 4.0f;
    if (kind == Logits::bf16) v = round_bf16(v);
    if (uni(rng) < 0.01f) v = -kInf;
    x[i] = v;
  }
}

// The parameter sets of the agreement test (seed and counter set per row).
std::vector<SampleRow> param_sets() {
  std::vector<SampleRow> s;
  const auto add = [&](float t, int32_t k, float top_p, float min_p, int32_t n_top, int32_t logprobs) {
    SampleRow p;
    p.temperature = t, p.top_k = k, p.top_p = top_p, p.min_p = min_p, p.n_top = n_top, p.logprobs = logprobs;
    s.push_back(p);
  };
  add(0.0f, 0, 1.0f, 0.0f, 0, 0);  // greedy
  add(0.0f, 0, 1.0f, 0.0f, 5, 1);  // greedy, reported
  add(1.0f, 0, 1.0f, 0.0f, 0, 0);  // temperature alone
  add(0.7f, 0, 1.0f, 0.0f, 0, 1);
  add(1.5f, 0, 1.0f, 0.0f, 1, 0);
  add(0.8f, 1, 1.0f, 0.0f, 0, 0);        // top-k 1
  add(0.8f, 40, 1.0f, 0.0f, 20, 1);      // top-k
  add(1.0f, 3000, 1.0f, 0.0f, 0, 0);     // top-k past the list's room
  add(1.0f, 1 << 30, 1.0f, 0.0f, 0, 0);  // top-k >= n
  add(0.9f, 0, 0.95f, 0.0f, 0, 0);       // top-p
  add(1.0f, 0, 1e-6f, 0.0f, 0, 0);       // tiny top-p: the best token
  add(1.2f, 0, 0.5f, 0.0f, 5, 1);
  add(1.0f, 0, 1.0f, 0.05f, 0, 0);  // min-p
  add(2.0f, 0, 1.0f, 0.001f, 0, 1);
  add(0.8f, 50, 0.9f, 0.02f, 20, 1);  // all together
  add(1.3f, 5000, 0.99f, 0.0001f, 1, 0);
  add(5.0f, 0, 0.999f, 0.0f, 0, 0);  // flat: the draw deep in the vocabulary
  return s;
}

// The agreement test's call: `per_set` rows a parameter set, each row's logits new; with adjust entries
// (penalties, logit bias, bans) on every other row, some rows with many entries; a mask on every third row
// (one token in ten allowed, nine in ten, one token, none), the mask rows in reverse order.
Call agreement_call(int64_t n, int64_t stride, Logits kind, int per_set, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Call c;
  c.n = n, c.stride = stride;
  const std::vector<SampleRow> sets = param_sets();
  std::uniform_int_distribution<uint32_t> any;
  for (const SampleRow& base : sets) {
    for (int k = 0; k < per_set; ++k) {
      SampleRow p = base;
      p.seed_lo = any(rng), p.seed_hi = any(rng), p.counter = any(rng) % 1000;
      if ((c.rows.size() & 1) != 0) {
        p.repeat_penalty = 1.1f + 0.2f * static_cast<float>(k % 3);
        p.presence_penalty = 0.3f, p.frequency_penalty = 0.1f;
        // Every other such row has more entries than the kernel holds in shared memory.
        const int64_t n_entries = std::min<int64_t>(n / 4, (c.rows.size() / 2) % 2 == 1 ? 1500 : 40);
        std::vector<int32_t> ids(static_cast<size_t>(n));
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), rng);
        ids.resize(static_cast<size_t>(n_entries));
        std::sort(ids.begin(), ids.end());
        p.adjust_begin = static_cast<int32_t>(c.adjust.size());
        p.adjust_count = static_cast<int32_t>(n_entries);
        for (const int32_t id : ids) {
          SampleAdjust e;
          e.id = id;
          e.count = static_cast<int32_t>(any(rng) % 4);
          e.bias = any(rng) % 5 == 0 ? static_cast<float>(static_cast<int>(any(rng) % 9) - 4) : 0.0f;
          e.banned = any(rng) % 10 == 0 ? 1 : 0;
          c.adjust.push_back(e);
        }
      }
      if (c.rows.size() % 3 == 2) {
        const size_t mask_kind = (c.rows.size() / 3) % 4;
        const int64_t one = static_cast<int64_t>(any(rng) % static_cast<uint32_t>(n));
        std::vector<uint32_t> m(static_cast<size_t>(c.words()), 0u);
        for (int64_t id = 0; id < n; ++id) {
          const bool allowed = mask_kind == 0   ? any(rng) % 10 == 0
                               : mask_kind == 1 ? any(rng) % 10 != 0
                                                : mask_kind == 2 && id == one;
          if (allowed) m[static_cast<size_t>(id / 32)] |= 1u << (id % 32);
        }
        c.masks.insert(c.masks.begin(), m.begin(), m.end());
        p.mask_row = 0;
        for (SampleRow& q : c.rows) q.mask_row += q.mask_row >= 0 ? 1 : 0;
      }
      c.rows.push_back(p);
    }
  }
  c.x.assign(static_cast<size_t>(stride) * c.rows.size(), 0.0f);
  for (size_t r = 0; r < c.rows.size(); ++r) fill_row(c.x.data() + r * stride, n, kind, rng);
  return c;
}

TEST(CudaSample, AgreesWithTheReference) {
  auto b = cuda();
  ASSERT_NE(b, nullptr);
  struct Shape {
    int64_t n, stride;
    int per_set;
  };
  for (const Shape s : {Shape{1000, 1000, 6}, Shape{49152, 49152, 3}, Shape{49152, 49160, 2},
                        Shape{151936, 151936, 2}, Shape{151936, 152000, 1}}) {
    for (const Logits kind : {Logits::continuous, Logits::quarters, Logits::bf16}) {
      const Call c = agreement_call(s.n, s.stride, kind, s.per_set, 1000 * s.n + static_cast<int>(kind));
      expect_reference(*b, c,
                       "n = " + std::to_string(s.n) + ", stride " + std::to_string(s.stride) +
                           ", logits kind " + std::to_string(static_cast<int>(kind)));
    }
  }
}

TEST(CudaSample, ErrorCodes) {
  auto b = cuda();
  ASSERT_NE(b, nullptr);
  Call c;
  c.n = c.stride = 300;
  std::mt19937_64 rng(5);
  const auto row = [&](SampleRow p, const std::vector<SampleAdjust>& adj, auto edit) {
    std::vector<float> x(static_cast<size_t>(c.n));
    fill_row(x.data(), c.n, Logits::continuous, rng);
    edit(x);
    p.adjust_begin = static_cast<int32_t>(c.adjust.size());
    p.adjust_count = static_cast<int32_t>(adj.size());
    c.adjust.insert(c.adjust.end(), adj.begin(), adj.end());
    c.rows.push_back(p);
    c.x.insert(c.x.end(), x.begin(), x.end());
  };
  SampleRow hot;
  hot.temperature = 1.0f, hot.logprobs = 1, hot.n_top = 3;
  const auto none = [](std::vector<float>&) {};
  std::vector<SampleAdjust> banned_all;
  for (int32_t i = 0; i < 300; ++i) banned_all.push_back({i, 0.0f, 0, 1});
  for (const SampleRow p : {SampleRow{}, hot}) {
    row(p, {}, [](std::vector<float>& x) { x[17] = std::numeric_limits<float>::quiet_NaN(); });
    row(p, {}, [](std::vector<float>& x) { x[299] = kInf; });
    row(p, {}, [](std::vector<float>& x) { std::fill(x.begin(), x.end(), -kInf); });
    row(p, {{5, 3e38f, 0, 0}}, [](std::vector<float>& x) { x[5] = 3e38f; });  // bias overflows to +inf
    row(p, banned_all, none);                                                 // everything banned
    row(p, {{7, -kInf, 0, 0}}, [](std::vector<float>& x) {                    // -inf bias on the one finite
      std::fill(x.begin(), x.end(), -kInf);
      x[7] = 1.0f;
    });
    row(p, {}, none);  // a good row among them
  }
  const std::vector<int32_t> want_codes = {ops::kSampleBadLogits, ops::kSampleBadLogits,
                                           ops::kSampleBadLogits, ops::kSampleBadAdjusted,
                                           ops::kSampleAllMasked, ops::kSampleAllMasked};
  const std::vector<int32_t> out = run_sample(*b, c);
  for (size_t r = 0; r < c.rows.size(); ++r) {
    const int32_t* o = out.data() + r * kOutWords;
    const size_t k = r % 7;
    if (k < want_codes.size()) {
      EXPECT_EQ(o[0], want_codes[k]) << "row " << r;
      EXPECT_EQ(o[1], 0) << "row " << r;
      EXPECT_EQ(o[2], 0x7E7E7E7E) << "row " << r;
    } else {
      EXPECT_GE(o[0], 0) << "row " << r;
    }
    EXPECT_EQ(o[0], ops::sample_row_reference(c.row_x(r), c.rows[r], c.row_adjust(r), c.row_mask(r)).token)
        << "row " << r;
  }
}

TEST(CudaSample, DrawsFollowTheFilteredDistribution) {
  auto b = cuda();
  ASSERT_NE(b, nullptr);
  constexpr int64_t kN = 256, kDraws = 100000;
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(kN);
  for (float& v : x) v = normal(rng);
  std::vector<SampleAdjust> penalties;
  for (int32_t i = 0; i < kN; i += 7) {
    penalties.push_back({i, i % 3 == 0 ? 0.5f : 0.0f, 1 + i % 4, i % 5 == 0 ? 1 : 0});
  }
  struct Case {
    const char* name;
    SampleRow p;
    bool adjust;
    SampleRow alt;  // for the cases without a boundary to move: another distribution to reject
  };
  const auto row = [](float t, int32_t k, float top_p, float min_p) {
    SampleRow p;
    p.temperature = t, p.top_k = k, p.top_p = top_p, p.min_p = min_p;
    return p;
  };
  SampleRow pen = row(0.9f, 0, 1.0f, 0.0f);
  pen.repeat_penalty = 1.3f, pen.presence_penalty = 0.4f, pen.frequency_penalty = 0.2f;
  const std::vector<Case> cases = {
      {"temperature", row(0.7f, 0, 1.0f, 0.0f), false, row(0.75f, 0, 1.0f, 0.0f)},
      {"top-k", row(1.0f, 20, 1.0f, 0.0f), false, {}},
      {"top-p", row(1.0f, 0, 0.6f, 0.0f), false, {}},
      {"min-p", row(1.0f, 0, 1.0f, 0.3f), false, {}},
      {"top-k, top-p, min-p", row(0.8f, 60, 0.8f, 0.05f), false, {}},
      {"penalties", pen, true, row(0.9f, 0, 1.0f, 0.0f)},
  };
  for (const Case& cs : cases) {
    Call c;
    c.n = c.stride = kN;
    if (cs.adjust) c.adjust = penalties;
    c.x.reserve(static_cast<size_t>(kN * kDraws));
    for (int64_t d = 0; d < kDraws; ++d) {
      SampleRow p = cs.p;
      p.seed_lo = 0x1234567u, p.seed_hi = 89u, p.counter = static_cast<uint32_t>(d);
      p.adjust_count = cs.adjust ? static_cast<int32_t>(penalties.size()) : 0;
      c.rows.push_back(p);
      c.x.insert(c.x.end(), x.begin(), x.end());
    }
    const std::vector<int32_t> out = run_sample(*b, c);
    std::vector<int64_t> counts(kN, 0);
    for (int64_t d = 0; d < kDraws; ++d) {
      const int32_t t = out[static_cast<size_t>(d * kOutWords)];
      ASSERT_TRUE(t >= 0 && t < kN) << cs.name << ": token " << t;
      ++counts[static_cast<size_t>(t)];
    }
    const std::vector<SampleAdjust> adj = cs.adjust ? penalties : std::vector<SampleAdjust>{};
    const ChiSquare fit = chi_square(counts, filtered(x, cs.p, adj, 0), kDraws);
    EXPECT_LT(fit.stat, fit.limit) << cs.name;
    const bool boundary = cs.p.top_k > 0 || cs.p.top_p < 1.0f || cs.p.min_p > 0.0f;
    if (boundary) {
      for (const int shift : {-1, 1}) {
        const ChiSquare moved = chi_square(counts, filtered(x, cs.p, adj, shift), kDraws);
        EXPECT_GT(moved.stat, moved.limit) << cs.name << ", boundary moved by " << shift;
      }
    } else {
      const ChiSquare other = chi_square(counts, filtered(x, cs.alt, {}, 0), kDraws);
      EXPECT_GT(other.stat, other.limit) << cs.name << ", against another distribution";
    }
  }
}

TEST(CudaSample, ARowAloneAndAmongOthersGetsTheSameWords) {
  auto b = cuda();
  ASSERT_NE(b, nullptr);
  // 64 rows: the agreement test's parameter sets over several kinds of logits.
  Call many = agreement_call(49152, 49152, Logits::quarters, 4, 77);
  many.rows.resize(64);
  many.x.resize(static_cast<size_t>(many.stride) * 64);
  for (size_t r = 0; r < 64; ++r) many.rows[r].n_top = static_cast<int32_t>(r % 21);
  const std::vector<int32_t> all = run_sample(*b, many);
  for (size_t r = 0; r < 64; ++r) {
    Call one;
    one.n = one.stride = many.n;
    const std::span<const float> xr = many.row_x(r);
    one.x.assign(xr.begin(), xr.end());
    SampleRow p = many.rows[r];
    const std::span<const SampleAdjust> adj = many.row_adjust(r);
    one.adjust.assign(adj.begin(), adj.end());
    p.adjust_begin = 0;
    const std::span<const uint32_t> mask = many.row_mask(r);
    one.masks.assign(mask.begin(), mask.end());
    if (p.mask_row >= 0) p.mask_row = 0;
    one.rows.push_back(p);
    const std::vector<int32_t> alone = run_sample(*b, one);
    EXPECT_TRUE(std::equal(alone.begin(), alone.end(), all.begin() + static_cast<ptrdiff_t>(r * kOutWords)))
        << "row " << r;
  }
}

}  // namespace
}  // namespace kiln
