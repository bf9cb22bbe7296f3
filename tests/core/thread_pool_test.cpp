// ThreadPool: every index of every call runs exactly once, on chunks no shorter than asked, whether the
// workers are still spinning from the last call or asleep after a pause, with calls from several threads at
// once.
#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace kiln {
namespace {

void expect_each_index_once(ThreadPool& pool, int64_t n, int64_t min_chunk) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  std::atomic<int64_t> shortest{n};
  pool.parallel_for(
      n,
      [&](int64_t b, int64_t e, int t) {
        EXPECT_GE(t, 0);
        EXPECT_LT(t, pool.n_threads());
        int64_t cur = shortest.load();
        while (e - b < cur && !shortest.compare_exchange_weak(cur, e - b)) {
        }
        for (int64_t i = b; i < e; ++i) ++hits[static_cast<size_t>(i)];
      },
      min_chunk);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "n " << n << " i " << i;
  }
  if (n >= min_chunk) {
    EXPECT_GE(shortest.load(), std::min(n, min_chunk)) << "n " << n;
  }
}

TEST(ThreadPool, EachIndexOnceInBackToBackCalls) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (int rep = 0; rep < 2000; ++rep) expect_each_index_once(pool, 1 + rep % 37, 1 + rep % 5);
  }
}

TEST(ThreadPool, WorkersWakeAfterSleeping) {
  ThreadPool pool(3);
  for (int rep = 0; rep < 20; ++rep) {
    std::this_thread::sleep_for(std::chrono::milliseconds(rep % 2 == 0 ? 2 : 0));  // past the spin: asleep
    expect_each_index_once(pool, 1000, 1);
  }
}

TEST(ThreadPool, SlowChunksAndCallsFromSeveralThreads) {
  ThreadPool pool(4);
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c) {
    callers.emplace_back([&pool, c] {
      for (int rep = 0; rep < 50; ++rep) {
        std::atomic<int64_t> sum{0};
        pool.parallel_for(64, [&](int64_t b, int64_t e, int t) {
          if (t == (rep + c) % 4)
            std::this_thread::sleep_for(std::chrono::microseconds(300));  // past the spin
          for (int64_t i = b; i < e; ++i) sum += i;
        });
        ASSERT_EQ(sum.load(), 64 * 63 / 2);
      }
    });
  }
  for (auto& t : callers) t.join();
}

// parallel_dynamic: every index once, in whole chunks (the last may be short), with a thread that runs late
// leaving its share to the others.
TEST(ThreadPool, DynamicChunksCoverEachIndexOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (int rep = 0; rep < 500; ++rep) {
      const int64_t n = rep % 41, chunk = 1 + rep % 7;
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.parallel_dynamic(n, chunk, [&](int64_t b, int64_t e, int t) {
        EXPECT_GE(t, 0);
        EXPECT_LT(t, pool.n_threads());
        EXPECT_EQ(b % chunk, 0);
        EXPECT_EQ(e, std::min(n, b + chunk));
        for (int64_t i = b; i < e; ++i) ++hits[static_cast<size_t>(i)];
      });
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "n " << n << " i " << i;
    }
  }
  // Thread 0 stalls on the first chunk it takes until the others have run every other chunk (or 10 s pass):
  // the others take the rest.
  ThreadPool pool(3);
  std::vector<int> by_thread(3);
  std::atomic<int> done{0};
  std::atomic<bool> stalled{false};
  pool.parallel_dynamic(60, 1, [&](int64_t, int64_t, int t) {
    if (t == 0 && !stalled.exchange(true)) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (done.load() < 59 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    }
    ++by_thread[static_cast<size_t>(t)];  // each thread its own slot
    ++done;
  });
  EXPECT_EQ(by_thread[0] + by_thread[1] + by_thread[2], 60);
  EXPECT_LE(by_thread[0], 1) << "the stalled thread took more than the chunk it stalled on";
}

TEST(ThreadPool, DestroyedIdleOrBusy) {
  for (int rep = 0; rep < 50; ++rep) {
    ThreadPool pool(4);
    if (rep % 2 == 0) expect_each_index_once(pool, 100, 1);
  }
}

}  // namespace
}  // namespace kiln
