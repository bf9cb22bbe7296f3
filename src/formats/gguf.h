// GGUF (v2 and v3) reader and writer.
// The reader validates every field before use: a bad file is an error naming the field, its byte
// offset and its value, never a crash, a hang, or an allocation sized by an unchecked number.
// Tensor data is used in place from the memory map (or the caller's buffer for parse()).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "formats/mmap.h"

namespace kiln::gguf {

// Metadata value types, numbered as in the GGUF spec.
enum class ValueType : uint32_t {
  uint8 = 0,
  int8 = 1,
  uint16 = 2,
  int16 = 3,
  uint32 = 4,
  int32 = 5,
  float32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  uint64 = 10,
  int64 = 11,
  float64 = 12,
};
const char* value_type_name(ValueType type);

struct Value;
// An array: every element has elem_type (arrays of arrays nest).
struct Array {
  ValueType elem_type = ValueType::uint8;
  std::vector<Value> items;
};

// One metadata value. Integers of every width are held widened; `type` keeps the stored width.
struct Value {
  ValueType type = ValueType::uint8;
  std::variant<uint64_t, int64_t, double, bool, std::string, std::shared_ptr<Array>> v;

  static Value u8(uint8_t x) { return {ValueType::uint8, uint64_t{x}}; }
  static Value i8(int8_t x) { return {ValueType::int8, int64_t{x}}; }
  static Value u16(uint16_t x) { return {ValueType::uint16, uint64_t{x}}; }
  static Value i16(int16_t x) { return {ValueType::int16, int64_t{x}}; }
  static Value u32(uint32_t x) { return {ValueType::uint32, uint64_t{x}}; }
  static Value i32(int32_t x) { return {ValueType::int32, int64_t{x}}; }
  static Value u64(uint64_t x) { return {ValueType::uint64, x}; }
  static Value i64(int64_t x) { return {ValueType::int64, x}; }
  static Value f32(float x) { return {ValueType::float32, double{x}}; }
  static Value f64(double x) { return {ValueType::float64, x}; }
  static Value boolean(bool x) { return {ValueType::boolean, x}; }
  static Value str(std::string x) { return {ValueType::string, std::move(x)}; }
  static Value array(ValueType elem_type, std::vector<Value> items);

  bool is_integer() const;
  bool is_float() const { return type == ValueType::float32 || type == ValueType::float64; }
  const std::string* as_string() const { return std::get_if<std::string>(&v); }
  const Array* as_array() const;
  // A short human-readable rendering (arrays abbreviated), for `kiln inspect` and errors.
  std::string to_display_string(size_t max_items = 8) const;
};

struct TensorInfo {
  std::string name;
  std::vector<int64_t> shape;  // GGUF order: shape[0] is the innermost (contiguous) dimension
  DType type = DType::f32;
  uint64_t offset = 0;            // bytes, relative to the start of the data section (aligned)
  uint64_t n_bytes = 0;           // bytes of the tensor's data
  const uint8_t* data = nullptr;  // into the file's bytes

  int64_t n_elements() const;
};

// Metadata bytes a File holds against the per-process cap (see set_metadata_memory_cap); given
// back when the File is destroyed. Copies hold (and count) their own share.
class MetadataCharge {
 public:
  MetadataCharge() = default;
  explicit MetadataCharge(uint64_t already_reserved) : bytes_(already_reserved) {}
  MetadataCharge(const MetadataCharge& other);
  MetadataCharge& operator=(const MetadataCharge& other);
  MetadataCharge(MetadataCharge&& other) noexcept : bytes_(std::exchange(other.bytes_, 0)) {}
  MetadataCharge& operator=(MetadataCharge&& other) noexcept;
  ~MetadataCharge();
  uint64_t bytes() const { return bytes_; }

 private:
  uint64_t bytes_ = 0;
};

class File {
 public:
  // Memory-maps and parses a GGUF file.
  static Result<File> open(const std::string& path);
  // Parses GGUF bytes owned by the caller (they must outlive the File). `name` appears in errors.
  static Result<File> parse(std::span<const uint8_t> bytes, std::string name);
  // A File built in memory (a Hugging Face folder seen as GGUF): each tensor's `data` points into memory that
  // `owner` keeps alive (memory maps, converted buffers), and n_bytes must match its shape and type.
  // Errors: a duplicate key or tensor name, a tensor without data or whose byte count is wrong.
  static Result<File> assemble(std::string name, std::vector<std::pair<std::string, Value>> metadata,
                               std::vector<TensorInfo> tensors, std::shared_ptr<const void> owner);

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }                  // byte offset of the data section
  uint64_t tensor_infos_offset() const { return tensor_infos_offset_; }  // byte offset of the tensor infos
  const std::string& name() const { return name_; }
  std::span<const uint8_t> bytes() const { return bytes_; }

  // Metadata in file order.
  const std::vector<std::pair<std::string, Value>>& metadata() const { return metadata_; }
  const Value* find(std::string_view key) const;
  // Removes the metadata entry `key`, if any, and frees its value: for large arrays read once, such as a
  // vocabulary's tokens, scores and types (Gemma 3's 262,144 of each). Invalidates pointers from find() and
  // references into metadata().
  void release(std::string_view key);

  // Typed getters: not_found when absent; invalid_argument naming the key when the type is wrong.
  // Integer getters accept any integer type whose value fits; float getters accept f32/f64 and ints.
  Result<std::string> get_string(std::string_view key) const;
  Result<uint64_t> get_uint(std::string_view key) const;
  Result<int64_t> get_int(std::string_view key) const;
  Result<double> get_float(std::string_view key) const;
  Result<bool> get_bool(std::string_view key) const;
  Result<std::vector<std::string>> get_string_array(std::string_view key) const;
  Result<std::vector<double>> get_float_array(std::string_view key) const;
  Result<std::vector<int64_t>> get_int_array(std::string_view key) const;
  // The same, with a default when the key is absent (a present key of the wrong type is an error).
  Result<std::string> get_string_or(std::string_view key, std::string fallback) const;
  Result<uint64_t> get_uint_or(std::string_view key, uint64_t fallback) const;
  Result<double> get_float_or(std::string_view key, double fallback) const;
  Result<bool> get_bool_or(std::string_view key, bool fallback) const;

  // "general.architecture", or empty.
  std::string architecture() const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;
  // A memory-mapped file's whole pages within [p, p + n) out of the resident set (MappedFile::drop_pages);
  // nothing for a File over memory it does not map.
  void drop_pages(const void* p, size_t n) const;

 private:
  std::shared_ptr<MappedFile> map_;    // null for parse()
  std::shared_ptr<const void> owner_;  // assemble(): what tensor data points into
  std::span<const uint8_t> bytes_;
  std::string name_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  uint64_t tensor_infos_offset_ = 0;
  std::vector<std::pair<std::string, Value>> metadata_;
  std::unordered_map<std::string, size_t> metadata_index_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
  MetadataCharge charge_;

  friend class Parser;
};

// Writes GGUF v3. Metadata and tensors come out in the order they were added.
class Writer {
 public:
  explicit Writer(uint64_t alignment = 32) : alignment_(alignment) {}

  // Adds or replaces a metadata key (replacing keeps its position).
  void set(std::string key, Value value);
  // Adds a tensor; `data` is copied. Error: duplicate name, shape/type/byte-count mismatch.
  Status add_tensor(std::string name, std::vector<int64_t> shape, DType type, std::span<const uint8_t> data);
  // Fills a tensor's bytes (exactly its size, zeroed) when the file is written: write() then holds one tensor
  // in memory at a time. An error from `fill` aborts the write (no file is left).
  using TensorFill = std::function<Status(std::span<uint8_t> out)>;
  // Adds a tensor whose bytes `fill` produces at write time. Errors as add_tensor().
  Status add_tensor_lazy(std::string name, std::vector<int64_t> shape, DType type, TensorFill fill);

  // The bytes write() would write: the header, then every tensor padded to the alignment.
  Result<uint64_t> file_size() const;
  // Serialises the whole file into memory.
  Result<std::vector<uint8_t>> to_bytes() const;
  // Writes to `path` (via a temporary file renamed into place, so a failure leaves no half file), streaming
  // the tensors.
  Status write(const std::string& path) const;

 private:
  struct PendingTensor {
    std::string name;
    std::vector<int64_t> shape;
    DType type;
    uint64_t n_bytes;           // of the data
    std::vector<uint8_t> data;  // add_tensor()
    TensorFill fill;            // add_tensor_lazy()
  };
  // The byte count a tensor of this name, shape and type has, or the error add_tensor() reports.
  Result<uint64_t> check_tensor(const std::string& name, const std::vector<int64_t>& shape, DType type) const;
  // Magic, counts, metadata, tensor infos and the padding up to the data section.
  Result<std::vector<uint8_t>> header() const;
  // The tensor's bytes: its own, or filled into `scratch`.
  Status tensor_bytes(const PendingTensor& t, std::vector<uint8_t>& scratch,
                      std::span<const uint8_t>& out) const;

  uint64_t alignment_;
  std::vector<std::pair<std::string, Value>> metadata_;
  std::vector<PendingTensor> tensors_;
};

// The per-process hard cap on the metadata memory (keys, values, strings, arrays, tensor infos;
// bytes, estimated) that all live Files together may hold. A parse that would exceed it is
// rejected with resource_exhausted. Default 1 GiB.
void set_metadata_memory_cap(uint64_t bytes);
uint64_t metadata_memory_cap();
// The metadata bytes live Files hold now (against the cap).
uint64_t metadata_memory_in_use();

// Nested arrays deeper than this (an array of arrays is depth 2) are rejected.
inline constexpr int kMaxArrayDepth = 8;

// Copies a file's metadata and tensors into a Writer (for round trips and conversions).
Status copy_into(const File& file, Writer& writer);

}  // namespace kiln::gguf
