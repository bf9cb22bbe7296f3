// What the runtime reads from the environment, read once (at first use) into one typed struct; the only place
// in runtime/ that reads it. Models never read the environment: the engine hands them values (ModelOptions).
// - KILN_STEP_PROFILE=1: where the engine thread's time goes per kind of step, and under partial offload
//   where the offloaded steps' time goes, printed to stderr when the engine stops.
#pragma once

namespace kiln {

struct RuntimeEnvOptions {
  bool step_profile = false;  // KILN_STEP_PROFILE=1
};

// The values, read from the environment the first time this is called.
const RuntimeEnvOptions& runtime_env_options();

}  // namespace kiln
