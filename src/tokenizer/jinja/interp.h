// The evaluator: runs a parsed template against a context, within a step budget, a call-depth limit and an
// output cap. Each exceeded budget is a resource_exhausted Status; each missing feature names itself and
// the template line and column.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/value.h"

namespace kiln::jinja {

struct Limits {
  int64_t max_steps = 1'000'000;  // expression evaluations + statements + loop iterations
  int max_call_depth = 64;        // nested macro calls
  int max_depth = 512;            // nested expressions + statements across macro calls (C++ stack guard)
  size_t max_output_bytes = 16u << 20;  // any rendered string, the prompt included
};

using Frame = std::map<std::string, Value>;

class Interp {
 public:
  Interp(const Limits& limits, Frame globals);

  Result<std::string> render(const Template& tmpl);

  // Budget hooks for builtins: one step per unit of work; strings no larger than the output cap.
  Status charge(int64_t steps, const Expr* at);
  // Charges what an operation on these operands may touch, before it runs: one step per KiB of a string, one
  // per element of a list or dict (not nested). Every filter, test, method, operator and comparison pays it,
  // so the step budget bounds the bytes a template can scan, not only the steps it takes.
  Status charge_touch(std::initializer_list<const Value*> operands, const CallArgs* args, const Expr* at);
  Status check_size(size_t bytes, const Expr* at) const;
  const Limits& limits() const { return limits_; }
  Result<Value> call_value(const Value& fn, const CallArgs& args, const Expr* at);

  Status error(const Expr* at, StatusCode code, const std::string& msg) const;

 private:
  enum class Flow { normal, break_, continue_ };

  Result<Flow> exec_body(const Body& body, std::string& out);
  Result<Flow> exec(const Stmt& s, std::string& out);  // depth-checked entry
  Result<Flow> exec_node(const Stmt& s, std::string& out);
  Status enter(int line, int col);
  Result<Flow> exec_for(const Stmt& s, std::string& out);
  Status exec_set(const Stmt& s, std::string& out);
  Status append(std::string& out, const std::string& text, int line, int col) const;

  Result<Value> eval(const Expr& e);  // depth-checked entry
  Result<Value> eval_node(const Expr& e);
  Result<Value> eval_binary(const Expr& e);
  Result<Value> eval_collection(const Expr& e);  // list, tuple, dict literals
  Result<Value> eval_unary(const Expr& e);
  Result<Value> eval_compare(const Expr& e);
  Result<Value> eval_call(const Expr& e);
  Result<Value> eval_filter(const Expr& e, const Value* input);
  Result<Value> eval_test(const Expr& e);
  Result<CallArgs> eval_args(const Expr& e, size_t first);
  Result<Value> call_macro(const Callable& fn, const CallArgs& args, const Expr* at);

  Value lookup(const std::string& name) const;
  void assign(const std::string& name, Value v);

  Limits limits_;
  int64_t steps_ = 0;
  int call_depth_ = 0;
  int depth_ = 0;                               // current eval/exec nesting
  std::vector<std::shared_ptr<Frame>> scopes_;  // innermost last; [0] = globals, [1] = template level
};

// Builtins (builtins.cpp). `at` is the node to name in errors.
Result<Value> apply_filter(Interp& in, const std::string& name, const Value& v, const CallArgs& args,
                           const Expr* at);
Result<bool> apply_test(Interp& in, const std::string& name, const Value& v, const CallArgs& args,
                        const Expr* at);
Result<Value> call_method(Interp& in, const Value& obj, const std::string& name, const CallArgs& args,
                          const Expr* at);
bool has_method(const Value& obj, const std::string& name);
Result<Value> get_attr(const Value& obj, const std::string& name);
Result<Value> get_item(const Value& obj, const Value& key);
Result<Value> get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
// The iteration items of a value: list items, dict keys, string characters (UTF-8 code points).
// The items of a list, the keys of a dict, the characters of a string (at most kMaxIteratedStringBytes long).
inline constexpr size_t kMaxIteratedStringBytes = size_t{1} << 20;
Result<List> iterate(const Value& v);
void add_global_functions(Frame& globals);

}  // namespace kiln::jinja
