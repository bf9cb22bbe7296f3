// GGUF metadata values and the File's lookups and typed getters.
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "formats/gguf.h"
#include "formats/mmap.h"

namespace kiln::gguf {

const char* value_type_name(ValueType type) {
  switch (type) {
    case ValueType::uint8: return "uint8";
    case ValueType::int8: return "int8";
    case ValueType::uint16: return "uint16";
    case ValueType::int16: return "int16";
    case ValueType::uint32: return "uint32";
    case ValueType::int32: return "int32";
    case ValueType::float32: return "float32";
    case ValueType::boolean: return "bool";
    case ValueType::string: return "string";
    case ValueType::array: return "array";
    case ValueType::uint64: return "uint64";
    case ValueType::int64: return "int64";
    case ValueType::float64: return "float64";
  }
  return "unknown";
}

Value Value::array(ValueType elem_type, std::vector<Value> items) {
  auto arr = std::make_shared<Array>();
  arr->elem_type = elem_type;
  arr->items = std::move(items);
  return {ValueType::array, std::move(arr)};
}

bool Value::is_integer() const {
  switch (type) {
    case ValueType::uint8:
    case ValueType::int8:
    case ValueType::uint16:
    case ValueType::int16:
    case ValueType::uint32:
    case ValueType::int32:
    case ValueType::uint64:
    case ValueType::int64: return true;
    default: return false;
  }
}

const Array* Value::as_array() const {
  const auto* p = std::get_if<std::shared_ptr<Array>>(&v);
  return p != nullptr ? p->get() : nullptr;
}

std::string Value::to_display_string(size_t max_items) const {
  if (const auto* u = std::get_if<uint64_t>(&v)) return fmt::format("{}", *u);
  if (const auto* i = std::get_if<int64_t>(&v)) return fmt::format("{}", *i);
  if (const auto* d = std::get_if<double>(&v)) return fmt::format("{}", *d);
  if (const auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  if (const auto* s = std::get_if<std::string>(&v)) {
    constexpr size_t kMaxChars = 80;
    if (s->size() <= kMaxChars) return fmt::format("\"{}\"", *s);
    return fmt::format("\"{}...\" ({} bytes)", s->substr(0, kMaxChars), s->size());
  }
  const Array* arr = as_array();
  if (arr == nullptr) return "?";
  std::string out = fmt::format("[{} x {}: ", arr->items.size(), value_type_name(arr->elem_type));
  for (size_t i = 0; i < arr->items.size() && i < max_items; ++i) {
    if (i > 0) out += ", ";
    out += arr->items[i].to_display_string(max_items);
  }
  if (arr->items.size() > max_items) out += ", ...";
  out += "]";
  return out;
}

int64_t TensorInfo::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // the reader checked this product fits in int64
  return n;
}

const Value* File::find(std::string_view key) const {
  auto it = metadata_index_.find(std::string(key));
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].second;
}

void File::release(std::string_view key) {
  auto it = metadata_index_.find(std::string(key));
  if (it == metadata_index_.end()) return;
  metadata_.erase(metadata_.begin() + static_cast<std::ptrdiff_t>(it->second));
  metadata_index_.clear();
  for (size_t i = 0; i < metadata_.size(); ++i) metadata_index_.emplace(metadata_[i].first, i);
}

void File::drop_pages(const void* p, size_t n) const {
  if (map_ != nullptr) map_->drop_pages(p, n);
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::string File::architecture() const {
  const Value* v = find("general.architecture");
  const std::string* s = v != nullptr ? v->as_string() : nullptr;
  return s != nullptr ? *s : std::string();
}

namespace {

Status wrong_type(const std::string& file, std::string_view key, const Value& v, const char* wanted) {
  return invalid_argument("{}: metadata key '{}' has type {} (value {}), expected {}", file, key,
                          value_type_name(v.type), v.to_display_string(4), wanted);
}

// An integer value as int64/uint64, or nullopt when it does not fit the wanted signedness.
std::optional<uint64_t> as_u64(const Value& v) {
  if (const auto* u = std::get_if<uint64_t>(&v.v)) return *u;
  if (const auto* i = std::get_if<int64_t>(&v.v); i != nullptr && *i >= 0) return static_cast<uint64_t>(*i);
  return std::nullopt;
}
std::optional<int64_t> as_i64(const Value& v) {
  if (const auto* i = std::get_if<int64_t>(&v.v)) return *i;
  if (const auto* u = std::get_if<uint64_t>(&v.v);
      u != nullptr && *u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return static_cast<int64_t>(*u);
  }
  return std::nullopt;
}
std::optional<double> as_f64(const Value& v) {
  if (const auto* d = std::get_if<double>(&v.v)) return *d;
  if (const auto* u = std::get_if<uint64_t>(&v.v)) return static_cast<double>(*u);
  if (const auto* i = std::get_if<int64_t>(&v.v)) return static_cast<double>(*i);
  return std::nullopt;
}

}  // namespace

Result<std::string> File::get_string(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return not_found("{}: metadata key '{}' is missing", name_, key);
  if (const std::string* s = v->as_string()) return *s;
  return wrong_type(name_, key, *v, "string");
}

Result<uint64_t> File::get_uint(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return not_found("{}: metadata key '{}' is missing", name_, key);
  if (!v->is_integer()) return wrong_type(name_, key, *v, "an unsigned integer");
  if (auto u = as_u64(*v)) return *u;
  return invalid_argument("{}: metadata key '{}' = {} is negative", name_, key, v->to_display_string());
}

Result<int64_t> File::get_int(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return not_found("{}: metadata key '{}' is missing", name_, key);
  if (!v->is_integer()) return wrong_type(name_, key, *v, "an integer");
  if (auto i = as_i64(*v)) return *i;
  return invalid_argument("{}: metadata key '{}' = {} does not fit int64", name_, key,
                          v->to_display_string());
}

Result<double> File::get_float(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return not_found("{}: metadata key '{}' is missing", name_, key);
  if (!v->is_integer() && !v->is_float()) return wrong_type(name_, key, *v, "a number");
  return *as_f64(*v);
}

Result<bool> File::get_bool(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return not_found("{}: metadata key '{}' is missing", name_, key);
  if (const auto* b = std::get_if<bool>(&v->v)) return *b;
  return wrong_type(name_, key, *v, "bool");
}

namespace {

Result<const Array*> array_of(const File& f, std::string_view key, const char* wanted) {
  const Value* v = f.find(key);
  if (v == nullptr) return not_found("{}: metadata key '{}' is missing", f.name(), key);
  const Array* arr = v->as_array();
  if (arr == nullptr) return wrong_type(f.name(), key, *v, wanted);
  return arr;
}

// The items of arr converted by convert (Value -> std::optional<T>); fail(i, item) makes the error for the
// first item that does not convert.
template <class T, class Convert, class Fail>
Result<std::vector<T>> convert_items(const Array& arr, Convert&& convert, Fail&& fail) {
  std::vector<T> out;
  out.reserve(arr.items.size());
  for (size_t i = 0; i < arr.items.size(); ++i) {
    const std::optional<T> x = convert(arr.items[i]);
    if (!x) return fail(i, arr.items[i]);
    out.push_back(*x);
  }
  return out;
}

}  // namespace

Result<std::vector<std::string>> File::get_string_array(std::string_view key) const {
  KILN_ASSIGN_OR_RETURN(const Array* arr, array_of(*this, key, "array of string"));
  if (arr->elem_type != ValueType::string) {
    return invalid_argument("{}: metadata key '{}' is an array of {}, expected array of string", name_, key,
                            value_type_name(arr->elem_type));
  }
  std::vector<std::string> out;
  out.reserve(arr->items.size());
  for (const Value& item : arr->items) out.push_back(*item.as_string());
  return out;
}

Result<std::vector<double>> File::get_float_array(std::string_view key) const {
  KILN_ASSIGN_OR_RETURN(const Array* arr, array_of(*this, key, "array of numbers"));
  return convert_items<double>(*arr, as_f64, [&](size_t, const Value&) {
    return invalid_argument("{}: metadata key '{}' is an array of {}, expected numbers", name_, key,
                            value_type_name(arr->elem_type));
  });
}

Result<std::vector<int64_t>> File::get_int_array(std::string_view key) const {
  KILN_ASSIGN_OR_RETURN(const Array* arr, array_of(*this, key, "array of integers"));
  auto integer = [](const Value& item) { return item.is_integer() ? as_i64(item) : std::nullopt; };
  return convert_items<int64_t>(*arr, integer, [&](size_t i, const Value& item) {
    return invalid_argument("{}: metadata key '{}'[{}] = {} ({}) is not an int64", name_, key, i,
                            item.to_display_string(), value_type_name(item.type));
  });
}

Result<std::string> File::get_string_or(std::string_view key, std::string fallback) const {
  if (find(key) == nullptr) return fallback;
  return get_string(key);
}
Result<uint64_t> File::get_uint_or(std::string_view key, uint64_t fallback) const {
  if (find(key) == nullptr) return fallback;
  return get_uint(key);
}
Result<double> File::get_float_or(std::string_view key, double fallback) const {
  if (find(key) == nullptr) return fallback;
  return get_float(key);
}
Result<bool> File::get_bool_or(std::string_view key, bool fallback) const {
  if (find(key) == nullptr) return fallback;
  return get_bool(key);
}

}  // namespace kiln::gguf
