// Element types: plain floats/ints, GGUF block-quantized layouts, and kiln's in-memory forms (FP8 weights,
// the 8-bit KV cache of 64-value blocks).
// One table (dtype.cpp) describes every type: name, block size, bytes per block, and its scalar
// reference dequantization (and quantization where kiln supports it). Nothing else hard-codes these.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "core/status.h"

namespace kiln {

// Values of the GGUF types equal their ggml type ids (as stored in GGUF tensor infos).
// Ids that ggml retired (4, 5, 31-33...) are not types. Ids from 100 on are kiln's own in-memory forms, which
// no GGUF file holds (DTypeInfo::gguf is false for them).
enum class DType : uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q8_1 = 9,
  q2_k = 10,
  q3_k = 11,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  q8_k = 15,
  iq2_xxs = 16,
  iq2_xs = 17,
  iq3_xxs = 18,
  iq1_s = 19,
  iq4_nl = 20,
  iq3_s = 21,
  iq2_s = 22,
  iq4_xs = 23,
  i8 = 24,
  i16 = 25,
  i32 = 26,
  i64 = 27,
  f64 = 28,
  iq1_m = 29,
  bf16 = 30,
  tq1_0 = 34,
  tq2_0 = 35,
  mxfp4 = 39,
  // Blocks of 32 float8_e4m3fn values with an f32 scale (quant::BlockF8E4M3): the weights of FP8 Hugging Face
  // checkpoints as imported, their bytes untouched. GGUF has no FP8 type.
  f8_e4m3 = 100,
  // Blocks of 64 int8 codes with an f16 scale (quant::BlockQ8_64): a KV cache type (--kv-type q8_64), q8_0's
  // rounding over twice the values a scale, so 8.25 bits a value against q8_0's 8.5.
  q8_64 = 101,
};

// Convert `n` elements (a multiple of block_size) of one row from this type to f32.
using DequantizeRowFn = void (*)(const void* src, float* dst, int64_t n);
// Convert `n` f32 elements (a multiple of block_size) to this type (reference quantizer).
using QuantizeRowFn = void (*)(const float* src, void* dst, int64_t n);
// Quantize `n_rows` rows of `n_per_row` f32 values (a multiple of block_size) into whole rows of this type,
// as a model file stores a weight. `importance` is null or `n_per_row` non-negative values (an importance
// matrix's per-column mean squared activation); with it the quantizer minimizes the error weighted by it.
// The bytes equal ggml's quantize_chunk for the same input.
using QuantizeRowsFn = void (*)(const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                                const float* importance);

struct DTypeInfo {
  DType type;
  const char* name;                // lower-case GGUF name: "f32", "q4_k", "iq4_nl"
  int64_t block_size;              // elements per block (1 for plain types)
  int64_t type_size;               // bytes per block
  bool is_quantized;               // a block-quant layout
  DequantizeRowFn dequantize_row;  // null where kiln has no reference dequantizer yet
  QuantizeRowFn quantize_row;      // null where kiln has no reference quantizer
  QuantizeRowsFn quantize_rows;    // null where kiln cannot write the type into a model file
  bool requires_importance;        // quantize_rows needs importance weights (ggml: IQ2_XXS, IQ2_XS, IQ1_S)
  bool gguf;                       // a GGUF type (files may hold it); false for kiln's in-memory forms
};

// The table entry of a type. Asserts on a value that is not a DType (use dtype_from_gguf_id first).
const DTypeInfo& dtype_info(DType type);
inline const char* dtype_name(DType type) { return dtype_info(type).name; }

// A GGUF/ggml type id from a file: an error naming the id when it is not a known GGUF type (kiln's in-memory
// forms included: a file that claims one is refused).
Result<DType> dtype_from_gguf_id(uint32_t id);
// "q4_k", "Q4_K", "bf16" -> the type; nullopt when unknown.
std::optional<DType> dtype_from_name(std::string_view name);

// Bytes of `n_elements` of this type; error when n_elements is negative, not a multiple of the
// block size, or the byte count overflows int64.
Result<int64_t> dtype_row_bytes(DType type, int64_t n_elements);

// Every type in the table, in id order.
const DTypeInfo* dtype_table(int* count);

}  // namespace kiln
