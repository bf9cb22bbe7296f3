#include "perplexity_rows.h"

#include <algorithm>
#include <chrono>
#include <numeric>

namespace kiln::cli {

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
}  // namespace

RowWorkers::RowWorkers(int n_workers, size_t n_vocab, int64_t n_chunks, ScoreFn fn)
    : fn_(std::move(fn)), pushed_(static_cast<size_t>(n_chunks), 0), done_(static_cast<size_t>(n_chunks), 0) {
  n_workers = std::max(1, n_workers);
  // Room for a step's rows where the workers are behind (a prefill step hands over hundreds at once), within
  // 32 MiB; at least two rows a worker, one being scored and one waiting.
  const size_t fit = (size_t{32} << 20) / (std::max<size_t>(n_vocab, 1) * sizeof(float));
  slots_.resize(std::max(2 * static_cast<size_t>(n_workers), std::min<size_t>(fit, 256)));
  for (size_t i = 0; i < slots_.size(); ++i) {
    slots_[i].logits.resize(n_vocab);
    free_.push_back(i);
  }
  busy_ms_.assign(static_cast<size_t>(n_workers), 0.0);
  for (int w = 0; w < n_workers; ++w) threads_.emplace_back([this, w] { work(w); });
}

RowWorkers::~RowWorkers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  ready_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void RowWorkers::push(int64_t chunk, int32_t position, std::span<const float> logits) {
  const auto t0 = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  free_cv_.wait(lock, [&] { return !free_.empty(); });
  stalled_ms_ += ms_since(t0);
  const size_t i = free_.back();
  free_.pop_back();
  lock.unlock();
  Slot& s = slots_[i];  // owned by this thread until queued
  std::copy(logits.begin(), logits.end(), s.logits.begin());
  s.chunk = chunk;
  s.position = position;
  lock.lock();
  ++pushed_[static_cast<size_t>(chunk)];
  ready_.push_back(i);
  lock.unlock();
  ready_cv_.notify_one();
}

void RowWorkers::work(int worker) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    ready_cv_.wait(lock, [&] { return stop_ || !ready_.empty(); });
    if (ready_.empty()) return;  // stopping, nothing left
    const size_t i = ready_.front();
    ready_.pop_front();
    lock.unlock();
    const auto t0 = Clock::now();
    const Slot& s = slots_[i];
    fn_(worker, s.chunk, s.position, s.logits);
    const double ms = ms_since(t0);
    lock.lock();
    busy_ms_[static_cast<size_t>(worker)] += ms;
    ++done_[static_cast<size_t>(s.chunk)];
    free_.push_back(i);
    free_cv_.notify_one();
    done_cv_.notify_all();
  }
}

int64_t RowWorkers::wait_chunk(int64_t chunk) {
  const auto c = static_cast<size_t>(chunk);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return done_[c] == pushed_[c]; });
  return done_[c];
}

double RowWorkers::busy_ms() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::accumulate(busy_ms_.begin(), busy_ms_.end(), 0.0);
}

double RowWorkers::stalled_ms() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stalled_ms_;
}

}  // namespace kiln::cli
