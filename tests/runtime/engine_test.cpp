// The public Engine API on the default model (SmolLM2-135M Q4_1 from KILN_MODELS_DIR): bad requests are
// errors that name what is wrong and queue nothing (tool calls and tools that are not JSON objects included);
// cancel ends a running request with FinishReason::cancelled; requests running together give the same greedy
// text as alone; stop strings and max_tokens end a request as they should; prompt logprobs score a prompt as
// generation scored its tokens; prompt logits come once per asked position and agree with the prompt
// logprobs.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "engine_test_util.h"

namespace kiln {
namespace {

using test::collect;
using test::Collected;
using test::greedy;

Engine& engine() {
  static std::unique_ptr<Engine> e = [] {
    EngineOptions o;
    o.n_ctx = 256;
    o.n_seq_max = 4;
    return test::make_engine(o);
  }();
  return *e;
}

void expect_error(const Request& r, std::string_view needle) {
  Collected c;
  auto id = engine().submit(r, collect(c));
  ASSERT_FALSE(id.ok()) << "expected an error naming " << needle;
  EXPECT_NE(id.status().message().find(needle), std::string::npos) << id.status().message();
  EXPECT_EQ(c.finals, 0);
}

TEST(Engine, BadRequestsAreNamedErrors) {
  Request none;
  expect_error(none, "exactly one of prompt");
  Request bad_temp = greedy("hi", 4);
  bad_temp.sampling.temperature = -1;
  expect_error(bad_temp, "temperature");
  Request bad_ids;
  bad_ids.prompt_tokens = {1, 2, 99999999};
  expect_error(bad_ids, "prompt_tokens[2] = 99999999");
  std::string long_text;
  for (int i = 0; i < 300; ++i) long_text += "word ";
  expect_error(greedy(long_text, 4), "context is 256");
  EXPECT_FALSE(engine().wait(123456).ok());
  Request tools_alone = greedy("hi", 4);
  tools_alone.tools = {{"f", "", ""}};
  expect_error(tools_alone, "tools are only rendered with chat messages");
  Request bad_args;
  bad_args.messages = {{"user", "hi"}, {"assistant", "", {{"call_1", "f", "{\"a\": 1"}}}};
  expect_error(bad_args, "messages[1].tool_calls[0].arguments is not a JSON object");
  Request bad_params;
  bad_params.messages = {{"user", "hi"}};
  bad_params.tools = {{"f", "", "[1, 2]"}};
  expect_error(bad_params, "tools[0].parameters is not a JSON object");
  bad_params.tools = {{"", "", ""}};
  expect_error(bad_params, "tools[0] has no name");
}

TEST(Engine, MaxTokensAndStopStrings) {
  Collected a;
  auto id = engine().submit(greedy("The capital of France is", 5), collect(a));
  ASSERT_TRUE(id.ok()) << id.status().message();
  auto st = engine().wait(*id);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->n_generated, 5);
  EXPECT_EQ(st->finish, FinishReason::length);
  EXPECT_EQ(a.finals, 1);
  EXPECT_NE(a.text.find("Paris"), std::string::npos) << a.text;
  // max_tokens 0: the prompt is computed, nothing is generated.
  Collected z;
  id = engine().submit(greedy("The capital of France is", 0), collect(z));
  ASSERT_TRUE(id.ok());
  st = engine().wait(*id);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->n_generated, 0);
  EXPECT_EQ(st->finish, FinishReason::length);
  EXPECT_TRUE(z.tokens.empty());
  EXPECT_EQ(z.finals, 1);
  // The same request stopped at "Paris": the text ends before it.
  Request r = greedy("The capital of France is", 16);
  r.sampling.stop = {"Paris"};
  Collected b;
  id = engine().submit(r, collect(b));
  ASSERT_TRUE(id.ok());
  st = engine().wait(*id);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->finish, FinishReason::stop);
  EXPECT_EQ(b.text.find("Paris"), std::string::npos) << b.text;
  EXPECT_EQ(a.text.substr(0, b.text.size()), b.text);
  // A second identical prompt reuses cached prefix blocks only when a whole block is cached: 5 tokens fit
  // none.
  EXPECT_EQ(st->n_cached, 0);
}

TEST(Engine, ConcurrentRequestsMatchAlone) {
  const std::vector<std::string> prompts = {"Once upon a time", "The three primary colours are",
                                            "def fibonacci(n):", "In 1969, the first people"};
  std::vector<Collected> alone(prompts.size()), together(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto id = engine().submit(greedy(prompts[i], 12), collect(alone[i]));
    ASSERT_TRUE(id.ok());
    ASSERT_TRUE(engine().wait(*id).ok());
  }
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto id = engine().submit(greedy(prompts[i], 12), collect(together[i]));
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  for (uint64_t id : ids) ASSERT_TRUE(engine().wait(id).ok());
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(alone[i].tokens, together[i].tokens) << prompts[i];
    EXPECT_EQ(together[i].tokens.size(), 12u);
  }
}

TEST(Engine, CancelEndsARunningRequest) {
  Collected c;
  std::atomic<int> seen{0};
  auto id = engine().submit(greedy("Count from one to one hundred:", 200), [&](const TokenEvent& ev) {
    collect(c)(ev);
    ++seen;
  });
  ASSERT_TRUE(id.ok());
  while (seen.load() < 3) std::this_thread::yield();
  engine().cancel(*id);
  auto st = engine().wait(*id);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->finish, FinishReason::cancelled);
  EXPECT_LT(st->n_generated, 200);
  EXPECT_EQ(c.finals, 1);
  EXPECT_EQ(c.finish, FinishReason::cancelled);
  // The engine goes on serving.
  Collected d;
  id = engine().submit(greedy("Hello", 3), collect(d));
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(engine().wait(*id)->n_generated, 3);
}

// Prompt logprobs: a prompt that ends with a greedy continuation scores those tokens as generation did (the
// same logprob, the same alternatives), with the whole prompt computed (no prefix-cache hit, however often it
// is sent) and the same numbers when the prefill is cut into chunks.
TEST(Engine, PromptLogprobsScoreThePromptAsGenerationScoredIt) {
  const std::string text =
      "The history of the old city goes back to Roman times, when a small settlement of traders stood";
  Request gen = greedy(text, 8);
  gen.sampling.n_logprobs = 3;
  Collected g;
  auto id = engine().submit(gen, collect(g));
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(engine().wait(*id).ok());
  ASSERT_EQ(g.tokens.size(), 8u);
  EXPECT_EQ(g.prompt_lp_events, 0);  // not asked for

  auto prompt = engine().tokenize(text, /*add_special=*/true);
  ASSERT_TRUE(prompt.ok());
  const size_t n_text = prompt->size();
  ASSERT_GT(n_text, 16u);  // a whole block: a second request could reuse it
  std::vector<int32_t> tokens = *prompt;
  tokens.insert(tokens.end(), g.tokens.begin(), g.tokens.end());

  const auto score = [&](Engine& e) {
    Request r;
    r.prompt_tokens = tokens;
    r.sampling.temperature = 0;
    r.sampling.max_tokens = 0;
    r.sampling.prompt_logprobs = 3;
    Collected c;
    auto sid = e.submit(r, collect(c));
    EXPECT_TRUE(sid.ok());
    auto st = e.wait(*sid);
    EXPECT_TRUE(st.ok());
    EXPECT_EQ(st->n_cached, 0);
    EXPECT_EQ(c.prompt_lp_events, 1);
    EXPECT_EQ(c.finish, FinishReason::length);
    return c.prompt_lp;
  };
  const std::vector<PromptLogprob> first = score(engine());
  ASSERT_EQ(first.size(), tokens.size() - 1);
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(first[i].token, tokens[i + 1]) << i;
    EXPECT_LE(first[i].logprob, 0.0f) << i;
    ASSERT_EQ(first[i].top.size(), 3u) << i;
    EXPECT_GE(first[i].top[0].logprob, first[i].top[1].logprob) << i;
    EXPECT_GE(first[i].top[0].logprob, first[i].logprob) << i;
  }
  for (size_t k = 0; k < g.tokens.size(); ++k) {
    const PromptLogprob& p = first[n_text - 1 + k];  // scores tokens[n_text + k] = generated token k
    EXPECT_NEAR(p.logprob, g.logprobs[k], 2e-3) << k;
    ASSERT_EQ(g.tops[k].size(), 3u);
    EXPECT_EQ(p.top[0].token, g.tops[k][0].token) << k;  // greedy: the token itself
    for (size_t j = 0; j < 3; ++j) EXPECT_NEAR(p.top[j].logprob, g.tops[k][j].logprob, 2e-3) << k << " " << j;
  }
  // Again: the prompt's blocks are cached now, but a scored prompt computes every position.
  const std::vector<PromptLogprob> second = score(engine());
  ASSERT_EQ(second.size(), first.size());
  for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(second[i].logprob, first[i].logprob) << i;
  // Prefill in chunks of 8 tokens: each chunk scores its own positions.
  EngineOptions o;
  o.n_ctx = 256;
  o.max_batch_tokens = 8;
  auto chunked = test::make_engine(o);
  ASSERT_NE(chunked, nullptr);
  const std::vector<PromptLogprob> third = score(*chunked);
  ASSERT_EQ(third.size(), first.size());
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(third[i].token, first[i].token) << i;
    EXPECT_NEAR(third[i].logprob, first[i].logprob, 2e-3) << i;
  }
  // Out of range is an error naming the field.
  Request bad = greedy("hi", 1);
  bad.sampling.prompt_logprobs = 21;
  expect_error(bad, "prompt_logprobs = 21");
}

// log softmax(logits)[token], in f64.
double log_softmax_at(const std::vector<float>& logits, int32_t token) {
  const float m = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (const float x : logits) sum += std::exp(static_cast<double>(x - m));
  return static_cast<double>(logits[static_cast<size_t>(token)] - m) - std::log(sum);
}

TEST(Engine, PromptLogitsComeOncePerPositionFromTheFirstAsked) {
  auto prompt =
      engine().tokenize("The quick brown fox jumps over the lazy dog, then sleeps in the sun.", true);
  ASSERT_TRUE(prompt.ok());
  const auto n = static_cast<int32_t>(prompt->size());
  ASSERT_GT(n, 12);
  // The reference: prompt logprobs of every position.
  Request scored;
  scored.prompt_tokens = *prompt;
  scored.sampling.temperature = 0;
  scored.sampling.max_tokens = 0;
  scored.sampling.prompt_logprobs = 0;
  Collected ref;
  auto rid = engine().submit(scored, collect(ref));
  ASSERT_TRUE(rid.ok());
  ASSERT_TRUE(engine().wait(*rid).ok());
  ASSERT_EQ(ref.prompt_lp.size(), static_cast<size_t>(n - 1));

  const auto run = [&](Engine& e, int32_t from) {
    std::vector<std::pair<int32_t, std::vector<float>>> got;
    Request r;
    r.prompt_tokens = *prompt;
    r.sampling.temperature = 0;
    r.sampling.max_tokens = 0;
    r.prompt_logits = [&got](int32_t p, std::span<const float> logits) {
      got.emplace_back(p, std::vector<float>(logits.begin(), logits.end()));
    };
    r.prompt_logits_from = from;
    auto id = e.submit(r, nullptr);
    EXPECT_TRUE(id.ok()) << id.status().message();
    auto st = e.wait(*id);
    EXPECT_TRUE(st.ok());
    EXPECT_EQ(st->n_cached, 0);  // the whole prompt is computed, even with its blocks cached
    EXPECT_EQ(st->finish, FinishReason::length);
    return got;
  };
  EngineOptions o;
  o.n_ctx = 256;
  o.max_batch_tokens = 5;  // prefill in chunks of 5: positions from several steps
  auto chunked = test::make_engine(o);
  ASSERT_NE(chunked, nullptr);
  for (Engine* e : {&engine(), chunked.get()}) {
    for (const int32_t from : {0, 7, n - 1}) {
      const auto got = run(*e, from);
      ASSERT_EQ(got.size(), static_cast<size_t>(n - 1 - from)) << from;
      for (size_t i = 0; i < got.size(); ++i) {
        const int32_t p = got[i].first;
        ASSERT_EQ(p, from + static_cast<int32_t>(i));
        ASSERT_EQ(got[i].second.size(), static_cast<size_t>(e->model().n_vocab));
        const int32_t next = (*prompt)[static_cast<size_t>(p) + 1];
        EXPECT_NEAR(log_softmax_at(got[i].second, next), ref.prompt_lp[static_cast<size_t>(p)].logprob, 2e-3)
            << p;
      }
    }
  }
  Request bad;
  bad.prompt_tokens = *prompt;
  bad.prompt_logits = [](int32_t, std::span<const float>) {};
  bad.prompt_logits_from = n;
  expect_error(bad, "prompt_logits_from = " + std::to_string(n) + " is outside [0, " + std::to_string(n - 1));
}

}  // namespace
}  // namespace kiln
