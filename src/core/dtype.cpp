// The one table of element types. Block and byte sizes are ggml's (ggml.c type_traits), also for
// types kiln cannot convert yet, so files holding them can still be inspected and sized.
#include "core/dtype.h"

#include <array>
#include <cctype>
#include <limits>

#include "core/quant/quant_blocks.h"

namespace kiln {
namespace {

using namespace kiln::quant;  // NOLINT: the row functions of the table below

// clang-format off: one row per type
constexpr DTypeInfo kTable[] = {
    // type, name, block_size (elements), type_size (bytes per block), is_quantized, dequantize, quantize,
    // quantize_rows, requires_importance, gguf
    {DType::f32, "f32", 1, 4, false, dequantize_row_f32, quantize_row_f32, quantize_rows_f32, false, true},
    {DType::f16, "f16", 1, 2, false, dequantize_row_f16, quantize_row_f16, quantize_rows_f16, false, true},
    {DType::q4_0, "q4_0", 32, 18, true, LegacyRow<BlockQ4_0>::dequantize, LegacyRow<BlockQ4_0>::quantize,
     quantize_rows_q4_0, false, true},
    {DType::q4_1, "q4_1", 32, 20, true, LegacyRow<BlockQ4_1>::dequantize, LegacyRow<BlockQ4_1>::quantize,
     quantize_rows_q4_1, false, true},
    {DType::q5_0, "q5_0", 32, 22, true, LegacyRow<BlockQ5_0>::dequantize, LegacyRow<BlockQ5_0>::quantize,
     quantize_rows_q5_0, false, true},
    {DType::q5_1, "q5_1", 32, 24, true, LegacyRow<BlockQ5_1>::dequantize, LegacyRow<BlockQ5_1>::quantize,
     quantize_rows_q5_1, false, true},
    {DType::q8_0, "q8_0", 32, 34, true, LegacyRow<BlockQ8_0>::dequantize, LegacyRow<BlockQ8_0>::quantize,
     quantize_rows_q8_0, false, true},
    {DType::q8_1, "q8_1", 32, 36, true, LegacyRow<BlockQ8_1>::dequantize, LegacyRow<BlockQ8_1>::quantize,
     nullptr, false, true},
    {DType::q2_k, "q2_k", 256, 84, true, dequantize_row_q2_k, nullptr, quantize_rows_q2_k, false, true},
    {DType::q3_k, "q3_k", 256, 110, true, dequantize_row_q3_k, nullptr, quantize_rows_q3_k, false, true},
    {DType::q4_k, "q4_k", 256, 144, true, dequantize_row_q4_k, nullptr, quantize_rows_q4_k, false, true},
    {DType::q5_k, "q5_k", 256, 176, true, dequantize_row_q5_k, nullptr, quantize_rows_q5_k, false, true},
    {DType::q6_k, "q6_k", 256, 210, true, dequantize_row_q6_k, nullptr, quantize_rows_q6_k, false, true},
    {DType::q8_k, "q8_k", 256, 292, true, dequantize_row_q8_k, quantize_row_q8_k, nullptr, false, true},
    {DType::iq2_xxs, "iq2_xxs", 256, 66, true, dequantize_row_iq2_xxs, nullptr, quantize_rows_iq2_xxs, true,
     true},
    {DType::iq2_xs, "iq2_xs", 256, 74, true, dequantize_row_iq2_xs, nullptr, quantize_rows_iq2_xs, true,
     true},
    {DType::iq3_xxs, "iq3_xxs", 256, 98, true, dequantize_row_iq3_xxs, nullptr, quantize_rows_iq3_xxs, false,
     true},
    {DType::iq1_s, "iq1_s", 256, 50, true, dequantize_row_iq1_s, nullptr, quantize_rows_iq1_s, true, true},
    {DType::iq4_nl, "iq4_nl", 32, 18, true, dequantize_row_iq4_nl, nullptr, quantize_rows_iq4_nl, false,
     true},
    {DType::iq3_s, "iq3_s", 256, 110, true, dequantize_row_iq3_s, nullptr, quantize_rows_iq3_s, false, true},
    {DType::iq2_s, "iq2_s", 256, 82, true, dequantize_row_iq2_s, nullptr, quantize_rows_iq2_s, false, true},
    {DType::iq4_xs, "iq4_xs", 256, 136, true, dequantize_row_iq4_xs, nullptr, quantize_rows_iq4_xs, false,
     true},
    {DType::i8, "i8", 1, 1, false, nullptr, nullptr, nullptr, false, true},
    {DType::i16, "i16", 1, 2, false, nullptr, nullptr, nullptr, false, true},
    {DType::i32, "i32", 1, 4, false, nullptr, nullptr, nullptr, false, true},
    {DType::i64, "i64", 1, 8, false, nullptr, nullptr, nullptr, false, true},
    {DType::f64, "f64", 1, 8, false, nullptr, nullptr, nullptr, false, true},
    {DType::iq1_m, "iq1_m", 256, 56, true, dequantize_row_iq1_m, nullptr, quantize_rows_iq1_m, false, true},
    {DType::bf16, "bf16", 1, 2, false, dequantize_row_bf16, quantize_row_bf16, quantize_rows_bf16, false,
     true},
    {DType::tq1_0, "tq1_0", 256, 54, true, dequantize_row_tq1_0, nullptr, nullptr, false, true},
    {DType::tq2_0, "tq2_0", 256, 66, true, dequantize_row_tq2_0, nullptr, nullptr, false, true},
    {DType::mxfp4, "mxfp4", 32, 17, true, dequantize_row_mxfp4, nullptr, nullptr, false, true},
    {DType::f8_e4m3, "f8_e4m3", 32, 36, true, dequantize_row_f8_e4m3, quantize_row_f8_e4m3, nullptr, false,
     false},
    {DType::q8_64, "q8_64", 64, 66, true, dequantize_row_q8_64, quantize_row_q8_64, nullptr, false, false},
};
// clang-format on
constexpr int kTableSize = static_cast<int>(std::size(kTable));

// Type id -> index into kTable, -1 for ids that are not types. ggml's ids are below 64, kiln's in-memory
// forms start at 100.
constexpr int kMaxId = 128;
constexpr std::array<int8_t, kMaxId> make_index() {
  std::array<int8_t, kMaxId> index{};
  for (auto& v : index) v = -1;
  for (int i = 0; i < kTableSize; ++i) index[static_cast<uint32_t>(kTable[i].type)] = static_cast<int8_t>(i);
  return index;
}
constexpr std::array<int8_t, kMaxId> kIndex = make_index();

constexpr bool table_in_id_order() {
  for (int i = 1; i < kTableSize; ++i)
    if (static_cast<uint32_t>(kTable[i - 1].type) >= static_cast<uint32_t>(kTable[i].type)) return false;
  return true;
}
static_assert(table_in_id_order(), "kTable must list each type once, in id order");
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ8_K) == 292 && sizeof(BlockF8E4M3) == 36 &&
                  sizeof(BlockQ8_64) == 66,
              "block structs match the table");

int table_index(uint32_t id) { return id < kMaxId ? kIndex[id] : -1; }

bool equal_ignoring_case(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  }
  return true;
}

}  // namespace

const DTypeInfo& dtype_info(DType type) {
  const int i = table_index(static_cast<uint32_t>(type));
  KILN_ASSERT(i >= 0);
  return kTable[i];
}

Result<DType> dtype_from_gguf_id(uint32_t id) {
  const int i = table_index(id);
  if (i < 0) return invalid_argument("unknown ggml type id {} (not a type kiln knows)", id);
  // kiln's in-memory forms have ids no ggml type uses; a file claiming one is malformed.
  if (!kTable[i].gguf) {
    return invalid_argument("type id {} ({}) is one of kiln's in-memory forms, not a GGUF type", id,
                            kTable[i].name);
  }
  return kTable[i].type;
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const DTypeInfo& info : kTable) {
    if (equal_ignoring_case(name, info.name)) return info.type;
  }
  return std::nullopt;
}

Result<int64_t> dtype_row_bytes(DType type, int64_t n_elements) {
  const DTypeInfo& info = dtype_info(type);
  if (n_elements < 0) return invalid_argument("{}: element count {} is negative", info.name, n_elements);
  if (n_elements % info.block_size != 0) {
    return invalid_argument("{}: element count {} is not a multiple of the block size {}", info.name,
                            n_elements, info.block_size);
  }
  const int64_t blocks = n_elements / info.block_size;
  if (blocks > std::numeric_limits<int64_t>::max() / info.type_size) {
    return out_of_range("{}: {} elements take more than 2^63 bytes", info.name, n_elements);
  }
  return blocks * info.type_size;
}

const DTypeInfo* dtype_table(int* count) {
  if (count != nullptr) *count = kTableSize;
  return kTable;
}

}  // namespace kiln
