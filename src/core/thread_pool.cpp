#include "core/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <utility>

#include "core/env_options.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace kiln {

namespace {

// One spin-wait step: tells the core it is spinning (the sibling hyper-thread runs, power drops).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// How long a waiting thread spins before it sleeps. A model step issues its parallel_for calls microseconds
// apart, so the workers are usually still spinning when the next one comes: no futex on the way in or out
// (a futex wake-up costs tens of microseconds in a virtual machine). After this long with no work (between
// requests), they sleep and cost nothing.
constexpr auto kSpin = std::chrono::microseconds(200);

// Spins until done() holds or kSpin passes; whether it holds. A few microseconds of pause loop, then the
// thread yields its core between checks: on a machine with more runnable threads than cores (processes side
// by side), a spinner then lets the thread it waits for, or another process's, run instead of burning its
// time slice.
template <class Done>
bool spin_until(Done done) {
  for (int i = 0; i < 512; ++i) {
    if (done()) return true;
    cpu_relax();
  }
  const auto until = std::chrono::steady_clock::now() + kSpin;
  for (;;) {
    std::this_thread::yield();
    for (int i = 0; i < 16; ++i) {
      if (done()) return true;
      cpu_relax();
    }
    if (std::chrono::steady_clock::now() >= until) return false;
  }
}

// Chunk `c` of `n_chunks` over [0, n).
std::pair<int64_t, int64_t> chunk_range(int64_t n, int n_chunks, int c) {
  return {n * c / n_chunks, n * (c + 1) / n_chunks};
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads > 0 ? n_threads : default_thread_count()) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
  }
  start_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn,
                              int64_t min_chunk) {
  if (n <= 0) return;
  const int chunks =
      static_cast<int>(std::clamp<int64_t>(n / std::max<int64_t>(min_chunk, 1), 1, n_threads_));
  if (chunks == 1) {
    fn(0, n, 0);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mu_);
  job_ = &fn;
  job_n_ = n;
  job_chunks_ = chunks;
  // Every worker answers every job, those without a chunk too: the next job's fields are written only once
  // all of them have read this one's.
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  // Publishes the job (release). A worker that found no job and is going to sleep has raised sleepers_ before
  // it checks generation_ again under mu_; both sides are sequentially consistent, so either it sees this job
  // or this sees it asleep and wakes it (under mu_, so the wake-up cannot fall between its check and its
  // wait).
  generation_.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    start_cv_.notify_all();
  }
  const auto [b, e] = chunk_range(n, chunks, 0);
  fn(b, e, 0);
  const auto done = [&] { return pending_.load(std::memory_order_acquire) == 0; };
  if (!spin_until(done)) {
    std::unique_lock<std::mutex> lock(mu_);
    caller_sleeping_.store(true, std::memory_order_seq_cst);
    done_cv_.wait(lock, done);
    caller_sleeping_.store(false, std::memory_order_relaxed);
  }
  job_ = nullptr;
}

void ThreadPool::parallel_dynamic(int64_t n, int64_t chunk,
                                  const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  chunk = std::max<int64_t>(chunk, 1);
  const int64_t n_chunks = (n + chunk - 1) / chunk;
  if (n_chunks == 1 || n_threads_ == 1) {
    for (int64_t b = 0; b < n; b += chunk) fn(b, std::min(n, b + chunk), 0);
    return;
  }
  std::atomic<int64_t> next{0};
  parallel_for(std::min<int64_t>(n_chunks, n_threads_), [&](int64_t, int64_t, int thread) {
    for (;;) {
      const int64_t b = next.fetch_add(chunk, std::memory_order_relaxed);
      if (b >= n) return;
      fn(b, std::min(n, b + chunk), thread);
    }
  });
}

void ThreadPool::worker(int index) {
  uint64_t seen = 0;
  for (;;) {
    const auto ready = [&] {
      return generation_.load(std::memory_order_acquire) != seen || stop_.load(std::memory_order_relaxed);
    };
    if (!spin_until(ready)) {
      std::unique_lock<std::mutex> lock(mu_);
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      start_cv_.wait(lock, ready);
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
    }
    if (stop_.load(std::memory_order_relaxed)) return;
    seen = generation_.load(std::memory_order_acquire);
    const int chunks = job_chunks_;
    if (index < chunks) {
      const auto [b, e] = chunk_range(job_n_, chunks, index);
      (*job_)(b, e, index);
    }
    // The last worker to finish wakes the caller if it gave up spinning (same handshake as above).
    if (pending_.fetch_sub(1, std::memory_order_seq_cst) == 1 &&
        caller_sleeping_.load(std::memory_order_seq_cst)) {
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_one();
    }
  }
}

int default_thread_count() {
  if (const int n = core_env_options().threads; n > 0) return n;
  // Distinct (package, core) pairs among the online CPUs.
  std::set<std::pair<std::string, std::string>> cores;
  for (int cpu = 0; cpu < 4096; ++cpu) {
    const std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    std::ifstream core(base + "core_id"), pkg(base + "physical_package_id");
    if (!core) break;
    std::string c, p;
    core >> c;
    pkg >> p;
    cores.emplace(p, c);
  }
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  int n = cores.empty() ? hw : static_cast<int>(cores.size());
  if (hw > 0) n = std::min(n, hw);  // a cgroup/affinity limit may allow fewer
  return std::max(n, 1);
}

}  // namespace kiln
