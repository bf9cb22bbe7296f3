#include "models/tp_model.h"

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "models/tp_shard.h"

namespace kiln {

namespace {

class TpModel final : public Model {
 public:
  TpModel(CollectiveGroup& group, std::span<Backend* const> backends)
      : group_(group), backends_(backends.begin(), backends.end()) {}

  ~TpModel() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  Status load(const std::shared_ptr<const gguf::File>& file, const ModelOptions& options) {
    for (int32_t r = 0; r < group_.world(); ++r) {
      KILN_ASSIGN_OR_RETURN(std::shared_ptr<const gguf::File> shard, tp::shard_file(file, group_.world(), r));
      ModelOptions o = options;
      o.collective = &group_.rank(r);
      KILN_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, load_model(shard, *backends_[r], o));
      ranks_.push_back(std::move(m));
    }
    info_ = ranks_[0]->info();  // the rank's KV heads: the pools of every rank hold as many
    info_.n_params = 0;
    info_.weight_bytes = 0;
    for (const gguf::TensorInfo& t : file->tensors()) {
      info_.n_params += t.n_elements();
      info_.weight_bytes += t.n_bytes;
    }
    state_.assign(static_cast<size_t>(group_.world()), RankState{});
    for (int32_t r = 1; r < group_.world(); ++r) threads_.emplace_back([this, r] { work(r); });
    return Status::ok_status();
  }

  const ModelInfo& info() const override { return info_; }
  const Program& last_program() const override { return ranks_[0]->last_program(); }
  std::span<const std::unique_ptr<WeightHandle>> weights() const override { return ranks_[0]->weights(); }
  size_t peak_scratch_bytes() const override {
    size_t peak = 0;
    for (const auto& m : ranks_) peak = std::max(peak, m->peak_scratch_bytes());
    return peak;
  }
  Backend& layer_backend(int32_t layer) const override { return ranks_[0]->layer_backend(layer); }
  Backend& output_backend() const override { return ranks_[0]->output_backend(); }

  Result<KvBuffers> allocate_kv(int32_t block_size, int32_t n_blocks, DType dtype) const override {
    KILN_ASSIGN_OR_RETURN(KvBuffers kv, ranks_[0]->allocate_kv(block_size, n_blocks, dtype));
    for (size_t r = 1; r < ranks_.size(); ++r) {
      KILN_ASSIGN_OR_RETURN(KvBuffers part, ranks_[r]->allocate_kv(block_size, n_blocks, dtype));
      kv.ranks.push_back(std::move(part));
    }
    return kv;
  }

  // Every rank's forward of the step at once. A rank's error stops the group (CollectiveGroup::abort), so
  // that no rank waits in a collective for one that has given up; the first error that is not the abort's
  // own is returned, and the group stays stopped.
  Result<Tensor> forward(const Batch& batch, KvBuffers& kv) override {
    if (kv.ranks.size() + 1 != ranks_.size()) {
      return invalid_argument("tensor parallelism over {}: the KV cache has the pools of {} ranks",
                              ranks_.size(), kv.ranks.size() + 1);
    }
    std::unique_lock lock(mu_);
    // The last step's other ranks have finished on their devices (their errors surface here).
    cv_.wait(lock, [&] { return all_at(&RankState::synced, step_); });
    KILN_TRY(first_error());
    batch_ = &batch;
    kv_ = &kv;
    ++step_;
    lock.unlock();
    cv_.notify_all();
    Result<Tensor> out = ranks_[0]->forward(batch, kv);
    if (!out.ok()) group_.abort(out.status());
    lock.lock();
    state_[0] = {step_, step_, out.ok() ? Status::ok_status() : out.status()};
    cv_.wait(lock, [&] { return all_at(&RankState::launched, step_); });
    KILN_TRY(first_error());
    return out;
  }

 private:
  struct RankState {
    uint64_t launched = 0;  // the last step whose forward returned
    uint64_t synced = 0;    // ... and whose work the backend finished
    Status status;          // the first error
  };

  bool all_at(uint64_t RankState::*field, uint64_t step) const {
    for (const RankState& s : state_) {
      if (s.*field < step) return false;
    }
    return true;
  }

  // A rank's own error before the group's abort that it caused (which the others then report).
  Status first_error() const {
    const Status* abort = nullptr;
    for (const RankState& s : state_) {
      if (s.status.ok()) continue;
      if (s.status.code() != StatusCode::internal) return s.status;
      if (abort == nullptr) abort = &s.status;
    }
    return abort != nullptr ? *abort : Status::ok_status();
  }

  // Rank r's thread: each step's forward, then (the caller no longer waiting) its backend's synchronize.
  void work(int32_t r) {
    RankState& st = state_[static_cast<size_t>(r)];
    uint64_t done = 0;
    for (;;) {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || step_ != done; });
      if (stop_) return;
      const uint64_t step = step_;
      const Batch& batch = *batch_;
      KvBuffers& kv = kv_->ranks[static_cast<size_t>(r - 1)];
      lock.unlock();
      Result<Tensor> out = ranks_[r]->forward(batch, kv);
      Status s = out.ok() ? Status::ok_status() : out.status();
      if (!s.ok()) group_.abort(s);
      lock.lock();
      st.launched = step;
      if (st.status.ok()) st.status = s;
      lock.unlock();
      cv_.notify_all();
      s = s.ok() ? backends_[r]->synchronize() : Status::ok_status();
      if (!s.ok()) group_.abort(s);
      lock.lock();
      st.synced = step;
      if (st.status.ok()) st.status = s;
      done = step;
      lock.unlock();
      cv_.notify_all();
    }
  }

  CollectiveGroup& group_;
  std::vector<Backend*> backends_;
  std::vector<std::unique_ptr<Model>> ranks_;
  ModelInfo info_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<RankState> state_;
  uint64_t step_ = 0;
  const Batch* batch_ = nullptr;
  KvBuffers* kv_ = nullptr;
  bool stop_ = false;
};

}  // namespace

Result<std::unique_ptr<Model>> load_tp_model(std::shared_ptr<const gguf::File> file,
                                             std::span<Backend* const> backends, CollectiveGroup& group,
                                             const ModelOptions& options) {
  if (static_cast<int32_t>(backends.size()) != group.world()) {
    return invalid_argument("tensor parallelism: {} backends for a group of {} ranks", backends.size(),
                            group.world());
  }
  if (options.rest != nullptr) return unimplemented("tensor parallelism with partial offload (--gpu-layers)");
  auto model = std::make_unique<TpModel>(group, backends);
  KILN_TRY(model->load(file, options));
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace kiln
