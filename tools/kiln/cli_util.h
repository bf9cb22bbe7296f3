// Helpers shared by the subcommands: the default model, printing errors.
#pragma once

#include <string>

#include "core/status.h"

namespace kiln::cli {

// ${KILN_MODELS_DIR:-${XDG_CACHE_HOME:-~/.cache}/kiln/models}
std::string models_dir();
// The default model (SmolLM2-135M-Instruct Q4_1) inside models_dir().
std::string default_model_path();
// `path` when given, else the default model; an error (naming the setup script) when it does not exist.
Result<std::string> resolve_model_path(const std::string& path);

// Prints "kiln <cmd>: error: <message>" to stderr and returns the exit code for it.
int report_error(const char* cmd, const Status& status);

}  // namespace kiln::cli
