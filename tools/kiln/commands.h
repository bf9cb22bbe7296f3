// Subcommand registration: each adds its CLI11 subcommand to `app` and, when it runs, sets `rc`.
#pragma once

#include <CLI/CLI.hpp>

namespace kiln::cli {

void register_inspect(CLI::App& app, int& rc);
void register_tokenize(CLI::App& app, int& rc);
void register_run(CLI::App& app, int& rc);
void register_chat(CLI::App& app, int& rc);
void register_convert(CLI::App& app, int& rc);
void register_quantize(CLI::App& app, int& rc);
void register_bench(CLI::App& app, int& rc);
void register_serve(CLI::App& app, int& rc);
void register_perplexity(CLI::App& app, int& rc);
void register_imatrix(CLI::App& app, int& rc);
// kiln bench serve, a subcommand of kiln bench.
void register_bench_serve(CLI::App& bench, int& rc);

}  // namespace kiln::cli
