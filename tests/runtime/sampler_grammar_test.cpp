// A constrained Sampler (set_grammar) on a small vocabulary: the host path (sample) and the op path
// (next_row + fill_mask + the CPU backend's ops::Sample + take) draw the same tokens as the scalar reference
// given the matcher's mask; greedy takes the best allowed token, not the argmax; the text drawn is a sentence
// of the grammar; a mask that leaves nothing is an error naming the grammar; a token the grammar does not
// allow is an internal error.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "runtime/sampler/sampler.h"

namespace kiln {
namespace {

// Digits, a dash, letters, a few pieces of two characters, and the end token (last).
struct Vocab {
  std::vector<std::string> pieces;
  std::shared_ptr<const grammar::Vocabulary> vocab;
  int32_t end = 0;
  int32_t n() const { return static_cast<int32_t>(pieces.size()); }
};

Vocab make_vocab() {
  Vocab v;
  for (char c = '0'; c <= '9'; ++c) v.pieces.emplace_back(1, c);
  for (char c = 'a'; c <= 'z'; ++c) v.pieces.emplace_back(1, c);
  for (const char* s : {"-", "12", "3-", "ab", "-x", "zz", " ", "A"}) v.pieces.emplace_back(s);
  v.end = v.n();
  v.pieces.emplace_back("");
  auto g = std::make_shared<grammar::Vocabulary>();
  g->bytes = v.pieces;
  g->excluded.assign(v.pieces.size(), 0);
  g->excluded[static_cast<size_t>(v.end)] = 1;
  g->end_ids = {v.end};
  v.vocab = g;
  return v;
}

constexpr const char* kGrammar = R"(root ::= [0-9] [0-9] [0-9] "-" [a-z] [a-z] [a-z]?)";

std::shared_ptr<const grammar::CompiledGrammar> compiled(const Vocab& v, const char* text = kGrammar) {
  auto g = grammar::parse_gbnf(text);
  EXPECT_TRUE(g.ok()) << g.status().message();
  auto c = grammar::compile(*g, v.vocab);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return *c;
}

Sampler constrained_sampler(const Vocab& v, SamplingParams p) {
  Sampler s(std::move(p), v.n());
  s.set_end_tokens(std::vector<int32_t>{v.end});
  s.set_grammar(compiled(v));
  return s;
}

std::vector<float> logits(int32_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& f : x) f = d(rng);
  return x;
}

bool allows(const std::vector<uint32_t>& m, int32_t id) {
  return (m[static_cast<size_t>(id) / 32] >> (id % 32)) & 1u;
}

// One draw through ops::Sample on `b` (host memory operands): the row, its adjust entries and its mask.
ops::SampleOut op_draw(Backend& b, Sampler& s, std::span<const float> x, std::span<const int32_t> history,
                       std::vector<uint32_t>& mask_out) {
  ops::SampleRow row;
  std::vector<ops::SampleAdjust> adjust;
  EXPECT_TRUE(s.next_row(history, row, adjust, /*mask_row=*/0).ok());
  EXPECT_EQ(row.mask_row, 0);
  mask_out.assign(grammar::mask_words(s.n_vocab()), 0u);
  s.fill_mask(mask_out);
  std::vector<int32_t> rows_w(16), adjust_w(4 * std::max<size_t>(adjust.size(), 1)), out_w(2 + 2 * 20);
  std::memcpy(rows_w.data(), &row, sizeof(row));
  std::memcpy(adjust_w.data(), adjust.data(), adjust.size() * sizeof(ops::SampleAdjust));
  const auto n = static_cast<int64_t>(x.size());
  ops::Sample op{make_tensor(DType::f32, const_cast<float*>(x.data()), n),
                 make_tensor(DType::i32, rows_w.data(), 16, 1),
                 make_tensor(DType::i32, adjust_w.data(), 4, static_cast<int64_t>(adjust_w.size() / 4)),
                 make_tensor(DType::i32, out_w.data(), 2 + 2 * 20, 1),
                 make_tensor(DType::i32, mask_out.data(), static_cast<int64_t>(mask_out.size()), 1)};
  EXPECT_TRUE(b.run(op).ok());
  ops::SampleOut o;
  o.token = out_w[0];
  o.logprob = std::bit_cast<float>(out_w[1]);
  o.n_top = row.n_top;
  for (int32_t j = 0; j < o.n_top; ++j) {
    o.top_id[j] = out_w[static_cast<size_t>(2 + 2 * j)];
    o.top_logprob[j] = std::bit_cast<float>(out_w[static_cast<size_t>(3 + 2 * j)]);
  }
  // The reference, given the same row and mask.
  const ops::SampleOut want = ops::sample_row_reference(x, row, adjust, mask_out);
  EXPECT_EQ(o.token, want.token);
  EXPECT_NEAR(o.logprob, want.logprob, 1e-5f);
  return o;
}

TEST(SamplerGrammar, HostAndOpPathsDrawTheReferenceTokensInsideTheGrammar) {
  const Vocab v = make_vocab();
  auto cpu = make_backend("cpu");
  ASSERT_TRUE(cpu.ok()) << cpu.status().message();
  for (const float t : {0.0f, 0.7f, 1.5f}) {
    for (uint64_t seed = 1; seed <= 12; ++seed) {
      SamplingParams p;
      p.temperature = t, p.top_k = seed % 3 == 0 ? 5 : 0, p.top_p = seed % 2 == 0 ? 0.9f : 1.0f;
      p.seed = seed, p.logprobs = true, p.n_logprobs = 3;
      p.repeat_penalty = t == 0.0f ? 1.0f : 1.3f, p.repeat_last_n = 8;  // greedy: the raw best below
      Sampler host = constrained_sampler(v, p), op = constrained_sampler(v, p);
      EXPECT_FALSE(host.plain_greedy());
      std::mt19937_64 rng(seed * 31 + static_cast<uint64_t>(t * 10));
      std::vector<int32_t> history = {3, 1, 4};
      std::string text;
      for (int step = 0; step < 12 && !host.grammar_done(); ++step) {
        const std::vector<float> x = logits(v.n(), rng);
        std::vector<uint32_t> mask;
        const ops::SampleOut drawn = op_draw(**cpu, op, x, history, mask);
        Result<SampleResult> a = host.sample(x, history);
        Result<SampleResult> b = op.take(drawn);
        ASSERT_TRUE(a.ok()) << a.status().message();
        ASSERT_TRUE(b.ok()) << b.status().message();
        ASSERT_EQ(a->token, b->token) << "t " << t << " seed " << seed << " step " << step;
        EXPECT_TRUE(allows(mask, a->token));
        // The logprobs are those of the raw logits, mask or not.
        const Result<SampleResult> raw = score_token(x, a->token, 3);
        EXPECT_NEAR(a->logprob, raw->logprob, 1e-5f);
        ASSERT_EQ(a->top.size(), 3u);
        EXPECT_EQ(a->top[0].token, raw->top[0].token);
        if (t == 0.0f) {  // greedy: the best allowed token
          int32_t best = -1;
          for (int32_t id = 0; id < v.n(); ++id) {
            if (allows(mask, id) && (best < 0 || x[static_cast<size_t>(id)] > x[static_cast<size_t>(best)]))
              best = id;
          }
          EXPECT_EQ(a->token, best);
        }
        if (a->token != v.end) text += v.pieces[static_cast<size_t>(a->token)];
        history.push_back(a->token);
        EXPECT_EQ(host.grammar_done(), op.grammar_done());
      }
      ASSERT_TRUE(host.grammar_done()) << text;
      // ddd-ll or ddd-lll (an end token drawn after the two letters, or the third letter).
      ASSERT_TRUE(text.size() == 6 || text.size() == 7) << text;
      for (size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        EXPECT_TRUE(i < 3 ? c >= '0' && c <= '9' : i == 3 ? c == '-' : c >= 'a' && c <= 'z') << text;
      }
    }
  }
}

TEST(SamplerGrammar, AMaskThatLeavesNothingIsAnError) {
  const Vocab v = make_vocab();
  SamplingParams p;
  p.temperature = 0.0f;
  // The grammar allows digits first (and "12"); logit_bias bans them all.
  for (int32_t id = 0; id < 10; ++id) p.logit_bias.emplace_back(id, -std::numeric_limits<float>::infinity());
  p.logit_bias.emplace_back(36 + 1, -std::numeric_limits<float>::infinity());  // "12"
  Sampler s = constrained_sampler(v, p);
  std::mt19937_64 rng(3);
  const Result<SampleResult> r = s.sample(logits(v.n(), rng), std::vector<int32_t>{1});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("grammar"), std::string::npos) << r.status().message();
  // The op path's code reads the same.
  Result<SampleResult> t = s.take(ops::SampleOut{ops::kSampleAllMasked});
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("grammar"), std::string::npos) << t.status().message();
}

TEST(SamplerGrammar, ATokenTheGrammarRefusesIsAnInternalError) {
  const Vocab v = make_vocab();
  Sampler s = constrained_sampler(v, SamplingParams{});
  ops::SampleOut o;
  o.token = 10;  // "a": the grammar wants a digit
  const Result<SampleResult> r = s.take(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::internal);
  EXPECT_NE(r.status().message().find("token 10"), std::string::npos) << r.status().message();
  o.token = 1;  // a digit is fine
  EXPECT_TRUE(s.take(o).ok());
}

TEST(SamplerGrammar, UnconstrainedSamplersHaveNoMaskRow) {
  const Vocab v = make_vocab();
  Sampler s(SamplingParams{}, v.n());
  EXPECT_FALSE(s.constrained());
  EXPECT_FALSE(s.grammar_done());
  ops::SampleRow row;
  std::vector<ops::SampleAdjust> adjust;
  ASSERT_TRUE(s.next_row(std::vector<int32_t>{1}, row, adjust, /*mask_row=*/5).ok());
  EXPECT_EQ(row.mask_row, -1);
}

}  // namespace
}  // namespace kiln
