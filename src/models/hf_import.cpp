#include "models/hf_import.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <map>
#include <numbers>

#include "formats/folder.h"
#include "formats/safetensors.h"
#include "models/hf_fp8.h"

namespace kiln::hf_import {

void Metadata::set(std::string_view key, gguf::Value v) {
  set_raw(arch_ + "." + std::string(key), std::move(v));
}

void Metadata::set_raw(std::string key, gguf::Value v) {
  for (auto& [k, old] : entries_) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  entries_.emplace_back(std::move(key), std::move(v));
}

Result<hf::ModelConfig> text_config(const hf::ModelConfig& cfg) {
  KILN_ASSIGN_OR_RETURN(std::optional<hf::ModelConfig> text, cfg.text_config());
  if (!text) return cfg;
  // The wrapper names the class; the text config holds the sizes.
  nlohmann::json raw = text->raw();
  if (!raw.contains("architectures") && cfg.raw().contains("architectures"))
    raw["architectures"] = cfg.raw()["architectures"];
  return hf::ModelConfig::from_json(std::move(raw), cfg.source() + " text_config");
}

namespace {

// Everything the assembled File's tensors point into.
struct Storage {
  safetensors::Model weights;
  std::vector<std::vector<uint8_t>> buffers;
};

// Configs that give RoPE per layer type (Gemma 3: {"full_attention": {...}, "sliding_attention": {...}}) are
// read through their full-attention entry; the architecture reads the others itself.
Result<hf::ModelConfig> global_rope_view(const hf::ModelConfig& cfg) {
  const nlohmann::json* rp = cfg.find("rope_parameters");
  if (rp == nullptr || !rp->is_object() || !rp->contains("full_attention")) return cfg;
  nlohmann::json raw = cfg.raw();
  raw["rope_parameters"] = (*rp)["full_attention"];
  return hf::ModelConfig::from_json(std::move(raw), cfg.source());
}

// Llama 3 scaling as GGUF stores it: per-pair frequency divisors in rope_freqs.weight.
Status llama3_factors(const hf::RopeScaling& rs, double theta, int64_t n_rot, const std::string& src,
                      Metadata& md) {
  const hf::JsonObject obj(rs.raw, src + " rope_scaling");
  KILN_ASSIGN_OR_RETURN(const double low, obj.get_float_or("low_freq_factor", 1.0));
  KILN_ASSIGN_OR_RETURN(const double high, obj.get_float_or("high_freq_factor", 4.0));
  KILN_ASSIGN_OR_RETURN(const int64_t orig, obj.get_positive("original_max_position_embeddings"));
  const double factor = rs.factor.value_or(8.0);
  if (!(high > low))
    return invalid_argument("{}: rope_scaling high_freq_factor {} <= low {}", src, high, low);
  std::vector<float> f(static_cast<size_t>(n_rot / 2));
  const double low_wavelen = orig / low, high_wavelen = orig / high;
  for (size_t i = 0; i < f.size(); ++i) {
    const double freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(n_rot));
    const double wavelen = 2.0 * std::numbers::pi / freq;
    double d = 1.0;
    if (wavelen > low_wavelen) {
      d = factor;
    } else if (wavelen >= high_wavelen) {
      const double smooth = (orig / wavelen - low) / (high - low);
      d = 1.0 / ((1.0 - smooth) / factor + smooth);
    }
    f[i] = static_cast<float>(d);
  }
  md.add_tensor("rope_freqs.weight", std::move(f));
  return Status::ok_status();
}

// Routed experts (Mixtral, Qwen-MoE): expert_count, expert_used_count, expert_feed_forward_length,
// expert_shared_feed_forward_length, expert_weights_norm.
Status moe_metadata(const hf::ModelConfig& cfg, Metadata& md) {
  const char* count_key = cfg.has("num_local_experts") ? "num_local_experts" : "num_experts";
  if (!cfg.has(count_key)) return Status::ok_status();
  KILN_ASSIGN_OR_RETURN(const int64_t n, cfg.get_positive(count_key));
  KILN_ASSIGN_OR_RETURN(const int64_t k, cfg.get_positive("num_experts_per_tok"));
  if (k > n) return invalid_argument("{}: num_experts_per_tok {} > {} {}", cfg.source(), k, count_key, n);
  md.set_u32("expert_count", n);
  md.set_u32("expert_used_count", k);
  if (cfg.has("moe_intermediate_size")) {
    KILN_ASSIGN_OR_RETURN(const int64_t ff, cfg.get_positive("moe_intermediate_size"));
    md.set_u32("expert_feed_forward_length", ff);
  }
  if (cfg.has("shared_expert_intermediate_size")) {
    KILN_ASSIGN_OR_RETURN(const int64_t ff, cfg.get_positive("shared_expert_intermediate_size"));
    md.set_u32("expert_shared_feed_forward_length", ff);
  }
  if (cfg.has("norm_topk_prob")) {
    KILN_ASSIGN_OR_RETURN(const bool norm, cfg.get_bool("norm_topk_prob"));
    md.set_bool("expert_weights_norm", norm);
  }
  return Status::ok_status();
}

// The keys every architecture shares.
Status common_metadata(const hf::ModelConfig& cfg_in, const std::string& name, Metadata& md) {
  KILN_ASSIGN_OR_RETURN(const hf::ModelConfig cfg, global_rope_view(cfg_in));
  // Qwen2's window applies only above max_window_layers; the released models leave it off.
  KILN_ASSIGN_OR_RETURN(const bool qwen_swa, cfg.get_bool_or("use_sliding_window", false));
  if (qwen_swa) return unimplemented("{}: use_sliding_window is not supported", cfg.source());
  md.set_raw("general.architecture", gguf::Value::str(md.arch()));
  md.set_raw("general.name", gguf::Value::str(name));
  KILN_ASSIGN_OR_RETURN(const int64_t n_embd, cfg.hidden_size());
  KILN_ASSIGN_OR_RETURN(const int64_t n_layers, cfg.num_hidden_layers());
  KILN_ASSIGN_OR_RETURN(const int64_t n_heads, cfg.num_attention_heads());
  KILN_ASSIGN_OR_RETURN(const int64_t n_kv, cfg.num_key_value_heads());
  KILN_ASSIGN_OR_RETURN(const int64_t head_dim, cfg.head_dim());
  KILN_ASSIGN_OR_RETURN(const int64_t n_ctx, cfg.get_positive_or("max_position_embeddings", 4096));
  KILN_ASSIGN_OR_RETURN(const double eps, cfg.rms_norm_eps());
  KILN_ASSIGN_OR_RETURN(const double theta, cfg.rope_theta());
  md.set_u32("context_length", n_ctx);
  md.set_u32("embedding_length", n_embd);
  md.set_u32("block_count", n_layers);
  if (cfg.has("intermediate_size")) {
    KILN_ASSIGN_OR_RETURN(const int64_t n_ff, cfg.intermediate_size());
    md.set_u32("feed_forward_length", n_ff);
  }
  md.set_u32("attention.head_count", n_heads);
  md.set_u32("attention.head_count_kv", n_kv);
  md.set_u32("attention.key_length", head_dim);
  md.set_u32("attention.value_length", head_dim);
  md.set_f32("attention.layer_norm_rms_epsilon", eps);
  md.set_f32("rope.freq_base", theta);
  double partial = 1.0;
  if (cfg.has("partial_rotary_factor")) {
    KILN_ASSIGN_OR_RETURN(partial, cfg.get_float("partial_rotary_factor"));
  } else if (const nlohmann::json* rp = cfg.find("rope_parameters");
             rp != nullptr && rp->is_object() && rp->contains("partial_rotary_factor")) {
    KILN_ASSIGN_OR_RETURN(partial, hf::JsonObject(*rp, cfg.source()).get_float("partial_rotary_factor"));
  }
  if (!(partial > 0 && partial <= 1))
    return invalid_argument("{}: partial_rotary_factor {} is not in (0, 1]", cfg.source(), partial);
  const int64_t n_rot = static_cast<int64_t>(static_cast<double>(head_dim) * partial) / 2 * 2;
  md.set_u32("rope.dimension_count", n_rot);
  KILN_TRY(moe_metadata(cfg, md));
  KILN_ASSIGN_OR_RETURN(std::optional<hf::RopeScaling> rs, cfg.rope_scaling());
  if (!rs) return Status::ok_status();
  const hf::JsonObject obj(rs->raw, cfg.source() + " rope_scaling");
  if (rs->type == "linear") {
    md.set_str("rope.scaling.type", "linear");
    md.set_f32("rope.scaling.factor", rs->factor.value_or(1.0));
  } else if (rs->type == "yarn") {
    md.set_str("rope.scaling.type", "yarn");
    md.set_f32("rope.scaling.factor", rs->factor.value_or(1.0));
    KILN_ASSIGN_OR_RETURN(const int64_t orig, obj.get_positive_or("original_max_position_embeddings", n_ctx));
    md.set_u32("rope.scaling.original_context_length", orig);
    KILN_ASSIGN_OR_RETURN(const double fast, obj.get_float_or("beta_fast", 32.0));
    KILN_ASSIGN_OR_RETURN(const double slow, obj.get_float_or("beta_slow", 1.0));
    md.set_f32("rope.scaling.yarn_beta_fast", fast);
    md.set_f32("rope.scaling.yarn_beta_slow", slow);
  } else if (rs->type == "llama3") {
    KILN_TRY(llama3_factors(*rs, theta, n_rot, cfg.source(), md));
  } else if (rs->type != "longrope") {  // longrope: the architecture (Phi-3) writes it
    return unimplemented("{}: rope scaling type \"{}\" is not supported (linear, yarn, llama3, longrope)",
                         cfg.source(), rs->type);
  }
  return Status::ok_status();
}

// HF module names after "model.layers.N." -> GGUF names after "blk.N.", without the ".weight"/".bias" suffix.
constexpr Rename kCommonNames[] = {
    {"input_layernorm", "attn_norm"},
    {"post_attention_layernorm", "ffn_norm"},
    {"self_attn.q_proj", "attn_q"},
    {"self_attn.k_proj", "attn_k"},
    {"self_attn.v_proj", "attn_v"},
    {"self_attn.o_proj", "attn_output"},
    {"self_attn.qkv_proj", "attn_qkv"},
    {"self_attn.q_norm", "attn_q_norm"},
    {"self_attn.k_norm", "attn_k_norm"},
    {"mlp.gate_proj", "ffn_gate"},
    {"mlp.up_proj", "ffn_up"},
    {"mlp.down_proj", "ffn_down"},
    {"mlp.gate_up_proj", "ffn_up"},  // Phi-3: gate rows first, then up
    {"mlp.gate", "ffn_gate_inp"},
    {"block_sparse_moe.gate", "ffn_gate_inp"},
    {"mlp.shared_expert.gate_proj", "ffn_gate_shexp"},
    {"mlp.shared_expert.up_proj", "ffn_up_shexp"},
    {"mlp.shared_expert.down_proj", "ffn_down_shexp"},
    {"mlp.shared_expert_gate", "ffn_gate_inp_shexp"},
};

// Expert projections: "<prefix>.experts.E.<proj>" -> the stacked GGUF tensor.
constexpr Rename kExpertNames[] = {
    {"gate_proj", "ffn_gate_exps"}, {"up_proj", "ffn_up_exps"}, {"down_proj", "ffn_down_exps"},
    {"w1", "ffn_gate_exps"},        {"w3", "ffn_up_exps"},      {"w2", "ffn_down_exps"},
};

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// Reads a decimal index at the start of `s` up to '.', advancing past the dot.
std::optional<int64_t> take_index(std::string_view& s) {
  const size_t dot = s.find('.');
  if (dot == std::string_view::npos || dot == 0) return std::nullopt;
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + dot, v);
  if (ec != std::errc() || p != s.data() + dot) return std::nullopt;
  s.remove_prefix(dot + 1);
  return v;
}

// One tensor of the GGUF being assembled.
struct Pending {
  std::string name;
  std::vector<int64_t> shape;  // GGUF order
  const safetensors::Tensor* src = nullptr;
  std::vector<const safetensors::Tensor*> experts;  // stacked tensors, by expert index
};

// The GGUF name of an HF tensor, or "" when the tensor is not part of the text model.
Result<std::string> gguf_name(std::string_view n, const HfSpec& spec, const std::string& cls,
                              std::map<std::string, Pending>& stacks, const safetensors::Tensor* t) {
  const std::string full(n);
  for (std::string_view p : {"model.language_model.", "language_model.model.", "model."}) {
    if (starts_with(n, p)) {
      n.remove_prefix(p.size());
      break;
    }
  }
  if (n == "lm_head.weight" || n == "language_model.lm_head.weight") return std::string("output.weight");
  if (n == "embed_tokens.weight") return std::string("token_embd.weight");
  if (n == "norm.weight") return std::string("output_norm.weight");
  for (std::string_view skip : {"vision_tower.", "vision_model.", "multi_modal_projector.", "rotary_emb."}) {
    if (starts_with(n, skip)) return std::string();
  }
  if (!starts_with(n, "layers.")) return unimplemented("tensor {} has no GGUF name for {}", full, cls);
  n.remove_prefix(7);
  const std::optional<int64_t> layer = take_index(n);
  if (!layer) return invalid_argument("tensor {}: bad layer index", full);
  if (n.ends_with("rotary_emb.inv_freq")) return std::string();
  const std::string blk = "blk." + std::to_string(*layer) + ".";
  std::string_view kind;
  for (std::string_view k : {".weight", ".bias"}) {
    if (n.ends_with(k)) kind = k;
  }
  if (kind.empty()) return unimplemented("tensor {} has no GGUF name for {}", full, cls);
  const std::string_view module = n.substr(0, n.size() - kind.size());
  for (const Rename& r : spec.renames) {
    if (r.hf == n) return blk + std::string(r.gguf);
  }
  for (const Rename& r : kCommonNames) {
    if (r.hf == module) return blk + std::string(r.gguf) + std::string(kind);
  }
  // Experts: "{mlp|block_sparse_moe}.experts.E.{proj}.weight", stacked into one 3-d tensor.
  for (std::string_view p : {"mlp.experts.", "block_sparse_moe.experts."}) {
    if (!starts_with(module, p) || kind != ".weight") continue;
    std::string_view rest = module.substr(p.size());
    const std::optional<int64_t> e = take_index(rest);
    if (!e || *e > 4096) break;
    for (const Rename& r : kExpertNames) {
      if (r.hf != rest) continue;
      Pending& st = stacks[blk + std::string(r.gguf) + ".weight"];
      if (st.experts.size() <= static_cast<size_t>(*e)) st.experts.resize(*e + 1);
      st.experts[*e] = t;
      return std::string("\x01");  // consumed into a stack
    }
  }
  return unimplemented("tensor {} has no GGUF name for {}", full, cls);
}

int64_t product(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// The tensor's values as f32. Precondition: an F32, F16 or BF16 tensor (materialize() checks).
std::vector<float> to_f32(const safetensors::Tensor& t) {
  const DType dt = *t.kiln_dtype();
  std::vector<float> out(static_cast<size_t>(t.n_elements));
  if (dt == DType::f32) {
    std::memcpy(out.data(), t.data.data(), out.size() * sizeof(float));
  } else {
    dtype_info(dt).dequantize_row(t.data.data(), out.data(), t.n_elements);
  }
  return out;
}

// GGUF's RoPE pair order for a Q or K weight (or bias) of n_heads heads: within each head, HF's dims i and
// i + hd/2 become neighbours 2i and 2i + 1. `row_bytes`: bytes per output row (one element for a bias).
std::vector<uint8_t> permute_rows(std::span<const uint8_t> src, int64_t n_heads, int64_t n_rows,
                                  size_t row_bytes) {
  std::vector<uint8_t> out(src.size());
  const int64_t hd = n_rows / n_heads, half = hd / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    for (int64_t i = 0; i < half; ++i) {
      for (int64_t b = 0; b < 2; ++b) {
        const int64_t from = h * hd + b * half + i, to = h * hd + 2 * i + b;
        std::memcpy(out.data() + to * row_bytes, src.data() + from * row_bytes, row_bytes);
      }
    }
  }
  return out;
}

// Where an assembled tensor goes in the file: globals first, then the layers in order, then the output.
std::tuple<int, int64_t, std::string> order_key(const std::string& name) {
  if (starts_with(name, "blk.")) {
    std::string_view rest = std::string_view(name).substr(4);
    const std::optional<int64_t> l = take_index(rest);
    return {1, l.value_or(0), std::string(rest)};
  }
  if (starts_with(name, "output")) return {2, 0, name};
  return {0, 0, name};
}

// Stacks the experts of one GGUF tensor into [in, out, n_expert] bytes.
Result<Pending> check_stack(const std::string& name, Pending st, int64_t n_expert, const std::string& src) {
  if (static_cast<int64_t>(st.experts.size()) != n_expert) {
    return invalid_argument("{}: {} has {} experts, config.json says {}", src, name, st.experts.size(),
                            n_expert);
  }
  for (size_t e = 0; e < st.experts.size(); ++e) {
    const safetensors::Tensor* t = st.experts[e];
    if (t == nullptr) return invalid_argument("{}: expert {} of {} is missing", src, e, name);
    if (t->shape.size() != 2 || t->shape != st.experts[0]->shape || t->dtype != st.experts[0]->dtype) {
      return invalid_argument("{}: expert {} of {} ({}, [{}]) differs from expert 0", src, e, name,
                              dtype_name(t->dtype), fmt::join(t->shape, ", "));
    }
  }
  st.name = name;
  st.shape = {st.experts[0]->shape[1], st.experts[0]->shape[0], n_expert};
  return st;
}

}  // namespace

// What materialize() needs to know about the import.
struct Context {
  const std::string& dir;
  const HfSpec& spec;
  const Options& options;
  int64_t n_heads, n_kv;  // query and KV heads (Q/K permutation)
  const Fp8Weights& fp8;  // the FP8 weights' scales
};

// The GGUF tensor for `pt`: in place in the safetensors map when nothing changes, else converted into a
// buffer `storage` keeps (f32 widening and edits, stacked experts, permuted Q/K rows, FP8 weights as f8_e4m3
// blocks with their scales).
Result<gguf::TensorInfo> materialize(const Pending& pt, const Context& ctx, Storage& storage) {
  gguf::TensorInfo info;
  info.name = pt.name;
  info.shape = pt.shape;
  const safetensors::Tensor* first = pt.src != nullptr ? pt.src : pt.experts[0];
  const std::optional<DType> dt = first->kiln_dtype();
  const bool fp8 = first->dtype == safetensors::Dtype::dtype_f8_e4m3;  // Fp8Weights::collect checked it
  if (!fp8 && (!dt || (*dt != DType::f32 && *dt != DType::f16 && *dt != DType::bf16))) {
    return unimplemented("{}: tensor {} has type {} (F32, F16, BF16 and FP8 F8_E4M3 are supported)", ctx.dir,
                         first->name, dtype_name(first->dtype));
  }
  const TensorEdit* edit = nullptr;
  for (const TensorEdit& e : ctx.spec.edits) {
    if (pt.name.ends_with(e.suffix)) edit = &e;
  }
  const bool to_float = ctx.options.force_f32 || pt.shape.size() == 1 || edit != nullptr;
  info.type = to_float ? DType::f32 : fp8 ? DType::f8_e4m3 : *dt;
  // The bytes in the output type, in place when nothing changes.
  std::vector<uint8_t> bytes;
  std::span<const uint8_t> view;
  const std::vector<const safetensors::Tensor*> parts =
      pt.src != nullptr ? std::vector<const safetensors::Tensor*>{pt.src} : pt.experts;
  for (const safetensors::Tensor* part : parts) {
    if (to_float) {
      std::vector<float> v;
      if (fp8) {
        KILN_ASSIGN_OR_RETURN(v, ctx.fp8.dequantize(*part));
      } else {
        v = to_f32(*part);
      }
      if (edit != nullptr) edit->apply(v);
      const auto* b = reinterpret_cast<const uint8_t*>(v.data());
      bytes.insert(bytes.end(), b, b + v.size() * sizeof(float));
    } else if (fp8) {  // each expert with its own scale
      KILN_TRY(ctx.fp8.append_blocks(*part, bytes));
    } else if (parts.size() > 1) {
      bytes.insert(bytes.end(), part->data.begin(), part->data.end());
    } else {
      view = part->data;
    }
  }
  if (!bytes.empty()) view = bytes;
  // Bytes of a row of ne0 values in the output type (a whole number of blocks: materialized FP8 rows are).
  KILN_ASSIGN_OR_RETURN(const int64_t row_bytes, dtype_row_bytes(info.type, pt.shape[0]));
  const bool is_q = pt.name.ends_with("attn_q.weight") || pt.name.ends_with("attn_q.bias");
  const bool is_k = pt.name.ends_with("attn_k.weight") || pt.name.ends_with("attn_k.bias");
  if (ctx.spec.permute_qk && (is_q || is_k)) {
    const int64_t rows = pt.shape.size() == 2 ? pt.shape[1] : pt.shape[0];
    const int64_t heads = is_q ? ctx.n_heads : ctx.n_kv;
    if (rows % (2 * heads) != 0)
      return invalid_argument("{}: {} has {} rows, not a multiple of 2 x {} heads", ctx.dir, pt.name, rows,
                              heads);
    // A bias permutes element by element; a weight's rows move whole, with their FP8 scales.
    const size_t row = pt.shape.size() == 2 ? static_cast<size_t>(row_bytes)
                                            : static_cast<size_t>(dtype_info(info.type).type_size);
    bytes = permute_rows(view, heads, rows, row);
    view = bytes;
  }
  if (!bytes.empty()) {
    storage.buffers.push_back(std::move(bytes));
    view = storage.buffers.back();
  }
  info.data = view.data();
  info.n_bytes = view.size();
  const int64_t n_rows = product(std::vector<int64_t>(info.shape.begin() + 1, info.shape.end()));
  if (static_cast<int64_t>(info.n_bytes) != n_rows * row_bytes)
    return invalid_argument("{}: tensor {} has {} bytes for shape [{}]", ctx.dir, pt.name, info.n_bytes,
                            fmt::join(info.shape, ", "));
  return info;
}

Result<std::shared_ptr<const gguf::File>> import(const std::string& dir, const SpecLookup& spec_for,
                                                 const Options& options) {
  const std::string config_path = (std::filesystem::path(dir) / "config.json").string();
  KILN_TRY(check_in_folder(dir, config_path));
  KILN_ASSIGN_OR_RETURN(hf::ModelConfig top, hf::ModelConfig::load(config_path));
  KILN_ASSIGN_OR_RETURN(const hf::ModelConfig cfg, text_config(top));
  KILN_ASSIGN_OR_RETURN(const std::string cls, top.architecture());
  KILN_ASSIGN_OR_RETURN(const auto found, spec_for(cls));
  const HfSpec& spec = *found.second;
  auto storage = std::make_shared<Storage>();
  KILN_ASSIGN_OR_RETURN(storage->weights, safetensors::Model::open_dir(dir));

  std::filesystem::path p(dir);
  if (p.filename().empty()) p = p.parent_path();
  Metadata md(found.first);
  KILN_TRY(common_metadata(cfg, p.filename().string(), md));
  if (spec.metadata != nullptr) KILN_TRY(spec.metadata(cfg, md));
  KILN_ASSIGN_OR_RETURN(const bool tied, cfg.tie_word_embeddings());
  KILN_ASSIGN_OR_RETURN(const int64_t n_heads, cfg.num_attention_heads());
  KILN_ASSIGN_OR_RETURN(const int64_t n_kv, cfg.num_key_value_heads());
  // FP8 checkpoints: the scales are sorted out first (their names map to no GGUF tensor), by their weights.
  KILN_ASSIGN_OR_RETURN(Fp8Config fp8_config, read_fp8_config(top, dir));
  KILN_ASSIGN_OR_RETURN(const Fp8Weights fp8,
                        Fp8Weights::collect(std::move(fp8_config), storage->weights, dir));

  std::map<std::string, Pending> stacks;
  std::vector<Pending> pending;
  for (const safetensors::Tensor* t : storage->weights.tensors()) {
    if (fp8.is_side_tensor(t->name)) continue;
    KILN_ASSIGN_OR_RETURN(std::string g, gguf_name(t->name, spec, cls, stacks, t));
    if (g.empty() || g == "\x01" || (g == "output.weight" && tied)) continue;
    if (t->shape.empty() || t->shape.size() > 2)
      return unimplemented("{}: tensor {} has {} dimensions", dir, t->name, t->shape.size());
    Pending pt{g, std::vector<int64_t>(t->shape.rbegin(), t->shape.rend()), t, {}};
    if (g.ends_with("ffn_gate_inp_shexp.weight") && pt.shape.size() == 2 && pt.shape[1] == 1)
      pt.shape.resize(1);
    pending.push_back(std::move(pt));
  }
  if (!stacks.empty()) {
    int64_t n_expert = 0;
    for (std::string_view k : {"num_local_experts", "num_experts", "n_routed_experts"}) {
      if (cfg.has(k) && n_expert == 0) {
        KILN_ASSIGN_OR_RETURN(n_expert, cfg.get_positive(k));
      }
    }
    for (auto& [name, st] : stacks) {
      KILN_ASSIGN_OR_RETURN(Pending s, check_stack(name, std::move(st), n_expert, cfg.source()));
      pending.push_back(std::move(s));
    }
  }

  std::vector<gguf::TensorInfo> infos;
  const Context ctx{dir, spec, options, n_heads, n_kv, fp8};
  for (const Pending& pt : pending) {
    KILN_ASSIGN_OR_RETURN(gguf::TensorInfo info, materialize(pt, ctx, *storage));
    infos.push_back(std::move(info));
  }
  // An f32 tensor [values.size()] of its own bytes.
  const auto f32_tensor = [&](const std::string& name, const std::vector<float>& values) {
    gguf::TensorInfo info;
    info.name = name;
    info.shape = {static_cast<int64_t>(values.size())};
    info.type = DType::f32;
    const auto* b = reinterpret_cast<const uint8_t*>(values.data());
    storage->buffers.emplace_back(b, b + values.size() * sizeof(float));
    info.data = storage->buffers.back().data();
    info.n_bytes = storage->buffers.back().size();
    infos.push_back(std::move(info));
  };
  if (options.activation_scales) {
    // By GGUF stem ("blk.3.attn_q"). Projections that read one x (Q, K and V; gate and up) take the largest
    // of their scales, so that x rounds the same whether they run as one group or apart (vLLM's choice for
    // its fused projections).
    std::map<std::string, float> scales;
    std::map<std::string, Pending> experts;  // an expert's scale has no tensor of its own: left out
    for (const auto& [weight, scale] : fp8.input_scales()) {
      KILN_ASSIGN_OR_RETURN(const std::string g, gguf_name(weight, spec, cls, experts, nullptr));
      if (g.ends_with(".weight")) scales[g.substr(0, g.size() - 7)] = scale;
    }
    const auto shared_input = [](std::string_view stem) -> std::string {
      const size_t dot = stem.rfind('.');
      const std::string_view blk = stem.substr(0, dot + 1), m = stem.substr(dot + 1);
      if (m == "attn_q" || m == "attn_k" || m == "attn_v") return std::string(blk) + "qkv";
      if (m == "ffn_gate" || m == "ffn_up") return std::string(blk) + "gate_up";
      return std::string(stem);
    };
    std::map<std::string, float> largest;
    for (const auto& [stem, scale] : scales) {
      float& l = largest[shared_input(stem)];
      l = std::max(l, scale);
    }
    for (const auto& kv : scales) f32_tensor(kv.first + ".input_scale", {largest[shared_input(kv.first)]});
  }
  for (auto& [name, values] : md.tensors()) f32_tensor(name, values);
  std::sort(infos.begin(), infos.end(), [](const gguf::TensorInfo& a, const gguf::TensorInfo& b) {
    return order_key(a.name) < order_key(b.name);
  });
  KILN_ASSIGN_OR_RETURN(gguf::File f,
                        gguf::File::assemble(dir, std::move(md.entries()), std::move(infos),
                                             std::shared_ptr<const void>(storage, storage.get())));
  return std::make_shared<const gguf::File>(std::move(f));
}

std::string projection_gguf_name(std::string_view n, int64_t* expert) {
  *expert = -1;
  for (std::string_view p : {"model.language_model.", "language_model.model.", "model."}) {
    if (starts_with(n, p)) {
      n.remove_prefix(p.size());
      break;
    }
  }
  if (!starts_with(n, "layers.") || !n.ends_with(".weight")) return "";
  n.remove_prefix(7);
  const std::optional<int64_t> layer = take_index(n);
  if (!layer) return "";
  const std::string blk = "blk." + std::to_string(*layer) + ".";
  const std::string_view module = n.substr(0, n.size() - std::string_view(".weight").size());
  for (const Rename& r : kCommonNames) {
    if (r.hf == module) return blk + std::string(r.gguf) + ".weight";
  }
  for (std::string_view p : {"mlp.experts.", "block_sparse_moe.experts."}) {
    if (!starts_with(module, p)) continue;
    std::string_view rest = module.substr(p.size());
    const std::optional<int64_t> e = take_index(rest);
    if (!e) return "";
    for (const Rename& r : kExpertNames) {
      if (r.hf == rest) {
        *expert = *e;
        return blk + std::string(r.gguf) + ".weight";
      }
    }
  }
  return "";
}

}  // namespace kiln::hf_import
