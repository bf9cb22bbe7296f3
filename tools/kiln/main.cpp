// kiln: one binary, one subcommand per job. Each subcommand lives in its own file (cmd_<name>.cpp) with a
// register_<name>() declared in commands.h, called below: one line per subcommand.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "formats/mmap.h"
#include "formats/output_file.h"
#include "kiln/version.h"

int main(int argc, char** argv) {
  CLI::App app{"kiln: run, optimize, evaluate and serve large language models", "kiln"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "kiln " KILN_VERSION_STRING);
  kiln::install_output_cleanup_handlers();    // an interrupted convert or quantize leaves no temporary file
  kiln::install_mapped_file_fault_handler();  // a model file cut short while in use: an error, not SIGBUS
  int rc = 0;
  kiln::cli::register_run(app, rc);
  kiln::cli::register_chat(app, rc);
  kiln::cli::register_inspect(app, rc);
  kiln::cli::register_tokenize(app, rc);
  kiln::cli::register_convert(app, rc);
  kiln::cli::register_quantize(app, rc);
  kiln::cli::register_bench(app, rc);
  kiln::cli::register_serve(app, rc);
  kiln::cli::register_perplexity(app, rc);
  kiln::cli::register_imatrix(app, rc);
  if (argc == 1) {
    std::fputs(app.help().c_str(), stderr);
    return 2;
  }
  // llama.cpp's spelling of --gpu-layers and vLLM's of --tensor-parallel, which CLI11 cannot declare (one
  // dash, several letters).
  std::string gpu_layers = "--gpu-layers", tensor_parallel = "--tensor-parallel";
  std::vector<char*> args(argv, argv + argc);
  for (char*& a : args) {
    if (std::string_view(a) == "-ngl") a = gpu_layers.data();
    if (std::string_view(a) == "-tp") a = tensor_parallel.data();
  }
  try {
    app.parse(argc, args.data());
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; a usage error exits 2, as POSIX tools do.
    return app.exit(e) == 0 ? 0 : 2;
  }
  return rc;
}
