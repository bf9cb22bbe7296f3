// GGUF v3 writer: metadata in insertion order, tensor data aligned, files written via temp + rename.
#include <fmt/ranges.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <unordered_set>

#include "formats/gguf.h"
#include "formats/output_file.h"

namespace kiln::gguf {

namespace {

class Out {
 public:
  explicit Out(std::vector<uint8_t>& b) : b_(b) {}
  template <class T>
  void put(T x) {
    size_t n = b_.size();
    b_.resize(n + sizeof(T));
    std::memcpy(b_.data() + n, &x, sizeof(T));
  }
  void put_string(std::string_view s) {
    put<uint64_t>(s.size());
    b_.insert(b_.end(), s.begin(), s.end());
  }
  void pad_to(uint64_t align) {
    while (b_.size() % align != 0) b_.push_back(0);
  }

 private:
  std::vector<uint8_t>& b_;
};

// Puts *p as a T; false (nothing put) when p is null: the value holds another type.
template <class T, class U>
bool put_as(Out& out, const U* p) {
  if (p == nullptr) return false;
  out.put(static_cast<T>(*p));
  return true;
}

// Writes a value's payload (not its type tag). Error when the variant does not match `type`.
Status put_value(Out& out, const Value& v, ValueType type, std::string_view key) {
  if (v.type != type) {
    return invalid_argument("gguf writer: key '{}': array element of type {} in an array of {}", key,
                            value_type_name(v.type), value_type_name(type));
  }
  const auto* u = std::get_if<uint64_t>(&v.v);
  const auto* i = std::get_if<int64_t>(&v.v);
  const auto* d = std::get_if<double>(&v.v);
  bool ok = true;
  switch (type) {
    case ValueType::uint8: ok = put_as<uint8_t>(out, u); break;
    case ValueType::uint16: ok = put_as<uint16_t>(out, u); break;
    case ValueType::uint32: ok = put_as<uint32_t>(out, u); break;
    case ValueType::uint64: ok = put_as<uint64_t>(out, u); break;
    case ValueType::int8: ok = put_as<int8_t>(out, i); break;
    case ValueType::int16: ok = put_as<int16_t>(out, i); break;
    case ValueType::int32: ok = put_as<int32_t>(out, i); break;
    case ValueType::int64: ok = put_as<int64_t>(out, i); break;
    case ValueType::float32: ok = put_as<float>(out, d); break;
    case ValueType::float64: ok = put_as<double>(out, d); break;
    case ValueType::boolean: ok = put_as<uint8_t>(out, std::get_if<bool>(&v.v)); break;
    case ValueType::string: {
      const std::string* s = v.as_string();
      ok = s != nullptr;
      if (ok) out.put_string(*s);
      break;
    }
    case ValueType::array: {
      const Array* a = v.as_array();
      ok = a != nullptr;
      if (!ok) break;
      out.put(static_cast<uint32_t>(a->elem_type));
      out.put<uint64_t>(a->items.size());
      for (const Value& item : a->items) KILN_TRY(put_value(out, item, a->elem_type, key));
      break;
    }
  }
  if (!ok)
    return invalid_argument("gguf writer: key '{}': value does not hold a {}", key, value_type_name(type));
  return {};
}

}  // namespace

void Writer::set(std::string key, Value value) {
  for (auto& [k, v] : metadata_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(std::move(key), std::move(value));
}

Result<uint64_t> Writer::check_tensor(const std::string& name, const std::vector<int64_t>& shape,
                                      DType type) const {
  if (name.empty()) return invalid_argument("gguf writer: tensor name is empty");
  for (const auto& t : tensors_) {
    if (t.name == name) return invalid_argument("gguf writer: tensor '{}': duplicate name", name);
  }
  if (!dtype_info(type).gguf) {
    return invalid_argument(
        "gguf writer: tensor '{}' is {}: FP8 weights have no GGUF type (write them as bf16, "
        "f16, q8_0 or f32)",
        name, dtype_name(type));
  }
  if (shape.empty() || shape.size() > 4) {
    return invalid_argument("gguf writer: tensor '{}': {} dims, expected 1..4", name, shape.size());
  }
  int64_t n = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] <= 0 || n > std::numeric_limits<int64_t>::max() / shape[d]) {
      return invalid_argument("gguf writer: tensor '{}': dims[{}] = {} is not positive or overflows", name, d,
                              shape[d]);
    }
    n *= shape[d];
  }
  KILN_ASSIGN_OR_RETURN(int64_t row, dtype_row_bytes(type, shape[0]));
  int64_t rows = n / shape[0];
  if (row != 0 && rows > std::numeric_limits<int64_t>::max() / row) {
    return invalid_argument("gguf writer: tensor '{}': byte size overflows", name);
  }
  return static_cast<uint64_t>(row * rows);
}

Status Writer::add_tensor(std::string name, std::vector<int64_t> shape, DType type,
                          std::span<const uint8_t> data) {
  KILN_ASSIGN_OR_RETURN(const uint64_t n_bytes, check_tensor(name, shape, type));
  if (n_bytes != data.size()) {
    return invalid_argument("gguf writer: tensor '{}': shape [{}] of {} needs {} bytes, got {}", name,
                            fmt::join(shape, ", "), dtype_name(type), n_bytes, data.size());
  }
  tensors_.push_back(
      {std::move(name), std::move(shape), type, n_bytes, std::vector<uint8_t>(data.begin(), data.end()), {}});
  return {};
}

Status Writer::add_tensor_lazy(std::string name, std::vector<int64_t> shape, DType type, TensorFill fill) {
  KILN_ASSIGN_OR_RETURN(const uint64_t n_bytes, check_tensor(name, shape, type));
  if (!fill) return invalid_argument("gguf writer: tensor '{}': no fill function", name);
  tensors_.push_back({std::move(name), std::move(shape), type, n_bytes, {}, std::move(fill)});
  return {};
}

Status Writer::tensor_bytes(const PendingTensor& t, std::vector<uint8_t>& scratch,
                            std::span<const uint8_t>& out) const {
  if (!t.fill) {
    out = t.data;
    return {};
  }
  scratch.assign(t.n_bytes, 0);
  KILN_TRY(t.fill(scratch));
  out = scratch;
  return {};
}

Result<std::vector<uint8_t>> Writer::header() const {
  if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0 || alignment_ > UINT32_MAX) {
    return invalid_argument("gguf writer: alignment {} is not a power of two", alignment_);
  }
  bool has_alignment_key = false;
  for (const auto& [k, v] : metadata_) {
    if (k != "general.alignment") continue;
    has_alignment_key = true;
    const auto* u = std::get_if<uint64_t>(&v.v);
    if (v.type != ValueType::uint32 || u == nullptr || *u != alignment_) {
      return invalid_argument(
          "gguf writer: metadata 'general.alignment' = {} ({}) does not match the writer's {}",
          v.to_display_string(), value_type_name(v.type), alignment_);
    }
  }
  bool add_alignment_key = !has_alignment_key && alignment_ != 32;
  std::vector<uint8_t> bytes;
  Out out(bytes);
  out.put<uint32_t>(0x46554747);
  out.put<uint32_t>(3);
  out.put<uint64_t>(tensors_.size());
  out.put<uint64_t>(metadata_.size() + (add_alignment_key ? 1 : 0));
  if (add_alignment_key) {
    out.put_string("general.alignment");
    out.put(static_cast<uint32_t>(ValueType::uint32));
    out.put(static_cast<uint32_t>(alignment_));
  }
  for (const auto& [k, v] : metadata_) {
    out.put_string(k);
    out.put(static_cast<uint32_t>(v.type));
    KILN_TRY(put_value(out, v, v.type, k));
  }
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    out.put_string(t.name);
    out.put(static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) out.put(static_cast<uint64_t>(d));
    out.put(static_cast<uint32_t>(t.type));
    out.put(offset);
    offset += (t.n_bytes + alignment_ - 1) / alignment_ * alignment_;
  }
  out.pad_to(alignment_);
  return bytes;
}

Result<uint64_t> Writer::file_size() const {
  KILN_ASSIGN_OR_RETURN(const std::vector<uint8_t> head, header());
  uint64_t n = head.size();
  for (const auto& t : tensors_) n += (t.n_bytes + alignment_ - 1) / alignment_ * alignment_;
  return n;
}

Result<std::vector<uint8_t>> Writer::to_bytes() const {
  KILN_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, header());
  Out out(bytes);
  std::vector<uint8_t> scratch;
  for (const auto& t : tensors_) {
    std::span<const uint8_t> data;
    KILN_TRY(tensor_bytes(t, scratch, data));
    bytes.insert(bytes.end(), data.begin(), data.end());
    out.pad_to(alignment_);
  }
  return bytes;
}

Status Writer::write(const std::string& path) const {
  KILN_ASSIGN_OR_RETURN(const std::vector<uint8_t> head, header());
  KILN_ASSIGN_OR_RETURN(OutputFile out, OutputFile::create(path));
  std::FILE* f = out.stream();
  const std::string& tmp = out.temp_path();
  // The header, then each tensor (produced now when lazy: one in memory at a time) and its padding.
  uint64_t written = 0;
  Status st;
  auto put = [&](std::span<const uint8_t> b) {
    if (st.ok() && std::fwrite(b.data(), 1, b.size(), f) != b.size())
      st =
          io_error("gguf writer: writing '{}' failed after {} bytes: {}", tmp, written, std::strerror(errno));
    written += b.size();
  };
  put(head);
  std::vector<uint8_t> scratch;
  const std::vector<uint8_t> zeros(alignment_, 0);
  for (const auto& t : tensors_) {
    if (!st.ok()) break;
    std::span<const uint8_t> data;
    st = tensor_bytes(t, scratch, data);
    if (!st.ok()) break;
    put(data);
    put(std::span<const uint8_t>(zeros).first((alignment_ - written % alignment_) % alignment_));
  }
  if (!st.ok()) return st;  // `out` removes the temporary file
  return out.commit();
}

Status copy_into(const File& file, Writer& writer) {
  for (const auto& [k, v] : file.metadata()) writer.set(k, v);
  for (const TensorInfo& t : file.tensors()) {
    KILN_TRY(writer.add_tensor(t.name, t.shape, t.type, {t.data, t.n_bytes}));
  }
  return {};
}

}  // namespace kiln::gguf
