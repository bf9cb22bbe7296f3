// kiln quantize IN OUT TYPE [options]: a GGUF file or Hugging Face folder written as a GGUF file of a
// llama.cpp file type, with llama-quantize's options under the same names.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "kiln/quantize.h"
#include "perplexity_kld.h"
#include "quant/fp8_folder.h"
#include "quant/imatrix_file.h"
#include "quant/quant_mix.h"

namespace kiln::cli {
namespace {

struct QuantizeArgs {
  QuantizeOptions opt;
  std::string in;               // IN
  std::string out, type;        // OUT TYPE; with --dry-run also IN TYPE (`out` then holds the type)
  double target_kld = 0.0;      // --target-kld: the mean KL divergence to meet, measured against kld_base
  std::string kld_base;         // --kld-base FILE (kiln perplexity --kl-divergence-base)
  std::string target_size;      // --target-size: bytes, with an optional K/M/G suffix
  std::string fp8_activations;  // --fp8-activations: "dynamic", "static" or "" (static with --imatrix)
};

double mib(uint64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s;
  for (int64_t d : shape) s += (s.empty() ? "" : ", ") + std::to_string(d);
  return "[" + s + "]";
}

// A bar redrawn in place on a terminal; one line per tensor otherwise (logs).
// A tensor rounded otherwise than planned (QuantizeEvents::note), on a line of its own.
void print_note(const std::string& note) {
  std::fprintf(stderr, "%squantize: note: %s\n", isatty(fileno(stderr)) != 0 ? "\r\x1b[K" : "", note.c_str());
}

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

// --target-kld: files of one bits-per-weight budget after another (--target-bpw), each scored against the
// base file, until the smallest that meets the target is found to within kBpwPrecision; that one becomes OUT.
// The next budget comes from the two tries that bracket the target, the KL divergence taken as exponential in
// the bits (each bit divides it by about 4); before a bracket, a step of that size from the last try.
constexpr double kBpwPrecision = 0.05, kMaxBpw = 8.5, kMinBpw = 2.0;
constexpr int kMaxTries = 10;

struct Try {
  double bpw = 0;
  double kld = 0;
  std::string path, plan;
  uint64_t bytes = 0;
};

Status search_kld(QuantizeArgs& args) {
  QuantizeOptions opt = args.opt;
  const double target = args.target_kld;
  if (!(target > 0.0) || !(target < 10.0))
    return invalid_argument("--target-kld {} is not in (0, 10)", target);
  if (opt.target_bpw != 0.0 || opt.target_size != 0 || !opt.plan.empty())
    return invalid_argument("--target-kld and --target-bpw, --target-size or --plan: give one of them");
  if (args.kld_base.empty()) {
    return invalid_argument(
        "--target-kld needs --kld-base FILE: the source's distributions over an evaluation text (kiln "
        "perplexity -m {} -f TEXT --kl-divergence-base FILE)",
        args.in);
  }
  if (opt.dry_run) return invalid_argument("--target-kld measures the files it writes: not with --dry-run");
  std::error_code ec;
  if (std::filesystem::exists(opt.output, ec) && !opt.force)
    return invalid_argument("'{}' exists (--force replaces it)", opt.output);
  // The mix's own size: the first try.
  QuantizeOptions dry = opt;
  dry.dry_run = true;
  dry.save_plan.clear();
  KILN_ASSIGN_OR_RETURN(const QuantizeStats mix, quantize_model(dry, {}));
  const double n = static_cast<double>(std::max<uint64_t>(1, mix.n_elements));
  std::vector<Try> tries;
  const auto cleanup = [&](const Try* keep) {
    for (const Try& t : tries) {
      if (&t == keep) continue;
      std::filesystem::remove(t.path, ec);
      if (!t.plan.empty()) std::filesystem::remove(t.plan, ec);
    }
  };
  const auto best_ok = [&]() -> const Try* {
    const Try* b = nullptr;
    for (const Try& t : tries)
      if (t.kld <= target && (b == nullptr || t.bpw < b->bpw)) b = &t;
    return b;
  };
  const auto worst_missed = [&](double below) -> const Try* {
    const Try* b = nullptr;
    for (const Try& t : tries)
      if (t.kld > target && t.bpw < below && (b == nullptr || t.bpw > b->bpw)) b = &t;
    return b;
  };
  double bpw = std::clamp(mix.bytes_out * 8.0 / n, kMinBpw, kMaxBpw);
  Status failed;
  for (int i = 0; i < kMaxTries; ++i) {
    Try t;
    t.bpw = bpw;
    t.path = fmt::format("{}.try-{}", opt.output, i);
    t.plan = opt.save_plan.empty() ? "" : t.path + ".plan";
    QuantizeOptions q = opt;
    q.output = t.path;
    q.force = true;
    q.target_bpw = bpw;
    q.save_plan = t.plan;
    QuantizeEvents ev;
    ev.note = print_note;
    Result<QuantizeStats> st = quantize_model(q, ev);
    if (!st.ok() && st.status().code() == StatusCode::resource_exhausted && bpw < kMaxBpw) {
      std::fprintf(stderr, "quantize: %.3f bits per weight: %s\n", bpw, st.status().message().c_str());
      bpw = std::min(kMaxBpw, bpw + 0.25);  // below the smallest types: more bits
      continue;
    }
    if (!st.ok()) {
      failed = st.status();
      break;
    }
    t.bytes = st->file_bytes;
    tries.push_back(t);
    KldScoreOptions so;
    so.model = t.path;
    so.base = args.kld_base;
    so.device = opt.device;
    so.threads = opt.threads;
    Result<kld::Report> r = score_kld(so);
    if (!r.ok()) {
      failed = r.status();
      break;
    }
    tries.back().kld = r->kld.value;
    std::fprintf(stderr, "quantize: try %d: %.3f bits per weight, %.2f MiB: mean KLD %.5f (target %.5f)\n",
                 i + 1, bpw, static_cast<double>(t.bytes) / (1 << 20), r->kld.value, target);
    const Try* ok = best_ok();
    const Try* missed = worst_missed(ok != nullptr ? ok->bpw : kMaxBpw + 1.0);
    if (ok != nullptr && (missed != nullptr && ok->bpw - missed->bpw <= kBpwPrecision)) break;
    if (ok != nullptr && ok->bpw <= kMinBpw) break;
    if (ok == nullptr && bpw >= kMaxBpw) break;
    // The next budget.
    const auto step = [&](double kld) { return std::log(kld / target) / std::log(4.0); };
    double next;
    if (ok != nullptr && missed != nullptr) {
      const double slope = (std::log(missed->kld) - std::log(ok->kld)) / (missed->bpw - ok->bpw);
      next =
          slope < 0 ? ok->bpw + (std::log(target) - std::log(ok->kld)) / slope : (ok->bpw + missed->bpw) / 2;
      const double margin = std::min(kBpwPrecision / 2, (ok->bpw - missed->bpw) / 4);
      next = std::clamp(next, missed->bpw + margin, ok->bpw - margin);
    } else if (ok != nullptr) {
      next = ok->bpw - std::max(0.25, -step(ok->kld));
    } else {
      next = tries.back().bpw + std::max(0.25, step(tries.back().kld));
    }
    bpw = std::clamp(next, kMinBpw, kMaxBpw);
  }
  const Try* ok = best_ok();
  if (!failed.ok() || ok == nullptr) {
    cleanup(nullptr);
    if (!failed.ok()) return failed;
    return resource_exhausted(
        "--target-kld {}: not met at {} bits per weight (mean KLD {:.5f}); the tensors a budget does "
        "not type (embeddings, output head) keep {}'s types: a TYPE with more bits for them may meet it",
        target, tries.empty() ? kMaxBpw : tries.back().bpw, tries.empty() ? 0.0 : tries.back().kld, opt.type);
  }
  std::filesystem::rename(ok->path, opt.output, ec);
  if (ec) {
    cleanup(nullptr);
    return io_error("cannot rename {} to {}: {}", ok->path, opt.output, ec.message());
  }
  if (!ok->plan.empty()) std::filesystem::rename(ok->plan, opt.save_plan, ec);
  const Try* missed = worst_missed(ok->bpw);
  std::fprintf(
      stderr,
      "quantize: wrote %s: %.3f bits per weight, %.2f MiB, mean KLD %.5f <= %.5f after %zu tries "
      "(%s)\n",
      opt.output.c_str(), ok->bpw, static_cast<double>(ok->bytes) / (1 << 20), ok->kld, target, tries.size(),
      missed != nullptr ? fmt::format("{:.3f} bits per weight gave {:.5f}", missed->bpw, missed->kld).c_str()
                        : "none smaller tried");
  cleanup(ok);
  return Status();
}

bool equal_ignoring_case(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

// TYPE FP8: a Hugging Face folder written as an FP8 (compressed-tensors) folder, none of the GGUF options;
// --imatrix gives static activation scales (its input ranges) unless --fp8-activations dynamic, and with
// --method gptq the Gram matrices GPTQ rounds with.
Status write_fp8(const QuantizeArgs& args) {
  const QuantizeOptions& o = args.opt;
  const std::pair<bool, const char*> unused[] = {{!o.tensor_types.empty(), "--tensor-type"},
                                                 {!o.output_tensor_type.empty(), "--output-tensor-type"},
                                                 {!o.token_embedding_type.empty(), "--token-embedding-type"},
                                                 {o.allow_requantize, "--allow-requantize"},
                                                 {o.leave_output_tensor, "--leave-output-tensor"},
                                                 {o.pure, "--pure"},
                                                 {o.force, "--force"},
                                                 {o.dry_run, "--dry-run"},
                                                 {o.target_bpw != 0.0, "--target-bpw"},
                                                 {!args.target_size.empty(), "--target-size"},
                                                 {args.target_kld != 0.0, "--target-kld"},
                                                 {!o.plan.empty(), "--plan"},
                                                 {!o.save_plan.empty(), "--save-plan"}};
  for (const auto& [set, name] : unused) {
    if (set)
      return invalid_argument("{} does not apply to FP8 (a Hugging Face folder, per-channel scales)", name);
  }
  if (!o.method.empty() && o.method != "gptq")
    return invalid_argument("--method {}: the methods are gptq (or none)", o.method);
  const bool gptq = o.method == "gptq";
  const std::string acts =
      !args.fp8_activations.empty() ? args.fp8_activations : (o.imatrix.empty() ? "dynamic" : "static");
  if (acts != "dynamic" && acts != "static") {
    return invalid_argument(
        "--fp8-activations {}: dynamic (per token at run time) or static (per tensor, from --imatrix)", acts);
  }
  if (acts == "static" && o.imatrix.empty()) {
    return invalid_argument(
        "--fp8-activations static needs --imatrix (kiln imatrix: its input ranges give the scales)");
  }
  if (gptq && o.imatrix.empty())
    return invalid_argument("--method gptq needs --imatrix with Gram matrices (kiln imatrix --full)");
  if (gptq && (!(o.gptq_damp >= 0.0) || !std::isfinite(o.gptq_damp)))
    return invalid_argument("--gptq-damp {} must be a finite number >= 0", o.gptq_damp);
  if (!gptq && acts == "dynamic" && !o.imatrix.empty()) {
    return invalid_argument(
        "--imatrix with --fp8-activations dynamic is used by --method gptq only: give one of them");
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<quant::Imatrix> imatrix;
  if (!o.imatrix.empty()) {
    KILN_ASSIGN_OR_RETURN(imatrix, quant::read_imatrix(o.imatrix));
  }
  quant::Fp8FolderOptions fo;
  fo.n_threads = o.threads;
  fo.imatrix = imatrix ? &*imatrix : nullptr;
  fo.static_activations = acts == "static";
  fo.gptq = gptq;
  fo.gptq_damp = o.gptq_damp;
  fo.gptq_act_order = o.gptq_act_order;
  fo.device = o.device;
  KILN_ASSIGN_OR_RETURN(const quant::Fp8FolderStats st, quant::write_fp8_folder(o.input, o.output, fo));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const std::string& note : st.notes) print_note(note);
  std::fprintf(
      stderr,
      "quantize: wrote %s (compressed-tensors FP8, per-channel weights, %s activations): %lld "
      "weights in FP8%s, %lld tensors copied, %.2f MiB -> %.2f MiB, in %.1f s\n",
      o.output.c_str(), fo.static_activations ? "static per-tensor" : "dynamic per-token",
      static_cast<long long>(st.n_quantized),
      gptq ? fmt::format(" ({} rounded by GPTQ on {}, the others to nearest)", st.n_gptq, st.gptq_device)
                 .c_str()
           : "",
      static_cast<long long>(st.n_copied), mib(st.bytes_in), mib(st.bytes_out), s);
  if (st.n_experts_plain > 0) {
    std::fprintf(
        stderr,
        "quantize: MoE experts' weights rounded to nearest, not by GPTQ (the importance matrix holds "
        "no Gram matrix per expert): %lld\n",
        static_cast<long long>(st.n_experts_plain));
  }
  return Status();
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
  if (equal_ignoring_case(opt.type, "fp8")) return write_fp8(args);
  if (!args.fp8_activations.empty()) return invalid_argument("--fp8-activations applies to TYPE FP8 only");
  if (!args.target_size.empty()) {
    KILN_ASSIGN_OR_RETURN(opt.target_size, parse_byte_size(args.target_size));
    if (opt.target_size == 0) return invalid_argument("--target-size {} is not a size", args.target_size);
  }
  if (args.target_kld != 0.0) return search_kld(args);
  const auto t0 = std::chrono::steady_clock::now();
  auto progress = std::make_shared<Progress>(isatty(fileno(stderr)) != 0);
  QuantizeEvents ev;
  ev.planned = [progress](const QuantizeStats& plan, const std::vector<std::string>& warnings) {
    for (const std::string& w : warnings) std::fprintf(stderr, "quantize: warning: %s\n", w.c_str());
    progress->planned(plan);
  };
  ev.tensor_done = [progress](size_t i, uint64_t written) { progress->done(i, written); };
  ev.note = print_note;
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
  if (st.budget_bytes > 0) {
    std::fprintf(
        stderr,
        "quantize: a budget of %llu bytes (%.3f bits per weight) typed %zu weight matrices: rounding "
        "error %.4g in all, against %.4g with %s's types\n",
        static_cast<unsigned long long>(st.budget_bytes), st.budget_bytes * 8.0 / n, st.n_budget,
        st.budget_error, st.mix_error, st.file_type.c_str());
  } else if (st.n_budget > 0) {
    std::fprintf(stderr, "quantize: weight matrices typed by the plan %s: %zu\n", opt.plan.c_str(),
                 st.n_budget);
  }
  if (st.file_bytes > 0) {
    std::fprintf(stderr, "quantize: the file is %llu bytes\n",
                 static_cast<unsigned long long>(st.file_bytes));
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
  s +=
      "  FP8          a Hugging Face folder to an FP8 one (compressed-tensors: e4m3 weights with a scale "
      "per\n"
      "               output channel, activations per token at run time or, with --imatrix, per tensor with\n"
      "               static scales; --method gptq rounds the weights by GPTQ), OUT a new folder\n";
  return s;
}

}  // namespace

void register_quantize(CLI::App& app, int& rc) {
  auto args = std::make_shared<QuantizeArgs>();
  QuantizeOptions& o = args->opt;
  CLI::App* cmd = app.add_subcommand(
      "quantize",
      "Quantize a model to a GGUF file of a llama.cpp file type (the same file llama-quantize writes), or a "
      "Hugging Face folder to an FP8 one");
  cmd->add_option("IN", args->in, "A GGUF file or a Hugging Face folder")->required();
  cmd->add_option("OUT", args->out, "The GGUF file to write (left out with --dry-run); for FP8 a new folder")
      ->required();
  cmd->add_option("TYPE", args->type, "The file type (below)");
  cmd->add_option(
      "--imatrix", o.imatrix,
      "Importance matrix (kiln imatrix / llama-imatrix file): weights each column's rounding error; "
      "required by IQ1/IQ2/IQ3_XXS/IQ3_XS and Q2_K_S. For FP8 (a kiln imatrix file): static activation "
      "scales from its input ranges (see --fp8-activations), and GPTQ's Gram matrices with --method gptq");
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
                  "Hessian of their inputs (needs --imatrix from kiln imatrix --full); the same GGUF types. "
                  "For FP8: the same per-channel scales, the e4m3 codes chosen by GPTQ (MoE experts to "
                  "nearest)");
  cmd->add_option("--fp8-activations", args->fp8_activations,
                  "FP8 activations: dynamic (per token at run time; the default without --imatrix) or "
                  "static (per tensor, scales from --imatrix's input ranges; the default with it)");
  cmd->add_option("--gptq-damp", o.gptq_damp, "GPTQ's dampening, a fraction of mean(diag H) (default 0.01)");
  cmd->add_flag("--gptq-act-order,!--gptq-no-act-order", o.gptq_act_order,
                "GPTQ's blocks, and the columns within a block, by decreasing diag(H) (the default), or in "
                "column order (--gptq-no-act-order)");
  cmd->add_option(
      "--target-bpw", o.target_bpw,
      "Bits per weight (over every tensor) the file may take: each weight matrix gets the type, of "
      "the K-quants, IQ4_XS/NL, Q4_0..Q5_1 and Q8_0, that gives the least rounding error in all "
      "(weighted by --imatrix) within it; embeddings, output head and norms keep TYPE's mix");
  cmd->add_option("--target-size", args->target_size,
                  "Bytes the output file may take, header included (900M, 1.5G; as --target-bpw)");
  cmd->add_option("--plan", o.plan,
                  "Each weight matrix's type from a plan file (--save-plan of the same model); the others as "
                  "TYPE's mix");
  cmd->add_option("--save-plan", o.save_plan, "Write every weight matrix's type to this plan file");
  cmd->add_option("--target-kld", args->target_kld,
                  "Mean KL divergence from the source to meet: files of one --target-bpw after another are "
                  "written and scored against --kld-base until the smallest that meets it is found");
  cmd->add_option("--kld-base", args->kld_base,
                  "The source's distributions for --target-kld (kiln perplexity -m IN -f TEXT "
                  "--kl-divergence-base FILE)");
  cmd->add_option("-d,--device", args->opt.device,
                  "Where GPTQ factors and updates, and --target-kld scores its files: auto, cpu, cuda");
  cmd->add_option("-t,--threads", o.threads, "CPU threads (default: physical cores; the file is the same)");
  cmd->footer(types_footer());
  cmd->callback([args, &rc] {
    Status s = run_quantize(*args);
    if (!s.ok()) rc = report_error("quantize", s);
  });
}

}  // namespace kiln::cli
