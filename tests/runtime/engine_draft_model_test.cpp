// Speculative decoding with a draft model (EngineOptions::speculation "draft") on the default model, drafted
// by itself: greedy text is the text without drafts, token for token, alone and in batches, cut by max_tokens
// and stop strings inside a draft (every draft kept: the commit of the draft model's written K/V); seeded
// sampled requests (drafts often rejected: its K/V rolled back) give their tokens and logprobs without
// drafts; a draft model with another vocabulary and bad options are refused, naming what is wrong.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "engine_test_util.h"
#include "formats/gguf.h"

namespace kiln {
namespace {

using test::collect;
using test::Collected;
using test::generate;
using test::greedy;
using test::make_engine;

const std::vector<std::string>& prompts() {
  static const std::vector<std::string> p = {
      "The capital of France is", "Write a short poem about the sea.",     "def fib(n):\n",
      "1, 2, 3, 4, 5,",           "Once upon a time, in a small village,",
  };
  return p;
}

EngineOptions options(bool draft, float p_min = 0.0f) {
  EngineOptions o;
  o.n_ctx = 512;
  o.n_seq_max = 4;
  o.quantize_activations = true;   // the default path
  o.speculation_adaptive = false;  // every decode step drafts, however fast it is here
  if (draft) {
    o.draft_model = test::model_path();  // speculation "draft" implied
    o.draft_max = 5;
    o.draft_p_min = p_min;
  }
  return o;
}

TEST(EngineDraftModel, GreedyTextIsTheTextWithoutDrafts) {
  auto plain = make_engine(options(false));
  auto spec = make_engine(options(true));
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(spec, nullptr);
  std::vector<Request> reqs;
  for (const std::string& p : prompts()) reqs.push_back(greedy(p, 40));
  reqs.push_back(greedy(prompts()[3], 7));  // max_tokens inside a draft
  Request stopped = greedy(prompts()[3], 40);
  stopped.sampling.stop = {" 9,"};
  reqs.push_back(stopped);
  const std::vector<Collected> want = generate(*plain, reqs);
  for (size_t i : {size_t{1}, size_t{5}}) {
    const std::vector<Collected> got = generate(*spec, {reqs[i]});
    EXPECT_EQ(got[0].tokens, want[i].tokens) << "request " << i << " alone";
    EXPECT_EQ(got[0].text, want[i].text) << "request " << i << " alone";
    EXPECT_EQ(got[0].finish, want[i].finish) << "request " << i << " alone";
  }
  // The model drafting for itself greedily: every draft token is the target's token (requests that end by
  // length never leave a draft unchecked: a draft stops at max_tokens).
  const EngineMetrics alone = spec->metrics();
  EXPECT_GT(alone.n_draft_tokens, 20u);
  EXPECT_EQ(alone.n_accepted_tokens, alone.n_draft_tokens);
  const std::vector<Collected> together = generate(*spec, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(together[i].tokens, want[i].tokens) << "request " << i << " together";
    EXPECT_EQ(together[i].text, want[i].text) << "request " << i << " together";
    EXPECT_EQ(together[i].finish, want[i].finish) << "request " << i << " together";
  }
  // All kept but those after the stop string inside a draft.
  const EngineMetrics m = spec->metrics();
  EXPECT_GT(m.n_draft_tokens, 100u);
  EXPECT_GE(m.n_accepted_tokens + static_cast<uint64_t>(options(true).draft_max), m.n_draft_tokens);
  EXPECT_EQ(m.kv_blocks_used, 0);
}

// Sampled requests: the draft is the draft model's greedy choice, the target's draw often differs, and the
// draft model's K/V past the kept tokens are rewritten. The tokens are those without drafts; with a p_min,
// the drafts are shorter.
TEST(EngineDraftModel, SampledRequestsGiveTheirTokensWithoutDrafts) {
  auto plain = make_engine(options(false));
  auto spec = make_engine(options(true, 0.3f));
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(spec, nullptr);
  std::vector<Request> reqs;
  for (const std::string& p : prompts()) {
    Request r = greedy(p, 48);
    r.sampling.temperature = 0.9f;
    r.sampling.top_p = 0.95f;
    r.sampling.seed = 7;
    reqs.push_back(r);
  }
  reqs[1].sampling.repeat_penalty = 1.1f;
  reqs[2].sampling.n_logprobs = 3;
  const std::vector<Collected> want = generate(*plain, reqs);
  const std::vector<Collected> got = generate(*spec, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
    EXPECT_EQ(got[i].logprobs, want[i].logprobs) << "request " << i;
    ASSERT_EQ(got[i].tops.size(), want[i].tops.size()) << "request " << i;
    for (size_t t = 0; t < got[i].tops.size(); ++t) {
      ASSERT_EQ(got[i].tops[t].size(), want[i].tops[t].size()) << "request " << i << " token " << t;
      for (size_t j = 0; j < got[i].tops[t].size(); ++j) {
        EXPECT_EQ(got[i].tops[t][j].token, want[i].tops[t][j].token) << "request " << i << " token " << t;
        EXPECT_EQ(got[i].tops[t][j].logprob, want[i].tops[t][j].logprob) << "request " << i << " token " << t;
      }
    }
  }
  const EngineMetrics m = spec->metrics();
  std::printf("sampled drafts: %llu of %llu kept in %llu drafts\n",
              static_cast<unsigned long long>(m.n_accepted_tokens),
              static_cast<unsigned long long>(m.n_draft_tokens), static_cast<unsigned long long>(m.n_drafts));
  EXPECT_GT(m.n_draft_tokens, 30u);
  EXPECT_GT(m.n_accepted_tokens, 10u);
  EXPECT_LT(m.n_accepted_tokens, m.n_draft_tokens);  // some drafts rejected
  EXPECT_EQ(m.kv_blocks_used, 0);
}

// A copy of the default model whose token `id` is spelled `text`.
std::string respelled_model(int32_t id, const std::string& text) {
  auto f = gguf::File::open(test::model_path());
  EXPECT_TRUE(f.ok()) << f.status().message();
  gguf::Writer w;
  EXPECT_TRUE(gguf::copy_into(*f, w).ok());
  const gguf::Value* tokens = f->find("tokenizer.ggml.tokens");
  EXPECT_NE(tokens, nullptr);
  gguf::Value changed = *tokens;
  auto array = std::make_shared<gguf::Array>(*std::get<std::shared_ptr<gguf::Array>>(changed.v));
  array->items[static_cast<size_t>(id)].v = text;
  changed.v = array;
  w.set("tokenizer.ggml.tokens", changed);
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("kiln-draft-respelled-" + std::to_string(::getpid()) + ".gguf"))
                               .string();
  EXPECT_TRUE(w.write(path).ok());
  return path;
}

TEST(EngineDraftModel, BadDraftModelsAndOptionsAreRefused) {
  const auto refused = [](const EngineOptions& o, const std::string& want) {
    EngineOptions with = o;
    with.model_path = test::model_path();
    auto r = Engine::create(with);
    ASSERT_FALSE(r.ok()) << want;
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().message();
  };
  EngineOptions o = options(true);
  const std::string path = respelled_model(0, "<|kiln|>");
  o.draft_model = path;
  refused(o, "token 0 is \"<|kiln|>\" there");
  std::filesystem::remove(path);
  o.draft_model =
      std::filesystem::path(test::model_path()).replace_filename("gemma-3-270m-q4_k_m.gguf").string();
  refused(o, "its vocabulary has 262144 tokens and the model's 49152");
  o = options(false);
  o.speculation = "draft";
  refused(o, "needs a draft model");
  o = options(true);
  o.speculation = "ngram";
  refused(o, "does not use it");
  o = options(true);
  o.draft_p_min = 1.5f;
  refused(o, "draft_p_min = 1.5");
  o = options(true);
  o.draft_model = "/nonexistent/draft.gguf";
  refused(o, "/nonexistent/draft.gguf");
}

}  // namespace
}  // namespace kiln
