// The sampler: a request's sampling parameters checked, turned into ops::Sample's per-row form and its
// results read back; and StopMatcher, which cuts the generated text at the first stop string.
//
// Stage order (ops/sample.h; each stage sees the output of the one before):
//   logit bias -> penalties (repeat, presence, frequency over the window) -> greedy if temperature == 0 ->
//   top-k -> softmax with temperature -> top-p -> min-p -> one draw, u = a hash of (seed, draw index).
// A constrained request (set_grammar) also bans, with the adjustments, every token its grammar does not allow
// next (ops::Sample's mask), and moves its grammar's matcher past each token drawn.
// The reported log-probabilities ignore every stage: they are the log-softmax of the raw model logits.
// Ties between equal logits always go to the lower token id. A draw depends on the seed, the draw's index and
// the logits alone: not on the other requests of the step, nor on the device.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "grammar/grammar.h"
#include "kiln/sampling.h"
#include "ops/sample.h"

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

// One request's sampling: its parameters and its state between draws (the tokens drawn so far, which
// number the next draw and decide what min_tokens holds back). The draw itself is ops::Sample's
// (ops/sample.h: the stages, the counter-based uniform): on the backend, where the logits are (next_row()
// then take()), or here on downloaded logits (sample()); both give the same token for the same logits.
class Sampler {
 public:
  // Validates `params` first. Error: invalid_argument from validate().
  static Result<Sampler> create(SamplingParams params, int32_t n_vocab);
  // Precondition (asserted): validate(params, n_vocab) is ok.
  Sampler(SamplingParams params, int32_t n_vocab);

  // The next draw as ops::Sample reads it: `row` (counter = the tokens drawn so far) and the row's
  // adjustments (logit bias, the penalties over history's window, the end tokens min_tokens holds back)
  // appended to `adjust`, ascending ids. history: the prompt and the tokens generated so far, oldest first.
  // mask_row: where the caller puts this row's mask in ops::Sample::mask (fill_mask()) when constrained(),
  // >= 0 then (asserted); ignored otherwise (the row gets none).
  // Error: invalid_argument for a history id outside the vocabulary in the penalty window.
  Status next_row(std::span<const int32_t> history, ops::SampleRow& row,
                  std::vector<ops::SampleAdjust>& adjust, int32_t mask_row = -1);
  // What a draw of next_row()'s row came to: the token and its logprobs, or the error its code names. A token
  // counts as drawn (the next row's counter) when it is returned; a constrained sampler's matcher accepts it
  // (an error, internal, if the grammar does not allow it: the mask let through a token it should not have).
  Result<SampleResult> take(const ops::SampleOut& out);

  // next_row(), ops::sample_row() on these logits, take(). logits: [n_vocab] raw model output for the next
  // position (-inf allowed: a masked token). Errors: invalid_argument for logits of the wrong size, NaN or
  // +inf logits, a history id outside the vocabulary in the penalty window, a logit that logit_bias or
  // penalties overflow, or when every token ends up with a -inf logit.
  Result<SampleResult> sample(std::span<const float> logits, std::span<const int32_t> history);

  // The model's end-of-generation ids: with stop_token_ids (and unless ignore_eos), what min_tokens keeps
  // from being sampled until the sampler has drawn min_tokens tokens.
  void set_end_tokens(std::span<const int32_t> eog);

  // Constrains every draw from now on to `grammar` (compiled against this sampler's vocabulary of n_vocab
  // tokens, grammar::vocabulary_from the same tokenizer).
  void set_grammar(std::shared_ptr<const grammar::CompiledGrammar> grammar);
  bool constrained() const { return matcher_.has_value(); }
  // The next draw's mask of allowed tokens: words [grammar::mask_words(n_vocab)]. Precondition (asserted):
  // constrained(). Touches this sampler alone: samplers of different requests may fill theirs at once.
  void fill_mask(std::span<uint32_t> words);
  // The output so far is a complete sentence of the grammar and nothing else may follow, or an end token was
  // drawn (grammar::Matcher::done()); false when unconstrained.
  bool grammar_done() const { return matcher_.has_value() && matcher_->done(); }

  // True when sample() would return the first maximum of the raw logits and nothing else: greedy, with no
  // logit_bias, no penalties, no logprobs and no grammar. Such a request can take its token from an argmax
  // computed where the logits are (ops::Argmax on the backend) instead of from the downloaded logits.
  bool plain_greedy() const;
  // The result sample() gives for raw logits whose first maximum is `token` when plain_greedy() holds.
  static SampleResult greedy_result(int32_t token) { return SampleResult{token, 0.0f, {}}; }

  const SamplingParams& params() const { return params_; }
  int32_t n_vocab() const { return n_vocab_; }

 private:
  bool penalties_on() const;

  SamplingParams params_;
  int32_t n_vocab_;
  std::vector<int32_t> held_back_;           // end tokens masked while fewer than min_tokens were sampled
  int32_t n_sampled_ = 0;                    // tokens drawn
  std::optional<grammar::Matcher> matcher_;  // constrained: where the output is in its grammar
  // Scratch, reused between calls.
  std::vector<ops::SampleAdjust> entries_;
  std::vector<ops::SampleAdjust> row_adjust_;
  std::vector<uint32_t> mask_;  // sample()'s mask, [grammar::mask_words(n_vocab)] when constrained
  ops::SampleScratch scratch_;
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
