// kiln perplexity: a model's perplexity over a text file, as llama.cpp's llama-perplexity measures it. The
// text is tokenized once (with the model's BOS rule) and cut into chunks of --ctx-size tokens; each chunk
// starts with BOS (when the model adds one) and is run as its own sequence, and the tokens of its second half
// are scored, each given every token before it in the chunk (the first half is context only). The chunks go
// to the engine together (--parallel at a time), each a request whose prompt logits (Request::prompt_logits)
// are scored on the engine thread as they come. stdout: the running perplexity after each chunk, then the
// final estimate with its standard error (or one JSON object, -o json); stderr: what was measured and how
// fast.
//
// KL divergence (docs/kl-divergence.md), in llama-perplexity's file format (quant/kld_file.h):
// --kl-divergence-base FILE also writes the scored positions' distributions to FILE; --kl-divergence then
// runs another model over the same tokens, read from FILE with its chunk size, and compares its distributions
// with the base's row by row (quant/kld_stats.h): a line per chunk, then the statistics.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "kiln/kiln.h"
#include "perplexity_kld.h"
#include "perplexity_rows.h"
#include "quant/kld_file.h"
#include "quant/kld_stats.h"

namespace kiln::cli {
namespace {

struct PplOptions {
  std::string model;
  std::string file;
  int32_t n_ctx = 512;
  bool n_ctx_given = false;  // -c was on the command line
  int32_t n_chunks = -1;
  int32_t parallel = 4;
  int32_t n_threads = 0;
  std::string device = "auto";
  int32_t gpu_layers = -1;
  int32_t tensor_parallel = 1;
  std::string kv_type = "auto";
  bool exact = false;
  bool deterministic = false;
  std::string output = "text";  // text, json; "none" (score_kld): nothing printed
  std::string kld_base;         // --kl-divergence-base FILE
  bool kl_divergence = false;   // --kl-divergence: compare with kld_base rather than write it
};

// Sums of the scored tokens' negative log-likelihoods: the perplexity and its standard error as llama.cpp
// reports them (exp of the mean, and that times the standard error of the mean).
struct Nll {
  double sum = 0, sum2 = 0;
  int64_t count = 0;
  void add(double logprob) {
    sum -= logprob;
    sum2 += logprob * logprob;
    ++count;
  }
  void merge(const Nll& o) {
    sum += o.sum;
    sum2 += o.sum2;
    count += o.count;
  }
  double ppl() const { return std::exp(sum / static_cast<double>(count)); }
  double ppl_error() const {
    const double n = static_cast<double>(count), mean = sum / n, var = sum2 / n - mean * mean;
    return count > 1 && var > 0 ? ppl() * std::sqrt(var / (n - 1)) : 0.0;
  }
};

// log softmax(logits)[token]: f32 terms summed in f64, as llama-perplexity scores a token.
double token_logprob(std::span<const float> logits, int32_t token) {
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  double sum_exp = 0;
  for (const float x : logits) sum_exp += std::exp(x - max_logit);
  return static_cast<double>(logits[static_cast<size_t>(token)] - max_logit) - std::log(sum_exp);
}

// Where the chunks' tokens come from and where their scores go: the text (perplexity, writing a base file) or
// the base file (--kl-divergence). score() runs on RowWorkers' threads, one row each, and writes only that
// row's own places; the main thread reads a chunk's once RowWorkers::wait_chunk has returned for it.
struct PplRun {
  std::vector<int32_t> text_tokens;  // perplexity and --kl-divergence-base: the text, tokenized
  std::optional<kld::Reader> base;   // --kl-divergence
  std::optional<kld::Writer> out;    // --kl-divergence-base without --kl-divergence
  int64_t n_ctx = 0, n_chunks = 0, n_scored = 0;
  std::vector<double> logprobs;          // [n_chunks * n_scored]: log p(token), perplexity and writing a base
  std::vector<kld::Position> positions;  // [n_chunks * n_scored]: --kl-divergence
  std::vector<std::vector<uint16_t>> rows;  // [worker][row_values(n_vocab)]: scratch rows
  std::mutex error_mu;
  Status error = Status::ok_status();  // the first failure to read or write the base file

  std::span<const int32_t> chunk_tokens(int64_t c) const {
    if (base) return base->chunk_tokens(c);
    return {text_tokens.data() + c * n_ctx, static_cast<size_t>(n_ctx)};
  }
  // Position p of chunk c (p >= n_ctx / 2): the logits that predict token p + 1.
  void score(int worker, int64_t c, int32_t p, std::span<const float> logits);
  void fail(Status s) {
    std::lock_guard<std::mutex> lock(error_mu);
    if (error.ok()) error = std::move(s);
  }
};

void PplRun::score(int worker, int64_t c, int32_t p, std::span<const float> logits) {
  const int32_t token = chunk_tokens(c)[static_cast<size_t>(p) + 1];
  const int64_t j = p - kld::first_scored(static_cast<int32_t>(n_ctx));
  const auto at = static_cast<size_t>(c * n_scored + j);
  if (base) {
    std::vector<uint16_t>& row = rows[static_cast<size_t>(worker)];
    if (Status st = base->read_row(c, j, row); !st.ok()) return fail(std::move(st));
    positions[at] = kld::compare_row(logits, kld::view_row(row), token);
  } else if (out) {
    std::vector<uint16_t>& row = rows[static_cast<size_t>(worker)];
    logprobs[at] = -kld::encode_row(logits, token, row);
    if (Status st = out->write_row(c, j, row); !st.ok()) fail(std::move(st));
  } else {
    logprobs[at] = token_logprob(logits, token);
  }
}

// Sets run.n_ctx and n_chunks from the base file being compared with (run.base, whose vocabulary must be the
// model's), or from the text, tokenized into run.text_tokens.
Status choose_tokens(PplRun& run, const PplOptions& o, const Engine& engine) {
  if (run.base) {
    const kld::Header& h = run.base->header();
    if (o.n_ctx_given && o.n_ctx != h.n_ctx) {
      return invalid_argument("{} was computed with chunks of {} tokens, not {} (-c): leave -c out",
                              o.kld_base, h.n_ctx, o.n_ctx);
    }
    if (h.n_vocab != engine.model().n_vocab) {
      return invalid_argument(
          "{} holds distributions over {} tokens but {} has a vocabulary of {}: the two models must share a "
          "vocabulary",
          o.kld_base, h.n_vocab, engine.model().name, engine.model().n_vocab);
    }
    run.n_ctx = h.n_ctx;
    run.n_chunks = o.n_chunks > 0 ? std::min<int64_t>(h.n_chunk, o.n_chunks) : h.n_chunk;
    return Status::ok_status();
  }
  KILN_ASSIGN_OR_RETURN(const std::string text, read_text_file(o.file));
  KILN_ASSIGN_OR_RETURN(run.text_tokens, engine.tokenize(text, /*add_special=*/true));
  run.n_ctx = o.n_ctx;
  run.n_chunks = static_cast<int64_t>(run.text_tokens.size()) / run.n_ctx;
  if (run.n_chunks == 0) {
    return invalid_argument(
        "{} is {} tokens, fewer than one chunk of {} (-c): give a longer text or a smaller -c", o.file,
        run.text_tokens.size(), run.n_ctx);
  }
  if (o.n_chunks > 0) run.n_chunks = std::min<int64_t>(run.n_chunks, o.n_chunks);
  return Status::ok_status();
}

// `report`: where --kl-divergence's figures go as well (or null).
Status run_perplexity(const PplOptions& o, kld::Report* report_out = nullptr) {
  const bool quiet = o.output == "none";
  if (o.kl_divergence && !o.file.empty()) {
    std::fprintf(stderr, "kiln perplexity: %s is not read: the tokens come from %s\n", o.file.c_str(),
                 o.kld_base.c_str());
  }
  EngineOptions eo;
  KILN_ASSIGN_OR_RETURN(eo.model_path, resolve_model_path(o.model));
  eo.n_seq_max = o.parallel;
  eo.n_threads = o.n_threads;
  eo.kv_type = o.kv_type;
  eo.backend = o.device;
  eo.gpu_layers = o.gpu_layers;
  eo.tensor_parallel = o.tensor_parallel;
  eo.quantize_activations = !o.exact;
  eo.deterministic = o.deterministic;
  // What the requests' callbacks write, declared before the engine so that it outlives any callback the
  // engine's end may still make (an error below returns with requests in flight).
  PplRun run;
  std::optional<RowWorkers> workers;  // after `run`, whose rows it scores; before the engine, which feeds it
  std::vector<std::string> errors;
  // A base file is checked before the model loads; its chunks may be longer than -c.
  if (o.kl_divergence) {
    KILN_ASSIGN_OR_RETURN(kld::Reader r, kld::Reader::open(o.kld_base));
    run.base.emplace(std::move(r));
  }
  eo.n_ctx = (run.base ? run.base->header().n_ctx : o.n_ctx) + 1;  // room for one more token after a prompt
  KILN_ASSIGN_OR_RETURN(auto engine, Engine::create(eo));
  KILN_TRY(choose_tokens(run, o, *engine));
  const ModelDescription& m = engine->model();
  run.n_scored = kld::n_scored(static_cast<int32_t>(run.n_ctx));
  const auto n_positions = static_cast<size_t>(run.n_chunks * run.n_scored);
  if (!o.kl_divergence && !o.kld_base.empty()) {
    const kld::Header h{static_cast<int32_t>(run.n_ctx), m.n_vocab, static_cast<int32_t>(run.n_chunks)};
    const std::span<const int32_t> tokens(run.text_tokens.data(),
                                          static_cast<size_t>(run.n_chunks * run.n_ctx));
    KILN_ASSIGN_OR_RETURN(kld::Writer w, kld::Writer::create(o.kld_base, eo.model_path, h, tokens));
    run.out.emplace(std::move(w));
  }
  if (o.kl_divergence) {
    run.positions.resize(n_positions);
  } else {
    run.logprobs.resize(n_positions);
  }
  const int n_workers = std::max(1, m.n_threads);
  if (!o.kld_base.empty()) {
    run.rows.assign(static_cast<size_t>(n_workers),
                    std::vector<uint16_t>(static_cast<size_t>(kld::row_values(m.n_vocab))));
  }
  workers.emplace(
      n_workers, static_cast<size_t>(m.n_vocab), run.n_chunks,
      [&run](int w, int64_t c, int32_t p, std::span<const float> logits) { run.score(w, c, p, logits); });
  KILN_ASSIGN_OR_RETURN(const std::vector<int32_t> bos, engine->tokenize("", /*add_special=*/true));

  // Every chunk at once; the engine runs --parallel of them at a time. Each scored position's logits go from
  // the engine thread to the workers, which score them while the engine goes on.
  errors.resize(static_cast<size_t>(run.n_chunks));
  std::vector<uint64_t> ids;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t c = 0; c < run.n_chunks; ++c) {
    Request req;
    const std::span<const int32_t> tokens = run.chunk_tokens(c);
    req.prompt_tokens.assign(tokens.begin(), tokens.end());
    if (!bos.empty()) req.prompt_tokens[0] = bos[0];
    req.sampling.temperature = 0;
    req.sampling.max_tokens = 0;
    req.prompt_logits = [&workers, c](int32_t p, std::span<const float> logits) {
      workers->push(c, p, logits);
    };
    req.prompt_logits_from = kld::first_scored(static_cast<int32_t>(run.n_ctx));
    KILN_ASSIGN_OR_RETURN(const uint64_t id, engine->submit(req, [&errors, c](const TokenEvent& ev) {
      if (ev.finish == FinishReason::error) errors[static_cast<size_t>(c)] = ev.error;
    }));
    ids.push_back(id);
  }
  const bool json_out = o.output == "json";
  Nll nll;
  kld::Sums sums;
  std::vector<double> running;
  for (int64_t c = 0; c < run.n_chunks; ++c) {
    const auto i = static_cast<size_t>(c);
    KILN_ASSIGN_OR_RETURN(const RequestStats st, engine->wait(ids[i]));
    if (st.finish == FinishReason::error) {
      return make_status(StatusCode::internal, "chunk {} failed: {}", c + 1,
                         errors[i].empty() ? "no reason given" : errors[i]);
    }
    const int64_t n_rows = workers->wait_chunk(c);
    {
      std::lock_guard<std::mutex> lock(run.error_mu);
      KILN_TRY(run.error);
    }
    if (n_rows != run.n_scored) {
      return make_status(StatusCode::internal, "chunk {}: {} tokens scored, {} expected", c + 1, n_rows,
                         run.n_scored);
    }
    // The chunk's positions in order: the sums do not depend on which worker scored what.
    const auto from = static_cast<size_t>(c * run.n_scored), to = from + static_cast<size_t>(run.n_scored);
    if (o.kl_divergence) {
      for (size_t k = from; k < to; ++k) sums.add(run.positions[k]);
      if (!json_out && !quiet) {
        if (c == 0) print_kld_chunk_header();
        print_kld_chunk_line(c + 1, kld::running_report(sums));
      }
      continue;
    }
    for (size_t k = from; k < to; ++k) nll.add(run.logprobs[k]);
    running.push_back(nll.ppl());
    if (!json_out && !quiet) {
      std::printf("%s[%lld]%.4f", c == 0 ? "" : ",", static_cast<long long>(c + 1), running.back());
      std::fflush(stdout);
    }
  }
  if (run.out) KILN_TRY(run.out->commit());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double tps = static_cast<double>(run.n_chunks * run.n_ctx) / seconds;
  nlohmann::json out = {{"model", m.name},        {"device", m.backend}, {"ctx", run.n_ctx},
                        {"chunks", run.n_chunks}, {"seconds", seconds},  {"tokens_per_second", tps}};
  if (o.kl_divergence) {
    std::vector<float> kld_values(n_positions), p_diff_values(n_positions);
    for (size_t k = 0; k < n_positions; ++k) {
      kld_values[k] = static_cast<float>(run.positions[k].kld);
      p_diff_values[k] = run.positions[k].p_diff;
    }
    const kld::Report report = kld::final_report(sums, kld_values, p_diff_values);
    if (report_out != nullptr) *report_out = report;
    if (quiet) return Status::ok_status();
    if (json_out) {
      out["base_file"] = o.kld_base;
      out.update(kld_report_json(report));
      std::printf("%s\n", out.dump().c_str());
    } else {
      print_kld_summary(report);
    }
  } else if (json_out) {
    out.update({{"text_tokens", run.text_tokens.size()},
                {"scored_tokens", nll.count},
                {"ppl", nll.ppl()},
                {"ppl_error", nll.ppl_error()},
                {"mean_nll", nll.sum / static_cast<double>(nll.count)},
                {"chunk_ppl", running}});
    if (run.out) out["base_file"] = o.kld_base;
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("\nFinal estimate: PPL = %.4f +/- %.5f\n", nll.ppl(), nll.ppl_error());
  }
  std::fprintf(stderr, "%s on %s: %lld chunks of %lld tokens", m.name.c_str(), m.backend.c_str(),
               static_cast<long long>(run.n_chunks), static_cast<long long>(run.n_ctx));
  if (o.kl_divergence) {
    std::fprintf(stderr, " (from %s)", o.kld_base.c_str());
  } else {
    std::fprintf(stderr, " (of %zu in the text)", run.text_tokens.size());
  }
  std::fprintf(stderr, ", the last %lld of each scored; %lld tokens in %.2f s, %.1f tokens/s\n",
               static_cast<long long>(run.n_scored), static_cast<long long>(run.n_chunks * run.n_ctx),
               seconds, tps);
  const auto per_chunk = [&](double ms) { return ms / static_cast<double>(run.n_chunks); };
  std::fprintf(
      stderr,
      "host-side scoring (%s) on %d threads beside the engine: %.1f ms of CPU time a chunk, against %.1f "
      "ms a chunk for the whole run; the engine waited %.1f ms a chunk for it\n",
      o.kl_divergence ? "row reads and KL divergence"
      : run.out       ? "log-softmax, encoding and writing of rows"
                      : "log-softmax",
      n_workers, per_chunk(workers->busy_ms()), per_chunk(1000 * seconds), per_chunk(workers->stalled_ms()));
  if (run.out) std::fprintf(stderr, "wrote %s\n", o.kld_base.c_str());
  return Status::ok_status();
}

}  // namespace

Result<kld::Report> score_kld(const KldScoreOptions& so) {
  PplOptions o;
  o.model = so.model;
  o.kld_base = so.base;
  o.kl_divergence = true;
  o.device = so.device;
  o.gpu_layers = so.gpu_layers;
  o.n_threads = so.threads;
  o.output = "none";
  kld::Report report;
  KILN_TRY(run_perplexity(o, &report));
  return report;
}

void register_perplexity(CLI::App& app, int& rc) {
  auto o = std::make_shared<PplOptions>();
  CLI::App* cmd = app.add_subcommand(
      "perplexity", "A model's perplexity over a text file (as llama.cpp's llama-perplexity measures it)");
  cmd->add_option("-m,--model", o->model,
                  "A GGUF file or a Hugging Face folder (default: the default model)");
  cmd->add_option("-f,--file", o->file,
                  "The text, e.g. wikitext-2's wiki.test.raw (required, except with --kl-divergence)");
  CLI::Option* ctx =
      cmd->add_option("-c,--ctx-size", o->n_ctx,
                      "Tokens a chunk; the second half of each is scored (--kl-divergence: the "
                      "base file's)")
          ->check(CLI::Range(4, 1 << 20))
          ->capture_default_str();
  cmd->add_option("--chunks", o->n_chunks, "Chunks at most (default: all the text, or the base file, holds)")
      ->check(CLI::Range(1, 1 << 30));
  CLI::Option* base = cmd->add_option(
      "--kl-divergence-base", o->kld_base,
      "Also write the scored positions' token distributions to FILE (llama-perplexity's format), "
      "the base for --kl-divergence; with --kl-divergence, the file to compare with");
  cmd->add_flag("--kl-divergence", o->kl_divergence,
                "Compare this model's distributions with --kl-divergence-base FILE's over its tokens: KL "
                "divergence, same top token, perplexity ratio, Δp (docs/kl-divergence.md)")
      ->needs(base);
  cmd->add_option("--parallel", o->parallel, "Chunks run together")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_option(
      "-d,--device", o->device,
      "Where the model runs: cpu, cuda or cuda:N (default: CUDA device 0 when there is one, else cpu)");
  cmd->add_option(
         "--gpu-layers", o->gpu_layers,
         "Layers on the GPU, the first ones (-ngl N): the rest and the output head run on the CPU; -1 "
         "(the default): all")
      ->check(CLI::Range(-1, 1 << 20));
  add_tensor_parallel_option(*cmd, o->tensor_parallel);
  cmd->add_option("-t,--threads", o->n_threads, "CPU threads (default: physical cores)")
      ->check(CLI::Range(0, 1 << 20));
  add_kv_type_option(*cmd, o->kv_type);
  cmd->add_flag("--exact", o->exact,
                "Exact f32 matmuls (the reference path; default: the fast path, as kiln run)");
  cmd->add_flag(
      "--deterministic", o->deterministic,
      "Batch-invariant execution: a chunk's scores do not depend on the chunks beside it (slower on CUDA)");
  cmd->add_option("-o,--output", o->output, "text or json")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  cmd->callback([o, ctx, &rc] {
    // A usage error (exit 2) as a missing required option is: -f, unless the tokens come from a base file.
    if (o->file.empty() && !o->kl_divergence) {
      throw CLI::RequiredError(
          "-f,--file (the text to score; only --kl-divergence reads its tokens from the base file)");
    }
    o->n_ctx_given = ctx->count() > 0;
    if (Status s = run_perplexity(*o); !s.ok()) rc = report_error("perplexity", s);
  });
}

}  // namespace kiln::cli
