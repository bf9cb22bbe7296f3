#include "runtime/spec_control.h"

#include <algorithm>
#include <bit>
#include <utility>

namespace kiln {

void SpecControl::Rate::add(double v) {
  last[static_cast<size_t>(steps % kWindow)] = v;
  ++steps;
}

double SpecControl::Rate::value() const {
  const auto n = static_cast<size_t>(std::min<int64_t>(steps, kWindow));
  std::array<double, kWindow> v = last;
  for (size_t i = 1; i < n; ++i) {  // insertion sort of at most kWindow values
    for (size_t j = i; j > 0 && v[j - 1] > v[j]; --j) std::swap(v[j - 1], v[j]);
  }
  return n == 0 ? 0.0 : n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int SpecControl::class_of(int32_t n_decoding) {
  const auto n = static_cast<uint32_t>(std::max(n_decoding, 1));
  return std::min(kClasses - 1, static_cast<int>(std::bit_width(n)) - 1);
}

bool SpecControl::choose(int32_t n_decoding) {
  Class& c = classes_[static_cast<size_t>(class_of(n_decoding))];
  // Each mode's first steps measure it: drafting first.
  if (c.rate[1].steps < kTrySteps) return true;
  if (c.rate[0].steps < kTrySteps) return false;
  if (c.trying > 0) {
    --c.trying;
    return !c.best;
  }
  if (++c.since_try >= c.interval) {
    c.since_try = 0;
    c.trying = kTrySteps - 1;
    return !c.best;
  }
  return c.best;
}

bool SpecControl::favours(int32_t n_decoding) const {
  const Class& c = classes_[static_cast<size_t>(class_of(n_decoding))];
  return c.best && c.rate[1].steps >= kTrySteps && c.rate[0].steps >= kTrySteps;
}

void SpecControl::record(int32_t n_decoding, bool drafted, int64_t tokens, double seconds) {
  if (tokens <= 0 || seconds <= 0) return;
  Class& c = classes_[static_cast<size_t>(class_of(n_decoding))];
  c.rate[drafted ? 1 : 0].add(static_cast<double>(tokens) / seconds);
  if (c.rate[0].steps < kTrySteps || c.rate[1].steps < kTrySteps) return;
  const double drafting = c.rate[1].value(), plain = c.rate[0].value();
  const bool best = c.best ? drafting * kMargin >= plain : drafting > plain * kMargin;
  if (best != c.best) {
    c.best = best;
    c.interval = kMinInterval;
    c.since_try = 0;
  } else if (drafted != c.best && c.trying == 0) {
    // The last step of a try, and the other mode is still the faster: try it less often.
    c.interval = std::min(2 * c.interval, kMaxInterval);
  }
}

}  // namespace kiln
