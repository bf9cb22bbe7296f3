// Helpers shared by the subcommands: the default model, printing errors.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"
#include "kiln/kiln.h"

namespace kiln::cli {

// --spec, --draft-model, --draft-max and --draft-p-min (EngineOptions::speculation and the draft_* fields),
// for run, chat, bench and serve.
struct SpecOptions {
  std::string spec;
  std::string draft_model;
  int32_t draft_max = 8;
  float draft_p_min = 0.5f;
  bool draft_always = false;
  void apply(EngineOptions& eo) const;
};
void add_spec_options(CLI::App& cmd, SpecOptions& o);

// --tensor-parallel N (-tp N: main.cpp), EngineOptions::tensor_parallel, for run, bench, serve and
// perplexity.
void add_tensor_parallel_option(CLI::App& cmd, int32_t& tensor_parallel);

// --kv-type T, EngineOptions::kv_type, for run, bench, serve and perplexity.
void add_kv_type_option(CLI::App& cmd, std::string& kv_type);

// The whole text of `path`, a regular file that can be read; errors name the path.
Result<std::string> read_text_file(const std::string& path);

// ${KILN_MODELS_DIR:-${XDG_CACHE_HOME:-~/.cache}/kiln/models}
std::string models_dir();
// The default model (SmolLM2-135M-Instruct Q4_1) inside models_dir().
std::string default_model_path();
// `path` when given, else the default model; an error (naming the setup script) when it does not exist.
Result<std::string> resolve_model_path(const std::string& path);

// A size in bytes: a number with an optional fraction and an optional unit K, M, G or T (powers of 1024; "B",
// "iB" after the unit and lower case are accepted): "512M", "2G", "1.5GiB", "1048576". invalid_argument
// naming `text` for anything else, zero, a negative number, or more than 2^63 bytes.
Result<uint64_t> parse_byte_size(std::string_view text);

// Prints "kiln <cmd>: error: <message>" to stderr and returns the exit code for it.
int report_error(const char* cmd, const Status& status);

}  // namespace kiln::cli
