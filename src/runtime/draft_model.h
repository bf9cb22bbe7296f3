// DraftModel: speculative decoding's drafts from a second, smaller model with the target's vocabulary
// (EngineOptions::draft_model). Each call to propose() extends the drafting requests' drafts greedily, one
// token a forward pass for all of them together, until a request has its `max` tokens or the draft model's
// probability of its next token falls below `p_min` (a draft the model doubts is seldom kept, and each draft
// token costs a row of the target's step).
//
// The draft model keeps its own paged K/V (a KvCache over its own pool, with prefix sharing between
// requests), keyed by request id. A request's tokens whose K/V it holds are committed there; the draft tokens
// it fed are written past them, uncommitted. The next call commits those the target kept (they are the start
// of the request's new tokens) and computes the rest from the request's tokens, so a kept draft costs the
// draft model nothing more and a rejected one is simply overwritten.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/backend.h"
#include "core/status.h"
#include "formats/gguf.h"
#include "models/model.h"
#include "runtime/kv_cache/kv_cache.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

struct DraftModelOptions {
  int32_t n_ctx = 0;  // the target's context
  int32_t block_size = 16;
  int32_t n_blocks = 0;  // the draft's K/V pool (blocks of block_size positions)
  DType kv_type = DType::f32;
  float p_min = 0.0f;  // drafting stops at a token the draft model gives less than this probability
  // Tokens a propose() call computes to catch up with its requests' tokens, all together (a new request's
  // prompt comes over several calls; it drafts once caught up).
  int32_t max_catch_up = 512;
};

class DraftModel {
 public:
  // Loads the GGUF file at `path` onto `backend`. invalid_argument when its vocabulary is not the target's
  // (another size, or a token spelled differently: the first one is named).
  static Result<std::unique_ptr<DraftModel>> load(const std::string& path, Backend& backend,
                                                  const Tokenizer& target, const DraftModelOptions& options);

  struct Request {
    uint64_t id = 0;
    std::span<const int32_t> tokens;  // the request's tokens (prompt + generated), the last one not computed
    int32_t max = 0;                  // draft tokens at most, >= 1
    std::vector<int32_t> draft;       // out: the draft, possibly empty
  };
  // Drafts for each request. A request whose K/V do not fit the pool drafts nothing. Errors: the forward
  // pass's.
  Status propose(std::span<Request> requests);
  // The request ended: its K/V blocks go back to the pool.
  void forget(uint64_t id);

  const ModelInfo& info() const { return model_->info(); }
  uint64_t kv_bytes() const { return kv_.bytes(); }

 private:
  DraftModel(std::shared_ptr<const gguf::File> file, std::unique_ptr<Model> model, KvBuffers kv,
             KvCache cache, const DraftModelOptions& options, int32_t n_vocab);
  // Runs batch_ and reads the logits of its rows into logits_.
  Status forward();
  // The most likely token of logit row `row` and its probability.
  std::pair<int32_t, float> top(size_t row) const;

  std::shared_ptr<const gguf::File> file_;
  std::unique_ptr<Model> model_;
  KvBuffers kv_;
  KvCache cache_;
  DraftModelOptions options_;
  int32_t n_vocab_;  // the tokenizer's (the model's rows may be padded past it)
  // Per request: the draft tokens fed in the last call, written after the committed tokens.
  std::unordered_map<uint64_t, std::vector<int32_t>> written_;
  Batch batch_;
  std::vector<float> logits_;
};

}  // namespace kiln
