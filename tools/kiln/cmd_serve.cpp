// kiln serve: the OpenAI-compatible HTTP server (src/server/). It listens at once and answers /health with
// 503 while the model loads; SIGINT or SIGTERM stops it gracefully: no new connections or requests, the
// requests in flight finish (or are cancelled after --shutdown-timeout), exit status 0.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "kiln/kiln.h"
#include "server/api.h"
#include "server/http.h"

namespace kiln::cli {
namespace {

// The default bound on queued tokens: 1/8 of the machine's memory at what a queued token is reckoned to hold
// (server::kQueuedTokenBytes; server::queued_charge), so that a burst cannot take the server's memory, and
// short of that every valid request waits its turn.
int64_t default_max_queued_tokens() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return int64_t{1} << 24;
  return static_cast<int64_t>(pages) * page / 8 / server::kQueuedTokenBytes;
}

struct ServeOptions {
  std::string model;
  std::string alias;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::vector<std::string> api_keys;
  int32_t parallel = 4;
  int32_t n_ctx = 0;
  int32_t n_threads = 0;
  int32_t max_queue = 0;
  int64_t max_queued_tokens = -1;  // -1: from the machine's memory (default_max_queued_tokens)
  double queue_timeout = 0;
  int32_t max_batch_tokens = 0;  // 0: by device (EngineOptions)
  int32_t http_threads = 2;
  std::string max_body = "8M";
  std::string kv_type = "auto";
  std::string kv_memory;
  std::string device = "auto";
  int32_t gpu_layers = -1;
  int32_t tensor_parallel = 1;
  double shutdown_timeout = 30;
  int32_t http_timeout = 60;
  bool quantize_activations = false;
  bool exact = false;
  bool deterministic = false;
  SpecOptions spec;
};

Status run_serve(const ServeOptions& o) {
  EngineOptions eo;
  KILN_ASSIGN_OR_RETURN(eo.model_path, resolve_model_path(o.model));
  eo.n_ctx = o.n_ctx;
  eo.n_threads = o.n_threads;
  eo.n_seq_max = o.parallel;
  eo.max_batch_tokens = o.max_batch_tokens;
  eo.kv_type = o.kv_type;
  if (!o.kv_memory.empty()) {
    KILN_ASSIGN_OR_RETURN(eo.kv_memory_bytes, parse_byte_size(o.kv_memory));
  }
  eo.backend = o.device;
  eo.gpu_layers = o.gpu_layers;
  eo.tensor_parallel = o.tensor_parallel;
  eo.quantize_activations = !o.exact;  // the fast path on every device, as kiln run
  eo.deterministic = o.deterministic;
  o.spec.apply(eo);
  eo.queue_timeout_ms = static_cast<int64_t>(o.queue_timeout * 1000.0);

  server::HttpOptions ho;
  ho.host = o.host;
  ho.port = static_cast<uint16_t>(o.port);
  ho.io_threads = o.http_threads;
  ho.timeout = std::chrono::seconds(o.http_timeout);
  KILN_ASSIGN_OR_RETURN(ho.max_body_bytes, parse_byte_size(o.max_body));
  server::ApiOptions ao;
  // The file name without .gguf (a folder: its name), as llama-server lists it.
  const std::filesystem::path path(eo.model_path);
  ao.model_name = !o.alias.empty()              ? o.alias
                  : path.extension() == ".gguf" ? path.stem().string()
                                                : path.filename().string();
  ao.api_keys = o.api_keys;
  ao.max_queue = o.max_queue;
  ao.max_queued_tokens = o.max_queued_tokens >= 0 ? o.max_queued_tokens : default_max_queued_tokens();
  server::Api api(ao);

  // SIGINT and SIGTERM are taken by sigwait() below: blocked in this thread and every thread started after.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  KILN_ASSIGN_OR_RETURN(
      auto http, server::HttpServer::create(
                     ho, [&api](const server::HttpRequest& req, const std::shared_ptr<server::Exchange>& ex) {
                       api.handle(req, ex);
                     }));
  std::thread io([&http] { http->run(); });
  std::fprintf(stderr, "kiln serve: listening on http://%s:%u, loading %s\n", o.host.c_str(), http->port(),
               eo.model_path.c_str());
  auto engine = Engine::create(eo);
  if (!engine.ok()) {
    http->stop();
    io.join();
    return engine.status();
  }
  const ModelDescription& m = (*engine)->model();
  api.set_engine(engine->get());
  std::fprintf(stderr,
               "kiln serve: %s on %s: context %d, %d requests at once, KV cache %s %.2f GiB (%lld tokens); "
               "serving '%s' at http://%s:%u\n",
               m.name.c_str(), m.backend.c_str(), m.n_ctx, o.parallel, m.kv_type.c_str(),
               m.kv_bytes / 1073741824.0, static_cast<long long>(m.kv_blocks) * m.kv_block_size,
               ao.model_name.c_str(), o.host.c_str(), http->port());

  int sig = 0;
  sigwait(&signals, &sig);
  std::fprintf(stderr, "kiln serve: %s: finishing %lld requests in flight (at most %.0f s)\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM", static_cast<long long>(api.in_flight()),
               o.shutdown_timeout);
  http->stop_accepting();
  api.stop_admitting();
  const auto until = [&](double seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (api.in_flight() > 0 && std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  };
  until(o.shutdown_timeout);
  if (api.in_flight() > 0) {
    std::fprintf(stderr, "kiln serve: cancelling %lld requests\n", static_cast<long long>(api.in_flight()));
    api.cancel_all();
    until(5.0);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the last answers leave their sockets
  http->stop();
  io.join();
  api.set_engine(nullptr);
  engine->reset();
  std::fprintf(stderr, "kiln serve: stopped\n");
  return Status::ok_status();
}

}  // namespace

void register_serve(CLI::App& app, int& rc) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
  cmd->add_option("-m,--model", o->model,
                  "A GGUF file or a Hugging Face folder (default: the default model)");
  cmd->add_option("--alias", o->alias, "The model name clients use (default: the file or folder name)");
  cmd->add_option("--host", o->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", o->port, "Port to listen on (0: any free one)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--api-key", o->api_keys, "Accept this bearer key (repeatable; none: no authentication)");
  cmd->add_option("--parallel", o->parallel, "Requests decoded together")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_option("--max-queue", o->max_queue, "Requests waiting at most; more get 503 (0: no limit)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--max-queued-tokens", o->max_queued_tokens,
                  "Prompt tokens of requests not started yet at most, each choice counting 256 more (and "
                  "its logit_bias and stop strings); more get 503 (0: no limit; default: what 1/8 of this "
                  "machine's memory holds at 64 bytes a token)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  cmd->add_option("--queue-timeout", o->queue_timeout,
                  "Seconds a request may wait for admission; later it gets 503 (0: no limit)")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  cmd->add_option("--max-batch-tokens", o->max_batch_tokens,
                  "Tokens per step: long prompts are prefilled in chunks of this size between decode steps "
                  "(default: 512 on the CPU, 2048 on a GPU)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("-c,--ctx-size", o->n_ctx,
                  "Context size in tokens per request (default: min(model's, 4096))")
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_option("-t,--threads", o->n_threads, "CPU threads (default: physical cores)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option(
      "-d,--device", o->device,
      "Where the model runs: cpu, cuda or cuda:N (default: CUDA device 0 when there is one, else cpu)");
  cmd->add_option("--gpu-layers", o->gpu_layers,
                  "Layers on the GPU, the first ones (-ngl N, as llama.cpp): the rest and the output head "
                  "run on the CPU; -1 (the default): all")
      ->check(CLI::Range(-1, 1 << 20));
  add_tensor_parallel_option(*cmd, o->tensor_parallel);
  add_kv_type_option(*cmd, o->kv_type);
  cmd->add_option("--kv-memory", o->kv_memory,
                  "KV cache size, e.g. 2G (default: what --parallel requests need)");
  cmd->add_option("--http-threads", o->http_threads, "Threads serving connections")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->add_option("--http-timeout", o->http_timeout,
                  "Seconds a client has to send a whole request, and to take each piece of an answer")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  cmd->add_option("--max-body", o->max_body, "Largest request body; larger ones get 413")
      ->capture_default_str();
  cmd->add_option("--shutdown-timeout", o->shutdown_timeout,
                  "Seconds the requests in flight get to finish on SIGINT/SIGTERM before they are cancelled")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  auto* qa = cmd->add_flag("--quantize-activations", o->quantize_activations,
                           "Lower-precision matmuls, faster: the default (as kiln run)");
  cmd->add_flag("--exact", o->exact, "Exact f32 matmuls on every device")->excludes(qa);
  cmd->add_flag("--deterministic", o->deterministic,
                "Batch-invariant execution: a request's tokens do not depend on the requests beside it "
                "(slower on CUDA)");
  add_spec_options(*cmd, o->spec);
  cmd->callback([o, &rc] {
    Status s = run_serve(*o);
    if (!s.ok()) rc = report_error("serve", s);
  });
}

}  // namespace kiln::cli
