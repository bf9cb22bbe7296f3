// The paged KV cache bookkeeping: the block pool (ref counts, free list, LRU of cached blocks, eviction),
// chained SHA-256 block hashes, and KvCache prefix sharing, all-or-nothing reserve and release order.
// A randomized stress test simulates the K/V storage with token ids and checks every invariant after each op.
#include "runtime/kv_cache/kv_cache.h"

#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "ops/ops.h"
#include "runtime/kv_cache/block_pool.h"
#include "runtime/kv_cache/kv_budget.h"
#include "runtime/placement/placement.h"

namespace kiln {
namespace {

std::string hex(const BlockHash& h) {
  std::string s;
  for (uint8_t c : h) s += fmt::format("{:02x}", c);
  return s;
}

std::vector<int32_t> iota_tokens(int32_t n, int32_t start) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

std::vector<int32_t> table_of(const KvCache& kv, int64_t seq) {
  auto t = kv.block_table(seq);
  return {t.begin(), t.end()};
}

// add_sequence + reserve + commit of the whole prompt, as a prefill does; returns the reused token count.
int32_t prefill(KvCache& kv, int64_t seq, const std::vector<int32_t>& prompt) {
  Result<int32_t> reused = kv.add_sequence(seq, prompt);
  EXPECT_TRUE(reused.ok()) << reused.status().to_string();
  const int32_t r = *reused;
  Status st = kv.reserve(seq, static_cast<int32_t>(prompt.size()) - r);
  EXPECT_TRUE(st.ok()) << st.to_string();
  kv.commit(seq, std::span<const int32_t>(prompt).subspan(r));
  EXPECT_TRUE(kv.check_invariants().ok()) << kv.check_invariants().to_string();
  return r;
}

TEST(BlockHash, MatchesSha256OfParentAndLittleEndianTokens) {
  // Expected values: Python hashlib.sha256(parent + struct.pack('<...i', *tokens)).
  const std::vector<int32_t> a = {1, 2, -1};
  const BlockHash h = block_hash(nullptr, a);
  EXPECT_EQ(hex(h), "8d6a364a553e605f416dfe69198a8123b0ecf61546ccd54d4f2312f43b3e2641");
  const std::vector<int32_t> b = {7, 65536};
  EXPECT_EQ(hex(block_hash(&h, b)), "8538d1223b59b36d63acbf5b9272871a13e49e9630f96442a2ccb5122d14e8d4");
  // No parent is the same as a parent of 32 zero bytes.
  const BlockHash zero{};
  EXPECT_EQ(block_hash(&zero, a), h);
}

TEST(BlockHash, ChainsTheParent) {
  const std::vector<int32_t> x = {1, 2, 3, 4}, y = {5, 6, 7, 8}, z = {9, 9, 9, 9};
  const BlockHash hx = block_hash(nullptr, x), hz = block_hash(nullptr, z);
  EXPECT_NE(block_hash(&hx, y), block_hash(&hz, y));
  EXPECT_NE(block_hash(&hx, y), block_hash(nullptr, y));
  EXPECT_EQ(block_hash(&hx, y), block_hash(&hx, y));
}

TEST(BlockPool, AllocatesUntilExhaustedThenFails) {
  BlockPool pool(3);
  EXPECT_EQ(pool.n_free(), 3);
  for (int32_t i = 0; i < 3; ++i) {
    Result<int32_t> b = pool.allocate();
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(*b, i);  // a fresh pool hands out 0, 1, 2
    EXPECT_EQ(pool.ref_count(*b), 1);
  }
  EXPECT_EQ(pool.n_used(), 3);
  Result<int32_t> none = pool.allocate();
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::resource_exhausted);
  EXPECT_NE(none.status().message().find("3 blocks"), std::string::npos) << none.status().message();
  EXPECT_TRUE(pool.check_invariants().ok());
  // The free list is LIFO.
  pool.release(0);
  pool.release(2);
  EXPECT_EQ(*pool.allocate(), 2);
  EXPECT_EQ(*pool.allocate(), 0);
  EXPECT_TRUE(pool.check_invariants().ok());
}

TEST(BlockPool, EmptyPoolIsExhausted) {
  BlockPool pool(0);
  EXPECT_EQ(pool.allocate().status().code(), StatusCode::resource_exhausted);
  EXPECT_TRUE(pool.check_invariants().ok());
}

TEST(BlockPool, HashedBlocksStayCachedAndAreEvictedLeastRecentlyFreedFirst) {
  BlockPool pool(3);
  const std::vector<int32_t> t0 = {0}, t1 = {1}, t2 = {2};
  const BlockHash h0 = block_hash(nullptr, t0), h1 = block_hash(nullptr, t1), h2 = block_hash(nullptr, t2);
  for (int32_t i = 0; i < 3; ++i) ASSERT_EQ(*pool.allocate(), i);
  pool.set_hash(0, h0);
  pool.set_hash(1, h1);
  pool.acquire(1);  // a second holder
  EXPECT_EQ(pool.ref_count(1), 2);
  EXPECT_EQ(pool.find_cached(h1), 1);  // in use, still findable
  pool.release(1);
  pool.release(1);  // freed first
  pool.release(0);  // freed second
  pool.release(2);  // no hash: free list
  EXPECT_EQ(pool.n_cached(), 2);
  EXPECT_EQ(pool.n_free(), 1);
  EXPECT_EQ(pool.state(1), BlockState::block_state_cached);
  EXPECT_EQ(pool.find_cached(h0), 0);
  EXPECT_EQ(pool.find_cached(h1), 1);
  EXPECT_FALSE(pool.find_cached(h2).has_value());
  ASSERT_TRUE(pool.check_invariants().ok()) << pool.check_invariants().to_string();

  // The free list goes first, then the least recently freed cached block (1), forgetting its hash.
  EXPECT_EQ(*pool.allocate(), 2);
  EXPECT_EQ(pool.n_cached(), 2);
  EXPECT_EQ(*pool.allocate(), 1);
  EXPECT_FALSE(pool.find_cached(h1).has_value());
  EXPECT_FALSE(pool.hash_of(1).has_value());
  EXPECT_EQ(pool.find_cached(h0), 0);
  ASSERT_TRUE(pool.check_invariants().ok()) << pool.check_invariants().to_string();

  // acquire() pulls a cached block out of the LRU list: nothing is left to allocate.
  pool.acquire(0);
  EXPECT_EQ(pool.state(0), BlockState::block_state_used);
  EXPECT_EQ(pool.n_cached(), 0);
  EXPECT_EQ(pool.allocate().status().code(), StatusCode::resource_exhausted);
  ASSERT_TRUE(pool.check_invariants().ok()) << pool.check_invariants().to_string();
}

TEST(KvCache, CreateRejectsBadSizes) {
  EXPECT_EQ(KvCache::create(-1).status().code(), StatusCode::invalid_argument);
  Result<KvCache> bad_bs = KvCache::create(8, 0);
  ASSERT_FALSE(bad_bs.ok());
  EXPECT_NE(bad_bs.status().message().find("block_size = 0"), std::string::npos);
  Result<KvCache> ok = KvCache::create(8, 4);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->block_size(), 4);
  EXPECT_EQ(ok->n_blocks(), 8);
}

TEST(KvCache, BadCallsAreErrors) {
  KvCache kv(4, 4);
  const std::vector<int32_t> p = {1, 2, 3};
  ASSERT_TRUE(kv.add_sequence(7, p).ok());
  Result<int32_t> dup = kv.add_sequence(7, p);
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(dup.status().message().find("7"), std::string::npos);
  EXPECT_EQ(kv.reserve(8, 1).code(), StatusCode::not_found);
  EXPECT_EQ(kv.reserve(7, -1).code(), StatusCode::invalid_argument);
  EXPECT_TRUE(kv.check_invariants().ok());
}

TEST(KvCache, SlotsFollowTheBlockTable) {
  KvCache kv(8, 4);
  ASSERT_EQ(prefill(kv, 1, iota_tokens(6, 0)), 0);
  EXPECT_EQ(kv.n_tokens(1), 6);
  EXPECT_EQ(kv.capacity(1), 8);
  const std::vector<int32_t> t = table_of(kv, 1);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(kv.slot(1, 0), std::make_pair(t[0], 0));
  EXPECT_EQ(kv.slot(1, 5), std::make_pair(t[1], 1));
  EXPECT_EQ(kv.slot(1, 7), std::make_pair(t[1], 3));  // reserved, not committed
  // Only the full block is hashed.
  EXPECT_TRUE(kv.pool().hash_of(t[0]).has_value());
  EXPECT_FALSE(kv.pool().hash_of(t[1]).has_value());
}

TEST(KvCache, SharesAPrefixBetweenTwoSequences) {
  KvCache kv(16, 4);
  const std::vector<int32_t> a = iota_tokens(10, 100);  // blocks [100..103] [104..107] [108 109]
  ASSERT_EQ(prefill(kv, 1, a), 0);
  std::vector<int32_t> b(a.begin(), a.begin() + 8);
  b.insert(b.end(), {7, 7, 7});
  ASSERT_EQ(prefill(kv, 2, b), 8);
  const std::vector<int32_t> ta = table_of(kv, 1), tb = table_of(kv, 2);
  ASSERT_EQ(ta.size(), 3u);
  ASSERT_EQ(tb.size(), 3u);
  EXPECT_EQ(ta[0], tb[0]);
  EXPECT_EQ(ta[1], tb[1]);
  EXPECT_NE(ta[2], tb[2]);
  EXPECT_EQ(kv.pool().ref_count(ta[0]), 2);
  EXPECT_EQ(kv.pool().ref_count(ta[1]), 2);
  EXPECT_EQ(kv.pool().ref_count(ta[2]), 1);
  EXPECT_EQ(kv.n_tokens(2), 11);
  EXPECT_EQ(kv.pool().n_used(), 4);

  // The prefix is found again after both sequences are freed: the blocks wait in the LRU list.
  kv.free_sequence(1);
  kv.free_sequence(2);
  EXPECT_EQ(kv.pool().n_used(), 0);
  EXPECT_EQ(kv.pool().n_cached(), 2);
  ASSERT_TRUE(kv.check_invariants().ok());
  ASSERT_EQ(prefill(kv, 3, a), 8);
  const std::vector<int32_t> tc = table_of(kv, 3);
  EXPECT_EQ(tc[0], ta[0]);
  EXPECT_EQ(tc[1], ta[1]);
  EXPECT_EQ(kv.pool().n_cached(), 0);
  EXPECT_EQ(kv.pool().ref_count(tc[0]), 1);
}

TEST(KvCache, SameBlockTokensAtADifferentPrefixAreNotShared) {
  KvCache kv(16, 4);
  const std::vector<int32_t> a = {1, 1, 1, 1, 5, 6, 7, 8, 0};
  const std::vector<int32_t> b = {2, 2, 2, 2, 5, 6, 7, 8, 0};
  ASSERT_EQ(prefill(kv, 1, a), 0);
  ASSERT_EQ(prefill(kv, 2, b), 0);
  const std::vector<int32_t> ta = table_of(kv, 1), tb = table_of(kv, 2);
  EXPECT_NE(ta[1], tb[1]);
  ASSERT_TRUE(kv.pool().hash_of(ta[1]).has_value());
  ASSERT_TRUE(kv.pool().hash_of(tb[1]).has_value());  // registered: its chained hash differs
  EXPECT_NE(*kv.pool().hash_of(ta[1]), *kv.pool().hash_of(tb[1]));
}

TEST(KvCache, NeverReusesTheBlockOfTheLastPromptToken) {
  KvCache kv(16, 4);
  const std::vector<int32_t> a = iota_tokens(8, 0);  // exactly two full blocks
  ASSERT_EQ(prefill(kv, 1, a), 0);
  // The same prompt again: the second block holds the last token, so it is computed anew.
  ASSERT_EQ(prefill(kv, 2, a), 4);
  const std::vector<int32_t> ta = table_of(kv, 1), tb = table_of(kv, 2);
  EXPECT_EQ(ta[0], tb[0]);
  EXPECT_NE(ta[1], tb[1]);
  // Its own copy of block 1 is full but not registered: the hash index keeps one block per hash.
  EXPECT_FALSE(kv.pool().hash_of(tb[1]).has_value());
  EXPECT_EQ(kv.pool().find_cached(*kv.pool().hash_of(ta[1])), ta[1]);
  // A one-block prompt reuses nothing; so does an empty one.
  ASSERT_EQ(prefill(kv, 3, iota_tokens(4, 0)), 0);
  EXPECT_EQ(*kv.add_sequence(4, {}), 0);
  // A longer prompt reuses both blocks.
  ASSERT_EQ(prefill(kv, 5, iota_tokens(9, 0)), 8);
  // Freeing the sequence with the unregistered duplicate puts it on the free list, not in the LRU list.
  const int32_t cached_before = kv.pool().n_cached();
  kv.free_sequence(2);
  EXPECT_EQ(kv.pool().state(tb[1]), BlockState::block_state_free);
  EXPECT_EQ(kv.pool().n_cached(), cached_before);
  EXPECT_TRUE(kv.check_invariants().ok());
}

TEST(KvCache, ConcurrentEqualPrefillsKeepTheirOwnBlocks) {
  KvCache kv(16, 4);
  const std::vector<int32_t> a = iota_tokens(9, 0);
  ASSERT_EQ(*kv.add_sequence(1, a), 0);
  ASSERT_EQ(*kv.add_sequence(2, a), 0);  // nothing committed yet: nothing to share
  ASSERT_TRUE(kv.reserve(1, 9).ok());
  ASSERT_TRUE(kv.reserve(2, 9).ok());
  kv.commit(1, a);
  kv.commit(2, a);
  const std::vector<int32_t> ta = table_of(kv, 1), tb = table_of(kv, 2);
  for (int i = 0; i < 2; ++i) {
    EXPECT_NE(ta[i], tb[i]);
    EXPECT_TRUE(kv.pool().hash_of(ta[i]).has_value());
    EXPECT_FALSE(kv.pool().hash_of(tb[i]).has_value());
  }
  EXPECT_TRUE(kv.check_invariants().ok()) << kv.check_invariants().to_string();
  // A third sequence shares the registered (first) copies.
  ASSERT_EQ(prefill(kv, 3, a), 8);
  EXPECT_EQ(table_of(kv, 3)[0], ta[0]);
  EXPECT_EQ(table_of(kv, 3)[1], ta[1]);
}

TEST(KvCache, EvictsTheLeastRecentlyFreedAndTheTailOfAPrefixFirst) {
  KvCache kv(5, 4);
  const std::vector<int32_t> a = iota_tokens(13, 0);  // 3 full blocks + 1 partial
  ASSERT_EQ(prefill(kv, 1, a), 0);
  const std::vector<int32_t> ta = table_of(kv, 1);
  kv.free_sequence(1);
  EXPECT_EQ(kv.pool().n_cached(), 3);
  EXPECT_EQ(kv.pool().n_free(), 2);  // the partial block and the never-used one
  // A stranger takes the two free blocks, then evicts a's tail block (freed first), not its head.
  ASSERT_EQ(*kv.add_sequence(2, iota_tokens(3, 500)), 0);
  ASSERT_TRUE(kv.reserve(2, 12).ok());
  const std::vector<int32_t> t2 = table_of(kv, 2);
  EXPECT_EQ(t2[2], ta[2]);
  EXPECT_FALSE(kv.pool().hash_of(ta[2]).has_value());
  EXPECT_EQ(kv.pool().n_cached(), 2);
  // a's first two blocks are still cached and found.
  ASSERT_EQ(*kv.add_sequence(3, a), 8);
  EXPECT_EQ(table_of(kv, 3)[0], ta[0]);
  EXPECT_EQ(table_of(kv, 3)[1], ta[1]);
  EXPECT_TRUE(kv.check_invariants().ok());
}

TEST(KvCache, EvictsTheSequenceFreedEarlierFirst) {
  KvCache kv(4, 4);
  const std::vector<int32_t> x = iota_tokens(5, 0), y = iota_tokens(5, 50);
  ASSERT_EQ(prefill(kv, 1, x), 0);
  ASSERT_EQ(prefill(kv, 2, y), 0);
  const int32_t bx = table_of(kv, 1)[0], by = table_of(kv, 2)[0];
  kv.free_sequence(1);  // x's block is freed first, so it is evicted first
  kv.free_sequence(2);
  ASSERT_EQ(*kv.add_sequence(3, {}), 0);
  ASSERT_TRUE(kv.reserve(3, 12).ok());  // 2 free blocks + 1 eviction
  EXPECT_EQ(table_of(kv, 3)[2], bx);
  EXPECT_EQ(*kv.add_sequence(4, x), 0);
  EXPECT_EQ(*kv.add_sequence(5, y), 4);
  EXPECT_EQ(table_of(kv, 5)[0], by);
  EXPECT_TRUE(kv.check_invariants().ok());
}

TEST(BlockHash, SaltHashIsSha256OfTheDomainAndTheSalt) {
  // Expected: Python hashlib.sha256(b"kiln.cache_salt\x00" + b"tenant-a").
  EXPECT_EQ(hex(salt_hash("tenant-a")), "c95a665b1527199a2046f1c707e8f4eb9b0616af741eda2e6efa7e310e3b6721");
  EXPECT_NE(salt_hash("tenant-a"), salt_hash("tenant-b"));
}

TEST(KvCache, CacheSaltSeparatesPrefixNamespaces) {
  KvCache kv(32, 4);
  const std::vector<int32_t> a = iota_tokens(10, 100);  // two full blocks before the last token's
  ASSERT_EQ(*kv.add_sequence(1, a, "tenant-a"), 0);
  ASSERT_TRUE(kv.reserve(1, 10).ok());
  kv.commit(1, a);
  ASSERT_TRUE(kv.check_invariants().ok()) << kv.check_invariants().to_string();
  const std::vector<int32_t> t1 = table_of(kv, 1);
  // The salt is the first block's parent.
  const BlockHash root = salt_hash("tenant-a");
  EXPECT_EQ(*kv.pool().hash_of(t1[0]), block_hash(&root, std::span(a).first(4)));
  // Same salt: the prefix is shared. Another salt, or none: nothing is.
  ASSERT_EQ(*kv.add_sequence(2, a, "tenant-a"), 8);
  EXPECT_EQ(table_of(kv, 2)[0], t1[0]);
  EXPECT_EQ(*kv.add_sequence(3, a, "tenant-b"), 0);
  EXPECT_EQ(*kv.add_sequence(4, a), 0);
  // An unsalted sequence registers its own blocks, and a salted one does not find them either.
  ASSERT_TRUE(kv.reserve(4, 10).ok());
  kv.commit(4, a);
  const std::vector<int32_t> t4 = table_of(kv, 4);
  EXPECT_NE(t4[0], t1[0]);
  EXPECT_EQ(*kv.pool().hash_of(t4[0]), block_hash(nullptr, std::span(a).first(4)));
  ASSERT_EQ(*kv.add_sequence(5, a), 8);
  EXPECT_EQ(table_of(kv, 5)[0], t4[0]);
  EXPECT_EQ(*kv.add_sequence(6, a, "tenant-c"), 0);
  // After everyone is freed, the salted blocks wait in the LRU list and still answer only their salt.
  for (int64_t s : {1, 2, 3, 4, 5, 6}) kv.free_sequence(s);
  ASSERT_TRUE(kv.check_invariants().ok()) << kv.check_invariants().to_string();
  ASSERT_EQ(*kv.add_sequence(7, a, "tenant-a"), 8);
  EXPECT_EQ(table_of(kv, 7)[0], t1[0]);
  EXPECT_EQ(*kv.add_sequence(8, a, "tenant-b"), 0);
  EXPECT_TRUE(kv.check_invariants().ok()) << kv.check_invariants().to_string();
}

TEST(KvCache, ReserveIsAllOrNothing) {
  KvCache kv(4, 4);
  ASSERT_EQ(prefill(kv, 1, iota_tokens(5, 0)), 0);  // 2 blocks, the first cached-able
  ASSERT_EQ(prefill(kv, 2, iota_tokens(4, 90)), 0);
  kv.free_sequence(2);  // 1 cached block, 1 free block
  ASSERT_EQ(kv.pool().n_cached(), 1);
  ASSERT_EQ(kv.pool().n_free(), 1);
  const std::vector<int32_t> before = table_of(kv, 1);
  // Capacity 8, 5 committed: 3 + 4 + 4 fit in 2 more blocks; one token more needs 3.
  Status st = kv.reserve(1, 12);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::resource_exhausted);
  EXPECT_NE(st.message().find("2 available"), std::string::npos) << st.message();
  EXPECT_EQ(table_of(kv, 1), before);
  EXPECT_EQ(kv.pool().n_cached(), 1);  // nothing evicted
  EXPECT_EQ(kv.pool().n_free(), 1);
  EXPECT_TRUE(kv.check_invariants().ok());
  // Within the capacity: no new block.
  ASSERT_TRUE(kv.reserve(1, 3).ok());
  EXPECT_EQ(table_of(kv, 1), before);
  ASSERT_TRUE(kv.reserve(1, 11).ok());
  EXPECT_EQ(kv.capacity(1), 16);
  EXPECT_EQ(kv.pool().n_available(), 0);
  EXPECT_TRUE(kv.check_invariants().ok());
}

// Random add / reserve+write+commit / free. The K/V storage is simulated by the token id written at each
// slot: every committed position of every live sequence must read back its own token, so a shared block that
// gets overwritten, or a prefix hit with other content, shows up at once.
TEST(KvCache, RandomizedStress) {
  constexpr int32_t kBlockSize = 4, kBlocks = 40, kOps = 4000, kMaxLive = 8;
  KvCache kv(kBlocks, kBlockSize);
  std::mt19937 rng(1234);
  auto uniform = [&](int32_t lo, int32_t hi) { return std::uniform_int_distribution<int32_t>(lo, hi)(rng); };
  std::vector<std::vector<int32_t>> bases(3);  // shared prompt prefixes
  for (auto& b : bases) {
    for (int i = 0; i < 40; ++i) b.push_back(uniform(0, 5));
  }
  std::vector<int32_t> storage(kBlocks * kBlockSize, -1);  // [n_blocks * block_size] token at each slot
  struct Model {
    std::vector<int32_t> committed;  // tokens whose K/V are written
    std::vector<int32_t> pending;    // prompt tokens still to prefill
  };
  std::map<int64_t, Model> live;
  int64_t next_id = 0;
  int32_t n_reused_tokens = 0, n_exhausted = 0, n_freed = 0;

  auto free_random = [&]() {
    auto it = std::next(live.begin(), uniform(0, static_cast<int32_t>(live.size()) - 1));
    kv.free_sequence(it->first);
    live.erase(it);
    ++n_freed;
  };

  for (int op = 0; op < kOps; ++op) {
    const int32_t kind = uniform(0, 9);
    if (live.empty() || (kind < 3 && static_cast<int32_t>(live.size()) < kMaxLive)) {
      const auto& base = bases[uniform(0, 2)];
      std::vector<int32_t> prompt(base.begin(), base.begin() + uniform(0, 40));
      for (int32_t i = uniform(0, 6); i > 0; --i) prompt.push_back(uniform(0, 5));
      const int64_t id = next_id++;
      Result<int32_t> r = kv.add_sequence(id, prompt);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      ASSERT_EQ(*r % kBlockSize, 0);
      ASSERT_TRUE(prompt.empty() ? *r == 0 : *r < static_cast<int32_t>(prompt.size()));
      n_reused_tokens += *r;
      live[id] = Model{{prompt.begin(), prompt.begin() + *r}, {prompt.begin() + *r, prompt.end()}};
    } else if (kind < 9) {
      auto it = std::next(live.begin(), uniform(0, static_cast<int32_t>(live.size()) - 1));
      Model& m = it->second;
      std::vector<int32_t> chunk;
      if (!m.pending.empty()) {  // a prefill chunk
        const int32_t n = std::min<int32_t>(static_cast<int32_t>(m.pending.size()), uniform(1, 9));
        chunk.assign(m.pending.begin(), m.pending.begin() + n);
        m.pending.erase(m.pending.begin(), m.pending.begin() + n);
      } else {  // a decode step
        chunk.push_back(uniform(0, 5));
      }
      const std::vector<int32_t> table_before = table_of(kv, it->first);
      const int32_t available_before = kv.pool().n_available();
      Status st = kv.reserve(it->first, static_cast<int32_t>(chunk.size()));
      if (!st.ok()) {
        ASSERT_EQ(st.code(), StatusCode::resource_exhausted) << st.to_string();
        ASSERT_EQ(table_of(kv, it->first), table_before);
        ASSERT_EQ(kv.pool().n_available(), available_before);
        ++n_exhausted;
        free_random();  // preemption
      } else {
        const int32_t pos0 = static_cast<int32_t>(m.committed.size());
        for (size_t i = 0; i < chunk.size(); ++i) {
          auto [block, offset] = kv.slot(it->first, pos0 + static_cast<int32_t>(i));
          storage[block * kBlockSize + offset] = chunk[i];
        }
        kv.commit(it->first, chunk);
        m.committed.insert(m.committed.end(), chunk.begin(), chunk.end());
      }
    } else {
      free_random();
    }

    const Status inv = kv.check_invariants();
    ASSERT_TRUE(inv.ok()) << "after op " << op << ": " << inv.to_string();
    ASSERT_EQ(kv.n_sequences(), static_cast<int32_t>(live.size()));
    for (const auto& [id, m] : live) {
      ASSERT_EQ(kv.n_tokens(id), static_cast<int32_t>(m.committed.size()));
      for (int32_t p = 0; p < kv.n_tokens(id); ++p) {
        auto [block, offset] = kv.slot(id, p);
        ASSERT_EQ(storage[block * kBlockSize + offset], m.committed[p])
            << "op " << op << ", sequence " << id << ", position " << p;
      }
    }
  }
  // The run covered prefix hits, exhaustion and frees.
  EXPECT_GT(n_reused_tokens, 1000);
  EXPECT_GT(n_exhausted, 10);
  EXPECT_GT(n_freed, 100);
  while (!live.empty()) free_random();
  EXPECT_EQ(kv.pool().n_used(), 0);
  EXPECT_TRUE(kv.check_invariants().ok());
}

TEST(KvCacheBudget, ExplicitBudgetIsFlooredToWholeBlocks) {
  KvBudgetInput in{.budget_bytes = 10'000, .block_bytes = 3'000, .full_blocks = 2, .mem_available = 1};
  EXPECT_EQ(*kv_blocks_for_budget(in), 3);  // more than full_blocks: all of it, for cached prefixes
  in.budget_bytes = 2'999;
  Result<int64_t> none = kv_blocks_for_budget(in);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(none.status().message().find("kv_memory_bytes = 2999 (--kv-memory) holds no KV block"),
            std::string::npos)
      << none.status().message();
  EXPECT_NE(none.status().message().find("3000 bytes"), std::string::npos);
  in.budget_bytes = uint64_t{1} << 62;
  in.block_bytes = 1;
  EXPECT_NE(kv_blocks_for_budget(in).status().message().find("more than"), std::string::npos);
}

TEST(KvCacheBudget, DefaultIsFullLengthCappedByHalfTheAvailableMemory) {
  KvBudgetInput in{.budget_bytes = 0, .block_bytes = 1'000, .full_blocks = 64, .mem_available = 1'000'000};
  EXPECT_EQ(*kv_blocks_for_budget(in), 64);  // room to spare: n_seq_max x n_ctx, as before budgets
  in.mem_available = 100'000;
  EXPECT_EQ(*kv_blocks_for_budget(in), 50);  // half of 100 blocks' worth
  in.mem_available = 10;
  EXPECT_EQ(*kv_blocks_for_budget(in), 1);
  in.mem_available.reset();
  EXPECT_EQ(*kv_blocks_for_budget(in), 64);
}

TEST(KvCacheBudget, GpuLayersFitTheFreeMemory) {
  GpuFitInput in{.layer_bytes = {100, 100, 100, 100},
                 .first_bytes = 50,
                 .last_bytes = 80,
                 .free = 1'000,
                 .reserve = 200};
  EXPECT_EQ(fit_gpu_layers(in), 4);  // 530 of 800: everything
  in.free = 729;                     // room 529: one byte short of everything
  EXPECT_EQ(fit_gpu_layers(in), 3);  // the head goes to the CPU, and with it the last layer
  in.free = 549;                     // room 349: the embedding and 2 layers
  EXPECT_EQ(fit_gpu_layers(in), 2);
  in.free = 249;  // room 49: not even the embedding
  EXPECT_EQ(fit_gpu_layers(in), 0);
  in.free = 200;  // nothing beyond the reserve
  EXPECT_EQ(fit_gpu_layers(in), 0);
  in.free = 1'000;
  in.last_bytes = 1'000;  // the layers fit but the head does not
  EXPECT_EQ(fit_gpu_layers(in), 3);
  EXPECT_EQ(fit_gpu_layers({.layer_bytes = {}, .first_bytes = 0, .last_bytes = 0, .free = 10, .reserve = 0}),
            0);
}

TEST(KvCacheBudget, ParsesMemAvailable) {
  EXPECT_EQ(parse_mem_available("MemTotal:       24684084 kB\nMemFree:        21417296 kB\n"
                                "MemAvailable:   23670480 kB\nBuffers: 1 kB\n"),
            uint64_t{23670480} * 1024);
  EXPECT_EQ(parse_mem_available("MemAvailable: 7 kB"), uint64_t{7168});
  EXPECT_FALSE(parse_mem_available("MemTotal: 5 kB\n").has_value());
  EXPECT_FALSE(parse_mem_available("XMemAvailable: 5 kB\n").has_value());
  EXPECT_FALSE(parse_mem_available("MemAvailable: lots kB\n").has_value());
  EXPECT_FALSE(parse_mem_available("MemAvailable: 5 MB\n").has_value());
  EXPECT_FALSE(parse_mem_available("MemAvailable: 99999999999999999999 kB\n").has_value());
  // This machine's, when it has one, is a positive number of bytes.
  if (auto m = mem_available_bytes()) {
    EXPECT_GT(*m, 0u);
  }
}

}  // namespace
TEST(KvCache, ReleaseBeforeFreesOnlyBlocksOutsideTheWindow) {
  KvCache kv(8, 4);
  ASSERT_EQ(prefill(kv, 1, iota_tokens(10, 0)), 0);  // blocks [0..3] [4..7] [8 9 . .]
  const std::vector<int32_t> t = table_of(kv, 1);
  EXPECT_EQ(kv.release_before(1, 3), 0);  // position 3 is still read
  EXPECT_EQ(kv.release_before(1, 4), 1);
  EXPECT_EQ(kv.release_before(1, 4), 0);  // idempotent
  EXPECT_EQ(kv.block_table(1)[0], ops::kFreedBlock);
  EXPECT_EQ(kv.block_table(1)[1], t[1]);
  EXPECT_EQ(kv.pool().n_used(), 2);
  EXPECT_EQ(kv.pool().n_cached(), 1);  // the full block waits in the LRU list
  ASSERT_TRUE(kv.check_invariants().ok());
  // Never past the committed tokens: the block being written stays.
  EXPECT_EQ(kv.release_before(1, 100), 1);
  EXPECT_EQ(kv.block_table(1)[2], t[2]);
  ASSERT_TRUE(kv.check_invariants().ok());
  // A new sequence with the same prefix finds the released full blocks.
  ASSERT_EQ(prefill(kv, 2, iota_tokens(10, 0)), 8);
  EXPECT_EQ(table_of(kv, 2)[0], t[0]);
  kv.free_sequence(1);
  kv.free_sequence(2);
  EXPECT_EQ(kv.pool().n_used(), 0);
  ASSERT_TRUE(kv.check_invariants().ok());
}

}  // namespace kiln
