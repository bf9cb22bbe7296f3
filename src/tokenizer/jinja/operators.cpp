// Binary operators and comparisons with Python semantics.
#include <cmath>
#include <limits>

#include "tokenizer/jinja/interp.h"

namespace kiln::jinja {
namespace {

int64_t as_int(const Value& v) { return v.kind == Kind::boolean ? int64_t(v.b) : v.i; }
bool is_int(const Value& v) { return v.kind == Kind::integer || v.kind == Kind::boolean; }

// Python's floor division and modulo for integers (b != 0).
int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
int64_t floor_mod(int64_t a, int64_t b) {
  int64_t m = a % b;
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

// `n * seq` for a string or list: sized before it is built.
Result<Value> repeat(Interp& in, int64_t count, const Value& b, const Expr& e) {
  const int64_t n = std::max<int64_t>(0, count);
  const size_t unit = b.kind == Kind::string ? b.s.size() : b.list->size() * sizeof(Value);
  if (unit > 0 && uint64_t(n) > in.limits().max_output_bytes / unit) {
    KILN_TRY(in.check_size(in.limits().max_output_bytes + 1, &e));
  }
  KILN_TRY(in.charge(b.kind == Kind::string ? int64_t(unit * uint64_t(n)) >> 10 : n * int64_t(b.list->size()),
                     &e));
  if (b.kind == Kind::string) {
    std::string out;
    out.reserve(unit * size_t(n));
    for (int64_t k = 0; k < n; ++k) out += b.s;
    return Value::string(std::move(out));
  }
  List items;
  for (int64_t k = 0; k < n; ++k) items.insert(items.end(), b.list->begin(), b.list->end());
  return Value::new_list(std::move(items));
}

// Integer + - * // % ** with Python's floor semantics; overflow is an error, not a wrap.
Result<Value> int_arith(Interp& in, const std::string& op, int64_t x, int64_t y, const Expr& e) {
  int64_t r = 0;
  bool overflow = false;
  if (op == "+") {
    overflow = __builtin_add_overflow(x, y, &r);
  } else if (op == "-") {
    overflow = __builtin_sub_overflow(x, y, &r);
  } else if (op == "*") {
    overflow = __builtin_mul_overflow(x, y, &r);
  } else if (op == "//" || op == "%") {
    if (y == 0) return in.error(&e, StatusCode::invalid_argument, "integer division or modulo by zero");
    if (x == std::numeric_limits<int64_t>::min() && y == -1) {
      overflow = true;
    } else {
      r = op == "//" ? floor_div(x, y) : floor_mod(x, y);
    }
  } else if (op == "**") {
    if (y < 0) return Value::floating(std::pow(double(x), double(y)));
    r = 1;
    for (int64_t k = 0; k < y && !overflow; ++k) {
      overflow = __builtin_mul_overflow(r, x, &r);
      if (r == 0 || r == 1) break;
      if (r == -1) {  // x == -1
        r = (y % 2) ? -1 : 1;
        break;
      }
    }
  } else {
    return in.error(&e, StatusCode::invalid_argument,
                    fmt::format("unsupported operand types for {}: int and int", op));
  }
  if (overflow) return in.error(&e, StatusCode::out_of_range, fmt::format("integer overflow in {}", op));
  return Value::integer(r);
}

}  // namespace

Result<Value> Interp::eval_binary(const Expr& e) {
  const std::string& op = e.name;
  KILN_ASSIGN_OR_RETURN(Value a, eval(*e.kids[0]));
  if (op == "and") return truthy(a) ? eval(*e.kids[1]) : a;
  if (op == "or") return truthy(a) ? a : eval(*e.kids[1]);
  KILN_ASSIGN_OR_RETURN(Value b, eval(*e.kids[1]));
  KILN_TRY(charge_touch({&a, &b}, nullptr, &e));
  auto bad = [&]() {
    return error(
        &e, StatusCode::invalid_argument,
        fmt::format("unsupported operand types for {}: {} and {}", op, kind_name(a.kind), kind_name(b.kind)));
  };
  if (op == "~") {
    std::string l = to_str(a), r = to_str(b);
    KILN_TRY(check_size(l.size() + r.size(), &e));
    KILN_TRY(charge(int64_t((l.size() + r.size()) >> 10), &e));
    return Value::string(l + r);
  }
  if (a.kind == Kind::undefined || b.kind == Kind::undefined) {
    return error(&e, StatusCode::invalid_argument,
                 fmt::format("'{}' is undefined (operand of {})", a.kind == Kind::undefined ? a.s : b.s, op));
  }
  if (op == "+") {
    if (a.kind == Kind::string && b.kind == Kind::string) {
      KILN_TRY(check_size(a.s.size() + b.s.size(), &e));
      KILN_TRY(charge(int64_t((a.s.size() + b.s.size()) >> 10), &e));  // one step per KiB copied
      return Value::string(a.s + b.s);
    }
    if (a.kind == Kind::list && b.kind == Kind::list) {
      KILN_TRY(charge(int64_t(a.list->size() + b.list->size()), &e));
      List items = *a.list;
      items.insert(items.end(), b.list->begin(), b.list->end());
      return Value::new_list(std::move(items));
    }
  }
  if (op == "%" && a.kind == Kind::string) {
    return error(&e, StatusCode::unimplemented,
                 "printf-style string formatting ('%' on a string) is not supported");
  }
  if (op == "*" && ((a.kind == Kind::string || a.kind == Kind::list) && is_int(b))) std::swap(a, b);
  if (op == "*" && is_int(a) && (b.kind == Kind::string || b.kind == Kind::list)) {
    return repeat(*this, as_int(a), b, e);
  }
  if (!a.is_number() || !b.is_number()) return bad();
  if (is_int(a) && is_int(b) && op != "/") return int_arith(*this, op, as_int(a), as_int(b), e);
  double x = a.as_double(), y = b.as_double();
  if (op == "+") return Value::floating(x + y);
  if (op == "-") return Value::floating(x - y);
  if (op == "*") return Value::floating(x * y);
  if (op == "**") return Value::floating(std::pow(x, y));
  if (y == 0.0) return error(&e, StatusCode::invalid_argument, "division by zero");
  if (op == "/") return Value::floating(x / y);
  if (op == "//") return Value::floating(std::floor(x / y));
  if (op == "%") {
    double m = std::fmod(x, y);
    if (m != 0 && ((m < 0) != (y < 0))) m += y;
    return Value::floating(m);
  }
  return bad();
}

static Result<bool> contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Kind::string:
      if (item.kind != Kind::string)
        return invalid_argument("'in <string>' requires a string, got {}", kind_name(item.kind));
      return container.s.find(item.s) != std::string::npos;
    case Kind::list:
      for (const auto& x : *container.list) {
        if (values_equal(x, item)) return true;
      }
      return false;
    case Kind::dict:
    case Kind::ns: return item.kind == Kind::string && container.dict->find(item.s) != nullptr;
    default: return invalid_argument("argument of type {} is not iterable", kind_name(container.kind));
  }
}

Result<Value> Interp::eval_compare(const Expr& e) {
  KILN_ASSIGN_OR_RETURN(Value left, eval(*e.kids[0]));
  for (size_t k = 0; k < e.ops.size(); ++k) {
    KILN_ASSIGN_OR_RETURN(Value right, eval(*e.kids[k + 1]));
    KILN_TRY(charge_touch({&left, &right}, nullptr, &e));
    const std::string& op = e.ops[k];
    bool r = false;
    if (op == "==") {
      r = values_equal(left, right);
    } else if (op == "!=") {
      r = !values_equal(left, right);
    } else if (op == "in" || op == "notin") {
      auto c = contains(right, left);
      if (!c.ok()) return error(&e, c.status().code(), c.status().message());
      r = *c != (op == "notin");
    } else {
      auto c = values_compare(left, right);
      if (!c.ok()) return error(&e, c.status().code(), c.status().message() + " with " + op);
      r = op == "<" ? *c < 0 : op == "<=" ? *c <= 0 : op == ">" ? *c > 0 : *c >= 0;
    }
    if (!r) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

}  // namespace kiln::jinja
