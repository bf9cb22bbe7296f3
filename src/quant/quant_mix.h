// Type mixes: which type each tensor of a model is written as for a file type such as Q4_K_M, the choice
// llama.cpp's llama-quantize makes for the same model, file type and options (so that the files match).
//
// A file type names a base type (Q4_K_M: q4_k) and a mix: rules by tensor role (token embedding, output head,
// attention V / K / Q / output, FFN down / gate / up) that give the roles most sensitive to rounding more
// bits, some in every layer, some in the first and last eighth of the layers and every third layer between
// them (more_bits_layer), some depending on grouped-query attention (n_head / n_head_kv) or the expert count.
// Tensors that are not weight matrices (1-d tensors, norms, position embeddings, expert routers) are kept
// as they are. A row length that is not a whole number of the chosen type's blocks falls back to a type
// with smaller blocks (q4_k -> q5_0, ...), or to f16.
//
// The counters of the rules (the n-th attention V matrix, the n-th FFN down matrix of a dense model) follow
// the order llama.cpp visits tensors in: sort_like_llama() below; choose_types() takes them in that order.
#pragma once

#include <cstdint>
#include <optional>
#include <regex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace kiln::gguf {
class File;
}

namespace kiln::quant {

// General.file_type values (llama.cpp's LLAMA_FTYPE_*).
enum class FileType : uint32_t {
  all_f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q8_0 = 7,
  q5_0 = 8,
  q5_1 = 9,
  q2_k = 10,
  q3_k_s = 11,
  q3_k_m = 12,
  q3_k_l = 13,
  q4_k_s = 14,
  q4_k_m = 15,
  q5_k_s = 16,
  q5_k_m = 17,
  q6_k = 18,
  iq2_xxs = 19,
  iq2_xs = 20,
  q2_k_s = 21,
  iq3_xs = 22,
  iq3_xxs = 23,
  iq1_s = 24,
  iq4_nl = 25,
  iq3_s = 26,
  iq3_m = 27,
  iq2_s = 28,
  iq2_m = 29,
  iq4_xs = 30,
  iq1_m = 31,
  bf16 = 32,
};

struct FileTypeInfo {
  FileType type;
  const char* name;   // as llama-quantize spells it: "Q4_K_M"
  DType base;         // the type the mix starts every weight matrix from
  const char* about;  // one line for --help
};

// Every file type kiln writes, in llama-quantize's listing order.
std::span<const FileTypeInfo> file_types();
const FileTypeInfo& file_type_info(FileType type);
// "q4_k_m", "Q4_K_M", the aliases Q3_K / Q4_K / Q5_K (the _M mixes), or the number ("15"); nullopt when
// unknown.
std::optional<FileType> file_type_from_name(std::string_view name);

// What the rules read from a model's metadata.
struct ModelFacts {
  std::string arch;       // general.architecture
  int64_t n_layer = 0;    // {arch}.block_count
  int64_t n_head = 0;     // {arch}.attention.head_count (of layer 0 when per layer)
  int64_t n_head_kv = 0;  // {arch}.attention.head_count_kv (of layer 0), default n_head
  int64_t n_expert = 0;   // {arch}.expert_count, 0 for a dense model
  bool is_70b = false;    // a model llama.cpp sizes as 70B (llama with 80 layers and GQA, qwen2 with 80...)
  int64_t n_gqa() const { return n_head_kv == 0 ? 0 : n_head / n_head_kv; }
};
// Errors: no general.architecture or {arch}.block_count, a key of the wrong type.
Result<ModelFacts> model_facts(const gguf::File& file);

// --tensor-type PATTERN=TYPE: tensors whose name the (lower-cased, ECMAScript) regular expression PATTERN
// matches anywhere are written as TYPE; the first matching pattern wins.
struct TypeOverride {
  std::string pattern;
  std::regex regex;
  DType type;
};
// Errors name the bad spec: no '=', an empty pattern or type, an unknown type, a pattern that does not
// compile.
Result<TypeOverride> parse_type_override(std::string_view spec);

struct MixOptions {
  FileType file_type = FileType::q8_0;
  std::optional<DType> output_tensor_type;    // --output-tensor-type: output.weight (and a tied embedding)
  std::optional<DType> token_embedding_type;  // --token-embedding-type
  std::vector<TypeOverride> overrides;        // --tensor-type, in the order given
  bool pure = false;                          // --pure: the base type for every weight matrix, no mix
  bool leave_output = false;                  // --leave-output-tensor: output.weight kept as it is
  bool has_imatrix = false;                   // some rules differ when an importance matrix is given
};

// One tensor as the rules see it.
struct TensorDesc {
  std::string_view name;
  std::span<const int64_t> shape;  // GGUF order, trailing 1s dropped (as ggml counts dimensions)
  DType type;                      // as stored
};

struct TypeChoice {
  DType type;             // what the tensor is written as (its stored type when it is kept)
  bool quantizable;       // a weight matrix the mix applies to (false: copied as it is)
  bool requires_imatrix;  // `type` in this file type needs an importance matrix for this tensor
  bool fell_back;         // the mix's type did not fit the rows: `type` is its fallback
  std::string note;       // a fallback or override the user should hear of, or empty
};

// The types for `tensors`, given in sort_like_llama() order. Errors: a tensor whose layer an MoE rule needs
// and whose name does not say it, a 256-block type with no smaller fallback.
Result<std::vector<TypeChoice>> choose_types(const ModelFacts& model, std::span<const TensorDesc> tensors,
                                             const MixOptions& options);

// The order llama.cpp visits (and writes) a model's tensors in: tensors outside the blocks first, then
// blk.0.*, blk.1.*, ...; by name within each. Returns indices into `names`.
std::vector<size_t> sort_like_llama(std::span<const std::string> names);

}  // namespace kiln::quant
