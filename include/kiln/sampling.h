// Sampling parameters of one request and the log-probabilities reported with each token: plain structs that
// embedders fill in; the runtime checks them (runtime/sampler) before use.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kiln {

struct SamplingParams {
  float temperature = 0.8f;  // >= 0, finite; 0: greedy (argmax, ties -> lowest id)
  int32_t top_k = 40;        // keep the k highest logits; <= 0: off
  float top_p = 0.95f;       // in (0, 1]: keep the smallest prefix with mass >= top_p; 1: off
  float min_p = 0.05f;       // in [0, 1]: keep tokens with p >= min_p * p_max; 0: off
  float repeat_penalty =
      1.0f;  // > 0; over the last repeat_last_n tokens: logit > 0 ? logit / pen : logit * pen
  int32_t repeat_last_n = 64;      // the penalty window in tokens; -1: whole history, 0: no penalties at all
  float presence_penalty = 0.0f;   // logit -= presence_penalty * (count > 0), count over the same window
  float frequency_penalty = 0.0f;  // logit -= frequency_penalty * count, count over the same window
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, added to its logit before everything else)
  uint64_t seed = 0;                                  // same seed + same logits -> same tokens
  bool logprobs = false;   // report each token's logprob (TokenEvent::logprob); implied by n_logprobs > 0
  int32_t n_logprobs = 0;  // top-n alternatives to report with each token, 0..20
  std::vector<std::string> stop;  // stop strings (not included in the output), at most 16, none empty
  int32_t max_tokens = 256;       // tokens to generate at most, >= 0
  bool ignore_eos = false;        // keep generating past the end-of-sequence token (not past a grammar's end)
  std::vector<int32_t>
      stop_token_ids;      // more tokens that end generation as EOS does (not streamed), at most 64
  int32_t min_tokens = 0;  // EOS and stop_token_ids cannot be sampled before this many tokens
  // -1: off. 0..20: score the prompt too, with this many alternatives per position: every prompt token after
  // the first gets its logprob given the tokens before it (TokenEvent::prompt_logprobs). The request then
  // computes its whole prompt: a prefix-cache hit would leave positions without logits.
  int32_t prompt_logprobs = -1;
};

struct TokenLogprob {
  int32_t token;  // token id
  float logprob;  // natural log of its probability under the raw model logits
};

// A prompt token scored by the model: its logprob given the prompt before it, and the alternatives.
struct PromptLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;  // SamplingParams::prompt_logprobs most likely tokens, descending
};

}  // namespace kiln
