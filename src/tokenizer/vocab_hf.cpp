// Tokenizer::from_hf_json: the vocabulary from a Hugging Face tokenizer.json (model type BPE), with the
// normalizers, pre-tokenizers, decoders and post-processors that byte-level and SentencePiece-style BPE
// tokenizers use. Anything else is `unimplemented`, naming the component, rather than silently ignored.
#include <limits>

#include "formats/json_file.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace kiln {

using nlohmann::json;
using tokenizer_detail::AddedToken;
using tokenizer_detail::Vocab;

namespace {

constexpr std::string_view kMetaspace = "\xE2\x96\x81";

// What the pipeline components ask of the Vocab, gathered before the vocabulary is built.
struct Pipeline {
  bool byte_level = false;
  std::vector<std::string> patterns;  // pre-tokenizer regexes, applied in order
};

// Lenient accessors that never throw: a missing member or one of another type reads as null / the fallback.
const json& member(const json& obj, const char* key) {
  static const json null_json;
  if (!obj.is_object()) return null_json;
  auto it = obj.find(key);
  return it == obj.end() ? null_json : *it;
}
std::string str_member(const json& obj, const char* key) {
  const json& m = member(obj, key);
  return m.is_string() ? m.get<std::string>() : std::string();
}
bool bool_member(const json& obj, const char* key, bool fallback) {
  const json& m = member(obj, key);
  return m.is_boolean() ? m.get<bool>() : fallback;
}
int64_t int_member(const json& obj, const char* key, int64_t fallback) {
  const json& m = member(obj, key);
  return m.is_number_integer() ? m.get<int64_t>() : fallback;
}

const json& empty_array() {
  static const json empty = json::array();
  return empty;
}

std::string type_of(const json& j) { return str_member(j, "type"); }

// A JSON string field, or `fallback` when absent or null.
Result<std::string> string_field(const json& obj, const char* key, std::string_view where,
                                 std::string fallback) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_string()) {
    return invalid_argument("{}.{} must be a string, not {}", where, key, json_file::preview(*it));
  }
  return it->get<std::string>();
}

Result<bool> bool_field(const json& obj, const char* key, std::string_view where, bool fallback) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean())
    return invalid_argument("{}.{} must be true or false, not {}", where, key, json_file::preview(*it));
  return it->get<bool>();
}

// PCRE2 text matching `s` literally.
std::string quote_regex(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}-/").find(c) != std::string_view::npos) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

// A "Sequence" node of a normalizer, pre_tokenizer or decoder: parse(c) for each c of its `list` member.
template <class Parse>
Status parse_sequence(const json& n, std::string_view what, const char* list, Parse&& parse) {
  if (!n.contains(list) || !n[list].is_array()) {
    return invalid_argument("{} Sequence has no \"{}\" list", what, list);
  }
  for (const json& c : n[list]) KILN_TRY(parse(c));
  return Status::ok_status();
}

Status parse_normalizer(const json& n, Vocab& v) {
  if (n.is_null()) return Status::ok_status();
  const std::string type = type_of(n);
  if (type == "Sequence") {
    return parse_sequence(n, "normalizer", "normalizers",
                          [&](const json& c) { return parse_normalizer(c, v); });
  }
  if (type == "Replace" && str_member(member(n, "pattern"), "String") == " " &&
      str_member(n, "content") == kMetaspace) {
    v.spm_escape_spaces = true;
    return Status::ok_status();
  }
  if (type == "Prepend" && str_member(n, "prepend") == kMetaspace) {
    v.spm_prepend_segments = true;
    return Status::ok_status();
  }
  return unimplemented("tokenizer.json normalizer {} is not supported", json_file::preview(n, 120));
}

Status parse_pre_tokenizer(const json& p, Vocab& v, Pipeline& pipe) {
  if (p.is_null()) return Status::ok_status();
  const std::string type = type_of(p);
  if (type == "Sequence") {
    return parse_sequence(p, "pre_tokenizer", "pretokenizers",
                          [&](const json& c) { return parse_pre_tokenizer(c, v, pipe); });
  }
  if (type == "ByteLevel") {
    KILN_ASSIGN_OR_RETURN(bool prefix, bool_field(p, "add_prefix_space", "pre_tokenizer ByteLevel", false));
    KILN_ASSIGN_OR_RETURN(bool use_regex, bool_field(p, "use_regex", "pre_tokenizer ByteLevel", true));
    if (prefix)
      return unimplemented("tokenizer.json pre_tokenizer ByteLevel with add_prefix_space is not supported");
    pipe.byte_level = true;
    if (use_regex) pipe.patterns.push_back(kGpt2Pattern);
    return Status::ok_status();
  }
  if (type == "Digits") {
    KILN_ASSIGN_OR_RETURN(bool individual, bool_field(p, "individual_digits", "pre_tokenizer Digits", false));
    pipe.patterns.push_back(individual ? kDigitPattern : R"(\p{N}+)");
    return Status::ok_status();
  }
  if (type == "Split") {
    const json pattern = member(p, "pattern");
    const std::string behavior = str_member(p, "behavior");
    KILN_ASSIGN_OR_RETURN(bool invert, bool_field(p, "invert", "pre_tokenizer Split", false));
    const bool is_regex = pattern.contains("Regex") && pattern["Regex"].is_string();
    const bool is_string = pattern.contains("String") && pattern["String"].is_string();
    if (!invert && behavior == "Isolated" && (is_regex || is_string)) {
      pipe.patterns.push_back(is_regex ? pattern["Regex"].get<std::string>()
                                       : quote_regex(pattern["String"].get<std::string>()));
      return Status::ok_status();
    }
    // Gemma: split on " " after the normalizer turned every space into U+2581 splits nothing.
    if (!invert && behavior == "MergedWithPrevious" && is_string && pattern["String"] == " " &&
        v.spm_escape_spaces) {
      return Status::ok_status();
    }
  }
  if (type == "Metaspace") {
    KILN_ASSIGN_OR_RETURN(std::string rep,
                          string_field(p, "replacement", "pre_tokenizer Metaspace", "\xE2\x96\x81"));
    KILN_ASSIGN_OR_RETURN(std::string scheme,
                          string_field(p, "prepend_scheme", "pre_tokenizer Metaspace", "always"));
    KILN_ASSIGN_OR_RETURN(bool split, bool_field(p, "split", "pre_tokenizer Metaspace", true));
    if (rep == kMetaspace && (scheme == "first" || scheme == "never")) {
      v.spm_escape_spaces = true;
      v.add_space_prefix = scheme == "first";
      v.spm_split_metaspace = split;
      return Status::ok_status();
    }
  }
  return unimplemented("tokenizer.json pre_tokenizer {} is not supported", json_file::preview(p, 120));
}

Status parse_decoder(const json& d, Vocab& v) {
  if (d.is_null()) return Status::ok_status();
  const std::string type = type_of(d);
  if (type == "Sequence") {
    return parse_sequence(d, "decoder", "decoders", [&](const json& c) { return parse_decoder(c, v); });
  }
  if (type == "ByteLevel" || type == "ByteFallback" || type == "Fuse") return Status::ok_status();
  if (type == "Replace" && str_member(member(d, "pattern"), "String") == kMetaspace &&
      str_member(d, "content") == " ") {
    return Status::ok_status();
  }
  if (type == "Strip" && str_member(d, "content") == " " && int_member(d, "start", 0) <= 1 &&
      int_member(d, "stop", 0) == 0) {
    v.strip_space_prefix = int_member(d, "start", 0) == 1;
    return Status::ok_status();
  }
  if (type == "Metaspace") {
    v.strip_space_prefix = str_member(d, "prepend_scheme") != "never";
    return Status::ok_status();
  }
  return unimplemented("tokenizer.json decoder {} is not supported", json_file::preview(d, 120));
}

// Fills keys from model.vocab and added_tokens; every id in [0, n) must be named by one of them.
Status read_vocab(const json& model, const json& added, Vocab& v) {
  const json& vocab = member(model, "vocab");
  if (!vocab.is_object()) return invalid_argument("tokenizer.json: model.vocab must be an object");
  int64_t n = 0;
  for (const auto& [key, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() >= std::numeric_limits<int32_t>::max()) {
      return invalid_argument("tokenizer.json: model.vocab[\"{}\"] = {} is not a token id", key,
                              json_file::preview(id));
    }
    n = std::max(n, id.get<int64_t>() + 1);
  }
  for (const json& t : added) {
    if (!t.is_object() || !member(t, "id").is_number_integer() || !member(t, "content").is_string() ||
        t["id"].get<int64_t>() < 0 || t["id"].get<int64_t>() >= std::numeric_limits<int32_t>::max()) {
      return invalid_argument("tokenizer.json: added token {} needs an integer id and a string content",
                              json_file::preview(t));
    }
    n = std::max(n, t["id"].get<int64_t>() + 1);
  }
  if (n > static_cast<int64_t>(vocab.size() + added.size())) {
    return invalid_argument("tokenizer.json: token ids reach {} but only {} tokens are named", n - 1,
                            vocab.size() + added.size());
  }
  v.keys.assign(n, std::string());
  std::vector<uint8_t> named(n, 0);
  for (const auto& [key, id] : vocab.items()) {
    const auto i = id.get<int64_t>();
    if (named[i]) return invalid_argument("tokenizer.json: model.vocab names id {} twice (\"{}\")", i, key);
    v.keys[i] = key;
    named[i] = 1;
  }
  v.types.assign(n, TokenType::normal);
  for (const json& t : added) {
    const auto i = t["id"].get<int64_t>();
    if (!named[i]) v.keys[i] = t["content"].get<std::string>();
    named[i] = 1;
    v.types[i] = bool_member(t, "special", false) ? TokenType::control : TokenType::user_defined;
  }
  for (int64_t i = 0; i < n; ++i) {
    if (!named[i])
      return invalid_argument("tokenizer.json: token id {} is in neither model.vocab nor added_tokens", i);
  }
  return Status::ok_status();
}

Status read_hf_merges(const json& model, Vocab& v) {
  const json& merges = member(model, "merges").is_null() ? empty_array() : member(model, "merges");
  if (!merges.is_array()) return invalid_argument("tokenizer.json: model.merges must be a list");
  v.merges.reserve(merges.size());
  std::string left, right;
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos) {
        return invalid_argument(
            "tokenizer.json: model.merges[{}] = \"{}\" is not two tokens separated by a space", i, s);
      }
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      return invalid_argument("tokenizer.json: model.merges[{}] = {} is not a pair of tokens", i,
                              json_file::preview(m));
    }
    const std::string joined = left + right;
    int32_t ids[3];
    const std::string* parts[3] = {&left, &right, &joined};
    for (int k = 0; k < 3; ++k) {
      ids[k] = v.key_index.find(*parts[k]);
      if (ids[k] < 0) {
        return invalid_argument("tokenizer.json: model.merges[{}] = {}: \"{}\" is not in the vocabulary", i,
                                json_file::preview(m), *parts[k]);
      }
    }
    v.merges.insert_or_assign(tokenizer_detail::MergeTable::pair_key(ids[0], ids[1]),
                              tokenizer_detail::Merge{static_cast<uint32_t>(i), ids[2]});
  }
  return Status::ok_status();
}

Status read_added(const json& added, bool has_normalizer, Vocab& v) {
  for (const json& t : added) {
    const std::string content = t["content"].get<std::string>();
    for (const char* flag : {"lstrip", "rstrip", "single_word"}) {
      if (bool_member(t, flag, false)) {
        return unimplemented("tokenizer.json: added token \"{}\" has {} = true, which kiln does not support",
                             content, flag);
      }
    }
    if (has_normalizer && bool_member(t, "normalized", false) && content.find(' ') != std::string::npos) {
      return unimplemented("tokenizer.json: added token \"{}\" is normalized and has a space", content);
    }
    v.added.push_back(
        {content, static_cast<int32_t>(t["id"].get<int64_t>()), bool_member(t, "special", false)});
  }
  return Status::ok_status();
}

// The id of a special token named in tokenizer_config.json (a string or {"content": ...}), or -1.
Result<int32_t> config_token(const json& config, const char* key, const Vocab& v) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return -1;
  std::string text;
  if (it->is_string()) {
    text = it->get<std::string>();
  } else if (it->is_object() && it->value("content", json()).is_string()) {
    text = (*it)["content"].get<std::string>();
  } else {
    return invalid_argument("tokenizer_config.json: {} = {} is not a token", key, json_file::preview(*it));
  }
  for (const AddedToken& t : v.added) {
    if (t.content == text) return t.id;
  }
  const int32_t id = v.key_index.find(text);
  if (id < 0)
    return invalid_argument("tokenizer_config.json: {} = \"{}\" is not in the vocabulary", key, text);
  return id;
}

// BOS/EOS from a TemplateProcessing post-processor: special tokens before and after "$A".
Status parse_post_processor(const json& p, Vocab& v) {
  if (p.is_null()) return Status::ok_status();
  const std::string type = type_of(p);
  if (type == "Sequence") {
    for (const json& c : member(p, "processors")) KILN_TRY(parse_post_processor(c, v));
    return Status::ok_status();
  }
  if (type == "ByteLevel") return Status::ok_status();
  if (type != "TemplateProcessing") {
    return unimplemented("tokenizer.json post_processor {} is not supported", json_file::preview(p, 120));
  }
  bool seen_a = false;
  for (const json& item : member(p, "single")) {
    if (item.contains("Sequence")) {
      seen_a = true;
      continue;
    }
    const std::string name = str_member(member(item, "SpecialToken"), "id");
    const json& ids = member(member(member(p, "special_tokens"), name.c_str()), "ids");
    if (!ids.is_array() || ids.size() != 1 || !ids[0].is_number_integer() || ids[0].get<int64_t>() < 0 ||
        ids[0].get<int64_t>() >= v.n_vocab()) {
      return invalid_argument("tokenizer.json: post_processor special token \"{}\" has no valid id", name);
    }
    const auto id = static_cast<int32_t>(ids[0].get<int64_t>());
    (seen_a ? v.eos : v.bos) = id;
    (seen_a ? v.add_eos : v.add_bos) = true;
  }
  return Status::ok_status();
}

Status build_from_json(const json& j, const std::optional<json>& config, Vocab& v) {
  if (!j.is_object() || !member(j, "model").is_object())
    return invalid_argument("tokenizer.json has no \"model\" object");
  const json& model = j["model"];
  if (!type_of(model).empty() && type_of(model) != "BPE") {
    return unimplemented("tokenizer.json model type \"{}\": kiln supports BPE", str_member(model, "type"));
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    KILN_ASSIGN_OR_RETURN(std::string s, string_field(model, key, "model", ""));
    if (!s.empty()) return unimplemented("tokenizer.json: model.{} = \"{}\" is not supported", key, s);
  }
  const json& added = member(j, "added_tokens").is_null() ? empty_array() : member(j, "added_tokens");
  if (!added.is_array()) return invalid_argument("tokenizer.json: added_tokens must be a list");
  KILN_TRY(read_vocab(model, added, v));
  Pipeline pipe;
  KILN_TRY(parse_normalizer(member(j, "normalizer"), v));
  KILN_TRY(parse_pre_tokenizer(member(j, "pre_tokenizer"), v, pipe));
  KILN_TRY(parse_decoder(member(j, "decoder"), v));
  v.model = pipe.byte_level ? TokenizerModel::byte_level_bpe : TokenizerModel::spm_bpe;
  if (pipe.byte_level && (v.spm_escape_spaces || v.spm_prepend_segments)) {
    return unimplemented(
        "tokenizer.json: a byte-level pre-tokenizer after a U+2581 normalizer is not supported");
  }
  KILN_ASSIGN_OR_RETURN(auto pre, PreTokenizer::from_patterns(pipe.patterns));
  v.pre = std::move(pre);
  tokenizer_detail::build_key_index(v);
  KILN_TRY(read_hf_merges(model, v));
  KILN_ASSIGN_OR_RETURN(v.byte_fallback, bool_field(model, "byte_fallback", "model", false));
  KILN_ASSIGN_OR_RETURN(v.fuse_unk, bool_field(model, "fuse_unk", "model", false));
  KILN_ASSIGN_OR_RETURN(v.ignore_merges, bool_field(model, "ignore_merges", "model", false));
  KILN_ASSIGN_OR_RETURN(std::string unk, string_field(model, "unk_token", "model", ""));
  if (!unk.empty()) {
    const int32_t id = v.key_index.find(unk);
    if (id < 0)
      return invalid_argument("tokenizer.json: model.unk_token \"{}\" is not in the vocabulary", unk);
    v.model_unk = v.unk = id;
  }
  for (int32_t i = 0; i < v.n_vocab(); ++i) {
    if (v.types[i] == TokenType::normal && v.model == TokenizerModel::spm_bpe && v.keys[i].size() == 6 &&
        v.keys[i].starts_with("<0x")) {
      v.types[i] = TokenType::byte;
    }
  }
  KILN_TRY(read_added(added, !member(j, "normalizer").is_null(), v));
  KILN_TRY(parse_post_processor(member(j, "post_processor"), v));
  if (config) {
    if (!config->is_object()) return invalid_argument("tokenizer_config.json must be an object");
    KILN_ASSIGN_OR_RETURN(int32_t bos, config_token(*config, "bos_token", v));
    KILN_ASSIGN_OR_RETURN(int32_t eos, config_token(*config, "eos_token", v));
    KILN_ASSIGN_OR_RETURN(int32_t cunk, config_token(*config, "unk_token", v));
    KILN_ASSIGN_OR_RETURN(v.pad, config_token(*config, "pad_token", v));
    if (bos >= 0) v.bos = bos;
    if (eos >= 0) v.eos = eos;
    if (cunk >= 0) v.unk = cunk;
    KILN_ASSIGN_OR_RETURN(v.add_bos,
                          bool_field(*config, "add_bos_token", "tokenizer_config.json", v.add_bos));
    KILN_ASSIGN_OR_RETURN(v.add_eos,
                          bool_field(*config, "add_eos_token", "tokenizer_config.json", v.add_eos));
  }
  return Status::ok_status();
}

}  // namespace

Result<Tokenizer> Tokenizer::from_hf_json(const std::string& path_or_text,
                                          const std::optional<json>& config) {
  const size_t first = path_or_text.find_first_not_of(" \t\r\n");
  const bool is_text = first != std::string::npos && path_or_text[first] == '{';
  const std::string source = is_text ? "tokenizer.json" : path_or_text;
  json j;
  if (is_text) {
    if (path_or_text.size() > json_file::kMaxTokenizerBytes) {
      return invalid_argument("tokenizer.json text is {} bytes, over the {}-byte limit", path_or_text.size(),
                              json_file::kMaxTokenizerBytes);
    }
    KILN_ASSIGN_OR_RETURN(j, json_file::parse(path_or_text, source));
  } else {
    KILN_ASSIGN_OR_RETURN(j, json_file::read(path_or_text, json_file::kMaxTokenizerBytes));
  }
  auto v = std::make_shared<Vocab>();
  if (Status st = build_from_json(j, config, *v); !st.ok()) {
    return Status(st.code(), fmt::format("{}: {}", source, st.message()));
  }
  KILN_TRY(tokenizer_detail::finalize_vocab(*v, source));
  return Tokenizer(std::move(v));
}

}  // namespace kiln
