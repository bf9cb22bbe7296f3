// The sampler: picks the next token from one row of logits, and StopMatcher, which cuts the generated text
// at the first stop string.
//
// Stage order of Sampler::sample (each stage sees the output of the one before):
//   logit bias -> penalties (repeat, presence, frequency over the window) -> greedy if temperature == 0 ->
//   top-k -> softmax with temperature -> top-p -> min-p -> one draw from the seeded RNG.
// The reported log-probabilities ignore every stage: they are the log-softmax of the raw model logits.
// Ties between equal logits always go to the lower token id, so results do not depend on the standard
// library's sort; the RNG is std::mt19937_64 with its 64-bit output mapped to [0, 1) by hand.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "kiln/sampling.h"

namespace kiln {

inline constexpr int32_t kSamplerMaxLogprobs = 20;   // SamplingParams::n_logprobs at most
inline constexpr size_t kSamplerMaxStops = 16;       // SamplingParams::stop entries at most
inline constexpr size_t kSamplerMaxStopTokens = 64;  // SamplingParams::stop_token_ids entries at most

// Checks every field of `params` for a vocabulary of n_vocab tokens. Error: invalid_argument naming the
// field and its value.
Status validate(const SamplingParams& params, int32_t n_vocab);

struct SampleResult {
  int32_t token = -1;             // the chosen token id
  float logprob = 0.0f;           // log-softmax of `token` under the raw logits (0 unless asked for)
  std::vector<TokenLogprob> top;  // the n_logprobs most likely tokens under the raw logits, descending
};

// The log-softmax of `token` under raw logits, and the n_top most likely tokens (descending, ties by lower
// id): what sample() reports for a sampled token, here for a given one (a prompt token that is scored, not
// drawn). Errors: out_of_range for a token outside the logits, invalid_argument for n_top outside
// [0, kSamplerMaxLogprobs], a NaN or +inf logit, or logits that are all -inf.
Result<SampleResult> score_token(std::span<const float> logits, int32_t token, int32_t n_top);

class Sampler {
 public:
  // Validates `params` first. Error: invalid_argument from validate().
  static Result<Sampler> create(SamplingParams params, int32_t n_vocab);
  // Precondition (asserted): validate(params, n_vocab) is ok.
  Sampler(SamplingParams params, int32_t n_vocab);

  // logits: [n_vocab] raw model output for the next position (-inf allowed: a masked token).
  // history: the prompt and the tokens generated so far, oldest first (the penalties read its last
  // repeat_last_n ids). Errors: invalid_argument for logits of the wrong size, NaN or +inf logits, a history
  // id outside the vocabulary in the penalty window, a logit that logit_bias or penalties overflow, or when
  // every token ends up with a -inf logit.
  // Advances the RNG by one draw when temperature > 0.
  Result<SampleResult> sample(std::span<const float> logits, std::span<const int32_t> history);

  // The model's end-of-generation ids: with stop_token_ids (and unless ignore_eos), what min_tokens keeps
  // from being sampled until the sampler has drawn min_tokens tokens.
  void set_end_tokens(std::span<const int32_t> eog);

  // True when sample() would return the first maximum of the raw logits and nothing else: greedy, with no
  // logit_bias, no penalties and no logprobs. Such a request can take its token from an argmax computed where
  // the logits are (ops::Argmax on the backend) instead of from the downloaded logits.
  bool plain_greedy() const;
  // The result sample() gives for raw logits whose first maximum is `token` when plain_greedy() holds.
  static SampleResult greedy_result(int32_t token) { return SampleResult{token, 0.0f, {}}; }

  const SamplingParams& params() const { return params_; }
  int32_t n_vocab() const { return n_vocab_; }

 private:
  struct Candidate {
    float logit;   // after bias and penalties
    int32_t id;    // token id
    float weight;  // exp((logit - max logit) / temperature): the softmax over the candidates, unnormalized
  };

  // Leaves window_ids_ = the distinct ids it changed.
  Status apply_penalties(std::span<const int32_t> history);
  // Error unless work_[id] is finite or -inf.
  Status check_adjusted(int32_t id) const;
  // Fills cands_ with the logits > -inf, or the top_k best of them when top-k is on (then `sorted` is set:
  // they are in descending logit order, ties by ascending id); returns their count.
  size_t select_candidates(bool& sorted);
  // Sorts a prefix of cands_[0, n) as far as needed; returns the count kept by top-p. total: sum of weights.
  size_t apply_top_p(size_t n, bool sorted, double total);
  int32_t draw(size_t n);

  SamplingParams params_;
  int32_t n_vocab_;
  std::mt19937_64 rng_;
  // Scratch, sized n_vocab on the first call and reused.
  std::vector<float> work_;          // [n_vocab] logits after bias and penalties
  std::vector<int32_t> held_back_;   // end tokens masked while fewer than min_tokens were sampled
  int32_t n_sampled_ = 0;            // successful sample() calls
  std::vector<Candidate> cands_;     // [n_vocab] at most
  std::vector<int32_t> counts_;      // [n_vocab] occurrences in the penalty window; all zero between calls
  std::vector<int32_t> window_ids_;  // distinct ids of the penalty window
};

// Cuts streamed text at the first stop string. Text is pushed piece by piece (any split, even inside a UTF-8
// character); what may still become a stop string is held back until it can be decided. The result equals
// cutting the whole text at the stop string that completes first (on a tie, the one that starts first).
class StopMatcher {
 public:
  struct StopResult {
    std::string emit;      // text safe to show now
    bool stopped = false;  // a stop string completed: `emit` is the text before it, the rest is dropped
  };

  explicit StopMatcher(std::vector<std::string> stops);

  // After a stop, every push returns {"", true}.
  StopResult push(std::string_view text_piece);
  // The text held back, at the end of generation ("" after a stop).
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;  // non-empty strings
  std::string held_;                // a suffix of the text that is a proper prefix of some stop string
  bool stopped_ = false;
};

}  // namespace kiln
