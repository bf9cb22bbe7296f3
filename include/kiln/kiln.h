// The kiln C++ API: load a model, submit generation requests (a prompt, token ids or chat messages, with
// sampling parameters), receive tokens through a streaming callback, cancel. The CLI uses only this API.
//
//   auto engine = kiln::Engine::create({.model_path = "model.gguf"});
//   kiln::Request req;
//   req.prompt = "The capital of France is";
//   req.sampling.temperature = 0;
//   auto id = (*engine)->submit(req, [](const kiln::TokenEvent& ev) { std::cout << ev.text; });
//   (*engine)->wait(*id);
//
// Requests run concurrently (continuous batching: up to EngineOptions::n_seq_max at once, the rest queue).
// Callbacks are called from the engine's thread, in order per request, and must not block for long.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "kiln/sampling.h"

namespace kiln {

struct EngineOptions {
  std::string model_path;          // a GGUF file or a Hugging Face folder
  int32_t n_threads = 0;           // CPU threads; 0: physical cores
  int32_t n_ctx = 0;               // tokens per sequence (prompt + output); 0: min(training context, 4096)
  int32_t n_seq_max = 1;           // sequences decoded together; more requests wait in a queue
  int32_t max_batch_tokens = 512;  // tokens per forward step (prefill chunks are cut to fit)
  int32_t kv_block_size = 16;      // tokens per KV cache block
  std::string kv_type = "f32";     // "f32" or "f16"
  std::string backend = "cpu";
  // Matmuls on 8-bit quantized activations with integer dot products, as llama.cpp does (faster decode;
  // ~1e-3 relative error per product). false: exact f32 activations.
  bool quantize_activations = false;
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

struct Request {
  // Exactly one of these is the prompt:
  std::string prompt;                  // text, tokenized with the model's BOS rule
  std::vector<int32_t> prompt_tokens;  // token ids as they are
  std::vector<ChatMessage> messages;   // a conversation, rendered with the model's chat template
  SamplingParams sampling;
};

enum class FinishReason { none, stop, length, cancelled, error };
const char* finish_reason_name(FinishReason r);  // "stop", "length", ...

// One streamed event. Tokens come with the text they complete (possibly empty: a character split over byte
// tokens, or text held back because it may start a stop string). The last event has done = true.
struct TokenEvent {
  int32_t token = -1;  // -1 on the final event when it carries no token
  std::string text;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;  // SamplingParams::n_logprobs alternatives
  bool done = false;
  FinishReason finish = FinishReason::none;  // set when done
  std::string error;                         // finish == error
};
using TokenCallback = std::function<void(const TokenEvent&)>;

struct RequestStats {
  int32_t n_prompt = 0;     // prompt tokens
  int32_t n_cached = 0;     // prompt tokens found in the prefix cache (not recomputed)
  int32_t n_generated = 0;  // tokens sampled
  double prefill_ms = 0;    // from admission to the first sampled token
  double decode_ms = 0;     // from the first sampled token to the end
  FinishReason finish = FinishReason::none;
};

struct ModelDescription {
  std::string path, name, architecture;
  int32_t n_vocab = 0, n_ctx = 0, n_ctx_train = 0, n_layers = 0, n_embd = 0;
  int64_t n_params = 0;
  uint64_t weight_bytes = 0, kv_bytes = 0;
  int32_t n_threads = 0;
  double load_ms = 0;
  bool has_chat_template = false;
};

class Engine {
 public:
  // Loads the model and starts the engine thread. Errors: a missing or malformed file, an unsupported
  // architecture, bad options — each named.
  static Result<std::unique_ptr<Engine>> create(const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request. Errors (nothing queued): bad sampling parameters, an empty prompt, a prompt that does
  // not fit the context, a chat request for a model without a template.
  Result<uint64_t> submit(const Request& request, TokenCallback callback);
  // Stops a request; its callback gets a final event with FinishReason::cancelled. Unknown ids are ignored.
  void cancel(uint64_t id);
  // Blocks until the request has finished; its statistics. not_found for an unknown (or already waited) id.
  Result<RequestStats> wait(uint64_t id);

  const ModelDescription& model() const;
  Result<std::vector<int32_t>> tokenize(const std::string& text, bool add_special) const;
  Result<std::string> detokenize(const std::vector<int32_t>& ids) const;
  // The prompt text a conversation renders to (with the assistant turn opened).
  Result<std::string> render_chat(const std::vector<ChatMessage>& messages) const;

  struct Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
