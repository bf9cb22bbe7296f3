// parse_gbnf: the syntax llama.cpp's grammars use, errors with their line and column, the Limits.
#include <gtest/gtest.h>

#include "grammar/grammar.h"
#include "test_util.h"

namespace kiln::grammar {
namespace {

using test::matches;

Status parse_error(const std::string& text, const Limits& limits = {}) {
  auto g = parse_gbnf(text, limits);
  EXPECT_FALSE(g.ok()) << text;
  return g.ok() ? Status() : g.status();
}

void expect_error(const std::string& text, StatusCode code, const std::string& part,
                  const Limits& limits = {}) {
  Status s = parse_error(text, limits);
  EXPECT_EQ(s.code(), code) << s.to_string();
  EXPECT_NE(s.message().find(part), std::string::npos) << "'" << part << "' not in: " << s.message();
}

TEST(GbnfParse, MultiLineRulesAndComments) {
  const char* g = R"gbnf(
# a comment line
root ::= greeting   # trailing comment
  | farewell
greeting ::= (
    "hello" |
    "hi"   # inside a group
  ) " " name
farewell ::=
  "bye" " " name
name ::= [A-Z] [a-z]*
)gbnf";
  EXPECT_TRUE(matches(g, "hello Ada"));
  EXPECT_TRUE(matches(g, "hi Bo"));
  EXPECT_TRUE(matches(g, "bye Cy"));
  EXPECT_FALSE(matches(g, "hey Dee"));
  EXPECT_TRUE(matches("root ::= \"a\"\r\nb ::= \"c\"\r\n", "a"));  // CRLF
  EXPECT_TRUE(matches("root ::= ws | \"x\"\nws ::= | \" \"", " "));
}

TEST(GbnfParse, EscapesAndClasses) {
  EXPECT_TRUE(matches(R"gbnf(root ::= [\]\[\-\\] [\x41-\x43] [^\n])gbnf", "]Bz"));
  EXPECT_TRUE(matches(R"gbnf(root ::= [a-] "x")gbnf", "-x"));  // '-' before ']' is a character
  EXPECT_TRUE(matches(R"gbnf(root ::= "\/")gbnf", "/"));
  EXPECT_TRUE(matches("root ::= \"é\" [à-ä]", "\xC3\xA9\xC3\xA2"));
  EXPECT_FALSE(matches(R"gbnf(root ::= [^\x00-\x7F])gbnf", "a"));  // non-ASCII only
  EXPECT_TRUE(matches(R"gbnf(root ::= [^\x00-\x7F])gbnf", "\xE2\x82\xAC"));
}

TEST(GbnfParse, SyntaxErrorsNameLineAndColumn) {
  expect_error("root ::= \"a\"\nbad rule ::= \"b\"", StatusCode::invalid_argument, "line 2, column 5");
  expect_error("root ::= \"a\" )", StatusCode::invalid_argument, "line 1, column 14");
  expect_error("root := \"a\"", StatusCode::invalid_argument, "expected '::='");
  expect_error("root ::= \"abc", StatusCode::invalid_argument, "unterminated string");
  expect_error("root ::= [abc", StatusCode::invalid_argument, "unterminated character class");
  expect_error("root ::= \"\\q\"", StatusCode::invalid_argument, "unknown escape");
  expect_error("root ::= \"\\x4\"", StatusCode::invalid_argument, "hex digits");
  expect_error("root ::= \"\\uD800\"", StatusCode::invalid_argument, "not a Unicode scalar value");
  expect_error("root ::= [z-a]", StatusCode::invalid_argument, "reversed");
  expect_error("root ::= []", StatusCode::invalid_argument, "empty character class");
  expect_error("root ::= (\"a\" | \"b\"", StatusCode::invalid_argument, "expected ')'");
  expect_error("root ::= \"a\"{3,2}", StatusCode::invalid_argument, "below the minimum");
  expect_error("root ::= \"a\"{x}", StatusCode::invalid_argument, "repetition count");
  expect_error("root ::= <[12]>", StatusCode::invalid_argument, "token references");
  expect_error("root ::= \"\xC3\"", StatusCode::invalid_argument, "invalid UTF-8");
  expect_error("root ::= \"a\"\nroot ::= \"b\"", StatusCode::invalid_argument, "defined twice");
}

TEST(GbnfParse, UndefinedRuleMissingRootLeftRecursion) {
  expect_error("root ::= \"a\" thing", StatusCode::invalid_argument,
               "line 1, column 14: rule 'thing' is used but never defined");
  expect_error("start ::= \"a\"", StatusCode::invalid_argument, "no 'root' rule");
  expect_error("", StatusCode::invalid_argument, "no 'root' rule");
  expect_error("root ::= root \"a\" | \"b\"", StatusCode::invalid_argument,
               "left recursion: root calls itself before consuming any text (root -> root)");
  expect_error("root ::= a\na ::= b \"x\"\nb ::= a | \"y\"", StatusCode::invalid_argument, "a -> b -> a");
  // Through a rule that may match nothing.
  expect_error("root ::= opt root \"a\" | \"b\"\nopt ::= \"z\"?", StatusCode::invalid_argument,
               "left recursion");
  expect_error("root ::= \"a\" root", StatusCode::invalid_argument, "matches no finite text");
  // Right recursion is fine.
  EXPECT_TRUE(matches("root ::= \"a\" root | \"b\"", "aaab"));
}

TEST(GbnfParse, LimitsAreResourceExhausted) {
  Limits l;
  l.max_text_bytes = 16;
  expect_error("root ::= \"aaaaaaaaaaaaaaaaaaaaaaaaaa\"", StatusCode::resource_exhausted, "max_text_bytes",
               l);
  l = Limits{};
  l.max_repeat = 100;
  expect_error("root ::= \"a\"{101}", StatusCode::resource_exhausted, "max_repeat", l);
  expect_error("root ::= \"a\"{2,99999999999999999999}", StatusCode::resource_exhausted, "max_repeat", l);
  l = Limits{};
  l.max_rules = 3;
  expect_error("root ::= a b c\na ::= \"a\"\nb ::= \"b\"\nc ::= \"c\"", StatusCode::resource_exhausted,
               "max_rules", l);
  l = Limits{};
  l.max_states = 500;
  expect_error("root ::= (\"ab\" [0-9]){1000}", StatusCode::resource_exhausted, "max_states", l);
  // Nested repetitions multiply.
  expect_error("root ::= ((((\"a\"{100}){100}){100}){100})", StatusCode::resource_exhausted, "max_states");
  // Deep nesting fails cleanly instead of exhausting the C++ stack.
  expect_error("root ::= " + std::string(100000, '(') + "\"a\"" + std::string(100000, ')'),
               StatusCode::resource_exhausted, "nested deeper");
  expect_error("root ::= \"a\"" + std::string(100000, '*'), StatusCode::resource_exhausted, "nested deeper");
}

}  // namespace
}  // namespace kiln::grammar
