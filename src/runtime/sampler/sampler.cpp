#include "runtime/sampler/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kiln {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Fills out.logprob (of `token`) and out.top (the n_logprobs best); raw_max = max(logits), finite.
void report_logprobs(std::span<const float> logits, float raw_max, int32_t token, int32_t n_logprobs,
                     SampleResult& out);

}  // namespace

Status validate(const SamplingParams& params, int32_t n_vocab) {
  if (n_vocab <= 0) return invalid_argument("n_vocab = {}: must be > 0", n_vocab);
  if (!std::isfinite(params.temperature) || params.temperature < 0.0f) {
    return invalid_argument("temperature = {}: must be finite and >= 0", params.temperature);
  }
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f)) {
    return invalid_argument("top_p = {}: must be in (0, 1]", params.top_p);
  }
  if (!(params.min_p >= 0.0f && params.min_p <= 1.0f)) {
    return invalid_argument("min_p = {}: must be in [0, 1]", params.min_p);
  }
  if (!std::isfinite(params.repeat_penalty) || params.repeat_penalty <= 0.0f) {
    return invalid_argument("repeat_penalty = {}: must be finite and > 0", params.repeat_penalty);
  }
  if (params.repeat_last_n < -1) {
    return invalid_argument("repeat_last_n = {}: must be >= -1 (-1: whole history)", params.repeat_last_n);
  }
  if (!std::isfinite(params.presence_penalty)) {
    return invalid_argument("presence_penalty = {}: must be finite", params.presence_penalty);
  }
  if (!std::isfinite(params.frequency_penalty)) {
    return invalid_argument("frequency_penalty = {}: must be finite", params.frequency_penalty);
  }
  for (size_t i = 0; i < params.logit_bias.size(); ++i) {
    const auto& [id, bias] = params.logit_bias[i];
    if (id < 0 || id >= n_vocab) {
      return invalid_argument("logit_bias[{}] token = {}: must be in [0, {})", i, id, n_vocab);
    }
    if (std::isnan(bias) || bias == std::numeric_limits<float>::infinity()) {
      return invalid_argument("logit_bias[{}] value = {}: must be finite or -inf", i, bias);
    }
  }
  if (params.n_logprobs < 0 || params.n_logprobs > kSamplerMaxLogprobs) {
    return invalid_argument("n_logprobs = {}: must be in [0, {}]", params.n_logprobs, kSamplerMaxLogprobs);
  }
  if (params.prompt_logprobs < -1 || params.prompt_logprobs > kSamplerMaxLogprobs) {
    return invalid_argument("prompt_logprobs = {}: must be -1 (off) or in [0, {}]", params.prompt_logprobs,
                            kSamplerMaxLogprobs);
  }
  if (params.max_tokens < 0) return invalid_argument("max_tokens = {}: must be >= 0", params.max_tokens);
  if (params.stop.size() > kSamplerMaxStops) {
    return invalid_argument("stop: {} strings, at most {} allowed", params.stop.size(), kSamplerMaxStops);
  }
  for (size_t i = 0; i < params.stop.size(); ++i) {
    if (params.stop[i].empty()) return invalid_argument("stop[{}] = \"\": must not be empty", i);
  }
  if (params.stop_token_ids.size() > kSamplerMaxStopTokens) {
    return invalid_argument("stop_token_ids: {} ids, at most {} allowed", params.stop_token_ids.size(),
                            kSamplerMaxStopTokens);
  }
  for (size_t i = 0; i < params.stop_token_ids.size(); ++i) {
    if (params.stop_token_ids[i] < 0 || params.stop_token_ids[i] >= n_vocab) {
      return invalid_argument("stop_token_ids[{}] = {}: must be in [0, {})", i, params.stop_token_ids[i],
                              n_vocab);
    }
  }
  if (params.min_tokens < 0) return invalid_argument("min_tokens = {}: must be >= 0", params.min_tokens);
  return Status::ok_status();
}

Result<Sampler> Sampler::create(SamplingParams params, int32_t n_vocab) {
  KILN_TRY(validate(params, n_vocab));
  return Sampler(std::move(params), n_vocab);
}

Sampler::Sampler(SamplingParams params, int32_t n_vocab) : params_(std::move(params)), n_vocab_(n_vocab) {
  KILN_ASSERT(validate(params_, n_vocab_).ok());
}

bool Sampler::penalties_on() const {
  return params_.repeat_last_n != 0 && (params_.repeat_penalty != 1.0f || params_.presence_penalty != 0.0f ||
                                        params_.frequency_penalty != 0.0f);
}

Status Sampler::next_row(std::span<const int32_t> history, ops::SampleRow& row,
                         std::vector<ops::SampleAdjust>& adjust, int32_t mask_row) {
  row = ops::SampleRow{};
  if (constrained()) {
    KILN_ASSERT(mask_row >= 0);
    row.mask_row = mask_row;
  }
  row.temperature = params_.temperature;
  row.top_k = params_.top_k;
  row.top_p = params_.top_p;
  row.min_p = params_.min_p;
  row.repeat_penalty = params_.repeat_penalty;
  row.presence_penalty = params_.presence_penalty;
  row.frequency_penalty = params_.frequency_penalty;
  row.seed_lo = static_cast<uint32_t>(params_.seed);
  row.seed_hi = static_cast<uint32_t>(params_.seed >> 32);
  row.counter = static_cast<uint32_t>(n_sampled_);
  row.n_top = params_.n_logprobs;
  row.logprobs = params_.logprobs || params_.n_logprobs > 0 ? 1 : 0;

  // Every (id, change) the row makes, then merged per id: ascending, distinct.
  entries_.clear();
  for (const auto& [id, bias] : params_.logit_bias) entries_.push_back({id, bias, 0, 0});
  if (params_.repeat_last_n != 0) {
    const size_t w = params_.repeat_last_n < 0
                         ? history.size()
                         : std::min(history.size(), static_cast<size_t>(params_.repeat_last_n));
    const std::span<const int32_t> window = history.last(w);
    for (size_t i = 0; i < w; ++i) {
      if (window[i] < 0 || window[i] >= n_vocab_) {
        return invalid_argument("history[{}] = {}: must be in [0, {})", history.size() - w + i, window[i],
                                n_vocab_);
      }
    }
    if (penalties_on()) {
      for (const int32_t id : window) entries_.push_back({id, 0.0f, 1, 0});
    }
  }
  if (n_sampled_ < params_.min_tokens && !grammar_done()) {  // a grammar's end outranks min_tokens
    for (const int32_t id : held_back_) entries_.push_back({id, 0.0f, 0, 1});
  }
  std::sort(entries_.begin(), entries_.end(),
            [](const ops::SampleAdjust& a, const ops::SampleAdjust& b) { return a.id < b.id; });
  row.adjust_begin = static_cast<int32_t>(adjust.size());
  for (const ops::SampleAdjust& e : entries_) {
    if (static_cast<int32_t>(adjust.size()) > row.adjust_begin && adjust.back().id == e.id) {
      ops::SampleAdjust& m = adjust.back();
      m.bias += e.bias;
      m.count += e.count;
      m.banned |= e.banned;
    } else {
      adjust.push_back(e);
    }
  }
  row.adjust_count = static_cast<int32_t>(adjust.size()) - row.adjust_begin;
  return Status::ok_status();
}

Result<SampleResult> Sampler::take(const ops::SampleOut& out) {
  switch (out.token) {
    case ops::kSampleBadLogits: return invalid_argument("logits: a NaN or +inf, or every value -inf");
    case ops::kSampleBadAdjusted:
      return invalid_argument("a logit is NaN or +inf after logit_bias and penalties");
    case ops::kSampleAllMasked:
      if (constrained()) {
        return invalid_argument(
            "every token has a -inf logit after logit_bias, penalties and the grammar's mask of allowed "
            "tokens");
      }
      return invalid_argument("every token has a -inf logit after logit_bias and penalties");
    default: break;
  }
  if (out.token < 0 || out.token >= n_vocab_) {
    return make_status(StatusCode::internal, "sampled token {} is outside the vocabulary of {}", out.token,
                       n_vocab_);
  }
  if (matcher_.has_value() && !matcher_->accept(out.token)) {
    return make_status(StatusCode::internal, "sampled token {} is not allowed by the grammar", out.token);
  }
  SampleResult r;
  r.token = out.token;
  r.logprob = out.logprob;
  for (int32_t j = 0; j < std::min(out.n_top, params_.n_logprobs); ++j)
    r.top.push_back({out.top_id[j], out.top_logprob[j]});
  ++n_sampled_;
  return r;
}

Result<SampleResult> Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  if (logits.size() != static_cast<size_t>(n_vocab_)) {
    return invalid_argument("logits: {} values, expected n_vocab = {}", logits.size(), n_vocab_);
  }
  ops::SampleRow row;
  row_adjust_.clear();
  KILN_TRY(next_row(history, row, row_adjust_, /*mask_row=*/0));
  if (constrained()) {
    mask_.resize(grammar::mask_words(n_vocab_));
    fill_mask(mask_);
  }
  const ops::SampleOut out = ops::sample_row(logits, row, row_adjust_, scratch_,
                                             constrained() ? mask_ : std::span<const uint32_t>{});
  // Errors name the logit, here where the logits are.
  if (out.token == ops::kSampleBadLogits) {
    for (size_t i = 0; i < logits.size(); ++i) {
      if (std::isnan(logits[i]) || logits[i] == std::numeric_limits<float>::infinity())
        return invalid_argument("logits[{}] = {}: must not be NaN or +inf", i, logits[i]);
    }
    return invalid_argument("logits: all {} values are -inf", logits.size());
  }
  if (out.token == ops::kSampleBadAdjusted) {
    for (const ops::SampleAdjust& e : row_adjust_) {
      if (constrained() && !ops::sample_mask_allows(mask_.data(), e.id)) continue;  // a ban, not looked at
      const float v = ops::sample_adjusted(logits[static_cast<size_t>(e.id)], row, e);
      if (std::isnan(v) || v == std::numeric_limits<float>::infinity()) {
        return invalid_argument(
            "logit of token {} = {} after logit_bias and penalties: must not be NaN or +inf", e.id, v);
      }
    }
  }
  return take(out);
}

void Sampler::set_end_tokens(std::span<const int32_t> eog) {
  held_back_ = params_.stop_token_ids;
  if (!params_.ignore_eos) held_back_.insert(held_back_.end(), eog.begin(), eog.end());
}

void Sampler::set_grammar(std::shared_ptr<const grammar::CompiledGrammar> grammar) {
  matcher_.emplace(std::move(grammar));
}

void Sampler::fill_mask(std::span<uint32_t> words) {
  KILN_ASSERT(matcher_.has_value() && words.size() == grammar::mask_words(n_vocab_));
  matcher_->fill_mask(words);
}

bool Sampler::plain_greedy() const {
  return params_.temperature == 0.0f && params_.logit_bias.empty() && !penalties_on() && !params_.logprobs &&
         params_.n_logprobs == 0 && params_.min_tokens == 0 && !constrained();
}

Result<SampleResult> score_token(std::span<const float> logits, int32_t token, int32_t n_top) {
  if (token < 0 || static_cast<size_t>(token) >= logits.size()) {
    return out_of_range("score_token: token {} is outside the {} logits", token, logits.size());
  }
  if (n_top < 0 || n_top > kSamplerMaxLogprobs) {
    return invalid_argument("score_token: n_top = {}: must be in [0, {}]", n_top, kSamplerMaxLogprobs);
  }
  float raw_max = kNegInf;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float v = logits[i];
    if (std::isnan(v) || v == std::numeric_limits<float>::infinity()) {
      return invalid_argument("logits[{}] = {}: must not be NaN or +inf", i, v);
    }
    raw_max = std::max(raw_max, v);
  }
  if (raw_max == kNegInf) return invalid_argument("logits: all {} values are -inf", logits.size());
  SampleResult out;
  out.token = token;
  report_logprobs(logits, raw_max, token, n_top, out);
  return out;
}

namespace {

// Higher logit first; equal logits: lower id first. A strict total order, so every sort agrees.
struct ByLogitDesc {
  template <class C>
  bool operator()(const C& a, const C& b) const {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  }
};

void report_logprobs(std::span<const float> logits, float raw_max, int32_t token, int32_t n_logprobs,
                     SampleResult& out) {
  // log-softmax: logprob(i) = logits[i] - (max + log(sum(exp(logits - max)))); float exp (each term within
  // an ulp), summed in double. Alongside, the n best raw logits, kept sorted in a list of at most 20 (ids
  // ascend, so ties keep the lower id first).
  struct Entry {
    float logit;
    int32_t id;
  };
  const auto n_top = std::min(static_cast<size_t>(n_logprobs), logits.size());
  std::vector<Entry> best;
  best.reserve(n_top + 1);
  double sum = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float v = logits[i];
    sum += static_cast<double>(std::exp(v - raw_max));
    if (n_top == 0 || (best.size() == n_top && !(v > best.back().logit))) continue;
    const Entry e{v, static_cast<int32_t>(i)};
    best.insert(std::upper_bound(best.begin(), best.end(), e, ByLogitDesc{}), e);
    if (best.size() > n_top) best.pop_back();
  }
  const double lse = static_cast<double>(raw_max) + std::log(sum);
  out.logprob = static_cast<float>(static_cast<double>(logits[static_cast<size_t>(token)]) - lse);
  out.top.reserve(n_top);
  for (const Entry& e : best) {
    out.top.push_back({e.id, static_cast<float>(static_cast<double>(e.logit) - lse)});
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// StopMatcher

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const std::string& s : stops_) KILN_ASSERT(!s.empty());
}

StopMatcher::StopResult StopMatcher::push(std::string_view text_piece) {
  if (stopped_) return {"", true};
  if (stops_.empty()) return {std::string(text_piece), false};
  held_.append(text_piece);

  // The stop string that completes first (smallest end); on a tie, the one that starts first. held_ never
  // holds a whole stop string between calls, so any match ends in the new piece.
  size_t best_pos = std::string::npos, best_end = std::string::npos;
  for (const std::string& s : stops_) {
    const size_t pos = held_.find(s);
    if (pos == std::string::npos) continue;
    const size_t end = pos + s.size();
    if (end < best_end || (end == best_end && pos < best_pos)) {
      best_pos = pos;
      best_end = end;
    }
  }
  if (best_pos != std::string::npos) {
    StopResult r{held_.substr(0, best_pos), true};
    held_.clear();
    stopped_ = true;
    return r;
  }

  // Hold back the longest suffix that is a proper prefix of some stop string.
  const std::string_view text = held_;
  size_t hold = 0;
  for (const std::string& s : stops_) {
    for (size_t len = std::min(s.size() - 1, text.size()); len > hold; --len) {
      if (text.ends_with(std::string_view(s).substr(0, len))) {
        hold = len;
        break;
      }
    }
  }
  StopResult r{held_.substr(0, held_.size() - hold), false};
  held_.erase(0, held_.size() - hold);
  return r;
}

std::string StopMatcher::flush() {
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace kiln
