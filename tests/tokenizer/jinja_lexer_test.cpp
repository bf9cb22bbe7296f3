// The lexer: whitespace control (trim_blocks, lstrip_blocks, `-`, `+`), literals, raw blocks, positions.
#include <gtest/gtest.h>

#include "tokenizer/jinja/ast.h"

namespace kiln::jinja {
namespace {

std::vector<Token> lex_ok(const std::string& src) {
  auto r = lex(src);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : std::vector<Token>{};
}

std::string texts(const std::vector<Token>& toks) {
  std::string out;
  for (const auto& t : toks) {
    if (t.type == Tok::text) out += "[" + t.text + "]";
  }
  return out;
}

TEST(JinjaLexer, TrimBlocksDropsOneNewlineAfterABlockTag) {
  EXPECT_EQ(texts(lex_ok("{% if x %}\n\nA{% endif %}\n")), "[\nA]");
  // A variable tag keeps its newline.
  EXPECT_EQ(texts(lex_ok("{{ x }}\nA")), "[\nA]");
}

TEST(JinjaLexer, LstripBlocksStripsIndentBeforeBlockTagsOnly) {
  EXPECT_EQ(texts(lex_ok("A\n    {% if x %}B")), "[A\n][B]");
  EXPECT_EQ(texts(lex_ok("A\n    {{ x }}")), "[A\n    ]");
  EXPECT_EQ(texts(lex_ok("A  {% if x %}")), "[A  ]");       // not at line start
  EXPECT_EQ(texts(lex_ok("A\n  {%+ if x %}")), "[A\n  ]");  // `+` disables lstrip
}

TEST(JinjaLexer, DashStripsAllWhitespaceOnThatSide) {
  EXPECT_EQ(texts(lex_ok("A \n\t {{- x -}} \n B")), "[A][B]");
  EXPECT_EQ(texts(lex_ok("A\n{#- comment -#}\n B")), "[A][B]");
}

TEST(JinjaLexer, OneTrailingNewlineIsDroppedAndCrlfNormalised) {
  EXPECT_EQ(texts(lex_ok("A\r\nB\n\n")), "[A\nB\n]");
}

TEST(JinjaLexer, StringEscapesDecodeLikePython) {
  auto toks = lex_ok(R"({{ 'a\n\t\'b\\ \u00e9 \x41 \q' ~ "dq\"" }})");
  ASSERT_GE(toks.size(), 5u);
  EXPECT_EQ(toks[1].type, Tok::string);
  EXPECT_EQ(toks[1].text, "a\n\t'b\\ \xC3\xA9 A \\q");
  EXPECT_EQ(toks[3].text, "dq\"");
}

TEST(JinjaLexer, NumbersAndOperators) {
  auto toks = lex_ok("{{ 1_000 + 2.5e3 // 3 ** 2 }}");
  ASSERT_EQ(toks.size(), 10u);  // {{ 1000 + 2500.0 // 3 ** 2 }} eof
  EXPECT_EQ(toks[1].type, Tok::integer);
  EXPECT_EQ(toks[1].ival, 1000);
  EXPECT_EQ(toks[3].type, Tok::floating);
  EXPECT_DOUBLE_EQ(toks[3].fval, 2500.0);
  EXPECT_EQ(toks[4].text, "//");
  EXPECT_EQ(toks[6].text, "**");
}

TEST(JinjaLexer, RawBlockIsText) {
  EXPECT_EQ(texts(lex_ok("{% raw %}{{ x }}{% if %}{% endraw %}")), "[{{ x }}{% if %}]");
}

TEST(JinjaLexer, BracesInsideTagsDoNotCloseIt) {
  auto toks = lex_ok("{{ {'a': {'b': 1}} }}");
  EXPECT_EQ(toks.back().type, Tok::eof);
  EXPECT_EQ(toks[toks.size() - 2].type, Tok::var_end);
}

TEST(JinjaLexer, ErrorsNameLineAndColumn) {
  auto r = lex("line1\n  {{ 'unterminated }}");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("line 2, column 6"), std::string::npos) << r.status().message();
  auto r2 = lex("ok\n{{ x $ y }}");
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find("line 2, column 6"), std::string::npos) << r2.status().message();
  EXPECT_FALSE(lex("{% if x").ok());
  EXPECT_FALSE(lex("{# never closed").ok());
  EXPECT_FALSE(lex("{% raw %}no end").ok());
  EXPECT_FALSE(lex("{{ 99999999999999999999 }}").ok());
}

}  // namespace
}  // namespace kiln::jinja
