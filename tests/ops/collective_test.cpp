// HostGroup (ops/collective.h): ranks that are threads of one process sum and gather exactly, in rank order,
// through the CPU backend's collectives, and an aborted group releases the ranks waiting in a collective.
#include "ops/collective.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "backends/backend.h"

namespace kiln {
namespace {

Tensor f32_tensor(std::vector<float>& v, int64_t n, int64_t rows) {
  Tensor t;
  t.type = DType::f32;
  t.data = v.data();
  t.ne = {n, rows, 1, 1};
  t.nb = {4, 4 * n, 4 * n * rows, 4 * n * rows};
  return t;
}

// Runs fn(rank) on a thread a rank.
template <class Fn>
void on_ranks(int32_t world, Fn&& fn) {
  std::vector<std::thread> threads;
  for (int32_t r = 0; r < world; ++r) threads.emplace_back([&, r] { fn(r); });
  for (std::thread& t : threads) t.join();
}

TEST(HostGroup, SumsAndGathersInRankOrderOnEveryRank) {
  constexpr int32_t kWorld = 3;
  constexpr int64_t kN = 5, kRows = 2;
  HostGroup group(kWorld);
  std::vector<std::unique_ptr<Backend>> cpus;
  for (int32_t r = 0; r < kWorld; ++r) cpus.push_back(make_backend("cpu", {.n_threads = 1}).value());
  std::vector<std::vector<float>> x(kWorld), sum(kWorld), all(kWorld);
  for (int32_t r = 0; r < kWorld; ++r) {
    for (int64_t i = 0; i < kN * kRows; ++i) x[r].push_back(static_cast<float>(100 * r + i) + 0.25f);
    sum[r] = x[r];
    all[r].assign(static_cast<size_t>(kN * kRows * kWorld), 0.0f);
  }
  std::atomic<int> failures{0};
  on_ranks(kWorld, [&](int32_t r) {
    Program p;
    Tensor xs = f32_tensor(x[r], kN, kRows), s = f32_tensor(sum[r], kN, kRows),
           g = f32_tensor(all[r], kN * kWorld, kRows);
    // Several collectives in a row: each is its own barrier.
    if (!p.add(ops::AllGather{xs, g, &group.rank(r)}).ok() ||
        !p.add(ops::AllReduce{s, s, &group.rank(r)}).ok() ||
        !p.add(ops::AllReduce{s, s, &group.rank(r)}).ok() || !cpus[r]->run(p).ok()) {
      ++failures;
    }
  });
  ASSERT_EQ(failures.load(), 0);
  for (int32_t r = 0; r < kWorld; ++r) {
    for (int64_t i = 0; i < kN * kRows; ++i) {
      float once = 0.0f;
      for (int32_t q = 0; q < kWorld; ++q) once += x[q][i];
      EXPECT_EQ(sum[r][i], once * kWorld) << "rank " << r << " value " << i;  // summed twice
    }
    for (int64_t j = 0; j < kRows; ++j) {
      for (int32_t q = 0; q < kWorld; ++q) {
        for (int64_t i = 0; i < kN; ++i)
          EXPECT_EQ(all[r][(j * kWorld + q) * kN + i], x[q][j * kN + i]) << "rank " << r;
      }
    }
  }
}

TEST(HostGroup, AbortReleasesTheRanksWaiting) {
  HostGroup group(2);
  std::vector<float> v(4, 1.0f);
  Status waited;
  std::thread rank0(
      [&] { waited = static_cast<HostCollective&>(group.rank(0)).all_reduce(v.data(), v.data(), 4); });
  // Rank 1 never comes: it failed before its collective.
  group.abort(invalid_argument("rank 1: a bad step"));
  rank0.join();
  EXPECT_FALSE(waited.ok());
  EXPECT_NE(waited.message().find("rank 1: a bad step"), std::string::npos) << waited.to_string();
  // And the group stays stopped.
  EXPECT_FALSE(static_cast<HostCollective&>(group.rank(1)).all_reduce(v.data(), v.data(), 4).ok());
}

}  // namespace
}  // namespace kiln
