// oneOf's exclusivity (json_schema_converter.h: SchemaConverter::overlapping_branches). Each branch is
// over-approximated by a Shape, the few facts that tell JSON values apart in the schemas people write: the
// value's JSON type, a finite set of values (const, enum), and for an object its required keys, the keys it
// may have (additionalProperties false) and its properties' shapes (pydantic's discriminated unions: a
// required "kind" whose const differs per branch). Two branches are exclusive when their shapes share no
// value. Every keyword a shape leaves out (pattern, minimum, items, ...) only widens it, and a schema without
// "type" accepts every type here, as JSON Schema says (the grammar is tighter): so a proof holds for any
// value a validator checks, whatever the grammar lets through.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "grammar/json_schema_converter.h"

namespace kiln::grammar {

namespace {

using Value = nlohmann::json;  // compared as JSON Schema compares values: key order aside, 1 == 1.0

// JSON types as bits; "integer" is a number.
constexpr uint8_t kNull = 1, kBoolean = 2, kObject = 4, kArray = 8, kString = 16, kNumber = 32, kAnyType = 63;

constexpr int kMaxDepth = 8;                    // schemas followed into properties, $ref and combinators
constexpr int64_t kMaxShapes = 10'000;          // schemas looked at for one oneOf; past it, shapes are wide
constexpr int64_t kMaxComparisons = 1'000'000;  // shape and value pairs compared for one oneOf
constexpr size_t kMaxMeet = 100'000;  // value pairs compared to intersect two value sets (past it: wider)
constexpr int kMaxValueDepth = 100;   // const / enum values nested deeper are not read

uint8_t type_bit(const Value& v) {
  switch (v.type()) {
    case Value::value_t::null: return kNull;
    case Value::value_t::boolean: return kBoolean;
    case Value::value_t::object: return kObject;
    case Value::value_t::array: return kArray;
    case Value::value_t::string: return kString;
    case Value::value_t::number_integer:
    case Value::value_t::number_unsigned:
    case Value::value_t::number_float: return kNumber;
    default: return 0;
  }
}

// The bits of a `type` keyword; every type when it is malformed (the converter names that error).
uint8_t type_bits(const Json& t) {
  const auto one = [](const Json& name) -> uint8_t {
    if (!name.is_string()) return kAnyType;
    const std::string& n = name.get_ref<const std::string&>();
    if (n == "null") return kNull;
    if (n == "boolean") return kBoolean;
    if (n == "object") return kObject;
    if (n == "array") return kArray;
    if (n == "string") return kString;
    if (n == "number" || n == "integer") return kNumber;
    return kAnyType;
  };
  if (!t.is_array()) return one(t);
  uint8_t bits = 0;
  for (const Json& name : t) bits |= one(name);
  return t.empty() ? kAnyType : bits;
}

bool shallow(const Json& v, int depth) {
  if (depth > kMaxValueDepth) return false;
  if (!v.is_structured()) return true;
  return std::all_of(v.begin(), v.end(), [&](const Json& x) { return shallow(x, depth + 1); });
}

// What a schema may accept, over-approximated: a value of one of `types`, one of `values` when they are set;
// an object with every key of `required`, only keys of `allowed` when set, and under a key of `props` a value
// that key's shape may accept.
struct Shape {
  uint8_t types = kAnyType;
  std::optional<std::vector<Value>> values;
  std::map<std::string, Shape> props;
  std::set<std::string> required;
  std::optional<std::set<std::string>> allowed;
};

// `v` as text that is equal for equal values: objects' keys sorted (nlohmann::json's map), and integral
// numbers written as integers (1.0 as 1).
std::string canonical(const Value& v) {
  const auto normal = [](const auto& self, const Value& x) -> Value {
    if (x.is_number_float()) {
      const double d = x.get<double>();
      if (d == std::floor(d) && std::abs(d) < 9.2e18) return Value(static_cast<int64_t>(d));
      if (d == std::floor(d) && d > 0 && d < 1.8e19) return Value(static_cast<uint64_t>(d));
      return x;
    }
    if (!x.is_structured()) return x;
    Value out = x.is_object() ? Value::object() : Value::array();
    if (x.is_object()) {
      for (const auto& [k, item] : x.items()) out[k] = self(self, item);
    } else {
      for (const Value& item : x) out.push_back(self(self, item));
    }
    return out;
  };
  return normal(normal, v).dump();
}

bool contains(const std::vector<Value>& values, const Value& v) {
  return std::find(values.begin(), values.end(), v) != values.end();
}

// Drops what the types rule out: values of other types; the object type when a required key is not allowed
// or has a shape that accepts nothing.
void normalize(Shape& s) {
  if (s.types & kObject) {
    for (const std::string& k : s.required) {
      const auto p = s.props.find(k);
      if ((s.allowed && s.allowed->count(k) == 0) || (p != s.props.end() && p->second.types == 0)) {
        s.types &= static_cast<uint8_t>(~kObject);
        break;
      }
    }
  }
  if (s.values) {
    std::erase_if(*s.values, [&](const Value& v) { return (type_bit(v) & s.types) == 0; });
    uint8_t t = 0;
    for (const Value& v : *s.values) t |= type_bit(v);
    s.types &= t;
  }
}

// Values both accept (a wider shape when the value sets are too large to compare).
Shape meet(Shape a, const Shape& b) {
  a.types &= b.types;
  if (b.values) {
    if (!a.values) {
      a.values = b.values;
    } else if (a.values->size() * b.values->size() <= kMaxMeet) {
      std::erase_if(*a.values, [&](const Value& v) { return !contains(*b.values, v); });
    }
  }
  for (const auto& [k, shape] : b.props) {
    const auto [it, fresh] = a.props.try_emplace(k, shape);
    if (!fresh) it->second = meet(std::move(it->second), shape);
  }
  a.required.insert(b.required.begin(), b.required.end());
  if (b.allowed) {
    if (!a.allowed) {
      a.allowed = b.allowed;
    } else {
      std::erase_if(*a.allowed, [&](const std::string& k) { return b.allowed->count(k) == 0; });
    }
  }
  normalize(a);
  return a;
}

// Values either accepts (or more).
Shape join(Shape a, const Shape& b) {
  if (a.types == 0) return b;
  if (b.types == 0) return a;
  if (a.values && b.values) {
    a.values->insert(a.values->end(), b.values->begin(), b.values->end());
  } else {
    a.values.reset();
  }
  // The object facts of the side that accepts objects, or what both sides' objects share.
  if ((a.types & kObject) == 0) {
    a.props = b.props;
    a.required = b.required;
    a.allowed = b.allowed;
  } else if (b.types & kObject) {
    for (auto it = a.props.begin(); it != a.props.end();) {
      const auto other = b.props.find(it->first);
      if (other == b.props.end()) {
        it = a.props.erase(it);
      } else {
        it->second = join(std::move(it->second), other->second);
        ++it;
      }
    }
    std::erase_if(a.required, [&](const std::string& k) { return b.required.count(k) == 0; });
    if (a.allowed && b.allowed) {
      a.allowed->insert(b.allowed->begin(), b.allowed->end());
    } else {
      a.allowed.reset();
    }
  }
  a.types |= b.types;
  return a;
}

// Shape and value comparisons left for one oneOf; past them, two branches count as overlapping (not shown
// exclusive).
struct Budget {
  int64_t left = kMaxComparisons;
  bool spend(size_t n) {
    left -= static_cast<int64_t>(n);
    return left >= 0;
  }
};

// Whether the shape may accept the value.
bool may_accept(const Shape& s, const Value& v, Budget& budget) {
  if ((type_bit(v) & s.types) == 0) return false;
  if (s.values) return !budget.spend(s.values->size()) || contains(*s.values, v);
  if (!v.is_object()) return true;
  for (const std::string& k : s.required) {
    if (!v.contains(k)) return false;
  }
  for (const auto& [k, item] : v.items()) {
    if (s.allowed && s.allowed->count(k) == 0) return false;
    const auto p = s.props.find(k);
    if (p != s.props.end() && !may_accept(p->second, item, budget)) return false;
  }
  return true;
}

bool may_overlap(const Shape& a, const Shape& b, Budget& budget);

// No object that `x` accepts is one `y` accepts: a key `x` requires is one `y` does not allow, or holds
// values of shapes that share none.
bool objects_exclusive(const Shape& x, const Shape& y, Budget& budget) {
  for (const std::string& k : x.required) {
    if (y.allowed && y.allowed->count(k) == 0) return true;
    const auto px = x.props.find(k), py = y.props.find(k);
    if (py == y.props.end()) continue;
    if (!may_overlap(px == x.props.end() ? Shape{} : px->second, py->second, budget)) return true;
  }
  return false;
}

bool may_overlap(const Shape& a, const Shape& b, Budget& budget) {
  if (!budget.spend(1)) return true;
  const uint8_t common = a.types & b.types;
  if (common == 0) return false;
  if (a.values && b.values) {
    if (!budget.spend(a.values->size() * b.values->size())) return true;
    return std::any_of(a.values->begin(), a.values->end(),
                       [&](const Value& v) { return contains(*b.values, v); });
  }
  if (a.values || b.values) {
    const Shape& finite = a.values ? a : b;
    const Shape& other = a.values ? b : a;
    return std::any_of(finite.values->begin(), finite.values->end(),
                       [&](const Value& v) { return may_accept(other, v, budget); });
  }
  // Only objects can tell the two apart.
  if (common != kObject) return true;
  return !objects_exclusive(a, b, budget) && !objects_exclusive(b, a, budget);
}

// Shapes of schemas, following $ref (through the converter's resolve) to a bounded depth and count.
class ShapeReader {
 public:
  explicit ShapeReader(std::function<const Json*(const std::string&)> resolve)
      : resolve_(std::move(resolve)) {}

  Shape read(const Json& s, int depth) {
    Shape out;
    if (depth > kMaxDepth || ++n_read_ > kMaxShapes) return out;
    if (s.is_boolean()) {
      if (!s.get<bool>()) out.types = 0;
      return out;
    }
    if (!s.is_object()) return out;
    if (const auto t = s.find("type"); t != s.end()) out.types = type_bits(*t);
    if (const auto c = s.find("const"); c != s.end() && shallow(*c, 0)) out.values = std::vector{Value(*c)};
    if (const auto e = s.find("enum"); e != s.end() && e->is_array() && shallow(*e, 0)) {
      Shape values;
      values.values.emplace();
      for (const Json& v : *e) values.values->emplace_back(v);
      out = meet(std::move(out), values);
    }
    if (const auto p = s.find("properties"); p != s.end() && p->is_object()) {
      for (const auto& [k, sub] : p->items()) out.props.emplace(k, read(sub, depth + 1));
      if (const auto a = s.find("additionalProperties"); a != s.end() && *a == Json(false)) {
        out.allowed.emplace();
        for (const auto& [k, sub] : p->items()) out.allowed->insert(k);
      }
    } else if (const auto a = s.find("additionalProperties"); a != s.end() && *a == Json(false)) {
      out.allowed.emplace();
    }
    if (const auto r = s.find("required"); r != s.end() && r->is_array()) {
      for (const Json& k : *r) {
        if (k.is_string()) out.required.insert(k.get<std::string>());
      }
    }
    if (const auto r = s.find("$ref"); r != s.end() && r->is_string()) {
      if (const Json* target = resolve_(r->get<std::string>()))
        out = meet(std::move(out), read(*target, depth + 1));
    }
    if (const auto all = s.find("allOf"); all != s.end() && all->is_array()) {
      for (const Json& m : *all) out = meet(std::move(out), read(m, depth + 1));
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      const auto any = s.find(key);
      if (any == s.end() || !any->is_array() || any->empty()) continue;
      Shape either;
      either.types = 0;  // accepts nothing: join's identity
      for (const Json& m : *any) either = join(std::move(either), read(m, depth + 1));
      out = meet(std::move(out), either);
    }
    normalize(out);
    return out;
  }

 private:
  std::function<const Json*(const std::string&)> resolve_;
  int64_t n_read_ = 0;
};

}  // namespace

std::optional<std::pair<size_t, size_t>> SchemaConverter::overlapping_branches(
    const Json& siblings, const std::vector<std::pair<size_t, const Json*>>& branches) const {
  ShapeReader reader([this](const std::string& ref) -> const Json* {
    Result<const Json*> target = resolve(ref, "#");
    return target.ok() ? *target : nullptr;
  });
  const Shape common = reader.read(siblings, 0);
  std::vector<Shape> shapes;
  for (const auto& [index, branch] : branches) shapes.push_back(meet(common, reader.read(*branch, 0)));
  // Only values (a oneOf of consts, however many): exclusive when no value is in two branches.
  if (std::all_of(shapes.begin(), shapes.end(), [](const Shape& x) { return x.values.has_value(); })) {
    std::unordered_map<std::string, size_t> owner;  // canonical value -> its first branch, in `shapes`
    for (size_t i = 0; i < shapes.size(); ++i) {
      for (const Value& v : *shapes[i].values) {
        const auto [it, fresh] = owner.emplace(canonical(v), i);
        if (!fresh && it->second != i) return std::pair{branches[it->second].first, branches[i].first};
      }
    }
    return std::nullopt;
  }
  Budget budget;
  for (size_t i = 0; i < shapes.size(); ++i) {
    for (size_t j = i + 1; j < shapes.size(); ++j) {
      if (may_overlap(shapes[i], shapes[j], budget)) return std::pair{branches[i].first, branches[j].first};
    }
  }
  return std::nullopt;
}

}  // namespace kiln::grammar
