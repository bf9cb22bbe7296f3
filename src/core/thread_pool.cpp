#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <utility>

namespace kiln {

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads > 0 ? n_threads : default_thread_count()) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

namespace {
// Chunk `c` of `n_chunks` over [0, n).
std::pair<int64_t, int64_t> chunk_range(int64_t n, int n_chunks, int c) {
  return {n * c / n_chunks, n * (c + 1) / n_chunks};
}
}  // namespace

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
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_n_ = n;
    job_chunks_ = chunks;
    pending_ = chunks - 1;
    ++generation_;
  }
  start_cv_.notify_all();
  const auto [b, e] = chunk_range(n, chunks, 0);
  fn(b, e, 0);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  job_ = nullptr;
}

void ThreadPool::worker(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t, int)>* job = nullptr;
    int64_t n = 0;
    int chunks = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = job_n_;
      chunks = job_chunks_;
    }
    if (index < chunks) {
      const auto [b, e] = chunk_range(n, chunks, index);
      (*job)(b, e, index);
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

int default_thread_count() {
  if (const char* env = std::getenv("KILN_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
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
