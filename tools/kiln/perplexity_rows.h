// RowWorkers: scores the rows of a perplexity run off the engine thread. The prompt-logits callback (on the
// engine thread) copies each row into one of a few slots and returns, waiting only when every slot is taken
// (the workers are behind by that many rows); `n_workers` threads score the rows as they come, so the host's
// math overlaps the next forward steps and runs on several cores. Each row's result goes to a place of its
// own (the caller's arrays, indexed by chunk and position), so results do not depend on which worker scored a
// row, or when.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

namespace kiln::cli {

class RowWorkers {
 public:
  // fn(worker, chunk, position, logits): scores one row; `worker` in [0, n_workers) picks per-thread scratch.
  using ScoreFn =
      std::function<void(int worker, int64_t chunk, int32_t position, std::span<const float> logits)>;

  RowWorkers(int n_workers, size_t n_vocab, int64_t n_chunks, ScoreFn fn);
  ~RowWorkers();  // scores what is queued, then joins
  RowWorkers(const RowWorkers&) = delete;
  RowWorkers& operator=(const RowWorkers&) = delete;

  // Queues a copy of `logits` ([n_vocab]) for scoring. Engine thread.
  void push(int64_t chunk, int32_t position, std::span<const float> logits);
  // Blocks until every row pushed for `chunk` has been scored; how many were. Call once the chunk's request
  // has finished (no more rows can come for it).
  int64_t wait_chunk(int64_t chunk);
  // Milliseconds spent scoring, summed over the workers; milliseconds push() waited for a free slot.
  double busy_ms() const;
  double stalled_ms() const;

 private:
  struct Slot {
    std::vector<float> logits;  // [n_vocab]
    int64_t chunk = 0;
    int32_t position = 0;
  };
  void work(int worker);

  ScoreFn fn_;
  std::vector<Slot> slots_;
  mutable std::mutex mu_;
  std::condition_variable ready_cv_, free_cv_, done_cv_;
  std::vector<size_t> free_;     // slot indices
  std::deque<size_t> ready_;     // slot indices, in push order
  std::vector<int64_t> pushed_;  // [n_chunks]: rows queued
  std::vector<int64_t> done_;    // [n_chunks]: rows scored
  std::vector<double> busy_ms_;  // [n_workers], each written by its worker under mu_
  double stalled_ms_ = 0;        // engine thread
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace kiln::cli
