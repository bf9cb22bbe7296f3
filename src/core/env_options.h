// What the core reads from the environment, read once (at first use) into one typed struct; the only place in
// core/ that reads it.
// - KILN_LOG_LEVEL=debug|info|warn|error|off: the log level a process starts at (default info).
// - KILN_THREADS=N (N > 0): the thread count a pool gets when it is asked for the default (default: the
//   physical cores, default_thread_count()).
#pragma once

#include <string>

namespace kiln {

struct CoreEnvOptions {
  std::string log_level;  // KILN_LOG_LEVEL as given ("" when unset)
  int threads = 0;        // KILN_THREADS when a positive number, else 0
};

// The values, read from the environment the first time this is called.
const CoreEnvOptions& core_env_options();

}  // namespace kiln
