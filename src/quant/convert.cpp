// kiln convert: a Hugging Face folder through hf_import (the model code's own view of it), its tensors cast
// to the requested type, its tokenizer and chat template as GGUF keys.
#include "kiln/convert.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "backends/backend.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "formats/gguf.h"
#include "formats/output_file.h"
#include "quant/hf_folder.h"

namespace kiln {

namespace {

Result<std::optional<DType>> parse_type(const std::string& type) {
  if (type.empty()) return std::optional<DType>();
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::q8_0}) {
    if (type == dtype_name(t)) return std::optional<DType>(t);
  }
  return invalid_argument("convert: type \"{}\" is not supported (f32, f16, bf16, q8_0)", type);
}

// The type tensor `t` is written as. An FP8 router (rare: checkpoints leave it unquantized) keeps full
// precision as f32, as the other routers keep their own type.
DType target_type(const gguf::TensorInfo& t, std::optional<DType> wanted) {
  if (wanted && t.type == DType::f8_e4m3 && t.name.ends_with("ffn_gate_inp.weight")) return DType::f32;
  if (!wanted || t.shape.size() < 2 || t.name.ends_with("ffn_gate_inp.weight")) return t.type;
  if (*wanted == DType::q8_0 && t.shape[0] % dtype_info(DType::q8_0).block_size != 0) return DType::f16;
  return *wanted;
}

// `t` re-encoded as `type` into `out` (its byte size), row by row through f32, the rows split over the pool's
// threads (each row is encoded alone: the same bytes whatever the threads).
void cast(const gguf::TensorInfo& t, DType type, std::span<uint8_t> out, ThreadPool& pool) {
  const DTypeInfo& src = dtype_info(t.type);
  const DTypeInfo& dst = dtype_info(type);
  const int64_t ne0 = t.shape[0], rows = t.n_elements() / ne0;
  const size_t src_row = static_cast<size_t>(ne0 / src.block_size * src.type_size);
  const size_t dst_row = static_cast<size_t>(ne0 / dst.block_size * dst.type_size);
  KILN_ASSERT(out.size() == dst_row * static_cast<size_t>(rows));
  // At least 65,536 elements a chunk, so that a small tensor stays on one thread.
  const int64_t min_rows = std::max<int64_t>(1, (int64_t{1} << 16) / ne0);
  pool.parallel_for(
      rows,
      [&](int64_t begin, int64_t end, int) {
        std::vector<float> row(static_cast<size_t>(ne0));
        for (int64_t r = begin; r < end; ++r) {
          src.dequantize_row(t.data + r * src_row, row.data(), ne0);
          dst.quantize_row(row.data(), out.data() + r * dst_row, ne0);
        }
      },
      min_rows);
}

}  // namespace

Result<ConvertStats> convert_model(const ConvertOptions& options) {
  KILN_ASSIGN_OR_RETURN(const std::optional<DType> wanted, parse_type(options.type));
  if (Status s = check_thread_count(options.threads); !s.ok())
    return Status(s.code(), "convert: " + s.message());
  if (options.output.empty()) return invalid_argument("convert: no output file given");
  // Before any work: the output may not be a device, a link, a folder or one of the folder's own files.
  if (Status s = check_output_path(options.output); !s.ok())
    return Status(s.code(), "convert: " + s.message());
  if (Status s = check_output_not_input(options.output, options.input); !s.ok())
    return Status(s.code(), "convert: " + s.message());
  KILN_ASSIGN_OR_RETURN(const std::shared_ptr<const gguf::File> file, quant::open_hf_folder(options.input));
  const gguf::TensorInfo* embd = file->find_tensor("token_embd.weight");
  if (embd == nullptr || embd->shape.size() != 2)
    return invalid_argument("{}: the model has no 2-d token embedding", options.input);

  // An FP8 checkpoint's weights (kiln's in-memory f8_e4m3 blocks) have no GGUF type: without --type nothing
  // could hold them, so refuse before any work.
  for (const gguf::TensorInfo& t : file->tensors()) {
    if (!dtype_info(target_type(t, wanted)).gguf) {
      return invalid_argument(
          "convert: {}: tensor {} is an FP8 weight, which GGUF has no type for: pass --type bf16, f16, q8_0 "
          "or "
          "f32 to write it dequantized",
          options.input, t.name);
    }
  }
  gguf::Writer w;
  KILN_TRY(quant::set_hf_folder_keys(options.input, *file, w));
  ConvertStats stats;
  stats.architecture = file->architecture();
  const size_t total = file->tensors().size();
  ThreadPool pool(options.threads);
  // Each tensor is produced while the file is written (one in memory at a time): copied from the folder's
  // memory maps, or cast.
  for (const gguf::TensorInfo& t : file->tensors()) {
    const DType type = target_type(t, wanted);
    KILN_TRY(w.add_tensor_lazy(t.name, t.shape, type,
                               [&t, type, &stats, &options, total, &pool](std::span<uint8_t> out) {
                                 if (type == t.type) {
                                   std::memcpy(out.data(), t.data, out.size());
                                 } else {
                                   cast(t, type, out, pool);
                                 }
                                 stats.tensor_bytes += out.size();
                                 ++stats.n_tensors;
                                 if (options.progress) options.progress(stats.n_tensors, total);
                                 return Status();
                               }));
  }
  // llama.cpp's file type ids (LLAMA_FTYPE_*): the type most weights have.
  const DType main = wanted.value_or(embd->type);
  const uint32_t ftype = main == DType::f32 ? 0 : main == DType::f16 ? 1 : main == DType::q8_0 ? 7 : 32;
  w.set("general.file_type", gguf::Value::u32(ftype));
  KILN_TRY(w.write(options.output));
  return stats;
}

}  // namespace kiln
