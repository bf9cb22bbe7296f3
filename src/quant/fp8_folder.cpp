#include "quant/fp8_folder.h"

#include <fmt/format.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <vector>

#include "backends/backend.h"
#include "core/half.h"
#include "core/quant/quant_blocks.h"
#include "core/thread_pool.h"
#include "formats/folder.h"
#include "formats/output_file.h"
#include "formats/safetensors.h"
#include "models/hf_import.h"
#include "quant/gptq.h"
#include "quant/imatrix_file.h"

namespace kiln::quant {

namespace {

namespace fs = std::filesystem;

// The projections written in FP8: "model.layers.N.<...>.<proj>.weight" (also under "model.language_model."),
// experts' included; routers ("mlp.gate", "shared_expert_gate") and everything outside the layers are not.
bool quantized_weight(const std::string& name, const safetensors::Tensor& t) {
  static const std::regex kProj(
      R"(^(model\.|model\.language_model\.|language_model\.model\.)layers\.\d+\..*\b)"
      R"((q_proj|k_proj|v_proj|o_proj|qkv_proj|gate_proj|up_proj|down_proj|gate_up_proj|w1|w2|w3)\.weight$)");
  return t.shape.size() == 2 && std::regex_search(name, kProj);
}

// Files of a folder beside the weights that a loader reads: copied when present.
constexpr const char* kCopied[] = {
    "tokenizer.json",      "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
    "chat_template.jinja", "chat_template.json",    "tokenizer.model",         "vocab.json",
    "merges.txt",          "added_tokens.json",     "preprocessor_config.json"};

// One output tensor: its name, safetensors type and shape, and how to produce its bytes.
struct OutTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
  const safetensors::Tensor* src = nullptr;
  enum class Kind { copy, fp8_values, fp8_scales, input_scale } kind = Kind::copy;
  float value = 0.0f;           // input_scale: the static activation scale
  const float* gram = nullptr;  // fp8_values: [in, in], the inputs' Gram matrix GPTQ rounds with; null: none
};

// The row-wise scales and e4m3 codes of a weight, computed once for both of its output tensors.
struct Fp8Weight {
  std::vector<float> scales;   // [out]
  std::vector<uint8_t> codes;  // [out, in]
  bool by_gptq = false;        // the codes chosen by GPTQ (else rounded to nearest)
};

// GPTQ's codes for the weight `values` [rows, cols] with the scales of `w` (quant/gptq.h: f8_e4m3 with the
// row scales pinned) into `w.codes`; out_of_range (a Hessian not positive definite even dampened) leaves them
// to the caller.
Status gptq_codes(const std::vector<float>& values, int64_t rows, int64_t cols, const float* gram,
                  GptqOptions go, ThreadPool& pool, Fp8Weight& w) {
  std::vector<uint8_t> blocks(static_cast<size_t>(rows * cols / quant::kQK) * sizeof(quant::BlockF8E4M3));
  go.row_scales = w.scales.data();
  go.pool = &pool;
  KILN_TRY(gptq_quantize(values.data(), rows, cols, gram, DType::f8_e4m3, go, blocks.data()));
  for (int64_t i = 0; i < rows * cols / quant::kQK; ++i) {
    const auto b = quant::load_block<quant::BlockF8E4M3>(blocks.data(), i);
    std::memcpy(w.codes.data() + i * quant::kQK, b.q, quant::kQK);
  }
  return Status::ok_status();
}

// `t`'s scales (max |row| / 448, 1 for a row of zeros) and codes: rounded to nearest, or by GPTQ with `gram`
// when `go` and `gram` are given. A weight GPTQ cannot round is rounded to nearest, with a note saying why.
Result<Fp8Weight> quantize_weight(const safetensors::Tensor& t, const float* gram, const GptqOptions* go,
                                  ThreadPool& pool, std::vector<std::string>& notes) {
  const std::optional<DType> dt = t.kiln_dtype();
  if (!dt || (*dt != DType::f32 && *dt != DType::f16 && *dt != DType::bf16)) {
    return invalid_argument("{}: type {} (F32, F16 or BF16 weights are quantized to FP8)", t.name,
                            safetensors::dtype_name(t.dtype));
  }
  const int64_t rows = t.shape[0], cols = t.shape[1];
  const DTypeInfo& info = dtype_info(*dt);
  bool gptq = go != nullptr && gram != nullptr;
  if (gptq && cols % quant::kQK != 0) {
    notes.push_back(fmt::format("{}: rows of {} are not whole blocks of {}: rounded to nearest, not by GPTQ",
                                t.name, cols, quant::kQK));
    gptq = false;
  }
  Fp8Weight w;
  w.scales.resize(static_cast<size_t>(rows));
  w.codes.resize(static_cast<size_t>(rows * cols));
  // The rows in f32: all of them for GPTQ, else one a thread at a time.
  std::vector<float> values(static_cast<size_t>(gptq ? rows * cols : 0));
  std::atomic<int64_t> bad_row{-1};
  pool.parallel_for(rows, [&](int64_t r0, int64_t r1, int) {
    std::vector<float> row(static_cast<size_t>(gptq ? 0 : cols));
    for (int64_t r = r0; r < r1; ++r) {
      float* v = gptq ? values.data() + r * cols : row.data();
      info.dequantize_row(t.data.data() + r * cols * info.type_size, v, cols);
      float amax = 0.0f;
      for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(v[c]));
      if (!std::isfinite(amax)) {
        bad_row = r;
        continue;
      }
      const float scale = amax > 0.0f ? amax / kF8E4M3Max : 1.0f;
      w.scales[static_cast<size_t>(r)] = scale;
      uint8_t* q = w.codes.data() + r * cols;
      for (int64_t c = 0; c < cols; ++c) q[c] = f32_to_f8_e4m3(v[c] / scale);
    }
  });
  if (bad_row >= 0)
    return invalid_argument("{}: row {} holds a value that is not finite", t.name, bad_row.load());
  if (!gptq) return w;
  const Status s = gptq_codes(values, rows, cols, gram, *go, pool, w);
  if (s.code() == StatusCode::out_of_range) {
    notes.push_back(fmt::format("{}: {}; rounded to nearest, not by GPTQ", t.name, s.message()));
    return w;  // the plain codes above
  }
  if (!s.ok()) return Status(s.code(), fmt::format("{}: GPTQ: {}", t.name, s.message()));
  w.by_gptq = true;
  return w;
}

// The quantization_config of the output: per-channel FP8 weights; FP8 activations per token at run time
// (dynamic), or per tensor with the scales written (static).
nlohmann::json quantization_config(const std::vector<std::string>& ignore, bool static_acts) {
  nlohmann::json weights = {
      {"num_bits", 8},       {"type", "float"},       {"strategy", "channel"},      {"symmetric", true},
      {"dynamic", false},    {"group_size", nullptr}, {"block_structure", nullptr}, {"actorder", nullptr},
      {"observer", "minmax"}};
  nlohmann::json acts = {{"num_bits", 8},
                         {"type", "float"},
                         {"strategy", static_acts ? "tensor" : "token"},
                         {"symmetric", true},
                         {"dynamic", !static_acts},
                         {"group_size", nullptr},
                         {"block_structure", nullptr},
                         {"observer", static_acts ? nlohmann::json("minmax") : nlohmann::json(nullptr)}};
  return {{"quant_method", "compressed-tensors"},
          {"format", "float-quantized"},
          {"quantization_status", "compressed"},
          {"config_groups",
           {{"group_0",
             {{"targets", {"Linear"}},
              {"weights", weights},
              {"input_activations", acts},
              {"output_activations", nullptr},
              {"format", "float-quantized"}}}}},
          {"ignore", ignore},
          {"kv_cache_scheme", nullptr}};
}

Status write_bytes(std::FILE* f, const void* p, size_t n, const std::string& path) {
  if (n > 0 && std::fwrite(p, 1, n, f) != n)
    return io_error("writing {} failed: {}", path, std::strerror(errno));
  return Status::ok_status();
}

// The weights file: header, then each tensor's bytes in order. An FP8 weight is quantized once, when its
// values come (its scales follow it at once).
Status write_weights(const std::string& path, const std::vector<OutTensor>& tensors, const GptqOptions* go,
                     ThreadPool& pool, Fp8FolderStats& stats) {
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const OutTensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes}}};
    offset += t.bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section 8-byte aligned, as safetensors writes it
  KILN_ASSIGN_OR_RETURN(OutputFile out, OutputFile::create(path));
  const uint64_t n = text.size();
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  KILN_TRY(write_bytes(out.stream(), len, 8, path));
  KILN_TRY(write_bytes(out.stream(), text.data(), text.size(), path));
  Fp8Weight current;
  for (const OutTensor& t : tensors) {
    switch (t.kind) {
      case OutTensor::Kind::copy:
        KILN_TRY(write_bytes(out.stream(), t.src->data.data(), t.src->data.size(), path));
        ++stats.n_copied;
        break;
      case OutTensor::Kind::fp8_values: {
        KILN_ASSIGN_OR_RETURN(current, quantize_weight(*t.src, t.gram, go, pool, stats.notes));
        KILN_TRY(write_bytes(out.stream(), current.codes.data(), current.codes.size(), path));
        ++stats.n_quantized;
        stats.n_gptq += current.by_gptq ? 1 : 0;
        break;
      }
      case OutTensor::Kind::fp8_scales:
        KILN_TRY(
            write_bytes(out.stream(), current.scales.data(), current.scales.size() * sizeof(float), path));
        break;
      case OutTensor::Kind::input_scale:
        KILN_TRY(write_bytes(out.stream(), &t.value, sizeof(float), path));
        break;
    }
    const bool derived = t.kind == OutTensor::Kind::fp8_scales || t.kind == OutTensor::Kind::input_scale;
    stats.bytes_in += derived ? 0 : t.src->data.size();
    stats.bytes_out += t.bytes;
  }
  return out.commit();
}

// A projection's static activation scale: the largest |input| the importance matrix saw for it, over 448 (the
// e4m3 maximum). An expert no calibration token reached takes its layer's largest.
Result<float> static_input_scale(const Imatrix& calibration, const std::string& name) {
  int64_t expert = -1;
  const std::string gguf = hf_import::projection_gguf_name(name, &expert);
  if (gguf.empty()) return invalid_argument("{}: not a decoder layer's projection the imatrix names", name);
  const auto it = calibration.tensors.find(gguf);
  if (it == calibration.tensors.end())
    return invalid_argument("{}: the importance matrix has no {} (made from another model?)", name, gguf);
  const ImatrixTensor& t = it->second;
  if (t.amax.empty()) {
    return invalid_argument(
        "{}: the importance matrix holds no input ranges for {} ({}.in_amax: a file of "
        "kiln imatrix, not combined with one that has none)",
        name, gguf, gguf);
  }
  if (expert >= static_cast<int64_t>(t.amax.size()))
    return invalid_argument("{}: expert {} of {}, which has {}", name, expert, gguf, t.amax.size());
  float amax = t.amax[static_cast<size_t>(std::max<int64_t>(expert, 0))];
  if (amax == 0.0f && expert >= 0) amax = *std::max_element(t.amax.begin(), t.amax.end());
  if (!(amax > 0.0f) || !std::isfinite(amax)) {
    return invalid_argument("{}: its input was {} over every calibration token ({}): no scale", name, amax,
                            gguf);
  }
  return amax / kF8E4M3Max;
}

// The Gram matrix ([in, in]) GPTQ rounds a projection with: its importance entry's (kiln imatrix --full).
// null for an MoE expert, whose stacked entry holds no Gram matrix (n_mat > 1): rounded to nearest, counted
// in `experts_plain`.
Result<const float*> gptq_gram(const Imatrix& imatrix, const safetensors::Tensor& t, int64_t& experts_plain) {
  int64_t expert = -1;
  const std::string gguf = hf_import::projection_gguf_name(t.name, &expert);
  if (gguf.empty()) return invalid_argument("{}: not a decoder layer's projection the imatrix names", t.name);
  const auto it = imatrix.tensors.find(gguf);
  if (it == imatrix.tensors.end())
    return invalid_argument("{}: the importance matrix has no {} (made from another model?)", t.name, gguf);
  const ImatrixTensor& e = it->second;
  if (expert >= 0 && (e.n_mat != 1 || !e.has_gram())) {
    ++experts_plain;
    return nullptr;
  }
  if (!e.has_gram()) {
    return invalid_argument(
        "{}: GPTQ needs the Gram matrix of {}'s inputs ({}.in_gram), which the importance matrix does not "
        "hold: make it with kiln imatrix --full",
        t.name, gguf, gguf);
  }
  const int64_t cols = t.shape[1];
  if (e.n_cols != cols || static_cast<int64_t>(e.gram_values().size()) != cols * cols) {
    return invalid_argument(
        "{}: the Gram matrix of {} has {} columns, the weight {} (made from another model?)", t.name, gguf,
        e.n_cols, cols);
  }
  return e.gram_values().data();
}

}  // namespace

Result<Fp8FolderStats> write_fp8_folder(const std::string& in, const std::string& out,
                                        const Fp8FolderOptions& o) {
  const Imatrix* imatrix = o.imatrix;
  if (o.static_activations && imatrix == nullptr)
    return invalid_argument("static FP8 activation scales need an importance matrix (kiln imatrix)");
  if (o.gptq && imatrix == nullptr)
    return invalid_argument("GPTQ needs an importance matrix with Gram matrices (kiln imatrix --full)");
  if (!(o.gptq_damp >= 0.0) || !std::isfinite(o.gptq_damp))
    return invalid_argument("GPTQ's dampening {} must be a finite number >= 0", o.gptq_damp);
  std::error_code ec;
  if (!fs::is_directory(in, ec))
    return invalid_argument("{}: FP8 is written from a Hugging Face folder (config.json and safetensors)",
                            in);
  if (fs::exists(fs::symlink_status(out, ec)))
    return invalid_argument("{}: already exists (the FP8 folder is written as a new folder)", out);
  const std::string config_path = (fs::path(in) / "config.json").string();
  KILN_TRY(check_in_folder(in, config_path));
  nlohmann::json config;
  {
    std::ifstream f(config_path);
    if (!f) return not_found("{}: cannot be read", config_path);
    config = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
    if (!config.is_object()) return invalid_argument("{}: not a JSON object", config_path);
  }
  if (config.contains("quantization_config"))
    return invalid_argument(
        "{}: the folder is already quantized (quantization_config); give its full-precision source", in);
  KILN_ASSIGN_OR_RETURN(safetensors::Model model, safetensors::Model::open_dir(in));

  // The output tensors in the input's order, each FP8 weight followed by its scales.
  std::vector<OutTensor> tensors;
  // Linear layers left in full precision, which a loader must not take for FP8 ones: the output head, and
  // matrices inside the layers that are not projections (MoE routers).
  std::vector<std::string> ignore = {"lm_head"};
  Fp8FolderStats stats;
  for (const safetensors::Tensor* t : model.tensors()) {
    const bool matrix = t->shape.size() == 2 && t->name.ends_with(".weight");
    const std::string module =
        matrix ? t->name.substr(0, t->name.size() - std::string_view(".weight").size()) : "";
    if (quantized_weight(t->name, *t)) {
      tensors.push_back({t->name, "F8_E4M3", t->shape, static_cast<uint64_t>(t->n_elements), t,
                         OutTensor::Kind::fp8_values});
      if (o.gptq) {
        KILN_ASSIGN_OR_RETURN(tensors.back().gram, gptq_gram(*imatrix, *t, stats.n_experts_plain));
      }
      tensors.push_back({module + ".weight_scale",
                         "F32",
                         {t->shape[0], 1},
                         static_cast<uint64_t>(t->shape[0]) * 4,
                         t,
                         OutTensor::Kind::fp8_scales});
      if (o.static_activations) {
        KILN_ASSIGN_OR_RETURN(const float scale, static_input_scale(*imatrix, t->name));
        tensors.push_back({module + ".input_scale", "F32", {1}, 4, t, OutTensor::Kind::input_scale, scale});
      }
    } else {
      tensors.push_back(
          {t->name, safetensors::dtype_name(t->dtype), t->shape, t->data.size(), t, OutTensor::Kind::copy});
      if (matrix && t->name.find(".layers.") != std::string::npos) ignore.push_back(module);
    }
  }
  if (std::none_of(tensors.begin(), tensors.end(),
                   [](const OutTensor& t) { return t.kind == OutTensor::Kind::fp8_values; })) {
    return invalid_argument("{}: no decoder-layer projection weights to quantize", in);
  }
  config["quantization_config"] = quantization_config(ignore, o.static_activations);
  std::unique_ptr<Backend> backend;
  if (o.gptq) {
    KILN_ASSIGN_OR_RETURN(backend, gptq_device(o.device));
  }
  GptqOptions go;
  go.damp = o.gptq_damp;
  go.act_order = o.gptq_act_order;
  go.backend = backend.get();
  stats.gptq_device = backend != nullptr ? std::string(backend->name()) : "cpu";

  // Everything goes to a fresh folder beside `out`, renamed to it at the end.
  const fs::path target = fs::absolute(out, ec);
  std::string tmpl = (target.parent_path() / ("." + target.filename().string() + ".partial-XXXXXX")).string();
  if (mkdtemp(tmpl.data()) == nullptr)
    return io_error("cannot create a folder beside {}: {}", out, std::strerror(errno));
  const fs::path tmp(tmpl);
  const Status s = [&]() -> Status {
    ThreadPool pool(o.n_threads);
    KILN_TRY(
        write_weights((tmp / "model.safetensors").string(), tensors, o.gptq ? &go : nullptr, pool, stats));
    {
      KILN_ASSIGN_OR_RETURN(OutputFile f, OutputFile::create((tmp / "config.json").string()));
      const std::string text = config.dump(2) + "\n";
      KILN_TRY(write_bytes(f.stream(), text.data(), text.size(), f.temp_path()));
      KILN_TRY(f.commit());
    }
    for (const char* name : kCopied) {
      const fs::path src = fs::path(in) / name;
      if (!fs::exists(src, ec)) continue;
      KILN_TRY(check_in_folder(in, src.string()));
      fs::copy_file(src, tmp / name, ec);
      if (ec) return io_error("copying {} failed: {}", src.string(), ec.message());
    }
    fs::rename(tmp, target, ec);
    if (ec) return io_error("renaming {} to {} failed: {}", tmp.string(), out, ec.message());
    return Status::ok_status();
  }();
  if (!s.ok()) {
    fs::remove_all(tmp, ec);
    return s;
  }
  return stats;
}

}  // namespace kiln::quant
