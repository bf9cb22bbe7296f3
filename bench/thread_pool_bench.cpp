// The cost of one ThreadPool::parallel_for handoff: calls with an empty body, back to back (as a model step
// makes them), and after a pause long enough for the workers to sleep. Not a test; prints nanoseconds per
// call.
//   build/release/tests/thread_pool_bench [threads]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "core/thread_pool.h"

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  kiln::ThreadPool pool(threads);
  const auto empty = [](int64_t, int64_t, int) {};
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < 1000; ++i) pool.parallel_for(threads, empty);  // warm up
  constexpr int kCalls = 200000;
  auto t0 = Clock::now();
  for (int i = 0; i < kCalls; ++i) pool.parallel_for(threads, empty);
  const double back_to_back = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / kCalls;
  constexpr int kCold = 200;
  double cold = 0;
  for (int i = 0; i < kCold; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    t0 = Clock::now();
    pool.parallel_for(threads, empty);
    cold += std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
  }
  std::printf("thread pool, %d threads: %.0f ns a call back to back, %.0f ns a call after a 2 ms pause\n",
              threads, back_to_back, cold / kCold);
  return 0;
}
