// rope_freq(): the angle and magnitude of each rotated pair, shared by the reference, the CPU backend and the
// CUDA kernels (compiled for the device too), so that every backend computes the same angles in double.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>

#include "ops/host_device.h"
#include "ops/ops.h"

namespace kiln::ops {

// The frequency of rotated pair i (0 <= i < n_rot/2) and the magnitude scale for cos/sin, after scaling and
// the pair's freq_factor (1 without factors).
KILN_HOST_DEVICE inline RopeFreq rope_freq(const RopeParams& p, int32_t i, float freq_factor) {
  const double d = p.n_rot;
  const double base_freq = std::pow(static_cast<double>(p.freq_base), -2.0 * i / d);
  double freq = base_freq;
  double mscale = 1.0;
  switch (p.scaling) {
    case RopeScaling::rope_scaling_none: break;
    case RopeScaling::rope_scaling_linear: freq = base_freq / p.factor; break;
    case RopeScaling::rope_scaling_yarn: {
      // The dims whose wavelength completes between beta_slow and beta_fast turns over the original context
      // blend interpolated (freq / factor) and original frequencies linearly.
      const double two_pi = 2.0 * std::numbers::pi;
      const double log_base = 2.0 * std::log(static_cast<double>(p.freq_base));
      auto dim_of = [&](double rotations) {
        return d * std::log(p.original_context / (rotations * two_pi)) / log_base;
      };
      double low = fmax(0.0, std::floor(dim_of(p.beta_fast)));  // fmax / fmin: callable on the device
      double high = fmin(d - 1.0, std::ceil(dim_of(p.beta_slow)));
      if (high == low) high += 0.001;
      const double ramp = fmin(fmax((i - low) / (high - low), 0.0), 1.0);
      const double extrapolate = 1.0 - ramp;
      freq = base_freq / p.factor * (1.0 - extrapolate) + base_freq * extrapolate;
      mscale = p.factor > 1.0f ? 0.1 * std::log(static_cast<double>(p.factor)) + 1.0 : 1.0;
      break;
    }
  }
  freq /= freq_factor;
  return {static_cast<float>(freq), static_cast<float>(mscale * p.attn_factor)};
}

}  // namespace kiln::ops
