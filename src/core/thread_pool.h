// ThreadPool: a persistent set of worker threads for data-parallel loops. parallel_for splits [0, n) into
// contiguous chunks, one per thread, the calling thread taking the first; it returns when all are done.
// One parallel_for at a time per pool (calls from several threads are serialised). Between calls the workers
// spin for a short while (a model step makes hundreds of calls microseconds apart), then sleep: a call costs
// well under a microsecond of handoff while a step runs, and an idle pool costs nothing.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln {

class ThreadPool {
 public:
  // n_threads <= 0: default_thread_count(). The pool holds n_threads - 1 workers.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return n_threads_; }
  // fn(begin, end, thread_index) over chunks of [0, n); chunks are at least `min_chunk` long.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn, int64_t min_chunk = 1);
  // fn(begin, end, thread_index) over the chunks [0, chunk), [chunk, 2 * chunk), ... of [0, n), which the
  // threads take in turn from a shared counter: a thread that runs late (another process on its core, a
  // slower core) leaves the rest to the others instead of holding every thread at the end of the call. Which
  // thread runs a chunk differs from call to call, so fn must not depend on it for its results.
  void parallel_dynamic(int64_t n, int64_t chunk, const std::function<void(int64_t, int64_t, int)>& fn);

 private:
  void worker(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex call_mu_;  // serialises parallel_for
  // Waiting threads spin on the atomics for a while, then sleep on the condition variables (under mu_).
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  // The current job: written by parallel_for before it bumps generation_, read by the workers after.
  const std::function<void(int64_t, int64_t, int)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int job_chunks_ = 0;                   // chunks of the current job (<= n_threads_)
  std::atomic<uint64_t> generation_{0};  // bumped per job
  std::atomic<int> pending_{0};          // workers that have not finished the current job
  std::atomic<int> sleepers_{0};         // workers asleep on start_cv_
  std::atomic<bool> caller_sleeping_{false};
  std::atomic<bool> stop_{false};
};

// Physical cores when the OS says (Linux sysfs topology), else std::thread::hardware_concurrency(); >= 1.
// KILN_THREADS overrides it.
int default_thread_count();

}  // namespace kiln
