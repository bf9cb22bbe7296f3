// kiln run: one generation from a prompt (or, with --chat, from one user message through the chat template).
// kiln chat: a multi-turn conversation on stdin/stdout.
// Generated text goes to stdout as it streams; counts, speeds and load time go to stderr.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>

#include "cli_util.h"
#include "commands.h"
#include "kiln/kiln.h"

namespace kiln::cli {
namespace {

struct GenOptions {
  std::string model;
  std::string prompt;
  std::string system;
  int32_t n_predict = 256;
  int32_t n_ctx = 0;
  int32_t n_threads = 0;
  std::string kv_type = "auto";
  std::string kv_memory;  // --kv-memory SIZE, checked by parse_byte_size; empty: the engine's default
  bool chat = false;
  bool quiet = false;
  std::string device = "auto";
  int32_t gpu_layers = -1;
  int32_t tensor_parallel = 1;
  bool quantize_activations = false;
  bool exact = false;
  bool deterministic = false;
  SpecOptions spec;
  SamplingParams sampling;
  // kiln run's structured output: at most one of these (CLI11 enforces it).
  std::string json_schema_file, grammar_file, regex;
};

// The constraint --json-schema / --grammar / --regex ask for (kind none without them); files are read here.
Result<OutputConstraint> constraint_of(const GenOptions& o) {
  OutputConstraint c;
  const auto read = [](const std::string& path, std::string_view flag) -> Result<std::string> {
    std::ifstream f(path, std::ios::binary);
    if (!f) return io_error("{} {}: cannot be opened", flag, path);
    std::ostringstream text;
    text << f.rdbuf();
    return text.str();
  };
  if (!o.json_schema_file.empty()) {
    c.kind = OutputConstraint::Kind::json_schema;
    KILN_ASSIGN_OR_RETURN(c.text, read(o.json_schema_file, "--json-schema"));
  } else if (!o.grammar_file.empty()) {
    c.kind = OutputConstraint::Kind::gbnf;
    KILN_ASSIGN_OR_RETURN(c.text, read(o.grammar_file, "--grammar"));
  } else if (!o.regex.empty()) {
    c.kind = OutputConstraint::Kind::regex;
    c.text = o.regex;
  }
  return c;
}

void add_model_options(CLI::App* cmd, GenOptions& o) {
  cmd->add_option("-m,--model", o.model, "A GGUF file or a Hugging Face folder (default: the default model)");
  cmd->add_option("-c,--ctx-size", o.n_ctx, "Context size in tokens (default: min(model's, 4096))")
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_option(
      "-d,--device", o.device,
      "Where the model runs: cpu, cuda or cuda:N (default: CUDA device 0 when there is one, else cpu)");
  cmd->add_option("--gpu-layers", o.gpu_layers,
                  "Layers on the GPU, the first ones (-ngl N, as llama.cpp): the rest and the output head "
                  "run on the CPU; -1 (the default): all")
      ->check(CLI::Range(-1, 1 << 20));
  add_tensor_parallel_option(*cmd, o.tensor_parallel);
  cmd->add_option("-t,--threads", o.n_threads, "CPU threads (default: physical cores)")
      ->check(CLI::Range(0, 1 << 20));
  add_kv_type_option(*cmd, o.kv_type);
  cmd->add_option("--kv-memory", o.kv_memory,
                  "KV cache size, e.g. 512M or 2G (powers of 1024); requests beyond it are preempted and "
                  "recomputed (default: what the context needs, at most half of the available memory)")
      ->check(CLI::Validator(
          [](std::string& s) {
            auto r = parse_byte_size(s);
            return r.ok() ? std::string() : r.status().message();
          },
          "SIZE"));
  cmd->add_option("--temp", o.sampling.temperature, "Temperature; 0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", o.sampling.top_k, "Top-k; 0 = off")->capture_default_str();
  cmd->add_option("--top-p", o.sampling.top_p, "Top-p (nucleus); 1 = off")->capture_default_str();
  cmd->add_option("--min-p", o.sampling.min_p, "Min-p; 0 = off")->capture_default_str();
  cmd->add_option("--repeat-penalty", o.sampling.repeat_penalty, "Repetition penalty; 1 = off")
      ->capture_default_str();
  cmd->add_option("--repeat-last-n", o.sampling.repeat_last_n, "Tokens the penalties look back at; -1 = all")
      ->capture_default_str();
  cmd->add_option("--presence-penalty", o.sampling.presence_penalty, "Presence penalty")
      ->capture_default_str();
  cmd->add_option("--frequency-penalty", o.sampling.frequency_penalty, "Frequency penalty")
      ->capture_default_str();
  cmd->add_option("-s,--seed", o.sampling.seed, "Random seed")->capture_default_str();
  cmd->add_option("--stop", o.sampling.stop, "Stop string (repeatable)");
  cmd->add_flag("--ignore-eos", o.sampling.ignore_eos, "Keep generating after end-of-generation tokens");
  auto* qa = cmd->add_flag("--quantize-activations", o.quantize_activations,
                           "Lower-precision matmuls, faster: on the CPU 8-bit activations with integer dot "
                           "products, as llama.cpp does (~1e-3 relative error); on CUDA bf16 tensor cores "
                           "(the default on every device; --exact turns it off)");
  cmd->add_flag("--exact", o.exact, "Exact f32 matmuls on every device (the reference path)")->excludes(qa);
  cmd->add_flag("--deterministic", o.deterministic,
                "Batch-invariant execution: a request's tokens do not depend on the requests beside it "
                "(slower on CUDA)");
  add_spec_options(*cmd, o.spec);
}

Result<std::unique_ptr<Engine>> open_engine(const GenOptions& o) {
  EngineOptions eo;
  KILN_ASSIGN_OR_RETURN(eo.model_path, resolve_model_path(o.model));
  eo.n_ctx = o.n_ctx;
  eo.n_threads = o.n_threads;
  eo.kv_type = o.kv_type;
  if (!o.kv_memory.empty()) {
    KILN_ASSIGN_OR_RETURN(eo.kv_memory_bytes, parse_byte_size(o.kv_memory));
  }
  eo.backend = o.device;
  eo.gpu_layers = o.gpu_layers;
  eo.tensor_parallel = o.tensor_parallel;
  // The fast path (8-bit activations on the CPU, tensor cores on a GPU) unless --exact.
  eo.quantize_activations = !o.exact;
  eo.deterministic = o.deterministic;
  o.spec.apply(eo);
  return Engine::create(eo);
}

// Streams one request's text to stdout; returns its statistics.
Result<RequestStats> generate(Engine& engine, const Request& req, std::string* reply) {
  std::string error;  // the engine's reason when the request ends in an error
  KILN_ASSIGN_OR_RETURN(uint64_t id, engine.submit(req, [reply, &error](const TokenEvent& ev) {
    if (ev.finish == FinishReason::error) error = ev.error;
    if (!ev.text.empty()) {
      std::fwrite(ev.text.data(), 1, ev.text.size(), stdout);
      std::fflush(stdout);
      if (reply) *reply += ev.text;
    }
  }));
  KILN_ASSIGN_OR_RETURN(RequestStats st, engine.wait(id));
  if (st.finish == FinishReason::error)
    return make_status(StatusCode::internal, "generation failed: {}",
                       error.empty() ? "no reason given" : error);
  return st;
}

void print_stats(const Engine& engine, const RequestStats& st) {
  const ModelDescription& m = engine.model();
  const int32_t computed = st.n_prompt - st.n_cached;
  const bool host = m.n_gpu_layers == 0;  // every layer on the CPU
  const bool split = !host && m.n_gpu_layers < m.n_layers;
  const std::string where = host    ? fmt::format("{}, {} threads", m.backend, m.n_threads)
                            : split ? fmt::format("{} (the first {} of {} layers on the GPU, {} CPU threads)",
                                                  m.backend, m.n_gpu_layers, m.n_layers, m.n_threads)
                                    : m.backend;
  // The backend's own copy of the weights: the CPU's repacked matrices (the file's pages of them are
  // dropped), a GPU's device memory.
  const std::string copy = m.prepared_bytes == 0
                               ? ""
                               : fmt::format(" ({:.2f} GiB {})", m.prepared_bytes / 1073741824.0,
                                             host    ? "repacked"
                                             : split ? "on the device and repacked"
                                                     : "on the device");
  std::fprintf(
      stderr,
      "\n%s on %s: load %.0f ms, context %d, weights %.2f GiB%s, KV cache %.2f GiB, scratch %.1f MiB\n",
      m.name.c_str(), where.c_str(), m.load_ms, m.n_ctx, m.weight_bytes / 1073741824.0, copy.c_str(),
      m.kv_bytes / 1073741824.0, engine.metrics().scratch_bytes / 1048576.0);
  std::fprintf(stderr, "prompt:  %d tokens (%d cached) in %.0f ms, %.1f tokens/s\n", st.n_prompt, st.n_cached,
               st.prefill_ms, st.prefill_ms > 0 ? computed * 1000.0 / st.prefill_ms : 0.0);
  // The first token comes out of the prefill; the decode rate counts the ones after it.
  const int32_t decoded = std::max(st.n_generated - 1, 0);
  std::fprintf(stderr, "decode:  %d tokens in %.0f ms, %.1f tokens/s (finish: %s)\n", st.n_generated,
               st.decode_ms, st.decode_ms > 0 ? decoded * 1000.0 / st.decode_ms : 0.0,
               finish_reason_name(st.finish));
  const EngineMetrics em = engine.metrics();
  if (em.n_draft_tokens > 0) {
    std::fprintf(stderr, "drafts:  %llu of %llu draft tokens kept (%.1f%%), %.2f tokens a verifying step\n",
                 static_cast<unsigned long long>(em.n_accepted_tokens),
                 static_cast<unsigned long long>(em.n_draft_tokens),
                 100.0 * static_cast<double>(em.n_accepted_tokens) / static_cast<double>(em.n_draft_tokens),
                 1.0 + static_cast<double>(em.n_accepted_tokens) / static_cast<double>(em.n_drafts));
  }
}

Status run_run(GenOptions o) {
  KILN_ASSIGN_OR_RETURN(auto engine, open_engine(o));
  Request req;
  o.sampling.max_tokens = o.n_predict < 0 ? engine->model().n_ctx : o.n_predict;
  req.sampling = o.sampling;
  KILN_ASSIGN_OR_RETURN(req.constraint, constraint_of(o));
  if (o.chat) {
    if (!o.system.empty()) req.messages.push_back({"system", o.system});
    req.messages.push_back({"user", o.prompt});
  } else {
    req.prompt = o.prompt;
  }
  KILN_ASSIGN_OR_RETURN(RequestStats st, generate(*engine, req, nullptr));
  // On a terminal, end the line for the prompt that follows; into a file or a pipe, the text exactly as
  // generated (`kiln run ... > f` must not add a newline the model did not write).
  if (isatty(STDOUT_FILENO) != 0) std::fputs("\n", stdout);
  std::fflush(stdout);
  print_stats(*engine, st);
  return Status::ok_status();
}

Status run_chat(GenOptions o) {
  KILN_ASSIGN_OR_RETURN(auto engine, open_engine(o));
  if (!engine->model().has_chat_template) {
    return invalid_argument("{}: the model has no chat template; use kiln run", engine->model().path);
  }
  const bool tty = isatty(STDIN_FILENO) != 0;
  std::vector<ChatMessage> history;
  if (!o.system.empty()) history.push_back({"system", o.system});
  const size_t base = history.size();
  if (tty)
    std::fprintf(stderr, "kiln chat: %s. /reset starts over, Ctrl-D exits.\n", engine->model().name.c_str());
  std::string line;
  for (;;) {
    if (tty) std::fputs("> ", stderr);
    if (!std::getline(std::cin, line)) break;
    if (line.empty()) continue;
    if (line == "/reset") {
      history.resize(base);
      if (tty) std::fputs("(conversation reset)\n", stderr);
      continue;
    }
    history.push_back({"user", line});
    Request req;
    req.messages = history;
    req.sampling = o.sampling;
    req.sampling.max_tokens = o.n_predict < 0 ? engine->model().n_ctx : o.n_predict;
    std::string reply;
    auto st = generate(*engine, req, &reply);
    std::fputs("\n", stdout);
    std::fflush(stdout);
    if (!st.ok()) {
      history.pop_back();
      // A conversation that outgrew the context: say so and let the user /reset.
      std::fprintf(stderr, "kiln chat: error: %s\n", st.status().message().c_str());
      continue;
    }
    history.push_back({"assistant", reply});
    if (!o.quiet) print_stats(*engine, *st);
  }
  return Status::ok_status();
}

}  // namespace

void register_run(CLI::App& app, int& rc) {
  auto o = std::make_shared<GenOptions>();
  CLI::App* cmd = app.add_subcommand("run", "Generate text from a prompt");
  cmd->add_option("-p,--prompt", o->prompt, "The prompt ('-' reads standard input)")->required();
  cmd->add_option("-n,--n-predict", o->n_predict,
                  "Tokens to generate at most; -1 = until the context is full")
      ->check(CLI::Range(-1, std::numeric_limits<int32_t>::max()))
      ->capture_default_str();
  cmd->add_flag("--chat", o->chat, "Send the prompt as a user message through the model's chat template");
  cmd->add_option("--system", o->system, "System message (with --chat)");
  // Structured output (docs/structured-output.md): each token is drawn among those that keep the text inside
  // the language, and the text ends where the language allows it.
  auto* schema = cmd->add_option("--json-schema", o->json_schema_file,
                                 "Constrain the output to JSON that a JSON schema (this file) accepts")
                     ->check(CLI::ExistingFile);
  auto* gbnf = cmd->add_option("--grammar", o->grammar_file,
                               "Constrain the output to a GBNF grammar (this file; start rule root)")
                   ->check(CLI::ExistingFile);
  auto* regex = cmd->add_option("--regex", o->regex, "Constrain the output to match a regular expression");
  schema->excludes(gbnf)->excludes(regex);
  gbnf->excludes(regex);
  add_model_options(cmd, *o);
  cmd->callback([o, &rc] {
    if (o->prompt == "-") {
      o->prompt.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    }
    Status s = run_run(*o);
    if (!s.ok()) rc = report_error("run", s);
  });
}

void register_chat(CLI::App& app, int& rc) {
  auto o = std::make_shared<GenOptions>();
  CLI::App* cmd =
      app.add_subcommand("chat", "Chat with a model (reads lines from stdin when it is not a terminal)");
  cmd->add_option("--system", o->system, "System message");
  cmd->add_option("-n,--n-predict", o->n_predict, "Tokens per reply at most; -1 = until the context is full")
      ->check(CLI::Range(-1, std::numeric_limits<int32_t>::max()))
      ->capture_default_str();
  cmd->add_flag("-q,--quiet", o->quiet, "No speed summary after each reply");
  add_model_options(cmd, *o);
  cmd->callback([o, &rc] {
    Status s = run_chat(*o);
    if (!s.ok()) rc = report_error("chat", s);
  });
}

}  // namespace kiln::cli
