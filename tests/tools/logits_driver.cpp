// Runs kiln's forward pass for tests/python/test_llama_parity.py.
// usage:
// Every mode takes --quantize-x: matmuls on 8-bit activations; without it, exact f32 (the default);
// --kv-f16: an f16 KV cache (default f32); --f32: a Hugging Face folder MODEL imported with every tensor as
// f32; --device NAME: the backend (cpu, the default, or cuda[:N]); --split N: only the first N layers on it,
// the rest and the output head on a CPU backend of their own (logits: ModelOptions::rest, on any device;
// generate: EngineOptions::gpu_layers, a GPU device); --tp N: the model split over N ranks (tensor
// parallelism: N CPU backends, or cuda:0 .. N-1 with --device cuda). MODEL is a GGUF file or a Hugging Face
// folder.
//   logits_driver logits MODEL OUT.f32 [--chunk N] [--threads T]
//     stdin: a JSON list of token-id lists, one per sequence. All sequences go through Model::forward
//     together, one batch per step (with --chunk N each sequence contributes at most N tokens per step, so a
//     prompt is prefilled in chunks). Writes the f32 logits of every token of every sequence to OUT.f32, in
//     input order. stdout: {"ok": true, "n_vocab": V, "n_rows": R, "steps": S}
//   logits_driver generate MODEL N [--threads T]
//     stdin: a JSON list of prompt id lists. Greedy-generates exactly N tokens for each through the public
//     Engine API, all requests submitted at once (continuous batching). stdout: {"ok": true, "tokens":
//     [[...]], "elapsed_ms": submit to the last finish, "decode_ms": the longest request's decode}
// On error: {"ok": false, "error": "..."} and exit status 1.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "formats/gguf.h"
#include "kiln/kiln.h"
#include "models/model.h"
#include "models/tp_model.h"
#include "runtime/kv_cache/kv_cache.h"
#include "runtime/placement/offload.h"

namespace {

using nlohmann::json;

int fail(const std::string& msg) {
  std::printf("%s\n", json({{"ok", false}, {"error", msg}}).dump().c_str());
  return 1;
}

bool g_quantize_x = false;
// The context the model is told it serves (the engine's default): picks Phi-3's LongRoPE factors.
constexpr int32_t kContext = 4096;
std::string g_device = "cpu";  // --device NAME: cpu, cuda, cuda:N
bool g_force_f32 = false;      // --f32: a Hugging Face folder imported with every tensor as f32
kiln::DType g_kv_type = kiln::DType::f32;
int32_t g_split = -1;  // --split N
int32_t g_tp = 0;      // --tp N (1: one rank, through the tensor-parallel model all the same)

kiln::Status run_logits(const std::string& model_path, const std::string& out_path, int chunk, int threads,
                        const std::vector<std::vector<int32_t>>& seqs, json& header) {
  std::shared_ptr<const kiln::gguf::File> file;
  if (std::filesystem::is_directory(model_path)) {
    KILN_ASSIGN_OR_RETURN(file, kiln::import_hf_folder(model_path, g_force_f32));
  } else {
    KILN_ASSIGN_OR_RETURN(kiln::gguf::File f, kiln::gguf::File::open(model_path));
    file = std::make_shared<const kiln::gguf::File>(std::move(f));
  }
  kiln::BackendOptions bo;
  bo.n_threads = threads;
  bo.precision = g_quantize_x ? kiln::ops::Precision::precision_fast : kiln::ops::Precision::precision_exact;
  // --tp: the group goes after the backends (NCCL's communicators outlive the graphs that captured them).
  std::unique_ptr<kiln::CollectiveGroup> group;
  KILN_ASSIGN_OR_RETURN(auto backend, kiln::make_backend(g_device, bo));
  kiln::ModelOptions options;
  options.n_ctx = kContext;
  std::unique_ptr<kiln::Backend> rest;
  std::unique_ptr<kiln::OffloadRunner> host_stage;  // as the engine runs a split model's host layers
  if (g_split >= 0) {
    KILN_ASSIGN_OR_RETURN(rest, kiln::make_backend("cpu", bo));
    options.rest = rest.get();
    options.n_first_layers = g_split;
    host_stage = std::make_unique<kiln::OffloadRunner>(kiln::OffloadOptions{});
    options.host_stage = host_stage.get();
  }
  std::vector<std::unique_ptr<kiln::Backend>> tp_backends;  // ranks 1 .. N - 1
  std::unique_ptr<kiln::Model> model;
  if (g_tp >= 1) {
    std::vector<kiln::Backend*> ranks{backend.get()};
    for (int32_t r = 1; r < g_tp; ++r) {
      KILN_ASSIGN_OR_RETURN(auto b,
                            kiln::make_backend(g_device == "cpu" ? "cpu" : fmt::format("cuda:{}", r), bo));
      ranks.push_back(b.get());
      tp_backends.push_back(std::move(b));
    }
    KILN_ASSIGN_OR_RETURN(group, kiln::make_collective_group(ranks));
    KILN_ASSIGN_OR_RETURN(model, kiln::load_tp_model(file, ranks, *group, options));
  } else {
    KILN_ASSIGN_OR_RETURN(model, kiln::load_model(file, *backend, options));
  }
  const kiln::ModelInfo& info = model->info();
  constexpr int32_t kBlock = 16;
  int32_t n_blocks = 0;
  for (const auto& s : seqs) n_blocks += static_cast<int32_t>((s.size() + kBlock - 1) / kBlock);
  KILN_ASSIGN_OR_RETURN(kiln::KvBuffers kv, kiln::KvBuffers::allocate(*model, kBlock, n_blocks, g_kv_type));
  KILN_ASSIGN_OR_RETURN(kiln::KvCache cache, kiln::KvCache::create(n_blocks, kBlock));
  std::vector<std::vector<float>> out(seqs.size());
  std::vector<int32_t> done(seqs.size(), 0);
  for (size_t i = 0; i < seqs.size(); ++i) {
    // No prefix sharing here: every token's logits are wanted, so every token is computed.
    KILN_TRY(cache.add_sequence(static_cast<int64_t>(i), std::span<const int32_t>()).status());
  }
  int steps = 0;
  std::vector<float> logits;
  for (;;) {
    kiln::Batch batch;
    std::vector<std::pair<size_t, int32_t>> parts;  // (sequence, tokens in this step)
    for (size_t i = 0; i < seqs.size(); ++i) {
      const auto left = static_cast<int32_t>(seqs[i].size()) - done[i];
      if (left == 0) continue;
      const int32_t n = chunk > 0 ? std::min(chunk, left) : left;
      KILN_TRY(cache.reserve(static_cast<int64_t>(i), n));
      parts.emplace_back(i, n);
    }
    if (parts.empty()) break;
    for (size_t p = 0; p < parts.size(); ++p) {
      const auto [i, n] = parts[p];
      batch.block_tables.push_back(cache.block_table(static_cast<int64_t>(i)));
      for (int32_t j = 0; j < n; ++j) {
        batch.logit_rows.push_back(batch.n_tokens());
        batch.tokens.push_back(seqs[i][done[i] + j]);
        batch.positions.push_back(done[i] + j);
        batch.seq.push_back(static_cast<int32_t>(p));
      }
    }
    KILN_ASSIGN_OR_RETURN(const kiln::Tensor step_logits, model->forward(batch, kv));
    KILN_TRY(kiln::read_logits(model->output_backend(), step_logits, logits));
    size_t row = 0;
    for (const auto& [i, n] : parts) {
      cache.commit(static_cast<int64_t>(i), std::span<const int32_t>(seqs[i]).subspan(done[i], n));
      out[i].insert(out[i].end(), logits.begin() + row * info.n_vocab,
                    logits.begin() + (row + n) * info.n_vocab);
      row += n;
      done[i] += n;
    }
    ++steps;
  }
  std::ofstream os(out_path, std::ios::binary);
  size_t rows = 0;
  for (const auto& o : out) {
    os.write(reinterpret_cast<const char*>(o.data()), static_cast<std::streamsize>(o.size() * sizeof(float)));
    rows += o.size() / info.n_vocab;
  }
  if (!os) return kiln::io_error("cannot write {}", out_path);
  header = {{"ok", true}, {"n_vocab", info.n_vocab}, {"n_rows", rows}, {"steps", steps}};
  return kiln::Status::ok_status();
}

kiln::Status run_generate(const std::string& model_path, int n, int threads,
                          const std::vector<std::vector<int32_t>>& prompts, json& header) {
  kiln::EngineOptions opt;
  opt.model_path = model_path;
  opt.n_threads = threads;
  opt.n_seq_max = static_cast<int32_t>(std::max<size_t>(prompts.size(), 1));
  opt.n_ctx = 1024;
  opt.quantize_activations = g_quantize_x;
  opt.backend = g_device;
  opt.gpu_layers = g_split;
  opt.tensor_parallel = std::max(g_tp, 1);
  opt.kv_type = kiln::dtype_name(g_kv_type);
  KILN_ASSIGN_OR_RETURN(auto engine, kiln::Engine::create(opt));
  std::vector<std::vector<int32_t>> tokens(prompts.size());
  std::vector<uint64_t> ids;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < prompts.size(); ++i) {
    kiln::Request req;
    req.prompt_tokens = prompts[i];
    req.sampling.temperature = 0;
    req.sampling.max_tokens = n;
    req.sampling.ignore_eos = true;
    KILN_ASSIGN_OR_RETURN(uint64_t id, engine->submit(req, [&tokens, i](const kiln::TokenEvent& ev) {
      if (ev.token >= 0) tokens[i].push_back(ev.token);
    }));
    ids.push_back(id);
  }
  double decode_ms = 0;  // the longest request's decode: all of them decode together
  for (uint64_t id : ids) {
    KILN_ASSIGN_OR_RETURN(kiln::RequestStats st, engine->wait(id));
    if (st.finish == kiln::FinishReason::error)
      return kiln::make_status(kiln::StatusCode::internal, "request failed");
    decode_ms = std::max(decode_ms, st.decode_ms);
  }
  const double elapsed_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  header = {{"ok", true}, {"tokens", tokens}, {"elapsed_ms", elapsed_ms}, {"decode_ms", decode_ms}};
  return kiln::Status::ok_status();
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  int chunk = 0, threads = 0;
  std::vector<std::string> pos;
  for (size_t i = 0; i < args.size(); ++i) {
    if ((args[i] == "--chunk" || args[i] == "--threads") && i + 1 < args.size()) {
      (args[i] == "--chunk" ? chunk : threads) = std::stoi(args[i + 1]);
      ++i;
    } else if (args[i] == "--split" && i + 1 < args.size()) {
      g_split = std::stoi(args[++i]);
    } else if (args[i] == "--tp" && i + 1 < args.size()) {
      g_tp = std::stoi(args[++i]);
    } else if (args[i] == "--device" && i + 1 < args.size()) {
      g_device = args[++i];
    } else if (args[i] == "--kv-f16") {
      g_kv_type = kiln::DType::f16;
    } else if (args[i] == "--quantize-x") {
      g_quantize_x = true;
    } else if (args[i] == "--f32") {
      g_force_f32 = true;
    } else {
      pos.push_back(args[i]);
    }
  }
  if (pos.size() != 3 || (pos[0] != "logits" && pos[0] != "generate")) {
    return fail("usage: logits_driver logits MODEL OUT.f32 [--chunk N] | generate MODEL N [--threads T]");
  }
  std::vector<std::vector<int32_t>> seqs;
  try {
    const std::string in((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    seqs = json::parse(in).get<std::vector<std::vector<int32_t>>>();
  } catch (const std::exception& e) {
    return fail(std::string("bad stdin: ") + e.what());
  }
  json header;
  const kiln::Status st = pos[0] == "logits" ? run_logits(pos[1], pos[2], chunk, threads, seqs, header)
                                             : run_generate(pos[1], std::stoi(pos[2]), threads, seqs, header);
  if (!st.ok()) return fail(st.message());
  std::printf("%s\n", header.dump().c_str());
  return 0;
}
