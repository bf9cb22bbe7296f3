// The evaluator through the ChatTemplate API: Python semantics of values, operators, filters, tests, scoping.
#include <gtest/gtest.h>

#include "tokenizer/chat_template.h"

namespace kiln {
namespace {

Result<std::string> render(const std::string& src,
                           nlohmann::ordered_json ctx = nlohmann::ordered_json::object()) {
  KILN_ASSIGN_OR_RETURN(auto t, ChatTemplate::parse(src));
  ChatTemplateInputs in;
  in.extra_context = std::move(ctx);
  return t.render(in);
}

std::string ok(const std::string& src, nlohmann::ordered_json ctx = nlohmann::ordered_json::object()) {
  auto r = render(src, std::move(ctx));
  EXPECT_TRUE(r.ok()) << src << ": " << r.status().to_string();
  return r.ok() ? *r : "<error>";
}

TEST(JinjaEval, PrintsValuesLikePython) {
  EXPECT_EQ(ok("{{ 1.0 }} {{ 2.50 }} {{ 1e16 }} {{ 1e-5 }} {{ 10 / 4 }} {{ 4 / 2 }}"),
            "1.0 2.5 1e+16 1e-05 2.5 2.0");
  EXPECT_EQ(ok("{{ none }} {{ true }} {{ false }} {{ undefined_name }}|"), "None True False |");
  EXPECT_EQ(ok("{{ ['a', 1, none, 'it\\'s'] }}"), "['a', 1, None, \"it's\"]");
  EXPECT_EQ(ok("{{ {'a': [1.5], 'b': {}} }}"), "{'a': [1.5], 'b': {}}");
  EXPECT_EQ(ok("{{ (1,) }} {{ (1, 2) }}"), "(1,) (1, 2)");
}

TEST(JinjaEval, IntegerAndFloatArithmetic) {
  EXPECT_EQ(
      ok("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 62 }} {{ 2 ** -1 }} {{ 7.5 // 2 }}"),
      "3 -4 2 -2 4611686018427387904 0.5 3.0");
  EXPECT_EQ(ok("{{ 1 + true }} {{ 'ab' * 2 }} {{ 2 * [0] }} {{ [1] + [2] }}"), "2 abab [0, 0] [1, 2]");
  auto r = render("{{ 1 // 0 }}");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("division"), std::string::npos);
  EXPECT_EQ(render("{{ 2 ** 64 }}").status().code(), StatusCode::out_of_range);
  EXPECT_FALSE(render("{{ 'a' + 1 }}").ok());
}

TEST(JinjaEval, UndefinedVersusNone) {
  EXPECT_EQ(ok("{{ x is defined }} {{ x is none }} {{ n is defined }} {{ n is none }}", {{"n", nullptr}}),
            "False False True True");
  EXPECT_EQ(ok("{{ d.missing is defined }} {{ d['missing'] is undefined }} {{ l[10] is defined }}",
               {{"d", {{"a", 1}}}, {"l", {1}}}),
            "False True False");
  EXPECT_EQ(ok("{{ x | default('dflt') }} {{ n | default('dflt') }} {{ n | default('dflt', true) }}",
               {{"n", nullptr}}),
            "dflt None dflt");
  auto r = render("{{ x.attr }}");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'x' is undefined"), std::string::npos) << r.status().message();
  EXPECT_FALSE(render("{{ x + 1 }}").ok());
  EXPECT_EQ(ok("{% for i in x %}no{% endfor %}{{ x | length }}"), "0");
}

TEST(JinjaEval, Truthiness) {
  EXPECT_EQ(ok("{% for v in [0, 1, '', 'a', [], [0], {}, none, 0.0] %}{{ 'T' if v else 'F' }}{% endfor %}"),
            "FTFTFTFFF");
  EXPECT_EQ(ok("{{ 0 or 'b' }} {{ 'a' and 0 }} {{ not [] }}"), "b 0 True");
}

TEST(JinjaEval, LoopVariables) {
  EXPECT_EQ(ok("{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
               "{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }}"
               "{{ loop.cycle('x', 'y') }};{% endfor %}"),
            "1032TrueFalse3bx;2121FalseFalse3acy;3210FalseTrue3bx;");
  EXPECT_EQ(ok("{% for x in range(10) if x is odd %}{% if x > 6 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "135");
  EXPECT_EQ(ok("{% for x in [1, 2, 3] %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% endfor %}"), "13");
  EXPECT_EQ(ok("{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}", {{"d", {{"z", 1}, {"a", 2}}}}),
            "z=1,a=2,");
}

TEST(JinjaEval, ScopingAndNamespaces) {
  // A set inside a loop does not leak; a namespace attribute does.
  EXPECT_EQ(ok("{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{% endfor %}{{ x }}"), "1");
  EXPECT_EQ(
      ok("{% set ns = namespace(x=1) %}{% for i in [1, 2] %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}"),
      "4");
  auto r = render("{% set x = 1 %}{% set x.y = 2 %}");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not a namespace"), std::string::npos);
}

TEST(JinjaEval, MacrosAndCallBlocks) {
  EXPECT_EQ(
      ok("{% macro m(a, b='B') %}[{{ a }}{{ b }}]{% endmacro %}{{ m(1) }}{{ m(1, 2) }}{{ m(b=3, a=4) }}"),
      "[1B][12][43]");
  EXPECT_EQ(ok("{% macro w() %}<{{ caller() }}>{% endmacro %}{% call w() %}in{% endcall %}"), "<in>");
  EXPECT_FALSE(render("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}").ok());
  EXPECT_FALSE(render("{% macro m(a) %}{% endmacro %}{{ m(c=1) }}").ok());
}

TEST(JinjaEval, StringMethodsAndFilters) {
  EXPECT_EQ(
      ok("{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ 'a,b'.split(',') }}|{{ 'a b  c'.split() }}"),
      "a b|a|['a', 'b']|['a', 'b', 'c']");
  EXPECT_EQ(ok("{{ 'héllo'[1] }}{{ 'héllo'[::-1] }}{{ 'héllo' | length }}"), "éolléh5");
  EXPECT_EQ(ok("{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}{{ 'aXa'.replace('a', 'b') }}"),
            "TrueTruebXb");
  EXPECT_EQ(ok("{{ [3, 1, 2] | sort | join(',') }} {{ ['b', 'A'] | sort }} {{ [1, 2, 2] | unique | list }}"),
            "1,2,3 ['A', 'b'] [1, 2]");
  EXPECT_EQ(ok("{{ l | selectattr('k', 'equalto', 1) | map(attribute='v') | list }}",
               {{"l", {{{"k", 1}, {"v", "a"}}, {{"k", 2}, {"v", "b"}}}}}),
            "['a']");
  EXPECT_EQ(ok("{{ d | tojson }}|{{ d | tojson(indent=2) }}", {{"d", {{"b", "é\n"}, {"a", {1, 2.5}}}}}),
            "{\"b\": \"é\\n\", \"a\": [1, 2.5]}|{\n  \"b\": \"é\\n\",\n  \"a\": [\n    1,\n    2.5\n  ]\n}");
  EXPECT_EQ(ok("{{ 'a\nb' | indent(2, true) }}"), "  a\n  b");
}

TEST(JinjaEval, ListMutationIsRefusedAsInTheImmutableSandbox) {
  auto r = render("{% set l = [] %}{{ l.append(1) }}");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("immutable sandbox"), std::string::npos);
}

TEST(JinjaEval, RaiseExceptionCarriesTheMessage) {
  auto r = render("\n{{ raise_exception('roles must alternate') }}");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(r.status().message().find("roles must alternate"), std::string::npos);
  EXPECT_NE(r.status().message().find("line 2"), std::string::npos);
}

TEST(JinjaEval, UnsupportedFiltersAndTestsAreNamedWithTheirPosition) {
  auto r = render("{{ x | wordwrap }}");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::unimplemented);
  EXPECT_NE(r.status().message().find("'wordwrap'"), std::string::npos);
  EXPECT_NE(r.status().message().find("line 1, column"), std::string::npos);
  r = render("{{ 1 is prime }}");
  EXPECT_EQ(r.status().code(), StatusCode::unimplemented);
  r = render("{{ 'a'.zfill(3) }}");
  EXPECT_EQ(r.status().code(), StatusCode::unimplemented);
  r = render("{{ '%s!' % 'x' }}");
  EXPECT_EQ(r.status().code(), StatusCode::unimplemented);
  EXPECT_EQ(render("{% include 'other' %}").status().code(), StatusCode::unimplemented);
}

}  // namespace
}  // namespace kiln
