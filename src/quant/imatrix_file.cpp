// Importance-matrix files, both of llama.cpp's formats (what llama-imatrix writes, what llama-quantize
// reads):
//
// GGUF (general.type = "imatrix"): keys imatrix.datasets (array of strings), imatrix.chunk_count and
// imatrix.chunk_size (u32); per weight, in name order, "<name>.in_sum2" f32 [n_cols, n_mat] (the raw sums of
// squares, one row per expert of a stacked MoE weight) and "<name>.counts" f32 [1, n_mat] (the activation
// rows each matrix's sums saw; 0 for an expert no token reached), trailing dimensions of 1 dropped as ggml
// writes them ([n_cols] and [1] for a dense weight). kiln's files add "<name>.in_amax" f32 [n_mat] (each
// matrix's largest |input| over the same rows) and, with --full, "<name>.in_gram" f32 [n_cols, n_cols] (the
// inputs' Gram matrix, over the same rows as the sums), which llama.cpp's reader skips.
//
// Legacy .dat, little-endian: i32 n_entries; per entry i32 name length, the name, i32 ncall, i32 nval, nval
// f32 values (each column's mean square times ncall, every matrix's n_cols one after another); then,
// optionally, i32 chunk count, i32 dataset-name length and the name.
#include "quant/imatrix_file.h"

#include <cmath>
#include <cstring>
#include <optional>
#include <span>
#include <string_view>
#include <utility>

#include "formats/gguf.h"
#include "formats/mmap.h"

namespace kiln::quant {

namespace {

constexpr std::string_view kSumsSuffix = ".in_sum2", kCountsSuffix = ".counts", kGramSuffix = ".in_gram",
                           kAmaxSuffix = ".in_amax";
constexpr const char* kDatasets = "imatrix.datasets";
constexpr const char* kChunkCount = "imatrix.chunk_count";
constexpr const char* kChunkSize = "imatrix.chunk_size";

// The bytes of a legacy file, read front to back; every read checks what is left.
class LegacyReader {
 public:
  LegacyReader(std::span<const uint8_t> bytes, std::string name) : b_(bytes), name_(std::move(name)) {}
  size_t offset() const { return pos_; }
  size_t left() const { return b_.size() - pos_; }
  Result<int32_t> i32(std::string_view what) {
    if (left() < 4) return truncated(what);
    int32_t v;
    std::memcpy(&v, b_.data() + pos_, 4);
    pos_ += 4;
    return v;
  }
  Result<std::string> text(int32_t len, std::string_view what) {
    if (len < 0 || static_cast<size_t>(len) > left()) {
      return invalid_argument("{}: {} length {} at byte {} is past the end of the file ({} bytes left)",
                              name_, what, len, pos_ - 4, left());
    }
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    return s;
  }
  Status floats(std::vector<float>& out, int32_t n, std::string_view what) {
    if (static_cast<uint64_t>(n) * 4 > left()) {
      return invalid_argument("{}: {}: {} values at byte {} need {} bytes, the file has {} left (truncated?)",
                              name_, what, n, pos_, static_cast<uint64_t>(n) * 4, left());
    }
    out.resize(static_cast<size_t>(n));
    std::memcpy(out.data(), b_.data() + pos_, out.size() * 4);
    pos_ += out.size() * 4;
    return Status::ok_status();
  }

 private:
  Status truncated(std::string_view what) const {
    return invalid_argument("{}: truncated: {} at byte {} is cut off ({} bytes left)", name_, what, pos_,
                            left());
  }
  std::span<const uint8_t> b_;
  std::string name_;
  size_t pos_ = 0;
};

Status check_finite(const std::string& file, const std::string& tensor, std::span<const float> v,
                    std::string_view what) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i])) return invalid_argument("{}: {}: {} {} is {}", file, tensor, what, i, v[i]);
  }
  return Status::ok_status();
}

Result<Imatrix> read_legacy(std::span<const uint8_t> bytes, const std::string& name) {
  LegacyReader r(bytes, name);
  KILN_ASSIGN_OR_RETURN(const int32_t n_entries, r.i32("the entry count"));
  if (n_entries < 1) {
    return invalid_argument("{}: neither an imatrix GGUF file nor a legacy imatrix: {} entries", name,
                            n_entries);
  }
  Imatrix im;
  im.legacy = true;
  for (int32_t e = 0; e < n_entries; ++e) {
    const std::string what = fmt::format("entry {} of {}", e + 1, n_entries);
    KILN_ASSIGN_OR_RETURN(const int32_t len, r.i32(what + "'s name length"));
    if (len < 1) return invalid_argument("{}: {} has a name of length {}", name, what, len);
    KILN_ASSIGN_OR_RETURN(std::string tensor, r.text(len, what + "'s name"));
    KILN_ASSIGN_OR_RETURN(const int32_t ncall, r.i32(what + "'s ncall"));
    KILN_ASSIGN_OR_RETURN(const int32_t nval, r.i32(what + "'s value count"));
    if (ncall < 0) return invalid_argument("{}: {} ({}): ncall = {} is negative", name, what, tensor, ncall);
    if (nval < 1) return invalid_argument("{}: {} ({}): {} values", name, what, tensor, nval);
    ImatrixTensor t;
    t.n_cols = nval;
    KILN_TRY(r.floats(t.sum2, nval, what + " (" + tensor + ")"));
    KILN_TRY(check_finite(name, tensor, t.sum2, "value"));
    // llama-quantize divides the values by ncall, and takes them as they are when it is 0.
    t.counts = {ncall > 0 ? static_cast<float>(ncall) : 1.0f};
    if (!im.tensors.emplace(tensor, std::move(t)).second) {
      return invalid_argument("{}: {} repeats the name {}", name, what, tensor);
    }
  }
  if (r.left() == 0) return im;  // no trailer: it is optional
  KILN_ASSIGN_OR_RETURN(const int32_t chunks, r.i32("the chunk count after the entries"));
  if (chunks < 0) return invalid_argument("{}: the chunk count {} is negative", name, chunks);
  im.chunk_count = chunks;
  if (r.left() == 0) return im;
  KILN_ASSIGN_OR_RETURN(const int32_t len, r.i32("the dataset name's length"));
  KILN_ASSIGN_OR_RETURN(std::string dataset, r.text(len, "the dataset name"));
  if (!dataset.empty()) im.datasets.push_back(std::move(dataset));
  if (r.left() != 0) {
    return invalid_argument("{}: {} bytes after the dataset name at byte {} (not a legacy imatrix?)", name,
                            r.left(), r.offset());
  }
  return im;
}

// The u32 key `key`: not_found naming it when absent (llama-quantize refuses a GGUF imatrix without it).
Result<int64_t> required_uint(const gguf::File& f, const char* key) {
  if (f.find(key) == nullptr) return not_found("{}: the imatrix key {} is missing", f.name(), key);
  KILN_ASSIGN_OR_RETURN(const uint64_t v, f.get_uint(key));
  if (v > UINT32_MAX) return invalid_argument("{}: {} = {} does not fit in 32 bits", f.name(), key, v);
  return static_cast<int64_t>(v);
}

// One weight's sums and counts, checked against each other.
Result<ImatrixTensor> read_entry(const gguf::File& f, const std::string& name, const gguf::TensorInfo& sums,
                                 const gguf::TensorInfo& counts) {
  for (const gguf::TensorInfo* t : {&sums, &counts}) {
    if (t->type != DType::f32)
      return invalid_argument("{}: {} is {}, not f32", f.name(), t->name, dtype_name(t->type));
  }
  ImatrixTensor t;
  t.n_cols = sums.shape.empty() ? 1 : sums.shape[0];
  t.n_mat = t.n_cols > 0 ? sums.n_elements() / t.n_cols : 0;
  if (t.n_cols < 1 || t.n_mat < 1) {
    return invalid_argument("{}: {} holds {} values", f.name(), sums.name, sums.n_elements());
  }
  if (counts.n_elements() != t.n_mat) {
    return invalid_argument("{}: {} has {} values but {} holds {} matrices of {} columns", f.name(),
                            counts.name, counts.n_elements(), sums.name, t.n_mat, t.n_cols);
  }
  t.sum2.resize(static_cast<size_t>(sums.n_elements()));
  std::memcpy(t.sum2.data(), sums.data, t.sum2.size() * 4);
  t.counts.resize(static_cast<size_t>(t.n_mat));
  std::memcpy(t.counts.data(), counts.data, t.counts.size() * 4);
  KILN_TRY(check_finite(f.name(), sums.name, t.sum2, "value"));
  KILN_TRY(check_finite(f.name(), counts.name, t.counts, "count"));
  for (int64_t m = 0; m < t.n_mat; ++m) {
    float& c = t.counts[static_cast<size_t>(m)];
    if (c < 0) return invalid_argument("{}: {}: count {} is {}", f.name(), counts.name, m, c);
    c = std::round(c);  // llama.cpp reads the counts as integers
    if (c > 0) continue;
    for (int64_t i = 0; i < t.n_cols; ++i) {
      if (t.sum2[static_cast<size_t>(m * t.n_cols + i)] != 0.0f) {
        return invalid_argument("{}: {}: matrix {} saw no rows (count 0) but its sums are not 0", f.name(),
                                name, m);
      }
    }
  }
  return t;
}

Result<Imatrix> read_gguf(std::span<const uint8_t> bytes, const std::string& name,
                          const std::shared_ptr<const MappedFile>& map) {
  KILN_ASSIGN_OR_RETURN(const gguf::File f, gguf::File::parse(bytes, name));
  if (f.find("general.type") != nullptr) {
    KILN_ASSIGN_OR_RETURN(const std::string type, f.get_string("general.type"));
    if (type != "imatrix") {
      return invalid_argument("{}: general.type is \"{}\", not \"imatrix\": not an importance matrix", name,
                              type);
    }
  }
  Imatrix im;
  KILN_ASSIGN_OR_RETURN(im.chunk_count, required_uint(f, kChunkCount));
  KILN_ASSIGN_OR_RETURN(im.chunk_size, required_uint(f, kChunkSize));
  if (f.find(kDatasets) == nullptr) return not_found("{}: the imatrix key {} is missing", name, kDatasets);
  KILN_ASSIGN_OR_RETURN(im.datasets, f.get_string_array(kDatasets));
  // Each weight's pair of tensors, by weight name.
  std::map<std::string, std::pair<const gguf::TensorInfo*, const gguf::TensorInfo*>> pairs;
  std::map<std::string, const gguf::TensorInfo*> grams, amaxes;
  for (const gguf::TensorInfo& t : f.tensors()) {
    const std::string_view n = t.name;
    if (n.ends_with(kGramSuffix) && n.size() > kGramSuffix.size()) {
      grams[std::string(n.substr(0, n.size() - kGramSuffix.size()))] = &t;
    } else if (n.ends_with(kAmaxSuffix) && n.size() > kAmaxSuffix.size()) {
      amaxes[std::string(n.substr(0, n.size() - kAmaxSuffix.size()))] = &t;
    } else if (n.ends_with(kSumsSuffix) && n.size() > kSumsSuffix.size()) {
      pairs[std::string(n.substr(0, n.size() - kSumsSuffix.size()))].first = &t;
    } else if (n.ends_with(kCountsSuffix) && n.size() > kCountsSuffix.size()) {
      pairs[std::string(n.substr(0, n.size() - kCountsSuffix.size()))].second = &t;
    }
  }
  if (pairs.empty()) {
    return invalid_argument("{}: no <weight>{} / <weight>{} tensors: not an importance matrix", name,
                            kSumsSuffix, kCountsSuffix);
  }
  for (const auto& [weight, p] : pairs) {
    if (p.first == nullptr || p.second == nullptr) {
      return invalid_argument("{}: {}{} has no {}{} beside it", name, weight,
                              p.first ? kSumsSuffix : kCountsSuffix, weight,
                              p.first ? kCountsSuffix : kSumsSuffix);
    }
    KILN_ASSIGN_OR_RETURN(ImatrixTensor t, read_entry(f, weight, *p.first, *p.second));
    if (const auto g = grams.find(weight); g != grams.end()) {
      const gguf::TensorInfo& gi = *g->second;
      if (gi.type != DType::f32 || t.n_mat != 1 || gi.n_elements() != t.n_cols * t.n_cols) {
        return invalid_argument("{}: {} is {} [{} values], expected f32 [{}, {}] for {}", name, gi.name,
                                dtype_name(gi.type), gi.n_elements(), t.n_cols, t.n_cols, weight);
      }
      // GGUF aligns tensor data (to 32 bytes by default, always to 4 or more): a float view is aligned.
      t.gram_mapped = {reinterpret_cast<const float*>(gi.data), static_cast<size_t>(gi.n_elements())};
      KILN_TRY(check_finite(name, gi.name, t.gram_mapped, "value"));
      im.mapping = map;
      grams.erase(g);
    }
    if (const auto a = amaxes.find(weight); a != amaxes.end()) {
      const gguf::TensorInfo& ai = *a->second;
      if (ai.type != DType::f32 || ai.n_elements() != t.n_mat) {
        return invalid_argument("{}: {} is {} [{} values], expected f32 [{}] for {}", name, ai.name,
                                dtype_name(ai.type), ai.n_elements(), t.n_mat, weight);
      }
      t.amax.resize(static_cast<size_t>(t.n_mat));
      std::memcpy(t.amax.data(), ai.data, t.amax.size() * 4);
      KILN_TRY(check_finite(name, ai.name, t.amax, "value"));
      for (const float v : t.amax) {
        if (v < 0) return invalid_argument("{}: {}: a range of {} is negative", name, ai.name, v);
      }
      amaxes.erase(a);
    }
    im.tensors.emplace(weight, std::move(t));
  }
  for (const auto* orphans : {&grams, &amaxes}) {
    if (!orphans->empty()) {
      return invalid_argument("{}: {}{} has no {}{} beside it", name, orphans->begin()->first,
                              orphans == &grams ? kGramSuffix : kAmaxSuffix, orphans->begin()->first,
                              kSumsSuffix);
    }
  }
  return im;
}

}  // namespace

Result<Imatrix> read_imatrix(const std::filesystem::path& path) {
  const std::string name = path.string();
  KILN_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::open(name));
  const auto map = std::make_shared<const MappedFile>(std::move(mapped));
  const std::span<const uint8_t> bytes = map->bytes();
  if (bytes.empty()) return invalid_argument("{}: the file is empty", name);
  if (bytes.size() >= 4 && std::memcmp(bytes.data(), "GGUF", 4) == 0) return read_gguf(bytes, name, map);
  return read_legacy(bytes, name);
}

Status write_imatrix(const Imatrix& imatrix, const std::filesystem::path& path) {
  const std::string name = path.string();
  gguf::Writer w;
  w.set("general.type", gguf::Value::str("imatrix"));
  std::vector<gguf::Value> datasets;
  for (const std::string& d : imatrix.datasets) datasets.push_back(gguf::Value::str(d));
  w.set(kDatasets, gguf::Value::array(gguf::ValueType::string, std::move(datasets)));
  for (const auto& [key, v] :
       {std::pair{kChunkCount, imatrix.chunk_count}, {kChunkSize, imatrix.chunk_size}}) {
    if (v < 0 || v > UINT32_MAX) return invalid_argument("{}: {} = {} is not a u32", name, key, v);
    w.set(key, gguf::Value::u32(static_cast<uint32_t>(v)));
  }
  const auto as_bytes = [](const std::vector<float>& v) {
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float));
  };
  for (const auto& [weight, t] : imatrix.tensors) {  // std::map: in name order, as llama-imatrix sorts them
    if (t.n_cols < 1 || t.n_mat < 1 || t.sum2.size() != static_cast<size_t>(t.n_cols * t.n_mat) ||
        t.counts.size() != static_cast<size_t>(t.n_mat)) {
      return invalid_argument("{}: {}: {} sums and {} counts for {} matrices of {} columns", name, weight,
                              t.sum2.size(), t.counts.size(), t.n_mat, t.n_cols);
    }
    const bool one = t.n_mat == 1;
    KILN_TRY(w.add_tensor(weight + std::string(kSumsSuffix),
                          one ? std::vector<int64_t>{t.n_cols} : std::vector<int64_t>{t.n_cols, t.n_mat},
                          DType::f32, as_bytes(t.sum2)));
    KILN_TRY(w.add_tensor(weight + std::string(kCountsSuffix),
                          one ? std::vector<int64_t>{1} : std::vector<int64_t>{1, t.n_mat}, DType::f32,
                          as_bytes(t.counts)));
    if (!t.amax.empty()) {
      if (t.amax.size() != static_cast<size_t>(t.n_mat))
        return invalid_argument("{}: {}: {} ranges for {} matrices", name, weight, t.amax.size(), t.n_mat);
      KILN_TRY(w.add_tensor(weight + std::string(kAmaxSuffix), {t.n_mat}, DType::f32, as_bytes(t.amax)));
    }
    const std::span<const float> gram = t.gram_values();
    if (gram.empty()) continue;
    if (!one || gram.size() != static_cast<size_t>(t.n_cols * t.n_cols)) {
      return invalid_argument("{}: {}: a Gram matrix of {} values for {} matrices of {} columns", name,
                              weight, gram.size(), t.n_mat, t.n_cols);
    }
    // Copied as the file is written, not into the writer first: a 1.5B model's are 9.8 GB.
    KILN_TRY(w.add_tensor_lazy(weight + std::string(kGramSuffix), {t.n_cols, t.n_cols}, DType::f32,
                               [gram](std::span<uint8_t> out) {
                                 std::memcpy(out.data(), gram.data(), out.size());
                                 return Status::ok_status();
                               }));
  }
  return w.write(name);
}

std::vector<float> importance(const ImatrixTensor& tensor, int64_t mat) {
  KILN_ASSERT(mat >= 0 && mat < tensor.n_mat);
  const float count = tensor.counts[static_cast<size_t>(mat)];
  std::vector<float> out(static_cast<size_t>(tensor.n_cols), 1.0f);  // count 0: 1 for every column
  if (count <= 0) return out;
  const float* sums = tensor.sum2.data() + mat * tensor.n_cols;
  for (int64_t i = 0; i < tensor.n_cols; ++i) out[static_cast<size_t>(i)] = sums[i] / count;
  return out;
}

std::vector<float> importance_all(const ImatrixTensor& tensor) {
  std::vector<float> out;
  out.reserve(tensor.sum2.size());
  for (int64_t m = 0; m < tensor.n_mat; ++m) {
    const std::vector<float> v = importance(tensor, m);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

}  // namespace kiln::quant
