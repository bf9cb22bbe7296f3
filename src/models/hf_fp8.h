// FP8 Hugging Face checkpoints for hf_import: the folder's quantization config, its scale tensors, and each
// float8_e4m3fn weight converted to kiln's f8_e4m3 blocks (core/dtype.h: 32 of the checkpoint's own bytes and
// the f32 scale that applies to them).
//
// Three forms load; in each the weight is q * scale:
// - compressed-tensors ("quant_method": "compressed-tensors", format float-quantized, or naive-quantized with
//   F8_E4M3 weights): `<module>.weight_scale` per tensor ([] or [1]), per output channel ([out, 1]) or per
//   block ([ceil(out/bo), ceil(in/bi)], block_structure [bo, bi]);
// - NVIDIA Model Optimizer ("quant_method": "modelopt" with "quant_algo": "FP8", or hf_quant_config.json's
//   {"quantization": {"quant_algo": "FP8"}}): `<module>.weight_scale` per tensor;
// - "quant_method": "fp8": with a weight_block_size (DeepSeek-V3, Qwen3-FP8), `<module>.weight_scale_inv` per
//   block, which despite its name multiplies the quants; without one (AutoFP8), `<module>.weight_scale` per
//   tensor.
// Every one of these scales becomes one scale per 32 values of a row. Activation scales (`input_scale`) are
// checked and kept by their weight (input_scales()): what a backend rounds x to e4m3 with (ops::Weight);
// KV-cache scales (`k_scale`, `v_scale`, AutoFP8's k and v projections' `output_scale`) are dropped.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/status.h"
#include "formats/hf_config.h"
#include "formats/safetensors.h"

namespace kiln::hf_import {

// The FP8 form a folder's config declares.
struct Fp8Config {
  enum class Method { none, compressed_tensors, modelopt, fp8 };
  Method method = Method::none;
  std::string scale_suffix;  // ".weight_scale" or ".weight_scale_inv"
  // The block of a block scale, [rows, columns] of the weight; 0 where the config declares no block scales.
  int64_t block_rows = 0, block_cols = 0;
  std::string source;  // where the config was read, for errors
  // Activations are rounded with the checkpoint's static scales (`input_scale`), not per token: declared so
  // by compressed-tensors (dynamic false, per tensor), Model Optimizer (always), "fp8" (activation_scheme).
  bool static_activations = false;
};

// The grain of a weight scale of shape `scale` for an [out, in] weight under `cfg`: one value ([] or [1]),
// one a row ([out, 1]), one a cfg block ([ceil(out / rows), ceil(in / cols)]), or none of these.
enum class ScaleGrain { tensor, channel, block, unknown };
ScaleGrain scale_grain(const std::vector<int64_t>& scale, int64_t out, int64_t in, const Fp8Config& cfg);

// The FP8 form of a folder: config.json's quantization_config (`top` is the top-level config), else
// hf_quant_config.json beside it; Method::none when neither is there. Errors: unimplemented for any other
// quantization (awq, gptq, bitsandbytes, integer or 4-bit schemes, e5m2...), naming the method and the field,
// and listing the supported forms; invalid_argument for a malformed config.
Result<Fp8Config> read_fp8_config(const hf::ModelConfig& top, const std::string& dir);

// The FP8 weights of a folder and their scales.
class Fp8Weights {
 public:
  // Sorts out the folder's FP8 side tensors: each weight's scale (by the weight's name), activation scales
  // (checked: finite and positive), KV-cache scales. Errors, each naming the tensor: an F8_E4M3 tensor or a
  // scale in a folder whose config declares no FP8 form, an F8_E4M3 tensor that is not a matrix, an FP8
  // weight without its scale, a scale without its weight or whose weight is not F8_E4M3, a scale of the
  // other method's name, a bad activation scale.
  static Result<Fp8Weights> collect(Fp8Config cfg, const safetensors::Model& weights, std::string dir);

  // A tensor the import leaves out: a weight's scale, an activation scale, a KV-cache scale.
  bool is_side_tensor(const std::string& name) const { return side_.contains(name); }
  // `w` (F8_E4M3 [out, in], a weight collect() saw) as `out` rows of f8_e4m3 blocks, appended to `bytes`.
  // Errors, naming the tensor: in not a multiple of 32, a block scale whose column size is not, a scale of
  // another shape than the forms above, a scale that is not finite and positive (its index named), a NaN
  // among the weight's codes (its element named).
  Status append_blocks(const safetensors::Tensor& w, std::vector<uint8_t>& bytes) const;
  // `w`'s values, q * scale, as f32: the f8_e4m3 blocks' values exactly. Errors as append_blocks.
  Result<std::vector<float>> dequantize(const safetensors::Tensor& w) const;
  // The static activation scales of F8_E4M3 weights (where the config declares them static), by the
  // weight's name ("<module>.weight" -> "<module>.input_scale"'s value).
  const std::unordered_map<std::string, float>& input_scales() const { return input_scales_; }

 private:
  // `w`'s scale for each of its blocks of 32: out * in / 32 values, row by row.
  Result<std::vector<float>> block_scales(const safetensors::Tensor& w) const;
  Status check_codes(const safetensors::Tensor& w) const;

  Fp8Config cfg_;
  std::string dir_;
  std::unordered_map<std::string, const safetensors::Tensor*> scales_;  // weight name -> its scale
  std::unordered_map<std::string, float> input_scales_;
  std::unordered_set<std::string> side_;
};

}  // namespace kiln::hf_import
