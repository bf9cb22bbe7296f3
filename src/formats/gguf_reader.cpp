// GGUF v2/v3 reader: validates every field before use (docs/limits.md).
// Layout (little-endian): magic "GGUF", u32 version, u64 n_tensors, u64 n_kv,
// n_kv x {string key, u32 type, value}, n_tensors x {string name, u32 n_dims, u64 dims[n_dims],
// u32 type, u64 offset}, padding to the alignment, then the data section.
// A string is {u64 length, bytes}; an array is {u32 elem_type, u64 count, elements}.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>

#include "formats/gguf.h"

namespace kiln::gguf {

namespace {

std::atomic<uint64_t> g_metadata_cap{uint64_t{1} << 30};
std::atomic<uint64_t> g_metadata_in_use{0};

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint32_t kMaxDims = 4;
constexpr uint64_t kDefaultAlignment = 32;

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<uint8_t>(s[i]);
    size_t n = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;
    for (size_t k = 1; k <= n; ++k) {
      auto cc = static_cast<uint8_t>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static constexpr uint32_t kMin[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

// Smallest encoded size of one array element of this type (bytes), used to bound counts.
uint64_t min_encoded_size(ValueType t) {
  switch (t) {
    case ValueType::uint8:
    case ValueType::int8:
    case ValueType::boolean: return 1;
    case ValueType::uint16:
    case ValueType::int16: return 2;
    case ValueType::uint32:
    case ValueType::int32:
    case ValueType::float32: return 4;
    case ValueType::string:
    case ValueType::uint64:
    case ValueType::int64:
    case ValueType::float64: return 8;
    case ValueType::array: return 12;
  }
  return 1;
}

}  // namespace

void set_metadata_memory_cap(uint64_t bytes) { g_metadata_cap.store(bytes); }
uint64_t metadata_memory_cap() { return g_metadata_cap.load(); }
uint64_t metadata_memory_in_use() { return g_metadata_in_use.load(); }

MetadataCharge::MetadataCharge(const MetadataCharge& other) : bytes_(other.bytes_) {
  g_metadata_in_use.fetch_add(bytes_);
}
MetadataCharge& MetadataCharge::operator=(const MetadataCharge& other) {
  if (this != &other) {
    g_metadata_in_use.fetch_add(other.bytes_);
    g_metadata_in_use.fetch_sub(bytes_);
    bytes_ = other.bytes_;
  }
  return *this;
}
MetadataCharge& MetadataCharge::operator=(MetadataCharge&& other) noexcept {
  if (this != &other) {
    g_metadata_in_use.fetch_sub(bytes_);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}
MetadataCharge::~MetadataCharge() { g_metadata_in_use.fetch_sub(bytes_); }

class Parser {
 public:
  Parser(std::span<const uint8_t> bytes, File& file) : b_(bytes), f_(file), cap_(metadata_memory_cap()) {}
  Parser(const Parser&) = delete;
  Parser& operator=(const Parser&) = delete;
  ~Parser() { g_metadata_in_use.fetch_sub(used_); }  // what run() did not hand to the File

  Status run();

 private:
  uint64_t remaining() const { return b_.size() - pos_; }
  Status need(uint64_t n, std::string_view field) const {
    if (n <= remaining()) return {};
    return invalid_argument("{}: {} at offset {}: needs {} bytes, only {} remain (truncated file?)", f_.name_,
                            field, pos_, n, remaining());
  }
  template <class T>
  Result<T> read(std::string_view field) {
    KILN_TRY(need(sizeof(T), field));
    T x;
    std::memcpy(&x, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return x;
  }
  // Reads a T and wraps it with make (Value::u8, ...).
  template <class T>
  Result<Value> read_scalar(std::string_view field, Value (*make)(T)) {
    KILN_ASSIGN_OR_RETURN(T x, read<T>(field));
    return make(x);
  }
  // Reserves `n` bytes of metadata memory against the per-process cap.
  Status charge(uint64_t n, std::string_view field) {
    used_ += n;
    uint64_t now = g_metadata_in_use.fetch_add(n) + n;
    if (now <= cap_) return {};
    return resource_exhausted(
        "{}: {} at offset {}: metadata memory would exceed the per-process cap of {} bytes "
        "({} in use)",
        f_.name_, field, pos_, cap_, now);
  }
  Result<std::string> read_string(std::string_view field);
  Result<Value> read_value(ValueType type, std::string_view field, int depth);
  Result<Value> read_array(std::string_view field, int depth);
  Status read_header(uint64_t& n_tensors, uint64_t& n_kv);
  Status read_metadata(uint64_t n_kv);
  Status read_alignment();
  Status read_tensor_info(size_t index);
  Status check_tensor_shape(TensorInfo& t, uint64_t at);
  Status place_tensors();

  std::span<const uint8_t> b_;
  File& f_;
  uint64_t pos_ = 0;
  uint64_t used_ = 0;
  uint64_t cap_;
};

Result<std::string> Parser::read_string(std::string_view field) {
  uint64_t at = pos_;
  KILN_ASSIGN_OR_RETURN(uint64_t len, read<uint64_t>(field));
  if (len > remaining()) {
    return invalid_argument("{}: {} at offset {}: string length {} exceeds the {} bytes remaining", f_.name_,
                            field, at, len, remaining());
  }
  KILN_TRY(charge(len, field));
  std::string s(reinterpret_cast<const char*>(b_.data() + pos_), len);
  pos_ += len;
  return s;
}

Result<Value> Parser::read_array(std::string_view field, int depth) {
  uint64_t at = pos_;
  if (depth >= kMaxArrayDepth) {
    return invalid_argument("{}: {} at offset {}: arrays nested deeper than {}", f_.name_, field, at,
                            kMaxArrayDepth);
  }
  KILN_ASSIGN_OR_RETURN(uint32_t et, read<uint32_t>(field));
  if (et > static_cast<uint32_t>(ValueType::float64)) {
    return invalid_argument("{}: {} at offset {}: array element type {} is not a GGUF value type", f_.name_,
                            field, at, et);
  }
  auto elem = static_cast<ValueType>(et);
  uint64_t count_at = pos_;
  KILN_ASSIGN_OR_RETURN(uint64_t count, read<uint64_t>(field));
  if (count > remaining() / min_encoded_size(elem)) {
    return invalid_argument("{}: {} at offset {}: array count {} of {} exceeds the {} bytes remaining",
                            f_.name_, field, count_at, count, value_type_name(elem), remaining());
  }
  KILN_TRY(charge(count * sizeof(Value) + sizeof(Array), field));
  std::vector<Value> items;
  items.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    KILN_ASSIGN_OR_RETURN(Value v, read_value(elem, field, depth + 1));
    items.push_back(std::move(v));
  }
  return Value::array(elem, std::move(items));
}

Result<Value> Parser::read_value(ValueType type, std::string_view field, int depth) {
  switch (type) {
    case ValueType::uint8: return read_scalar(field, Value::u8);
    case ValueType::int8: return read_scalar(field, Value::i8);
    case ValueType::uint16: return read_scalar(field, Value::u16);
    case ValueType::int16: return read_scalar(field, Value::i16);
    case ValueType::uint32: return read_scalar(field, Value::u32);
    case ValueType::int32: return read_scalar(field, Value::i32);
    case ValueType::uint64: return read_scalar(field, Value::u64);
    case ValueType::int64: return read_scalar(field, Value::i64);
    case ValueType::float32: return read_scalar(field, Value::f32);
    case ValueType::float64: return read_scalar(field, Value::f64);
    case ValueType::boolean: {
      uint64_t at = pos_;
      KILN_ASSIGN_OR_RETURN(auto x, read<uint8_t>(field));
      if (x > 1)
        return invalid_argument("{}: {} at offset {}: bool value {} is not 0 or 1", f_.name_, field, at, x);
      return Value::boolean(x == 1);
    }
    case ValueType::string: {
      KILN_ASSIGN_OR_RETURN(auto s, read_string(field));
      return Value::str(std::move(s));
    }
    case ValueType::array: return read_array(field, depth);
  }
  return invalid_argument("{}: {}: bad value type", f_.name_, field);
}

Status Parser::read_header(uint64_t& n_tensors, uint64_t& n_kv) {
  KILN_ASSIGN_OR_RETURN(uint32_t magic, read<uint32_t>("magic"));
  if (magic != kMagic) {
    return invalid_argument("{}: magic at offset 0: 0x{:08x} is not \"GGUF\" (0x{:08x}); not a GGUF file",
                            f_.name_, magic, kMagic);
  }
  KILN_ASSIGN_OR_RETURN(uint32_t version, read<uint32_t>("version"));
  if (version == 1) {
    return invalid_argument(
        "{}: version at offset 4: GGUF version 1 (32-bit counts) is not supported; "
        "re-convert the model to GGUF v3",
        f_.name_);
  }
  if ((version & 0xFFFF) == 0 && version != 0) {
    return invalid_argument(
        "{}: version at offset 4: 0x{:08x} looks byte-swapped; big-endian GGUF is not supported", f_.name_,
        version);
  }
  if (version != 2 && version != 3) {
    return invalid_argument("{}: version at offset 4: {} is not a supported GGUF version (2 or 3)", f_.name_,
                            version);
  }
  f_.version_ = version;
  KILN_ASSIGN_OR_RETURN(n_tensors, read<uint64_t>("n_tensors"));
  KILN_ASSIGN_OR_RETURN(n_kv, read<uint64_t>("n_kv"));
  // A key-value pair needs at least 8 (key length) + 1 (key) + 4 (type) + 1 (value) bytes;
  // a tensor info at least 8 + 1 + 4 + 8 + 4 + 8.
  if (n_kv > remaining() / 14) {
    return invalid_argument("{}: n_kv at offset 16: {} key-value pairs cannot fit in {} bytes", f_.name_,
                            n_kv, remaining());
  }
  if (n_tensors > remaining() / 33) {
    return invalid_argument("{}: n_tensors at offset 8: {} tensor infos cannot fit in {} bytes", f_.name_,
                            n_tensors, remaining());
  }
  return {};
}

Status Parser::read_metadata(uint64_t n_kv) {
  f_.metadata_.reserve(n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) {
    uint64_t at = pos_;
    std::string field = fmt::format("metadata key #{}", i);
    KILN_ASSIGN_OR_RETURN(std::string key, read_string(field));
    if (key.empty()) return invalid_argument("{}: {} at offset {}: the key is empty", f_.name_, field, at);
    if (!valid_utf8(key)) {
      return invalid_argument("{}: {} at offset {}: the key is not valid UTF-8", f_.name_, field, at);
    }
    field = fmt::format("metadata '{}'", key);
    if (f_.metadata_index_.count(key) != 0) {
      return invalid_argument("{}: {} at offset {}: duplicate key", f_.name_, field, at);
    }
    uint64_t type_at = pos_;
    KILN_ASSIGN_OR_RETURN(uint32_t type, read<uint32_t>(field));
    if (type > static_cast<uint32_t>(ValueType::float64)) {
      return invalid_argument("{}: {} at offset {}: value type {} is not a GGUF value type", f_.name_, field,
                              type_at, type);
    }
    KILN_TRY(charge(key.size() * 2 + sizeof(Value) + 64, field));
    KILN_ASSIGN_OR_RETURN(Value v, read_value(static_cast<ValueType>(type), field, 0));
    f_.metadata_index_.emplace(key, f_.metadata_.size());
    f_.metadata_.emplace_back(std::move(key), std::move(v));
  }
  return {};
}

Status Parser::read_alignment() {
  const Value* a = f_.find("general.alignment");
  if (a == nullptr) {
    f_.alignment_ = kDefaultAlignment;
    return {};
  }
  if (a->type != ValueType::uint32) {
    return invalid_argument("{}: metadata 'general.alignment' has type {} (value {}), expected uint32",
                            f_.name_, value_type_name(a->type), a->to_display_string(4));
  }
  uint64_t align = std::get<uint64_t>(a->v);
  if (align == 0 || (align & (align - 1)) != 0) {
    return invalid_argument("{}: metadata 'general.alignment' = {} is not a nonzero power of two", f_.name_,
                            align);
  }
  f_.alignment_ = align;
  return {};
}

Status Parser::check_tensor_shape(TensorInfo& t, uint64_t at) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  int64_t n = 1;
  for (size_t d = 0; d < t.shape.size(); ++d) {
    if (n > kMax / t.shape[d]) {
      return invalid_argument("{}: tensor '{}' at offset {}: element count overflows int64 at dims[{}] = {}",
                              f_.name_, t.name, at, d, t.shape[d]);
    }
    n *= t.shape[d];
  }
  const DTypeInfo& info = dtype_info(t.type);
  if (t.shape[0] % info.block_size != 0) {
    return invalid_argument(
        "{}: tensor '{}' at offset {}: dims[0] = {} is not a multiple of the {} block size {}", f_.name_,
        t.name, at, t.shape[0], info.name, info.block_size);
  }
  auto row = dtype_row_bytes(t.type, t.shape[0]);
  if (!row.ok()) {
    return invalid_argument("{}: tensor '{}' at offset {}: dims[0]: {}", f_.name_, t.name, at,
                            row.status().message());
  }
  int64_t rows = n / t.shape[0];
  if (*row != 0 && rows > kMax / *row) {
    return invalid_argument("{}: tensor '{}' at offset {}: byte size {} x {} rows overflows int64", f_.name_,
                            t.name, at, *row, rows);
  }
  t.n_bytes = static_cast<uint64_t>(*row * rows);
  return {};
}

Status Parser::read_tensor_info(size_t index) {
  uint64_t at = pos_;
  std::string field = fmt::format("tensor info #{} name", index);
  KILN_ASSIGN_OR_RETURN(std::string name, read_string(field));
  if (name.empty()) return invalid_argument("{}: {} at offset {}: the name is empty", f_.name_, field, at);
  if (!valid_utf8(name))
    return invalid_argument("{}: {} at offset {}: the name is not valid UTF-8", f_.name_, field, at);
  if (f_.tensor_index_.count(name) != 0) {
    return invalid_argument("{}: tensor '{}' at offset {}: duplicate tensor name", f_.name_, name, at);
  }
  TensorInfo t;
  t.name = std::move(name);
  field = fmt::format("tensor '{}'", t.name);
  uint64_t nd_at = pos_;
  KILN_ASSIGN_OR_RETURN(uint32_t n_dims, read<uint32_t>(field + " n_dims"));
  if (n_dims == 0 || n_dims > kMaxDims) {
    return invalid_argument("{}: {} at offset {}: n_dims = {} is not in 1..{}", f_.name_, field, nd_at,
                            n_dims, kMaxDims);
  }
  for (uint32_t d = 0; d < n_dims; ++d) {
    uint64_t d_at = pos_;
    KILN_ASSIGN_OR_RETURN(uint64_t dim, read<uint64_t>(field + " dims"));
    auto sdim = static_cast<int64_t>(dim);
    if (sdim <= 0) {
      return invalid_argument("{}: {} at offset {}: dims[{}] = {} is not positive", f_.name_, field, d_at, d,
                              sdim);
    }
    t.shape.push_back(sdim);
  }
  uint64_t type_at = pos_;
  KILN_ASSIGN_OR_RETURN(uint32_t type_id, read<uint32_t>(field + " type"));
  auto dt = dtype_from_gguf_id(type_id);
  if (!dt.ok()) {
    return invalid_argument("{}: {} at offset {}: type = {}: {}", f_.name_, field, type_at, type_id,
                            dt.status().message());
  }
  t.type = *dt;
  KILN_TRY(check_tensor_shape(t, at));
  uint64_t off_at = pos_;
  KILN_ASSIGN_OR_RETURN(t.offset, read<uint64_t>(field + " offset"));
  if (t.offset % f_.alignment_ != 0) {
    return invalid_argument("{}: {} at offset {}: data offset = {} is not a multiple of the alignment {}",
                            f_.name_, field, off_at, t.offset, f_.alignment_);
  }
  KILN_TRY(charge(t.name.size() * 2 + sizeof(TensorInfo) + 64, field));
  f_.tensor_index_.emplace(t.name, f_.tensors_.size());
  f_.tensors_.push_back(std::move(t));
  return {};
}

Status Parser::place_tensors() {
  uint64_t data = (pos_ + f_.alignment_ - 1) / f_.alignment_ * f_.alignment_;  // pos_ <= size, no overflow
  f_.data_offset_ = data;
  if (f_.tensors_.empty()) return {};
  if (data > b_.size()) {
    return invalid_argument("{}: data section at offset {}: starts past the end of the file ({} bytes)",
                            f_.name_, data, b_.size());
  }
  uint64_t data_size = b_.size() - data;
  std::vector<size_t> order(f_.tensors_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return f_.tensors_[a].offset < f_.tensors_[b].offset; });
  uint64_t prev_end = 0;
  const TensorInfo* prev = nullptr;
  for (size_t i : order) {
    TensorInfo& t = f_.tensors_[i];
    if (t.offset > data_size || t.n_bytes > data_size - t.offset) {
      return invalid_argument(
          "{}: tensor '{}': data offset {} + {} bytes runs past the end of the data section "
          "({} bytes at file offset {})",
          f_.name_, t.name, t.offset, t.n_bytes, data_size, data);
    }
    if (prev != nullptr && t.offset < prev_end) {
      return invalid_argument("{}: tensor '{}': data offset {} overlaps tensor '{}' (bytes {}..{})", f_.name_,
                              t.name, t.offset, prev->name, prev->offset, prev_end);
    }
    t.data = b_.data() + data + t.offset;
    prev_end = t.offset + t.n_bytes;
    prev = &t;
  }
  return {};
}

Status Parser::run() {
  uint64_t n_tensors = 0;
  uint64_t n_kv = 0;
  KILN_TRY(read_header(n_tensors, n_kv));
  KILN_TRY(read_metadata(n_kv));
  KILN_TRY(read_alignment());
  f_.tensor_infos_offset_ = pos_;
  f_.tensors_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) KILN_TRY(read_tensor_info(i));
  KILN_TRY(place_tensors());
  f_.charge_ = MetadataCharge(std::exchange(used_, 0));
  return {};
}

Result<File> File::parse(std::span<const uint8_t> bytes, std::string name) {
  File f;
  f.name_ = std::move(name);
  f.bytes_ = bytes;
  Parser p(bytes, f);
  KILN_TRY(p.run());
  return f;
}

Result<File> File::assemble(std::string name, std::vector<std::pair<std::string, Value>> metadata,
                            std::vector<TensorInfo> tensors, std::shared_ptr<const void> owner) {
  File f;
  f.name_ = std::move(name);
  f.owner_ = std::move(owner);
  f.version_ = 3;
  for (size_t i = 0; i < metadata.size(); ++i) {
    if (!f.metadata_index_.emplace(metadata[i].first, i).second)
      return invalid_argument("{}: metadata key {} is repeated", f.name_, metadata[i].first);
  }
  f.metadata_ = std::move(metadata);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo& t = tensors[i];
    const DTypeInfo& info = dtype_info(t.type);
    const int64_t n = t.n_elements();
    if (t.data == nullptr || t.shape.empty() || n <= 0 || n % info.block_size != 0 ||
        t.n_bytes != static_cast<uint64_t>(n / info.block_size) * static_cast<uint64_t>(info.type_size)) {
      return invalid_argument("{}: tensor {} has no data or {} bytes for its shape and type {}", f.name_,
                              t.name, t.n_bytes, info.name);
    }
    if (!f.tensor_index_.emplace(t.name, i).second)
      return invalid_argument("{}: tensor {} is repeated", f.name_, t.name);
  }
  f.tensors_ = std::move(tensors);
  return f;
}

Result<File> File::open(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(MappedFile m, MappedFile::open(path));
  auto map = std::make_shared<MappedFile>(std::move(m));
  KILN_ASSIGN_OR_RETURN(File f, parse(map->bytes(), path));
  f.map_ = std::move(map);
  return f;
}

}  // namespace kiln::gguf
