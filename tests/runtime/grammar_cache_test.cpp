// GrammarCache: compiled grammars shared by key, bounded by entries and by the bytes their masks hold.
#include "runtime/grammar_cache.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace kiln {
namespace {

// 256 one-byte tokens and an end token.
std::shared_ptr<const grammar::Vocabulary> byte_vocab() {
  auto v = std::make_shared<grammar::Vocabulary>();
  for (int b = 0; b < 256; ++b) v->bytes.emplace_back(1, static_cast<char>(b));
  v->bytes.emplace_back();
  v->excluded.assign(v->bytes.size(), 0);
  v->excluded.back() = 1;
  v->end_ids.push_back(256);
  return v;
}

OutputConstraint regex(std::string pattern) { return {OutputConstraint::Kind::regex, std::move(pattern)}; }

TEST(GrammarCache, SharesAGrammarByKindAndText) {
  GrammarCache cache(byte_vocab(), 8, size_t{1} << 30);
  auto a = cache.get(regex("[a-z]{3}"));
  auto b = cache.get(regex("[a-z]{3}"));
  auto c = cache.get({OutputConstraint::Kind::gbnf, "root ::= [a-z]{3}\n"});
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->get(), b->get());
  EXPECT_NE(a->get(), c->get());
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.hits(), 1u);
  EXPECT_GT(cache.bytes(), 0u);
}

TEST(GrammarCache, EvictsTheLeastRecentlyUsedPastItsEntries) {
  GrammarCache cache(byte_vocab(), 2, size_t{1} << 30);
  ASSERT_TRUE(cache.get(regex("a+")).ok());
  ASSERT_TRUE(cache.get(regex("b+")).ok());
  ASSERT_TRUE(cache.get(regex("a+")).ok());  // a hit: b is now the oldest
  ASSERT_TRUE(cache.get(regex("c+")).ok());
  EXPECT_EQ(cache.size(), 2u);
  const uint64_t hits = cache.hits();
  ASSERT_TRUE(cache.get(regex("a+")).ok());
  EXPECT_EQ(cache.hits(), hits + 1);  // kept
  ASSERT_TRUE(cache.get(regex("b+")).ok());
  EXPECT_EQ(cache.hits(), hits + 1);  // evicted: compiled again
}

TEST(GrammarCache, EvictsPastItsBytesButKeepsTheNewest) {
  GrammarCache cache(byte_vocab(), 64, 1);  // every grammar is over the bound
  auto a = cache.get(regex("[0-9]{4}"));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(cache.size(), 1u);
  auto b = cache.get(regex("[a-f]{4}"));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(cache.size(), 1u);
  // The evicted grammar still serves whoever holds it.
  grammar::Matcher m(*a);
  for (char ch : std::string("2024")) EXPECT_TRUE(m.accept(static_cast<unsigned char>(ch)));
  EXPECT_TRUE(m.can_end());
  EXPECT_EQ(cache.hits(), 0u);
}

TEST(GrammarCache, ErrorsAreNotCached) {
  GrammarCache cache(byte_vocab(), 8, size_t{1} << 30);
  auto bad = cache.get(regex("(a"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("constraint (regex)"), std::string::npos) << bad.status().message();
  EXPECT_EQ(cache.size(), 0u);
}

}  // namespace
}  // namespace kiln
