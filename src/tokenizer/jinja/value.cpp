#include "tokenizer/jinja/value.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "tokenizer/jinja/strutil.h"

namespace kiln::jinja {

Value Value::undefined(std::string name) { return Value{.s = std::move(name)}; }
Value Value::none() { return Value{.kind = Kind::none}; }
Value Value::boolean(bool x) { return Value{.kind = Kind::boolean, .b = x}; }
Value Value::integer(int64_t x) { return Value{.kind = Kind::integer, .i = x}; }
Value Value::floating(double x) { return Value{.kind = Kind::floating, .f = x}; }
Value Value::string(std::string x) { return Value{.kind = Kind::string, .s = std::move(x)}; }
Value Value::new_list(List items) {
  return Value{.kind = Kind::list, .list = std::make_shared<List>(std::move(items))};
}
Value Value::new_tuple(List items) {
  Value v = new_list(std::move(items));
  v.is_tuple = true;
  return v;
}
Value Value::new_dict() { return Value{.kind = Kind::dict, .dict = std::make_shared<Dict>()}; }
Value Value::new_namespace() {
  Value v = new_dict();
  v.kind = Kind::ns;
  return v;
}

const Value* Dict::find(const std::string& key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  for (auto& [k, old] : items) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  items.emplace_back(key, std::move(v));
}

const Value* CallArgs::kwarg(const std::string& name) const {
  for (const auto& [k, v] : kw) {
    if (k == name) return &v;
  }
  return nullptr;
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::undefined: return "undefined";
    case Kind::none: return "none";
    case Kind::boolean: return "bool";
    case Kind::integer: return "int";
    case Kind::floating: return "float";
    case Kind::string: return "string";
    case Kind::list: return "list";
    case Kind::dict: return "dict";
    case Kind::ns: return "namespace";
    case Kind::callable: return "callable";
  }
  return "?";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::undefined:
    case Kind::none: return false;
    case Kind::boolean: return v.b;
    case Kind::integer: return v.i != 0;
    case Kind::floating: return v.f != 0.0;
    case Kind::string: return !v.s.empty();
    case Kind::list: return !v.list->empty();
    case Kind::dict: return !v.dict->items.empty();
    case Kind::ns:
    case Kind::callable: return true;
  }
  return false;
}

std::string float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  // Python repr: the shortest round-trip digits; exponent form when exp10 < -4 or >= 16.
  std::string digits = fmt::format("{:e}", v);  // only to get the exponent
  int exp10 = std::stoi(digits.substr(digits.find('e') + 1));
  std::string out;
  if (exp10 < -4 || exp10 >= 16) {
    out = fmt::format("{}", v);
    // fmt may print the exponent form as 1e+16 (Python) already; make sure of the e[+-]dd shape.
    auto e = out.find('e');
    if (e == std::string::npos) {
      out = fmt::format("{:e}", v);
      e = out.find('e');
    }
    std::string mant = out.substr(0, e);
    int ex = std::stoi(out.substr(e + 1));
    out = mant + fmt::format("e{}{:02d}", ex < 0 ? '-' : '+', ex < 0 ? -ex : ex);
  } else {
    out = fmt::format("{}", v);
    if (out.find('e') != std::string::npos) out = fmt::format("{:f}", v);  // not expected in this range
    if (out.find('.') == std::string::npos) out += ".0";
  }
  return out;
}

static std::string repr_string(const std::string& s) {
  char q = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == q)
      out += std::string("\\") + char(c);
    else if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c == 0x7f)
      out += fmt::format("\\x{:02x}", c);
    else
      out += char(c);
  }
  out += q;
  return out;
}

namespace {

// Lists may share items, so a small value can stand for an exponentially large text: stop building once the
// text passes this size; callers then fail on their output cap (the default cap is 16 MiB).
constexpr size_t kTextLimit = size_t(32) << 20;

void repr_into(std::string& out, const Value& v) {
  if (out.size() > kTextLimit) return;
  switch (v.kind) {
    case Kind::string: out += repr_string(v.s); return;
    case Kind::list: {
      out += v.is_tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size() && out.size() <= kTextLimit; ++k) {
        if (k) out += ", ";
        repr_into(out, (*v.list)[k]);
      }
      out += v.is_tuple ? (v.list->size() == 1 ? ",)" : ")") : "]";
      return;
    }
    case Kind::dict: {
      out += "{";
      bool first = true;
      for (const auto& [k, x] : v.dict->items) {
        if (out.size() > kTextLimit) break;
        if (!first) out += ", ";
        first = false;
        out += repr_string(k) + ": ";
        repr_into(out, x);
      }
      out += "}";
      return;
    }
    default: out += to_str(v);
  }
}

}  // namespace

std::string to_repr(const Value& v) {
  std::string out;
  repr_into(out, v);
  return out;
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Kind::undefined: return "";
    case Kind::none: return "None";
    case Kind::boolean: return v.b ? "True" : "False";
    case Kind::integer: return std::to_string(v.i);
    case Kind::floating: return float_repr(v.f);
    case Kind::string: return v.s;
    case Kind::list:
    case Kind::dict: return to_repr(v);
    case Kind::ns: return "<Namespace>";
    case Kind::callable: return "<function " + v.fn->name + ">";
  }
  return "";
}

bool values_equal(const Value& a, const Value& b) {
  if (a.kind == b.kind && a.kind == Kind::list && a.list == b.list) return true;
  if (a.kind == b.kind && a.kind == Kind::dict && a.dict == b.dict) return true;
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::floating || b.kind == Kind::floating) return a.as_double() == b.as_double();
    return (a.kind == Kind::boolean ? int64_t(a.b) : a.i) == (b.kind == Kind::boolean ? int64_t(b.b) : b.i);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::undefined:
    case Kind::none: return true;
    case Kind::string: return a.s == b.s;
    case Kind::list: {
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k) {
        if (!values_equal((*a.list)[k], (*b.list)[k])) return false;
      }
      return true;
    }
    case Kind::dict: {
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, x] : a.dict->items) {
        const Value* y = b.dict->find(k);
        if (!y || !values_equal(x, *y)) return false;
      }
      return true;
    }
    default: return a.dict == b.dict && a.fn == b.fn;
  }
}

Result<int> values_compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Kind::floating && b.kind != Kind::floating) {
      int64_t x = a.kind == Kind::boolean ? a.b : a.i, y = b.kind == Kind::boolean ? b.b : b.i;
      return x < y ? -1 : x > y ? 1 : 0;
    }
    double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.kind == Kind::string && b.kind == Kind::string) return a.s < b.s ? -1 : a.s > b.s ? 1 : 0;
  if (a.kind == Kind::list && b.kind == Kind::list) {
    size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k) {
      KILN_ASSIGN_OR_RETURN(int c, values_compare((*a.list)[k], (*b.list)[k]));
      if (c) return c;
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  return invalid_argument("cannot compare {} with {}", kind_name(a.kind), kind_name(b.kind));
}

template <class Json>
Value from_json_impl(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null: return Value::none();
    case Json::value_t::boolean: return Value::boolean(j.template get<bool>());
    case Json::value_t::number_integer: return Value::integer(j.template get<int64_t>());
    case Json::value_t::number_unsigned: {
      uint64_t u = j.template get<uint64_t>();
      return u > uint64_t(INT64_MAX) ? Value::floating(double(u)) : Value::integer(int64_t(u));
    }
    case Json::value_t::number_float: return Value::floating(j.template get<double>());
    case Json::value_t::string: return Value::string(j.template get<std::string>());
    case Json::value_t::array: {
      Value v = Value::new_list();
      for (const auto& x : j) v.list->push_back(from_json_impl(x));
      return v;
    }
    case Json::value_t::object: {
      Value v = Value::new_dict();
      for (auto it = j.begin(); it != j.end(); ++it)
        v.dict->items.emplace_back(it.key(), from_json_impl(it.value()));
      return v;
    }
    default: return Value::none();
  }
}

Value from_json(const nlohmann::json& j) { return from_json_impl(j); }
Value from_json(const nlohmann::ordered_json& j) { return from_json_impl(j); }

static void json_string(std::string& out, const std::string& s) {
  static constexpr CharEscape kJson[] = {{'"', "\\\""}, {'\\', "\\\\"}, {'\n', "\\n"}, {'\r', "\\r"},
                                         {'\t', "\\t"}, {'\b', "\\b"},  {'\f', "\\f"}};
  out += '"';
  for (unsigned char c : s) {
    if (const std::string_view* text = find_escape(kJson, char(c))) {
      out += *text;
    } else if (c < 0x20) {
      out += fmt::format("\\u{:04x}", c);
    } else {
      out += char(c);
    }
  }
  out += '"';
}

static Status json_value(std::string& out, const Value& v, const JsonOptions& opt, int depth) {
  if (depth > 256) return resource_exhausted("tojson: nesting deeper than 256");
  if (out.size() > kTextLimit) return resource_exhausted("tojson: output larger than {} bytes", kTextLimit);
  const std::string& isep =
      !opt.item_sep.empty() ? opt.item_sep : (opt.indent >= 0 ? std::string(",") : ", ");
  const std::string& ksep = !opt.key_sep.empty() ? opt.key_sep : std::string(": ");
  auto newline = [&](int level) {
    if (opt.indent < 0) return;
    out += '\n';
    out.append(size_t(opt.indent) * size_t(level), ' ');
  };
  switch (v.kind) {
    case Kind::none: out += "null"; return {};
    case Kind::boolean: out += v.b ? "true" : "false"; return {};
    case Kind::integer: out += std::to_string(v.i); return {};
    case Kind::floating:
      if (std::isnan(v.f))
        out += "NaN";
      else if (std::isinf(v.f))
        out += v.f > 0 ? "Infinity" : "-Infinity";
      else
        out += float_repr(v.f);
      return {};
    case Kind::string: json_string(out, v.s); return {};
    case Kind::list: {
      if (v.list->empty()) {
        out += "[]";
        return {};
      }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += isep;
        newline(depth + 1);
        KILN_TRY(json_value(out, (*v.list)[k], opt, depth + 1));
      }
      newline(depth);
      out += ']';
      return {};
    }
    case Kind::dict:
    case Kind::ns: {
      if (v.dict->items.empty()) {
        out += "{}";
        return {};
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (opt.sort_keys) {
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      }
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += isep;
        newline(depth + 1);
        json_string(out, items[k]->first);
        out += ksep;
        KILN_TRY(json_value(out, items[k]->second, opt, depth + 1));
      }
      newline(depth);
      out += '}';
      return {};
    }
    default:
      return invalid_argument("tojson: a value of type {} is not JSON serializable", kind_name(v.kind));
  }
}

Result<std::string> to_json(const Value& v, const JsonOptions& opt) {
  std::string out;
  KILN_TRY(json_value(out, v, opt, 0));
  return out;
}

}  // namespace kiln::jinja
