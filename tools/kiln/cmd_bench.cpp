// kiln bench: prompt processing and generation speed, in the spirit of llama-bench. One table row per (model,
// threads, test): ppP (a P-token prompt, processed in one step), tgN (N tokens generated one at a time after
// a one-token prompt, or after a D-token one with --depth D: "tgN @ dD"), tgN@bsB (B requests generating
// together) and, with --pg P,N, ppP+tgN@bsB (B requests of a P-token prompt and N tokens out, submitted
// together as a server's clients would: generated tokens over the whole run, prefill included, on an engine
// with the default step budget as kiln serve's). Each test runs once untimed, then --reps times; rows give
// tokens/s as mean ± standard deviation. Every request has its own cache salt, so no repetition reuses
// another's prefix cache.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "kiln/kiln.h"

namespace kiln::cli {

namespace {

struct BenchOptions {
  std::vector<std::string> models;
  std::vector<int32_t> n_prompt{512};
  int32_t n_gen = 128;
  std::vector<int32_t> threads{0};
  std::vector<int32_t> batch;
  std::vector<int32_t> pg;  // {P, N}: the prompt-and-generation test; empty: none
  int32_t depth = 0;        // the tg tests' context: tokens in the cache before the timed ones
  int32_t reps = 5;
  std::string device = "auto";
  int32_t gpu_layers = -1;
  int32_t tensor_parallel = 1;
  std::string output = "md";
  std::string kv_type = "auto";
  bool quantize_activations = false;
  bool exact = false;
  bool deterministic = false;
  SpecOptions spec;
  // The tg and pp+tg tests' prompt: this file's text (as a chat message with --chat) instead of random
  // tokens.
  std::string prompt_file;
  bool chat = false;
};

struct Row {
  std::string model, path, backend, test;
  uint64_t size_bytes = 0;
  int64_t n_params = 0;
  int32_t threads = 0, n_prompt = 0, n_gen = 0, batch = 1;
  std::vector<double> samples;  // tokens/s of each timed repetition
  // Speculative decoding over the timed repetitions (EngineMetrics): draft tokens made and kept, and the
  // steps that verified a draft.
  uint64_t n_draft_tokens = 0, n_accepted = 0, n_drafts = 0;
  double mean() const {
    double s = 0;
    for (double v : samples) s += v;
    return samples.empty() ? 0 : s / static_cast<double>(samples.size());
  }
  double sd() const {
    if (samples.size() < 2) return 0;
    const double m = mean();
    double s = 0;
    for (double v : samples) s += (v - m) * (v - m);
    return std::sqrt(s / static_cast<double>(samples.size() - 1));
  }
};

// One test's requests, submitted together; the per-request statistics. Their prompt: `text`'s when it has
// one, else n_prompt random tokens.
Result<std::vector<RequestStats>> run_requests(Engine& engine, const Request& text, int32_t n_prompt,
                                               int32_t n_gen, int32_t batch, uint64_t& salt,
                                               std::mt19937& rng) {
  const int32_t n_vocab = engine.model().n_vocab;
  std::uniform_int_distribution<int32_t> token(0, n_vocab - 1);
  std::vector<uint64_t> ids;
  const bool has_text = !text.prompt.empty() || !text.messages.empty();
  for (int32_t b = 0; b < batch; ++b) {
    Request req;
    if (has_text) {
      req.prompt = text.prompt;
      req.messages = text.messages;
    } else {
      for (int32_t i = 0; i < n_prompt; ++i) req.prompt_tokens.push_back(token(rng));
    }
    req.sampling.temperature = 0;
    req.sampling.max_tokens = n_gen;
    req.sampling.ignore_eos = true;
    req.cache_salt = "kiln-bench-" + std::to_string(salt++);
    KILN_ASSIGN_OR_RETURN(const uint64_t id, engine.submit(req, [](const TokenEvent&) {}));
    ids.push_back(id);
  }
  std::vector<RequestStats> stats;
  for (uint64_t id : ids) {
    KILN_ASSIGN_OR_RETURN(RequestStats st, engine.wait(id));
    if (st.finish != FinishReason::length) {
      return make_status(StatusCode::internal, "a benchmark request ended with {}",
                         finish_reason_name(st.finish));
    }
    stats.push_back(st);
  }
  return stats;
}

// tokens/s of one repetition: the prompt over its processing time (pp), the tokens after the first over the
// longest decode of the batch (tg: they decode together), or every generated token over the wall time from
// submitting to the last one done (pp+tg).
Result<double> measure(Engine& engine, const Row& row, const Request& text, int32_t depth, uint64_t& salt,
                       std::mt19937& rng) {
  if (row.n_prompt > 0 && row.n_gen > 0) {
    const auto t0 = std::chrono::steady_clock::now();
    KILN_TRY(run_requests(engine, text, row.n_prompt, row.n_gen, row.batch, salt, rng).status());
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return static_cast<double>(row.batch) * row.n_gen * 1000.0 / std::max(ms, 1e-6);
  }
  if (row.n_prompt > 0) {
    KILN_ASSIGN_OR_RETURN(auto st, run_requests(engine, Request{}, row.n_prompt, 1, 1, salt, rng));
    return (st[0].n_prompt - st[0].n_cached) * 1000.0 / std::max(st[0].prefill_ms, 1e-6);
  }
  KILN_ASSIGN_OR_RETURN(auto st,
                        run_requests(engine, text, std::max(depth, 1), row.n_gen + 1, row.batch, salt, rng));
  double decode_ms = 0;
  for (const RequestStats& s : st) decode_ms = std::max(decode_ms, s.decode_ms);
  return static_cast<double>(row.batch) * row.n_gen * 1000.0 / std::max(decode_ms, 1e-6);
}

std::string human_bytes(uint64_t b) {
  const double v = static_cast<double>(b);
  return v >= 1073741824.0 ? fmt::format("{:.2f} GiB", v / 1073741824.0)
                           : fmt::format("{:.2f} MiB", v / 1048576.0);
}

void print_rows(const std::vector<Row>& rows, const std::string& format) {
  if (format == "json") {
    nlohmann::json out = nlohmann::json::array();
    for (const Row& r : rows) {
      out.push_back({{"model", r.model},
                     {"model_path", r.path},
                     {"size_bytes", r.size_bytes},
                     {"n_params", r.n_params},
                     {"backend", r.backend},
                     {"threads", r.threads},
                     {"test", r.test},
                     {"n_prompt", r.n_prompt},
                     {"n_gen", r.n_gen},
                     {"batch", r.batch},
                     {"tokens_per_s", r.mean()},
                     {"tokens_per_s_sd", r.sd()},
                     {"samples", r.samples},
                     {"spec_draft_tokens", r.n_draft_tokens},
                     {"spec_accepted_tokens", r.n_accepted},
                     {"spec_drafts", r.n_drafts}});
    }
    std::printf("%s\n", out.dump(2).c_str());
    return;
  }
  if (format == "csv") {
    std::printf(
        "model,size_bytes,n_params,backend,threads,test,n_prompt,n_gen,batch,tokens_per_s,tokens_per_s_sd\n");
    for (const Row& r : rows) {
      std::printf("\"%s\",%llu,%lld,%s,%d,%s,%d,%d,%d,%.3f,%.3f\n", r.model.c_str(),
                  static_cast<unsigned long long>(r.size_bytes), static_cast<long long>(r.n_params),
                  r.backend.c_str(), r.threads, r.test.c_str(), r.n_prompt, r.n_gen, r.batch, r.mean(),
                  r.sd());
    }
    return;
  }
  // With speculative decoding: the share of draft tokens kept, and the tokens a verifying step yields.
  const bool spec = std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.n_drafts > 0; });
  std::printf("| model | size | params | backend | threads | test | t/s |%s\n",
              spec ? " drafts kept | tokens/verify |" : "");
  std::printf("| --- | ---: | ---: | --- | ---: | ---: | ---: |%s\n", spec ? " ---: | ---: |" : "");
  for (const Row& r : rows) {
    std::string drafts;
    if (spec && r.n_drafts > 0) {
      drafts =
          fmt::format(" {:.1f}% | {:.2f} |", 100.0 * static_cast<double>(r.n_accepted) / r.n_draft_tokens,
                      1.0 + static_cast<double>(r.n_accepted) / static_cast<double>(r.n_drafts));
    } else if (spec) {
      drafts = " - | - |";
    }
    std::printf("| %s | %s | %.2f M | %s | %d | %s | %.2f ± %.2f |%s\n", r.model.c_str(),
                human_bytes(r.size_bytes).c_str(), static_cast<double>(r.n_params) / 1e6, r.backend.c_str(),
                r.threads, r.test.c_str(), r.mean(), r.sd(), drafts.c_str());
  }
}

Status run_bench(const BenchOptions& o) {
  std::vector<std::string> models = o.models.empty() ? std::vector<std::string>{""} : o.models;
  const int32_t max_batch = o.batch.empty() ? 1 : *std::max_element(o.batch.begin(), o.batch.end());
  const int32_t max_prompt = *std::max_element(o.n_prompt.begin(), o.n_prompt.end());
  std::vector<Row> rows;
  std::mt19937 rng(1234);
  uint64_t salt = 0;
  Request text;  // --prompt-file
  std::string text_name;
  if (!o.prompt_file.empty()) {
    KILN_ASSIGN_OR_RETURN(std::string t, read_text_file(o.prompt_file));
    if (t.empty()) return invalid_argument("--prompt-file {} is empty", o.prompt_file);
    if (o.chat) {
      text.messages.push_back({.role = "user", .content = std::move(t)});
    } else {
      text.prompt = std::move(t);
    }
    text_name = std::filesystem::path(o.prompt_file).filename().string();
  }
  for (const std::string& m : models) {
    for (const int32_t threads : o.threads) {
      // The pp and tg tests on one engine; the pp+tg tests on another, with kiln serve's step budget.
      for (const bool pg : {false, true}) {
        if (pg && o.pg.empty()) break;
        EngineOptions eo;
        KILN_ASSIGN_OR_RETURN(eo.model_path, resolve_model_path(m));
        eo.n_threads = threads;
        eo.backend = o.device;
        eo.gpu_layers = o.gpu_layers;
        eo.tensor_parallel = o.tensor_parallel;
        eo.kv_type = o.kv_type;
        eo.quantize_activations = !o.exact;
        eo.deterministic = o.deterministic;
        eo.n_seq_max = max_batch;
        o.spec.apply(eo);
        // A prompt in one step, as llama-bench's; every request's token, and the drafts of speculation.
        const int32_t step_tokens =
            std::max(max_prompt, max_batch + (o.spec.spec.empty() && o.spec.draft_model.empty()
                                                  ? 0
                                                  : Engine::kSpeculativeStepTokens));
        if (!text_name.empty()) {
          eo.n_ctx = 0;  // the model's (a text's length is known once tokenized)
          if (!pg) eo.max_batch_tokens = step_tokens;
        } else if (pg) {
          eo.n_ctx = o.pg[0] + o.pg[1] + 1;
        } else {
          eo.n_ctx = std::max(max_prompt, o.depth + o.n_gen + 1) + 1;
          // --depth's prompt goes in chunks of at least 2048 tokens (a GPU's default step), not one a step.
          eo.max_batch_tokens = o.depth > 0 ? std::max(step_tokens, 2048) : step_tokens;
        }
        KILN_ASSIGN_OR_RETURN(auto engine, Engine::create(eo));
        const ModelDescription& d = engine->model();
        Row base;
        base.model = d.name;
        base.path = eo.model_path;
        base.backend = d.backend;
        if (d.n_gpu_layers > 0 && d.n_gpu_layers < d.n_layers)  // partial offload
          base.backend += fmt::format(", ngl {}", d.n_gpu_layers);
        base.size_bytes = d.weight_bytes;
        base.n_params = d.n_params;
        base.threads = d.n_threads;
        std::vector<Row> tests;
        if (pg) {
          Row r = base;
          r.n_prompt = o.pg[0];
          r.n_gen = o.pg[1];
          for (const int32_t b : o.batch.empty() ? std::vector<int32_t>{1} : o.batch) {
            r.batch = b;
            r.test = fmt::format("pp{}+tg{}{}", r.n_prompt, r.n_gen, b > 1 ? fmt::format("@bs{}", b) : "");
            if (!text_name.empty())
              r.test = fmt::format("{}+tg{}{}", text_name, r.n_gen, b > 1 ? fmt::format("@bs{}", b) : "");
            tests.push_back(r);
          }
        }
        for (const int32_t p : pg ? std::vector<int32_t>{} : o.n_prompt) {
          Row r = base;
          r.n_prompt = p;
          r.test = fmt::format("pp{}", p);
          if (p > 0) tests.push_back(r);
        }
        if (!pg && o.n_gen > 0) {
          Row r = base;
          r.n_gen = o.n_gen;
          const std::string after = !text_name.empty() ? " after " + text_name
                                    : o.depth > 0      ? fmt::format(" @ d{}", o.depth)
                                                       : "";
          r.test = fmt::format("tg{}{}", o.n_gen, after);
          tests.push_back(r);
          for (const int32_t b : o.batch) {
            r.batch = b;
            r.test = fmt::format("tg{}@bs{}{}", o.n_gen, b, after);
            if (b > 1) tests.push_back(r);
          }
        }
        for (Row& r : tests) {
          std::fprintf(stderr, "kiln bench: %s, %d threads, %s: ", d.name.c_str(), d.n_threads,
                       r.test.c_str());
          KILN_TRY(measure(*engine, r, text, o.depth, salt, rng).status());  // warm-up, untimed
          const EngineMetrics m0 = engine->metrics();
          for (int32_t i = 0; i < o.reps; ++i) {
            KILN_ASSIGN_OR_RETURN(const double tps, measure(*engine, r, text, o.depth, salt, rng));
            r.samples.push_back(tps);
          }
          const EngineMetrics m1 = engine->metrics();
          r.n_draft_tokens = m1.n_draft_tokens - m0.n_draft_tokens;
          r.n_accepted = m1.n_accepted_tokens - m0.n_accepted_tokens;
          r.n_drafts = m1.n_drafts - m0.n_drafts;
          std::fprintf(stderr, "%.2f tokens/s\n", r.mean());
          rows.push_back(r);
        }
      }
    }
  }
  print_rows(rows, o.output);
  return Status::ok_status();
}

}  // namespace

void register_bench(CLI::App& app, int& rc) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd =
      app.add_subcommand("bench", "Measure prompt processing and generation speed (llama-bench style)");
  cmd->add_option("-m,--model", o->models,
                  "A GGUF file or a Hugging Face folder; repeatable (default: the default model)");
  cmd->add_option("-p,--n-prompt", o->n_prompt,
                  "Prompt lengths to process, comma-separated or repeated (0: none)")
      ->delimiter(',')
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  cmd->add_option("-n,--n-gen", o->n_gen, "Tokens to generate (0: no generation test)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "CPU threads, comma-separated or repeated (0: physical cores)")
      ->delimiter(',')
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--batch", o->batch,
                  "Also generate with this many requests together, comma-separated or repeated")
      ->delimiter(',')
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--pg", o->pg,
                  "P,N: also P-token prompts with N tokens generated, --batch requests submitted together: "
                  "generated tokens a second over the whole run, prefill included (kiln serve's ceiling)")
      ->delimiter(',')
      ->expected(2)
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("-r,--reps", o->reps, "Timed repetitions of each test (after one untimed)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_option("-d,--device", o->device, "cpu, cuda or cuda:N (default: CUDA device 0 when there is one)");
  cmd->add_option("--gpu-layers", o->gpu_layers,
                  "Layers on the GPU, the first ones (-ngl N, as llama.cpp): the rest and the output head "
                  "run on the CPU; -1 (the default): all")
      ->check(CLI::Range(-1, 1 << 20));
  add_tensor_parallel_option(*cmd, o->tensor_parallel);
  cmd->add_option("-o,--output", o->output, "Output format: md, json or csv")
      ->check(CLI::IsMember({"md", "json", "csv"}))
      ->capture_default_str();
  add_kv_type_option(*cmd, o->kv_type);
  auto* qa = cmd->add_flag("--quantize-activations", o->quantize_activations,
                           "Lower-precision matmuls (as kiln run; the default, --exact turns it off)");
  cmd->add_flag("--exact", o->exact, "Exact f32 matmuls on every device")->excludes(qa);
  cmd->add_flag("--deterministic", o->deterministic,
                "Batch-invariant execution: a request's tokens do not depend on the requests beside it "
                "(slower on CUDA)");
  cmd->add_option(
         "--prompt-file", o->prompt_file,
         "The generation tests' prompt: this file's text instead of random tokens (the tg tests then "
         "time the tokens after the first, the prompt untimed)")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--chat", o->chat, "--prompt-file's text as a user message through the chat template");
  cmd->add_option("--depth", o->depth,
                  "The tg tests decode after this many random prompt tokens (untimed), as llama-bench's "
                  "-d: generation speed at that context")
      ->check(CLI::Range(0, 1 << 20))
      ->excludes("--prompt-file");
  add_spec_options(*cmd, o->spec);
  register_bench_serve(*cmd, rc);
  cmd->callback([o, &rc, cmd] {
    if (cmd->got_subcommand("serve")) return;  // kiln bench serve ran instead
    Status s = run_bench(*o);
    if (!s.ok()) rc = report_error("bench", s);
  });
}

}  // namespace kiln::cli
