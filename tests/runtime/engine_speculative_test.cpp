// Speculative decoding (EngineOptions::speculation "ngram") on the default model: greedy text is the text
// without it, token for token, for requests alone and together, cut by max_tokens and stop strings in the
// middle of a draft; drafts are made and kept on text that repeats; seeded sampled requests (penalties,
// logprobs, min_tokens, a grammar) give the tokens they give without it; bad options are refused with the
// field named.
#include <gtest/gtest.h>

#include <string>
#include <vector>

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
