#include "tokenizer/vocab_index.h"

#include <gtest/gtest.h>

#include <string>
#include <unordered_map>
#include <vector>

namespace kiln::tokenizer_detail {
namespace {

TEST(KeyIndex, FindsEveryKeyAndNothingElse) {
  std::vector<std::string> keys;
  for (int i = 0; i < 5000; ++i) keys.push_back("tok" + std::to_string(i * 7));
  keys.push_back("");      // an empty key is a key
  keys.push_back("tok7");  // repeated: id 5001 (the last) or 1 (the first)
  keys.push_back("\xE2\x96\x81x");
  KeyIndex last, first;
  last.build(keys);
  first.build(keys, /*first_wins=*/true);
  for (int i = 0; i < 5000; ++i) {
    if (i == 1) continue;
    EXPECT_EQ(last.find(keys[i]), i);
    EXPECT_EQ(first.find(keys[i]), i);
  }
  EXPECT_EQ(last.find(""), 5000);
  EXPECT_EQ(last.find("tok7"), 5001);
  EXPECT_EQ(first.find("tok7"), 1);
  EXPECT_EQ(last.find("\xE2\x96\x81x"), 5002);
  EXPECT_EQ(last.find("tok8"), -1);
  EXPECT_EQ(last.find("tok70 "), -1);
  EXPECT_FALSE(last.contains("nope"));
  EXPECT_EQ(KeyIndex().find("tok7"), -1);  // never built
  // A moved vector keeps its strings: the index still reads them.
  std::vector<std::string> moved = std::move(keys);
  EXPECT_EQ(last.find("tok14"), 2);
}

TEST(MergeTable, AgreesWithAMap) {
  MergeTable t;
  std::unordered_map<uint64_t, Merge> ref;
  EXPECT_TRUE(t.empty());
  EXPECT_EQ(t.find(MergeTable::pair_key(1, 2)), nullptr);
  uint32_t state = 7;
  for (uint32_t i = 0; i < 20000; ++i) {  // grows from nothing; repeated pairs
    state = state * 1664525u + 1013904223u;
    const auto l = static_cast<int32_t>(state % 300), r = static_cast<int32_t>((state >> 16) % 300);
    const uint64_t key = MergeTable::pair_key(l, r);
    if (i % 2 == 0) {
      t.insert_or_assign(key, Merge{i, l + r});
      ref[key] = Merge{i, l + r};
    } else {
      t.insert(key, Merge{i, l - r});
      ref.emplace(key, Merge{i, l - r});
    }
  }
  EXPECT_EQ(t.size(), ref.size());
  for (const auto& [key, m] : ref) {
    const Merge* got = t.find(key);
    ASSERT_NE(got, nullptr);
    EXPECT_EQ(got->rank, m.rank);
    EXPECT_EQ(got->merged, m.merged);
  }
  size_t seen = 0;
  t.for_each([&](uint64_t key, const Merge& m) {
    ++seen;
    EXPECT_EQ(ref.at(key).rank, m.rank);
  });
  EXPECT_EQ(seen, ref.size());
  EXPECT_EQ(t.find(MergeTable::pair_key(300, 0)), nullptr);
  EXPECT_EQ(t.find(MergeTable::pair_key(0x7FFFFFFF, 0x7FFFFFFF)), nullptr);
  t.clear();
  EXPECT_TRUE(t.empty());
  EXPECT_EQ(t.find(ref.begin()->first), nullptr);
}

}  // namespace
}  // namespace kiln::tokenizer_detail
