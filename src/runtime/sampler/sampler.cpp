#include "runtime/sampler/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kiln {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// A uniform double in [0, 1) from the top 53 bits of one 64-bit draw: the same on every standard library
// (std::uniform_real_distribution is not).
double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

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

Sampler::Sampler(SamplingParams params, int32_t n_vocab)
    : params_(std::move(params)), n_vocab_(n_vocab), rng_(params_.seed) {
  KILN_ASSERT(validate(params_, n_vocab_).ok());
}

Result<SampleResult> Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  const size_t n_vocab = static_cast<size_t>(n_vocab_);
  if (logits.size() != n_vocab) {
    return invalid_argument("logits: {} values, expected n_vocab = {}", logits.size(), n_vocab);
  }
  if (work_.size() != n_vocab) {  // first call: the only n_vocab-sized allocations
    work_.resize(n_vocab);
    cands_.resize(n_vocab);
    counts_.assign(n_vocab, 0);
  }
  float raw_max = kNegInf;
  for (size_t i = 0; i < n_vocab; ++i) {
    const float v = logits[i];
    if (std::isnan(v) || v == std::numeric_limits<float>::infinity()) {
      return invalid_argument("logits[{}] = {}: must not be NaN or +inf", i, v);
    }
    raw_max = std::max(raw_max, v);
    work_[i] = v;
  }
  if (raw_max == kNegInf) return invalid_argument("logits: all {} values are -inf", n_vocab);

  for (const auto& [id, bias] : params_.logit_bias) work_[static_cast<size_t>(id)] += bias;
  KILN_TRY(apply_penalties(history));
  // Huge finite biases or penalties can overflow a logit: only the ids they touched can be affected.
  for (const auto& [id, bias] : params_.logit_bias) KILN_TRY(check_adjusted(id));
  for (const int32_t id : window_ids_) KILN_TRY(check_adjusted(id));
  if (n_sampled_ < params_.min_tokens) {
    for (const int32_t id : held_back_) work_[static_cast<size_t>(id)] = kNegInf;
  }

  SampleResult out;
  if (params_.temperature == 0.0f) {
    // Greedy: the first strict maximum, so ties go to the lowest id.
    float best = kNegInf;
    for (size_t i = 0; i < n_vocab; ++i) {
      if (work_[i] > best) {
        best = work_[i];
        out.token = static_cast<int32_t>(i);
      }
    }
  } else {
    bool sorted = false;
    const size_t n_cand = select_candidates(sorted);
    if (n_cand > 0) {
      // Softmax with temperature, left unnormalized: weight = exp((logit - l_max) / T) in [0, 1], exactly 1
      // for the best token; top-p compares partial sums with top_p * sum, min-p compares with min_p * 1.
      float l_max = kNegInf;
      for (size_t i = 0; i < n_cand; ++i) l_max = std::max(l_max, cands_[i].logit);
      double sum = 0.0;
      for (size_t i = 0; i < n_cand; ++i) {
        cands_[i].weight = std::exp((cands_[i].logit - l_max) / params_.temperature);
        sum += cands_[i].weight;
      }
      size_t n = n_cand;
      if (params_.top_p < 1.0f) n = apply_top_p(n, sorted, sum);
      if (params_.min_p > 0.0f) {
        // p >= min_p * p_max, as weight >= min_p * 1: a ratio, so the renormalization top-p implies does not
        // change it, and the best token always survives top-p, so this is min-p over the top-p survivors.
        size_t kept = 0;
        for (size_t i = 0; i < n; ++i) {
          if (cands_[i].weight >= params_.min_p) cands_[kept++] = cands_[i];
        }
        n = kept;
      }
      out.token = draw(n);
    }
  }
  if (out.token < 0) return invalid_argument("every token has a -inf logit after logit_bias and penalties");
  if (params_.logprobs || params_.n_logprobs > 0) {
    report_logprobs(logits, raw_max, out.token, params_.n_logprobs, out);
  }
  ++n_sampled_;
  return out;
}

void Sampler::set_end_tokens(std::span<const int32_t> eog) {
  held_back_ = params_.stop_token_ids;
  if (!params_.ignore_eos) held_back_.insert(held_back_.end(), eog.begin(), eog.end());
}

bool Sampler::plain_greedy() const {
  const bool penalties =
      params_.repeat_last_n != 0 && (params_.repeat_penalty != 1.0f || params_.presence_penalty != 0.0f ||
                                     params_.frequency_penalty != 0.0f);
  return params_.temperature == 0.0f && params_.logit_bias.empty() && !penalties && !params_.logprobs &&
         params_.n_logprobs == 0 && params_.min_tokens == 0;
}

Status Sampler::check_adjusted(int32_t id) const {
  const float v = work_[static_cast<size_t>(id)];
  if (std::isnan(v) || v == std::numeric_limits<float>::infinity()) {
    return invalid_argument("logit of token {} = {} after logit_bias and penalties: must not be NaN or +inf",
                            id, v);
  }
  return Status::ok_status();
}

Status Sampler::apply_penalties(std::span<const int32_t> history) {
  window_ids_.clear();
  if (params_.repeat_last_n == 0) return Status::ok_status();
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
  for (const int32_t id : window) {
    if (counts_[static_cast<size_t>(id)]++ == 0) window_ids_.push_back(id);
  }
  const float pen = params_.repeat_penalty;
  for (const int32_t id : window_ids_) {
    int32_t& count = counts_[static_cast<size_t>(id)];
    float& l = work_[static_cast<size_t>(id)];
    if (pen != 1.0f) l = l > 0.0f ? l / pen : l * pen;
    l -= params_.frequency_penalty * static_cast<float>(count) + params_.presence_penalty;
    count = 0;  // counts_ is all zero again when this returns
  }
  return Status::ok_status();
}

namespace {
// Higher logit first; equal logits: lower id first. A strict total order, so every sort agrees.
struct ByLogitDesc {
  template <class C>
  bool operator()(const C& a, const C& b) const {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  }
};
}  // namespace

size_t Sampler::select_candidates(bool& sorted) {
  const auto k = static_cast<size_t>(std::max(params_.top_k, 0));
  size_t n = 0;
  if (k == 0) {
    for (size_t i = 0; i < work_.size(); ++i) {
      if (work_[i] != kNegInf) cands_[n++] = Candidate{work_[i], static_cast<int32_t>(i), 0.0f};
    }
    sorted = false;
    return n;
  }
  // top-k in one pass: cands_[0, n) is a heap of the best k so far whose front is the worst of them, so a
  // token that does not beat it costs one comparison. O(n_vocab + k log k) for typical logits, O(n_vocab log
  // k) at worst.
  const ByLogitDesc better;
  const auto first = cands_.begin();
  for (size_t i = 0; i < work_.size(); ++i) {
    if (work_[i] == kNegInf) continue;
    const Candidate c{work_[i], static_cast<int32_t>(i), 0.0f};
    if (n < k) {
      cands_[n++] = c;
      std::push_heap(first, first + static_cast<ptrdiff_t>(n), better);
    } else if (better(c, cands_[0])) {
      std::pop_heap(first, first + static_cast<ptrdiff_t>(n), better);
      cands_[n - 1] = c;
      std::push_heap(first, first + static_cast<ptrdiff_t>(n), better);
    }
  }
  std::sort_heap(first, first + static_cast<ptrdiff_t>(n), better);  // best first
  sorted = true;
  return n;
}

size_t Sampler::apply_top_p(size_t n, bool sorted, double total) {
  // Sort only as far as needed: cands_[0, done) is sorted and summed; the sorted prefix grows 4x at a time
  // (nth_element of the rest, then a sort of the new part), so a peaked distribution costs O(n_vocab), not
  // O(n_vocab log n_vocab).
  auto first = cands_.begin();
  double cum = 0.0;
  size_t done = 0;
  size_t k = sorted ? n : std::min<size_t>(n, 64);
  while (true) {
    if (!sorted) {  // the next k - done best of cands_[done, n) to the front of it, then sorted
      const auto lo = first + static_cast<ptrdiff_t>(done), mid = first + static_cast<ptrdiff_t>(k);
      if (k < n) std::nth_element(lo, mid, first + static_cast<ptrdiff_t>(n), ByLogitDesc{});
      std::sort(lo, mid, ByLogitDesc{});
    }
    for (; done < k; ++done) {
      cum += cands_[done].weight;
      if (cum >= params_.top_p * total) return done + 1;  // the token that crosses top_p is kept
    }
    if (k == n) return n;
    k = std::min(n, k * 4);
  }
}

int32_t Sampler::draw(size_t n) {
  KILN_ASSERT(n > 0);
  double total = 0.0;
  for (size_t i = 0; i < n; ++i) total += cands_[i].weight;
  const double u = uniform01(rng_) * total;
  double cum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    cum += cands_[i].weight;
    if (u < cum) return cands_[i].id;
  }
  return cands_[n - 1].id;  // u rounded up to total
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
