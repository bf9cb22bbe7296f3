// Tensor parallelism's collectives on CUDA (backends/cuda/collective/, nccl_group.h; run by
// scripts/gpu-check.sh on the GPU machine): AllReduce (apart and in place) and AllGather over NCCL equal a
// host computation bit for bit, launched op by op, captured as a graph and replayed; a group of one rank; the
// groups make_collective_group refuses; and an aborted group, whose next collective fails with the abort's
// reason, and whose abort releases a rank waiting for a peer that never comes.
//
// A group is declared before its backends, so that it goes after them: their graphs hold NCCL's state, which
// the communicators wait for.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backends/backend.h"
#include "ops/collective.h"

namespace kiln {
namespace {

std::vector<float> random_values(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uni(-4.0f, 4.0f);
  std::vector<float> v(n);
  for (float& x : v) x = uni(rng);
  return v;
}

std::unique_ptr<Backend> cuda(int device) {
  auto b = make_backend("cuda:" + std::to_string(device));
  return b.ok() ? std::move(b).value() : nullptr;
}

// A rank's operands in one buffer of its backend: x [n, rows], the all-reduce's dst apart from x, a copy of x
// reduced in place, and the all-gather's dst [n * world, rows].
struct Operands {
  std::unique_ptr<Buffer> buf;
  Tensor x, reduced, in_place, gathered;
};

Operands operands(Backend& b, int64_t n, int64_t rows, int64_t world) {
  Operands o;
  const auto part = static_cast<size_t>(n * rows) * sizeof(float);
  o.buf = b.allocate(part * static_cast<size_t>(3 + world)).value();
  o.x = make_tensor(DType::f32, *o.buf, 0, n, rows);
  o.reduced = make_tensor(DType::f32, *o.buf, part, n, rows);
  o.in_place = make_tensor(DType::f32, *o.buf, 2 * part, n, rows);
  o.gathered = make_tensor(DType::f32, *o.buf, 3 * part, n * world, rows);
  return o;
}

// The all-reduce apart and in place, then the all-gather; n_tokens > 0 goes through a graph.
Program collectives(const Operands& o, const Collective& c, int32_t n_tokens) {
  Program p;
  EXPECT_TRUE(p.add(ops::AllReduce{o.x, o.reduced, &c}).ok());
  EXPECT_TRUE(p.add(ops::AllReduce{o.in_place, o.in_place, &c}).ok());
  EXPECT_TRUE(p.add(ops::AllGather{o.x, o.gathered, &c}).ok());
  p.n_tokens = n_tokens;
  return p;
}

struct Results {
  std::vector<float> reduced, in_place, gathered;
};

// Uploads x, runs `p` and reads the results back.
Status run_rank(Backend& b, const Operands& o, const Program& p, const std::vector<float>& x, Results& out) {
  const size_t bytes = x.size() * sizeof(float);
  KILN_TRY(b.upload(o.x, x.data(), bytes));
  KILN_TRY(b.upload(o.in_place, x.data(), bytes));
  KILN_TRY(b.run(p));
  out.reduced.assign(x.size(), 0.0f);
  out.in_place.assign(x.size(), 0.0f);
  out.gathered.assign(static_cast<size_t>(o.gathered.n_elements()), 0.0f);
  KILN_TRY(b.download(out.reduced.data(), o.reduced, bytes));
  KILN_TRY(b.download(out.in_place.data(), o.in_place, bytes));
  KILN_TRY(b.download(out.gathered.data(), o.gathered, out.gathered.size() * sizeof(float)));
  return b.synchronize();
}

// The group over these backends, or null with the test skipped when NCCL cannot be loaded.
std::unique_ptr<CollectiveGroup> nccl_group(std::vector<Backend*> ranks) {
  auto made = make_collective_group(ranks);
  if (!made.ok()) {
    EXPECT_EQ(made.status().code(), StatusCode::unimplemented) << made.status().to_string();
    return nullptr;
  }
  EXPECT_EQ(made.value()->rank(0).transport(), Collective::Transport::nccl);
  return std::move(made).value();
}

// A group of one rank: every result is x, op by op, captured as a graph, and replayed on new values.
void expect_own_values(Backend& b, CollectiveGroup& g) {
  uint64_t seed = 7;
  for (const int64_t rows : {1, 3}) {
    const int64_t n = 1001;
    const Operands o = operands(b, n, rows, 1);
    const Program eager = collectives(o, g.rank(0), 0), graph = collectives(o, g.rank(0), 1);
    for (const Program* p : {&eager, &graph, &graph}) {
      const std::vector<float> x = random_values(static_cast<size_t>(n * rows), ++seed);
      Results r;
      const Status s = run_rank(b, o, *p, x, r);
      ASSERT_TRUE(s.ok()) << s.to_string();
      EXPECT_EQ(r.reduced, x) << "rows " << rows << ", n_tokens " << p->n_tokens;
      EXPECT_EQ(r.in_place, x) << "rows " << rows << ", n_tokens " << p->n_tokens;
      EXPECT_EQ(r.gathered, x) << "rows " << rows << ", n_tokens " << p->n_tokens;
    }
  }
}

// Two GPUs and a group over them, or the reason the test skips.
struct TwoRanks {
  std::unique_ptr<CollectiveGroup> group;  // declared first, so that it goes after the backends
  std::unique_ptr<Backend> b0, b1;
  std::string skip;
};

TwoRanks two_ranks() {
  TwoRanks t;
  t.b0 = cuda(0);
  t.b1 = cuda(1);
  if (t.b0 == nullptr || t.b1 == nullptr) {
    t.skip = "needs two CUDA devices";
    return t;
  }
  t.group = nccl_group({t.b0.get(), t.b1.get()});
  if (t.group == nullptr) t.skip = "NCCL (libnccl.so.2) cannot be loaded";
  return t;
}

TEST(CudaCollective, OneRankOverNcclGetsItsOwnValues) {
  std::unique_ptr<CollectiveGroup> group;
  auto b = cuda(0);
  ASSERT_NE(b, nullptr);
  group = nccl_group({b.get()});
  if (group == nullptr) GTEST_SKIP() << "NCCL (libnccl.so.2) cannot be loaded";
  EXPECT_EQ(group->world(), 1);
  expect_own_values(*b, *group);
}

TEST(CudaCollective, OneRankOfTheHostTransportCopies) {
  HostGroup group(1);
  auto b = cuda(0);
  ASSERT_NE(b, nullptr);
  expect_own_values(*b, group);
}

TEST(CudaCollective, TwoRanksSumAndGatherExactly) {
  const TwoRanks two = two_ranks();
  if (!two.skip.empty()) GTEST_SKIP() << two.skip;
  CollectiveGroup* group = two.group.get();
  Backend* backends[2] = {two.b0.get(), two.b1.get()};
  for (const int64_t rows : {1, 3}) {
    const int64_t n = 1001;
    const auto size = static_cast<size_t>(n * rows);
    std::vector<Operands> o;
    std::vector<Program> eager, graph;
    for (int r = 0; r < 2; ++r) {
      o.push_back(operands(*backends[r], n, rows, 2));
      eager.push_back(collectives(o[r], group->rank(r), 0));
      graph.push_back(collectives(o[r], group->rank(r), static_cast<int32_t>(rows)));
    }
    // Op by op, then captured, then replayed on new values.
    for (int round = 0; round < 3; ++round) {
      std::vector<float> x[2];
      Results out[2];
      Status s[2];
      for (int r = 0; r < 2; ++r) x[r] = random_values(size, 100 * rows + 10 * round + r);
      std::vector<std::thread> threads;
      for (int r = 0; r < 2; ++r) {
        threads.emplace_back([&, r] {
          s[r] = run_rank(*backends[r], o[r], round == 0 ? eager[r] : graph[r], x[r], out[r]);
          if (!s[r].ok()) group->abort(s[r]);  // the other rank does not wait for this one forever
        });
      }
      for (std::thread& t : threads) t.join();
      ASSERT_TRUE(s[0].ok() && s[1].ok()) << s[0].to_string() << " / " << s[1].to_string();
      std::vector<float> sum(size), gathered(size * 2);
      for (size_t i = 0; i < size; ++i) sum[i] = x[0][i] + x[1][i];
      for (int64_t j = 0; j < rows; ++j) {
        for (int r = 0; r < 2; ++r) {
          for (int64_t i = 0; i < n; ++i) gathered[(j * 2 + r) * n + i] = x[r][j * n + i];
        }
      }
      for (int r = 0; r < 2; ++r) {
        EXPECT_EQ(out[r].reduced, sum) << "rank " << r << ", rows " << rows << ", round " << round;
        EXPECT_EQ(out[r].in_place, sum) << "rank " << r << ", rows " << rows << ", round " << round;
        EXPECT_EQ(out[r].gathered, gathered) << "rank " << r << ", rows " << rows << ", round " << round;
      }
    }
  }
}

TEST(CudaCollective, ADeviceTakesOneRank) {
  auto a = cuda(0), b = cuda(0);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  std::vector<Backend*> ranks = {a.get(), b.get()};
  auto g = make_collective_group(ranks);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(g.status().message().find("cuda:0"), std::string::npos) << g.status().to_string();
  auto cpu = make_backend("cpu");
  ASSERT_TRUE(cpu.ok());
  ranks = {a.get(), cpu.value().get()};
  g = make_collective_group(ranks);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::invalid_argument) << g.status().to_string();
}

TEST(CudaCollective, AnAbortedGroupFailsItsNextCollectiveWithTheReason) {
  std::unique_ptr<CollectiveGroup> group;
  auto b = cuda(0);
  ASSERT_NE(b, nullptr);
  group = nccl_group({b.get()});
  if (group == nullptr) GTEST_SKIP() << "NCCL (libnccl.so.2) cannot be loaded";
  const Operands o = operands(*b, 64, 1, 1);
  const Program graph = collectives(o, group->rank(0), 1), eager = collectives(o, group->rank(0), 0);
  const std::vector<float> x = random_values(64, 3);
  Results r;
  const Status ran = run_rank(*b, o, graph, x, r);  // a graph now holds the group's collectives
  ASSERT_TRUE(ran.ok()) << ran.to_string();
  group->abort(Status(StatusCode::internal, "rank 1 stopped: out of memory"));
  const Program fresh = collectives(o, group->rank(0), 1);
  // Replayed, op by op, and captured anew.
  for (const Program* p : {&graph, &eager, &fresh}) {
    const Status s = run_rank(*b, o, *p, x, r);
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("rank 1 stopped: out of memory"), std::string::npos) << s.to_string();
  }
}

TEST(CudaCollective, AnAbortReleasesARankWaitingForItsPeer) {
  const TwoRanks two = two_ranks();
  if (!two.skip.empty()) GTEST_SKIP() << two.skip;
  Backend* b0 = two.b0.get();
  CollectiveGroup* group = two.group.get();
  const Operands o = operands(*b0, 256, 1, 2);
  const Program p = collectives(o, group->rank(0), 0);
  const std::vector<float> x = random_values(256, 5);
  // Rank 1 never comes: rank 0's all-reduce kernel waits for it until the abort.
  Results r;
  std::thread rank0([&] { (void)run_rank(*b0, o, p, x, r); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  group->abort(Status(StatusCode::internal, "rank 1 stopped"));
  rank0.join();
  const Status s = run_rank(*b0, o, p, x, r);
  EXPECT_NE(s.message().find("rank 1 stopped"), std::string::npos) << s.to_string();
}

}  // namespace
}  // namespace kiln
