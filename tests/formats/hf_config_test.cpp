// json_file (size caps, line:column errors, duplicate keys, depth) and the Hugging Face config
// files: typed values from valid configs, and errors naming the key and value for bad ones.
#include "formats/hf_config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "formats/json_file.h"

namespace kiln::hf {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

void expect_has(const Status& s, std::initializer_list<const char*> needles) {
  ASSERT_FALSE(s.ok());
  for (const char* n : needles) {
    EXPECT_NE(s.message().find(n), std::string::npos) << "message lacks \"" << n << "\": " << s.message();
  }
}

// A llama config as transformers 5 writes it (rope_parameters instead of rope_theta).
json llama_config() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-06, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
    "tie_word_embeddings": true, "dtype": "bfloat16", "pad_token_id": null})");
}

ModelConfig config_with(const char* key, const json& value) {
  json j = llama_config();
  j[key] = value;
  return ModelConfig::from_json(j, "config.json").value();
}

// ---- json_file

TEST(JsonFile, SyntaxErrorNamesLineAndColumn) {
  auto r = json_file::parse("{\n  \"a\": 1,\n  \"b\": tru\n}", "cfg.json");
  expect_has(r.status(), {"cfg.json:3:", "invalid JSON"});
  auto empty = json_file::parse("", "e.json");
  expect_has(empty.status(), {"e.json:1:1", "invalid JSON"});
  expect_has(json_file::parse("{\"a\": 1} x", "t.json").status(), {"t.json:1:"});
  expect_has(json_file::parse("{\"a\": NaN}", "n.json").status(), {"n.json:1:"});
}

TEST(JsonFile, LongArraysOfObjectsParseInLinearTime) {
  // A tokenizer.json with 300,000 added tokens: nlohmann's callback DOM parser rescanned the parent array
  // after each object (~90 s here); the structure check now runs as its own SAX pass (well under a second).
  std::string text = "{\"added_tokens\": [";
  constexpr int kN = 300000;
  for (int i = 0; i < kN; ++i)
    text += fmt::format("{}{{\"id\": {}, \"content\": \"<t{}>\"}}", i ? "," : "", i, i);
  text += "]}";
  auto r = json_file::parse(text, "tokenizer.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ((*r)["added_tokens"].size(), size_t{kN});
  EXPECT_EQ((*r)["added_tokens"][kN - 1]["content"], "<t299999>");
  // The structure checks still hold inside such an array.
  text.insert(text.size() - 2, ", {\"id\": 1, \"id\": 2}");
  expect_has(json_file::parse(text, "tokenizer.json").status(), {"duplicate key \"id\"", "/added_tokens"});
}

TEST(JsonFile, LineColumn) {
  const auto lc = json_file::line_column("ab\ncd\nef", 7);
  EXPECT_EQ(lc.line, 3);
  EXPECT_EQ(lc.column, 2);
  EXPECT_EQ(json_file::line_column("ab", 99).column, 3);
}

TEST(JsonFile, DuplicateKeysRefusedWithPath) {
  expect_has(json_file::parse(R"({"a": {"b": [{"c": 1, "c": 2}]}})", "d.json").status(),
             {"d.json", "duplicate key \"c\"", "/a/b/*"});
  // The same key in different objects is fine.
  EXPECT_TRUE(
      json_file::parse(R"({"a": {"k": 1}, "b": {"k": 2}, "k": [{"k": 1}, {"k": 2}]})", "ok.json").ok());
}

TEST(JsonFile, DeepNestingRefused) {
  const std::string deep = std::string(5000, '[') + std::string(5000, ']');
  expect_has(json_file::parse(deep, "deep.json").status(), {"deep.json", "nesting deeper than"});
  const std::string ok = std::string(100, '[') + std::string(100, ']');
  EXPECT_TRUE(json_file::parse(ok, "ok.json").ok());
}

class HfDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kiln_hf_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
    return (dir_ / name).string();
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST_F(HfDir, ReadSizeCapCheckedBeforeReading) {
  const std::string p = write("big.json", "{}");
  fs::resize_file(p, json_file::kMaxConfigBytes + 1);  // sparse: costs no disk
  expect_has(ModelConfig::load(p).status(), {"big.json", "over the limit"});
  expect_has(json_file::read(write("small.json", "[1, 2, 3]"), 4).status(),
             {"small.json", "9 bytes", "limit of 4"});
  EXPECT_EQ(json_file::read(path("missing.json"), 100).status().code(), StatusCode::not_found);
  expect_has(json_file::read(dir_.string(), 100).status(), {"not a regular file"});
}

// ---- config.json

TEST(ModelConfigTest, ValidLlamaConfig) {
  auto r = ModelConfig::from_json(llama_config(), "config.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.architecture().value(), "LlamaForCausalLM");
  EXPECT_EQ(c.model_type().value(), "llama");
  EXPECT_EQ(c.hidden_size().value(), 64);
  EXPECT_EQ(c.num_hidden_layers().value(), 2);
  EXPECT_EQ(c.num_attention_heads().value(), 4);
  EXPECT_EQ(c.num_key_value_heads().value(), 2);
  EXPECT_EQ(c.intermediate_size().value(), 128);
  EXPECT_EQ(c.vocab_size().value(), 100);
  EXPECT_EQ(c.max_position_embeddings().value(), 2048);
  EXPECT_EQ(c.head_dim().value(), 16);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps().value(), 1e-6);
  EXPECT_DOUBLE_EQ(c.rope_theta().value(), 500000.0);
  EXPECT_FALSE(c.rope_scaling().value().has_value());  // rope_type "default"
  EXPECT_TRUE(c.tie_word_embeddings().value());
  EXPECT_EQ(c.torch_dtype().value(), "bfloat16");
  EXPECT_FALSE(c.has("pad_token_id"));  // null is absent
  EXPECT_FALSE(c.text_config().value().has_value());
}

TEST(ModelConfigTest, DefaultsAndOlderKeys) {
  json j = llama_config();
  j.erase("num_key_value_heads");
  j.erase("rope_parameters");
  j.erase("tie_word_embeddings");
  j.erase("dtype");
  j["torch_dtype"] = "float16";
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
  const ModelConfig c = ModelConfig::from_json(j, "config.json").value();
  EXPECT_EQ(c.num_key_value_heads().value(), 4);
  EXPECT_DOUBLE_EQ(c.rope_theta().value(), 10000.0);
  EXPECT_FALSE(c.tie_word_embeddings().value());
  EXPECT_EQ(c.torch_dtype().value(), "float16");
  const auto rs = c.rope_scaling().value();
  ASSERT_TRUE(rs.has_value());
  EXPECT_EQ(rs->type, "linear");
  EXPECT_DOUBLE_EQ(rs->factor.value(), 4.0);
  j["rope_theta"] = 1e6;
  EXPECT_DOUBLE_EQ(ModelConfig::from_json(j, "c").value().rope_theta().value(), 1e6);
  j["text_config"] = {{"hidden_size", 32}};
  EXPECT_EQ(ModelConfig::from_json(j, "c").value().text_config().value()->hidden_size().value(), 32);
}

TEST(ModelConfigTest, WrongTypesNameKeyAndValue) {
  expect_has(config_with("hidden_size", "64").hidden_size().status(),
             {"config.json", "\"hidden_size\"", "\"64\"", "string", "integer"});
  expect_has(config_with("hidden_size", 64.5).hidden_size().status(), {"\"hidden_size\"", "64.5"});
  expect_has(config_with("num_hidden_layers", true).num_hidden_layers().status(),
             {"\"num_hidden_layers\"", "true"});
  expect_has(config_with("rms_norm_eps", "1e-6").rms_norm_eps().status(), {"\"rms_norm_eps\"", "number"});
  expect_has(config_with("model_type", 3).model_type().status(), {"\"model_type\"", "3"});
  expect_has(config_with("architectures", "Llama").architecture().status(), {"\"architectures\"", "Llama"});
  expect_has(config_with("architectures", json::array()).architecture().status(), {"\"architectures\""});
  expect_has(config_with("tie_word_embeddings", "yes").tie_word_embeddings().status(),
             {"\"tie_word_embeddings\""});
  expect_has(config_with("rope_scaling", 2).rope_scaling().status(), {"\"rope_scaling\"", "object"});
  expect_has(config_with("rope_scaling", json{{"factor", 2.0}}).rope_scaling().status(), {"rope_type"});
  expect_has(config_with("rope_scaling", json{{"type", "linear"}, {"factor", "2"}}).rope_scaling().status(),
             {"\"factor\"", "\"2\""});
  expect_has(config_with("text_config", json::array()).text_config().status(), {"text_config", "object"});
}

TEST(ModelConfigTest, OutOfRangeSizes) {
  expect_has(config_with("hidden_size", -64).hidden_size().status(), {"\"hidden_size\"", "-64", "positive"});
  expect_has(config_with("vocab_size", 0).vocab_size().status(), {"\"vocab_size\"", "0"});
  expect_has(config_with("intermediate_size", int64_t{1} << 40).intermediate_size().status(),
             {"1099511627776"});
  expect_has(config_with("num_hidden_layers", uint64_t{1} << 63).num_hidden_layers().status(), {"int64"});
  expect_has(config_with("num_key_value_heads", 3).num_key_value_heads().status(),
             {"\"num_key_value_heads\" = 3", "4"});
  expect_has(config_with("rms_norm_eps", 0).rms_norm_eps().status(), {"\"rms_norm_eps\"", "positive"});
  expect_has(config_with("rope_theta", -1.0).rope_theta().status(), {"\"rope_theta\"", "-1"});
  json j = llama_config();
  j["num_attention_heads"] = 5;
  j.erase("num_key_value_heads");
  expect_has(ModelConfig::from_json(j, "c").value().head_dim().status(), {"\"hidden_size\" = 64", "5"});
  expect_has(config_with("head_dim", -1).head_dim().status(), {"\"head_dim\"", "-1"});
}

TEST(ModelConfigTest, MissingKeysAreNotFound) {
  json j = llama_config();
  j.erase("hidden_size");
  j["head_dim"] = 16;
  const ModelConfig c = ModelConfig::from_json(j, "config.json").value();
  EXPECT_EQ(c.hidden_size().status().code(), StatusCode::not_found);
  expect_has(c.hidden_size().status(), {"missing \"hidden_size\""});
  EXPECT_EQ(c.head_dim().value(), 16);  // given, so hidden_size is not needed
  j.erase("head_dim");
  EXPECT_EQ(ModelConfig::from_json(j, "config.json").value().head_dim().status().code(),
            StatusCode::not_found);
}

TEST(ModelConfigTest, NotAnObject) {
  expect_has(ModelConfig::from_json(json::array({1}), "config.json").status(),
             {"config.json", "object", "array"});
}

TEST_F(HfDir, MalformedConfigFiles) {
  expect_has(ModelConfig::load(write("a.json", "{\"hidden_size\": 64,,}")).status(),
             {"a.json:1:", "invalid JSON"});
  expect_has(ModelConfig::load(write("b.json", "\"just a string\"")).status(),
             {"b.json", "must be a JSON object"});
  expect_has(ModelConfig::load(write("c.json", "{\"a\": 1, \"a\": 2}")).status(),
             {"c.json", "duplicate key \"a\""});
  expect_has(ModelConfig::load(write("d.json", "")).status(), {"d.json:1:1"});
}

// ---- tokenizer_config.json

TEST(TokenizerConfigTest, StringTemplateAndAddedTokens) {
  const json j = json::parse(R"({
    "chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}",
    "bos_token": {"content": "<s>", "lstrip": false, "__type": "AddedToken"}, "eos_token": "</s>",
    "pad_token": null, "add_bos_token": true, "add_eos_token": false,
    "model_max_length": 1000000000000000019884624838656})");
  auto r = TokenizerConfig::from_json(j, "tokenizer_config.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_NE(r->chat_template(), nullptr);
  EXPECT_EQ(r->chat_template()->source.substr(0, 15), "{{ bos_token }}");
  EXPECT_EQ(r->bos_token(), "<s>");
  EXPECT_EQ(r->eos_token(), "</s>");
  EXPECT_FALSE(r->pad_token().has_value());
  EXPECT_FALSE(r->unk_token().has_value());
  EXPECT_EQ(r->add_bos_token(), true);
  EXPECT_EQ(r->add_eos_token(), false);
  EXPECT_FALSE(r->model_max_length().has_value());
}

TEST(TokenizerConfigTest, ListOfNamedTemplates) {
  const json j = json::parse(R"({"chat_template": [{"name": "default", "template": "A"},
                                                   {"name": "tool_use", "template": "B"}],
                                 "model_max_length": 8192})");
  const TokenizerConfig c = TokenizerConfig::from_json(j, "t.json").value();
  ASSERT_EQ(c.chat_templates().size(), 2u);
  EXPECT_EQ(c.chat_template("tool_use")->source, "B");
  EXPECT_EQ(c.chat_template("rag"), nullptr);
  EXPECT_EQ(c.model_max_length(), 8192);
}

TEST(TokenizerConfigTest, BadValues) {
  auto bad = [](const char* text) {
    return TokenizerConfig::from_json(json::parse(text), "t.json").status();
  };
  expect_has(bad(R"({"chat_template": 5})"), {"t.json", "\"chat_template\"", "5"});
  expect_has(bad(R"({"chat_template": [{"name": "x"}]})"), {"chat_template[0]", "\"template\""});
  expect_has(bad(R"({"chat_template": ["x"]})"), {"chat_template[0]"});
  expect_has(bad(R"({"chat_template": [{"name": "a", "template": "1"}, {"name": "a", "template": "2"}]})"),
             {"chat_template[1]", "duplicate template name \"a\""});
  expect_has(bad(R"({"bos_token": 1})"), {"\"bos_token\"", "1"});
  expect_has(bad(R"({"eos_token": {"text": "</s>"}})"), {"\"eos_token\"", "content"});
  expect_has(bad(R"({"add_bos_token": "true"})"), {"\"add_bos_token\"", "\"true\""});
  expect_has(bad(R"({"model_max_length": -5})"), {"\"model_max_length\"", "-5"});
  expect_has(bad(R"({"model_max_length": "big"})"), {"\"model_max_length\"", "big"});
}

// ---- generation_config.json

TEST(GenerationConfigTest, ValuesAndErrors) {
  const json j = json::parse(R"({"bos_token_id": 1, "eos_token_id": [2, 3], "do_sample": true,
                                 "temperature": 0.7, "top_p": 0.9, "top_k": 50, "pad_token_id": null})");
  const GenerationConfig g = GenerationConfig::from_json(j, "g.json").value();
  EXPECT_EQ(g.eos_token_ids, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(g.bos_token_id, 1);
  EXPECT_FALSE(g.pad_token_id.has_value());
  EXPECT_EQ(g.do_sample, true);
  EXPECT_DOUBLE_EQ(g.temperature.value(), 0.7);
  EXPECT_EQ(g.top_k, 50);
  EXPECT_EQ(GenerationConfig::from_json(json{{"eos_token_id", 7}}, "g").value().eos_token_ids,
            std::vector<int64_t>{7});
  auto bad = [](const char* text) {
    return GenerationConfig::from_json(json::parse(text), "g.json").status();
  };
  expect_has(bad(R"({"eos_token_id": [2, "x"]})"), {"\"eos_token_id\"[1]", "\"x\""});
  expect_has(bad(R"({"eos_token_id": -1})"), {"\"eos_token_id\"", "-1"});
  expect_has(bad(R"({"top_p": 1.5})"), {"\"top_p\"", "1.5"});
  expect_has(bad(R"({"temperature": -0.5})"), {"\"temperature\"", "-0.5"});
  expect_has(bad(R"({"top_k": 2.5})"), {"\"top_k\"", "2.5"});
  expect_has(bad(R"({"bos_token_id": -3})"), {"\"bos_token_id\"", "-3"});
}

// ---- the folder

TEST_F(HfDir, FolderLoadsEveryFile) {
  write("config.json", llama_config().dump(2));
  write("tokenizer_config.json", R"({"chat_template": "old", "eos_token": "</s>"})");
  write("chat_template.jinja", "{{ messages }}");
  write("generation_config.json", R"({"eos_token_id": 2})");
  write("tokenizer.json", "{}");
  auto r = ModelFolder::open(dir_.string());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->config.hidden_size().value(), 64);
  ASSERT_TRUE(r->tokenizer_config.has_value());
  EXPECT_EQ(r->tokenizer_config->chat_template()->source, "{{ messages }}");  // the .jinja file wins
  EXPECT_EQ(r->tokenizer_config->eos_token(), "</s>");
  EXPECT_EQ(r->generation_config->eos_token_ids, std::vector<int64_t>{2});
  EXPECT_EQ(r->tokenizer_json_path, path("tokenizer.json"));
}

TEST_F(HfDir, FolderErrors) {
  EXPECT_EQ(ModelFolder::open(path("none")).status().code(), StatusCode::not_found);
  auto r = ModelFolder::open(dir_.string());
  EXPECT_EQ(r.status().code(), StatusCode::not_found);
  expect_has(r.status(), {"config.json"});
  write("config.json", llama_config().dump());
  write("generation_config.json", R"({"top_p": "high"})");
  expect_has(ModelFolder::open(dir_.string()).status(), {"generation_config.json", "\"top_p\""});
  fs::remove(dir_ / "generation_config.json");
  write("tokenizer_config.json", "{");
  expect_has(ModelFolder::open(dir_.string()).status(), {"tokenizer_config.json:1:", "invalid JSON"});
  fs::remove(dir_ / "tokenizer_config.json");
  const std::string jinja = write("chat_template.jinja", "x");
  fs::resize_file(jinja, json_file::kMaxConfigBytes + 1);
  expect_has(ModelFolder::open(dir_.string()).status(), {"chat_template.jinja", "over the limit"});
}

}  // namespace
}  // namespace kiln::hf
