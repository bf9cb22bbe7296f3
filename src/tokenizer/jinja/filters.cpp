// Jinja's builtin filters and tests (the ones chat templates use), plus HF's tojson.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cfenv>
#include <cmath>

#include "tokenizer/jinja/interp.h"
#include "tokenizer/jinja/strutil.h"

namespace kiln::jinja {
namespace {

const Value* arg(const CallArgs& a, size_t pos, const char* name) {
  if (pos < a.pos.size()) return &a.pos[pos];
  return a.kwarg(name);
}

Result<int64_t> length_of(const Value& v) {
  switch (v.kind) {
    case Kind::undefined: return int64_t(0);
    case Kind::string: return int64_t(code_point_count(v.s));
    case Kind::list: return int64_t(v.list->size());
    case Kind::dict:
    case Kind::ns: return int64_t(v.dict->items.size());
    default: return invalid_argument("object of type {} has no length", kind_name(v.kind));
  }
}

// Jinja's sort key: strings compare case-insensitively unless case_sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.kind == Kind::string) return Value::string(py_lower(v.s));
  return v;
}

// The value of `attribute` (dotted path, integer parts index lists) of an item.
Result<Value> attribute_of(const Value& item, const std::string& path) {
  Value cur = item;
  size_t p = 0;
  while (p <= path.size()) {
    size_t q = path.find('.', p);
    if (q == std::string::npos) q = path.size();
    std::string part = path.substr(p, q - p);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
      return std::isdigit(static_cast<unsigned char>(c));
    });
    KILN_ASSIGN_OR_RETURN(
        cur, digits ? get_item(cur, Value::integer(std::stoll(part))) : get_item(cur, Value::string(part)));
    p = q + 1;
  }
  return cur;
}

Result<Value> sorted(const Value& v, bool reverse, bool case_sensitive, const Value* attribute) {
  KILN_ASSIGN_OR_RETURN(List items, iterate(v));
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& x : items) {
    Value key = x;
    if (attribute && attribute->kind == Kind::string) {
      KILN_ASSIGN_OR_RETURN(key, attribute_of(x, attribute->s));
    }
    keyed.emplace_back(sort_key(key, case_sensitive), std::move(x));
  }
  Status err;
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    auto c = values_compare(reverse ? b.first : a.first, reverse ? a.first : b.first);
    if (!c.ok()) {
      if (err.ok()) err = c.status();
      return false;
    }
    return *c < 0;
  });
  if (!err.ok()) return err;
  Value out = Value::new_list();
  for (auto& [k, x] : keyed) out.list->push_back(std::move(x));
  return out;
}

Result<Value> tojson_filter(const Value& v, const CallArgs& a) {
  JsonOptions opt;
  if (const Value* ind = arg(a, 1, "indent"); ind && ind->kind != Kind::none) {
    if (ind->kind != Kind::integer) return unimplemented("tojson: indent other than an integer");
    opt.indent = int(std::clamp<int64_t>(ind->i, 0, 64));
  }
  if (const Value* ea = arg(a, 0, "ensure_ascii"); ea && truthy(*ea)) {
    return unimplemented("tojson: ensure_ascii=True is not supported");
  }
  if (const Value* sep = arg(a, 2, "separators"); sep && sep->kind == Kind::list && sep->list->size() == 2) {
    opt.item_sep = to_str((*sep->list)[0]);
    opt.key_sep = to_str((*sep->list)[1]);
  }
  if (const Value* sk = arg(a, 3, "sort_keys")) opt.sort_keys = truthy(*sk);
  KILN_ASSIGN_OR_RETURN(std::string s, to_json(v, opt));
  return Value::string(std::move(s));
}

Result<Value> indent_filter(Interp& in, const Value& v, const CallArgs& a, const Expr* at) {
  std::string pad(4, ' ');
  if (const Value* w = arg(a, 0, "width")) {
    if (w->kind == Kind::integer)
      pad.assign(size_t(std::clamp<int64_t>(w->i, 0, 256)), ' ');
    else if (w->kind == Kind::string)
      pad = w->s;
  }
  const Value* first = arg(a, 1, "first");
  const Value* blank = arg(a, 2, "blank");
  std::string s = to_str(v) + "\n";
  // The result's size at most (every line indented, and the first), checked before it is built.
  const size_t n_lines = size_t(std::count(s.begin(), s.end(), '\n'));
  KILN_TRY(in.check_size(s.size() + (n_lines + 1) * pad.size(), at));
  // splitlines() on s + "\n" (lines split on "\n" only; the last empty piece dropped).
  std::vector<std::string> lines;
  for (size_t p = 0; p < s.size();) {
    size_t q = s.find('\n', p);
    lines.push_back(s.substr(p, q - p));
    p = q + 1;
  }
  std::string rv;
  for (size_t k = 0; k < lines.size(); ++k) {
    if (k) rv += "\n";
    bool indent = k > 0 && (!lines[k].empty() || (blank && truthy(*blank)));
    rv += (indent ? pad : "") + lines[k];
  }
  if (first && truthy(*first)) rv = pad + rv;
  return Value::string(std::move(rv));
}

Result<Value> int_filter(const Value& v, const CallArgs& a) {
  Value def = Value::integer(0);
  if (const Value* d = arg(a, 0, "default")) def = *d;
  switch (v.kind) {
    case Kind::integer: return v;
    case Kind::boolean: return Value::integer(v.b);
    case Kind::floating:
      return std::isfinite(v.f) && std::fabs(v.f) < 9.2e18 ? Value::integer(int64_t(v.f)) : def;
    case Kind::string: {
      std::string t = py_strip(v.s, nullptr, 'b');
      char* end = nullptr;
      errno = 0;
      long long x = std::strtoll(t.c_str(), &end, 10);
      if (!t.empty() && *end == '\0' && errno == 0) return Value::integer(x);
      double f = std::strtod(t.c_str(), &end);
      if (!t.empty() && *end == '\0' && std::isfinite(f) && std::fabs(f) < 9.2e18)
        return Value::integer(int64_t(f));
      return def;
    }
    default: return def;
  }
}

Result<Value> float_filter(const Value& v, const CallArgs& a) {
  Value def = Value::floating(0.0);
  if (const Value* d = arg(a, 0, "default")) def = *d;
  if (v.is_number()) return Value::floating(v.as_double());
  if (v.kind == Kind::string) {
    std::string t = py_strip(v.s, nullptr, 'b');
    char* end = nullptr;
    double f = std::strtod(t.c_str(), &end);
    if (!t.empty() && *end == '\0') return Value::floating(f);
  }
  return def;
}

Result<Value> round_filter(const Value& v, const CallArgs& a) {
  if (!v.is_number()) return invalid_argument("round: expected a number, got {}", kind_name(v.kind));
  int64_t precision = 0;
  if (const Value* p = arg(a, 0, "precision"); p && p->kind == Kind::integer)
    precision = std::clamp<int64_t>(p->i, 0, 15);
  std::string method = "common";
  if (const Value* m = arg(a, 1, "method"); m && m->kind == Kind::string) method = m->s;
  if (method == "common") {
    // Python's round(): an integer stays an integer; a float rounds half-even on its exact binary value,
    // which is what printf's correctly rounded %.*f does.
    if (v.kind != Kind::floating) return Value::integer(v.kind == Kind::boolean ? int64_t(v.b) : v.i);
    if (!std::isfinite(v.f)) return v;
    std::string digits = fmt::format("{:.{}f}", v.f, int(precision));
    return Value::floating(std::strtod(digits.c_str(), nullptr));
  }
  if (method != "ceil" && method != "floor")
    return invalid_argument("round: method must be common, ceil or floor");
  double scale = std::pow(10.0, double(precision)), x = v.as_double() * scale;
  return Value::floating((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

// select/reject/selectattr/rejectattr: keep the items whose test (default: truthiness) is `keep`.
Result<Value> select_filter(Interp& in, const Value& v, const CallArgs& a, bool by_attr, bool keep,
                            const Expr* at) {
  KILN_ASSIGN_OR_RETURN(List items, iterate(v));
  size_t first = 0;
  std::string attr;
  if (by_attr) {
    if (a.pos.empty() || a.pos[0].kind != Kind::string)
      return invalid_argument("selectattr needs an attribute name");
    attr = a.pos[0].s;
    first = 1;
  }
  std::string test;
  if (a.pos.size() > first) test = to_str(a.pos[first]);
  CallArgs targs;
  for (size_t k = first + 1; k < a.pos.size(); ++k) targs.pos.push_back(a.pos[k]);
  Value out = Value::new_list();
  for (const auto& x : items) {
    KILN_TRY(in.charge(1, at));
    Value subject = x;
    if (by_attr) {
      KILN_ASSIGN_OR_RETURN(subject, attribute_of(x, attr));
    }
    bool r = false;
    if (test.empty()) {
      r = truthy(subject);
    } else {
      KILN_ASSIGN_OR_RETURN(r, apply_test(in, test, subject, targs, at));
    }
    if (r == keep) out.list->push_back(x);
  }
  return out;
}

Result<Value> map_filter(Interp& in, const Value& v, const CallArgs& a, const Expr* at) {
  KILN_ASSIGN_OR_RETURN(List items, iterate(v));
  Value out = Value::new_list();
  if (const Value* attr = a.kwarg("attribute")) {
    const Value* def = a.kwarg("default");
    for (const auto& x : items) {
      KILN_ASSIGN_OR_RETURN(Value y, attribute_of(x, to_str(*attr)));
      out.list->push_back(y.kind == Kind::undefined && def ? *def : y);
    }
    return out;
  }
  if (a.pos.empty()) return invalid_argument("map needs a filter name or attribute=");
  std::string name = to_str(a.pos[0]);
  CallArgs fargs;
  fargs.pos.assign(a.pos.begin() + 1, a.pos.end());
  fargs.kw = a.kw;
  for (const auto& x : items) {
    KILN_TRY(in.charge(1, at));
    KILN_ASSIGN_OR_RETURN(Value y, apply_filter(in, name, x, fargs, at));
    out.list->push_back(std::move(y));
  }
  return out;
}

Result<Value> minmax(const Value& v, const CallArgs& a, bool want_max) {
  const Value* cs = arg(a, 0, "case_sensitive");
  KILN_ASSIGN_OR_RETURN(Value s, sorted(v, false, cs && truthy(*cs), a.kwarg("attribute")));
  if (s.list->empty()) return Value::undefined("min/max of an empty sequence");
  return want_max ? s.list->back() : s.list->front();
}

Result<Value> sum_filter(const Value& v, const CallArgs& a) {
  KILN_ASSIGN_OR_RETURN(List items, iterate(v));
  Value total = Value::integer(0);
  if (const Value* st = arg(a, 1, "start")) total = *st;
  const Value* attr = arg(a, 0, "attribute");
  for (const auto& x0 : items) {
    Value x = x0;
    if (attr && attr->kind == Kind::string) {
      KILN_ASSIGN_OR_RETURN(x, attribute_of(x0, attr->s));
    }
    if (!x.is_number() || !total.is_number())
      return invalid_argument("sum: cannot add {}", kind_name(x.kind));
    if (x.kind == Kind::floating || total.kind == Kind::floating) {
      total = Value::floating(total.as_double() + x.as_double());
    } else {
      int64_t r = 0;
      if (__builtin_add_overflow(total.kind == Kind::boolean ? int64_t(total.b) : total.i,
                                 x.kind == Kind::boolean ? int64_t(x.b) : x.i, &r)) {
        return out_of_range("sum: integer overflow");
      }
      total = Value::integer(r);
    }
  }
  return total;
}

Result<Value> string_filters(const std::string& name, const Value& v, const CallArgs& a, bool& handled) {
  handled = true;
  if (name == "trim") {
    const Value* chars = arg(a, 0, "chars");
    std::string cs = chars && chars->kind == Kind::string ? chars->s : std::string();
    return Value::string(py_strip(to_str(v), chars && chars->kind == Kind::string ? &cs : nullptr, 'b'));
  }
  if (name == "upper") return Value::string(py_upper(to_str(v)));
  if (name == "lower") return Value::string(py_lower(to_str(v)));
  if (name == "capitalize") return Value::string(py_capitalize(to_str(v)));
  if (name == "title") return Value::string(jinja_title(to_str(v)));
  if (name == "string") return v.kind == Kind::string ? v : Value::string(to_str(v));
  if (name == "safe") return v;
  if (name == "escape" || name == "e") {
    std::string out;
    static constexpr CharEscape kHtml[] = {
        {'&', "&amp;"}, {'<', "&lt;"}, {'>', "&gt;"}, {'"', "&#34;"}, {'\'', "&#39;"}};
    for (char c : to_str(v)) {
      if (const std::string_view* text = find_escape(kHtml, c)) {
        out += *text;
      } else {
        out += c;
      }
    }
    return Value::string(std::move(out));
  }
  if (name == "wordcount") {
    int64_t n = 0;
    bool in_word = false;
    for (unsigned char c : to_str(v)) {
      bool w = std::isalnum(c) || c == '_' || c >= 0x80;
      if (w && !in_word) ++n;
      in_word = w;
    }
    return Value::integer(n);
  }
  handled = false;
  return Value::none();
}

// Filters that take or build sequences: join, first, last, list, items, reverse, sort, dictsort, unique.
Result<Value> sequence_filters(Interp& in, const std::string& name, const Value& v, const CallArgs& a,
                               const Expr* at, bool& handled) {
  handled = true;
  if (name == "join") {
    KILN_ASSIGN_OR_RETURN(List items, iterate(v));
    const Value* sep = arg(a, 0, "d");
    const Value* attr = arg(a, 1, "attribute");
    std::string out, s = sep ? to_str(*sep) : std::string();
    for (size_t k = 0; k < items.size(); ++k) {
      if (k) out += s;
      Value x = items[k];
      if (attr && attr->kind == Kind::string) {
        KILN_ASSIGN_OR_RETURN(x, attribute_of(items[k], attr->s));
      }
      out += to_str(x);
      KILN_TRY(in.check_size(out.size(), at));
    }
    return Value::string(std::move(out));
  }
  if (name == "first" || name == "last") {
    KILN_ASSIGN_OR_RETURN(List items, iterate(v));
    if (items.empty()) return Value::undefined(name + " of an empty sequence");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    KILN_ASSIGN_OR_RETURN(List items, iterate(v));
    return Value::new_list(std::move(items));
  }
  if (name == "items") {
    if (v.kind == Kind::undefined) return Value::new_list();
    if (v.kind != Kind::dict) return invalid_argument("items: expected a dict, got {}", kind_name(v.kind));
    Value out = Value::new_list();
    for (const auto& [k, x] : v.dict->items) out.list->push_back(Value::new_tuple({Value::string(k), x}));
    return out;
  }
  if (name == "reverse") {
    if (v.kind == Kind::string) return get_slice(v, Value::none(), Value::none(), Value::integer(-1));
    KILN_ASSIGN_OR_RETURN(List items, iterate(v));
    std::reverse(items.begin(), items.end());
    return Value::new_list(std::move(items));
  }
  if (name == "sort") {
    const Value* rev = arg(a, 0, "reverse");
    const Value* cs = arg(a, 1, "case_sensitive");
    return sorted(v, rev && truthy(*rev), cs && truthy(*cs), arg(a, 2, "attribute"));
  }
  if (name == "dictsort") {
    if (v.kind != Kind::dict) return invalid_argument("dictsort: expected a dict, got {}", kind_name(v.kind));
    const Value* cs = arg(a, 0, "case_sensitive");
    const Value* by = arg(a, 1, "by");
    const Value* rev = arg(a, 2, "reverse");
    bool by_value = by && by->kind == Kind::string && by->s == "value";
    Value keyed = Value::new_list();
    for (const auto& [k, x] : v.dict->items) keyed.list->push_back(Value::new_tuple({Value::string(k), x}));
    Value key_attr = Value::string(by_value ? "1" : "0");
    return sorted(keyed, rev && truthy(*rev), cs && truthy(*cs), &key_attr);
  }
  if (name == "unique") {
    KILN_ASSIGN_OR_RETURN(List items, iterate(v));
    const Value* cs = arg(a, 0, "case_sensitive");
    List out, seen;
    for (const auto& x : items) {
      Value k = sort_key(x, cs && truthy(*cs));
      if (std::none_of(seen.begin(), seen.end(), [&](const Value& y) { return values_equal(k, y); })) {
        seen.push_back(k);
        out.push_back(x);
      }
    }
    return Value::new_list(std::move(out));
  }
  handled = false;
  return Value::none();
}

}  // namespace

Result<Value> apply_filter(Interp& in, const std::string& name, const Value& v, const CallArgs& a,
                           const Expr* at) {
  bool handled = false;
  KILN_ASSIGN_OR_RETURN(Value sv, string_filters(name, v, a, handled));
  if (handled) return sv;
  if (name == "length" || name == "count") {
    KILN_ASSIGN_OR_RETURN(int64_t n, length_of(v));
    return Value::integer(n);
  }
  if (name == "default" || name == "d") {
    Value def = a.pos.empty() ? Value::string("") : a.pos[0];
    const Value* boolean = arg(a, 1, "boolean");
    bool use_def = v.kind == Kind::undefined || (boolean && truthy(*boolean) && !truthy(v));
    return use_def ? def : v;
  }
  KILN_ASSIGN_OR_RETURN(Value seq, sequence_filters(in, name, v, a, at, handled));
  if (handled) return seq;
  if (name == "int") return int_filter(v, a);
  if (name == "float") return float_filter(v, a);
  if (name == "abs") {
    if (v.kind == Kind::integer)
      return v.i == INT64_MIN ? Value::floating(-double(v.i)) : Value::integer(v.i < 0 ? -v.i : v.i);
    if (v.is_number()) return v.kind == Kind::boolean ? Value::integer(v.b) : Value::floating(std::fabs(v.f));
    return invalid_argument("abs: expected a number, got {}", kind_name(v.kind));
  }
  if (name == "round") return round_filter(v, a);
  if (name == "replace") {
    if (a.pos.size() < 2) return invalid_argument("replace needs two arguments");
    CallArgs margs;
    margs.pos = {Value::string(to_str(a.pos[0])), Value::string(to_str(a.pos[1]))};
    if (a.pos.size() > 2) margs.pos.push_back(a.pos[2]);
    return call_method(in, Value::string(to_str(v)), "replace", margs, at);
  }
  if (name == "tojson") return tojson_filter(v, a);
  if (name == "indent") return indent_filter(in, v, a, at);
  if (name == "min" || name == "max") return minmax(v, a, name == "max");
  if (name == "sum") return sum_filter(v, a);
  if (name == "map") return map_filter(in, v, a, at);
  if (name == "select" || name == "reject") return select_filter(in, v, a, false, name == "select", at);
  if (name == "selectattr" || name == "rejectattr")
    return select_filter(in, v, a, true, name == "selectattr", at);
  return unimplemented("the filter '{}' is not supported", name);
}

Result<bool> apply_test(Interp& in, const std::string& name, const Value& v, const CallArgs& a,
                        const Expr* at) {
  (void)in;
  (void)at;
  const Value* x = a.pos.empty() ? nullptr : &a.pos[0];
  auto need = [&]() -> Status {
    if (!x) return invalid_argument("the test '{}' needs an argument", name);
    return {};
  };
  if (name == "defined") return v.kind != Kind::undefined;
  if (name == "undefined") return v.kind == Kind::undefined;
  if (name == "none") return v.kind == Kind::none;
  if (name == "string") return v.kind == Kind::string;
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind == Kind::integer;
  if (name == "float") return v.kind == Kind::floating;
  if (name == "boolean") return v.kind == Kind::boolean;
  if (name == "true") return v.kind == Kind::boolean && v.b;
  if (name == "false") return v.kind == Kind::boolean && !v.b;
  if (name == "mapping") return v.kind == Kind::dict;
  if (name == "iterable") return v.kind == Kind::list || v.kind == Kind::dict || v.kind == Kind::string;
  if (name == "sequence") return v.kind == Kind::list || v.kind == Kind::dict || v.kind == Kind::string;
  if (name == "callable") return v.kind == Kind::callable;
  if (name == "lower") return v.kind == Kind::string && py_lower(v.s) == v.s;
  if (name == "upper") return v.kind == Kind::string && py_upper(v.s) == v.s;
  if (name == "even" || name == "odd") {
    if (v.kind != Kind::integer)
      return invalid_argument("the test '{}' needs an integer, got {}", name, kind_name(v.kind));
    return (v.i % 2 == 0) == (name == "even");
  }
  if (name == "divisibleby") {
    KILN_TRY(need());
    if (v.kind != Kind::integer || x->kind != Kind::integer || x->i == 0) {
      return invalid_argument("divisibleby needs non-zero integers");
    }
    return v.i % x->i == 0;
  }
  if (name == "equalto" || name == "eq" || name == "==" || name == "sameas") {
    KILN_TRY(need());
    return values_equal(v, *x);
  }
  if (name == "ne" || name == "!=") {
    KILN_TRY(need());
    return !values_equal(v, *x);
  }
  if (name == "lt" || name == "le" || name == "gt" || name == "ge" || name == "lessthan" ||
      name == "greaterthan") {
    KILN_TRY(need());
    KILN_ASSIGN_OR_RETURN(int c, values_compare(v, *x));
    if (name == "lt" || name == "lessthan") return c < 0;
    if (name == "le") return c <= 0;
    if (name == "gt" || name == "greaterthan") return c > 0;
    return c >= 0;
  }
  if (name == "in") {
    KILN_TRY(need());
    if (x->kind == Kind::string) return v.kind == Kind::string && x->s.find(v.s) != std::string::npos;
    if (x->kind == Kind::dict) return v.kind == Kind::string && x->dict->find(v.s) != nullptr;
    KILN_ASSIGN_OR_RETURN(List items, iterate(*x));
    return std::any_of(items.begin(), items.end(), [&](const Value& y) { return values_equal(v, y); });
  }
  return unimplemented("the test '{}' is not supported", name);
}

}  // namespace kiln::jinja
