// Jinja values: what a chat template computes with. Lists, dicts and namespaces are shared by reference
// (as in Python); everything else is copied. Dicts keep insertion order (Python dict semantics).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace kiln::jinja {

enum class Kind { undefined, none, boolean, integer, floating, string, list, dict, ns, callable };

struct Value;
struct Dict;
struct Callable;
using List = std::vector<Value>;

struct Value {
  Kind kind = Kind::undefined;
  bool b = false;                  // boolean
  int64_t i = 0;                   // integer
  double f = 0;                    // floating
  std::string s{};                 // string; for undefined: the name that was looked up (for messages)
  std::shared_ptr<List> list{};    // list (tuples are lists too)
  bool is_tuple = false;           // list: prints as a Python tuple
  std::shared_ptr<Dict> dict{};    // dict and ns
  std::shared_ptr<Callable> fn{};  // callable

  static Value undefined(std::string name = {});
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value floating(double v);
  static Value string(std::string v);
  static Value new_list(List items = {});
  static Value new_tuple(List items);
  static Value new_dict();
  static Value new_namespace();

  bool is_undefined() const { return kind == Kind::undefined; }
  bool is_number() const { return kind == Kind::integer || kind == Kind::floating || kind == Kind::boolean; }
  double as_double() const {
    return kind == Kind::floating ? f : kind == Kind::boolean ? (b ? 1.0 : 0.0) : double(i);
  }
};

// Insertion-ordered string-keyed map. Chat-template dicts are small: lookups are linear.
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value v);
};

// Arguments of a call: positional, then keyword.
struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  const Value* kwarg(const std::string& name) const;
};

class Interp;
struct Stmt;
// A builtin function or a macro (defined by `{% macro %}` or the body of `{% call %}`).
struct Callable {
  std::string name;
  std::function<Result<Value>(Interp&, const CallArgs&)> builtin;  // set for builtins
  const Stmt* macro = nullptr;                                     // set for macros and call blocks
  Value caller;                                                    // the `caller` a call block passes
};

const char* kind_name(Kind k);
bool truthy(const Value& v);
// Python's str(): None -> "None", True -> "True", 1.0 -> "1.0", lists/dicts as repr.
std::string to_str(const Value& v);
// Python's repr(): strings quoted.
std::string to_repr(const Value& v);
std::string float_repr(double v);
bool values_equal(const Value& a, const Value& b);
// <0, 0, >0; an error for types Python cannot order.
Result<int> values_compare(const Value& a, const Value& b);

// JSON -> Value. Use ordered_json to keep object key order (tojson prints keys in insertion order).
Value from_json(const nlohmann::json& j);
Value from_json(const nlohmann::ordered_json& j);
struct JsonOptions {
  int indent = -1;  // <0: one line with ", " and ": "
  bool sort_keys = false;
  std::string item_sep, key_sep;  // empty: Python's defaults for the indent
};
// json.dumps(v, ensure_ascii=False, ...). Fails on undefined and callables, like Python.
Result<std::string> to_json(const Value& v, const JsonOptions& opt);

}  // namespace kiln::jinja
