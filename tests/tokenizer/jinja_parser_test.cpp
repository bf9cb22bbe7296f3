// The parser: precedence, statement structure, and errors that name line and column.
#include <gtest/gtest.h>

#include "tokenizer/jinja/ast.h"

namespace kiln::jinja {
namespace {

Status parse_status(const std::string& src) {
  auto r = parse_template(src);
  return r.ok() ? Status() : r.status();
}

const Expr& output_expr(const Template& t) {
  EXPECT_EQ(t.body.size(), 1u);
  EXPECT_EQ(t.body[0]->type, StmtType::output);
  return *t.body[0]->expr;
}

TEST(JinjaParser, ArithmeticPrecedence) {
  auto t = parse_template("{{ 1 + 2 * 3 ** 2 }}");
  ASSERT_TRUE(t.ok());
  const Expr& e = output_expr(**t);
  ASSERT_EQ(e.type, ExprType::binary);
  EXPECT_EQ(e.name, "+");
  EXPECT_EQ(e.kids[1]->name, "*");
  EXPECT_EQ(e.kids[1]->kids[1]->name, "**");
}

TEST(JinjaParser, FiltersAndTestsBindTighterThanBinaryOperators) {
  auto t = parse_template("{{ a + b | length is defined }}");
  ASSERT_TRUE(t.ok());
  const Expr& e = output_expr(**t);
  ASSERT_EQ(e.type, ExprType::binary);
  EXPECT_EQ(e.kids[1]->type, ExprType::test);
  EXPECT_EQ(e.kids[1]->kids[0]->type, ExprType::filter);
}

TEST(JinjaParser, NotInAndChainedComparisons) {
  auto t = parse_template("{{ a not in b < c }}");
  ASSERT_TRUE(t.ok());
  const Expr& e = output_expr(**t);
  ASSERT_EQ(e.type, ExprType::compare);
  EXPECT_EQ(e.ops, (std::vector<std::string>{"notin", "<"}));
}

TEST(JinjaParser, IfElifElseBranches) {
  auto t = parse_template("{% if a %}1{% elif b %}2{% elif c %}3{% else %}4{% endif %}");
  ASSERT_TRUE(t.ok());
  const Stmt& s = *(*t)->body[0];
  EXPECT_EQ(s.conds.size(), 3u);
  EXPECT_EQ(s.branches.size(), 4u);
}

TEST(JinjaParser, ForWithUnpackingFilterAndElse) {
  auto t = parse_template("{% for k, v in d.items() if v %}x{% else %}y{% endfor %}");
  ASSERT_TRUE(t.ok());
  const Stmt& s = *(*t)->body[0];
  EXPECT_EQ(s.targets, (std::vector<std::string>{"k", "v"}));
  EXPECT_TRUE(s.cond);
  EXPECT_EQ(s.else_body.size(), 1u);
}

TEST(JinjaParser, SliceForms) {
  for (const char* src : {"{{ a[::-1] }}", "{{ a[1:] }}", "{{ a[:2] }}", "{{ a[1:5:2] }}"}) {
    auto t = parse_template(src);
    ASSERT_TRUE(t.ok()) << src;
    EXPECT_EQ(output_expr(**t).type, ExprType::slice) << src;
  }
}

TEST(JinjaParser, ErrorsNameLineAndColumn) {
  Status s = parse_status("ok\n{% if x %}\n{% endfor %}");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("line 3"), std::string::npos) << s.message();

  s = parse_status("{{ (1 + }}");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("line 1, column 9"), std::string::npos) << s.message();

  s = parse_status("{% if x %}never closed");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("endif"), std::string::npos) << s.message();
}

TEST(JinjaParser, UnsupportedStatementsAreNamed) {
  for (const char* src : {"{% include 'x' %}", "{% extends 'x' %}", "{% import 'x' as y %}", "{% do x %}"}) {
    Status s = parse_status(src);
    ASSERT_FALSE(s.ok()) << src;
    EXPECT_EQ(s.code(), StatusCode::unimplemented) << src;
    EXPECT_NE(s.message().find("line 1, column 4"), std::string::npos) << s.message();
  }
  Status s = parse_status("{% for x in y recursive %}{% endfor %}");
  EXPECT_EQ(s.code(), StatusCode::unimplemented);
}

TEST(JinjaParser, DeepNestingIsRefusedNotACrash) {
  std::string deep = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  Status s = parse_status(deep);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("nested deeper"), std::string::npos);
  std::string ifs;
  for (int k = 0; k < 1000; ++k) ifs += "{% if x %}";
  EXPECT_FALSE(parse_status(ifs).ok());
  std::string nots = "{{ " + std::string(0, ' ');
  for (int k = 0; k < 5000; ++k) nots += "not ";
  EXPECT_FALSE(parse_status(nots + "x }}").ok());
  // Long chains build deep trees too: refused at parse time, not a stack overflow later.
  std::string attrs = "{{ a", adds = "{{ 1", filters = "{{ 'x'";
  for (int k = 0; k < 100000; ++k) {
    attrs += ".b";
    adds += " + 1";
    filters += " | trim";
  }
  for (const std::string& src : {attrs, adds, filters}) {
    Status st = parse_status(src + " }}");
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("nested deeper"), std::string::npos) << st.message();
  }
  EXPECT_TRUE(parse_status("{{ a.b.c | trim | upper + 1 + 2 ~ x[0][1:] }}").ok());
}

}  // namespace
}  // namespace kiln::jinja
