// safetensors: single files and sharded folders (model.safetensors.index.json).
// File layout: u64 little-endian header length N, then N bytes of a JSON object
//   {"<tensor name>": {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"<key>": "<string>", ...}}
// then the data section. Offsets are bytes relative to the data section; tensors tile it exactly
// (no overlaps, no holes, nothing after the last one). Shapes are outermost first (row-major,
// the last dimension is contiguous) — the reverse of GGUF's order.
// Every field is validated before use; tensor data is used in place from the memory map.
// Pickled PyTorch checkpoints (pytorch_model.bin, *.pt, *.pth, *.ckpt) are refused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "formats/mmap.h"

namespace kiln::safetensors {

// The safetensors element types (names as written in files: "F32", "BF16", "F8_E4M3", ...).
enum class Dtype : uint8_t {
  dtype_bool,
  dtype_u8,
  dtype_i8,
  dtype_f8_e5m2,
  dtype_f8_e4m3,
  dtype_f8_e8m0,
  dtype_i16,
  dtype_u16,
  dtype_f16,
  dtype_bf16,
  dtype_i32,
  dtype_u32,
  dtype_f32,
  dtype_c64,
  dtype_f64,
  dtype_i64,
  dtype_u64,
};

// "F32" for Dtype::dtype_f32.
const char* dtype_name(Dtype dtype);
// Bytes per element.
int64_t dtype_size(Dtype dtype);
// The file's name -> the type. Errors: unimplemented for sub-byte types kiln does not read (F4,
// F6_E2M3, F6_E3M2); invalid_argument for names safetensors does not define.
Result<Dtype> dtype_from_name(std::string_view name);
// kiln's DType for F32/F16/BF16/F64/I8/I16/I32/I64; nullopt for types kiln has no plain DType for
// (BOOL, U8..U64, F8_*, C64: they stay recognised and typed, and a loader decides what to do).
std::optional<DType> to_kiln_dtype(Dtype dtype);

// Limits on what a file may declare (checked before any allocation they would size).
inline constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;  // the JSON header
inline constexpr size_t kMaxRank = 8;                             // dimensions per tensor
inline constexpr size_t kMaxIndexBytes = size_t{64} << 20;        // model.safetensors.index.json

struct Tensor {
  std::string name;
  Dtype dtype = Dtype::dtype_f32;
  std::vector<int64_t> shape;     // outermost first, as in the file; [] is a scalar
  int64_t n_elements = 0;         // product of shape (1 for a scalar)
  uint64_t offset = 0;            // bytes, relative to the start of the data section
  std::span<const uint8_t> data;  // n_elements * dtype_size bytes, into the file's bytes

  std::optional<DType> kiln_dtype() const { return to_kiln_dtype(dtype); }
};

class File {
 public:
  // Memory-maps and parses `path`. Pickled checkpoints (by extension or by content) are refused
  // with a message on how to convert them.
  static Result<File> open(const std::string& path);
  // Parses bytes owned by the caller (they must outlive the File). `name` starts every error.
  static Result<File> parse(std::span<const uint8_t> bytes, std::string name);

  const std::string& name() const { return name_; }
  uint64_t header_bytes() const { return header_bytes_; }     // N, the JSON header's length
  uint64_t data_offset() const { return 8 + header_bytes_; }  // file offset of the data section
  // Tensors in data order (ascending offset).
  const std::vector<Tensor>& tensors() const { return tensors_; }
  const Tensor* find(std::string_view name) const;
  // "__metadata__" (string -> string); empty when absent.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::shared_ptr<MappedFile> map_;  // null for parse()
  std::string name_;
  uint64_t header_bytes_ = 0;
  std::vector<Tensor> tensors_;
  std::unordered_map<std::string, size_t> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

// A model's weights: one file or the shards named by an index. Tensor names are unique across shards.
class Model {
 public:
  Model() = default;
  Model(Model&&) noexcept = default;
  Model& operator=(Model&&) noexcept = default;
  Model(const Model&) = delete;  // tensors_ points into shards_
  Model& operator=(const Model&) = delete;

  // A Hugging Face folder: model.safetensors.index.json if present, else model.safetensors.
  // A folder with only pickled checkpoints gets the pickle refusal; an empty one not_found.
  static Result<Model> open_dir(const std::string& dir);
  // An index json: {"metadata": {...}, "weight_map": {"<tensor>": "<shard file name>"}}. Shards
  // are plain file names in the index's folder. Errors: a missing shard, a shard lacking a tensor
  // the map assigns it, a tensor found in two shards or in a shard the map does not name for it.
  static Result<Model> open_index(const std::string& index_path);
  // One file as a model of one shard.
  static Result<Model> open_file(const std::string& path);

  const std::vector<File>& shards() const { return shards_; }
  // Every tensor: shard by shard (index order of first mention), data order within each.
  const std::vector<const Tensor*>& tensors() const { return tensors_; }
  const Tensor* find(std::string_view name) const;
  size_t n_tensors() const { return tensors_.size(); }

 private:
  std::vector<File> shards_;
  std::vector<const Tensor*> tensors_;  // into shards_ (Files are not copied after build)
  std::unordered_map<std::string, const Tensor*> index_;
};

// True when `path` names a pickled PyTorch checkpoint by its extension (.bin, .pt, .pth, .ckpt, .pkl).
bool is_pickle_path(std::string_view path);
// The error for a pickled checkpoint at `path`: says kiln does not load pickles and how to convert.
Status pickle_refused(const std::string& path);

}  // namespace kiln::safetensors
