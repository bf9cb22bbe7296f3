// The public Engine API on the default model (SmolLM2-135M Q4_1 from KILN_MODELS_DIR): bad requests are
// errors that name what is wrong and queue nothing; cancel ends a running request with
// FinishReason::cancelled; requests running together give the same greedy text as alone; stop strings and
// max_tokens end a request as they should.
#include <gtest/gtest.h>

#include <atomic>
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

}  // namespace
}  // namespace kiln
