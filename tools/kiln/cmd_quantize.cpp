// kiln quantize IN OUT TYPE [options]: a GGUF file or Hugging Face folder written as a GGUF file of a
// llama.cpp file type, with llama-quantize's options under the same names.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "kiln/quantize.h"
#include "quant/quant_mix.h"

namespace kiln::cli {
namespace {

struct QuantizeArgs {
  QuantizeOptions opt;
  std::string in;         // IN
  std::string out, type;  // OUT TYPE; with --dry-run also IN TYPE (`out` then holds the type)
};

double mib(uint64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s;
  for (int64_t d : shape) s += (s.empty() ? "" : ", ") + std::to_string(d);
  return "[" + s + "]";
}

// A bar redrawn in place on a terminal; one line per tensor otherwise (logs).
class Progress {
 public:
  explicit Progress(bool tty) : tty_(tty) {}
  void planned(const QuantizeStats& plan) { plan_ = plan; }
  void done(size_t i, uint64_t written) {
    const QuantizeTensor& t = plan_.tensors[i];
    const size_t n = plan_.tensors.size();
    if (!tty_) {
      std::fprintf(stderr, "[%4zu/%4zu] %-36s %-22s %6s -> %-7s %9.2f MiB -> %8.2f MiB\n", i + 1, n,
                   t.name.c_str(), shape_string(t.shape).c_str(), t.from.c_str(), t.to.c_str(),
                   mib(t.bytes_in), mib(t.bytes_out));
      return;
    }
    const double f = plan_.bytes_out == 0 ? 1.0 : static_cast<double>(written) / plan_.bytes_out;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(f * kWidth);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(kWidth, '.');
    std::fprintf(stderr, "\r\x1b[Kquantize: [%s] %3d%% %zu/%zu %s -> %s", bar.c_str(),
                 static_cast<int>(f * 100), i + 1, n, t.name.c_str(), t.to.c_str());
    if (i + 1 == n) std::fprintf(stderr, "\n");
  }

 private:
  bool tty_;
  QuantizeStats plan_;
};

void print_plan(const QuantizeStats& plan) {
  for (const QuantizeTensor& t : plan.tensors) {
    std::printf("%-40s %-22s %-7s -> %-7s %9.2f MiB -> %8.2f MiB%s%s\n", t.name.c_str(),
                shape_string(t.shape).c_str(), t.from.c_str(), t.to.c_str(), mib(t.bytes_in),
                mib(t.bytes_out), t.note.empty() ? "" : "  ", t.note.c_str());
  }
}

Status run_quantize(QuantizeArgs& args) {
  QuantizeOptions& opt = args.opt;
  opt.input = args.in;
  if (!args.type.empty()) {
    opt.output = args.out, opt.type = args.type;
  } else if (opt.dry_run) {
    opt.type = args.out;
  } else {
    return invalid_argument("expected IN OUT TYPE (IN TYPE with --dry-run)");
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto progress = std::make_shared<Progress>(isatty(fileno(stderr)) != 0);
  QuantizeEvents ev;
  ev.planned = [progress](const QuantizeStats& plan, const std::vector<std::string>& warnings) {
    for (const std::string& w : warnings) std::fprintf(stderr, "quantize: warning: %s\n", w.c_str());
    progress->planned(plan);
  };
  ev.tensor_done = [progress](size_t i, uint64_t written) { progress->done(i, written); };
  KILN_ASSIGN_OR_RETURN(const QuantizeStats st, quantize_model(opt, ev));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (opt.dry_run) print_plan(st);
  const double n = st.n_elements == 0 ? 1.0 : static_cast<double>(st.n_elements);
  std::fprintf(stderr, "quantize: %s %s as %s (%s): %zu tensors, %zu converted, %zu copied%s\n",
               opt.dry_run ? "would write" : "wrote", opt.dry_run ? opt.input.c_str() : opt.output.c_str(),
               st.file_type.c_str(), st.architecture.c_str(), st.tensors.size(), st.n_converted,
               st.tensors.size() - st.n_converted, st.used_imatrix ? ", with an importance matrix" : "");
  if (st.n_gptq > 0) {
    std::fprintf(stderr, "quantize: tensors rounded by GPTQ (the others as without --method): %zu\n",
                 st.n_gptq);
  }
  if (st.n_requantized > 0) {
    std::fprintf(stderr, "quantize: tensors quantized already (dequantized to f32, then requantized): %zu\n",
                 st.n_requantized);
  }
  if (st.n_fallback > 0) {
    std::fprintf(
        stderr,
        "quantize: tensors that took a fallback type (rows not whole blocks of the mix's type): %zu\n",
        st.n_fallback);
  }
  std::fprintf(stderr, "quantize: %.2f MiB -> %.2f MiB, %.2f -> %.2f bits per weight, in %.1f s\n",
               mib(st.bytes_in), mib(st.bytes_out), st.bytes_in * 8.0 / n, st.bytes_out * 8.0 / n, s);
  return Status();
}

std::string types_footer() {
  std::string s = "Types (TYPE, case-insensitive; Q3_K, Q4_K, Q5_K: the _M mixes):\n";
  for (const quant::FileTypeInfo& f : quant::file_types()) {
    char line[160];
    std::snprintf(line, sizeof line, "  %-8s %2u  %s\n", f.name, static_cast<unsigned>(f.type), f.about);
    s += line;
  }
  return s;
}

}  // namespace

void register_quantize(CLI::App& app, int& rc) {
  auto args = std::make_shared<QuantizeArgs>();
  QuantizeOptions& o = args->opt;
  CLI::App* cmd = app.add_subcommand(
      "quantize",
      "Quantize a model to a GGUF file of a llama.cpp file type (the same file llama-quantize writes)");
  cmd->add_option("IN", args->in, "A GGUF file or a Hugging Face folder")->required();
  cmd->add_option("OUT", args->out, "The GGUF file to write (left out with --dry-run)")->required();
  cmd->add_option("TYPE", args->type, "The file type (below)");
  cmd->add_option(
      "--imatrix", o.imatrix,
      "Importance matrix (kiln imatrix / llama-imatrix file): weights each column's rounding error; "
      "required by IQ1/IQ2/IQ3_XXS/IQ3_XS and Q2_K_S");
  cmd->add_option("--tensor-type", o.tensor_types,
                  "PATTERN=TYPE: tensors whose name the regex matches (anywhere) as TYPE, e.g. attn_v=q8_0; "
                  "repeatable, the first match wins");
  cmd->add_option("--output-tensor-type", o.output_tensor_type, "Type of output.weight (e.g. q8_0)");
  cmd->add_option("--token-embedding-type", o.token_embedding_type, "Type of token_embd.weight (e.g. q8_0)");
  cmd->add_flag(
      "--allow-requantize", o.allow_requantize,
      "Quantize an already quantized model (dequantized first; worse than quantizing the f16 model)");
  cmd->add_flag("--leave-output-tensor", o.leave_output_tensor, "Keep output.weight as it is");
  cmd->add_flag("--pure", o.pure, "Every weight matrix the type's base type: no mix");
  cmd->add_flag("--dry-run", o.dry_run,
                "Print each tensor's type and size, write nothing (OUT may be left out)");
  cmd->add_flag("--force", o.force, "Replace OUT if it exists (never the input)");
  cmd->add_option("--method", o.method,
                  "gptq: round the weight matrices column by column with error feedback through the inverse "
                  "Hessian of their inputs (needs --imatrix from kiln imatrix --full); the same GGUF types");
  cmd->add_option("--gptq-damp", o.gptq_damp, "GPTQ's dampening, a fraction of mean(diag H) (default 0.01)");
  cmd->add_flag(
      "!--gptq-no-act-order", o.gptq_act_order,
      "GPTQ in column order (by default its blocks, and the columns within a block, go by decreasing "
      "diag(H))");
  cmd->add_option("-t,--threads", o.threads, "CPU threads (default: physical cores; the file is the same)");
  cmd->footer(types_footer());
  cmd->callback([args, &rc] {
    Status s = run_quantize(*args);
    if (!s.ok()) rc = report_error("quantize", s);
  });
}

}  // namespace kiln::cli
