// Matmul offload of a split model's host layers (llama.cpp's "op offload"): under partial offload the later
// layers' weights live in host memory, and a prompt's step on the CPU would be bound by the CPU's arithmetic.
// run_offloading() runs such a step's program on the host backend, except its matmuls of at least
// `min_tokens` tokens on host-resident weights: those go to the device backend, with their weights uploaded
// for the step (the PCIe link is much faster than the CPU's matmuls at that size), x uploaded once for the
// matmuls that share it and each result downloaded into its host tensor. OffloadRunner is what the engine
// hands a split model for it (ModelOptions::host_stage).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "backends/backend.h"
#include "core/status.h"
#include "models/model.h"
#include "ops/program.h"

namespace kiln {

// Where the time of offloading steps goes, by host clocks: the host backend's ops, the weights' uploads (a
// copy from pageable memory holds the thread while it stages), the device's runs (x up, the matmuls, the
// products down, the wait for them).
struct OffloadProfile {
  int64_t steps = 0, runs = 0;
  double host_ms = 0, device_ms = 0;
  double stage_ms = 0;  // copying weights into staging, alongside the rest (its own thread)
  double wait_ms = 0;   // the step waiting for weights: for staging, or for a pageable upload to stage
  uint64_t weight_bytes = 0, activation_bytes = 0;  // weights up; x up and products down
  std::string summary() const;
};

// What run_offloading keeps from one step to the next.
struct OffloadScratch {
  // The weights go up through page-locked staging, copied into it from their pages by a thread of its own
  // (itself splitting each copy over several), one run of matmuls ahead of the device, while the host runs
  // its ops; false: straight from their pages, each upload holding the step while the driver stages it.
  bool stage_weights = true;
  std::array<std::unique_ptr<Buffer>, 2> staging;  // grown to the largest run's weights
};

// Runs `program` (recorded for `host`) in order: runs of consecutive matmuls that qualify on `device`, every
// other op on `host`. Waits for the device after each run of matmuls. The results are those of the device's
// matmul (at its precision: Backend::fast_tolerance) in place of the host's. `profile`, when given, adds this
// step's times.
Status run_offloading(const Program& program, Backend& host, Backend& device, int32_t min_tokens,
                      OffloadScratch& scratch, OffloadProfile* profile = nullptr);

// Whether `op` qualifies: a Matmul of at least `min_tokens` columns whose weight is in host memory (not in a
// backend buffer), x an f32 matrix and dst an f32 matrix, both contiguous.
bool offloadable(const ops::Op& op, int32_t min_tokens);

struct OffloadOptions {
  int32_t min_tokens = 32;     // the fewest tokens of a step whose matmuls go to the device (> 0)
  bool stage_weights = true;   // OffloadScratch::stage_weights
  bool print_profile = false;  // the OffloadProfile to stderr when the runner goes (KILN_STEP_PROFILE=1)
};

// The host stage of a split model (the first backend a device, the second the host): steps of at least
// min_tokens tokens through run_offloading(), the others on the host alone.
class OffloadRunner final : public HostStageRunner {
 public:
  explicit OffloadRunner(const OffloadOptions& options);
  ~OffloadRunner() override;
  Status run(const Program& program, Backend& host, Backend& device) override;
  size_t scratch_bytes() const override;

 private:
  OffloadOptions options_;
  OffloadScratch scratch_;
  OffloadProfile profile_;
};

}  // namespace kiln
