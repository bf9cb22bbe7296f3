// Regular expressions to GBNF (regex.h): the language of each construct through a matcher over byte tokens,
// and the errors of bad or unsupported patterns.
#include "grammar/regex.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "byte_matcher.h"

namespace kiln::grammar {
namespace {

using test::ByteMatcher;

struct Case {
  const char* pattern;
  std::vector<std::string> accepted;
  std::vector<std::string> rejected;
};

void check(const Case& c) {
  SCOPED_TRACE(c.pattern);
  auto gbnf = regex_to_gbnf(c.pattern);
  ASSERT_TRUE(gbnf.ok()) << gbnf.status().to_string();
  ByteMatcher m(*gbnf);
  for (const auto& s : c.accepted) EXPECT_TRUE(m.accepts(s)) << "should accept '" << s << "'\n" << *gbnf;
  for (const auto& s : c.rejected) EXPECT_FALSE(m.accepts(s)) << "should reject '" << s << "'\n" << *gbnf;
}

TEST(RegexToGbnf, LiteralsAndAnchors) {
  check({"abc", {"abc"}, {"", "ab", "abcd", "xabc"}});
  check({"^abc$", {"abc"}, {"ab", "abcc"}});
  check({"^a|b$", {"a", "b"}, {"ab", ""}});
  check({"", {""}, {"a"}});
  check({"h\xC3\xA9!", {"h\xC3\xA9!"}, {"he!"}});  // hé!
  check({R"(a\.b\*\(\)\[\]\{\}\|\?\+\^\$\\\/)", {R"(a.b*()[]{}|?+^$\/)"}, {"axb"}});
  check({R"(\t\n\r\f\v\0)", {std::string("\t\n\r\f\v\0", 6)}, {"tnrfv0"}});
  check({R"(\x41\u00e9\u{1F600}\cJ)", {"A\xC3\xA9\xF0\x9F\x98\x80\n"}, {"A"}});
  check({R"(\uD83D\uDE00)", {"\xF0\x9F\x98\x80"}, {"?"}});  // a surrogate pair: one code point
  check({R"([\u0000-\uFFFF])", {"a", "\xC3\xA9", "\xEF\xBF\xBF"}, {"\xF0\x9F\x98\x80"}});
  check({"a{,2}", {"a{,2}"}, {"aa"}});  // not a quantifier: literal braces
  check({"a}", {"a}"}, {"a"}});
}

TEST(RegexToGbnf, ClassesAndDot) {
  check({"[a-c]+", {"a", "cab"}, {"", "d", "abd"}});
  check({"[^0-9]", {"a", "\xC3\xA9", " "}, {"5", "ab"}});
  check({R"([\]\-^x])", {"]", "-", "^", "x"}, {"\\", "a"}});
  check({"[-a]", {"-", "a"}, {"b"}});
  check({"[a-]", {"-", "a"}, {"b"}});
  check({R"([\d.])", {"7", "."}, {"a"}});
  check({R"([\b])", {"\b"}, {"b"}});
  check({"[^]", {"x", "\n"}, {""}});
  check({"[\xCE\xB1-\xCF\x89]+", {"\xCE\xBB\xCE\xBC"}, {"a"}});  // [α-ω]+
  check({"a.c",
         {"abc",
          "a\xC3\xA9"
          "c",
          "a c"},
         {"a\nc", "a\rc", "ac"}});
  check({R"(\d{3}-\d{4})", {"555-1234"}, {"55-1234", "555-12345", "abc-defg"}});
  check({R"(\w+)", {"a_Z9"}, {"a-b", ""}});
  check({R"(\W)", {"-"}, {"a", "_"}});
  check({R"(\s\S)", {" a", "\ta", "\xC2\xA0x"}, {"a ", "  "}});
  check({R"(\D)", {"x"}, {"1"}});
}

TEST(RegexToGbnf, AlternationGroupsRepetition) {
  check({"cat|dog|bird", {"cat", "dog", "bird"}, {"ca", "catdog"}});
  check({"(ab)+", {"ab", "abab"}, {"", "aba"}});
  check({"(?:x|y){2,3}", {"xy", "yyx"}, {"x", "xyxy"}});
  check({"(?<year>\\d{2})-(?P<m>\\d)", {"24-5"}, {"2-5"}});
  check({"a(b|)c", {"ac", "abc"}, {"abbc"}});
  check({"a+?b*?c??", {"a", "aabbc"}, {"b", "acc"}});
  check({"x{3}", {"xxx"}, {"xx", "xxxx"}});
  check({"x{2,}", {"xx", "xxxxx"}, {"x"}});
  check({"x{0}y", {"y"}, {"xy"}});
  check({"(a|b(c|d)*)?e", {"e", "ae", "bcdce"}, {"abe"}});
  check({"((a))", {"a"}, {"aa"}});
  check({"(a*)*b", {"b", "aab"}, {"a"}});
}

void check_error(const char* pattern, StatusCode code, const std::string& needle) {
  SCOPED_TRACE(pattern);
  auto r = regex_to_gbnf(pattern);
  ASSERT_FALSE(r.ok()) << *r;
  EXPECT_EQ(r.status().code(), code) << r.status().to_string();
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
}

TEST(RegexToGbnf, SyntaxErrorsGiveTheOffset) {
  check_error("(ab", StatusCode::invalid_argument, "'(' without its ')' at offset 0");
  check_error("ab)", StatusCode::invalid_argument, "')' without its '(' at offset 2");
  check_error("*a", StatusCode::invalid_argument, "nothing to repeat at offset 0");
  check_error("a**", StatusCode::invalid_argument, "nothing to repeat at offset 2");
  check_error("a|{2}", StatusCode::invalid_argument, "nothing to repeat at offset 2");
  check_error("[ab", StatusCode::invalid_argument, "'[' without its ']' at offset 0");
  check_error("[]", StatusCode::invalid_argument, "empty character class");
  check_error("x[z-a]", StatusCode::invalid_argument, "range out of order at offset 2");
  check_error("a{3,2}", StatusCode::invalid_argument, "n < m at offset 1");
  check_error("ab\\", StatusCode::invalid_argument, "trailing backslash at offset 2");
  check_error("\\q", StatusCode::invalid_argument, "unknown escape at offset 0");
  check_error("\\x4", StatusCode::invalid_argument, "\\x without two hex digits");
  check_error("[\\d-z]", StatusCode::invalid_argument, "class escape as a range's end");
  check_error("a\xFF", StatusCode::invalid_argument, "invalid UTF-8 at byte offset 1");
  check_error("a\\uD800", StatusCode::invalid_argument, "surrogates only at offset 1");
  check_error("[\\uD800-\\uDFFF]", StatusCode::invalid_argument, "surrogates only at offset 0");
}

TEST(RegexToGbnf, UnsupportedConstructsAreNamed) {
  check_error("a(?=b)", StatusCode::unimplemented, "lookaround at offset 1");
  check_error("(?!b)", StatusCode::unimplemented, "lookaround");
  check_error("(?<=b)a", StatusCode::unimplemented, "lookaround");
  check_error("(a)\\1", StatusCode::unimplemented, "backreference at offset 3");
  check_error("(?<n>a)\\k<n>", StatusCode::unimplemented, "backreference");
  check_error("(?P<n>a)(?P=n)", StatusCode::unimplemented, "backreference");
  check_error("\\bword", StatusCode::unimplemented, "word boundary \\b at offset 0");
  check_error("a^b", StatusCode::unimplemented, "anchor ^ inside the pattern at offset 1");
  check_error("a$b", StatusCode::unimplemented, "anchor $ inside the pattern at offset 1");
  check_error("(^a)", StatusCode::unimplemented, "anchor ^");
  check_error("(?i)a", StatusCode::unimplemented, "inline flag");
  check_error("\\p{L}", StatusCode::unimplemented, "Unicode property");
  check_error("\\Aa", StatusCode::unimplemented, "anchor escape");
}

TEST(RegexToGbnf, SizeBounds) {
  check_error("a{10001}", StatusCode::resource_exhausted, "bound 10000");
  check_error("a{99999999999999999999}", StatusCode::resource_exhausted, "bound 10000");
  check_error("(a{1000}){1000}", StatusCode::resource_exhausted, "more than 200000");
  check_error(std::string(70'000, 'a').c_str(), StatusCode::resource_exhausted, "bytes");
  auto deep = regex_to_gbnf(std::string(200, '(') + "a" + std::string(200, ')'));
  ASSERT_FALSE(deep.ok());
  EXPECT_EQ(deep.status().code(), StatusCode::resource_exhausted);
  check({"a{10000}", {std::string(10'000, 'a')}, {std::string(9'999, 'a')}});
}

TEST(RegexToGbnf, RuleNames) {
  auto r = regex_to_gbnf_rules("[0-9]+", "my-number");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->rfind("my-number ::= ", 0), 0u) << *r;
  ByteMatcher m("root ::= \"#\" my-number\n" + *r);
  EXPECT_TRUE(m.accepts("#42"));
  EXPECT_FALSE(m.accepts("42"));
  EXPECT_EQ(regex_to_gbnf_rules("a", "bad name").status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(regex_to_gbnf_rules("a", "").status().code(), StatusCode::invalid_argument);
}

}  // namespace
}  // namespace kiln::grammar
