#include "formats/safetensors.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>

#include "formats/folder.h"
#include "formats/json_file.h"

namespace kiln::safetensors {
namespace {

using nlohmann::json;

struct DtypeRow {
  Dtype dtype;
  const char* name;
  int64_t size;  // bytes per element
  std::optional<DType> kiln;
};

constexpr std::array<DtypeRow, 17> kDtypes = {{
    {Dtype::dtype_bool, "BOOL", 1, std::nullopt},
    {Dtype::dtype_u8, "U8", 1, std::nullopt},
    {Dtype::dtype_i8, "I8", 1, DType::i8},
    {Dtype::dtype_f8_e5m2, "F8_E5M2", 1, std::nullopt},
    {Dtype::dtype_f8_e4m3, "F8_E4M3", 1, std::nullopt},
    {Dtype::dtype_f8_e8m0, "F8_E8M0", 1, std::nullopt},
    {Dtype::dtype_i16, "I16", 2, DType::i16},
    {Dtype::dtype_u16, "U16", 2, std::nullopt},
    {Dtype::dtype_f16, "F16", 2, DType::f16},
    {Dtype::dtype_bf16, "BF16", 2, DType::bf16},
    {Dtype::dtype_i32, "I32", 4, DType::i32},
    {Dtype::dtype_u32, "U32", 4, std::nullopt},
    {Dtype::dtype_f32, "F32", 4, DType::f32},
    {Dtype::dtype_c64, "C64", 8, std::nullopt},
    {Dtype::dtype_f64, "F64", 8, DType::f64},
    {Dtype::dtype_i64, "I64", 8, DType::i64},
    {Dtype::dtype_u64, "U64", 8, std::nullopt},
}};

const DtypeRow& dtype_row(Dtype dtype) {
  const auto i = static_cast<size_t>(dtype);
  KILN_ASSERT(i < kDtypes.size() && kDtypes[i].dtype == dtype);
  return kDtypes[i];
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// An unsigned JSON integer (nlohmann stores non-negative integers as number_unsigned).
Result<uint64_t> get_unsigned(const json& v, const std::string& where) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) return invalid_argument("{} is {}, must be >= 0", where, v.get<int64_t>());
  return invalid_argument("{} must be a non-negative integer, got {} ({})", where, json_file::preview(v),
                          json_file::type_name(v));
}

// Field `key` of a tensor entry; `what` = "<file>: tensor \"<name>\"".
Result<const json*> get_field(const json& entry, const char* key, const std::string& what) {
  const auto it = entry.find(key);
  if (it == entry.end()) return invalid_argument("{}: missing field \"{}\"", what, key);
  return &*it;
}

Result<std::vector<int64_t>> parse_shape(const json& v, const std::string& what, int64_t* n_elements) {
  if (!v.is_array()) {
    return invalid_argument("{}: field \"shape\" must be an array, got {} ({})", what, json_file::preview(v),
                            json_file::type_name(v));
  }
  if (v.size() > kMaxRank) {
    return invalid_argument("{}: field \"shape\" has {} dimensions, more than the {} kiln accepts", what,
                            v.size(), kMaxRank);
  }
  std::vector<int64_t> shape;
  int64_t n = 1;
  for (size_t i = 0; i < v.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(const uint64_t d, get_unsigned(v[i], fmt::format("{}: shape[{}]", what, i)));
    if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return invalid_argument("{}: shape[{}] = {} does not fit in int64", what, i, d);
    }
    if (__builtin_mul_overflow(n, static_cast<int64_t>(d), &n)) {
      return invalid_argument("{}: shape {} has more elements than int64 can count", what, v.dump());
    }
    shape.push_back(static_cast<int64_t>(d));
  }
  *n_elements = n;
  return shape;
}

// Parses one tensor entry; checks its offsets against the data section's size `data_size`.
Result<Tensor> parse_entry(const std::string& tensor_name, const json& entry, const std::string& file_name,
                           uint64_t data_size) {
  const std::string what = fmt::format("{}: tensor \"{}\"", file_name, tensor_name);
  if (!entry.is_object()) {
    return invalid_argument("{}: entry must be an object, got {} ({})", what, json_file::preview(entry),
                            json_file::type_name(entry));
  }
  Tensor t;
  t.name = tensor_name;
  KILN_ASSIGN_OR_RETURN(const json* dtype, get_field(entry, "dtype", what));
  if (!dtype->is_string()) {
    return invalid_argument("{}: field \"dtype\" must be a string, got {}", what, json_file::preview(*dtype));
  }
  auto parsed_dtype = dtype_from_name(dtype->get<std::string>());
  if (!parsed_dtype.ok())
    return Status(parsed_dtype.status().code(), what + ": " + parsed_dtype.status().message());
  t.dtype = *parsed_dtype;

  KILN_ASSIGN_OR_RETURN(const json* shape, get_field(entry, "shape", what));
  KILN_ASSIGN_OR_RETURN(t.shape, parse_shape(*shape, what, &t.n_elements));
  int64_t n_bytes = 0;
  if (__builtin_mul_overflow(t.n_elements, dtype_size(t.dtype), &n_bytes)) {
    return invalid_argument("{}: shape {} of {} is more bytes than int64 can count", what, shape->dump(),
                            dtype_name(t.dtype));
  }

  KILN_ASSIGN_OR_RETURN(const json* offsets, get_field(entry, "data_offsets", what));
  if (!offsets->is_array() || offsets->size() != 2) {
    return invalid_argument("{}: field \"data_offsets\" must be an array [begin, end], got {}", what,
                            json_file::preview(*offsets));
  }
  KILN_ASSIGN_OR_RETURN(const uint64_t begin, get_unsigned((*offsets)[0], what + ": data_offsets[0]"));
  KILN_ASSIGN_OR_RETURN(const uint64_t end, get_unsigned((*offsets)[1], what + ": data_offsets[1]"));
  if (end < begin) return invalid_argument("{}: data_offsets [{}, {}] end before begin", what, begin, end);
  if (end - begin != static_cast<uint64_t>(n_bytes)) {
    return invalid_argument("{}: data_offsets [{}, {}] span {} bytes but shape {} of {} needs {} bytes", what,
                            begin, end, end - begin, shape->dump(), dtype_name(t.dtype), n_bytes);
  }
  if (end > data_size) {
    return invalid_argument("{}: data_offsets [{}, {}] run past the data section ({} bytes)", what, begin,
                            end, data_size);
  }
  t.offset = begin;
  return t;
}

Status parse_metadata(const json& v, const std::string& file_name, std::map<std::string, std::string>* out) {
  if (!v.is_object()) {
    return invalid_argument("{}: \"__metadata__\" must be an object of strings, got {} ({})", file_name,
                            json_file::preview(v), json_file::type_name(v));
  }
  for (const auto& [key, value] : v.items()) {
    if (!value.is_string()) {
      return invalid_argument("{}: \"__metadata__\" key \"{}\" must be a string, got {} ({})", file_name, key,
                              json_file::preview(value), json_file::type_name(value));
    }
    (*out)[key] = value.get<std::string>();
  }
  return {};
}

// Tensors sorted by offset must tile [0, data_size) exactly: no overlap, no hole, no trailing bytes.
Status check_tiling(const std::vector<Tensor>& tensors, const std::string& file_name, uint64_t data_size) {
  uint64_t expected = 0;
  const Tensor* prev = nullptr;
  for (const Tensor& t : tensors) {
    const uint64_t end = t.offset + t.data.size();
    if (t.offset < expected) {
      return invalid_argument(
          "{}: tensor \"{}\" at data_offsets [{}, {}] overlaps tensor \"{}\" (ends at {})", file_name, t.name,
          t.offset, end, prev->name, expected);
    }
    if (t.offset > expected) {
      return invalid_argument("{}: hole of {} bytes in the data section at [{}, {}) before tensor \"{}\"",
                              file_name, t.offset - expected, expected, t.offset, t.name);
    }
    expected = end;
    prev = &t;
  }
  if (expected != data_size) {
    return invalid_argument(
        "{}: {} bytes after the last tensor: the data section is {} bytes but tensors cover {}", file_name,
        data_size - expected, data_size, expected);
  }
  return {};
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// A zip (torch.save since 1.6) or a raw pickle stream (protocol 2-5) by its first bytes.
bool looks_like_pickle(std::span<const uint8_t> b) {
  if (b.size() >= 4 && b[0] == 'P' && b[1] == 'K' && b[2] == 3 && b[3] == 4) return true;
  return b.size() >= 2 && b[0] == 0x80 && b[1] >= 2 && b[1] <= 5;
}

}  // namespace

const char* dtype_name(Dtype dtype) { return dtype_row(dtype).name; }
int64_t dtype_size(Dtype dtype) { return dtype_row(dtype).size; }
std::optional<DType> to_kiln_dtype(Dtype dtype) { return dtype_row(dtype).kiln; }

Result<Dtype> dtype_from_name(std::string_view name) {
  for (const DtypeRow& row : kDtypes) {
    if (name == row.name) return row.dtype;
  }
  if (name == "F4" || name == "F6_E2M3" || name == "F6_E3M2") {
    return unimplemented("dtype \"{}\" (a sub-byte type) is not supported by kiln", name);
  }
  return invalid_argument("dtype \"{}\" is not a safetensors dtype", name);
}

bool is_pickle_path(std::string_view path) {
  return ends_with(path, ".bin") || ends_with(path, ".pt") || ends_with(path, ".pth") ||
         ends_with(path, ".ckpt") || ends_with(path, ".pkl") || ends_with(path, ".pickle");
}

Status pickle_refused(const std::string& path) {
  return invalid_argument(
      "{} is a pickled PyTorch checkpoint; kiln does not load pickles (loading one can run arbitrary code). "
      "Convert it to safetensors first, e.g. in Python: "
      "`model = transformers.AutoModelForCausalLM.from_pretrained(DIR); "
      "model.save_pretrained(OUT, safe_serialization=True)` or "
      "`safetensors.torch.save_file(torch.load(PATH, weights_only=True), \"model.safetensors\")`",
      path);
}

Result<File> File::parse(std::span<const uint8_t> bytes, std::string name) {
  if (bytes.size() < 8) {
    return invalid_argument("{}: file is {} bytes, too short for the 8-byte header length", name,
                            bytes.size());
  }
  const uint64_t n = read_u64_le(bytes.data());
  if (n > kMaxHeaderBytes) {
    return invalid_argument("{}: header length {} (offset 0) is over the limit of {} bytes", name, n,
                            kMaxHeaderBytes);
  }
  if (n > bytes.size() - 8) {
    return invalid_argument("{}: header length {} (offset 0) runs past the end of the file ({} bytes)", name,
                            n, bytes.size());
  }
  const std::string_view text(reinterpret_cast<const char*>(bytes.data() + 8), n);
  KILN_ASSIGN_OR_RETURN(const json header, json_file::parse(text, name + " header (at offset 8)"));
  if (!header.is_object()) {
    return invalid_argument("{}: header must be a JSON object, got {} ({})", name, json_file::preview(header),
                            json_file::type_name(header));
  }
  File f;
  f.name_ = std::move(name);
  f.header_bytes_ = n;
  const uint64_t data_size = bytes.size() - 8 - n;
  const uint8_t* data = bytes.data() + 8 + n;
  f.tensors_.reserve(header.size());
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      KILN_TRY(parse_metadata(value, f.name_, &f.metadata_));
      continue;
    }
    KILN_ASSIGN_OR_RETURN(Tensor t, parse_entry(key, value, f.name_, data_size));
    t.data = {data + t.offset, static_cast<size_t>(t.n_elements * dtype_size(t.dtype))};
    f.tensors_.push_back(std::move(t));
  }
  std::stable_sort(f.tensors_.begin(), f.tensors_.end(), [](const Tensor& a, const Tensor& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.data.size() < b.data.size();
  });
  KILN_TRY(check_tiling(f.tensors_, f.name_, data_size));
  for (size_t i = 0; i < f.tensors_.size(); ++i) f.index_.emplace(f.tensors_[i].name, i);
  return f;
}

Result<File> File::open(const std::string& path) {
  if (is_pickle_path(path)) return pickle_refused(path);
  KILN_ASSIGN_OR_RETURN(MappedFile map, MappedFile::open(path));
  auto shared = std::make_shared<MappedFile>(std::move(map));
  auto parsed = parse(shared->bytes(), path);
  if (!parsed.ok()) {
    if (looks_like_pickle(shared->bytes())) return pickle_refused(path);
    return parsed.status();
  }
  parsed->map_ = std::move(shared);
  return parsed;
}

const Tensor* File::find(std::string_view name) const {
  const auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

namespace fs = std::filesystem;

// A shard name from an index must be a plain file name in the index's folder (no paths).
Status check_shard_name(const std::string& shard, const std::string& tensor, const std::string& index_path) {
  if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos ||
      shard.find('\\') != std::string::npos || shard.find('\0') != std::string::npos) {
    return invalid_argument("{}: weight_map[\"{}\"] = \"{}\" is not a plain file name in the index's folder",
                            index_path, tensor, shard);
  }
  if (is_pickle_path(shard)) return pickle_refused(shard);
  if (!ends_with(shard, ".safetensors")) {
    return invalid_argument("{}: weight_map[\"{}\"] = \"{}\" is not a .safetensors file", index_path, tensor,
                            shard);
  }
  return {};
}

// {"weight_map": {tensor: shard}} -> the map, each shard name checked.
Result<std::map<std::string, std::string>> parse_weight_map(const json& index,
                                                            const std::string& index_path) {
  if (!index.is_object()) {
    return invalid_argument("{}: must be a JSON object, got {}", index_path, json_file::type_name(index));
  }
  if (const auto meta = index.find("metadata");
      meta != index.end() && !meta->is_object() && !meta->is_null()) {
    return invalid_argument("{}: \"metadata\" must be an object, got {}", index_path,
                            json_file::preview(*meta));
  }
  const auto wm = index.find("weight_map");
  if (wm == index.end()) return invalid_argument("{}: missing field \"weight_map\"", index_path);
  if (!wm->is_object()) {
    return invalid_argument("{}: \"weight_map\" must be an object, got {} ({})", index_path,
                            json_file::preview(*wm), json_file::type_name(*wm));
  }
  std::map<std::string, std::string> out;
  for (const auto& [tensor, shard] : wm->items()) {
    if (!shard.is_string()) {
      return invalid_argument("{}: weight_map[\"{}\"] must be a shard file name, got {}", index_path, tensor,
                              json_file::preview(shard));
    }
    KILN_TRY(check_shard_name(shard.get<std::string>(), tensor, index_path));
    out.emplace(tensor, shard.get<std::string>());
  }
  if (out.empty()) return invalid_argument("{}: \"weight_map\" is empty", index_path);
  return out;
}

}  // namespace

Result<Model> Model::open_file(const std::string& path) {
  Model m;
  KILN_ASSIGN_OR_RETURN(File f, File::open(path));
  m.shards_.push_back(std::move(f));
  for (const Tensor& t : m.shards_[0].tensors()) {
    m.tensors_.push_back(&t);
    m.index_.emplace(t.name, &t);
  }
  return m;
}

Result<Model> Model::open_index(const std::string& index_path) {
  KILN_ASSIGN_OR_RETURN(const json index, json_file::read(index_path, kMaxIndexBytes));
  KILN_ASSIGN_OR_RETURN(const auto weight_map, parse_weight_map(index, index_path));
  std::set<std::string> shard_names;  // sorted: model-00001-of-000NN first
  for (const auto& [tensor, shard] : weight_map) shard_names.insert(shard);
  const fs::path dir = fs::path(index_path).parent_path();

  Model m;
  m.shards_.reserve(shard_names.size());  // no reallocation after: tensors_ points into shards_
  for (const std::string& shard : shard_names) {
    const std::string path = (dir / shard).string();
    KILN_TRY(check_in_folder(dir.string(), path));
    auto f = File::open(path);
    if (!f.ok()) {
      if (f.status().code() == StatusCode::not_found) {
        return not_found("{}: shard \"{}\" named in weight_map is missing ({})", index_path, shard, path);
      }
      return f.status();
    }
    m.shards_.push_back(std::move(f).value());
  }
  std::unordered_map<std::string, std::string> owner;  // tensor -> the shard file name that holds it
  for (const File& f : m.shards_) {
    const std::string shard = fs::path(f.name()).filename().string();
    for (const Tensor& t : f.tensors()) {
      if (const auto [it, fresh] = owner.emplace(t.name, shard); !fresh) {
        return invalid_argument("{}: tensor \"{}\" is in two shards: \"{}\" and \"{}\"", index_path, t.name,
                                it->second, shard);
      }
      const auto wm = weight_map.find(t.name);
      if (wm == weight_map.end()) {
        return invalid_argument("{}: tensor \"{}\" in shard \"{}\" is not in weight_map", index_path, t.name,
                                shard);
      }
      m.index_.emplace(t.name, &t);
      m.tensors_.push_back(&t);
    }
  }
  for (const auto& [tensor, shard] : weight_map) {
    const auto it = owner.find(tensor);
    if (it == owner.end()) {
      return not_found("{}: shard \"{}\" lacks tensor \"{}\" (named in weight_map)", index_path, shard,
                       tensor);
    }
    if (it->second != shard) {
      return invalid_argument("{}: weight_map puts tensor \"{}\" in shard \"{}\" but it is in shard \"{}\"",
                              index_path, tensor, shard, it->second);
    }
  }
  return m;
}

Result<Model> Model::open_dir(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return not_found("model folder not found: {}", dir);
  const fs::path d(dir);
  for (const char* name : {"model.safetensors.index.json", "model.safetensors"})
    KILN_TRY(check_in_folder(dir, (d / name).string()));
  if (fs::exists(d / "model.safetensors.index.json", ec)) {
    return open_index((d / "model.safetensors.index.json").string());
  }
  if (fs::exists(d / "model.safetensors", ec)) return open_file((d / "model.safetensors").string());
  std::vector<std::string> safetensors_files;
  std::string pickle;
  // Incremented with an error_code: a folder that changes under us is an error, not an exception.
  for (fs::directory_iterator it(d, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (ends_with(name, ".safetensors")) safetensors_files.push_back(it->path().string());
    if (is_pickle_path(name) && pickle.empty()) pickle = it->path().string();
  }
  std::sort(safetensors_files.begin(), safetensors_files.end());
  if (ec) return io_error("cannot list {}: {}", dir, ec.message());
  if (safetensors_files.size() == 1) {
    KILN_TRY(check_in_folder(dir, safetensors_files[0]));
    return open_file(safetensors_files[0]);
  }
  if (safetensors_files.size() > 1) {
    return invalid_argument(
        "{}: {} .safetensors files but no model.safetensors.index.json to say which is which", dir,
        safetensors_files.size());
  }
  if (!pickle.empty()) return pickle_refused(pickle);
  return not_found("{}: no model.safetensors, model.safetensors.index.json or other .safetensors file", dir);
}

const Tensor* Model::find(std::string_view name) const {
  const auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : it->second;
}

}  // namespace kiln::safetensors
