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
// Requests run concurrently (continuous batching: up to EngineOptions::n_seq_max at once, the rest queue,
// first come first served). The KV cache is a pool of blocks sized by a memory budget (kv_memory_bytes);
// when it runs out, the newest running request is preempted and later recomputed, with the same output.
// Token callbacks are called on one thread of the engine's own, in order per request (and across requests in
// the order their events were made). The engine does not wait for them: it runs its next step while they
// format and send the last one's events, but a slow callback delays every request's events. A callback must
// not wait() for an unfinished request or drain() (both return invalid_argument there).
//
// A finished request's state (sampler, callback, KV blocks) is released as soon as it finishes, whether or
// not anyone waits for it. Only its RequestStats are kept for wait(): until wait() takes them, or until
// EngineOptions::keep_finished requests have finished after it, whichever comes first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/sampling.h"
#include "kiln/status.h"

namespace kiln {

struct EngineOptions {
  std::string model_path;  // a GGUF file or a Hugging Face folder
  int32_t n_threads = 0;   // CPU threads; 0: physical cores
  int32_t n_ctx = 0;       // tokens per sequence (prompt + output); 0: min(training context, 4096)
  int32_t n_seq_max = 1;   // sequences decoded together; more requests wait in a queue
  // Tokens per forward step (prefill chunks are cut to fit); 0: by device, 512 on the CPU and 2048 on a GPU
  // (whose steps cost more to launch: fewer, larger prefill chunks).
  int32_t max_batch_tokens = 0;
  int32_t kv_block_size = 16;  // tokens per KV cache block
  // "f32", "f16", "q8_0" (blocks of 32 int8 values and an f16 scale, 0.53x f16's bytes), "q8_64" (the same
  // over blocks of 64: 0.52x; head_dim a multiple of 64), or "auto": the
  // backend's preference (Backend::preferred_kv_type): f16 on a GPU with quantize_activations (as llama.cpp's
  // default cache), else f32.
  std::string kv_type = "auto";
  // Where the model runs: "cpu", "cuda" / "cuda:N" (a build with CUDA), or "auto" (CUDA device 0 when there
  // is one, else the CPU).
  std::string backend = "cpu";
  // Partial offload, with a CUDA backend: only the first gpu_layers layers (and the token embedding) run on
  // the GPU; the later layers, the final norm and the output head run on the CPU (n_threads), each layer's
  // K/V where the layer runs. -1: every layer when the weights fit in the GPU's free memory less what is kept
  // for the KV cache and scratch (max(1 GiB, 10%)), else as many leading layers as fit there (a warning says
  // so); >= the model's layers: every layer; 0: the whole model on the CPU. With backend "cpu" it must stay
  // -1; with "auto" on a machine without a GPU it is ignored.
  int32_t gpu_layers = -1;
  // Tensor parallelism: the model split over this many ranks (models/tp_plan.h), each its heads and FFN
  // features of every layer: CUDA devices N, N + 1, ... (backend "cuda:N"; "cuda" and "auto": from 0), over
  // NCCL; with backend "cpu", threads of this process that share n_threads (a check of the partition).
  // 1: one device. gpu_layers must stay -1.
  int32_t tensor_parallel = 1;
  // Under partial offload, the fewest tokens of a step (a prompt's) whose CPU layers' matmuls run on the GPU,
  // their weights uploaded for the step; 0: never.
  int32_t offload_min_tokens = 32;
  // Matmuls at lower precision, faster: on the CPU, 8-bit quantized activations with integer dot products, as
  // llama.cpp does (~1e-3 relative error per product); on CUDA, bf16 / f16 tensor cores for batches of more
  // than 8 tokens, and prefill attention on f16 tensor cores. false: exact f32 activations.
  bool quantize_activations = false;
  // Batch-invariant execution: a request's logits (and so its greedy or seeded tokens) do not depend on the
  // other requests that share its steps. The CPU always is; on CUDA this fixes one kernel and one reduction
  // order per op whatever the batch (slower: README). false: the fastest kernels for each batch size.
  bool deterministic = false;
  // Speculative decoding: "" (none), "ngram" or "draft". Each request (not one that scores its prompt)
  // drafts tokens, and one step computes them after its own token. "ngram": the tokens that followed the
  // latest earlier occurrence of its last 2-8 tokens (prompt lookup). "draft": draft_model's greedy
  // continuation, while that model gives each token at least draft_p_min. A draft is kept while the token
  // drawn at the row before it (as without drafts: same logits, history and draw) is that draft, so a
  // request's tokens are those it gets without speculation, greedy or sampled. A step drafts at most
  // Engine::kSpeculativeStepTokens tokens in all, so large batches speculate little or not at all.
  std::string speculation;
  // speculation "draft": a GGUF model with this model's tokenizer, smaller (a smaller model of the family, or
  // this one at fewer bits: `kiln quantize`), on the same backend, with a K/V pool of as many blocks as the
  // model's. Given alone, it sets speculation to "draft".
  std::string draft_model;
  float draft_p_min = 0.5f;  // in [0, 1]
  // true: a decode step drafts where drafting has paid: the engine measures the tokens a second of decode
  // steps with drafts and without, per batch size, and drafts where that was faster, trying the other now and
  // then (runtime/spec_control.h); prompt lookup also drafts in steps that compute prompts. false: every step
  // drafts, whatever it costs (tests, and measuring that cost).
  bool speculation_adaptive = true;
  int32_t draft_max = 8;  // draft tokens per request and step, in [1, 64]
  // Bytes of KV cache (K and V of every layer, in kv_type); the pool holds this many bytes' worth of whole
  // blocks. 0: min(what n_seq_max sequences of n_ctx tokens need, half of the memory available at load
  // (MemAvailable; a GPU's free memory after the weights)), which on a machine with room is exactly
  // n_seq_max x n_ctx. Less than that is fine: requests share the pool, and when it runs out the newest is
  // preempted and recomputed later. A request that outgrows the whole pool ends with FinishReason::error; a
  // prompt larger than it is refused by submit().
  uint64_t kv_memory_bytes = 0;
  // Requests waiting for admission (submitted or preempted, not running) at most; submit() beyond that
  // fails with resource_exhausted (a server answers 429). 0: no limit.
  int32_t max_queued = 0;
  // A request not admitted this many milliseconds after submit() ends with FinishReason::error (the message
  // names the wait); preempted requests, admitted once, are not timed. 0: no limit.
  int64_t queue_timeout_ms = 0;
  // Finished requests whose RequestStats wait() can still return, at most: a request's stats are dropped
  // when it is waited for or when this many requests have finished after it (see the top of this file).
  int32_t keep_finished = 1024;
};

// Whether this build of kiln has CUDA and a CUDA device is usable: what backend "auto" picks.
bool cuda_available();

// A function the assistant called (ChatMessage::tool_calls), as OpenAI's API carries it.
struct ToolCall {
  std::string id;         // what the tool's answer names in ChatMessage::tool_call_id
  std::string name;       // the function's name
  std::string arguments;  // a JSON object, as text
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool"
  std::string content;
  // (Initialized, so that {role, content} stays a complete aggregate initializer.)
  std::vector<ToolCall> tool_calls = {};  // assistant: the calls it made (the template sees them as OpenAI's)
  std::string tool_call_id = {};          // tool: the call this message answers
  std::string name = {};                  // the participant's, or a tool's function's (optional)
};

// A function the model may call (Request::tools): rendered into the prompt by the chat template as OpenAI's
// {"type": "function", "function": {name, description, parameters}}.
struct ToolDefinition {
  std::string name;
  std::string description;  // empty: none
  std::string parameters;   // a JSON schema of the arguments object, as text; empty: none
};

// Receives the raw logits of one prompt position (Request::prompt_logits): `position` p and the logits that
// predict prompt token p + 1, f32 [n_vocab] (ModelDescription::n_vocab), valid only during the call.
using PromptLogitsCallback = std::function<void(int32_t position, std::span<const float> logits)>;

// Structured output: the generated text must be a sentence of this grammar. Sampling only ever draws tokens
// that keep the text inside it, and an end-of-generation token only where the text is complete; the request
// ends with FinishReason::stop where the grammar ends (ignore_eos or not), and a grammar that cannot complete
// within max_tokens ends with FinishReason::length. Compiled by submit(), which names what is wrong with it
// (invalid_argument, unimplemented for a construct kiln does not support, resource_exhausted past a size
// bound). src/grammar/ describes each kind.
struct OutputConstraint {
  enum class Kind { none, gbnf, json_schema, regex };
  Kind kind = Kind::none;
  std::string text;  // the GBNF grammar (start rule `root`), the JSON schema as JSON text, or the pattern
};

struct Request {
  // Exactly one of these is the prompt:
  std::string prompt;                  // text, tokenized with the model's BOS rule
  std::vector<int32_t> prompt_tokens;  // token ids as they are
  std::vector<ChatMessage> messages;   // a conversation, rendered with the model's chat template
  std::vector<ToolDefinition> tools;   // with messages: the functions the template shows the model
  SamplingParams sampling;
  OutputConstraint constraint;
  // Prefix-cache namespace: cached KV blocks are shared only between requests with the same salt (empty: the
  // default namespace). Give each tenant its own, so one cannot learn another's prompts from cache timing.
  std::string cache_salt;
  // Admission rank (vLLM's `priority`): lower values are admitted first, and a waiting request preempts a
  // running one it outranks when every slot is taken; first come, first served among equals.
  int32_t priority = 0;
  // Whole distributions over the prompt, for tools that compare models (KL divergence): when set, called on
  // the engine thread for each prompt position p in [prompt_logits_from, n_prompt - 1), in increasing order
  // and once each (a preempted request's recomputed positions are not repeated). As with
  // SamplingParams::prompt_logprobs, the request then computes its whole prompt. Like the token callback, it
  // must not block for long; it is called before the request's events of the same step.
  PromptLogitsCallback prompt_logits;
  int32_t prompt_logits_from = 0;  // in [0, n_prompt - 1]
  // Called on the engine thread once, when the request is first admitted (it leaves the queue and holds KV
  // blocks), before its first step; a request that ends unadmitted never gets it. Must not block for long.
  std::function<void()> on_admitted;
};

enum class FinishReason { none, stop, length, cancelled, error };
const char* finish_reason_name(FinishReason r);  // "stop", "length", ...

struct RequestStats {
  int32_t n_prompt = 0;       // prompt tokens
  int32_t n_cached = 0;       // prompt tokens found in the prefix cache (not recomputed)
  int32_t n_generated = 0;    // tokens sampled
  double queue_ms = 0;        // from submit() to the first admission
  double prefill_ms = 0;      // from the first admission to the first sampled token
  double decode_ms = 0;       // from the first sampled token to the end
  int32_t n_preemptions = 0;  // times its KV blocks were taken back (and recomputed on resume)
  bool timed_out = false;     // ended unadmitted by EngineOptions::queue_timeout_ms (finish: error)
  FinishReason finish = FinishReason::none;
};

// One streamed event. Tokens come with the text they complete (possibly empty: a character split over byte
// tokens, or text held back because it may start a stop string). The last event has done = true.
struct TokenEvent {
  int32_t token = -1;  // -1 on the final event when it carries no token
  std::string text;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;  // SamplingParams::n_logprobs alternatives
  // SamplingParams::prompt_logprobs >= 0: on the request's first event only, prompt tokens 1..n-1 scored
  // (entry i is token i + 1 given tokens 0..i).
  std::vector<PromptLogprob> prompt_logprobs;
  bool done = false;
  FinishReason finish = FinishReason::none;  // set when done
  std::string error;                         // finish == error
  RequestStats stats;                        // set when done: what wait() returns
};
using TokenCallback = std::function<void(const TokenEvent&)>;

// A snapshot of the engine (Engine::metrics()). Counters run from the engine's start; gauges are as of the
// last step. Latency samples are the most recent ones, oldest first, at most Engine::kLatencySamples each.
struct EngineMetrics {
  int32_t n_running = 0;         // requests admitted (holding KV blocks)
  int32_t n_waiting = 0;         // requests queued for admission, preempted ones included
  bool draining = false;         // drain() was called: submit() refuses new requests
  int32_t kv_block_size = 0;     // tokens per block
  int32_t kv_blocks_total = 0;   // blocks in the pool
  int32_t kv_blocks_used = 0;    // held by running requests
  int32_t kv_blocks_cached = 0;  // free but still holding a prefix that later requests may reuse
  uint64_t kv_bytes_total = 0;   // bytes of the pool
  uint64_t kv_bytes_used = 0;    // bytes of the used blocks
  // Memory for the steps beyond weights and KV: the largest step's activations so far, plus the backend's
  // kernel scratch (on a GPU, measured at load by the warm-up steps).
  uint64_t scratch_bytes = 0;
  // The prefix cache, in tokens: looked up at each admission (re-admissions after a preemption included)
  // and found there (not recomputed).
  uint64_t prefix_cache_queries = 0;
  uint64_t prefix_cache_hits = 0;
  uint64_t n_prompt_tokens = 0;     // sum of RequestStats::n_prompt of admitted requests
  uint64_t n_cached_tokens = 0;     // sum of RequestStats::n_cached (first admissions only)
  uint64_t n_generated_tokens = 0;  // tokens sampled
  uint64_t n_preemptions = 0;
  uint64_t n_finished = 0;         // requests that ended, for any reason
  uint64_t n_rejected = 0;         // submit() calls refused for a full queue or a drain
  uint64_t n_queue_timeouts = 0;   // requests ended by EngineOptions::queue_timeout_ms
  uint64_t n_draft_tokens = 0;     // speculative decoding: draft tokens verified
  uint64_t n_accepted_tokens = 0;  // of them, kept (the text went that way)
  uint64_t n_drafts = 0;           // steps in which a request verified a draft
  std::vector<double> ttft_ms;     // from submit() to the first token, per request
  std::vector<double> itl_ms;      // between two consecutive tokens of one request
  std::vector<double> e2e_ms;      // from submit() to the end, per request that finished with stop or length
};

struct ModelDescription {
  std::string path, name, architecture;
  int32_t n_vocab = 0, n_ctx = 0, n_ctx_train = 0, n_layers = 0, n_embd = 0;
  int64_t n_params = 0;
  uint64_t weight_bytes = 0, kv_bytes = 0;
  uint64_t prepared_bytes =
      0;  // the backend's own copies of the weights: repacked (CPU), device memory (GPU)
  int32_t kv_blocks = 0, kv_block_size = 0;  // the KV pool: blocks of kv_block_size tokens, kv_bytes in all
  std::string kv_type;                       // its type, as EngineOptions::kv_type names it ("auto" resolved)
  int32_t n_threads = 0;
  std::string backend;       // the device the model runs on: "cpu", "cuda:0", or "cuda:0 + cpu" when split
  int32_t n_gpu_layers = 0;  // layers on the GPU: all of them, or the first ones under partial offload
  double load_ms = 0;
  bool has_chat_template = false;
  std::string chat_template;  // its source (Jinja), empty when there is none usable
};

class Engine {
 public:
  // Loads the model and starts the engine thread. Errors: a missing or malformed file, an unsupported
  // architecture, bad options — each named.
  static Result<std::unique_ptr<Engine>> create(const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Samples kept per latency series in EngineMetrics.
  static constexpr size_t kLatencySamples = 1024;
  // Draft tokens one step verifies at most, all requests together (EngineOptions::speculation).
  static constexpr int32_t kSpeculativeStepTokens = 16;

  // Queues a request. Errors (nothing queued): bad sampling parameters, an empty prompt, a prompt that does
  // not fit the context or the KV pool, a chat request for a model without a template (invalid_argument or
  // out_of_range); a full queue (max_queued) or a drain in progress (resource_exhausted, the message says
  // which). An empty callback streams nothing (wait() still reports the request's end).
  Result<uint64_t> submit(const Request& request, TokenCallback callback);
  // Compiles an output constraint as submit() does, into the engine's cache of compiled grammars (a
  // submit() with the same constraint soon after finds it there): ok, or the error submit() would return
  // for it. Thread-safe; kind none is ok.
  Status check_constraint(const OutputConstraint& constraint);
  // Stops a request, queued or running, at the next step; its callback gets a final event with
  // FinishReason::cancelled. Unknown and finished ids are ignored.
  void cancel(uint64_t id);
  // Blocks until the request has finished and its final callback returned; its statistics. not_found for an
  // unknown id, one already waited for, or one whose statistics were dropped (keep_finished newer requests
  // finished since).
  Result<RequestStats> wait(uint64_t id);
  // Stops admitting: submit() fails from now on (resource_exhausted naming the drain); the queued and running
  // requests go on to their end. Returns when none is left (its last callback returned). invalid_argument
  // when called from a callback (the engine's threads cannot wait for themselves).
  Status drain();
  EngineMetrics metrics() const;

  const ModelDescription& model() const;
  Result<std::vector<int32_t>> tokenize(const std::string& text, bool add_special) const;
  Result<std::string> detokenize(const std::vector<int32_t>& ids) const;
  // The prompt text a conversation renders to (with the assistant turn opened), with the tools the model may
  // call. invalid_argument: a tool call's arguments or a tool's parameters that are not JSON objects (named),
  // or a conversation the template refuses (its raise_exception message).
  Result<std::string> render_chat(const std::vector<ChatMessage>& messages,
                                  const std::vector<ToolDefinition>& tools = {}) const;

  struct Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
