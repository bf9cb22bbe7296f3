// kiln perplexity: a model's perplexity over a text file, as llama.cpp's llama-perplexity measures it. The
// text is tokenized once (with the model's BOS rule) and cut into chunks of --ctx-size tokens; each chunk
// starts with BOS (when the model adds one) and is run as its own sequence, and the tokens of its second half
// are scored, each given every token before it in the chunk (the first half is context only). The chunks go
// to the engine together (--parallel at a time), each a request whose prompt logprobs are the scores. stdout:
// the running perplexity after each chunk, then the final estimate with its standard error (or one JSON
// object, -o json); stderr: what was measured and how fast.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "kiln/kiln.h"

namespace kiln::cli {
namespace {

struct PplOptions {
  std::string model;
  std::string file;
  int32_t n_ctx = 512;
  int32_t n_chunks = -1;
  int32_t parallel = 4;
  int32_t n_threads = 0;
  std::string device = "auto";
  int32_t gpu_layers = -1;
  std::string kv_type = "auto";
  bool exact = false;
  bool deterministic = false;
  std::string output = "text";
};

// The whole text of `path`: a regular file that can be read.
Result<std::string> read_text(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return make_status(StatusCode::not_found, "cannot read {}: {}", path,
                       std::error_code(errno, std::generic_category()).message());
  }
  if (!S_ISREG(st.st_mode)) return invalid_argument("{} is not a regular file", path);
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_status(StatusCode::not_found, "cannot open {}", path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return io_error("cannot read {}", path);
  return text;
}

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
  double ppl() const { return std::exp(sum / static_cast<double>(count)); }
  double ppl_error() const {
    const double n = static_cast<double>(count), mean = sum / n, var = sum2 / n - mean * mean;
    return count > 1 && var > 0 ? ppl() * std::sqrt(var / (n - 1)) : 0.0;
  }
};

Status run_perplexity(const PplOptions& o) {
  KILN_ASSIGN_OR_RETURN(const std::string text, read_text(o.file));
  EngineOptions eo;
  KILN_ASSIGN_OR_RETURN(eo.model_path, resolve_model_path(o.model));
  eo.n_ctx = o.n_ctx + 1;  // a prompt must leave the context room for one more token
  eo.n_seq_max = o.parallel;
  eo.n_threads = o.n_threads;
  eo.kv_type = o.kv_type;
  eo.backend = o.device;
  eo.gpu_layers = o.gpu_layers;
  eo.quantize_activations = !o.exact;
  eo.deterministic = o.deterministic;
  // What the requests' callbacks write, declared before the engine so that it outlives any callback the
  // engine's end may still make (an error below returns with requests in flight).
  std::vector<std::vector<PromptLogprob>> scores;
  std::vector<std::string> errors;
  KILN_ASSIGN_OR_RETURN(auto engine, Engine::create(eo));
  KILN_ASSIGN_OR_RETURN(const std::vector<int32_t> tokens, engine->tokenize(text, /*add_special=*/true));
  KILN_ASSIGN_OR_RETURN(const std::vector<int32_t> bos, engine->tokenize("", /*add_special=*/true));
  const auto n_ctx = static_cast<int64_t>(o.n_ctx);
  int64_t n_chunks = static_cast<int64_t>(tokens.size()) / n_ctx;
  if (n_chunks == 0) {
    return invalid_argument(
        "{} is {} tokens, fewer than one chunk of {} (-c): give a longer text or a smaller -c", o.file,
        tokens.size(), n_ctx);
  }
  if (o.n_chunks > 0) n_chunks = std::min<int64_t>(n_chunks, o.n_chunks);
  const int64_t first = n_ctx / 2;  // the first position whose next token is scored

  // Every chunk at once; the engine runs --parallel of them at a time. The scores come with each request's
  // last event.
  scores.resize(static_cast<size_t>(n_chunks));
  errors.resize(static_cast<size_t>(n_chunks));
  std::vector<uint64_t> ids;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t c = 0; c < n_chunks; ++c) {
    Request req;
    req.prompt_tokens.assign(tokens.begin() + c * n_ctx, tokens.begin() + (c + 1) * n_ctx);
    if (!bos.empty()) req.prompt_tokens[0] = bos[0];
    req.sampling.temperature = 0;
    req.sampling.max_tokens = 0;
    req.sampling.prompt_logprobs = 0;
    KILN_ASSIGN_OR_RETURN(const uint64_t id, engine->submit(req, [&scores, &errors, c](const TokenEvent& ev) {
      const auto i = static_cast<size_t>(c);
      if (!ev.prompt_logprobs.empty()) scores[i] = ev.prompt_logprobs;
      if (ev.finish == FinishReason::error) errors[i] = ev.error;
    }));
    ids.push_back(id);
  }
  const bool json_out = o.output == "json";
  Nll nll;
  std::vector<double> running;
  for (int64_t c = 0; c < n_chunks; ++c) {
    const auto i = static_cast<size_t>(c);
    KILN_ASSIGN_OR_RETURN(const RequestStats st, engine->wait(ids[i]));
    if (st.finish == FinishReason::error) {
      return make_status(StatusCode::internal, "chunk {} failed: {}", c + 1,
                         errors[i].empty() ? "no reason given" : errors[i]);
    }
    if (static_cast<int64_t>(scores[i].size()) != n_ctx - 1) {
      return make_status(StatusCode::internal, "chunk {}: {} tokens scored, {} expected", c + 1,
                         scores[i].size(), n_ctx - 1);
    }
    for (int64_t j = first; j < n_ctx - 1; ++j) nll.add(scores[i][static_cast<size_t>(j)].logprob);
    running.push_back(nll.ppl());
    if (!json_out) {
      std::printf("%s[%lld]%.4f", c == 0 ? "" : ",", static_cast<long long>(c + 1), running.back());
      std::fflush(stdout);
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const ModelDescription& m = engine->model();
  const double tps = static_cast<double>(n_chunks * n_ctx) / seconds;
  if (json_out) {
    const nlohmann::json out = {{"model", m.name},
                                {"device", m.backend},
                                {"ctx", n_ctx},
                                {"chunks", n_chunks},
                                {"text_tokens", tokens.size()},
                                {"scored_tokens", nll.count},
                                {"ppl", nll.ppl()},
                                {"ppl_error", nll.ppl_error()},
                                {"mean_nll", nll.sum / static_cast<double>(nll.count)},
                                {"chunk_ppl", running},
                                {"seconds", seconds},
                                {"tokens_per_second", tps}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("\nFinal estimate: PPL = %.4f +/- %.5f\n", nll.ppl(), nll.ppl_error());
  }
  std::fprintf(
      stderr,
      "%s on %s: %lld chunks of %lld tokens (of %zu in the text), the last %lld of each scored; %lld "
      "tokens in %.2f s, %.1f tokens/s\n",
      m.name.c_str(), m.backend.c_str(), static_cast<long long>(n_chunks), static_cast<long long>(n_ctx),
      tokens.size(), static_cast<long long>(n_ctx - 1 - first), static_cast<long long>(n_chunks * n_ctx),
      seconds, tps);
  return Status::ok_status();
}

}  // namespace

void register_perplexity(CLI::App& app, int& rc) {
  auto o = std::make_shared<PplOptions>();
  CLI::App* cmd = app.add_subcommand(
      "perplexity", "A model's perplexity over a text file (as llama.cpp's llama-perplexity measures it)");
  cmd->add_option("-m,--model", o->model,
                  "A GGUF file or a Hugging Face folder (default: the default model)");
  cmd->add_option("-f,--file", o->file, "The text, e.g. wikitext-2's wiki.test.raw")->required();
  cmd->add_option("-c,--ctx-size", o->n_ctx, "Tokens a chunk; the second half of each is scored")
      ->check(CLI::Range(4, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--chunks", o->n_chunks, "Chunks at most (default: all the text holds)")
      ->check(CLI::Range(1, 1 << 30));
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
  cmd->add_option("-t,--threads", o->n_threads, "CPU threads (default: physical cores)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--kv-type", o->kv_type, "KV cache type: f32, f16, or auto (f16 on a GPU unless --exact)")
      ->check(CLI::IsMember({"f32", "f16", "auto"}));
  cmd->add_flag("--exact", o->exact,
                "Exact f32 matmuls (the reference path; default: the fast path, as kiln run)");
  cmd->add_flag(
      "--deterministic", o->deterministic,
      "Batch-invariant execution: a chunk's scores do not depend on the chunks beside it (slower on CUDA)");
  cmd->add_option("-o,--output", o->output, "text or json")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  cmd->callback([o, &rc] {
    if (Status s = run_perplexity(*o); !s.ok()) rc = report_error("perplexity", s);
  });
}

}  // namespace kiln::cli
