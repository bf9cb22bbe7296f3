// The mix rules, by tensor role. Each rule function returns the type for its role given the type chosen so
// far (the file type's base), and advances the counters its role keeps.
#include "quant/quant_mix.h"

#include <algorithm>
#include <cctype>
#include <initializer_list>
#include <limits>

#include "formats/gguf.h"

namespace kiln::quant {

namespace {

using FT = FileType;

// clang-format off: one row per file type
constexpr FileTypeInfo kFileTypes[] = {
    {FT::q4_0, "Q4_0", DType::q4_0, "4.5 bpw, legacy"},
    {FT::q4_1, "Q4_1", DType::q4_1, "5.0 bpw, legacy"},
    {FT::q5_0, "Q5_0", DType::q5_0, "5.5 bpw, legacy"},
    {FT::q5_1, "Q5_1", DType::q5_1, "6.0 bpw, legacy"},
    {FT::iq2_xxs, "IQ2_XXS", DType::iq2_xxs, "2.06 bpw i-quant (needs --imatrix)"},
    {FT::iq2_xs, "IQ2_XS", DType::iq2_xs, "2.31 bpw i-quant (needs --imatrix)"},
    {FT::iq2_s, "IQ2_S", DType::iq2_xs, "2.5 bpw i-quant mix (needs --imatrix)"},
    {FT::iq2_m, "IQ2_M", DType::iq2_s, "2.7 bpw i-quant mix (needs --imatrix)"},
    {FT::iq1_s, "IQ1_S", DType::iq1_s, "1.56 bpw i-quant (needs --imatrix)"},
    {FT::iq1_m, "IQ1_M", DType::iq1_m, "1.75 bpw i-quant (needs --imatrix)"},
    {FT::q2_k, "Q2_K", DType::q2_k, "2.6 bpw k-quant mix"},
    {FT::q2_k_s, "Q2_K_S", DType::q2_k, "2.6 bpw k-quant mix (needs --imatrix)"},
    {FT::iq3_xxs, "IQ3_XXS", DType::iq3_xxs, "3.06 bpw i-quant (needs --imatrix)"},
    {FT::iq3_s, "IQ3_S", DType::iq3_s, "3.44 bpw i-quant"},
    {FT::iq3_m, "IQ3_M", DType::iq3_s, "3.66 bpw i-quant mix"},
    {FT::iq3_xs, "IQ3_XS", DType::iq3_s, "3.3 bpw i-quant mix (needs --imatrix)"},
    {FT::q3_k_s, "Q3_K_S", DType::q3_k, "3.4 bpw k-quant mix"},
    {FT::q3_k_m, "Q3_K_M", DType::q3_k, "3.7 bpw k-quant mix"},
    {FT::q3_k_l, "Q3_K_L", DType::q3_k, "4.0 bpw k-quant mix"},
    {FT::iq4_nl, "IQ4_NL", DType::iq4_nl, "4.5 bpw non-linear"},
    {FT::iq4_xs, "IQ4_XS", DType::iq4_xs, "4.25 bpw non-linear"},
    {FT::q4_k_s, "Q4_K_S", DType::q4_k, "4.4 bpw k-quant mix"},
    {FT::q4_k_m, "Q4_K_M", DType::q4_k, "4.6 bpw k-quant mix"},
    {FT::q5_k_s, "Q5_K_S", DType::q5_k, "5.2 bpw k-quant mix"},
    {FT::q5_k_m, "Q5_K_M", DType::q5_k, "5.3 bpw k-quant mix"},
    {FT::q6_k, "Q6_K", DType::q6_k, "6.6 bpw k-quant"},
    {FT::q8_0, "Q8_0", DType::q8_0, "8.5 bpw"},
    {FT::f16, "F16", DType::f16, "16 bpw"},
    {FT::bf16, "BF16", DType::bf16, "16 bpw"},
    {FT::all_f32, "F32", DType::f32, "32 bpw"},
};
// clang-format on

bool equal_ignoring_case(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

bool one_of(FT ft, std::initializer_list<FT> set) {
  return std::find(set.begin(), set.end(), ft) != set.end();
}

// The layer of "blk.N....", read as C's scanf("blk.%d.") reads it (leading blanks and a sign allowed);
// nullopt when the name has none.
std::optional<int> block_index(std::string_view name) {
  if (!name.starts_with("blk.")) return std::nullopt;
  size_t i = 4;
  while (i < name.size() && std::isspace(static_cast<unsigned char>(name[i]))) ++i;
  bool negative = false;
  if (i < name.size() && (name[i] == '+' || name[i] == '-')) negative = name[i++] == '-';
  if (i >= name.size() || !std::isdigit(static_cast<unsigned char>(name[i]))) return std::nullopt;
  int64_t v = 0;
  for (; i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])); ++i)
    v = std::min<int64_t>(v * 10 + (name[i] - '0'), std::numeric_limits<int>::max());
  return static_cast<int>(negative ? -v : v);
}

enum class Role {
  token_embd,  // token_embd.weight, per_layer_token_embd.weight
  output,      // output.weight
  attn_v,      // attn_v, and the fused attn_qkv and attn_kv_b, which share its rules
  attn_k,
  attn_q,
  attn_output,
  ffn_up,  // dense and expert (ffn_up_exps, ffn_up_shexp)
  ffn_gate,
  ffn_down,
  other,
};

Role role_of(std::string_view name) {
  if (name == "output.weight") return Role::output;
  if (name == "token_embd.weight" || name == "per_layer_token_embd.weight") return Role::token_embd;
  if (contains(name, "attn_qkv.weight") || contains(name, "attn_kv_b.weight") ||
      contains(name, "attn_v.weight"))
    return Role::attn_v;
  if (contains(name, "attn_k.weight")) return Role::attn_k;
  if (contains(name, "attn_q.weight")) return Role::attn_q;
  if (contains(name, "attn_output.weight")) return Role::attn_output;
  if (contains(name, "ffn_up")) return Role::ffn_up;
  if (contains(name, "ffn_gate")) return Role::ffn_gate;
  if (contains(name, "ffn_down")) return Role::ffn_down;
  return Role::other;
}

// Small or special matrices kept as they are: expert routers, position embeddings, vision and audio
// towers' small tensors, recurrent models' small mixing weights.
constexpr std::string_view kKeptParts[] = {"_norm.weight",
                                           "ffn_gate_inp.weight",
                                           "ffn_gate_tid2eid.weight",
                                           "altup",
                                           "laurel",
                                           "per_layer_model_proj",
                                           "ssm_conv1d",
                                           "shortconv.conv.weight",
                                           "indexer.k_proj.weight",
                                           "indexer.q_proj.weight",
                                           "time_mix_first.weight",
                                           "time_mix_w0.weight",
                                           "time_mix_w1.weight",
                                           "time_mix_w2.weight",
                                           "time_mix_v0.weight",
                                           "time_mix_v1.weight",
                                           "time_mix_v2.weight",
                                           "time_mix_a0.weight",
                                           "time_mix_a1.weight",
                                           "time_mix_a2.weight",
                                           "time_mix_g1.weight",
                                           "time_mix_g2.weight",
                                           "time_mix_decay_w1.weight",
                                           "time_mix_decay_w2.weight",
                                           "time_mix_lerp_fused.weight",
                                           "attn_rel_b.weight",
                                           ".position_embd",
                                           "sam.pos_embd",
                                           "sam.neck.",
                                           "sam.net_",
                                           ".rel_pos",
                                           ".patch_embd",
                                           ".patch_merger",
                                           "a.rvq.codebook",
                                           "mm.a.code_embd"};
constexpr std::string_view kKeptPartsGlm5Next[] = {"hc_",
                                                   "indexer.attn_q_b",
                                                   "indexer.attn_k",
                                                   "indexer.proj",
                                                   "indexer_compressor_gate",
                                                   "indexer_compressor_ape",
                                                   "ssm_f_a.weight",
                                                   "ssm_f_b.weight",
                                                   "ssm_g_a.weight",
                                                   "ssm_g_b.weight",
                                                   "ssm_beta.weight",
                                                   "attn_kv_a_mqa.weight",
                                                   "attn_k_b.weight",
                                                   "attn_v_b.weight"};

bool is_weight_matrix(const ModelFacts& model, const TensorDesc& t, const MixOptions& options) {
  const std::string_view name = t.name;
  if (t.shape.size() < 2 || !name.ends_with("weight")) return false;
  if (options.leave_output && name == "output.weight") return false;
  if (name == "position_embd.weight" || name == "token_types.weight") return false;
  for (std::string_view part : kKeptParts)
    if (contains(name, part)) return false;
  if (model.arch == "glm5-next") {
    for (std::string_view part : kKeptPartsGlm5Next)
      if (contains(name, part)) return false;
  }
  return true;
}

// The layers that get more bits in the mixes that vary by layer: the first and last eighth, and every third
// layer between them.
bool more_bits_layer(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// The 1- and 2-bit i-quant mixes, which share one set of rules for the matrices inside the blocks.
bool low_bit_iq(FT ft) {
  return one_of(ft, {FT::iq2_xxs, FT::iq2_xs, FT::iq1_s, FT::iq2_s, FT::iq2_m, FT::iq1_m});
}

// The state the rules keep while visiting a model's tensors in order.
struct Mix {
  const ModelFacts& model;
  const MixOptions& options;
  FT ft;
  bool tied_embeddings = true;  // no output.weight: the token embedding is also the output head
  int n_attn_v = 0;             // attention V (and fused QKV) matrices in the model
  int i_attn_v = 0;             // ... visited so far
  int i_ffn_down = 0, i_ffn_gate = 0, i_ffn_up = 0;

  bool falcon() const { return model.arch == "falcon"; }
  int n_layer() const { return static_cast<int>(model.n_layer); }

  // (layer, layers) of an FFN matrix: in a dense model the count of its role visited so far; in an MoE model
  // the layer its name gives (experts and shared experts of a layer are several matrices of one role).
  Result<std::pair<int, int>> layer_of(int counter, std::string_view name) const {
    if (model.n_expert <= 1) return std::pair{counter, n_layer()};
    const std::optional<int> index = block_index(name);
    if (!index) return invalid_argument("cannot tell the layer of tensor '{}' (no blk.N. prefix)", name);
    const int layer = *index;
    if (layer < 0 || layer >= n_layer())
      return invalid_argument("tensor '{}': layer {} is not in [0, {})", name, layer, n_layer());
    return std::pair{layer, n_layer()};
  }

  // The output head, and the token embedding when it is also the head.
  DType output(DType t, int64_t ne0) const {
    if (options.output_tensor_type) return *options.output_tensor_type;
    if (falcon() || ne0 % dtype_info(t).block_size != 0) return DType::q8_0;
    if (one_of(ft, {FT::iq2_xxs, FT::iq2_xs, FT::iq3_xxs, FT::iq1_s, FT::iq2_s, FT::iq2_m, FT::iq1_m}))
      return DType::q5_k;
    return t == DType::q8_0 ? t : DType::q6_k;
  }

  DType token_embd(DType t) const {
    if (options.token_embedding_type) return *options.token_embedding_type;
    if (one_of(ft, {FT::iq2_xxs, FT::iq2_xs, FT::iq1_s, FT::iq1_m})) return DType::q2_k;
    if (one_of(ft, {FT::iq2_s, FT::iq2_m, FT::iq3_xxs})) return DType::iq3_s;
    return t;
  }

  // Block matrices in the 1- and 2-bit i-quant mixes.
  DType low_bit(Role role, DType t) {
    const bool iq2_s_m = one_of(ft, {FT::iq2_s, FT::iq2_m});
    switch (role) {
      case Role::attn_v:
        ++i_attn_v;
        if (model.n_gqa() >= 4 || model.n_expert >= 4) return DType::q4_k;
        return iq2_s_m ? DType::iq3_s : DType::q2_k;
      case Role::attn_k: return model.n_expert == 8 ? DType::q4_k : t;
      case Role::ffn_down: {
        const bool first_eighth = i_ffn_down < n_layer() / 8;
        ++i_ffn_down;
        if (first_eighth) return iq2_s_m ? DType::iq3_s : DType::q2_k;
        return t;
      }
      case Role::attn_output:
        if (model.n_expert == 8) return DType::q5_k;
        if (one_of(ft, {FT::iq1_s, FT::iq1_m})) return DType::iq2_xxs;
        if (iq2_s_m) return DType::iq3_s;
        return t;
      default: return t;
    }
  }

  DType attn_v(DType t) {
    const int64_t gqa = model.n_gqa();
    switch (ft) {
      case FT::q2_k: t = gqa >= 4 ? DType::q4_k : DType::q3_k; break;
      case FT::q2_k_s:
        if (gqa >= 4) t = DType::q4_k;
        break;
      case FT::iq3_xxs:
        t = gqa >= 4 ? DType::q4_k : options.has_imatrix ? DType::iq3_xxs : DType::iq3_s;
        break;
      case FT::iq3_xs:
      case FT::iq3_s:
        if (gqa >= 4) t = DType::q4_k;
        break;
      case FT::iq3_m: t = DType::q4_k; break;
      case FT::q3_k_m: t = i_attn_v < 2 ? DType::q5_k : DType::q4_k; break;
      case FT::q3_k_l: t = DType::q5_k; break;
      case FT::iq4_nl:
      case FT::iq4_xs:
        if (gqa >= 4) t = DType::q5_k;
        break;
      case FT::q4_k_m:
      case FT::q5_k_m:
        if (more_bits_layer(i_attn_v, n_attn_v)) t = DType::q6_k;
        break;
      case FT::q4_k_s:
        if (i_attn_v < 4) t = DType::q5_k;
        break;
      default: break;
    }
    // A 70B model shares each V matrix among 8 heads: V is small, more bits cost little.
    if (model.is_70b && (t == DType::q3_k || t == DType::q4_k)) t = DType::q5_k;
    if (model.n_expert == 8) t = DType::q8_0;
    ++i_attn_v;
    return t;
  }

  DType attn_k(DType t) const {
    if (model.n_expert == 8) return DType::q8_0;
    if (ft == FT::iq3_xs) return DType::iq3_xxs;
    if (ft == FT::iq3_xxs) return DType::iq2_s;
    return t;
  }

  DType attn_q(DType t) const {
    if (ft == FT::iq3_xs) return DType::iq3_xxs;
    if (ft == FT::iq3_xxs) return DType::iq2_s;
    return t;
  }

  Result<DType> ffn_down(DType t, std::string_view name) {
    KILN_ASSIGN_OR_RETURN(const auto li, layer_of(i_ffn_down, name));
    ++i_ffn_down;
    const auto [i, n] = li;
    const bool more = more_bits_layer(i, n);
    switch (ft) {
      case FT::q2_k: return DType::q3_k;
      case FT::q2_k_s: return i < n / 8 ? DType::q4_k : t;
      case FT::iq3_xxs:
        if (!options.has_imatrix) return i < n / 8 ? DType::q4_k : DType::q3_k;
        return t;
      case FT::q3_k_m:
        if (i < n / 16) return DType::q5_k;
        return !falcon() || more ? DType::q4_k : DType::q3_k;
      case FT::iq3_m: return i < n / 8 || (model.n_expert == 8 && more) ? DType::q4_k : t;
      case FT::q3_k_l: return falcon() ? DType::q4_k : DType::q5_k;
      case FT::q4_k_m:
        if (falcon()) return i < n / 16 ? DType::q6_k : more ? DType::q5_k : DType::q4_k;
        return more ? DType::q6_k : t;
      case FT::iq4_nl:
      case FT::iq4_xs: return i < n / 8 && !options.has_imatrix ? DType::q5_k : t;
      case FT::q5_k_m: return more ? DType::q6_k : t;
      case FT::q4_k_s: return !falcon() && i < n / 8 ? DType::q5_k : t;
      // With an importance matrix only, so that a file made without one stays as it always was.
      case FT::q4_0: return options.has_imatrix && i < n / 8 ? DType::q4_1 : t;
      case FT::q5_0: return options.has_imatrix && i < n / 8 ? DType::q5_1 : t;
      default: return t;
    }
  }

  DType attn_output(DType t) const {
    if (falcon()) return ft == FT::q3_k_l ? DType::q4_k : t;
    if (model.n_expert == 8) {
      return one_of(ft, {FT::q2_k, FT::iq3_xs, FT::iq3_xxs, FT::q3_k_s, FT::q3_k_m, FT::iq4_nl, FT::q4_k_s,
                         FT::q4_k_m, FT::iq3_s, FT::iq3_m, FT::iq4_xs})
                 ? DType::q5_k
                 : t;
    }
    switch (ft) {
      case FT::q2_k: return DType::q3_k;
      case FT::iq3_xxs: return DType::iq3_s;
      case FT::q3_k_m: return DType::q4_k;
      case FT::q3_k_l: return DType::q5_k;
      case FT::iq3_m: return DType::q4_k;
      default: return t;
    }
  }

  // FFN gate and up: IQ3_XS gives the middle layers fewer bits.
  Result<DType> ffn_gate_up(DType t, std::string_view name, int& counter) {
    KILN_ASSIGN_OR_RETURN(const auto li, layer_of(counter, name));
    ++counter;
    const auto [i, n] = li;
    return ft == FT::iq3_xs && i >= n / 8 && i < 7 * n / 8 ? DType::iq3_xxs : t;
  }

  // The mix's type for a weight matrix, from the base type `t`.
  Result<DType> mixed(const TensorDesc& tensor, Role role, DType t) {
    // glm5-next's low-rank Q projections and next-token head stay at 8 bits.
    if (model.arch == "glm5-next" &&
        (contains(tensor.name, "attn_q_a") || contains(tensor.name, "attn_q_b") ||
         contains(tensor.name, "nextn.eh_proj")))
      return DType::q8_0;
    if (role == Role::output || (tied_embeddings && role == Role::token_embd))
      return output(t, tensor.shape[0]);
    if (role == Role::token_embd) return token_embd(t);
    if (low_bit_iq(ft)) return low_bit(role, t);
    switch (role) {
      case Role::attn_v: return attn_v(t);
      case Role::attn_k: return attn_k(t);
      case Role::attn_q: return attn_q(t);
      case Role::ffn_down: return ffn_down(t, tensor.name);
      case Role::attn_output: return attn_output(t);
      case Role::ffn_gate: return ffn_gate_up(t, tensor.name, i_ffn_gate);
      case Role::ffn_up: return ffn_gate_up(t, tensor.name, i_ffn_up);
      default: return t;
    }
  }
};

// A type whose blocks divide a row of `ne0` when `type`'s do not; `note` says so. Error for a 256-block type
// with no smaller fallback.
Result<DType> fallback(std::string_view name, int64_t ne0, DType type, std::string& note) {
  const int64_t block = dtype_info(type).block_size;
  if (ne0 % block == 0) return type;
  DType to = type;
  switch (type) {
    case DType::iq1_s:
    case DType::iq1_m:
    case DType::iq2_xxs:
    case DType::iq2_xs:
    case DType::iq2_s:
    case DType::iq3_xxs:
    case DType::iq3_s:
    case DType::iq4_xs: to = DType::iq4_nl; break;
    case DType::q2_k:
    case DType::q3_k:
    case DType::tq1_0:
    case DType::tq2_0: to = DType::q4_0; break;
    case DType::q4_k: to = DType::q5_0; break;
    case DType::q5_k: to = DType::q5_1; break;
    case DType::q6_k: to = DType::q8_0; break;
    default:
      if (block > 32) {
        return invalid_argument(
            "tensor '{}': rows of {} are not a multiple of {}'s block ({}) and {} has no "
            "fallback type",
            name, ne0, dtype_name(type), block, dtype_name(type));
      }
  }
  if (ne0 % dtype_info(to).block_size != 0) to = DType::f16;
  note = fmt::format("rows of {} are not a multiple of {} ({}'s block): falling back to {}", ne0, block,
                     dtype_name(type), dtype_name(to));
  return to;
}

// llama.cpp's rule for when a tensor cannot go without an importance matrix.
bool needs_imatrix(std::string_view name, DType type, FT ft) {
  if (role_of(name) == Role::token_embd || role_of(name) == Role::output) return false;
  switch (type) {
    case DType::iq3_xxs:
    case DType::iq2_xxs:
    case DType::iq2_xs:
    case DType::iq2_s:
    case DType::iq1_m:
    case DType::iq1_s: return true;
    case DType::q2_k: return ft == FT::q2_k_s;  // the one k-quant mix that needs one
    default: return false;
  }
}

}  // namespace

std::span<const FileTypeInfo> file_types() { return kFileTypes; }

const FileTypeInfo& file_type_info(FileType type) {
  for (const FileTypeInfo& info : kFileTypes)
    if (info.type == type) return info;
  KILN_ASSERT(false);
  return kFileTypes[0];
}

std::optional<FileType> file_type_from_name(std::string_view name) {
  for (const FileTypeInfo& info : kFileTypes)
    if (equal_ignoring_case(name, info.name)) return info.type;
  if (equal_ignoring_case(name, "Q3_K")) return FT::q3_k_m;
  if (equal_ignoring_case(name, "Q4_K")) return FT::q4_k_m;
  if (equal_ignoring_case(name, "Q5_K")) return FT::q5_k_m;
  // Or the general.file_type number, as llama-quantize also takes it.
  if (!name.empty() && name.size() < 4 && std::all_of(name.begin(), name.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c)) != 0;
      })) {
    const uint32_t id = static_cast<uint32_t>(std::stoul(std::string(name)));
    for (const FileTypeInfo& info : kFileTypes)
      if (static_cast<uint32_t>(info.type) == id) return info.type;
  }
  return std::nullopt;
}

Result<ModelFacts> model_facts(const gguf::File& file) {
  ModelFacts m;
  m.arch = file.architecture();
  if (m.arch.empty()) return invalid_argument("{}: no general.architecture", file.name());
  const std::string p = m.arch + ".";
  KILN_ASSIGN_OR_RETURN(const uint64_t n_layer, file.get_uint(p + "block_count"));
  if (n_layer == 0 || n_layer > 100000)
    return invalid_argument("{}: {}block_count = {} is out of range", file.name(), p, n_layer);
  m.n_layer = static_cast<int64_t>(n_layer);
  // Per-layer counts may be arrays; the rules read layer 0's.
  auto first = [&](const std::string& key, int64_t fallback) -> Result<int64_t> {
    const gguf::Value* v = file.find(key);
    if (v == nullptr) return fallback;
    if (v->as_array() != nullptr) {
      KILN_ASSIGN_OR_RETURN(const std::vector<int64_t> a, file.get_int_array(key));
      return a.empty() ? fallback : a[0];
    }
    return file.get_int(key);
  };
  KILN_ASSIGN_OR_RETURN(m.n_head, first(p + "attention.head_count", 0));
  KILN_ASSIGN_OR_RETURN(m.n_head_kv, first(p + "attention.head_count_kv", m.n_head));
  KILN_ASSIGN_OR_RETURN(const uint64_t n_expert, file.get_uint_or(p + "expert_count", 0));
  m.n_expert = static_cast<int64_t>(n_expert);
  // The models llama.cpp sizes as 70B (the only size a rule looks at).
  m.is_70b = (m.arch == "llama" && m.n_layer == 80 && m.n_head != m.n_head_kv) ||
             ((m.arch == "qwen2" || m.arch == "deci" || m.arch == "olmo") && m.n_layer == 80) ||
             (m.arch == "jais2" && m.n_layer == 68);
  return m;
}

Result<TypeOverride> parse_type_override(std::string_view spec) {
  const size_t eq = spec.find('=');
  if (eq == std::string_view::npos)
    return invalid_argument("--tensor-type '{}': expected PATTERN=TYPE (e.g. attn_v=q8_0)", spec);
  std::string pattern(spec.substr(0, eq));
  const std::string_view type_name = spec.substr(eq + 1);
  if (pattern.empty()) return invalid_argument("--tensor-type '{}': the tensor name pattern is empty", spec);
  if (type_name.empty()) return invalid_argument("--tensor-type '{}': the type is empty", spec);
  const std::optional<DType> type = dtype_from_name(type_name);
  if (!type) return invalid_argument("--tensor-type '{}': unknown type '{}'", spec, type_name);
  for (char& c : pattern) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  TypeOverride o{pattern, {}, *type};
  try {
    o.regex = std::regex(pattern);
  } catch (const std::regex_error& e) {
    return invalid_argument("--tensor-type '{}': the pattern '{}' is not a valid regular expression ({})",
                            spec, pattern, e.what());
  }
  return o;
}

Result<std::vector<TypeChoice>> choose_types(const ModelFacts& model, std::span<const TensorDesc> tensors,
                                             const MixOptions& options) {
  const FT ft = options.file_type;
  const DType base = file_type_info(ft).base;
  const bool base_quantized = dtype_info(base).is_quantized;
  Mix mix{model, options, ft};
  for (const TensorDesc& t : tensors) {
    const Role role = role_of(t.name);
    if (role == Role::attn_v) ++mix.n_attn_v;
    if (role == Role::output) mix.tied_embeddings = false;
  }
  std::vector<TypeChoice> out;
  out.reserve(tensors.size());
  for (const TensorDesc& t : tensors) {
    TypeChoice c{t.type, is_weight_matrix(model, t, options), false, false, {}};
    const Role role = role_of(t.name);
    if (!c.quantizable) {
      out.push_back(std::move(c));
      continue;
    }
    // The types the user named for the embedding and the head are taken as they are.
    const std::optional<DType> named = role == Role::token_embd ? options.token_embedding_type
                                       : role == Role::output   ? options.output_tensor_type
                                                                : std::nullopt;
    bool named_by_pattern = false;
    if (named && t.name == "per_layer_token_embd.weight") {
      // A large table of its own: a --tensor-type pattern that names it wins over --token-embedding-type.
      for (const TypeOverride& o : options.overrides)
        named_by_pattern = named_by_pattern || std::regex_search(std::string(t.name), o.regex);
    }
    if (named && !named_by_pattern) {
      c.type = *named;
    } else {
      c.type = base;
      if (base_quantized) {
        bool manual = false;
        for (const TypeOverride& o : options.overrides) {
          if (!std::regex_search(std::string(t.name), o.regex)) continue;
          if (o.type != c.type)
            c.note = fmt::format("--tensor-type {}: {} instead of {}", o.pattern, dtype_name(o.type),
                                 dtype_name(c.type));
          c.type = o.type;
          manual = true;
          break;
        }
        if (!manual && !options.pure) {
          KILN_ASSIGN_OR_RETURN(c.type, mix.mixed(t, role, c.type));
        }
        std::string note;
        KILN_ASSIGN_OR_RETURN(c.type, fallback(t.name, t.shape[0], c.type, note));
        c.fell_back = !note.empty();
        if (c.fell_back) c.note = c.note.empty() ? note : c.note + "; " + note;
      }
    }
    c.requires_imatrix = needs_imatrix(t.name, c.type, ft);
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<size_t> sort_like_llama(std::span<const std::string> names) {
  std::vector<size_t> order(names.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int la = block_index(names[a]).value_or(-1), lb = block_index(names[b]).value_or(-1);
    if (la != lb) return la < lb;
    return names[a] < names[b];
  });
  return order;
}

}  // namespace kiln::quant
