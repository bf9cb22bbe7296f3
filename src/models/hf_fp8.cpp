#include "models/hf_fp8.h"

#include <fmt/ranges.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <span>
#include <utility>

#include "core/dtype.h"
#include "core/half.h"
#include "core/quant/quant_blocks.h"
#include "formats/folder.h"
#include "formats/json_file.h"

namespace kiln::hf_import {

namespace {

using nlohmann::json;
using Method = Fp8Config::Method;
using safetensors::Dtype;

constexpr std::string_view kSupported =
    "kiln loads FP8 (float8_e4m3fn) checkpoints: quant_method compressed-tensors (format float-quantized, "
    "8-bit float weights, tensor, channel or block scales), modelopt (quant_algo FP8), fp8 (fmt e4m3: "
    "tensor scales, or block scales with a weight_block_size)";

Status not_supported(const std::string& source, std::string_view field, const std::string& value) {
  return unimplemented("{}: {} {} is not supported; {}", source, field, value, kSupported);
}

// A JSON value as it reads in a message: strings quoted, the rest as JSON.
std::string shown(const json& v) { return json_file::preview(v); }

// [rows, columns] of a block: two positive integers.
Status read_block(const json* v, const std::string& source, std::string_view key, Fp8Config& out) {
  if (v == nullptr || !v->is_array() || v->size() != 2 || !(*v)[0].is_number_integer() ||
      !(*v)[1].is_number_integer() || (*v)[0].get<int64_t>() <= 0 || (*v)[1].get<int64_t>() <= 0 ||
      (*v)[0].get<int64_t>() > (int64_t{1} << 20) || (*v)[1].get<int64_t>() > (int64_t{1} << 20)) {
    return invalid_argument("{}: {} must be two positive integers [rows, columns], got {}", source, key,
                            v == nullptr ? std::string("nothing") : shown(*v));
  }
  const int64_t rows = (*v)[0].get<int64_t>(), cols = (*v)[1].get<int64_t>();
  if (out.block_rows != 0 && (out.block_rows != rows || out.block_cols != cols)) {
    return unimplemented("{}: {} [{}, {}] differs from another group's [{}, {}]", source, key, rows, cols,
                         out.block_rows, out.block_cols);
  }
  out.block_rows = rows;
  out.block_cols = cols;
  return Status::ok_status();
}

Status check_format(const std::string& format, const std::string& source) {
  if (format.empty() || format == "float-quantized" || format == "naive-quantized")
    return Status::ok_status();
  return not_supported(source, "format", "\"" + format + "\"");
}

// One of compressed-tensors' config_groups: 8-bit float weights, symmetric, a tensor, channel or block
// scale; activations unquantized or 8-bit float (a static scale is each weight's `input_scale`).
Status compressed_tensors_group(const hf::JsonObject& g, Fp8Config& out) {
  if (g.has("format")) {
    KILN_ASSIGN_OR_RETURN(const std::string format, g.get_string("format"));
    KILN_TRY(check_format(format, g.source()));
  }
  const json* w = g.find("weights");
  if (w == nullptr || !w->is_object())
    return not_supported(g.source(), "weights", w == nullptr ? "null (no weight quantization)" : shown(*w));
  const hf::JsonObject ws(*w, g.source() + ".weights");
  KILN_ASSIGN_OR_RETURN(const int64_t bits, ws.get_int("num_bits"));
  if (bits != 8) return not_supported(ws.source(), "num_bits", std::to_string(bits));
  KILN_ASSIGN_OR_RETURN(const std::string type, ws.get_string("type"));
  if (type != "float") return not_supported(ws.source(), "type", "\"" + type + "\"");
  KILN_ASSIGN_OR_RETURN(const bool symmetric, ws.get_bool_or("symmetric", true));
  if (!symmetric) return not_supported(ws.source(), "symmetric", "false");
  KILN_ASSIGN_OR_RETURN(const std::string strategy, ws.get_string("strategy"));
  if (strategy == "block") {
    KILN_TRY(read_block(ws.find("block_structure"), ws.source(), "block_structure", out));
  } else if (strategy != "tensor" && strategy != "channel") {
    return not_supported(ws.source(), "strategy", "\"" + strategy + "\"");
  }
  if (const json* a = g.find("input_activations"); a != nullptr) {
    if (!a->is_object()) return not_supported(g.source(), "input_activations", shown(*a));
    const hf::JsonObject as(*a, g.source() + ".input_activations");
    KILN_ASSIGN_OR_RETURN(const int64_t a_bits, as.get_int("num_bits"));
    if (a_bits != 8) return not_supported(as.source(), "num_bits", std::to_string(a_bits));
    KILN_ASSIGN_OR_RETURN(const std::string a_type, as.get_string("type"));
    if (a_type != "float") return not_supported(as.source(), "type", "\"" + a_type + "\"");
    KILN_ASSIGN_OR_RETURN(const std::string a_strategy, as.get_string_or("strategy", "tensor"));
    if (a_strategy != "tensor" && a_strategy != "token")
      return not_supported(as.source(), "strategy", "\"" + a_strategy + "\"");
    KILN_ASSIGN_OR_RETURN(const bool dynamic, as.get_bool_or("dynamic", false));
    if (!dynamic && a_strategy == "tensor") out.static_activations = true;
  }
  if (const json* o = g.find("output_activations"); o != nullptr)
    return not_supported(g.source(), "output_activations", shown(*o));
  return Status::ok_status();
}

Result<Fp8Config> compressed_tensors(const hf::JsonObject& q) {
  Fp8Config out{Method::compressed_tensors, ".weight_scale", 0, 0, q.source()};
  KILN_ASSIGN_OR_RETURN(const std::string format, q.get_string_or("format", ""));
  KILN_TRY(check_format(format, q.source()));
  const json* groups = q.find("config_groups");
  if (groups == nullptr || !groups->is_object() || groups->empty()) {
    return invalid_argument("{}: config_groups must be a non-empty object, got {}", q.source(),
                            groups == nullptr ? std::string("nothing") : shown(*groups));
  }
  for (const auto& [name, g] : groups->items()) {
    if (!g.is_object())
      return invalid_argument("{}: config_groups.{} must be an object, got {}", q.source(), name, shown(g));
    KILN_TRY(compressed_tensors_group(hf::JsonObject(g, q.source() + ".config_groups." + name), out));
  }
  // 2:4 sparsity stores other tensors than the weights; a "dense" sparsity format stores them as they are.
  if (const json* sp = q.find("sparsity_config"); sp != nullptr) {
    const hf::JsonObject s(*sp, q.source() + ".sparsity_config");
    KILN_ASSIGN_OR_RETURN(const std::string sf, s.get_string_or("format", "dense"));
    if (sf != "dense") return not_supported(s.source(), "format", "\"" + sf + "\"");
  }
  return out;
}

Result<Fp8Config> modelopt(const hf::JsonObject& q) {
  std::string algo;
  if (q.has("quant_algo")) {
    KILN_ASSIGN_OR_RETURN(algo, q.get_string("quant_algo"));
  } else if (const json* inner = q.find("quantization"); inner != nullptr) {
    KILN_ASSIGN_OR_RETURN(algo,
                          hf::JsonObject(*inner, q.source() + ".quantization").get_string("quant_algo"));
  } else {
    return invalid_argument("{}: modelopt without a quant_algo", q.source());
  }
  if (algo != "FP8") return not_supported(q.source(), "quant_algo", "\"" + algo + "\"");
  Fp8Config out{Method::modelopt, ".weight_scale", 0, 0, q.source()};
  out.static_activations = true;  // Model Optimizer's FP8 calibrates an input_scale a weight
  return out;
}

// "fp8": with a weight_block_size (DeepSeek-V3, Qwen3-FP8), a weight_scale_inv per block; without one, or
// with null (AutoFP8's folders, and vLLM's reading of the same config), a weight_scale per tensor.
Result<Fp8Config> fine_grained_fp8(const hf::JsonObject& q) {
  const json* block = q.find("weight_block_size");
  const bool blocks = block != nullptr && !block->is_null();
  Fp8Config out{Method::fp8, blocks ? ".weight_scale_inv" : ".weight_scale", 0, 0, q.source()};
  KILN_ASSIGN_OR_RETURN(const std::string fmt, q.get_string_or("fmt", "e4m3"));
  if (fmt != "e4m3") return not_supported(q.source(), "fmt", "\"" + fmt + "\"");
  KILN_ASSIGN_OR_RETURN(const std::string scheme, q.get_string_or("activation_scheme", "dynamic"));
  if (scheme != "dynamic" && scheme != "static")
    return not_supported(q.source(), "activation_scheme", "\"" + scheme + "\"");
  out.static_activations = scheme == "static";
  if (blocks) KILN_TRY(read_block(block, q.source(), "weight_block_size", out));
  return out;
}

// The scale's values as f32. Precondition: F32, BF16 or F16.
std::vector<float> values_f32(const safetensors::Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.n_elements));
  const DType dt = *t.kiln_dtype();
  if (dt == DType::f32) {
    std::memcpy(out.data(), t.data.data(), out.size() * sizeof(float));
  } else {
    dtype_info(dt).dequantize_row(t.data.data(), out.data(), t.n_elements);
  }
  return out;
}

bool float_scale_type(Dtype d) {
  return d == Dtype::dtype_f32 || d == Dtype::dtype_bf16 || d == Dtype::dtype_f16;
}

// The side tensors' name endings (the weight scales first: ".weight_scale" is no ending of "_inv").
constexpr std::string_view kWeightScaleInv = ".weight_scale_inv", kWeightScale = ".weight_scale",
                           kInputScale = ".input_scale";
// KV-cache scales, which kiln does not use: compressed-tensors' and Model Optimizer's names, and AutoFP8's
// (the k and v projections' output_scale).
constexpr std::string_view kKvScales[] = {".k_scale", ".v_scale", ".kv_scale", "k_proj.output_scale",
                                          "v_proj.output_scale"};

}  // namespace

ScaleGrain scale_grain(const std::vector<int64_t>& scale, int64_t out, int64_t in, const Fp8Config& cfg) {
  const int64_t br = cfg.block_rows, bc = cfg.block_cols;
  if (scale.empty() || scale == std::vector<int64_t>{1}) return ScaleGrain::tensor;
  if (scale == std::vector<int64_t>{out, 1}) return ScaleGrain::channel;
  if (br > 0 && scale == std::vector<int64_t>{(out + br - 1) / br, (in + bc - 1) / bc})
    return ScaleGrain::block;
  return ScaleGrain::unknown;
}

Result<Fp8Config> read_fp8_config(const hf::ModelConfig& top, const std::string& dir) {
  const json* qc = top.find("quantization_config");
  const std::string source = top.source() + " quantization_config";
  if (qc == nullptr) {
    // Model Optimizer's own file, when config.json does not carry the quantization.
    const std::string path = (std::filesystem::path(dir) / "hf_quant_config.json").string();
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) return Fp8Config{};
    KILN_TRY(check_in_folder(dir, path));
    KILN_ASSIGN_OR_RETURN(const json from_file, json_file::read(path, json_file::kMaxConfigBytes));
    const auto inner = from_file.is_object() ? from_file.find("quantization") : from_file.end();
    if (inner == from_file.end() || !inner->is_object())
      return invalid_argument("{}: no \"quantization\" object", path);
    return modelopt(hf::JsonObject(*inner, path + " quantization"));
  }
  if (!qc->is_object()) return invalid_argument("{}: must be an object, got {}", source, shown(*qc));
  const hf::JsonObject q(*qc, source);
  if (!q.has("quant_method")) return invalid_argument("{}: no quant_method; {}", source, kSupported);
  KILN_ASSIGN_OR_RETURN(const std::string method, q.get_string("quant_method"));
  if (method == "compressed-tensors") return compressed_tensors(q);
  if (method == "modelopt") return modelopt(q);
  if (method == "fp8") return fine_grained_fp8(q);
  return not_supported(source, "quant_method", "\"" + method + "\"");
}

Result<Fp8Weights> Fp8Weights::collect(Fp8Config cfg, const safetensors::Model& weights, std::string dir) {
  Fp8Weights out;
  out.cfg_ = std::move(cfg);
  out.dir_ = std::move(dir);
  const std::string& d = out.dir_;
  const bool fp8 = out.cfg_.method != Method::none;
  for (const safetensors::Tensor* t : weights.tensors()) {
    const std::string& name = t->name;
    if (t->dtype == Dtype::dtype_f8_e4m3) {
      if (!fp8) {
        return invalid_argument("{}: tensor {} is F8_E4M3, but config.json has no FP8 quantization_config", d,
                                name);
      }
      if (t->shape.size() != 2) {
        return invalid_argument("{}: FP8 weight {} has shape [{}]: FP8 weights must be matrices [out, in]", d,
                                name, fmt::join(t->shape, ", "));
      }
      continue;
    }
    const bool weight_scale = name.ends_with(kWeightScale) || name.ends_with(kWeightScaleInv);
    bool kv_scale = false;
    for (std::string_view k : kKvScales) kv_scale = kv_scale || name.ends_with(k);
    if (!weight_scale && !kv_scale && !name.ends_with(kInputScale)) continue;
    if (!fp8) {
      return invalid_argument("{}: tensor {} is an FP8 scale, but config.json has no FP8 quantization_config",
                              d, name);
    }
    out.side_.insert(name);
    if (kv_scale) continue;
    if (!float_scale_type(t->dtype)) {
      return invalid_argument("{}: scale {} is {} (F32, BF16 or F16 expected)", d, name,
                              safetensors::dtype_name(t->dtype));
    }
    if (!weight_scale) {  // an activation scale: one finite positive number, kept if its weight is FP8
      if (t->n_elements != 1 || t->shape.size() > 1) {
        return invalid_argument("{}: activation scale {} has shape [{}] ([] or [1] expected)", d, name,
                                fmt::join(t->shape, ", "));
      }
      const float v = values_f32(*t)[0];
      if (!std::isfinite(v) || v <= 0.0f)
        return invalid_argument("{}: activation scale {} is {} (a finite positive value expected)", d, name,
                                v);
      const std::string weight = name.substr(0, name.size() - kInputScale.size()) + ".weight";
      const safetensors::Tensor* w = weights.find(weight);
      if (out.cfg_.static_activations && w != nullptr && w->dtype == Dtype::dtype_f8_e4m3)
        out.input_scales_[weight] = v;
      continue;
    }
    if (!name.ends_with(out.cfg_.scale_suffix)) {
      return invalid_argument("{}: tensor {} is not the scale this quantization names ({}: *{})", d, name,
                              out.cfg_.source, out.cfg_.scale_suffix);
    }
    const std::string weight = name.substr(0, name.size() - out.cfg_.scale_suffix.size()) + ".weight";
    const safetensors::Tensor* w = weights.find(weight);
    if (w == nullptr) return invalid_argument("{}: scale {} has no weight {}", d, name, weight);
    if (w->dtype != Dtype::dtype_f8_e4m3) {
      return invalid_argument(
          "{}: scale {} belongs to {}, which is {}, not F8_E4M3 (kiln loads FP8 weights only)", d, name,
          weight, safetensors::dtype_name(w->dtype));
    }
    out.scales_[weight] = t;
  }
  for (const safetensors::Tensor* t : weights.tensors()) {
    if (t->dtype == Dtype::dtype_f8_e4m3 && !out.scales_.contains(t->name)) {
      const std::string stem = t->name.ends_with(".weight") ? t->name.substr(0, t->name.size() - 7) : t->name;
      return invalid_argument("{}: FP8 weight {} has no scale ({}{} is missing)", d, t->name, stem,
                              out.cfg_.scale_suffix);
    }
  }
  return out;
}

Result<std::vector<float>> Fp8Weights::block_scales(const safetensors::Tensor& w) const {
  const auto it = scales_.find(w.name);
  KILN_ASSERT(it != scales_.end() && w.shape.size() == 2);
  const safetensors::Tensor& s = *it->second;
  const int64_t out = w.shape[0], in = w.shape[1], nb = in / quant::kQK;
  if (in % quant::kQK != 0) {
    return invalid_argument("{}: FP8 weight {} has {} columns, not a multiple of {} (kiln's FP8 block)", dir_,
                            w.name, in, quant::kQK);
  }
  const std::vector<float> v = values_f32(s);
  for (size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i]) || v[i] <= 0.0f) {
      const int64_t cols = s.shape.size() == 2 ? s.shape[1] : 1;
      return invalid_argument("{}: scale {} has {} at [{}, {}] (a finite positive value expected)", dir_,
                              s.name, v[i], static_cast<int64_t>(i) / cols, static_cast<int64_t>(i) % cols);
    }
  }
  // Which scale each (row, block of 32) takes: scale index = (r / row_div) * row_stride + (b / col_div).
  int64_t row_div = 0, row_stride = 0, col_div = 1;
  const std::vector<int64_t>& sh = s.shape;
  const int64_t br = cfg_.block_rows, bc = cfg_.block_cols;
  const ScaleGrain grain = scale_grain(sh, out, in, cfg_);
  if (grain == ScaleGrain::tensor) {
    row_div = out;  // per tensor: one scale
    col_div = nb;
  } else if (grain == ScaleGrain::channel) {
    row_div = 1;  // per output channel
    row_stride = 1;
    col_div = nb;
  } else if (grain == ScaleGrain::block) {
    if (bc % quant::kQK != 0) {
      return invalid_argument(
          "{}: FP8 weight {} has {}x{} block scales: {} columns are not a multiple of {} "
          "(kiln's FP8 block)",
          dir_, w.name, br, bc, bc, quant::kQK);
    }
    row_div = br;
    row_stride = sh[1];
    col_div = bc / quant::kQK;
  } else {
    std::string forms = fmt::format("[] or [1] per tensor, [{}, 1] per channel", out);
    if (br > 0)
      forms += fmt::format(", [{}, {}] per {}x{} block", (out + br - 1) / br, (in + bc - 1) / bc, br, bc);
    return invalid_argument("{}: scale {} has shape [{}] for weight {} [{}, {}] (expected {})", dir_, s.name,
                            fmt::join(sh, ", "), w.name, out, in, forms);
  }
  std::vector<float> d(static_cast<size_t>(out * nb));
  for (int64_t r = 0; r < out; ++r) {
    for (int64_t b = 0; b < nb; ++b)
      d[static_cast<size_t>(r * nb + b)] = v[(r / row_div) * row_stride + b / col_div];
  }
  return d;
}

Status Fp8Weights::check_codes(const safetensors::Tensor& w) const {
  const std::span<const uint8_t> q = w.data;
  for (size_t i = 0; i < q.size(); ++i) {
    if ((q[i] & 0x7f) == 0x7f) {
      const auto cols = static_cast<size_t>(w.shape[1]);
      return invalid_argument("{}: FP8 weight {} has a NaN (0x{:02x}) at [{}, {}]", dir_, w.name, q[i],
                              i / cols, i % cols);
    }
  }
  return Status::ok_status();
}

Status Fp8Weights::append_blocks(const safetensors::Tensor& w, std::vector<uint8_t>& bytes) const {
  KILN_ASSIGN_OR_RETURN(const std::vector<float> d, block_scales(w));
  KILN_TRY(check_codes(w));
  const int64_t out = w.shape[0], in = w.shape[1], nb = in / quant::kQK;
  const size_t at = bytes.size();
  bytes.resize(at + static_cast<size_t>(out * nb) * sizeof(quant::BlockF8E4M3));
  for (int64_t r = 0; r < out; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      quant::BlockF8E4M3 blk;
      blk.d = d[static_cast<size_t>(r * nb + b)];
      std::memcpy(blk.q, w.data.data() + r * in + b * quant::kQK, quant::kQK);
      quant::store_block(bytes.data() + at, r * nb + b, blk);
    }
  }
  return Status::ok_status();
}

Result<std::vector<float>> Fp8Weights::dequantize(const safetensors::Tensor& w) const {
  std::vector<uint8_t> blocks;
  KILN_TRY(append_blocks(w, blocks));
  std::vector<float> out(static_cast<size_t>(w.n_elements));
  quant::dequantize_row_f8_e4m3(blocks.data(), out.data(), w.n_elements);
  return out;
}

}  // namespace kiln::hf_import
