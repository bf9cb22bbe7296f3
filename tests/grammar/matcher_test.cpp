// The matcher over small hand-made vocabularies: languages, edge cases, the fast mask against the reference.
#include <gtest/gtest.h>

#include <algorithm>

#include "grammar/grammar.h"
#include "test_util.h"

namespace kiln::grammar {
namespace {

using test::matches;

TEST(GrammarMatch, LiteralsClassesRepetition) {
  EXPECT_TRUE(matches(R"(root ::= "ab" [0-9]+)", "ab123"));
  EXPECT_FALSE(matches(R"(root ::= "ab" [0-9]+)", "ab"));
  EXPECT_FALSE(matches(R"(root ::= "ab" [0-9]+)", "abx"));
  EXPECT_TRUE(matches(R"(root ::= [a-c]{2,3})", "abc"));
  EXPECT_FALSE(matches(R"(root ::= [a-c]{2,3})", "abca"));
  EXPECT_FALSE(matches(R"(root ::= [a-c]{2,3})", "a"));
  EXPECT_TRUE(matches(R"(root ::= "x"{3})", "xxx"));
  EXPECT_TRUE(matches(R"(root ::= "x"{2,} "y")", "xxxxxy"));
  EXPECT_FALSE(matches(R"(root ::= "x"{2,} "y")", "xy"));
  EXPECT_TRUE(matches(R"(root ::= ("a" | "b")* "c"?)", ""));
  EXPECT_TRUE(matches(R"(root ::= ("a" | "b")* "c"?)", "abbac"));
  EXPECT_TRUE(matches("root ::= [^a-z]+", "AZ09"));
  EXPECT_FALSE(matches("root ::= [^a-z]+", "Ab"));
  EXPECT_TRUE(matches("root ::= .+", "h\xC3\xA9llo\xF0\x9F\x98\x80"));
  EXPECT_TRUE(matches(R"(root ::= [α-ω]+)", "λμ"));
  EXPECT_FALSE(matches(R"(root ::= [α-ω]+)", "λA"));
  EXPECT_TRUE(matches(R"(root ::= "\x41\u00e9\U0001F600\n\t\"\\")", "A\xC3\xA9\xF0\x9F\x98\x80\n\t\"\\"));
}

TEST(GrammarMatch, RulesAndRecursion) {
  const char* arr = R"(
root ::= arr
arr ::= "[" (arr ("," arr)*)? "]"
)";
  EXPECT_TRUE(matches(arr, "[]"));
  EXPECT_TRUE(matches(arr, "[[],[[]],[[],[]]]"));
  EXPECT_FALSE(matches(arr, "[[]"));
  EXPECT_FALSE(matches(arr, "[],"));
  const char* list = R"(
root ::= item
item ::= "x" item | ""
)";
  EXPECT_TRUE(matches(list, ""));
  EXPECT_TRUE(matches(list, std::string(500, 'x')));
}

}  // namespace
}  // namespace kiln::grammar

namespace kiln::grammar {
namespace {

using test::checked_mask;
using test::compile_text;
using test::make_vocab;

// Token ids of a vocabulary, by their bytes.
int32_t id_of(const Vocabulary& v, const std::string& bytes) {
  for (int32_t i = 0; i < v.n_vocab(); ++i) {
    if (v.bytes[static_cast<size_t>(i)] == bytes) return i;
  }
  ADD_FAILURE() << "no token " << bytes;
  return -1;
}

std::vector<int32_t> ids(const Vocabulary& v, std::initializer_list<const char*> tokens) {
  std::vector<int32_t> out;
  for (const char* t : tokens) out.push_back(id_of(v, t));
  std::sort(out.begin(), out.end());
  return out;
}

TEST(GrammarMatcher, FiniteLanguageEndsWithOnlyEndTokens) {
  auto v = make_vocab({"y", "ye", "yes", "s", "no", "n", "o", "yesno", "<eos>"}, {8});
  auto cg = compile_text(R"gbnf(root ::= "yes" | "no")gbnf", v);
  Matcher m(cg);
  EXPECT_EQ(checked_mask(m, v->n_vocab()), ids(*v, {"y", "ye", "yes", "no", "n"}));
  EXPECT_FALSE(m.can_end());
  EXPECT_TRUE(m.accept(id_of(*v, "ye")));
  EXPECT_EQ(checked_mask(m, v->n_vocab()), ids(*v, {"s"}));
  EXPECT_TRUE(m.accept(id_of(*v, "s")));
  EXPECT_TRUE(m.can_end());
  EXPECT_TRUE(m.done());  // nothing but an end token can follow
  EXPECT_EQ(checked_mask(m, v->n_vocab()), std::vector<int32_t>{8});
  EXPECT_TRUE(m.accept(8));
  EXPECT_TRUE(m.done());
  EXPECT_FALSE(m.can_end());
  EXPECT_FALSE(m.accept(8));
  EXPECT_EQ(checked_mask(m, v->n_vocab()), std::vector<int32_t>{});
}

TEST(GrammarMatcher, EmptyLanguageIsDoneAtOnce) {
  auto v = make_vocab({"a", "<eos>"}, {1});
  auto cg = compile_text(R"gbnf(root ::= "")gbnf", v);
  Matcher m(cg);
  EXPECT_TRUE(m.can_end());
  EXPECT_TRUE(m.done());
  EXPECT_EQ(checked_mask(m, v->n_vocab()), std::vector<int32_t>{1});
  EXPECT_FALSE(m.accept(0));
}

TEST(GrammarMatcher, EmptyAlternativeAllowsEndAtOnce) {
  auto v = make_vocab({"a", "aa", "b", "<eos>"}, {3});
  auto cg = compile_text(R"gbnf(root ::= "a" | "")gbnf", v);
  Matcher m(cg);
  EXPECT_TRUE(m.can_end());
  EXPECT_FALSE(m.done());
  EXPECT_EQ(checked_mask(m, v->n_vocab()), (std::vector<int32_t>{0, 3}));
  EXPECT_TRUE(m.accept(3));
  EXPECT_TRUE(m.done());
}

TEST(GrammarMatcher, NestedArraysRecurse) {
  auto v = make_vocab({"[", "]", ",", "[[", "]]", "],[", "[]", "1", "<eos>"}, {8});
  auto cg = compile_text(R"gbnf(
root ::= arr
arr ::= "[" ( val ( "," val )* )? "]"
val ::= arr | "1"
)gbnf",
                         v);
  Matcher m(cg);
  const int32_t open = id_of(*v, "[["), close = id_of(*v, "]]");
  for (int i = 0; i < 300; ++i) ASSERT_TRUE(m.accept(open));
  EXPECT_EQ(checked_mask(m, v->n_vocab()), ids(*v, {"[", "]", "[[", "]]", "],[", "[]", "1"}));
  for (int i = 0; i < 300; ++i) ASSERT_TRUE(m.accept(close)) << i;
  EXPECT_TRUE(m.done());
  EXPECT_EQ(checked_mask(m, v->n_vocab()), std::vector<int32_t>{8});
}

TEST(GrammarMatcher, TokenSpansRuleBoundaries) {
  auto v = make_vocab({"a", ",", "a,", ",a", "a,b", "ab", "b", "<eos>"}, {7});
  auto cg = compile_text(R"gbnf(
root ::= item ("," item)*
item ::= [a-b]
)gbnf",
                         v);
  Matcher m(cg);
  EXPECT_EQ(checked_mask(m, v->n_vocab()), ids(*v, {"a", "a,", "a,b", "b"}));
  EXPECT_TRUE(m.accept(id_of(*v, "a,b")));
  EXPECT_EQ(checked_mask(m, v->n_vocab()), ids(*v, {",", ",a", "<eos>"}));
  EXPECT_FALSE(m.accept(id_of(*v, "ab")));
}

TEST(GrammarMatcher, TokenEndsInsideAMultiByteCharacter) {
  // é is C3 A9, ü is C3 BC, € is E2 82 AC.
  auto v = make_vocab(
      {"\xC3", "\xA9", "\xBC", "\xC3\xA9", "\xE2", "\x82\xAC", "\xE2\x82", "\xAC", "e", "<eos>"}, {9});
  auto cg = compile_text(R"gbnf(root ::= [é€]+)gbnf", v);
  Matcher m(cg);
  EXPECT_EQ(checked_mask(m, v->n_vocab()), ids(*v, {"\xC3", "\xC3\xA9", "\xE2", "\xE2\x82"}));
  EXPECT_TRUE(m.accept(id_of(*v, "\xC3")));
  EXPECT_FALSE(m.can_end());  // in the middle of a character
  EXPECT_EQ(checked_mask(m, v->n_vocab()), ids(*v, {"\xA9"}));
  EXPECT_TRUE(m.accept(id_of(*v, "\xA9")));
  EXPECT_TRUE(m.can_end());
  EXPECT_TRUE(m.accept(id_of(*v, "\xE2\x82")));
  EXPECT_EQ(checked_mask(m, v->n_vocab()), ids(*v, {"\xAC"}));
}

TEST(GrammarMatcher, RejectedAcceptChangesNothing) {
  auto v = make_vocab({"a", "b", "ab", "<eos>"}, {3});
  auto cg = compile_text(R"gbnf(root ::= "a" "b"*)gbnf", v);
  Matcher m(cg);
  const auto before = checked_mask(m, v->n_vocab());
  EXPECT_FALSE(m.accept(1));   // "b" first
  EXPECT_FALSE(m.accept(3));   // end too early
  EXPECT_FALSE(m.accept(-1));  // out of range
  EXPECT_FALSE(m.accept(1 << 20));
  EXPECT_EQ(checked_mask(m, v->n_vocab()), before);
  EXPECT_FALSE(m.can_end());
  EXPECT_TRUE(m.accept(2));
  EXPECT_TRUE(m.can_end());
}

TEST(GrammarMatcher, ExcludedAndEmptyTokensNeverAllowed) {
  auto base = make_vocab({"a", "b", "", "a", "<eos>"}, {4});
  auto v = std::make_shared<Vocabulary>(*base);
  v->excluded[1] = 1;  // "b" is a control token
  auto cg = compile_text(R"gbnf(root ::= [ab]*)gbnf", v);
  Matcher m(cg);
  EXPECT_EQ(checked_mask(m, v->n_vocab()), (std::vector<int32_t>{0, 3, 4}));  // duplicates both allowed
  EXPECT_FALSE(m.accept(1));
  EXPECT_FALSE(m.accept(2));
  EXPECT_TRUE(m.accept(3));
}

TEST(GrammarMatcher, AmbiguousGrammarStaysBoundedAndFailsCleanly) {
  // After n "x", every nesting level may take a "y": n live stacks. Past the bound the matcher refuses.
  auto v = make_vocab({"x", "y", "xx", "<eos>"}, {3});
  auto cg = compile_text(R"gbnf(
root ::= a
a ::= "x" a "y"? | ""
)gbnf",
                         v);
  Matcher m(cg);
  int accepted = 0;
  for (; accepted < 5000 && m.accept(0); ++accepted) {
  }
  EXPECT_GT(accepted, 100);
  EXPECT_LT(accepted, 5000);
  std::vector<uint32_t> words(mask_words(v->n_vocab()));
  m.fill_mask(words);  // still answers
  // Exponentially ambiguous: each "a" may start one of two rules.
  auto cg2 = compile_text(R"gbnf(
root ::= (p | q)*
p ::= "x" | "x" "x"
q ::= "x"+
)gbnf",
                          v);
  Matcher m2(cg2);
  for (int i = 0; i < 2000; ++i) {
    if (!m2.accept(2)) break;
    if (i % 100 == 0) checked_mask(m2, v->n_vocab());
  }
}

}  // namespace
}  // namespace kiln::grammar
