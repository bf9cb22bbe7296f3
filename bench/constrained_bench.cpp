// The cost of constrained sampling in the engine: B requests decoding together, each N tokens, without and
// with a JSON schema constraint (Request::constraint), the two runs interleaved rep by rep on one engine.
//
//   constrained_bench [--model PATH] [--threads T] [--batch B] [--n N] [--reps R] [--temp T] [--device D]
//                     [--only plain|schema]
//
// The schema (an array of at least 40 small objects) cannot end within N <= 300 tokens, so both runs generate
// exactly B x N tokens (unconstrained ones with ignore_eos). Prints per run the median and the best over reps
// of the tokens/s (every generated token over the wall time from submit to the last finish, prefill
// included: the prompts are short) and the constrained/unconstrained ratios (on a shared machine, the best
// is the one to compare). KILN_STEP_PROFILE=1 splits a step's time
// (the masks are filled in its `batch` phase). --only runs one of the two (for a profile of one kind of step:
// KILN_CUDA_PROFILE=1 times each op kind, the sampling kernel with and without masks).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_args.h"
#include "kiln/kiln.h"

namespace {

using namespace kiln;
using Clock = std::chrono::steady_clock;

constexpr const char* kSchema = R"({"type": "array", "minItems": 40, "items": {"type": "object",
  "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0},
                 "city": {"type": "string", "maxLength": 24}},
  "required": ["name", "age", "city"], "additionalProperties": false}})";

std::string arg(int argc, char** argv, std::string_view flag, std::string fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (flag == argv[i]) return argv[i + 1];
  }
  return fallback;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}
double best(const std::vector<double>& v) { return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()); }

// Tokens/s of one batch: every request's tokens over the wall time.
double run_batch(Engine& engine, int32_t batch, int32_t n, float temp, bool constrained, int rep) {
  const char* prompts[] = {"List people with their ages and cities as JSON.", "Make up a table of customers.",
                           "Write a JSON array of famous scientists.", "Give me sample user records."};
  std::vector<uint64_t> ids;
  const auto t0 = Clock::now();
  for (int32_t b = 0; b < batch; ++b) {
    Request r;
    r.messages = {{"user", prompts[b % 4]}};
    r.sampling.temperature = temp;
    r.sampling.seed = static_cast<uint64_t>(1000 * rep + b);
    r.sampling.max_tokens = n;
    r.sampling.ignore_eos = true;
    r.cache_salt = "bench-" + std::to_string(rep) + "-" + std::to_string(b) + (constrained ? "c" : "u");
    if (constrained) r.constraint = {OutputConstraint::Kind::json_schema, kSchema};
    ids.push_back(bench::check(engine.submit(r, [](const TokenEvent&) {}), "submit"));
  }
  int64_t tokens = 0;
  for (const uint64_t id : ids) {
    const RequestStats st = bench::check(engine.wait(id), "wait");
    if (st.finish != FinishReason::length) {
      std::fprintf(stderr, "a request ended with %s, not length\n", finish_reason_name(st.finish));
      std::exit(1);
    }
    tokens += st.n_generated;
  }
  return static_cast<double>(tokens) / std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  EngineOptions o;
  const std::string home = std::getenv("HOME") != nullptr ? std::getenv("HOME") : ".";
  o.model_path = arg(argc, argv, "--model", home + "/.cache/kiln/models/SmolLM2-135M-Instruct.Q4_1.gguf");
  o.n_threads = std::stoi(arg(argc, argv, "--threads", "0"));
  o.backend = arg(argc, argv, "--device", "cpu");
  const int32_t batch = std::stoi(arg(argc, argv, "--batch", "8"));
  const int32_t n = std::stoi(arg(argc, argv, "--n", "128"));
  const int reps = std::stoi(arg(argc, argv, "--reps", "3"));
  const float temp = std::stof(arg(argc, argv, "--temp", "0.8"));
  const std::string only = arg(argc, argv, "--only", "");
  if (only != "" && only != "plain" && only != "schema") {
    std::fprintf(stderr, "--only %s: plain or schema\n", only.c_str());
    return 2;
  }
  const bool run_plain = only != "schema", run_schema = only != "plain";
  o.n_seq_max = batch;
  o.n_ctx = 512;
  o.quantize_activations = true;
  auto engine = bench::check(Engine::create(o), "load");
  // One untimed batch of each: the grammar compiled and cached, the kernels warm.
  if (run_plain) run_batch(*engine, batch, 8, temp, false, -1);
  if (run_schema) run_batch(*engine, batch, 8, temp, true, -1);
  std::vector<double> plain, constrained;
  for (int rep = 0; rep < reps; ++rep) {
    if (run_plain) plain.push_back(run_batch(*engine, batch, n, temp, false, rep));
    if (run_schema) constrained.push_back(run_batch(*engine, batch, n, temp, true, rep));
  }
  std::printf("%s, %s, %d threads, %d requests x %d tokens, temperature %.2f, %d reps\n",
              engine->model().name.c_str(), engine->model().backend.c_str(), engine->model().n_threads, batch,
              n, static_cast<double>(temp), reps);
  std::printf("tokens/s        median     best\n");
  if (run_plain) std::printf("unconstrained %8.1f %8.1f\n", median(plain), best(plain));
  if (run_schema) std::printf("json schema   %8.1f %8.1f\n", median(constrained), best(constrained));
  if (run_plain && run_schema) {
    std::printf("ratio         %8.3f %8.3f\n", median(constrained) / median(plain),
                best(constrained) / best(plain));
  }
  return 0;
}
