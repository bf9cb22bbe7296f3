// Statements and expressions of the Jinja subset. Python semantics: `and`/`or` return an operand, `/` is
// true division, `//` and `%` floor, integers overflow into errors rather than wrapping.
#include "tokenizer/jinja/interp.h"

#include <cmath>
#include <limits>

namespace kiln::jinja {

Interp::Interp(const Limits& limits, Frame globals) : limits_(limits) {
  scopes_.push_back(std::make_shared<Frame>(std::move(globals)));
  scopes_.push_back(std::make_shared<Frame>());
}

Status Interp::error(const Expr* at, StatusCode code, const std::string& msg) const {
  if (!at) return Status(code, msg);
  return Status(code, fmt::format("template line {}, column {}: {}", at->line, at->col, msg));
}

Status Interp::charge(int64_t steps, const Expr* at) {
  steps_ += steps;
  if (steps_ > limits_.max_steps) {
    return error(at, StatusCode::resource_exhausted,
                 fmt::format("template step budget of {} exhausted", limits_.max_steps));
  }
  return {};
}

Status Interp::charge_touch(std::initializer_list<const Value*> operands, const CallArgs* args,
                            const Expr* at) {
  auto cost = [](const Value& v) -> int64_t {
    switch (v.kind) {
      case Kind::string: return int64_t(v.s.size() >> 10);
      case Kind::list: return v.list ? int64_t(v.list->size()) : 0;
      case Kind::dict: return v.dict ? int64_t(v.dict->items.size()) : 0;
      default: return 0;
    }
  };
  int64_t steps = 0;
  for (const Value* v : operands) steps += cost(*v);
  if (args != nullptr) {
    for (const Value& v : args->pos) steps += cost(v);
    for (const auto& [name, v] : args->kw) steps += cost(v);
  }
  return steps > 0 ? charge(steps, at) : Status();
}

Status Interp::check_size(size_t bytes, const Expr* at) const {
  if (bytes > limits_.max_output_bytes) {
    return error(at, StatusCode::resource_exhausted,
                 fmt::format("string of {} bytes exceeds the template output cap of {} bytes", bytes,
                             limits_.max_output_bytes));
  }
  return {};
}

Status Interp::append(std::string& out, const std::string& text, int line, int col) const {
  if (out.size() + text.size() > limits_.max_output_bytes) {
    return resource_exhausted("template line {}, column {}: output exceeds the cap of {} bytes", line, col,
                              limits_.max_output_bytes);
  }
  out += text;
  return {};
}

Value Interp::lookup(const std::string& name) const {
  for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
    auto f = (*it)->find(name);
    if (f != (*it)->end()) return f->second;
  }
  return Value::undefined(name);
}

void Interp::assign(const std::string& name, Value v) { (*scopes_.back())[name] = std::move(v); }

Result<std::string> Interp::render(const Template& tmpl) {
  std::string out;
  KILN_ASSIGN_OR_RETURN(Flow flow, exec_body(tmpl.body, out));
  (void)flow;
  return out;
}

Result<Interp::Flow> Interp::exec_body(const Body& body, std::string& out) {
  for (const auto& s : body) {
    KILN_ASSIGN_OR_RETURN(Flow flow, exec(*s, out));
    if (flow != Flow::normal) return flow;
  }
  return Flow::normal;
}

Status Interp::enter(int line, int col) {
  if (depth_ >= limits_.max_depth) {
    return resource_exhausted(
        "template line {}, column {}: expressions, blocks and macro calls nested deeper than {}", line, col,
        limits_.max_depth);
  }
  ++depth_;
  return {};
}

Result<Interp::Flow> Interp::exec(const Stmt& s, std::string& out) {
  KILN_TRY(enter(s.line, s.col));
  auto r = exec_node(s, out);
  --depth_;
  return r;
}

Result<Interp::Flow> Interp::exec_node(const Stmt& s, std::string& out) {
  steps_ += 1;
  if (steps_ > limits_.max_steps) {
    return resource_exhausted("template line {}, column {}: template step budget of {} exhausted", s.line,
                              s.col, limits_.max_steps);
  }
  switch (s.type) {
    case StmtType::text: KILN_TRY(append(out, s.text, s.line, s.col)); return Flow::normal;
    case StmtType::output: {
      KILN_ASSIGN_OR_RETURN(Value v, eval(*s.expr));
      KILN_TRY(append(out, to_str(v), s.line, s.col));
      return Flow::normal;
    }
    case StmtType::if_:
      for (size_t k = 0; k < s.branches.size(); ++k) {
        if (k < s.conds.size()) {
          KILN_ASSIGN_OR_RETURN(Value c, eval(*s.conds[k]));
          if (!truthy(c)) continue;
        }
        return exec_body(s.branches[k], out);
      }
      return Flow::normal;
    case StmtType::for_: return exec_for(s, out);
    case StmtType::set:
    case StmtType::set_block: KILN_TRY(exec_set(s, out)); return Flow::normal;
    case StmtType::macro: {
      Value m;
      m.kind = Kind::callable;
      m.fn = std::make_shared<Callable>();
      m.fn->name = s.text;
      m.fn->macro = &s;
      assign(s.text, std::move(m));
      return Flow::normal;
    }
    case StmtType::call_block: {
      Value caller;
      caller.kind = Kind::callable;
      caller.fn = std::make_shared<Callable>();
      caller.fn->name = "caller";
      caller.fn->macro = &s;
      const Expr& call = *s.expr;
      KILN_ASSIGN_OR_RETURN(Value fn, eval(*call.kids[0]));
      KILN_ASSIGN_OR_RETURN(CallArgs args, eval_args(call, 1));
      if (fn.kind != Kind::callable || !fn.fn->macro) {
        return error(&call, StatusCode::invalid_argument, "'{% call %}' needs a macro");
      }
      Callable with_caller = *fn.fn;
      with_caller.caller = caller;
      KILN_ASSIGN_OR_RETURN(Value r, call_macro(with_caller, args, &call));
      KILN_TRY(append(out, to_str(r), s.line, s.col));
      return Flow::normal;
    }
    case StmtType::filter_block: {
      std::string inner;
      KILN_ASSIGN_OR_RETURN(Flow flow, exec_body(s.body, inner));
      (void)flow;
      Value v = Value::string(std::move(inner));
      KILN_ASSIGN_OR_RETURN(Value r, eval_filter(*s.expr, &v));
      KILN_TRY(append(out, to_str(r), s.line, s.col));
      return Flow::normal;
    }
    case StmtType::break_: return Flow::break_;
    case StmtType::continue_: return Flow::continue_;
  }
  return Flow::normal;
}

Status Interp::exec_set(const Stmt& s, std::string& out) {
  (void)out;
  Value v;
  if (s.type == StmtType::set_block) {
    std::string inner;
    KILN_ASSIGN_OR_RETURN(Flow flow, exec_body(s.body, inner));
    (void)flow;
    v = Value::string(std::move(inner));
    if (s.expr) {
      KILN_ASSIGN_OR_RETURN(v, eval_filter(*s.expr, &v));
    }
  } else {
    KILN_ASSIGN_OR_RETURN(v, eval(*s.expr));
  }
  if (!s.ns_name.empty()) {
    Value ns = lookup(s.ns_name);
    if (ns.kind != Kind::ns) {
      return invalid_argument(
          "template line {}, column {}: cannot set attribute '{}' of '{}': it is a {}, not a "
          "namespace",
          s.line, s.col, s.text, s.ns_name, kind_name(ns.kind));
    }
    ns.dict->set(s.text, std::move(v));
    return {};
  }
  if (s.targets.size() == 1) {
    assign(s.targets[0], std::move(v));
    return {};
  }
  KILN_ASSIGN_OR_RETURN(List items, iterate(v));
  if (items.size() != s.targets.size()) {
    return invalid_argument("template line {}, column {}: cannot unpack {} values into {} names", s.line,
                            s.col, items.size(), s.targets.size());
  }
  for (size_t k = 0; k < items.size(); ++k) assign(s.targets[k], items[k]);
  return {};
}

Result<Interp::Flow> Interp::exec_for(const Stmt& s, std::string& out) {
  KILN_ASSIGN_OR_RETURN(Value seq, eval(*s.expr));
  KILN_ASSIGN_OR_RETURN(List all, iterate(seq));
  KILN_TRY(charge(int64_t(all.size()), s.expr.get()));
  scopes_.push_back(std::make_shared<Frame>());
  auto bind = [&](const Value& item) -> Status {
    if (s.targets.size() == 1) {
      assign(s.targets[0], item);
      return {};
    }
    KILN_ASSIGN_OR_RETURN(List parts, iterate(item));
    if (parts.size() != s.targets.size()) {
      return invalid_argument("template line {}, column {}: cannot unpack {} values into {} loop variables",
                              s.line, s.col, parts.size(), s.targets.size());
    }
    for (size_t k = 0; k < parts.size(); ++k) assign(s.targets[k], parts[k]);
    return {};
  };
  List items;
  if (s.cond) {
    for (const Value& item : all) {
      KILN_TRY(bind(item));
      KILN_ASSIGN_OR_RETURN(Value c, eval(*s.cond));
      if (truthy(c)) items.push_back(item);
    }
  } else {
    items = std::move(all);
  }
  const int64_t n = int64_t(items.size());
  for (int64_t k = 0; k < n; ++k) {
    scopes_.back() = std::make_shared<Frame>();  // each iteration starts from a fresh scope, as in Jinja
    KILN_TRY(bind(items[size_t(k)]));
    Value loop = Value::new_dict();
    Dict& d = *loop.dict;
    d.set("index", Value::integer(k + 1));
    d.set("index0", Value::integer(k));
    d.set("revindex", Value::integer(n - k));
    d.set("revindex0", Value::integer(n - k - 1));
    d.set("first", Value::boolean(k == 0));
    d.set("last", Value::boolean(k == n - 1));
    d.set("length", Value::integer(n));
    d.set("depth", Value::integer(1));
    d.set("depth0", Value::integer(0));
    d.set("previtem", k > 0 ? items[size_t(k - 1)] : Value::undefined("previtem"));
    d.set("nextitem", k + 1 < n ? items[size_t(k + 1)] : Value::undefined("nextitem"));
    Value cycle;
    cycle.kind = Kind::callable;
    cycle.fn = std::make_shared<Callable>();
    cycle.fn->name = "cycle";
    cycle.fn->builtin = [k](Interp&, const CallArgs& a) -> Result<Value> {
      if (a.pos.empty()) return invalid_argument("loop.cycle() needs at least one argument");
      return a.pos[size_t(k) % a.pos.size()];
    };
    d.set("cycle", std::move(cycle));
    assign("loop", std::move(loop));
    KILN_ASSIGN_OR_RETURN(Flow flow, exec_body(s.body, out));
    if (flow == Flow::break_) break;
  }
  scopes_.pop_back();
  if (n == 0) {
    KILN_ASSIGN_OR_RETURN(Flow flow, exec_body(s.else_body, out));
    return flow;
  }
  return Flow::normal;
}

Result<CallArgs> Interp::eval_args(const Expr& e, size_t first) {
  CallArgs args;
  for (size_t k = first; k < e.kids.size(); ++k) {
    KILN_ASSIGN_OR_RETURN(Value v, eval(*e.kids[k]));
    if (e.arg_names[k].empty()) {
      if (!args.kw.empty())
        return error(&e, StatusCode::invalid_argument, "positional argument after keyword");
      args.pos.push_back(std::move(v));
    } else {
      args.kw.emplace_back(e.arg_names[k], std::move(v));
    }
  }
  return args;
}

Result<Value> Interp::call_macro(const Callable& fn, const CallArgs& args, const Expr* at) {
  const Stmt& m = *fn.macro;
  if (call_depth_ >= limits_.max_call_depth) {
    return error(at, StatusCode::resource_exhausted,
                 fmt::format("macro calls nested deeper than {} (recursion limit)", limits_.max_call_depth));
  }
  if (args.pos.size() > m.params.size()) {
    return error(
        at, StatusCode::invalid_argument,
        fmt::format("macro '{}' takes {} arguments, got {}", fn.name, m.params.size(), args.pos.size()));
  }
  auto frame = std::make_shared<Frame>();
  std::vector<std::shared_ptr<Frame>> saved = {scopes_.begin(), scopes_.end()};
  scopes_ = {saved[0], saved[1], frame};
  Status st;
  for (size_t k = 0; k < m.params.size() && st.ok(); ++k) {
    const Value* v = k < args.pos.size() ? &args.pos[k] : args.kwarg(m.params[k]);
    if (v) {
      (*frame)[m.params[k]] = *v;
    } else if (m.defaults[k]) {
      auto d = eval(*m.defaults[k]);
      if (!d.ok())
        st = d.status();
      else
        (*frame)[m.params[k]] = std::move(d).value();
    } else {
      (*frame)[m.params[k]] = Value::undefined(m.params[k]);
    }
  }
  for (const auto& [name, v] : args.kw) {
    bool known = false;
    for (const auto& p : m.params) known = known || p == name;
    if (!known && st.ok()) {
      st = error(at, StatusCode::invalid_argument,
                 fmt::format("macro '{}' has no parameter '{}'", fn.name, name));
    }
  }
  if (fn.caller.kind == Kind::callable) (*frame)["caller"] = fn.caller;
  std::string out;
  ++call_depth_;
  if (st.ok()) {
    auto r = exec_body(m.body, out);
    if (!r.ok()) st = r.status();
  }
  --call_depth_;
  scopes_ = std::move(saved);
  if (!st.ok()) return st;
  return Value::string(std::move(out));
}

Result<Value> Interp::call_value(const Value& fn, const CallArgs& args, const Expr* at) {
  if (fn.kind == Kind::undefined) {
    return error(at, StatusCode::invalid_argument, fmt::format("'{}' is undefined", fn.s));
  }
  if (fn.kind != Kind::callable) {
    return error(at, StatusCode::invalid_argument, fmt::format("a {} is not callable", kind_name(fn.kind)));
  }
  if (fn.fn->macro) return call_macro(*fn.fn, args, at);
  auto r = fn.fn->builtin(*this, args);
  if (!r.ok() && r.status().message().rfind("template line", 0) != 0) {
    return error(at, r.status().code(), r.status().message());
  }
  return r;
}

Result<Value> Interp::eval_call(const Expr& e) {
  const Expr& callee = *e.kids[0];
  KILN_ASSIGN_OR_RETURN(CallArgs args, eval_args(e, 1));
  if (callee.type == ExprType::attr) {
    KILN_ASSIGN_OR_RETURN(Value obj, eval(*callee.kids[0]));
    if (has_method(obj, callee.name)) {
      KILN_TRY(charge_touch({&obj}, &args, &callee));
      return call_method(*this, obj, callee.name, args, &callee);
    }
    if (obj.kind == Kind::undefined) {
      return error(&callee, StatusCode::invalid_argument, fmt::format("'{}' is undefined", obj.s));
    }
    KILN_ASSIGN_OR_RETURN(Value fn, get_attr(obj, callee.name));
    if (fn.kind == Kind::undefined) {
      return error(
          &callee, StatusCode::unimplemented,
          fmt::format("a {} has no method '{}' in this interpreter", kind_name(obj.kind), callee.name));
    }
    return call_value(fn, args, &e);
  }
  KILN_ASSIGN_OR_RETURN(Value fn, eval(callee));
  return call_value(fn, args, &e);
}

Result<Value> Interp::eval_filter(const Expr& e, const Value* input) {
  Value v;
  if (input) {
    v = *input;
  } else {
    KILN_ASSIGN_OR_RETURN(v, eval(*e.kids[0]));
  }
  // In a filter block the filter chain's innermost operand is the block's text.
  if (input && e.kids[0]) {
    KILN_ASSIGN_OR_RETURN(v, eval_filter(*e.kids[0], input));
  }
  KILN_ASSIGN_OR_RETURN(CallArgs args, eval_args(e, 1));
  KILN_TRY(charge_touch({&v}, &args, &e));
  auto r = apply_filter(*this, e.name, v, args, &e);
  if (!r.ok() && r.status().message().rfind("template line", 0) != 0) {
    return error(&e, r.status().code(), r.status().message());
  }
  // Texts of values are cut short past the cap (see value.cpp): such a string must not be measured or used.
  if (r.ok() && r->kind == Kind::string) KILN_TRY(check_size(r->s.size(), &e));
  return r;
}

Result<Value> Interp::eval_test(const Expr& e) {
  KILN_ASSIGN_OR_RETURN(Value v, eval(*e.kids[0]));
  KILN_ASSIGN_OR_RETURN(CallArgs args, eval_args(e, 1));
  KILN_TRY(charge_touch({&v}, &args, &e));
  auto r = apply_test(*this, e.name, v, args, &e);
  if (!r.ok()) {
    if (r.status().message().rfind("template line", 0) == 0) return r.status();
    return error(&e, r.status().code(), r.status().message());
  }
  return Value::boolean(*r != e.negated);
}

Result<Value> Interp::eval_collection(const Expr& e) {
  if (e.type != ExprType::dict) {
    Value v = Value::new_list();
    for (const auto& k : e.kids) {
      KILN_ASSIGN_OR_RETURN(Value x, eval(*k));
      v.list->push_back(std::move(x));
    }
    v.is_tuple = e.type == ExprType::tuple;
    return v;
  }
  Value v = Value::new_dict();
  for (size_t k = 0; k + 1 < e.kids.size(); k += 2) {
    KILN_ASSIGN_OR_RETURN(Value key, eval(*e.kids[k]));
    KILN_ASSIGN_OR_RETURN(Value x, eval(*e.kids[k + 1]));
    if (key.kind != Kind::string) {
      return error(&e, StatusCode::unimplemented, "dict keys other than strings are not supported");
    }
    v.dict->set(key.s, std::move(x));
  }
  return v;
}

Result<Value> Interp::eval_unary(const Expr& e) {
  KILN_ASSIGN_OR_RETURN(Value v, eval(*e.kids[0]));
  if (e.name == "not") return Value::boolean(!truthy(v));
  if (v.kind == Kind::integer) {
    if (e.name == "-" && v.i == std::numeric_limits<int64_t>::min()) {
      return error(&e, StatusCode::out_of_range, "integer overflow");
    }
    return Value::integer(e.name == "-" ? -v.i : v.i);
  }
  if (v.kind == Kind::boolean) return Value::integer(e.name == "-" ? -int64_t(v.b) : int64_t(v.b));
  if (v.kind == Kind::floating) return Value::floating(e.name == "-" ? -v.f : v.f);
  return error(&e, StatusCode::invalid_argument,
               fmt::format("bad operand type for unary {}: {}", e.name, kind_name(v.kind)));
}

Result<Value> Interp::eval(const Expr& e) {
  KILN_TRY(enter(e.line, e.col));
  auto r = eval_node(e);
  --depth_;
  return r;
}

Result<Value> Interp::eval_node(const Expr& e) {
  KILN_TRY(charge(1, &e));
  switch (e.type) {
    case ExprType::literal: return e.value;
    case ExprType::name: return lookup(e.name);
    case ExprType::list:
    case ExprType::tuple:
    case ExprType::dict: return eval_collection(e);
    case ExprType::attr: {
      KILN_ASSIGN_OR_RETURN(Value obj, eval(*e.kids[0]));
      if (obj.kind == Kind::undefined) {
        return error(&e, StatusCode::invalid_argument,
                     fmt::format("'{}' is undefined (reading .{})", obj.s, e.name));
      }
      auto r = get_attr(obj, e.name);
      if (!r.ok()) return error(&e, r.status().code(), r.status().message());
      return r;
    }
    case ExprType::item: {
      KILN_ASSIGN_OR_RETURN(Value obj, eval(*e.kids[0]));
      KILN_ASSIGN_OR_RETURN(Value key, eval(*e.kids[1]));
      if (obj.kind == Kind::undefined) {
        return error(&e, StatusCode::invalid_argument,
                     fmt::format("'{}' is undefined (reading [{}])", obj.s, to_repr(key)));
      }
      auto r = get_item(obj, key);
      if (!r.ok()) return error(&e, r.status().code(), r.status().message());
      return r;
    }
    case ExprType::slice: {
      KILN_ASSIGN_OR_RETURN(Value obj, eval(*e.kids[0]));
      Value parts[3] = {Value::none(), Value::none(), Value::none()};
      for (int k = 0; k < 3; ++k) {
        if (e.kids[size_t(k) + 1]) {
          KILN_ASSIGN_OR_RETURN(parts[k], eval(*e.kids[size_t(k) + 1]));
        }
      }
      auto r = get_slice(obj, parts[0], parts[1], parts[2]);
      if (!r.ok()) return error(&e, r.status().code(), r.status().message());
      return r;
    }
    case ExprType::call: return eval_call(e);
    case ExprType::filter: return eval_filter(e, nullptr);
    case ExprType::test: return eval_test(e);
    case ExprType::unary: return eval_unary(e);
    case ExprType::binary: return eval_binary(e);
    case ExprType::compare: return eval_compare(e);
    case ExprType::cond: {
      KILN_ASSIGN_OR_RETURN(Value c, eval(*e.kids[1]));
      if (truthy(c)) return eval(*e.kids[0]);
      if (e.kids[2]) return eval(*e.kids[2]);
      return Value::undefined("conditional expression without else");
    }
  }
  return error(&e, StatusCode::internal, "unknown expression");
}

}  // namespace kiln::jinja
