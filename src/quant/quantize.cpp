// kiln quantize: the input's tensors in llama.cpp's order, each typed by the mix (quant_mix.h) and converted
// while the output file is written (one tensor's output in memory at a time).
//
// Everything that can be wrong is found before the output file is created: the options, the input, every
// tensor's type, the importance matrix's entries. What remains are write errors (the temporary file is then
// removed) and non-finite weights (found as each tensor is converted).
#include "kiln/quantize.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <regex>
#include <sstream>
#include <unordered_map>

#include "backends/backend.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "formats/gguf.h"
#include "formats/output_file.h"
#include "quant/gptq.h"
#include "quant/hf_folder.h"
#include "quant/imatrix_file.h"
#include "quant/quant_budget.h"
#include "quant/quant_mix.h"

namespace kiln {

namespace {

constexpr uint32_t kQuantizationVersion = 2;  // general.quantization_version of the block layouts (ggml's)
// Keys llama-quantize writes for the importance matrix it used; strings cut at 127 bytes, as it cuts them.
constexpr size_t kImatrixKeyMax = 127;

// The shape as ggml counts dimensions: trailing 1s dropped (at least one dimension kept).
std::vector<int64_t> ggml_shape(std::vector<int64_t> shape) {
  while (shape.size() > 1 && shape.back() == 1) shape.pop_back();
  return shape;
}

Result<std::optional<DType>> parse_dtype(const std::string& name, const char* option) {
  if (name.empty()) return std::optional<DType>();
  const std::optional<DType> t = dtype_from_name(name);
  if (!t) return invalid_argument("{} '{}': unknown type (q8_0, q6_k, q4_k, f16, ...)", option, name);
  return t;
}

std::string file_type_names() {
  std::string s;
  for (const quant::FileTypeInfo& f : quant::file_types()) s += (s.empty() ? "" : ", ") + std::string(f.name);
  return s;
}

Result<quant::MixOptions> mix_options(const QuantizeOptions& o) {
  quant::MixOptions m;
  const std::optional<quant::FileType> ft = quant::file_type_from_name(o.type);
  if (!ft) return invalid_argument("unknown type '{}' (one of {})", o.type, file_type_names());
  m.file_type = *ft;
  KILN_ASSIGN_OR_RETURN(m.output_tensor_type, parse_dtype(o.output_tensor_type, "--output-tensor-type"));
  KILN_ASSIGN_OR_RETURN(m.token_embedding_type,
                        parse_dtype(o.token_embedding_type, "--token-embedding-type"));
  for (const std::string& spec : o.tensor_types) {
    KILN_ASSIGN_OR_RETURN(quant::TypeOverride ov, quant::parse_type_override(spec));
    m.overrides.push_back(std::move(ov));
  }
  m.pure = o.pure;
  m.leave_output = o.leave_output_tensor;
  m.has_imatrix = !o.imatrix.empty();
  return m;
}

Status check_output(const QuantizeOptions& o) {
  if (o.output.empty()) return invalid_argument("no output file given");
  KILN_TRY(check_output_path(o.output));
  KILN_TRY(check_output_not_input(o.output, o.input));
  std::error_code ec;
  if (std::filesystem::exists(o.output, ec) && !o.force)
    return invalid_argument("'{}' exists (--force replaces it)", o.output);
  return {};
}

Result<std::shared_ptr<const gguf::File>> open_input(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return quant::open_hf_folder(path);
  KILN_ASSIGN_OR_RETURN(gguf::File file, gguf::File::open(path));
  KILN_ASSIGN_OR_RETURN(const uint64_t n_split, file.get_uint_or("split.count", 1));
  if (n_split > 1)
    return unimplemented("{} is one of {} parts of a split model: merge them into one file first", path,
                         n_split);
  return std::make_shared<const gguf::File>(std::move(file));
}

// One tensor of the output, in write order.
struct Job {
  const gguf::TensorInfo* in;
  std::vector<int64_t> shape;                     // ggml_shape(in->shape)
  quant::TypeChoice choice;                       // its type
  const quant::ImatrixTensor* imatrix = nullptr;  // its importance, when it is converted and has one
  bool gptq = false;      // rounded by GPTQ with imatrix->gram (QuantizeOptions::method "gptq")
  bool budgeted = false;  // its type chosen by a target or a plan
  bool converted() const { return choice.type != in->type; }
  // The 2-d slices ([shape[0], shape[1]] each) of a stacked tensor (the experts of a 3-d MoE weight).
  int64_t n_mat() const { return in->n_elements() / (shape[0] * (shape.size() > 1 ? shape[1] : 1)); }
};

// Which tensors GPTQ rounds (QuantizeOptions::method "gptq"): the converted weight matrices whose imatrix
// entry has a Gram matrix and whose type gptq_quantize writes.
Status choose_gptq(const QuantizeOptions& o, const quant::Imatrix* imatrix, std::vector<Job>& jobs,
                   QuantizeStats& stats) {
  if (o.method != "gptq") return invalid_argument("--method {}: the methods are gptq (or none)", o.method);
  if (!(o.gptq_damp >= 0.0) || !std::isfinite(o.gptq_damp))
    return invalid_argument("--gptq-damp {} must be a finite number >= 0", o.gptq_damp);
  if (imatrix == nullptr)
    return invalid_argument("--method gptq needs --imatrix with Gram matrices (kiln imatrix --full)");
  for (Job& j : jobs) {
    j.gptq = j.converted() && j.imatrix != nullptr && j.imatrix->has_gram() && j.n_mat() == 1 &&
             gptq_supports(j.choice.type);
    stats.n_gptq += j.gptq ? 1 : 0;
  }
  if (stats.n_gptq == 0) {
    return invalid_argument(
        "--method gptq: no tensor to round: {} has no Gram matrices (kiln imatrix --full) for tensors of a "
        "type GPTQ writes",
        o.imatrix);
  }
  return {};
}

// The imatrix entry of each converted tensor, checked against its shape. llama.cpp's rules: a tensor without
// an entry is an error when its type needs one, a note otherwise; an entry whose size is not the tensor's
// row length times its matrices is an error, except for the token embedding (which imatrix tools see as a
// lookup, not a matmul). The size, not the shape: a legacy .dat entry holds a stacked weight's experts as one
// long row.
Status attach_imatrix(const quant::Imatrix& imatrix, const std::string& path, std::vector<Job>& jobs,
                      std::vector<std::string>& warnings) {
  for (const auto& [name, entry] : imatrix.tensors) {
    for (float v : quant::importance_all(entry)) {
      if (!std::isfinite(v))
        return invalid_argument("{}: entry '{}' holds a non-finite value ({})", path, name, v);
    }
  }
  for (Job& j : jobs) {
    if (!j.choice.quantizable || !j.converted()) continue;
    const auto it = imatrix.tensors.find(j.in->name);
    if (it == imatrix.tensors.end()) {
      if (j.choice.requires_imatrix) {
        return invalid_argument("{}: no entry for tensor '{}', which {} needs one for", path, j.in->name,
                                dtype_name(j.choice.type));
      }
      warnings.push_back(fmt::format("{}: no importance data in {}", j.in->name, path));
      continue;
    }
    const quant::ImatrixTensor& e = it->second;
    const int64_t ne0 = j.shape[0], n_mat = j.n_mat();
    if (e.n_cols * e.n_mat != ne0 * n_mat) {
      const std::string what = fmt::format(
          "the entry for '{}' has {} values ({} x {}); the tensor takes {} ({} "
          "columns x {} matrices)",
          j.in->name, e.n_cols * e.n_mat, e.n_mat, e.n_cols, ne0 * n_mat, ne0, n_mat);
      if (j.in->name == "token_embd.weight" && !j.choice.requires_imatrix) {
        warnings.push_back(fmt::format("{}: {}: not used", path, what));
        continue;
      }
      return invalid_argument("{}: {}", path, what);
    }
    j.imatrix = &e;
  }
  return {};
}

// A tensor's conversion can be done: its stored type can be read as f32, its new type written, and its
// rows are whole blocks of both.
Status check_convertible(const Job& j, bool allow_requantize) {
  const DTypeInfo& from = dtype_info(j.in->type);
  const DTypeInfo& to = dtype_info(j.choice.type);
  if (from.is_quantized && !allow_requantize) {
    return invalid_argument(
        "tensor '{}' is already quantized ({}): quantizing it again to {} loses more quality than quantizing "
        "the f16/f32 model; --allow-requantize does it anyway",
        j.in->name, from.name, to.name);
  }
  if (from.dequantize_row == nullptr)
    return unimplemented("tensor '{}': kiln cannot read type {} as numbers", j.in->name, from.name);
  if (to.quantize_rows == nullptr)
    return unimplemented("tensor '{}': kiln cannot write type {} yet", j.in->name, to.name);
  if (j.shape[0] % to.block_size != 0) {
    return invalid_argument("tensor '{}': rows of {} are not a multiple of {}'s block ({})", j.in->name,
                            j.shape[0], to.name, to.block_size);
  }
  return {};
}

// `j`'s rows as f32 (the whole tensor), or an error naming the first row that is not finite.
Result<std::vector<float>> read_rows(const Job& j, ThreadPool& pool) {
  const DTypeInfo& from = dtype_info(j.in->type);
  if (from.dequantize_row == nullptr)
    return unimplemented("tensor '{}': kiln cannot read type {} as numbers", j.in->name, from.name);
  const int64_t ne0 = j.shape[0];
  const int64_t n_rows = j.in->n_elements() / ne0;
  const size_t src_row = static_cast<size_t>(ne0 / from.block_size * from.type_size);
  std::vector<float> w(static_cast<size_t>(n_rows * ne0));
  pool.parallel_for(n_rows, [&](int64_t begin, int64_t end, int) {
    for (int64_t r = begin; r < end; ++r)
      from.dequantize_row(j.in->data + r * src_row, w.data() + r * ne0, ne0);
  });
  for (size_t i = 0; i < w.size(); ++i) {
    if (!std::isfinite(w[i])) {
      return invalid_argument("tensor '{}': row {} holds a value that is not a finite number", j.in->name,
                              static_cast<int64_t>(i) / ne0);
    }
  }
  return w;
}

// `j` rounded by GPTQ: the whole tensor in f32 (one tensor at a time), its rows over the pool's threads. A
// Hessian that is not positive definite even dampened (out_of_range) leaves `out` to the caller's plain
// rounding.
Status convert_gptq(const Job& j, std::span<uint8_t> out, const QuantizeOptions& o, ThreadPool& pool,
                    Backend* backend) {
  KILN_ASSIGN_OR_RETURN(const std::vector<float> w, read_rows(j, pool));
  const int64_t ne0 = j.shape[0];
  const int64_t n_rows = j.in->n_elements() / ne0;
  GptqOptions go;
  go.damp = o.gptq_damp;
  go.act_order = o.gptq_act_order;
  go.pool = &pool;
  go.backend = backend;
  const Status s =
      gptq_quantize(w.data(), n_rows, ne0, j.imatrix->gram_values().data(), j.choice.type, go, out.data());
  if (!s.ok()) return Status(s.code(), fmt::format("tensor '{}': GPTQ: {}", j.in->name, s.message()));
  return {};
}

// `j`'s rows written as its new type into `out`: chunks of whole rows over the pool's threads, each read as
// f32 into the thread's own buffer (an f32 tensor is read in place) and quantized with its matrix's
// importance. Each row is encoded alone, so the bytes do not depend on the threads.
Status convert_rows(const Job& j, std::span<uint8_t> out, ThreadPool& pool) {
  const DTypeInfo& from = dtype_info(j.in->type);
  const DTypeInfo& to = dtype_info(j.choice.type);
  const int64_t ne0 = j.shape[0];
  const int64_t n_rows = j.in->n_elements() / ne0;
  const int64_t rows_per_mat = j.shape.size() > 1 ? j.shape[1] : 1;  // a 2-d slice's rows (an expert's)
  const size_t src_row = static_cast<size_t>(ne0 / from.block_size * from.type_size);
  const size_t dst_row = static_cast<size_t>(ne0 / to.block_size * to.type_size);
  KILN_ASSERT(out.size() == dst_row * static_cast<size_t>(n_rows));
  // [n_mat][ne0]: matrix m's rows take [m * ne0, (m + 1) * ne0)
  const std::vector<float> importance = j.imatrix ? quant::importance_all(*j.imatrix) : std::vector<float>();
  const int64_t chunk = std::max<int64_t>(1, (int64_t{1} << 16) / ne0);  // rows: ~64K values a chunk
  std::vector<std::vector<float>> buffers(static_cast<size_t>(pool.n_threads()));
  std::atomic<int64_t> first_bad{std::numeric_limits<int64_t>::max()};  // the first row with a nan or inf
  pool.parallel_dynamic(n_rows, chunk, [&](int64_t begin, int64_t end, int thread) {
    std::vector<float>& buf = buffers[static_cast<size_t>(thread)];
    for (int64_t r = begin; r < end;) {
      const int64_t mat = r / rows_per_mat;
      const int64_t stop = std::min(end, (mat + 1) * rows_per_mat);  // a piece within one matrix
      const int64_t n = stop - r;
      const float* src;
      if (j.in->type == DType::f32) {
        src = reinterpret_cast<const float*>(j.in->data + r * src_row);
      } else {
        buf.resize(static_cast<size_t>(chunk * ne0));
        for (int64_t i = 0; i < n; ++i)
          from.dequantize_row(j.in->data + (r + i) * src_row, buf.data() + i * ne0, ne0);
        src = buf.data();
      }
      for (int64_t i = 0; i < n * ne0; ++i) {
        if (!std::isfinite(src[i])) {
          int64_t row = r + i / ne0, seen = first_bad.load();
          while (row < seen && !first_bad.compare_exchange_weak(seen, row)) {
          }
          break;
        }
      }
      to.quantize_rows(src, out.data() + r * dst_row, n, ne0,
                       importance.empty() ? nullptr : importance.data() + mat * ne0);
      r = stop;
    }
  });
  if (const int64_t row = first_bad.load(); row != std::numeric_limits<int64_t>::max())
    return invalid_argument("tensor '{}': row {} holds a value that is not a finite number", j.in->name, row);
  return {};
}

// The output's metadata: the input's keys in order, less those that describe the input's own encoding or
// split, then the quantization version and file type (and the imatrix keys), which llama-quantize appends.
Status set_metadata(const QuantizeOptions& o, const gguf::File& file, bool hf_folder,
                    const quant::FileTypeInfo& ft, const quant::Imatrix* imatrix, gguf::Writer& w) {
  if (hf_folder) {
    KILN_TRY(quant::set_hf_folder_keys(o.input, file, w));
  } else {
    for (const auto& [k, v] : file.metadata()) {
      if (k == "general.quantization_version" || k == "general.file_type" || k.starts_with("split."))
        continue;
      w.set(k, v);
    }
  }
  w.set("general.quantization_version", gguf::Value::u32(kQuantizationVersion));
  w.set("general.file_type", gguf::Value::u32(static_cast<uint32_t>(ft.type)));
  if (imatrix != nullptr) {
    w.set("quantize.imatrix.file", gguf::Value::str(o.imatrix.substr(0, kImatrixKeyMax)));
    if (!imatrix->datasets.empty())
      w.set("quantize.imatrix.dataset", gguf::Value::str(imatrix->datasets[0].substr(0, kImatrixKeyMax)));
    w.set("quantize.imatrix.entries_count", gguf::Value::u32(static_cast<uint32_t>(imatrix->tensors.size())));
    if (imatrix->chunk_count > 0)
      w.set("quantize.imatrix.chunks_count", gguf::Value::u32(static_cast<uint32_t>(imatrix->chunk_count)));
  }
  return {};
}

void add_to_stats(const Job& j, QuantizeStats& stats) {
  QuantizeTensor qt{j.in->name,    j.shape,       dtype_name(j.in->type), dtype_name(j.choice.type),
                    j.in->n_bytes, j.in->n_bytes, j.choice.note};
  if (j.converted()) {
    const DTypeInfo& to = dtype_info(j.choice.type);
    qt.bytes_out = static_cast<uint64_t>(j.in->n_elements() / to.block_size * to.type_size);
    ++stats.n_converted;
    stats.n_requantized += dtype_info(j.in->type).is_quantized ? 1 : 0;
  }
  stats.n_fallback += j.choice.fell_back ? 1 : 0;
  stats.n_elements += static_cast<uint64_t>(j.in->n_elements());
  stats.bytes_in += qt.bytes_in;
  stats.bytes_out += qt.bytes_out;
  stats.tensors.push_back(std::move(qt));
}

// --- size budgets and plans -------------------------------------------------------------------------------

// A weight matrix whose type a target may choose (QuantizeOptions::target_bpw): converted, one 2-d matrix,
// rows that fit a ladder, not the token embedding, the output head, or a tensor a --tensor-type pattern
// names.
bool budget_candidate(const Job& j, const quant::MixOptions& mix) {
  if (!j.choice.quantizable || !j.converted() || j.shape.size() != 2 || j.n_mat() != 1) return false;
  const std::string& name = j.in->name;
  if (name == "token_embd.weight" || name == "output.weight") return false;
  for (const quant::TypeOverride& ov : mix.overrides) {
    if (std::regex_search(name, ov.regex)) return false;
  }
  return !quant::budget_ladder(j.shape[0]).empty();
}

uint64_t padded_bytes(const Job& j, DType type, uint64_t alignment) {
  const DTypeInfo& t = dtype_info(type);
  const auto n = static_cast<uint64_t>(j.in->n_elements() / t.block_size * t.type_size);
  return (n + alignment - 1) / alignment * alignment;
}

// QuantizeOptions::target_bpw / target_size: the candidates' types from their rounding errors
// (quant_budget.h) within what the budget leaves after the header and the other tensors.
Status choose_budget(const QuantizeOptions& o, const quant::MixOptions& mix, const gguf::File& file,
                     uint64_t header_bytes, std::vector<Job>& jobs, QuantizeStats& stats) {
  if (o.target_bpw != 0.0 && o.target_size != 0)
    return invalid_argument("--target-bpw and --target-size: give one of them");
  if (!(o.target_bpw >= 0.0) || !std::isfinite(o.target_bpw) || o.target_bpw > 32.0)
    return invalid_argument("--target-bpw {} is not in (0, 32]", o.target_bpw);
  uint64_t n_elements = 0;
  for (const Job& j : jobs) n_elements += static_cast<uint64_t>(j.in->n_elements());
  const uint64_t budget =
      o.target_size != 0 ? o.target_size : static_cast<uint64_t>(o.target_bpw * n_elements / 8.0);
  stats.budget_bytes = budget;
  // What the budget cannot go below, before any tensor is read: the header, the tensors it does not type,
  // and the smallest type of each it does.
  uint64_t fixed = header_bytes, least = 0;
  for (const Job& j : jobs) {
    if (!budget_candidate(j, mix)) {
      fixed += padded_bytes(j, j.choice.type, file.alignment());
      continue;
    }
    uint64_t smallest = UINT64_MAX;
    for (DType t : quant::budget_ladder(j.shape[0]))
      smallest = std::min(smallest, padded_bytes(j, t, file.alignment()));
    least += smallest;
  }
  if (fixed + least > budget) {
    return resource_exhausted(
        "the target of {} bytes ({:.3f} bits per weight) cannot be met: the header and the tensors "
        "it does not type (embeddings, output head, norms) take {} bytes, the smallest types of the "
        "others {}: at least {} bytes ({:.3f} bits per weight)",
        budget, budget * 8.0 / static_cast<double>(n_elements), fixed, least, fixed + least,
        (fixed + least) * 8.0 / static_cast<double>(n_elements));
  }
  ThreadPool pool(o.threads);
  std::vector<size_t> chosen;  // jobs the budget types
  std::vector<std::vector<quant::BudgetPoint>> points;
  for (size_t i = 0; i < jobs.size(); ++i) {
    Job& j = jobs[i];
    if (!budget_candidate(j, mix)) continue;
    const std::vector<DType> ladder = quant::budget_ladder(j.shape[0]);
    KILN_ASSIGN_OR_RETURN(const std::vector<float> w, read_rows(j, pool));
    std::vector<DType> types = ladder;
    if (std::find(types.begin(), types.end(), j.choice.type) == types.end() &&
        dtype_info(j.choice.type).quantize_rows != nullptr &&
        j.shape[0] % dtype_info(j.choice.type).block_size == 0)
      types.push_back(j.choice.type);  // the mix's own type: its error, for the comparison printed
    const std::vector<float> importance =
        j.imatrix != nullptr ? quant::importance_all(*j.imatrix) : std::vector<float>();
    const std::vector<double> errors =
        quant::rounding_errors(w.data(), j.in->n_elements() / j.shape[0], j.shape[0],
                               importance.empty() ? nullptr : importance.data(), types, pool);
    for (size_t k = 0; k < types.size(); ++k) {
      if (types[k] == j.choice.type) stats.mix_error += errors[k];
    }
    std::vector<quant::BudgetPoint>& pts = points.emplace_back();
    for (size_t k = 0; k < ladder.size(); ++k)
      pts.push_back({ladder[k], padded_bytes(j, ladder[k], file.alignment()), errors[k]});
    chosen.push_back(i);
  }
  if (chosen.empty()) return invalid_argument("--target-*: the model has no weight matrix a target can type");
  Result<std::vector<size_t>> pick = quant::allocate_budget(points, budget - fixed);
  if (!pick.ok()) {
    return resource_exhausted(
        "the target of {} bytes cannot be met: {} bytes go to the header and the tensors it does not type, "
        "and {}",
        budget, fixed, pick.status().message());
  }
  for (size_t c = 0; c < chosen.size(); ++c) {
    Job& j = jobs[chosen[c]];
    const quant::BudgetPoint& p = points[c][(*pick)[c]];
    j.choice.type = p.type;
    j.choice.fell_back = false;
    j.choice.note = "";
    j.budgeted = true;
    stats.budget_error += p.error;
  }
  return {};
}

// A plan file: a comment line, then "name type ne0,ne1,..." a tensor.
Status apply_plan(const std::string& path, std::vector<Job>& jobs) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return io_error("--plan '{}': cannot open it: {}", path, std::strerror(errno));
  std::string text;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
  std::fclose(f);
  std::unordered_map<std::string, Job*> by_name;
  for (Job& j : jobs) by_name[j.in->name] = &j;
  std::istringstream lines(text);
  std::string line;
  for (int line_no = 1; std::getline(lines, line); ++line_no) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string name, type, shape;
    if (!(fields >> name >> type >> shape)) {
      return invalid_argument("--plan '{}' line {}: expected 'NAME TYPE SHAPE', got '{}'", path, line_no,
                              line.substr(0, 80));
    }
    const auto it = by_name.find(name);
    if (it == by_name.end()) {
      return invalid_argument(
          "--plan '{}' line {}: the model has no tensor '{}' (a plan made for another model?)", path, line_no,
          name);
    }
    Job& j = *it->second;
    std::string have;
    for (int64_t d : j.shape) have += (have.empty() ? "" : ",") + std::to_string(d);
    if (shape != have) {
      return invalid_argument(
          "--plan '{}' line {}: tensor '{}' is [{}] in the plan but [{}] in the model (a plan made "
          "for another model?)",
          path, line_no, name, shape, have);
    }
    const std::optional<DType> t = dtype_from_name(type);
    if (!t) return invalid_argument("--plan '{}' line {}: unknown type '{}'", path, line_no, type);
    if (!j.choice.quantizable) {
      return invalid_argument("--plan '{}' line {}: tensor '{}' is not a weight matrix the mix quantizes",
                              path, line_no, name);
    }
    j.choice.type = *t;
    j.choice.fell_back = false;
    j.choice.note = "";
    j.budgeted = true;
  }
  return {};
}

Status save_plan(const std::string& path, const QuantizeStats& stats, const std::vector<Job>& jobs) {
  KILN_ASSIGN_OR_RETURN(OutputFile out, OutputFile::create(path));
  std::string text = fmt::format("# kiln quantize plan: {} {}, {} tensors\n", stats.architecture,
                                 stats.file_type, jobs.size());
  for (const Job& j : jobs) {
    if (!j.choice.quantizable) continue;
    std::string shape;
    for (int64_t d : j.shape) shape += (shape.empty() ? "" : ",") + std::to_string(d);
    text += fmt::format("{} {} {}\n", j.in->name, dtype_name(j.choice.type), shape);
  }
  if (std::fwrite(text.data(), 1, text.size(), out.stream()) != text.size())
    return io_error("--save-plan '{}': write failed: {}", path, std::strerror(errno));
  return out.commit();
}

// The output file's header (metadata and tensor infos, padded), which the tensors' types do not change.
Result<uint64_t> header_bytes(const QuantizeOptions& o, const gguf::File& file, bool hf_folder,
                              const quant::FileTypeInfo& ft, const quant::Imatrix* imatrix,
                              const std::vector<Job>& jobs) {
  gguf::Writer w(file.alignment());
  KILN_TRY(set_metadata(o, file, hf_folder, ft, imatrix, w));
  uint64_t tensors = 0;
  for (const Job& j : jobs) {
    KILN_TRY(
        w.add_tensor_lazy(j.in->name, j.shape, j.choice.type, [](std::span<uint8_t>) { return Status(); }));
    tensors += padded_bytes(j, j.choice.type, file.alignment());
  }
  KILN_ASSIGN_OR_RETURN(const uint64_t size, w.file_size());
  return size - tensors;
}

// The output file: `jobs` in order, each converted (or copied) while it is written.
Status write_output(const QuantizeOptions& o, const gguf::File& file, bool hf_folder,
                    const quant::FileTypeInfo& ft, const quant::Imatrix* imatrix,
                    const std::vector<Job>& jobs, const QuantizeEvents& events) {
  gguf::Writer w(file.alignment());
  KILN_TRY(set_metadata(o, file, hf_folder, ft, imatrix, w));
  ThreadPool pool(o.threads);
  // GPTQ's factor and updates on a GPU, when the device is one.
  std::unique_ptr<Backend> device;
  if (std::any_of(jobs.begin(), jobs.end(), [](const Job& j) { return j.gptq; })) {
    KILN_ASSIGN_OR_RETURN(device, gptq_device(o.device));
    if (device != nullptr && events.note)
      events.note(fmt::format("GPTQ's factors and updates on {}", device->name()));
  }
  uint64_t written = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    auto fill = [&, i](std::span<uint8_t> out) -> Status {
      const Job& j = jobs[i];
      Status gptq = Status::ok_status();
      if (j.gptq) gptq = convert_gptq(j, out, o, pool, device.get());
      if (gptq.code() == StatusCode::out_of_range) {
        if (events.note) events.note(fmt::format("{}; rounded without GPTQ", gptq.message()));
        KILN_TRY(convert_rows(j, out, pool));
      } else if (j.gptq) {
        KILN_TRY(gptq);
      } else if (j.converted()) {
        KILN_TRY(convert_rows(j, out, pool));
      } else {
        std::memcpy(out.data(), j.in->data, out.size());
      }
      file.drop_pages(j.in->data, j.in->n_bytes);  // read once: out of the resident set
      written += out.size();
      if (events.tensor_done) events.tensor_done(i, written);
      return {};
    };
    KILN_TRY(w.add_tensor_lazy(jobs[i].in->name, jobs[i].shape, jobs[i].choice.type, std::move(fill)));
  }
  return w.write(o.output);
}

Result<QuantizeStats> quantize(const QuantizeOptions& o, const QuantizeEvents& events) {
  KILN_ASSIGN_OR_RETURN(const quant::MixOptions mix, mix_options(o));
  KILN_TRY(check_thread_count(o.threads));
  if (!o.dry_run) KILN_TRY(check_output(o));
  std::optional<quant::Imatrix> imatrix;
  if (!o.imatrix.empty()) {
    KILN_ASSIGN_OR_RETURN(imatrix, quant::read_imatrix(o.imatrix));
  }
  std::error_code ec;
  const bool hf_folder = std::filesystem::is_directory(o.input, ec);
  KILN_ASSIGN_OR_RETURN(const std::shared_ptr<const gguf::File> file, open_input(o.input));
  KILN_ASSIGN_OR_RETURN(const quant::ModelFacts facts, quant::model_facts(*file));

  // Every tensor's type, in llama.cpp's order.
  std::vector<std::string> names;
  for (const gguf::TensorInfo& t : file->tensors()) names.push_back(t.name);
  std::vector<Job> jobs;
  for (size_t i : quant::sort_like_llama(names))
    jobs.push_back({&file->tensors()[i], ggml_shape(file->tensors()[i].shape), {}, nullptr});
  std::vector<quant::TensorDesc> descs;
  for (const Job& j : jobs) descs.push_back({j.in->name, j.shape, j.in->type});
  KILN_ASSIGN_OR_RETURN(std::vector<quant::TypeChoice> choices, quant::choose_types(facts, descs, mix));
  const quant::FileTypeInfo& ft = quant::file_type_info(mix.file_type);

  QuantizeStats stats;
  stats.architecture = facts.arch;
  stats.file_type = ft.name;
  stats.used_imatrix = imatrix.has_value();
  std::vector<std::string> warnings;
  for (size_t i = 0; i < jobs.size(); ++i) {
    Job& j = jobs[i];
    j.choice = std::move(choices[i]);
    if (!imatrix && j.choice.quantizable && j.choice.requires_imatrix) {
      if (!o.dry_run) {
        return invalid_argument("{} needs an importance matrix (--imatrix): tensor '{}' would be {}", ft.name,
                                j.in->name, dtype_name(j.choice.type));
      }
      warnings.push_back(fmt::format("{}: {} needs an importance matrix (--imatrix)", j.in->name,
                                     dtype_name(j.choice.type)));
    }
  }
  if (imatrix) KILN_TRY(attach_imatrix(*imatrix, o.imatrix, jobs, warnings));
  if (o.target_bpw != 0.0 || o.target_size != 0) {
    if (!o.plan.empty()) return invalid_argument("--plan and a --target-*: give one of them");
    KILN_ASSIGN_OR_RETURN(const uint64_t head,
                          header_bytes(o, *file, hf_folder, ft, imatrix ? &*imatrix : nullptr, jobs));
    KILN_TRY(choose_budget(o, mix, *file, head, jobs, stats));
  } else if (!o.plan.empty()) {
    KILN_TRY(apply_plan(o.plan, jobs));
  }
  for (const Job& j : jobs) {
    if (!j.choice.note.empty()) warnings.push_back(j.in->name + ": " + j.choice.note);
    stats.n_budget += j.budgeted ? 1 : 0;
    add_to_stats(j, stats);
  }
  if (!o.method.empty()) KILN_TRY(choose_gptq(o, imatrix ? &*imatrix : nullptr, jobs, stats));
  if (!o.save_plan.empty()) KILN_TRY(save_plan(o.save_plan, stats, jobs));
  if (!o.dry_run) {
    for (const Job& j : jobs)
      if (j.converted()) KILN_TRY(check_convertible(j, o.allow_requantize));
  }
  if (events.planned) events.planned(stats, warnings);
  if (o.dry_run) return stats;

  KILN_TRY(write_output(o, *file, hf_folder, ft, imatrix ? &*imatrix : nullptr, jobs, events));
  stats.file_bytes = std::filesystem::file_size(o.output, ec);
  return stats;
}

}  // namespace

Result<QuantizeStats> quantize_model(const QuantizeOptions& options, const QuantizeEvents& events) {
  Result<QuantizeStats> r = quantize(options, events);
  if (!r.ok()) return Status(r.status().code(), "quantize: " + r.status().message());
  return r;
}

}  // namespace kiln
