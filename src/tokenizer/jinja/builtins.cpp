// Attribute/item access, iteration, methods of str/dict, and the global functions HF exposes.
#include <fmt/format.h>

#include <algorithm>
#include <ctime>

#include "tokenizer/jinja/interp.h"
#include "tokenizer/jinja/strutil.h"

namespace kiln::jinja {
namespace {

Value string_list(const std::vector<std::string>& parts) {
  Value v = Value::new_list();
  for (const auto& p : parts) v.list->push_back(Value::string(p));
  return v;
}

Result<const std::string*> opt_string_arg(const CallArgs& a, size_t k, const char* what) {
  if (a.pos.size() <= k || a.pos[k].kind == Kind::none) return static_cast<const std::string*>(nullptr);
  if (a.pos[k].kind != Kind::string)
    return invalid_argument("{}: expected a string, got {}", what, kind_name(a.pos[k].kind));
  return &a.pos[k].s;
}

Result<bool> prefix_match(const Value& s, const Value& arg, bool suffix) {
  auto one = [&](const std::string& p) {
    if (p.size() > s.s.size()) return false;
    return suffix ? s.s.compare(s.s.size() - p.size(), p.size(), p) == 0 : s.s.compare(0, p.size(), p) == 0;
  };
  if (arg.kind == Kind::string) return one(arg.s);
  if (arg.kind == Kind::list) {
    for (const auto& x : *arg.list) {
      if (x.kind == Kind::string && one(x.s)) return true;
    }
    return false;
  }
  return invalid_argument("{}with: expected a string or a tuple, got {}", suffix ? "ends" : "starts",
                          kind_name(arg.kind));
}

Result<Value> string_method(Interp& in, const Value& obj, const std::string& name, const CallArgs& a,
                            const Expr* at) {
  const std::string& s = obj.s;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    KILN_ASSIGN_OR_RETURN(const std::string* chars, opt_string_arg(a, 0, name.c_str()));
    return Value::string(py_strip(s, chars, name[0] == 's' ? 'b' : name[0]));
  }
  if (name == "split" || name == "rsplit") {
    KILN_ASSIGN_OR_RETURN(const std::string* sep, opt_string_arg(a, 0, "split"));
    if (sep && sep->empty()) return invalid_argument("split: empty separator");
    long maxsplit = a.pos.size() > 1 && a.pos[1].kind == Kind::integer ? long(a.pos[1].i) : -1;
    if (const Value* m = a.kwarg("maxsplit")) maxsplit = m->kind == Kind::integer ? long(m->i) : -1;
    if (name == "rsplit" && maxsplit >= 0) return unimplemented("rsplit with maxsplit is not supported");
    KILN_TRY(in.charge(int64_t(s.size() >> 6), at));
    return string_list(py_split(s, sep, maxsplit));
  }
  if (name == "startswith" || name == "endswith") {
    if (a.pos.empty()) return invalid_argument("{} needs an argument", name);
    KILN_ASSIGN_OR_RETURN(bool r, prefix_match(obj, a.pos[0], name == "endswith"));
    return Value::boolean(r);
  }
  if (name == "upper") return Value::string(py_upper(s));
  if (name == "lower") return Value::string(py_lower(s));
  if (name == "title") return Value::string(py_title(s));
  if (name == "capitalize") return Value::string(py_capitalize(s));
  if (name == "replace") {
    if (a.pos.size() < 2 || a.pos[0].kind != Kind::string || a.pos[1].kind != Kind::string) {
      return invalid_argument("replace needs two string arguments");
    }
    long count = a.pos.size() > 2 && a.pos[2].kind == Kind::integer ? long(a.pos[2].i) : -1;
    size_t worst = s.size() + (code_point_count(s) + 1) * a.pos[1].s.size();
    if (worst > in.limits().max_output_bytes) {
      std::string r = py_replace(s, a.pos[0].s, "", count);  // count the matches without building the result
      size_t matches =
          a.pos[0].s.empty() ? code_point_count(s) + 1 : (s.size() - r.size()) / a.pos[0].s.size();
      KILN_TRY(in.check_size(r.size() + matches * a.pos[1].s.size(), at));
    }
    return Value::string(py_replace(s, a.pos[0].s, a.pos[1].s, count));
  }
  if (name == "find") {
    if (a.pos.empty() || a.pos[0].kind != Kind::string)
      return invalid_argument("find needs a string argument");
    size_t p = s.find(a.pos[0].s);
    return Value::integer(p == std::string::npos ? -1 : int64_t(code_point_count(s.substr(0, p))));
  }
  if (name == "count") {
    if (a.pos.empty() || a.pos[0].kind != Kind::string || a.pos[0].s.empty()) {
      return invalid_argument("count needs a non-empty string argument");
    }
    int64_t n = 0;
    for (size_t p = s.find(a.pos[0].s); p != std::string::npos; p = s.find(a.pos[0].s, p + a.pos[0].s.size()))
      ++n;
    return Value::integer(n);
  }
  if (name == "join") {
    if (a.pos.empty()) return invalid_argument("join needs an argument");
    KILN_ASSIGN_OR_RETURN(List items, iterate(a.pos[0]));
    std::string out;
    for (size_t k = 0; k < items.size(); ++k) {
      if (k) out += s;
      out += to_str(items[k]);
      KILN_TRY(in.check_size(out.size(), at));
    }
    return Value::string(std::move(out));
  }
  if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isalnum") {
    if (s.empty()) return Value::boolean(false);
    for (unsigned char c : s) {
      bool ok = name == "isdigit"   ? std::isdigit(c) != 0
                : name == "isspace" ? is_py_space(c)
                : name == "isalpha" ? std::isalpha(c) != 0
                                    : std::isalnum(c) != 0;
      if (!ok) return Value::boolean(false);
    }
    return Value::boolean(true);
  }
  return unimplemented("string method '{}' is not supported", name);
}

Result<Value> dict_method(const Value& obj, const std::string& name, const CallArgs& a) {
  const Dict& d = *obj.dict;
  if (name == "items") {
    Value v = Value::new_list();
    for (const auto& [k, x] : d.items) v.list->push_back(Value::new_tuple({Value::string(k), x}));
    return v;
  }
  if (name == "keys" || name == "values") {
    Value v = Value::new_list();
    for (const auto& [k, x] : d.items) v.list->push_back(name == "keys" ? Value::string(k) : x);
    return v;
  }
  if (name == "get") {
    if (a.pos.empty()) return invalid_argument("get needs a key");
    const Value* x = a.pos[0].kind == Kind::string ? d.find(a.pos[0].s) : nullptr;
    if (x) return *x;
    return a.pos.size() > 1 ? a.pos[1] : Value::none();
  }
  return unimplemented("dict method '{}' is not supported", name);
}

}  // namespace

bool has_method(const Value& obj, const std::string& name) {
  static const char* const str_methods[] = {"strip",      "lstrip",   "rstrip",  "split",  "rsplit",
                                            "startswith", "endswith", "upper",   "lower",  "title",
                                            "capitalize", "replace",  "find",    "count",  "join",
                                            "isdigit",    "isspace",  "isalpha", "isalnum"};
  static const char* const dict_methods[] = {"items", "keys", "values", "get"};
  static const char* const mutators[] = {"append", "extend",     "pop",  "insert",  "remove", "clear",
                                         "update", "setdefault", "sort", "reverse", "popitem"};
  if (obj.kind == Kind::string) {
    for (const char* m : str_methods) {
      if (name == m) return true;
    }
  }
  if (obj.kind == Kind::dict) {
    for (const char* m : dict_methods) {
      if (name == m) return true;
    }
  }
  if (obj.kind == Kind::list || obj.kind == Kind::dict) {
    for (const char* m : mutators) {
      if (name == m) return true;
    }
  }
  return false;
}

Result<Value> call_method(Interp& in, const Value& obj, const std::string& name, const CallArgs& args,
                          const Expr* at) {
  Result<Value> r = Status(StatusCode::internal, "no method");
  if (obj.kind == Kind::string) {
    r = string_method(in, obj, name, args, at);
  } else if (obj.kind == Kind::dict &&
             (name == "items" || name == "keys" || name == "values" || name == "get")) {
    r = dict_method(obj, name, args);
  } else {
    // Hugging Face renders with ImmutableSandboxedEnvironment: lists and dicts cannot be modified.
    r = invalid_argument("{}.{}() modifies a {}, which the immutable sandbox forbids", kind_name(obj.kind),
                         name, kind_name(obj.kind));
  }
  if (!r.ok()) return in.error(at, r.status().code(), r.status().message());
  return r;
}

Result<Value> get_attr(const Value& obj, const std::string& name) {
  if (obj.kind == Kind::dict || obj.kind == Kind::ns) {
    if (const Value* v = obj.dict->find(name)) return *v;
  }
  return Value::undefined(name);
}

Result<Value> get_item(const Value& obj, const Value& key) {
  if ((obj.kind == Kind::dict || obj.kind == Kind::ns) && key.kind == Kind::string) {
    if (const Value* v = obj.dict->find(key.s)) return *v;
    return Value::undefined(key.s);
  }
  if ((obj.kind == Kind::list || obj.kind == Kind::string) &&
      (key.kind == Kind::integer || key.kind == Kind::boolean)) {
    int64_t k = key.kind == Kind::boolean ? int64_t(key.b) : key.i;
    if (obj.kind == Kind::list) {
      int64_t n = int64_t(obj.list->size());
      if (k < 0) k += n;
      if (k < 0 || k >= n) return Value::undefined(fmt::format("[{}]", key.i));
      return (*obj.list)[size_t(k)];
    }
    auto offs = code_point_offsets(obj.s);
    int64_t n = int64_t(offs.size()) - 1;
    if (k < 0) k += n;
    if (k < 0 || k >= n) return Value::undefined(fmt::format("[{}]", key.i));
    return Value::string(obj.s.substr(offs[size_t(k)], offs[size_t(k) + 1] - offs[size_t(k)]));
  }
  if (key.kind == Kind::string) return get_attr(obj, key.s);
  return Value::undefined(to_repr(key));
}

Result<Value> get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  auto as_index = [](const Value& v, const char* what) -> Result<std::optional<int64_t>> {
    if (v.kind == Kind::none || v.kind == Kind::undefined) return std::optional<int64_t>();
    if (v.kind != Kind::integer)
      return invalid_argument("slice {} must be an integer, got {}", what, kind_name(v.kind));
    return std::optional<int64_t>(v.i);
  };
  KILN_ASSIGN_OR_RETURN(auto b, as_index(start, "start"));
  KILN_ASSIGN_OR_RETURN(auto e, as_index(stop, "stop"));
  KILN_ASSIGN_OR_RETURN(auto st, as_index(step, "step"));
  int64_t s = st.value_or(1);
  if (s == 0) return invalid_argument("slice step cannot be zero");
  std::vector<size_t> offs;
  int64_t n = 0;
  if (obj.kind == Kind::list) {
    n = int64_t(obj.list->size());
  } else if (obj.kind == Kind::string) {
    offs = code_point_offsets(obj.s);
    n = int64_t(offs.size()) - 1;
  } else {
    return invalid_argument("cannot slice a {}", kind_name(obj.kind));
  }
  // Python's slice.indices().
  auto clamp = [&](std::optional<int64_t> v, int64_t def) {
    if (!v) return def;
    int64_t x = *v;
    if (x < 0) x += n;
    if (s > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  int64_t lo = clamp(b, s > 0 ? 0 : n - 1), hi = clamp(e, s > 0 ? n : -1);
  List items;
  std::string str;
  for (int64_t k = lo; s > 0 ? k < hi : k > hi; k += s) {
    if (obj.kind == Kind::list)
      items.push_back((*obj.list)[size_t(k)]);
    else
      str.append(obj.s, offs[size_t(k)], offs[size_t(k) + 1] - offs[size_t(k)]);
  }
  if (obj.kind == Kind::list) {
    Value out = Value::new_list(std::move(items));
    out.is_tuple = obj.is_tuple;
    return out;
  }
  return Value::string(std::move(str));
}

Result<List> iterate(const Value& v) {
  switch (v.kind) {
    case Kind::undefined: return List{};
    case Kind::list: return *v.list;
    case Kind::dict: {
      List keys;
      for (const auto& [k, x] : v.dict->items) keys.push_back(Value::string(k));
      return keys;
    }
    case Kind::string: {
      // One value per character (~100 bytes each): a long string would turn into gigabytes.
      if (v.s.size() > kMaxIteratedStringBytes) {
        return resource_exhausted("iterating over a string of {} bytes (more than {}) is not supported",
                                  v.s.size(), kMaxIteratedStringBytes);
      }
      List chars;
      auto offs = code_point_offsets(v.s);
      for (size_t k = 0; k + 1 < offs.size(); ++k)
        chars.push_back(Value::string(v.s.substr(offs[k], offs[k + 1] - offs[k])));
      return chars;
    }
    default: return invalid_argument("a {} is not iterable", kind_name(v.kind));
  }
}

namespace {

Value builtin(const std::string& name, std::function<Result<Value>(Interp&, const CallArgs&)> f) {
  Value v;
  v.kind = Kind::callable;
  v.fn = std::make_shared<Callable>();
  v.fn->name = name;
  v.fn->builtin = std::move(f);
  return v;
}

Result<Value> range_fn(Interp& in, const CallArgs& a) {
  int64_t start = 0, stop = 0, step = 1;
  for (const auto& x : a.pos) {
    if (x.kind != Kind::integer) return invalid_argument("range() needs integers, got {}", kind_name(x.kind));
  }
  if (a.pos.size() == 1) {
    stop = a.pos[0].i;
  } else if (a.pos.size() == 2 || a.pos.size() == 3) {
    start = a.pos[0].i;
    stop = a.pos[1].i;
    if (a.pos.size() == 3) step = a.pos[2].i;
  } else {
    return invalid_argument("range() takes 1 to 3 arguments, got {}", a.pos.size());
  }
  if (step == 0) return invalid_argument("range() step must not be zero");
  // Item count without overflow: the span fits in uint64_t.
  uint64_t count = 0;
  if (step > 0 ? stop > start : stop < start) {
    uint64_t span = step > 0 ? uint64_t(stop) - uint64_t(start) : uint64_t(start) - uint64_t(stop);
    uint64_t st = step > 0 ? uint64_t(step) : uint64_t(0) - uint64_t(step);
    count = span / st + (span % st != 0);
  }
  if (count > uint64_t(in.limits().max_steps)) {
    return resource_exhausted("range() of {} items exceeds the template step budget of {}", int64_t(count),
                              in.limits().max_steps);
  }
  KILN_TRY(in.charge(int64_t(count), nullptr));
  List items;
  for (int64_t k = 0; k < int64_t(count); ++k) items.push_back(Value::integer(start + k * step));
  return Value::new_list(std::move(items));
}

Result<Value> make_dict(const CallArgs& a, bool ns) {
  Value v = ns ? Value::new_namespace() : Value::new_dict();
  for (const auto& x : a.pos) {
    if (x.kind != Kind::dict)
      return invalid_argument("{}() takes a dict positional argument, got {}", ns ? "namespace" : "dict",
                              kind_name(x.kind));
    for (const auto& [k, y] : x.dict->items) v.dict->set(k, y);
  }
  for (const auto& [k, y] : a.kw) {
    if (ns && !k.empty() && k[0] == '_')
      return invalid_argument("namespace attributes cannot start with '_': {}", k);
    v.dict->set(k, y);
  }
  return v;
}

}  // namespace

void add_global_functions(Frame& g) {
  g["range"] = builtin("range", range_fn);
  g["namespace"] = builtin("namespace", [](Interp&, const CallArgs& a) { return make_dict(a, true); });
  g["dict"] = builtin("dict", [](Interp&, const CallArgs& a) { return make_dict(a, false); });
  g["raise_exception"] = builtin("raise_exception", [](Interp&, const CallArgs& a) -> Result<Value> {
    return invalid_argument("raise_exception: {}", a.pos.empty() ? std::string() : to_str(a.pos[0]));
  });
  g["strftime_now"] = builtin("strftime_now", [](Interp&, const CallArgs& a) -> Result<Value> {
    if (a.pos.size() != 1 || a.pos[0].kind != Kind::string)
      return invalid_argument("strftime_now needs a format string");
    std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[256];
    size_t n = std::strftime(buf, sizeof buf, a.pos[0].s.c_str(), &tm);
    if (n == 0 && !a.pos[0].s.empty())
      return invalid_argument("strftime_now: format too long or empty result");
    return Value::string(std::string(buf, n));
  });
}

}  // namespace kiln::jinja
