// Hostile GBNF: mutations of valid grammars (bytes replaced, inserted, deleted; pieces duplicated) must end
// in an error or a grammar that compiles and matches, never a crash; when they parse, the fast mask equals
// the reference mask along a few steps.
#include <gtest/gtest.h>

#include <random>

#include "grammar/grammar.h"
#include "test_util.h"

namespace kiln::grammar {
namespace {

const char* kSeeds[] = {
    R"gbnf(root ::= "{" ws pair ("," ws pair)* "}"
pair ::= str ws ":" ws (str | num | root)
str ::= "\"" [^"\\]* "\""
num ::= "-"? [0-9]+ ("." [0-9]{1,3})?
ws ::= [ \t\n]*)gbnf",
    R"gbnf(root ::= (expr "=" term "\n")+
expr ::= term ([-+*/] term)*
term ::= [a-z]+ | [0-9]+ | "(" expr ")")gbnf",
    R"gbnf(root ::= item{2,4} tail?
item ::= [α-ω€] | "x" item "y" | .
tail ::= "" | "!" tail)gbnf",
};

std::string mutate(std::string s, std::mt19937& rng) {
  const char alphabet[] = "\"[]()|*+?{},-^\\.#:= \nabxyz019rootu";
  const int n = 1 + static_cast<int>(rng() % 4);
  for (int i = 0; i < n; ++i) {
    const size_t at = s.empty() ? 0 : rng() % s.size();
    const char c = alphabet[rng() % (sizeof(alphabet) - 1)];
    switch (rng() % 4) {
      case 0:
        if (!s.empty()) s[at] = c;
        break;
      case 1: s.insert(s.begin() + static_cast<ptrdiff_t>(at), c); break;
      case 2:
        if (!s.empty()) s.erase(at, 1);
        break;
      default: {
        const size_t len = std::min<size_t>(rng() % 12, s.size() - at);
        s.insert(at, s.substr(at, len));
      }
    }
  }
  return s;
}

TEST(GbnfMutation, NeverCrashesAndMasksAgree) {
  std::vector<std::string> tokens;
  for (int b = 1; b < 128; ++b) tokens.emplace_back(1, static_cast<char>(b));
  for (const char* t :
       {"\xCE", "\xB1", "\xCE\xB1", "\xE2\x82\xAC", "ab", "xy", "x(", ")=", "12", "\"a", "\":", "root"}) {
    tokens.emplace_back(t);
  }
  tokens.emplace_back("");
  auto vocab = test::make_vocab(tokens, {static_cast<int32_t>(tokens.size()) - 1});
  Limits limits;
  limits.max_states = 20'000;
  limits.max_repeat = 64;
  std::mt19937 rng(7);
  int parsed = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    const std::string text = mutate(kSeeds[iter % 3], rng);
    auto g = parse_gbnf(text, limits);
    if (!g.ok()) {
      EXPECT_FALSE(g.status().message().empty());
      continue;
    }
    ++parsed;
    auto cg = compile(*g, vocab);
    ASSERT_TRUE(cg.ok()) << cg.status().message();
    Matcher m(*cg);
    for (int step = 0; step < 6 && !m.done(); ++step) {
      SCOPED_TRACE(text);
      const auto ok = test::checked_mask(m, vocab->n_vocab());
      if (ok.empty() || HasFailure()) break;
      ASSERT_TRUE(m.accept(ok[rng() % ok.size()]));
    }
    if (HasFailure()) return;
  }
  EXPECT_GT(parsed, 1000) << "the mutations should keep many grammars valid";
}

}  // namespace
}  // namespace kiln::grammar
