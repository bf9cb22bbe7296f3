// SpecControl: whether a decode step drafts, from what drafting has bought so far. Speculation pays when the
// tokens its drafts add outweigh what drafting and checking them cost, and that depends on the hardware (how
// much a step of k + 1 rows costs beside one of one), the drafter (a draft model's passes are not free), the
// text (how often drafts are kept) and the batch (a full batch is already compute-bound). None of these is
// known in advance, so the engine measures: for decode-only steps it keeps the rate of generated tokens per
// second with drafts and without, per batch size class, and drafts when that has been the faster. The slower
// mode is tried again now and then, at intervals that double while it stays slower (so a mode that loses
// costs ever less), and fall back to the shortest when the choice flips.
#pragma once

#include <array>
#include <cstdint>

namespace kiln {

class SpecControl {
 public:
  // Steps between tries of the slower mode: from kMinInterval, doubling to kMaxInterval.
  static constexpr int32_t kMinInterval = 8, kMaxInterval = 512;
  // Steps each mode takes in a row when tried, so one noisy step does not decide.
  static constexpr int32_t kTrySteps = 3;
  // The other mode must be this much faster to become the choice: two modes within noise keep the current
  // one.
  static constexpr double kMargin = 1.03;

  // Whether a decode step of `n_decoding` requests should draft.
  bool choose(int32_t n_decoding);
  // Whether drafting has been measured the faster mode for `n_decoding` requests (false until both modes
  // were), without taking a step of the try schedule: for the steps that compute prompts, which prompt
  // lookup's drafts ride along only where drafting pays in the decode steps beside them. A class whose
  // decode steps cannot draft (a GPU's 64 rows, all taken by requests) never favours it: there, drafts
  // riding along prompt steps put requests out of step, so that more, smaller prompt steps followed.
  bool favours(int32_t n_decoding) const;
  // A decode-only step of `n_decoding` requests, with drafts or not as choose() said, made `tokens` tokens
  // in `seconds` (drafting included).
  void record(int32_t n_decoding, bool drafted, int64_t tokens, double seconds);

 private:
  // A mode's rate: the median of its last kWindow steps' tokens per second. A median, not a mean: a step
  // slowed by something else (a graph captured, a request admitted, a delivery thread descheduled) must not
  // make the faster mode look slower, and a try of kTrySteps steps still moves it.
  static constexpr int kWindow = 5;
  struct Rate {
    std::array<double, kWindow> last{};  // ring of the newest steps' rates
    int64_t steps = 0;
    void add(double v);
    double value() const;
  };
  struct Class {
    std::array<Rate, 2> rate;  // [drafted]
    bool best = true;          // the mode that has been faster (drafting, until measured)
    int32_t interval = kMinInterval;
    int32_t since_try = 0;  // steps of `best` since the other mode was last tried
    int32_t trying = 0;     // steps left of the try in progress (of !best)
  };
  // Batch size classes: 1, 2-3, 4-7, ..., 64 and more.
  static constexpr int kClasses = 8;
  static int class_of(int32_t n_decoding);
  std::array<Class, kClasses> classes_;
};

}  // namespace kiln
