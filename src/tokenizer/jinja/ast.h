// The Jinja syntax tree and the lexer's tokens. Every node carries its 1-based source line and column.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "tokenizer/jinja/value.h"

namespace kiln::jinja {

enum class Tok { text, block_begin, block_end, var_begin, var_end, name, string, integer, floating, op, eof };

struct Token {
  Tok type = Tok::eof;
  std::string text;  // text data, name, decoded string literal, or operator spelling
  int64_t ival = 0;
  double fval = 0;
  int line = 1, col = 1;
};

// The template source as tokens, with HF's settings applied: trim_blocks, lstrip_blocks, `-` whitespace
// control, comments dropped, raw blocks turned into text, one trailing newline removed.
Result<std::vector<Token>> lex(const std::string& source);

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprType {
  literal,  // value
  name,     // name
  list,     // kids = items
  tuple,    // kids = items
  dict,     // kids = key, value, key, value...
  attr,     // kids[0].name
  item,     // kids[0][kids[1]]
  slice,    // kids[0][kids[1]:kids[2]:kids[3]] (null kids where omitted)
  call,     // kids[0](kids[1..]); arg_names[k] names kid k+1 ("" = positional)
  filter,   // kids[0] | name(kids[1..]); kids[0] null inside a filter block
  test,     // kids[0] is [not] name(kids[1..])
  unary,    // op kids[0]: "-", "+", "not"
  binary,   // kids[0] op kids[1]: + - * / // % ** ~ and or
  compare,  // kids[0] ops[0] kids[1] ops[1] kids[2]...: == != < <= > >= in notin
  cond,     // kids[0] if kids[1] else kids[2] (kids[2] may be null)
};

struct Expr {
  ExprType type = ExprType::literal;
  int line = 0, col = 0;
  Value value;       // literal
  std::string name;  // name, attribute, filter, test, or the operator
  std::vector<ExprPtr> kids;
  std::vector<std::string> arg_names;  // call/filter/test: one per argument kid
  std::vector<std::string> ops;        // compare
  bool negated = false;                // test: `is not`
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class StmtType {
  text,
  output,
  if_,
  for_,
  set,
  set_block,
  macro,
  call_block,
  filter_block,
  break_,
  continue_
};

struct Stmt {
  StmtType type = StmtType::text;
  int line = 0, col = 0;
  std::string text;                  // text; set/set_block/macro: the name; set on ns: the attribute
  std::vector<std::string> targets;  // for/set: names bound (several = tuple unpacking)
  std::string ns_name;               // set ns.attr = ...: "ns"
  ExprPtr expr;                // output, set value, for iterable, call block's call, filter block's filter
  ExprPtr cond;                // for's inline `if`
  std::vector<ExprPtr> conds;  // if/elif conditions, one per branch in `branches`
  std::vector<Body> branches;  // if: one body per cond, then else (if any)
  Body body, else_body;        // for, macro, call/filter/set blocks
  std::vector<std::string> params;  // macro/call block parameters
  std::vector<ExprPtr> defaults;    // one per param, null if none
};

struct Template {
  Body body;
};

// Parse errors name the line and column.
Result<std::shared_ptr<Template>> parse_template(const std::string& source);

}  // namespace kiln::jinja
