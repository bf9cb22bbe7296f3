// kiln convert HF_DIR OUT.gguf [--type f32|f16|bf16|q8_0] [-t N]: a Hugging Face folder as a GGUF file.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "cli_util.h"
#include "commands.h"
#include "kiln/convert.h"

namespace kiln::cli {
namespace {

Status run_convert(ConvertOptions opt) {
  const auto t0 = std::chrono::steady_clock::now();
  if (isatty(fileno(stderr))) {  // a progress line on a terminal; logs get the summary only
    opt.progress = [](size_t done, size_t total) {
      std::fprintf(stderr, "\rconvert: %zu/%zu tensors", done, total);
      if (done == total) std::fprintf(stderr, "\n");
    };
  }
  KILN_ASSIGN_OR_RETURN(const ConvertStats st, convert_model(opt));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "convert: wrote %s (%s, %zu tensors, %.1f MiB of weights) in %.1f s\n",
               opt.output.c_str(), st.architecture.c_str(), st.n_tensors,
               static_cast<double>(st.tensor_bytes) / (1 << 20), s);
  return Status();
}

}  // namespace

void register_convert(CLI::App& app, int& rc) {
  auto opt = std::make_shared<ConvertOptions>();
  CLI::App* cmd = app.add_subcommand("convert", "Convert a Hugging Face model folder to a GGUF file");
  cmd->add_option("input", opt->input, "The Hugging Face folder (config.json, *.safetensors, tokenizer.json)")
      ->required();
  cmd->add_option("output", opt->output, "The GGUF file to write")->required();
  cmd->add_option("--type", opt->type,
                  "Weight type: f32, f16, bf16, q8_0 (default: as stored; 1-d tensors and routers stay f32)");
  cmd->add_option("-t,--threads", opt->threads,
                  "CPU threads that cast the weights (default: physical cores)");
  cmd->callback([opt, &rc] {
    Status s = run_convert(*opt);
    if (!s.ok()) rc = report_error("convert", s);
  });
}

}  // namespace kiln::cli
