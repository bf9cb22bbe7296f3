// Engine::Impl: the state of one engine. engine.cpp holds the API side (submit, cancel, wait, drain,
// metrics), engine_step.cpp the engine thread (scheduler plan -> Batch -> forward -> sample -> stream),
// engine_load.cpp the setup.
//
// Threads: API calls take `mu` and touch only the fields under "Shared"; the engine thread owns the rest.
// The token callbacks run on a third thread, the delivery thread: the engine thread queues each step's events
// (`outbox`, handed over under `delivery_mu` when the step ends) and goes on to the next step while the
// callbacks format and send them. A request lives in `incoming` (submitted, not yet seen by the engine
// thread), then in `live` and the scheduler until it finishes; then only its Outcome remains, for wait(),
// until taken or dropped. The Outcome is marked finished by the delivery thread, after the final callback.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "backends/backend.h"
#include "core/thread_pool.h"
#include "formats/gguf.h"
#include "grammar/grammar.h"
#include "kiln/kiln.h"
#include "models/model.h"
#include "runtime/draft_model.h"
#include "runtime/grammar_cache.h"
#include "runtime/placement/offload.h"
#include "runtime/sampler/sampler.h"
#include "runtime/scheduler/scheduler.h"
#include "runtime/spec_control.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

using Clock = std::chrono::steady_clock;

// The last `capacity` values pushed, oldest first on read.
class SampleRing {
 public:
  explicit SampleRing(size_t capacity) : capacity_(capacity) {}
  void push(double v);
  std::vector<double> ordered() const;

 private:
  size_t capacity_;
  size_t next_ = 0;           // where the next value goes once full
  std::vector<double> data_;  // [min(pushed, capacity)]
};

struct Engine::Impl {
  // What wait() reads. Written by the engine thread under mu.
  struct Outcome {
    bool finished = false;
    RequestStats stats;
  };
  // One request's engine-side state, from submit() until it finishes.
  struct Seq {
    uint64_t id = 0;
    std::vector<int32_t> prompt;  // handed to the scheduler (which then owns the tokens) by take_incoming()
    std::string cache_salt;
    int32_t priority = 0;  // Request::priority
    SamplingParams params;
    std::optional<Sampler> sampler;
    std::optional<StreamDecoder> decoder;
    std::optional<StopMatcher> stop;
    std::shared_ptr<const TokenCallback> callback;  // shared with the request's events not yet delivered
    std::shared_ptr<Outcome> outcome;
    RequestStats stats;
    // SamplingParams::prompt_logprobs >= 0: entry i scores prompt token i + 1, filled as the prefill chunks
    // compute position i; handed over with the first event.
    int32_t n_prompt = 0;
    std::vector<PromptLogprob> prompt_lp;
    bool prompt_lp_sent = false;
    // Request::prompt_logits, and the next position it is owed (positions below it were delivered).
    PromptLogitsCallback prompt_logits;
    int32_t prompt_logits_next = 0;
    std::vector<int32_t> draft;  // speculative decoding: the tokens this step's chunk drafts after its own
    std::function<void()> on_admitted;                     // Request::on_admitted
    bool admitted = false;                                 // admitted at least once
    Clock::time_point t_submit, t_admit, t_first, t_last;  // t_last: the latest sampled token
  };
  // KILN_STEP_PROFILE=1: where the engine thread's time goes, summed per kind of step (decode-only steps,
  // steps with prompt tokens) and printed to stderr when the engine stops. Host clocks only: `launch` is the
  // model recording the step and the backend accepting it, `wait` the download of its output (on a GPU, most
  // of the kernels' time), `emit` sampling, detokenizing and queueing the events (the callbacks run on the
  // delivery thread, outside these clocks).
  struct StepProfile {
    struct Phases {
      int64_t steps = 0, tokens = 0, rows = 0;
      double plan_ms = 0, batch_ms = 0, launch_ms = 0, wait_ms = 0, emit_ms = 0;
    };
    bool on = false;
    Phases decode, prefill;
    void print() const;
  };
  // One event on its way to a callback; the final one (event.done) carries the Outcome to mark finished.
  struct Delivery {
    std::shared_ptr<const TokenCallback> callback;
    TokenEvent event;
    uint64_t id = 0;
    std::shared_ptr<Outcome> outcome;
  };
  // Counter increments of the engine thread since the last publish (merged into `totals` under mu).
  struct Delta {
    uint64_t prefix_cache_queries = 0, prefix_cache_hits = 0;
    uint64_t n_prompt_tokens = 0, n_cached_tokens = 0, n_generated_tokens = 0;
    uint64_t n_preemptions = 0, n_finished = 0, n_queue_timeouts = 0;
    uint64_t n_draft_tokens = 0, n_accepted_tokens = 0, n_drafts = 0;
    std::vector<double> ttft_ms, itl_ms, e2e_ms;
  };

  Status load(const EngineOptions& options);
  Result<std::string> render_chat(const std::vector<ChatMessage>& messages,
                                  const std::vector<ToolDefinition>& tools) const;
  // The chat template: tokenizer_config.json (+ chat_template.jinja) of a folder, tokenizer.chat_template of
  // a GGUF file; a template that does not parse is a warning, not an error.
  Status load_chat_template(const std::string& path, bool folder);
  Status warm_up(int32_t n_blocks);
  // The backend (options.backend) and, under partial offload (options.gpu_layers), host_backend; `options`
  // for load_model() placed accordingly.
  Status make_backends(const gguf::File& f, ModelOptions& options);
  // Tensor parallelism's: `backend` and tp_backends, one a rank (options.tensor_parallel), made with `bo`.
  Status make_tp_backends(BackendOptions bo);
  // Sets kv_block_bytes; the pool's blocks from options.kv_memory_bytes (kv_budget.h), `extra` blocks beyond
  // what the sequences need at full length (the pads' spare on a device) when the budget is the default.
  Result<int32_t> size_kv_pool(const ModelInfo& mi, int32_t n_ctx, DType kv_type, int32_t extra);

  // Engine thread (engine_step.cpp).
  void loop();
  void step();
  void take_incoming();
  // Ends the requests never admitted that waited past options.queue_timeout_ms.
  void expire_queued();
  void on_plan(const StepPlan& plan);
  void build_batch(const StepPlan& plan);
  // The one call into the model: runs `batch`, fills `logits` (f32 [model n_vocab, batch.logit_rows.size()])
  // or, under batch.argmax_vocab, `token_ids`, and waits for the backend: the step's one synchronisation.
  // `launched`: when the backend had accepted the step (KILN_STEP_PROFILE).
  Status run_forward(Clock::time_point& launched);
  // Prompt logprobs and logits: the positions of chunk `c` whose logits the step computes for them ([lo, hi),
  // empty unless the request asked and has not had them yet); scoring one and handing its logits over;
  // putting the logprobs on the first event.
  static std::pair<int32_t, int32_t> scored_positions(const Seq& s, const ScheduledChunk& c);
  Status score_prompt(Seq& s, int32_t position, std::span<const float> row_logits);
  static void hand_over_prompt_logits(Seq& s, int32_t position, std::span<const float> row_logits);
  static void hand_over_prompt_logprobs(Seq& s, TokenEvent& ev);
  // The masks of a sampled step's constrained rows into batch.sample_mask (row i: samplers[i]'s), in
  // parallel on mask_pool when there are several.
  void fill_masks(std::span<Sampler* const> samplers);
  // A decode step whose tokens the backend chooses, padded to the backend's padded_rows (pad_decode), unless
  // layers run on the host.
  void pad();
  // Row `row` of a sampled step's output (Batch::sample_vocab), read from token_ids.
  ops::SampleOut sampled_row(size_t row) const;
  // Streams the token the request's sampler chose (or ends the request with the sampler's error). drafted:
  // the token is the draft whose K/V this step computed (Scheduler::accept_draft) rather than a new one.
  void emit(Seq& s, Result<SampleResult> sampled, bool drafted = false);
  // Speculative decoding: each decoding request's draft (Seq::draft, Scheduler::set_draft), within
  // the step's draft budget, by prompt lookup or from the draft model; and, after the step, the chunk's rows
  // from `row` on: each token emitted in turn while it equals the draft before it. decode_only: the step
  // computes no prompt (the backend may replay it).
  void propose_drafts(bool decode_only);
  // Whether the next step is likely to decode only (no admission, no prompt to compute): the steps where
  // speculation drafts, and whose speed SpecControl compares.
  bool decode_step_next() const;
  void verify_drafts(const ScheduledChunk& c, size_t row);
  // The token of logit row `row` when the backend did not draw it: the backend's argmax (a greedy step), or
  // the request's sampler on the downloaded logits.
  Result<SampleResult> host_token(Seq& s, size_t row);
  // Ends request `id`: leaves the scheduler (its blocks freed), final callback, Outcome for wait(), state
  // freed.
  void finish(uint64_t id, FinishReason reason, const std::string& error);
  // Under mu: gauges from the scheduler, `delta` merged into `totals`.
  void publish_locked();
  // Queues request `s`'s event for its callback (engine thread); hands the step's queued events to the
  // delivery thread (engine thread, after the step's publish, so that a callback sees the gauges of the step
  // that made its event).
  void post(const Seq& s, TokenEvent ev);
  void hand_over_events();
  // The delivery thread: runs the callbacks in the order their events were posted, then marks finished the
  // Outcome of each final event (wait() and drain() return after the request's last callback).
  void deliver_loop();
  // Whether the calling thread is one a callback runs on (where wait() and drain() would wait for
  // themselves).
  bool on_engine_threads() const;

  EngineOptions options;
  ModelDescription desc;
  std::shared_ptr<const gguf::File> file;
  // Tensor parallelism (options.tensor_parallel > 1): the group the ranks' collectives run over. Declared
  // before the backends, so that it goes after them: NCCL's communicators are destroyed only once the graphs
  // that captured their collectives (the backends') are gone.
  std::unique_ptr<CollectiveGroup> tp_group;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Backend> host_backend;  // partial offload: the CPU backend of the later layers, or null
  // The backends of ranks 1 .. N - 1 (rank 0's is `backend`); declared before `model`, which uses them.
  std::vector<std::unique_ptr<Backend>> tp_backends;
  // Partial offload with options.offload_min_tokens > 0: the host layers' runner (ModelOptions::host_stage),
  // or null. Declared before `model`, which uses it, so that it goes after the model.
  std::unique_ptr<OffloadRunner> offload;
  std::unique_ptr<Model> model;
  std::optional<Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat_template;
  // The vocabulary as a grammar sees it (made at load), and the constraints compiled against it: submit()
  // compiles through the cache on the caller's thread (the cache is thread-safe).
  std::shared_ptr<const grammar::Vocabulary> vocab;
  std::unique_ptr<GrammarCache> grammars;
  std::unique_ptr<KvBuffers> kv;
  uint64_t kv_block_bytes = 0;  // one block: K and V of every layer
  bool kv_windowed = false;     // the model's layers all attend to a sliding window (blocks are given back)

  // Engine thread only.
  std::optional<Scheduler> scheduler;
  std::unordered_map<uint64_t, std::unique_ptr<Seq>> live;  // requests the scheduler holds
  Batch batch;
  std::vector<float> logits;  // f32 [model n_vocab, logit rows]
  // When the step's argmax ran on the backend: [logit rows]; when its draws did: ops::Sample's out, [2 + 2 *
  // batch.sample_n_top, logit rows].
  std::vector<int32_t> token_ids;
  bool backend_samples = false;             // the output backend runs ops::Sample (set at load)
  bool speculate = false;                   // EngineOptions::speculation "ngram" or "draft"
  std::unique_ptr<DraftModel> draft_model;  // speculation "draft": EngineOptions::draft_model
  SpecControl spec_control;                 // whether a decode step drafts (speculation on)
  int32_t spare_block = -1;  // the KV block past the cache's that padded decode rows write; -1: none
  // Tokens per step when EngineOptions::max_batch_tokens is 0: on the CPU, and on a device backend, where a
  // step that runs op by op (a prompt chunk's) spends milliseconds launching its kernels.
  static constexpr int32_t kHostBatchTokens = 512, kDeviceBatchTokens = 2048;
  // The threads that fill a step's grammar masks (the engine's CPU threads, at most kMaskThreads), made by
  // the first step with two constrained rows or more.
  static constexpr int32_t kMaskThreads = 4;
  std::unique_ptr<ThreadPool> mask_pool;
  Delta delta;
  StepProfile profile;
  std::vector<Delivery> outbox;  // this step's events, in order

  // Shared with the API threads, under mu.
  mutable std::mutex mu;
  std::condition_variable work_cv, done_cv;
  std::deque<std::unique_ptr<Seq>> incoming;
  std::vector<uint64_t> cancels;  // ids whose cancel() the engine thread has not seen yet
  // Open requests, and finished ones whose stats wait() has not taken (at most keep_finished of those).
  std::unordered_map<uint64_t, std::shared_ptr<Outcome>> outcomes;
  std::deque<uint64_t> finished_ids;  // the last keep_finished finished ids, oldest first (some taken)
  int64_t n_open = 0;                 // submitted and not finished
  bool draining = false;
  bool stop = false;
  // Counters, and gauges as last published: totals.n_waiting (the scheduler's queue, without `incoming`) is
  // published when requests are handed over and as soon as each plan is made, before the forward pass and the
  // token callbacks: a request admitted by the plan never counts against max_queued while its step runs.
  EngineMetrics totals;
  SampleRing ttft{Engine::kLatencySamples}, itl{Engine::kLatencySamples}, e2e{Engine::kLatencySamples};
  uint64_t next_id = 1;
  std::thread thread;

  // Shared by the engine thread (which fills it) and the delivery thread (which empties it), under
  // delivery_mu.
  std::mutex delivery_mu;
  std::condition_variable delivery_cv;
  std::vector<Delivery> deliveries;
  bool delivery_stop = false;  // set once the engine thread has ended: deliver what is left and end
  std::thread delivery_thread;
};

}  // namespace kiln
