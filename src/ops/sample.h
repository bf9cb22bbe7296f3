// Token sampling as an op: the per-row parameters ops::Sample reads, the counter-based uniform every device
// draws from, and the scalar reference of one row (the oracle of every backend's Sample).
//
// One row, in this order (each stage sees the output of the one before):
//   1. raw logits x: a NaN or +inf, or nothing above -inf -> token kSampleBadLogits.
//   2. adjusted logits a: for each SampleAdjust entry of the row, a = x + bias; when count > 0, a = (a > 0 ?
//      a / repeat_penalty : a * repeat_penalty) - frequency_penalty * count - presence_penalty; banned: -inf.
//      Every other token: a = x. Then a row with a mask (mask_row >= 0): every token whose bit is 0 -> -inf,
//      as a ban (its adjusted value is not looked at). A NaN or +inf a -> kSampleBadAdjusted; every a == -inf
//      -> kSampleAllMasked.
//   3. the order: a descending, ties by ascending id (a strict total order; every stage below keeps a prefix
//      of it, so the kept set is always a prefix of the order).
//   4. temperature == 0: the first token of the order (greedy; stages 5-8 are skipped).
//   5. top-k (0 < top_k): the first min(top_k, n) tokens.
//   6. weights w = expf((a - a_max) / temperature) (f32; 1 for the best token); top-p (top_p < 1): the
//      shortest prefix whose cumulative weight (in order, summed in f64) is >= top_p * (sum of the kept).
//   7. min-p (min_p > 0): the kept tokens with w >= min_p.
//   8. the draw: u = sample_uniform(seed, counter) in [0, 1); the first kept token (in order) whose
//      cumulative weight is > u * (sum of the kept).
//   9. report: logprob = x[token] - logsumexp(x) (raw logits, sum in f64), and the n_top best raw logits
//      (order of x, ties by ascending id) with theirs.
// A backend may sum the weights in another order (a GPU reduces in parallel), so a token can differ from this
// reference only where a cumulative sum lands within rounding of its threshold.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ops/host_device.h"
#include "ops/ops.h"

namespace kiln::ops {

inline constexpr int32_t kSampleMaxTop = 20;  // SampleRow::n_top at most

// Tokens Sample writes for a row it cannot draw from.
inline constexpr int32_t kSampleBadLogits = -1;    // a raw logit is NaN or +inf, or all are -inf
inline constexpr int32_t kSampleBadAdjusted = -2;  // logit_bias or a penalty made a logit NaN or +inf
inline constexpr int32_t kSampleAllMasked = -3;    // every token is -inf after the adjustments

// One row's parameters: 16 32-bit words (ops::Sample::rows is i32 [16, rows]).
struct SampleRow {
  float temperature = 0.0f;  // >= 0; 0: greedy
  int32_t top_k = 0;         // <= 0: off
  float top_p = 1.0f;        // (0, 1]; 1: off
  float min_p = 0.0f;        // [0, 1]; 0: off
  float repeat_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint32_t seed_lo = 0, seed_hi = 0;  // the request's seed
  uint32_t counter = 0;               // the draw: how many tokens the request sampled before this one
  int32_t adjust_begin = 0;           // the row's entries in Sample::adjust: [begin, begin + count)
  int32_t adjust_count = 0;
  int32_t n_top = 0;  // raw top logprobs to report, 0..kSampleMaxTop (<= Sample::out's room)
  int32_t logprobs =
      0;  // 1: report the token's logprob (stage 9; implied by n_top > 0). 0: out's logprob is 0
  int32_t mask_row = -1;  // the row's allowed tokens: a row of Sample::mask (< its rows); -1: every token
  int32_t reserved = 0;
};
static_assert(sizeof(SampleRow) == 16 * 4);

// A token whose logit a row changes (entries of a row: ascending, distinct ids).
struct SampleAdjust {
  int32_t id = 0;
  float bias = 0.0f;   // added first (logit_bias)
  int32_t count = 0;   // occurrences in the penalty window; > 0: the penalties apply
  int32_t banned = 0;  // 1: -inf after everything (a token min_tokens holds back)
};
static_assert(sizeof(SampleAdjust) == 4 * 4);

// A uniform double in [0, 1) from (seed, counter) alone: a SplitMix64-style hash, so that a draw depends on
// the request and its token index, not on what else shares the step or on the device (the CUDA kernel calls
// these on the device).
KILN_HOST_DEVICE constexpr uint64_t sample_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
KILN_HOST_DEVICE constexpr double sample_uniform(uint64_t seed, uint32_t counter) {
  const uint64_t h = sample_mix64(sample_mix64(seed + 0x9E3779B97F4A7C15ull) ^
                                  (static_cast<uint64_t>(counter) * 0xD1B54A32D192ED03ull));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

// Stage 2 for one token: x with the entry's changes.
float sample_adjusted(float x, const SampleRow& p, const SampleAdjust& e);

// What one row came to.
struct SampleOut {
  int32_t token = kSampleBadLogits;
  float logprob = 0.0f;
  int32_t n_top = 0;
  int32_t top_id[kSampleMaxTop] = {};
  float top_logprob[kSampleMaxTop] = {};
};

// Whether a mask allows token id (words: [ceil(n_vocab / 32)]; empty: every token is allowed).
KILN_HOST_DEVICE inline bool sample_mask_allows(const uint32_t* words, int64_t id) {
  return ((words[id >> 5] >> (id & 31)) & 1u) != 0;
}

// The scalar reference of one row (full sort; the oracle). x: the row's raw logits; adjust: the row's
// entries; mask: the row's allowed tokens, [ceil(x.size() / 32)] words, or empty (none).
SampleOut sample_row_reference(std::span<const float> x, const SampleRow& p,
                               std::span<const SampleAdjust> adjust, std::span<const uint32_t> mask = {});

// The same result by partial selection (about one pass over the row for typical logits): what the CPU runs.
// scratch: reused between calls (sized by the call).
struct SampleScratch {
  struct Cand {
    uint64_t key;  // the order of stage 3 as one integer: larger first
    float w;       // the weight of stage 6
  };
  std::vector<float> a;        // [n] adjusted logits
  std::vector<float> w;        // [n] their weights
  std::vector<int32_t> at;     // [n] each token's segment of a
  std::vector<double> mass;    // each segment's weight
  std::vector<int32_t> count;  // each segment's tokens
  std::vector<int32_t> first;  // where each gathered segment starts in cands
  std::vector<Cand> cands;     // the gathered segments, each sorted
};
SampleOut sample_row(std::span<const float> x, const SampleRow& p, std::span<const SampleAdjust> adjust,
                     SampleScratch& scratch, std::span<const uint32_t> mask = {});

// Whether the op has a mask tensor (Sample::mask).
bool sample_op_has_mask(const Sample& op);
// Host access to an op whose tensors the host can read (the CPU backend, the reference): row r's
// parameters, its adjust entries, its mask (empty: none), and writing its result into out's row r.
SampleRow sample_op_row(const Sample& op, int64_t r);
std::span<const SampleAdjust> sample_op_adjust(const Sample& op, const SampleRow& p);
std::span<const uint32_t> sample_op_mask(const Sample& op, const SampleRow& p);
void write_sample_out(const Sample& op, int64_t r, const SampleOut& o);

}  // namespace kiln::ops
