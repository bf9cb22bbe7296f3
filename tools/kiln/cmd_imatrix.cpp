// kiln imatrix -m MODEL -f TEXT [-o imatrix.gguf]: an importance matrix for quantization, as llama.cpp's
// llama-imatrix computes it (kiln/imatrix.h). stdout: the running perplexity after each chunk and the final
// estimate, as llama-imatrix prints them; stderr: progress with an ETA, then what was written.
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "kiln/imatrix.h"

namespace kiln::cli {
namespace {

struct ImatrixCli {
  ImatrixOptions o;
  std::string model;
  bool no_ppl = false;
};

Status run_imatrix(ImatrixCli& cli) {
  ImatrixOptions o = cli.o;
  o.compute_ppl = !cli.no_ppl;
  if (!o.text_file.empty()) {
    KILN_ASSIGN_OR_RETURN(o.model, resolve_model_path(cli.model));
  }
  const bool tty = isatty(fileno(stderr)) != 0;
  size_t printed = 0;  // chunk perplexities already on stdout
  o.progress = [&](const ImatrixProgress& p) {
    for (; printed < p.chunk_ppl.size(); ++printed)
      std::printf("%s[%zu]%.4f", printed == 0 ? "" : ",", printed + 1, p.chunk_ppl[printed]);
    std::fflush(stdout);
    const double eta =
        p.seconds / static_cast<double>(p.chunks_done) * static_cast<double>(p.n_chunks - p.chunks_done);
    std::fprintf(stderr, "%simatrix: %lld/%lld chunks in %.1f s, ETA %d min %02d s", tty ? "\r" : "",
                 static_cast<long long>(p.chunks_done), static_cast<long long>(p.n_chunks), p.seconds,
                 static_cast<int>(eta) / 60, static_cast<int>(eta) % 60);
    std::fprintf(stderr, tty && p.chunks_done < p.n_chunks ? "" : "\n");
  };
  KILN_ASSIGN_OR_RETURN(const ImatrixStats st, compute_imatrix(o));
  if (st.chunks > 0 && o.compute_ppl)
    std::printf("\nFinal estimate: PPL = %.4f +/- %.5f\n", st.ppl, st.ppl_error);
  if (st.chunks > 0) {
    std::fprintf(stderr, "imatrix: %s on %s: %lld chunks of %d tokens (of %lld in the text), %.1f tokens/s\n",
                 st.model_name.c_str(), st.device.c_str(), static_cast<long long>(st.chunks), o.chunk_size,
                 static_cast<long long>(st.text_tokens), st.tokens_per_second);
  }
  if (st.partial > 0) {
    std::fprintf(stderr, "imatrix: %lld weights have experts that no token reached (count 0)\n",
                 static_cast<long long>(st.partial));
  }
  std::fprintf(stderr, "imatrix: wrote %s (%lld weights)\n", o.output.c_str(),
               static_cast<long long>(st.entries));
  return Status::ok_status();
}

}  // namespace

void register_imatrix(CLI::App& app, int& rc) {
  auto cli = std::make_shared<ImatrixCli>();
  ImatrixOptions& o = cli->o;
  CLI::App* cmd = app.add_subcommand(
      "imatrix",
      "An importance matrix for quantization from a calibration text (as llama.cpp's llama-imatrix)");
  cmd->add_option("-m,--model", cli->model,
                  "A GGUF file or a Hugging Face folder (default: the default model)");
  cmd->add_option("-f,--file", o.text_file, "The calibration text");
  cmd->add_option("-o,--output", o.output, "The imatrix GGUF file to write (replaced whole when it exists)")
      ->capture_default_str();
  cmd->add_option("-c,--ctx-size", o.chunk_size, "Tokens a chunk")
      ->check(CLI::Range(2, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--chunks", o.max_chunks, "Chunks at most (default: all the text holds)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option(
      "-d,--device", o.device,
      "Where the model runs: cpu, cuda or cuda:N (default: CUDA device 0 when there is one, else cpu)");
  cmd->add_option("-t,--threads", o.threads, "CPU threads (default: physical cores)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--output-frequency", o.output_frequency,
                  "Also write the output every N chunks (0: at the end only; with --full, at the end only)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  cmd->add_option(
      "--in-file", o.in_files,
      "An imatrix file (GGUF or legacy .dat) whose sums are added; repeatable. Without -f, the files "
      "are only combined (a legacy file becomes a GGUF one)");
  cmd->add_flag("--process-output", o.process_output, "Also collect the output head's input (output.weight)");
  cmd->add_flag(
      "--full", o.full,
      "Also each weight's Gram matrix of inputs (X^T X), for kiln quantize --method gptq; n^2 floats a "
      "weight of n columns on the device, summed in f32 over the run");
  cmd->add_flag("--no-ppl", cli->no_ppl, "Do not compute the perplexity");
  cmd->add_flag("--exact", o.exact, "Exact f32 matmuls (default: the fast path, as kiln run)");
  cmd->callback([cli, &rc] {
    if (Status s = run_imatrix(*cli); !s.ok()) rc = report_error("imatrix", s);
  });
}

}  // namespace kiln::cli
