// kiln: one binary, one subcommand per job. Each subcommand lives in its own file (cmd_<name>.cpp)
// and registers itself through commands.h.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "commands.h"
#include "kiln/version.h"

int main(int argc, char** argv) {
  CLI::App app{"kiln: run, optimize, evaluate and serve large language models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "kiln " KILN_VERSION_STRING);
  int rc = 0;
  kiln::cli::register_inspect(app, rc);
  kiln::cli::register_tokenize(app, rc);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return rc;
}
