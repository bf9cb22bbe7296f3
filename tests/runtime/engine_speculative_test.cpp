// Speculative decoding (EngineOptions::speculation "ngram") on the default model: greedy text is the text
// without it, token for token, for requests alone and together, cut by max_tokens and stop strings in the
// middle of a draft; drafts are made and kept on text that repeats; seeded sampled requests (penalties,
// logprobs, min_tokens, a grammar) give the tokens they give without it; sampled tokens follow the target's
// distribution (chi-square; also on a GPU with KILN_TEST_BACKEND=cuda); bad options are refused with the
// field named.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "../ops/sample_stats.h"
#include "engine_test_util.h"

namespace kiln {
namespace {

using test::collect;
using test::Collected;
using test::generate;
using test::greedy;
using test::make_engine;

// Prompts whose continuations repeat what came before (drafts are kept) and others (drafts mostly missed).
const std::vector<std::string>& prompts() {
  static const std::vector<std::string> p = {
      "Repeat this line three times: the quick brown fox jumps over the lazy dog. the quick brown fox jumps",
      "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n",
      "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
      "The capital of France is",
      "<ul>\n  <li>apple</li>\n  <li>banana</li>\n  <li>cherry</li>\n  <li>",
  };
  return p;
}

EngineOptions options(bool speculate) {
  EngineOptions o;
  o.n_ctx = 512;
  o.n_seq_max = 4;
  o.quantize_activations = true;   // the default path
  o.speculation_adaptive = false;  // every decode step drafts, however fast it is here
  if (speculate) o.speculation = "ngram";
  return o;
}

TEST(EngineSpeculative, GreedyTextIsTheTextWithoutDrafts) {
  auto plain = make_engine(options(false));
  auto spec = make_engine(options(true));
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(spec, nullptr);
  std::vector<Request> reqs;
  for (const std::string& p : prompts()) reqs.push_back(greedy(p, 40));
  // Cut by max_tokens (in the middle of a draft, for the repeating prompts) and by a stop string.
  reqs.push_back(greedy(prompts()[0], 7));
  reqs.push_back(greedy(prompts()[2], 5));
  Request stopped = greedy(prompts()[2], 40);
  stopped.sampling.stop = {" 20,"};
  reqs.push_back(stopped);
  const std::vector<Collected> want = generate(*plain, reqs);
  // Two alone (drafts with no other request in the step), then all together.
  for (size_t i : {size_t{0}, size_t{5}}) {
    const std::vector<Collected> got = generate(*spec, {reqs[i]});
    EXPECT_EQ(got[0].tokens, want[i].tokens) << "request " << i << " alone";
    EXPECT_EQ(got[0].text, want[i].text) << "request " << i << " alone";
    EXPECT_EQ(got[0].finish, want[i].finish) << "request " << i << " alone";
  }
  const std::vector<Collected> together = generate(*spec, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(together[i].tokens, want[i].tokens) << "request " << i << " together";
    EXPECT_EQ(together[i].text, want[i].text) << "request " << i << " together";
  }
  const EngineMetrics m = spec->metrics();
  std::printf("drafts: %llu of %llu kept\n", static_cast<unsigned long long>(m.n_accepted_tokens),
              static_cast<unsigned long long>(m.n_draft_tokens));
  EXPECT_GT(m.n_draft_tokens, 100u);
  EXPECT_GT(m.n_accepted_tokens, 20u);  // measured: 53 of 304
  EXPECT_LE(m.n_accepted_tokens, m.n_draft_tokens);
  EXPECT_GT(m.n_drafts, 0u);
  EXPECT_LE(m.n_drafts, m.n_draft_tokens);
  EXPECT_EQ(plain->metrics().n_draft_tokens, 0u);
  EXPECT_EQ(m.kv_blocks_used, 0);  // every block back
}

// A sampled row's token is drawn as without drafts (the same logits, history and draw index), so a seeded
// request's tokens, and their logprobs, are those it gets without speculation; so for penalties, min_tokens
// and a grammar. Keeping a draft only when the draw gives it is speculative sampling's rule for a draft of
// one certain token: kept with probability p(draft), else a draw from p without it.
TEST(EngineSpeculative, SampledRequestsGiveTheirTokensWithoutDrafts) {
  auto plain = make_engine(options(false));
  auto spec = make_engine(options(true));
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(spec, nullptr);
  std::vector<Request> reqs;
  for (const std::string& p : {prompts()[0], prompts()[1], prompts()[4]}) {
    Request r = greedy(p, 40);
    r.sampling.temperature = 0.5f;
    r.sampling.top_p = 0.95f;
    r.sampling.seed = 11;
    reqs.push_back(r);
  }
  reqs[1].sampling.repeat_penalty = 1.05f;
  reqs[1].sampling.n_logprobs = 2;
  reqs[2].sampling.min_tokens = 20;
  reqs[2].sampling.ignore_eos = false;
  Request g = greedy(prompts()[2], 40);
  g.constraint.kind = OutputConstraint::Kind::regex;
  g.constraint.text = "( [0-9]+,)+";
  reqs.push_back(g);
  const std::vector<Collected> want = generate(*plain, reqs);
  const std::vector<Collected> got = generate(*spec, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
    EXPECT_EQ(got[i].logprobs, want[i].logprobs) << "request " << i;
    EXPECT_EQ(got[i].finish, want[i].finish) << "request " << i;
  }
  const EngineMetrics m = spec->metrics();
  std::printf("sampled drafts: %llu of %llu kept\n", static_cast<unsigned long long>(m.n_accepted_tokens),
              static_cast<unsigned long long>(m.n_draft_tokens));
  EXPECT_GT(m.n_draft_tokens, 20u);
  EXPECT_GT(m.n_accepted_tokens, 5u);
}

// Speculative sampling keeps the target's distribution. Requests of 3 tokens, sampled at temperature 1.5
// among the top 3 and drafted by prompt lookup (2 tokens a draft, every step), give joint counts of (t1, t2,
// t3) that pass a chi-square test against the exact p(t1) p(t2 | t1) p(t3 | t1, t2): the filtered softmax of
// the top-3 logprobs that requests without drafts report after each prefix. t2 is drawn at the row of t1 in
// a verifying step; t3 at a draft's row where the draft of t2 was kept, else at the next step's first row.
// The same draws must fail against the distribution at temperature 1 (the test can fail).
TEST(EngineSpeculative, SampledTokensFollowTheTargetDistribution) {
  constexpr int kTop = 3, kDraws = 1000;
  constexpr float kTemp = 1.5f;
  EngineOptions po = options(false), so = options(true);
  for (EngineOptions* o : {&po, &so}) {
    o->backend = test::test_backend();
    o->n_ctx = 128;
    o->n_seq_max = 8;
    // A row's logits as the reference requests compute them whatever the step's shape (the CPU always; on
    // CUDA's fastest kernels two close logits can swap places between a prompt step and a verifying step,
    // which moves the top-3 boundary).
    o->deterministic = true;
  }
  so.draft_max = 2;
  auto plain = make_engine(po);
  auto spec = make_engine(so);
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(spec, nullptr);
  auto prompt = plain->tokenize(
      "the quick brown fox jumps over the lazy dog. the quick brown fox jumps over the lazy dog. the quick "
      "brown",
      true);
  ASSERT_TRUE(prompt.ok());

  // The top-3 tokens after a prefix and their probabilities at kTemp among those three; the next ones and
  // all logprobs, to say where a draw outside the three stood.
  struct Next {
    std::vector<int32_t> ids;
    std::vector<double> p;
    std::vector<TokenLogprob> top;
  };
  const auto next_of = [&](const std::vector<std::vector<int32_t>>& prefixes) {
    std::vector<Request> reqs;
    for (const auto& pre : prefixes) {
      Request r = greedy("", 1);
      r.prompt_tokens = pre;
      r.sampling.n_logprobs = 2 * kTop;
      reqs.push_back(r);
    }
    std::vector<Next> out;
    for (const Collected& c : generate(*plain, reqs)) {
      Next n;
      EXPECT_EQ(c.tops.size(), 1u);
      if (c.tops.size() != 1 || c.tops[0].size() != size_t{2 * kTop}) return std::vector<Next>{};
      n.top = c.tops[0];
      double total = 0;
      for (int k = 0; k < kTop; ++k) {
        const TokenLogprob& t = c.tops[0][static_cast<size_t>(k)];
        n.ids.push_back(t.token);
        n.p.push_back(std::exp((t.logprob - c.tops[0][0].logprob) / kTemp));
        total += n.p.back();
      }
      for (double& v : n.p) v /= total;
      out.push_back(n);
    }
    return out;
  };
  const std::vector<Next> first = next_of({*prompt});
  ASSERT_EQ(first.size(), 1u);
  std::vector<std::vector<int32_t>> pre2, pre3;
  for (const int32_t a : first[0].ids) {
    pre2.push_back(*prompt);
    pre2.back().push_back(a);
  }
  const std::vector<Next> second = next_of(pre2);
  ASSERT_EQ(second.size(), size_t{kTop});
  for (int i = 0; i < kTop; ++i) {
    for (const int32_t b : second[i].ids) {
      pre3.push_back(pre2[i]);
      pre3.back().push_back(b);
    }
  }
  const std::vector<Next> third = next_of(pre3);
  ASSERT_EQ(third.size(), size_t{kTop * kTop});

  // The exact joint distribution, cell (i, j, l) = the ranks of t1, t2 and t3, at kTemp and at 1.
  const auto joint = [&](float temp) {
    const auto at = [&](const Next& n, int i) {
      double total = 0;
      for (double v : n.p) total += std::pow(v, kTemp / temp);
      return std::pow(n.p[i], kTemp / temp) / total;
    };
    std::vector<double> p(kTop * kTop * kTop);
    for (int i = 0; i < kTop; ++i)
      for (int j = 0; j < kTop; ++j)
        for (int l = 0; l < kTop; ++l)
          p[(i * kTop + j) * kTop + l] = at(first[0], i) * at(second[i], j) * at(third[i * kTop + j], l);
    return p;
  };

  std::vector<Request> reqs;
  for (int s = 0; s < kDraws; ++s) {
    Request r = greedy("", 3);
    r.prompt_tokens = *prompt;
    r.sampling.temperature = kTemp;
    r.sampling.top_k = kTop;
    r.sampling.top_p = 1.0f;
    r.sampling.min_p = 0.0f;
    r.sampling.seed = static_cast<uint64_t>(s) + 1;
    reqs.push_back(r);
  }
  std::vector<int64_t> counts(kTop * kTop * kTop, 0);
  const auto rank = [](const std::vector<int32_t>& ids, int32_t t) {
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] == t) return static_cast<int>(i);
    return -1;
  };
  const auto where = [](const Next& n, int32_t t) {
    std::string s = "token " + std::to_string(t) + " is not among the top 3 of";
    for (const TokenLogprob& e : n.top) s += " " + std::to_string(e.token) + ":" + std::to_string(e.logprob);
    return s;
  };
  for (const Collected& c : generate(*spec, reqs)) {
    ASSERT_EQ(c.tokens.size(), 3u);
    const int i = rank(first[0].ids, c.tokens[0]);
    ASSERT_GE(i, 0) << "t1: " << where(first[0], c.tokens[0]);
    const int j = rank(second[i].ids, c.tokens[1]);
    ASSERT_GE(j, 0) << "t2: " << where(second[i], c.tokens[1]);
    const int l = rank(third[i * kTop + j].ids, c.tokens[2]);
    ASSERT_GE(l, 0) << "t3: " << where(third[i * kTop + j], c.tokens[2]);
    ++counts[(i * kTop + j) * kTop + l];
  }
  const EngineMetrics m = spec->metrics();
  const sample_stats::ChiSquare fit = sample_stats::chi_square(counts, joint(kTemp), kDraws);
  const sample_stats::ChiSquare other = sample_stats::chi_square(counts, joint(1.0f), kDraws);
  std::printf(
      "%s: chi-square %.1f (limit %.1f), at temperature 1: %.1f (limit %.1f); drafts %llu of %llu kept\n",
      so.backend.c_str(), fit.stat, fit.limit, other.stat, other.limit,
      static_cast<unsigned long long>(m.n_accepted_tokens),
      static_cast<unsigned long long>(m.n_draft_tokens));
  EXPECT_LT(fit.stat, fit.limit);
  EXPECT_GT(other.stat, other.limit);
  // Drafts were made (745 draft tokens for the 1,000 requests when written), both kept and refused.
  EXPECT_GT(m.n_draft_tokens, static_cast<uint64_t>(kDraws / 2));
  EXPECT_GT(m.n_accepted_tokens, static_cast<uint64_t>(kDraws / 10));
  EXPECT_LT(m.n_accepted_tokens, m.n_draft_tokens);
}

TEST(EngineSpeculative, BadOptionsAreRefused) {
  EngineOptions o = options(false);
  o.model_path = test::model_path();
  o.speculation = "eagle";
  auto bad = Engine::create(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("speculation = \"eagle\""), std::string::npos)
      << bad.status().message();
  o.speculation = "ngram";
  o.draft_max = 0;
  bad = Engine::create(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("draft_max = 0"), std::string::npos) << bad.status().message();
}

}  // namespace
}  // namespace kiln
