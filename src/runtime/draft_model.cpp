#include "runtime/draft_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace kiln {

namespace {

// The first token the two vocabularies spell differently, or -1.
int32_t first_difference(const Tokenizer& a, const Tokenizer& b) {
  const std::vector<std::string>& ka = a.vocab().keys;
  const std::vector<std::string>& kb = b.vocab().keys;
  for (size_t i = 0; i < ka.size(); ++i) {
    if (ka[i] != kb[i]) return static_cast<int32_t>(i);
  }
  return -1;
}

}  // namespace

DraftModel::DraftModel(std::shared_ptr<const gguf::File> file, std::unique_ptr<Model> model, KvBuffers kv,
                       KvCache cache, const DraftModelOptions& options, int32_t n_vocab)
    : file_(std::move(file)),
      model_(std::move(model)),
      kv_(std::move(kv)),
      cache_(std::move(cache)),
      options_(options),
      n_vocab_(n_vocab) {}

Result<std::unique_ptr<DraftModel>> DraftModel::load(const std::string& path, Backend& backend,
                                                     const Tokenizer& target,
                                                     const DraftModelOptions& options) {
  if (options.n_blocks < 1)
    return invalid_argument("draft model: n_blocks = {} must be >= 1", options.n_blocks);
  KILN_ASSIGN_OR_RETURN(gguf::File f, gguf::File::open(path));
  auto file = std::make_shared<gguf::File>(std::move(f));
  KILN_ASSIGN_OR_RETURN(const Tokenizer tok, Tokenizer::from_gguf(*file));
  if (tok.n_vocab() != target.n_vocab()) {
    return invalid_argument(
        "draft model {}: its vocabulary has {} tokens and the model's {}; a draft model must have the "
        "model's tokenizer",
        path, tok.n_vocab(), target.n_vocab());
  }
  if (const int32_t i = first_difference(tok, target); i >= 0) {
    return invalid_argument(
        "draft model {}: token {} is {:?} there and {:?} in the model; a draft model must have the model's "
        "tokenizer",
        path, i, tok.vocab().keys[static_cast<size_t>(i)], target.vocab().keys[static_cast<size_t>(i)]);
  }
  for (const char* key : {"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
                          "tokenizer.ggml.merges"}) {
    file->release(key);
  }
  ModelOptions mo;
  mo.n_ctx = options.n_ctx;
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, load_model(file, backend, mo));
  if (model->info().n_vocab < tok.n_vocab()) {
    return invalid_argument(
        "draft model {}: the tokenizer has {} tokens but token_embd.weight has only {} rows", path,
        tok.n_vocab(), model->info().n_vocab);
  }
  KILN_ASSIGN_OR_RETURN(KvBuffers kv,
                        KvBuffers::allocate(*model, options.block_size, options.n_blocks, options.kv_type));
  KILN_ASSIGN_OR_RETURN(KvCache cache, KvCache::create(options.n_blocks, options.block_size));
  return std::unique_ptr<DraftModel>(new DraftModel(std::move(file), std::move(model), std::move(kv),
                                                    std::move(cache), options, tok.n_vocab()));
}

Status DraftModel::forward() {
  KILN_ASSIGN_OR_RETURN(const Tensor out, model_->forward(batch_, kv_));
  return read_logits(model_->output_backend(), out, logits_);
}

std::pair<int32_t, float> DraftModel::top(size_t row) const {
  const float* l = logits_.data() + row * static_cast<size_t>(model_->info().n_vocab);
  const auto best = static_cast<int32_t>(std::max_element(l, l + n_vocab_) - l);
  const float max = l[best];
  if (!std::isfinite(max)) return {-1, 0.0f};
  double sum = 0;
  for (int32_t i = 0; i < n_vocab_; ++i) sum += std::exp(static_cast<double>(l[i] - max));
  return {best, static_cast<float>(1.0 / sum)};
}

Status DraftModel::propose(std::span<Request> requests) {
  // Catch up: each request's tokens the draft model has not computed, its last one included when all fit.
  struct Feed {
    size_t request = 0;
    int32_t from = 0, n = 0;  // positions [from, from + n) of the request's tokens
    bool drafts = false;      // n reaches the last token: its logits give the first draft token
  };
  std::vector<Feed> feeds;
  int32_t budget = options_.max_catch_up;
  for (size_t i = 0; i < requests.size() && budget > 0; ++i) {
    Request& r = requests[i];
    r.draft.clear();
    const auto seq = static_cast<int64_t>(r.id);
    const auto n = static_cast<int32_t>(r.tokens.size());
    if (n == 0 || r.max < 1) continue;
    std::vector<int32_t>& written = written_[r.id];
    if (!cache_.has_sequence(seq)) {
      KILN_TRY(cache_.add_sequence(seq, r.tokens).status());
    } else {
      // The draft tokens fed last time that the target kept begin the request's new tokens: their K/V are
      // written already.
      const int32_t c = cache_.n_tokens(seq);
      size_t k = 0;
      while (k < written.size() && c + static_cast<int32_t>(k) < n - 1 &&
             r.tokens[static_cast<size_t>(c) + k] == written[k])
        ++k;
      if (k > 0) cache_.commit(seq, r.tokens.subspan(static_cast<size_t>(c), k));
    }
    written.clear();
    const int32_t from = cache_.n_tokens(seq);
    const int32_t behind = n - from, fed = std::min(behind, budget);
    const bool drafts = fed == behind;
    // Room for the tokens fed and, when it drafts, for the draft tokens it feeds after them (all but the
    // last).
    if (!cache_.reserve(seq, fed + (drafts ? r.max - 1 : 0)).ok()) continue;  // the pool is full: no draft
    feeds.push_back({i, from, fed, drafts});
    budget -= fed;
  }
  if (feeds.empty()) return Status::ok_status();

  batch_.clear();
  for (const Feed& f : feeds) {
    const Request& r = requests[f.request];
    batch_.block_tables.push_back(cache_.block_table(static_cast<int64_t>(r.id)));
    for (int32_t p = f.from; p < f.from + f.n; ++p) {
      batch_.tokens.push_back(r.tokens[static_cast<size_t>(p)]);
      batch_.positions.push_back(p);
      batch_.seq.push_back(static_cast<int32_t>(batch_.block_tables.size() - 1));
    }
    if (f.drafts) batch_.logit_rows.push_back(batch_.n_tokens() - 1);
  }
  KILN_TRY(forward());
  std::vector<size_t> active;  // requests still drafting
  size_t row = 0;
  for (const Feed& f : feeds) {
    Request& r = requests[f.request];
    cache_.commit(static_cast<int64_t>(r.id),
                  r.tokens.subspan(static_cast<size_t>(f.from), static_cast<size_t>(f.n)));
    if (!f.drafts) continue;
    const auto [token, p] = top(row++);
    if (token < 0 || p < options_.p_min) continue;
    r.draft.push_back(token);
    if (r.max > 1) active.push_back(f.request);
  }

  // Then one token a pass: each active request's latest draft token in, the next one out.
  while (!active.empty()) {
    batch_.clear();
    for (const size_t i : active) {
      const Request& r = requests[i];
      batch_.block_tables.push_back(cache_.block_table(static_cast<int64_t>(r.id)));
      batch_.tokens.push_back(r.draft.back());
      batch_.positions.push_back(static_cast<int32_t>(r.tokens.size() + r.draft.size()) - 1);
      batch_.seq.push_back(static_cast<int32_t>(batch_.block_tables.size() - 1));
      batch_.logit_rows.push_back(batch_.n_tokens() - 1);
    }
    KILN_TRY(forward());
    std::vector<size_t> next;
    for (size_t j = 0; j < active.size(); ++j) {
      Request& r = requests[active[j]];
      written_[r.id].push_back(r.draft.back());
      const auto [token, p] = top(j);
      if (token < 0 || p < options_.p_min) continue;
      r.draft.push_back(token);
      if (static_cast<int32_t>(r.draft.size()) < r.max) next.push_back(active[j]);
    }
    active.swap(next);
  }
  return Status::ok_status();
}

void DraftModel::forget(uint64_t id) {
  const auto seq = static_cast<int64_t>(id);
  if (cache_.has_sequence(seq)) cache_.free_sequence(seq);
  written_.erase(id);
}

}  // namespace kiln
