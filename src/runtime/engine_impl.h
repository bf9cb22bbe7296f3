// Engine::Impl: the state the engine thread owns (engine.cpp) and its setup (engine_load.cpp).
#pragma once

#include <atomic>
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
#include "formats/gguf.h"
#include "kiln/kiln.h"
#include "models/model.h"
#include "runtime/kv_cache/kv_cache.h"
#include "runtime/sampler/sampler.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

struct Engine::Impl {
  // One request, from submit() to wait().
  struct Seq {
    uint64_t id = 0;
    std::vector<int32_t> tokens;  // prompt, then the generated tokens
    int32_t n_prompt = 0;
    int32_t n_computed = 0;  // leading tokens whose K/V are in the cache
    SamplingParams params;
    std::optional<Sampler> sampler;
    std::optional<StreamDecoder> decoder;
    std::optional<StopMatcher> stop;
    TokenCallback callback;
    bool admitted = false;
    std::atomic<bool> cancel_requested{false};
    bool finished = false;  // guarded by Impl::mu
    RequestStats stats;
    std::chrono::steady_clock::time_point t_admit, t_first;

    int32_t pending() const { return static_cast<int32_t>(tokens.size()) - n_computed; }
  };

  Status load(const EngineOptions& options);
  Result<std::string> render_chat(const std::vector<ChatMessage>& messages) const;
  // The chat template: tokenizer_config.json (+ chat_template.jinja) of a folder, tokenizer.chat_template of
  // a GGUF file; a template that does not parse is a warning, not an error.
  Status load_chat_template(const std::string& path, bool folder);
  void loop();
  void step();
  // model->forward(batch) and its logits into `logits` ([logit rows, n_vocab]).
  Status run_forward();
  void admit();
  void preempt(Seq& s);
  void sample_and_emit(const std::shared_ptr<Seq>& s, std::span<const float> logits);
  void finish(Seq& s, FinishReason reason, const std::string& error);

  EngineOptions options;
  ModelDescription desc;
  std::shared_ptr<const gguf::File> file;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::optional<Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat_template;
  std::unique_ptr<KvBuffers> kv;
  std::unique_ptr<KvCache> kv_cache;

  // Engine thread only.
  std::vector<std::shared_ptr<Seq>> running;  // admitted, in admission order
  std::vector<std::shared_ptr<Seq>> cancelled_in_queue;
  Batch batch;
  std::vector<float> logits;  // [logit rows, n_vocab]

  // Shared with the API threads, under mu.
  std::mutex mu;
  std::condition_variable work_cv, done_cv;
  std::deque<std::shared_ptr<Seq>> queue;
  std::unordered_map<uint64_t, std::shared_ptr<Seq>> all;  // submitted and not yet waited for
  uint64_t next_id = 1;
  bool stop = false;
  std::thread thread;
};

}  // namespace kiln
