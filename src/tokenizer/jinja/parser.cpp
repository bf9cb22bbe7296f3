// Tokens -> syntax tree. Precedence follows Jinja: or < and < not < comparisons < + - < ~ < * / // % < ** <
// unary minus < postfix (attribute, subscript, call, filter, test).
#include <set>

#include "tokenizer/jinja/ast.h"

namespace kiln::jinja {
namespace {

constexpr int kMaxNesting = 200;  // expression and block nesting: deeper templates are refused

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  Result<std::shared_ptr<Template>> run() {
    auto tmpl = std::make_shared<Template>();
    std::string end;
    KILN_TRY(parse_body(tmpl->body, {}, end));
    return tmpl;
  }

 private:
  const Token& cur() const { return t_[p_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  bool is_op(const char* op) const { return cur().type == Tok::op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::name && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    ++p_;
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    ++p_;
    return true;
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::text: return "text";
      case Tok::block_begin: return "'{%'";
      case Tok::block_end: return "'%}'";
      case Tok::var_begin: return "'{{'";
      case Tok::var_end: return "'}}'";
      case Tok::eof: return "end of template";
      case Tok::string: return "string literal";
      default: return "'" + t.text + "'";
    }
  }
  Status error(const Token& t, const std::string& msg) const {
    return invalid_argument("template line {}, column {}: {}", t.line, t.col, msg);
  }
  Status expect_op(const char* op) {
    if (!skip_op(op)) return error(cur(), std::string("expected '") + op + "', got " + describe(cur()));
    return {};
  }
  Result<std::string> expect_name() {
    if (cur().type != Tok::name) return error(cur(), "expected a name, got " + describe(cur()));
    return t_[p_++].text;
  }
  Status expect_block_end() {
    if (cur().type != Tok::block_end) return error(cur(), "expected '%}', got " + describe(cur()));
    ++p_;
    return {};
  }
  // Operator and postfix chains build trees as deep as they are long: each link counts as one level of
  // nesting until the chain ends, so no path through the tree is deeper than kMaxNesting (+ a few).
  struct ChainGuard {
    int& depth;
    int links = 0;
    ~ChainGuard() { depth -= links; }
  };
  Status check_chain(ChainGuard& chain) const {
    ++chain.links;
    if (++chain.depth > kMaxNesting)
      return error(cur(), "expression nested deeper than 200 (long operator or filter chain)");
    return {};
  }
  ExprPtr node(ExprType type, const Token& at) const {
    auto e = std::make_unique<Expr>();
    e->type = type;
    e->line = at.line;
    e->col = at.col;
    return e;
  }
  StmtPtr stmt(StmtType type, const Token& at) const {
    auto s = std::make_unique<Stmt>();
    s->type = type;
    s->line = at.line;
    s->col = at.col;
    return s;
  }

  // Statements until one of `ends` (a block keyword) is reached; its name goes to `end`, the tag stays open.
  Status parse_body(Body& body, const std::set<std::string>& ends, std::string& end) {
    if (++depth_ > kMaxNesting) return error(cur(), "blocks nested deeper than 200");
    for (;;) {
      const Token& t = cur();
      if (t.type == Tok::eof) {
        if (ends.empty()) break;
        std::string want;
        for (const auto& e : ends) want += (want.empty() ? "" : " or ") + ("'{% " + e + " %}'");
        return error(t, "unexpected end of template: expected " + want);
      }
      if (t.type == Tok::text) {
        auto s = stmt(StmtType::text, t);
        s->text = t.text;
        body.push_back(std::move(s));
        ++p_;
      } else if (t.type == Tok::var_begin) {
        ++p_;
        auto s = stmt(StmtType::output, t);
        KILN_ASSIGN_OR_RETURN(s->expr, parse_tuple_expr());
        if (cur().type != Tok::var_end) return error(cur(), "expected '}}', got " + describe(cur()));
        ++p_;
        body.push_back(std::move(s));
      } else if (t.type == Tok::block_begin) {
        const Token& kw = peek();
        if (kw.type == Tok::name && ends.count(kw.text)) {
          end = kw.text;
          p_ += 2;
          break;
        }
        ++p_;
        KILN_ASSIGN_OR_RETURN(auto s, parse_statement());
        if (s) body.push_back(std::move(s));
      } else {
        return error(t, "unexpected " + describe(t));
      }
    }
    --depth_;
    return {};
  }

  Result<StmtPtr> parse_statement() {
    const Token& kw = cur();
    if (kw.type != Tok::name) return error(kw, "expected a statement name, got " + describe(kw));
    const std::string& n = kw.text;
    ++p_;
    if (n == "if") return parse_if(kw);
    if (n == "for") return parse_for(kw);
    if (n == "set") return parse_set(kw);
    if (n == "macro") return parse_macro(kw);
    if (n == "call") return parse_call_block(kw);
    if (n == "filter") return parse_filter_block(kw);
    if (n == "break" || n == "continue") {
      KILN_TRY(expect_block_end());
      return stmt(n == "break" ? StmtType::break_ : StmtType::continue_, kw);
    }
    if (n.rfind("end", 0) == 0 || n == "elif" || n == "else") {
      return error(kw, "unexpected '{% " + n + " %}' (no open block it could close)");
    }
    if (n == "generation") {  // HF's AssistantTracker: renders its body unchanged
      KILN_TRY(expect_block_end());
      auto s = stmt(StmtType::if_, kw);
      auto yes = node(ExprType::literal, kw);
      yes->value = Value::boolean(true);
      s->conds.push_back(std::move(yes));
      s->branches.emplace_back();
      std::string end;
      KILN_TRY(parse_body(s->branches.back(), {"endgeneration"}, end));
      KILN_TRY(expect_block_end());
      return s;
    }
    return unimplemented("template line {}, column {}: the '{}' statement is not supported", kw.line, kw.col,
                         n);
  }

  Result<StmtPtr> parse_if(const Token& kw) {
    auto s = stmt(StmtType::if_, kw);
    KILN_ASSIGN_OR_RETURN(auto c, parse_expr());
    s->conds.push_back(std::move(c));
    KILN_TRY(expect_block_end());
    for (;;) {
      s->branches.emplace_back();
      std::string end;
      KILN_TRY(parse_body(s->branches.back(), {"elif", "else", "endif"}, end));
      if (end == "elif") {
        KILN_ASSIGN_OR_RETURN(auto c2, parse_expr());
        s->conds.push_back(std::move(c2));
        KILN_TRY(expect_block_end());
        continue;
      }
      KILN_TRY(expect_block_end());
      if (end == "endif") break;
      s->branches.emplace_back();
      KILN_TRY(parse_body(s->branches.back(), {"endif"}, end));
      KILN_TRY(expect_block_end());
      break;
    }
    return s;
  }

  Status parse_targets(std::vector<std::string>& targets) {
    bool paren = skip_op("(");
    do {
      KILN_ASSIGN_OR_RETURN(auto name, expect_name());
      targets.push_back(std::move(name));
    } while (skip_op(","));
    if (paren) KILN_TRY(expect_op(")"));
    return {};
  }

  Result<StmtPtr> parse_for(const Token& kw) {
    auto s = stmt(StmtType::for_, kw);
    KILN_TRY(parse_targets(s->targets));
    if (!skip_name("in")) return error(cur(), "expected 'in' in for loop, got " + describe(cur()));
    KILN_ASSIGN_OR_RETURN(s->expr, parse_tuple_expr(/*with_cond=*/false));
    if (skip_name("if")) {
      KILN_ASSIGN_OR_RETURN(s->cond, parse_expr());
    }
    if (is_name("recursive"))
      return unimplemented("template line {}, column {}: recursive for loops are not supported", cur().line,
                           cur().col);
    KILN_TRY(expect_block_end());
    std::string end;
    KILN_TRY(parse_body(s->body, {"else", "endfor"}, end));
    KILN_TRY(expect_block_end());
    if (end == "else") {
      KILN_TRY(parse_body(s->else_body, {"endfor"}, end));
      KILN_TRY(expect_block_end());
    }
    return s;
  }

  Result<StmtPtr> parse_set(const Token& kw) {
    auto s = stmt(StmtType::set, kw);
    if (cur().type == Tok::name && peek().type == Tok::op && peek().text == ".") {
      s->ns_name = t_[p_].text;
      p_ += 2;
      KILN_ASSIGN_OR_RETURN(s->text, expect_name());
    } else {
      KILN_TRY(parse_targets(s->targets));
    }
    if (skip_op("=")) {
      KILN_ASSIGN_OR_RETURN(s->expr, parse_tuple_expr());
      KILN_TRY(expect_block_end());
      return s;
    }
    if (!s->ns_name.empty() || s->targets.size() != 1) return error(cur(), "expected '=' in set");
    s->type = StmtType::set_block;
    if (is_op("|")) {
      KILN_ASSIGN_OR_RETURN(s->expr, parse_filter_chain(nullptr));
    }
    KILN_TRY(expect_block_end());
    std::string end;
    KILN_TRY(parse_body(s->body, {"endset"}, end));
    KILN_TRY(expect_block_end());
    return s;
  }

  Status parse_params(Stmt& s) {
    KILN_TRY(expect_op("("));
    while (!is_op(")")) {
      KILN_ASSIGN_OR_RETURN(auto name, expect_name());
      s.params.push_back(std::move(name));
      ExprPtr def;
      if (skip_op("=")) {
        KILN_ASSIGN_OR_RETURN(def, parse_expr());
      }
      s.defaults.push_back(std::move(def));
      if (!skip_op(",")) break;
    }
    return expect_op(")");
  }

  Result<StmtPtr> parse_macro(const Token& kw) {
    auto s = stmt(StmtType::macro, kw);
    KILN_ASSIGN_OR_RETURN(s->text, expect_name());
    KILN_TRY(parse_params(*s));
    KILN_TRY(expect_block_end());
    std::string end;
    KILN_TRY(parse_body(s->body, {"endmacro"}, end));
    if (cur().type == Tok::name) ++p_;  // {% endmacro name %}
    KILN_TRY(expect_block_end());
    return s;
  }

  Result<StmtPtr> parse_call_block(const Token& kw) {
    auto s = stmt(StmtType::call_block, kw);
    if (is_op("(")) KILN_TRY(parse_params(*s));
    KILN_ASSIGN_OR_RETURN(s->expr, parse_expr());
    if (s->expr->type != ExprType::call) return error(kw, "'{% call %}' needs a macro call");
    KILN_TRY(expect_block_end());
    std::string end;
    KILN_TRY(parse_body(s->body, {"endcall"}, end));
    KILN_TRY(expect_block_end());
    return s;
  }

  Result<StmtPtr> parse_filter_block(const Token& kw) {
    auto s = stmt(StmtType::filter_block, kw);
    KILN_ASSIGN_OR_RETURN(s->expr, parse_filter_chain(nullptr, /*leading_pipe=*/false));
    KILN_TRY(expect_block_end());
    std::string end;
    KILN_TRY(parse_body(s->body, {"endfilter"}, end));
    KILN_TRY(expect_block_end());
    return s;
  }

  // ---- expressions ----

  // `a, b` at the top of {{ }} / set / for builds a tuple.
  Result<ExprPtr> parse_tuple_expr(bool with_cond = true) {
    const Token& at = cur();
    KILN_ASSIGN_OR_RETURN(auto first, with_cond ? parse_expr() : parse_or());
    if (!is_op(",")) return first;
    auto tup = node(ExprType::tuple, at);
    tup->kids.push_back(std::move(first));
    while (skip_op(",")) {
      if (cur().type == Tok::block_end || cur().type == Tok::var_end || is_name("if")) break;
      KILN_ASSIGN_OR_RETURN(auto e, with_cond ? parse_expr() : parse_or());
      tup->kids.push_back(std::move(e));
    }
    return tup;
  }

  Result<ExprPtr> parse_expr() {
    if (++depth_ > kMaxNesting) return error(cur(), "expression nested deeper than 200");
    const Token& at = cur();
    KILN_ASSIGN_OR_RETURN(auto e, parse_or());
    ChainGuard chain{depth_};
    while (skip_name("if")) {
      KILN_TRY(check_chain(chain));
      auto c = node(ExprType::cond, at);
      c->kids.push_back(std::move(e));
      KILN_ASSIGN_OR_RETURN(auto test, parse_or());
      c->kids.push_back(std::move(test));
      ExprPtr other;
      if (skip_name("else")) {
        KILN_ASSIGN_OR_RETURN(other, parse_expr());
      }
      c->kids.push_back(std::move(other));
      e = std::move(c);
    }
    --depth_;
    return e;
  }

  ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b, const Token& at) const {
    auto e = node(ExprType::binary, at);
    e->name = op;
    e->kids.push_back(std::move(a));
    e->kids.push_back(std::move(b));
    return e;
  }

  Result<ExprPtr> parse_or() {
    KILN_ASSIGN_OR_RETURN(auto e, parse_and());
    ChainGuard chain{depth_};
    while (is_name("or")) {
      KILN_TRY(check_chain(chain));
      const Token& at = t_[p_++];
      KILN_ASSIGN_OR_RETURN(auto r, parse_and());
      e = binary("or", std::move(e), std::move(r), at);
    }
    return e;
  }
  Result<ExprPtr> parse_and() {
    KILN_ASSIGN_OR_RETURN(auto e, parse_not());
    ChainGuard chain{depth_};
    while (is_name("and")) {
      KILN_TRY(check_chain(chain));
      const Token& at = t_[p_++];
      KILN_ASSIGN_OR_RETURN(auto r, parse_not());
      e = binary("and", std::move(e), std::move(r), at);
    }
    return e;
  }
  Result<ExprPtr> parse_not() {
    if (is_name("not")) {
      if (++depth_ > kMaxNesting) return error(cur(), "expression nested deeper than 200");
      const Token& at = t_[p_++];
      auto e = node(ExprType::unary, at);
      e->name = "not";
      KILN_ASSIGN_OR_RETURN(auto k, parse_not());
      e->kids.push_back(std::move(k));
      --depth_;
      return e;
    }
    return parse_compare();
  }
  Result<ExprPtr> parse_compare() {
    const Token& at = cur();
    KILN_ASSIGN_OR_RETURN(auto first, parse_math1());
    ExprPtr cmp;
    for (;;) {
      std::string op;
      if (cur().type == Tok::op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                    cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
        op = t_[p_++].text;
      } else if (is_name("in")) {
        ++p_;
        op = "in";
      } else if (is_name("not") && peek().type == Tok::name && peek().text == "in") {
        p_ += 2;
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = node(ExprType::compare, at);
        cmp->kids.push_back(std::move(first));
      }
      KILN_ASSIGN_OR_RETURN(auto r, parse_math1());
      cmp->ops.push_back(op);
      cmp->kids.push_back(std::move(r));
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  Result<ExprPtr> parse_math1() {
    KILN_ASSIGN_OR_RETURN(auto e, parse_concat());
    ChainGuard chain{depth_};
    while (is_op("+") || is_op("-")) {
      KILN_TRY(check_chain(chain));
      const Token& at = t_[p_++];
      KILN_ASSIGN_OR_RETURN(auto r, parse_concat());
      e = binary(at.text, std::move(e), std::move(r), at);
    }
    return e;
  }
  Result<ExprPtr> parse_concat() {
    KILN_ASSIGN_OR_RETURN(auto e, parse_math2());
    ChainGuard chain{depth_};
    while (is_op("~")) {
      KILN_TRY(check_chain(chain));
      const Token& at = t_[p_++];
      KILN_ASSIGN_OR_RETURN(auto r, parse_math2());
      e = binary("~", std::move(e), std::move(r), at);
    }
    return e;
  }
  Result<ExprPtr> parse_math2() {
    KILN_ASSIGN_OR_RETURN(auto e, parse_pow());
    ChainGuard chain{depth_};
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      KILN_TRY(check_chain(chain));
      const Token& at = t_[p_++];
      KILN_ASSIGN_OR_RETURN(auto r, parse_pow());
      e = binary(at.text, std::move(e), std::move(r), at);
    }
    return e;
  }
  Result<ExprPtr> parse_pow() {
    KILN_ASSIGN_OR_RETURN(auto e, parse_unary(true));
    ChainGuard chain{depth_};
    while (is_op("**")) {
      KILN_TRY(check_chain(chain));
      const Token& at = t_[p_++];
      KILN_ASSIGN_OR_RETURN(auto r, parse_unary(true));
      e = binary("**", std::move(e), std::move(r), at);
    }
    return e;
  }
  Result<ExprPtr> parse_unary(bool with_filter) {
    if (is_op("-") || is_op("+")) {
      if (++depth_ > kMaxNesting) return error(cur(), "expression nested deeper than 200");
      const Token& at = t_[p_++];
      auto e = node(ExprType::unary, at);
      e->name = at.text;
      KILN_ASSIGN_OR_RETURN(auto k, parse_unary(false));
      e->kids.push_back(std::move(k));
      --depth_;
      if (with_filter) return parse_filter_chain(std::move(e), /*leading_pipe=*/true);
      return e;
    }
    KILN_ASSIGN_OR_RETURN(auto e, parse_primary());
    KILN_ASSIGN_OR_RETURN(e, parse_postfix(std::move(e)));
    if (with_filter) return parse_filter_chain(std::move(e), /*leading_pipe=*/true);
    return e;
  }

  Status parse_call_args(Expr& e) {
    KILN_TRY(expect_op("("));
    while (!is_op(")")) {
      std::string kw;
      if (cur().type == Tok::name && peek().type == Tok::op && peek().text == "=") {
        kw = cur().text;
        p_ += 2;
      }
      KILN_ASSIGN_OR_RETURN(auto a, parse_expr());
      e.kids.push_back(std::move(a));
      e.arg_names.push_back(std::move(kw));
      if (!skip_op(",")) break;
    }
    return expect_op(")");
  }

  // Filters (`| name(args)`), tests (`is [not] name args`) and calls after an operand. With
  // leading_pipe=false the first filter has no `|` (filter blocks).
  Result<ExprPtr> parse_filter_chain(ExprPtr e, bool leading_pipe = true) {
    bool first = true;
    ChainGuard chain{depth_};
    for (;;) {
      KILN_TRY(check_chain(chain));
      if (is_op("|") || (first && !leading_pipe)) {
        const Token& at = cur();
        if (is_op("|")) ++p_;
        auto f = node(ExprType::filter, at);
        KILN_ASSIGN_OR_RETURN(f->name, expect_name());
        f->kids.push_back(std::move(e));
        f->arg_names.push_back("");
        if (is_op("(")) KILN_TRY(parse_call_args(*f));
        e = std::move(f);
      } else if (is_name("is")) {
        const Token& at = t_[p_++];
        auto t = node(ExprType::test, at);
        t->negated = skip_name("not");
        KILN_ASSIGN_OR_RETURN(t->name, expect_name());
        t->kids.push_back(std::move(e));
        t->arg_names.push_back("");
        if (is_op("(")) {
          KILN_TRY(parse_call_args(*t));
        } else if ((cur().type == Tok::name && !is_name("else") && !is_name("or") && !is_name("and") &&
                    !is_name("if") && !is_name("is")) ||
                   cur().type == Tok::string || cur().type == Tok::integer || cur().type == Tok::floating ||
                   is_op("[") || is_op("{")) {
          KILN_ASSIGN_OR_RETURN(auto arg, parse_primary());
          KILN_ASSIGN_OR_RETURN(arg, parse_postfix(std::move(arg)));
          t->kids.push_back(std::move(arg));
          t->arg_names.push_back("");
        }
        e = std::move(t);
      } else if (is_op("(")) {
        KILN_ASSIGN_OR_RETURN(e, parse_call(std::move(e)));
      } else {
        break;
      }
      first = false;
    }
    return e;
  }

  Result<ExprPtr> parse_call(ExprPtr callee) {
    auto c = node(ExprType::call, cur());
    c->kids.push_back(std::move(callee));
    c->arg_names.push_back("");
    KILN_TRY(parse_call_args(*c));
    return c;
  }

  Result<ExprPtr> parse_postfix(ExprPtr e) {
    ChainGuard chain{depth_};
    for (;;) {
      KILN_TRY(check_chain(chain));
      if (is_op(".")) {
        const Token& at = t_[p_++];
        auto a = node(ExprType::attr, at);
        if (cur().type == Tok::integer) {
          a->type = ExprType::item;
          auto idx = node(ExprType::literal, cur());
          idx->value = Value::integer(cur().ival);
          ++p_;
          a->kids.push_back(std::move(e));
          a->kids.push_back(std::move(idx));
        } else {
          KILN_ASSIGN_OR_RETURN(a->name, expect_name());
          a->kids.push_back(std::move(e));
        }
        e = std::move(a);
      } else if (is_op("[")) {
        KILN_ASSIGN_OR_RETURN(e, parse_subscript(std::move(e)));
      } else if (is_op("(")) {
        KILN_ASSIGN_OR_RETURN(e, parse_call(std::move(e)));
      } else {
        return e;
      }
    }
  }

  Result<ExprPtr> parse_subscript(ExprPtr obj) {
    const Token& at = t_[p_++];  // '['
    ExprPtr parts[3];
    int n = 0;
    bool slice = false;
    for (;;) {
      if (!is_op(":") && !is_op("]")) {
        KILN_ASSIGN_OR_RETURN(parts[n], parse_expr());
      }
      if (is_op(":") && n < 2) {
        ++p_;
        slice = true;
        ++n;
        continue;
      }
      break;
    }
    KILN_TRY(expect_op("]"));
    auto e = node(slice ? ExprType::slice : ExprType::item, at);
    e->kids.push_back(std::move(obj));
    if (!slice && !parts[0]) return error(at, "empty subscript");
    e->kids.push_back(std::move(parts[0]));
    if (slice) {
      e->kids.push_back(std::move(parts[1]));
      e->kids.push_back(std::move(parts[2]));
    }
    return e;
  }

  Result<ExprPtr> parse_primary() {
    const Token& t = cur();
    if (t.type == Tok::name) {
      ++p_;
      auto e = node(ExprType::literal, t);
      if (t.text == "true" || t.text == "True")
        e->value = Value::boolean(true);
      else if (t.text == "false" || t.text == "False")
        e->value = Value::boolean(false);
      else if (t.text == "none" || t.text == "None")
        e->value = Value::none();
      else {
        e->type = ExprType::name;
        e->name = t.text;
      }
      return e;
    }
    if (t.type == Tok::string) {
      auto e = node(ExprType::literal, t);
      std::string s;
      while (cur().type == Tok::string) s += t_[p_++].text;  // adjacent literals concatenate
      e->value = Value::string(std::move(s));
      return e;
    }
    if (t.type == Tok::integer || t.type == Tok::floating) {
      ++p_;
      auto e = node(ExprType::literal, t);
      e->value = t.type == Tok::integer ? Value::integer(t.ival) : Value::floating(t.fval);
      return e;
    }
    if (is_op("(") || is_op("[") || is_op("{")) {
      if (++depth_ > kMaxNesting) return error(t, "expression nested deeper than 200");
      KILN_ASSIGN_OR_RETURN(auto e, parse_bracketed());
      --depth_;
      return e;
    }
    return error(t, "unexpected " + describe(t) + " in expression");
  }

  Result<ExprPtr> parse_bracketed() {
    const Token& t = t_[p_++];
    const std::string close = t.text == "(" ? ")" : t.text == "[" ? "]" : "}";
    auto e = node(t.text == "(" ? ExprType::tuple : t.text == "[" ? ExprType::list : ExprType::dict, t);
    bool trailing_comma = false;
    while (!is_op(close.c_str())) {
      KILN_ASSIGN_OR_RETURN(auto item, parse_expr());
      e->kids.push_back(std::move(item));
      if (e->type == ExprType::dict) {
        KILN_TRY(expect_op(":"));
        KILN_ASSIGN_OR_RETURN(auto v, parse_expr());
        e->kids.push_back(std::move(v));
      }
      trailing_comma = skip_op(",");
      if (!trailing_comma) break;
    }
    KILN_TRY(expect_op(close.c_str()));
    if (e->type == ExprType::tuple && e->kids.size() == 1 && !trailing_comma) return std::move(e->kids[0]);
    return e;
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  int depth_ = 0;
};

}  // namespace

Result<std::shared_ptr<Template>> parse_template(const std::string& source) {
  KILN_ASSIGN_OR_RETURN(auto toks, lex(source));
  return Parser(std::move(toks)).run();
}

}  // namespace kiln::jinja
