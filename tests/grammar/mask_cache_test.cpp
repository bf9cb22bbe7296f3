// The per-state mask caches: built on first use (and from several threads at once) they give the masks
// compile() gives; over exotic grammars and a vocabulary of many overlapping pieces, the fast mask equals the
// reference mask along random paths.
#include "grammar/mask_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <thread>

#include "grammar/grammar.h"
#include "test_util.h"

namespace kiln::grammar {
namespace {

// Every byte, and the substrings of 2..5 bytes of the sample texts: tokens that cross every boundary.
std::shared_ptr<const Vocabulary> piece_vocab(const std::vector<std::string>& samples) {
  std::set<std::string> pieces;
  for (int b = 1; b < 256; ++b) pieces.insert(std::string(1, static_cast<char>(b)));
  for (const std::string& s : samples) {
    for (size_t i = 0; i < s.size(); ++i) {
      for (size_t n = 2; n <= 5 && i + n <= s.size(); ++n) pieces.insert(s.substr(i, n));
    }
  }
  std::vector<std::string> tokens(pieces.begin(), pieces.end());
  tokens.emplace_back("");  // the end token
  const auto end = static_cast<int32_t>(tokens.size()) - 1;
  return test::make_vocab(std::move(tokens), {end});
}

struct Exotic {
  const char* name;
  const char* gbnf;
  const char* sample;
};

const Exotic kExotic[] = {
    // Nullable rules in a row, loops over nullable groups.
    {"nullable", R"gbnf(
root ::= a b c "!"
a ::= "x"? a2
a2 ::= "" | "q" a2
b ::= ("y" | "")* "z"?
c ::= (a | b)
)gbnf",
     "xqqyyzxq!"},
    // Right recursion in tail position, mutual recursion, calls returning into states that also consume.
    {"recursion", R"gbnf(
root ::= stmt+
stmt ::= "let " id " = " expr ";\n" | "{" stmt* "}"
expr ::= term (("+" | "-") term)*
term ::= id | [0-9]+ | "(" expr ")" | "f(" args? ")"
args ::= expr ("," args)?
id ::= [a-z] [a-z0-9]*
)gbnf",
     "let a = (b+1)-f(2,c);\n{let x9 = f(f(1));\n}"},
    // Two parses alive at once (ws both inside and after the list), escapes over several rules at once.
    {"ambiguous", R"gbnf(
root ::= list ws
list ::= "[" ws (item (ws "," ws item)*)? ws "]"
item ::= list | word
word ::= [a-z]+ | "'" [^']* "'"
ws ::= [ \n]*
)gbnf",
     "[ [ab , 'c d' ] ,[ ] , x ]  \n"},
    // Multi-byte characters in classes, negation, any character, repetition counts.
    {"unicode", R"gbnf(
root ::= (greek | cjk | other)+
greek ::= [α-ωΑ-Ω]{1,3} " "
cjk ::= [^\x00-\u2FFF]+ "。"
other ::= "<" .{2,4} ">"
)gbnf",
     "αβγ 日本語。<ab€>Ω <😀😀>"},
};

// The token ids of the text's single bytes.
std::vector<int32_t> byte_path(const Vocabulary& v, const std::string& text) {
  std::vector<int32_t> out;
  for (char c : text) {
    const auto it = std::find(v.bytes.begin(), v.bytes.end(), std::string(1, c));
    out.push_back(static_cast<int32_t>(it - v.bytes.begin()));
  }
  return out;
}

void random_walks(const std::shared_ptr<const CompiledGrammar>& cg, const Vocabulary& v, uint32_t seed,
                  int32_t steps) {
  std::mt19937 rng(seed);
  Matcher m(cg);
  for (int32_t step = 0; step < steps && !m.done(); ++step) {
    SCOPED_TRACE(step);
    const std::vector<int32_t> ok = test::checked_mask(m, v.n_vocab());
    if (::testing::Test::HasFailure() || ok.empty()) return;
    int32_t pick = ok[std::uniform_int_distribution<size_t>(0, ok.size() - 1)(rng)];
    if (v.bytes[static_cast<size_t>(pick)].empty() && ok.size() > 1) pick = ok[0];
    ASSERT_TRUE(m.accept(pick));
  }
}

TEST(GrammarMaskCache, ExoticGrammarsFastEqualsReference) {
  std::vector<std::string> samples;
  for (const Exotic& e : kExotic) samples.emplace_back(e.sample);
  auto v = piece_vocab(samples);
  for (const Exotic& e : kExotic) {
    SCOPED_TRACE(e.name);
    auto cg = test::compile_text(e.gbnf, v);
    ASSERT_NE(cg, nullptr);
    // The sample itself, one byte token at a time, is a sentence.
    Matcher m(cg);
    for (int32_t token : byte_path(*v, e.sample))
      ASSERT_TRUE(m.accept(token)) << v->bytes[static_cast<size_t>(token)];
    EXPECT_TRUE(m.can_end());
    for (uint32_t seed = 1; seed <= 6; ++seed) random_walks(cg, *v, seed, 40);
  }
}

std::vector<std::vector<int32_t>> masks_along(const std::shared_ptr<const CompiledGrammar>& cg,
                                              int32_t n_vocab, const std::vector<int32_t>& path) {
  Matcher m(cg);
  std::vector<std::vector<int32_t>> out;
  std::vector<uint32_t> words(mask_words(n_vocab));
  for (int32_t token : path) {
    m.fill_mask(words);
    out.push_back(test::allowed(words, n_vocab));
    if (!m.accept(token)) break;
  }
  return out;
}

TEST(GrammarMaskCache, BuiltOnFirstUseFromManyThreads) {
  const Exotic& e = kExotic[2];
  auto v = piece_vocab({e.sample});
  auto g = parse_gbnf(e.gbnf);
  ASSERT_TRUE(g.ok());
  auto eager = compile_with_budget(*g, v, int64_t{1} << 40);
  auto lazy = compile_with_budget(*g, v, 0);
  ASSERT_TRUE(eager.ok() && lazy.ok());
  EXPECT_EQ((*lazy)->owned.size(), 0u);
  const std::vector<int32_t> path = byte_path(*v, e.sample);
  const auto expected = masks_along(*eager, v->n_vocab(), path);
  ASSERT_EQ(expected.size(), path.size());
  std::vector<std::vector<std::vector<int32_t>>> got(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < got.size(); ++t) {
    threads.emplace_back([&, t] { got[t] = masks_along(*lazy, v->n_vocab(), path); });
  }
  for (auto& th : threads) th.join();
  for (const auto& masks : got) EXPECT_EQ(masks, expected);
  EXPECT_GT((*lazy)->owned.size(), 0u);
}

}  // namespace
}  // namespace kiln::grammar
