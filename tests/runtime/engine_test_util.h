// Helpers of the Engine tests: the default model, engines with test options, greedy requests and a callback
// that collects what a request streamed.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "kiln/kiln.h"

namespace kiln::test {

inline std::string model_path() {
  const char* dir = std::getenv("KILN_MODELS_DIR");
  const std::string d =
      dir != nullptr && *dir != '\0' ? dir : std::string(std::getenv("HOME")) + "/.cache/kiln/models";
  return d + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

// The backend of the tests that also run on a GPU: KILN_TEST_BACKEND ("cuda"), else the CPU.
inline std::string test_backend() {
  const char* b = std::getenv("KILN_TEST_BACKEND");
  return b != nullptr && *b != '\0' ? b : "cpu";
}

// An engine on the default model with 2 threads; nullptr (and a test failure) when it cannot be created.
inline std::unique_ptr<Engine> make_engine(EngineOptions o) {
  o.model_path = model_path();
  o.n_threads = 2;
  auto r = Engine::create(o);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? std::move(r).value() : nullptr;
}

struct Collected {
  std::string text;
  std::vector<int32_t> tokens;
  int finals = 0;
  FinishReason finish = FinishReason::none;
  std::string error;
  std::vector<float> logprobs;                  // of each token
  std::vector<std::vector<TokenLogprob>> tops;  // of each token
  std::vector<PromptLogprob> prompt_lp;         // from the event that carried them
  int prompt_lp_events = 0;                     // events that carried prompt logprobs
};

// Appends every event to `c`. The engine calls it on its delivery thread; read `c` after wait() returns.
inline TokenCallback collect(Collected& c) {
  return [&c](const TokenEvent& ev) {
    c.text += ev.text;
    if (ev.token >= 0) {
      c.tokens.push_back(ev.token);
      c.logprobs.push_back(ev.logprob);
      c.tops.push_back(ev.top);
    }
    if (!ev.prompt_logprobs.empty()) {
      c.prompt_lp = ev.prompt_logprobs;
      ++c.prompt_lp_events;
    }
    if (ev.done) {
      ++c.finals;
      c.finish = ev.finish;
      c.error = ev.error;
    }
  };
}

inline Request greedy(std::string prompt, int32_t n) {
  Request r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0;
  r.sampling.max_tokens = n;
  r.sampling.ignore_eos = true;
  return r;
}

// Each request's tokens and text, all submitted at once (those past the engine's n_seq_max wait).
inline std::vector<Collected> generate(Engine& e, const std::vector<Request>& reqs) {
  std::vector<Collected> out(reqs.size());
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto id = e.submit(reqs[i], collect(out[i]));
    EXPECT_TRUE(id.ok()) << id.status().message();
    ids.push_back(id.ok() ? *id : 0);
  }
  for (uint64_t id : ids) EXPECT_TRUE(e.wait(id).ok());
  return out;
}

}  // namespace kiln::test
