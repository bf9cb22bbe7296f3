// write_gguf_tokenizer: a tokenizer written as GGUF tokenizer metadata, parsed back and rebuilt with
// Tokenizer::from_gguf, tokenizes and decodes exactly as the original. On the real models (SmolLM2:
// byte-level BPE; Gemma 3: SentencePiece-style; from KILN_MODELS_DIR, skipped when absent) built from their
// GGUF files; on small hand-built tokenizer.json vocabularies; plus padding, the pre-tokenizer names and the
// errors. The real models' tokenizer.json route and llama.cpp's reading of the written files are
// tests/python/test_tokenizer_export.py.
#include "tokenizer/gguf_export.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "formats/gguf.h"
#include "tokenizer/load.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace kiln {
namespace {

using Ids = std::vector<int32_t>;

// Text with the cases tokenizers get wrong: CJK, emoji (with ZWJ and skin tones), combining marks,
// whitespace runs, digits, contractions, special tokens of both models, a literal U+2581.
const std::vector<std::string>& corpus() {
  static const std::vector<std::string> texts = {
      "",
      "Hello, world!",
      "The quick brown fox jumps over the lazy dog. I'm sure it's fine; they'll see, we'd go.",
      "  leading spaces and trailing   ",
      "tabs\tand\t\tnewlines\n\n\nand\r\nCRLF",
      "          ten spaces",
      "\n",
      "1234567890 3.14159 1,000,000 2024-11-23 0x1F",
      "你好，世界！这是一个测试。",
      "日本語のテキストとカタカナ、ひらがな",
      "한국어 텍스트",
      "Emoji: 😀🎉👍🏽 👨‍👩‍👧‍👦 🇫🇷",
      "Combining: e\xCC\x81 n\xCC\x83 a\xCC\x8A\xCC\x81",
      "Ελληνικά και кириллица и العربية",
      "def f(x):\n    return x ** 2  # comment\n",
      "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
      "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
      "<|endoftext|><bos><eos>",
      "literal \xE2\x96\x81 metaspace \xE2\x96\x81\xE2\x96\x81 run",
      "mixed 123abc456 !!! ??? ... ---",
      "\xEF\xBF\xBD replacement and \xC2\xA0nbsp\xE2\x80\x83"
      "em space",
  };
  return texts;
}

// The two tokenizers agree on every id, special flag and piece, and on every corpus text (each mode).
void expect_same_tokenizer(const Tokenizer& a, const Tokenizer& b) {
  ASSERT_EQ(a.n_vocab(), b.n_vocab());
  EXPECT_EQ(a.model(), b.model());
  EXPECT_EQ(a.bos_id(), b.bos_id());
  EXPECT_EQ(a.eos_id(), b.eos_id());
  EXPECT_EQ(a.eot_id(), b.eot_id());
  EXPECT_EQ(a.unk_id(), b.unk_id());
  EXPECT_EQ(a.pad_id(), b.pad_id());
  EXPECT_EQ(a.add_bos(), b.add_bos());
  EXPECT_EQ(a.add_eos(), b.add_eos());
  EXPECT_EQ(a.eog_ids(), b.eog_ids());
  int bad_pieces = 0;
  for (int32_t id = 0; id < a.n_vocab() && bad_pieces < 5; ++id) {
    if (a.token_to_piece(id) != b.token_to_piece(id) || a.is_special(id) != b.is_special(id)) {
      ADD_FAILURE() << "token " << id << ": piece \"" << a.token_to_piece(id) << "\" vs \""
                    << b.token_to_piece(id) << "\", special " << a.is_special(id) << " vs "
                    << b.is_special(id);
      ++bad_pieces;
    }
  }
  for (const std::string& text : corpus()) {
    for (bool add_special : {false, true}) {
      for (bool parse_special : {false, true}) {
        const Ids ia = a.encode(text, add_special, parse_special);
        const Ids ib = b.encode(text, add_special, parse_special);
        EXPECT_EQ(ia, ib) << "\"" << text << "\" add_special=" << add_special
                          << " parse_special=" << parse_special;
      }
    }
    const Ids ids = b.encode(text, false, true);
    auto decoded = b.decode(ids, false);
    ASSERT_TRUE(decoded.ok()) << decoded.status().message();
    // A decoder that strips the prefix space also strips a space the text began with, and a SentencePiece
    // vocabulary reads a literal U+2581 as a space (both as HF's do).
    const bool spm_lossy =
        a.model() == TokenizerModel::spm_bpe && text.find("\xE2\x96\x81") != std::string::npos;
    if (!(a.vocab().strip_space_prefix && text.starts_with(' ')) && !spm_lossy) {
      EXPECT_EQ(*decoded, text);
    }
    EXPECT_EQ(*decoded, a.decode(ids, false).value());
    EXPECT_EQ(b.decode(ids, true).value(), a.decode(ids, true).value());
  }
}

// Writes `tok` (and `extra` keys, e.g. general.architecture) to GGUF bytes.
std::vector<uint8_t> export_bytes(const Tokenizer& tok, int32_t n_vocab_model,
                                  const std::optional<std::string>& chat_template = std::nullopt,
                                  const std::vector<std::pair<std::string, gguf::Value>>& extra = {}) {
  gguf::Writer w;
  for (const auto& [key, value] : extra) w.set(key, value);
  const Status st = write_gguf_tokenizer(tok, w, n_vocab_model, chat_template);
  EXPECT_TRUE(st.ok()) << st.message();
  auto bytes = w.to_bytes();
  EXPECT_TRUE(bytes.ok()) << bytes.status().message();
  return bytes.ok() ? std::move(bytes).value() : std::vector<uint8_t>();
}

Tokenizer reload(const std::vector<uint8_t>& bytes) {
  auto f = gguf::File::parse(bytes, "exported.gguf");
  EXPECT_TRUE(f.ok()) << f.status().message();
  auto tok = Tokenizer::from_gguf(*f);
  EXPECT_TRUE(tok.ok()) << tok.status().message();
  return std::move(tok).value();
}

std::string models_dir() {
  const char* dir = std::getenv("KILN_MODELS_DIR");
  return dir != nullptr && *dir != '\0' ? dir : std::string(std::getenv("HOME")) + "/.cache/kiln/models";
}

// ---------------------------------------------------------------------------------------------------
// Real models

struct RealModel {
  const char* name;
  const char* file;
};

class GgufExportModel : public ::testing::TestWithParam<RealModel> {};

TEST_P(GgufExportModel, GgufRoundTripKeepsIds) {
  const std::string path = models_dir() + "/" + GetParam().file;
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no test model " << path;
  auto f = gguf::File::open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  auto tok = Tokenizer::from_gguf(*f);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  auto tmpl = f->get_string_or("tokenizer.chat_template", "");
  ASSERT_TRUE(tmpl.ok());
  const std::optional<std::string> chat = tmpl->empty() ? std::nullopt : std::optional(*tmpl);
  // As a converter would: the architecture beside the tokenizer keys.
  const auto bytes = export_bytes(*tok, tok->n_vocab(), chat,
                                  {{"general.architecture", gguf::Value::str(f->architecture())}});
  auto g = gguf::File::parse(bytes, "exported.gguf");
  ASSERT_TRUE(g.ok()) << g.status().message();
  if (chat) {
    EXPECT_EQ(g->get_string("tokenizer.chat_template").value(), *chat);
  }
  auto back = Tokenizer::from_gguf(*g);
  ASSERT_TRUE(back.ok()) << back.status().message();
  expect_same_tokenizer(*tok, *back);
  // The same tokens, with the original spelling of every added token and of every byte-level token.
  const auto tokens = g->get_string_array("tokenizer.ggml.tokens").value();
  const auto original = f->get_string_array("tokenizer.ggml.tokens").value();
  ASSERT_EQ(tokens.size(), original.size());
  size_t differ = 0;
  for (size_t i = 0; i < tokens.size(); ++i) differ += tokens[i] != original[i];
  // Gemma's whitespace-run tokens are written with U+2581 (as kiln and HF look them up), nothing else moves.
  EXPECT_LE(differ, 64u);
}

INSTANTIATE_TEST_SUITE_P(Models, GgufExportModel,
                         ::testing::Values(RealModel{"smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"},
                                           RealModel{"gemma3", "gemma-3-270m-q4_k_m.gguf"}),
                         [](const auto& p) { return std::string(p.param.name); });

// ---------------------------------------------------------------------------------------------------
// Small tokenizer.json vocabularies

nlohmann::json byte_level_json(nlohmann::json pre_tokenizer) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[unicode::bytes_to_byte_level(std::string(1, static_cast<char>(b)))] = b;
  vocab["he"] = 256;
  vocab["ll"] = 257;
  vocab["hell"] = 258;
  vocab["hello"] = 259;
  vocab["\xC4\xA0w"] = 260;  // "Ġw"
  vocab["12"] = 261;
  return {
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", {"h e", "l l", "he ll", "hell o", "\xC4\xA0 w", "1 2"}}}},
      {"pre_tokenizer", std::move(pre_tokenizer)},
      {"decoder", {{"type", "ByteLevel"}}},
      {"added_tokens",
       {{{"id", 262}, {"content", "<|end|>"}, {"special", true}},
        {{"id", 263}, {"content", "[[x]]"}, {"special", false}}}},
  };
}

nlohmann::json byte_level_regex() {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
}

// SentencePiece-style: <unk>, <s>, </s>, 256 byte tokens, then merged tokens; Metaspace prefix "first".
nlohmann::json spm_json(bool split) {
  const std::string ms = "\xE2\x96\x81";
  nlohmann::json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 3 + b;
  int32_t id = 259;
  for (const std::string& k : {ms, std::string("a"), std::string("b"), ms + "a", std::string("ab"), ms + "ab",
                               ms + ms, "a" + ms + "b"}) {
    vocab[k] = id++;
  }
  return {
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", {ms + " a", "a b", ms + "a b", ms + " " + ms}},
        {"unk_token", "<unk>"},
        {"byte_fallback", true},
        {"fuse_unk", true}}},
      {"pre_tokenizer",
       {{"type", "Metaspace"}, {"replacement", ms}, {"prepend_scheme", "first"}, {"split", split}}},
      {"decoder", {{"type", "Metaspace"}, {"replacement", ms}, {"prepend_scheme", "first"}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {{{"SpecialToken", {{"id", "<s>"}}}}, {{"Sequence", {{"id", "A"}}}}}},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", nlohmann::json::array({1})}}}}}}},
      {"added_tokens",
       {{{"id", 0}, {"content", "<unk>"}, {"special", true}},
        {{"id", 1}, {"content", "<s>"}, {"special", true}},
        {{"id", 2}, {"content", "</s>"}, {"special", true}}}},
  };
}

Tokenizer from_json(const nlohmann::json& j) {
  auto tok = Tokenizer::from_hf_json(j.dump());
  EXPECT_TRUE(tok.ok()) << tok.status().message();
  return std::move(tok).value();
}

TEST(GgufExport, ByteLevelJsonRoundTrip) {
  const Tokenizer tok = from_json(byte_level_json(byte_level_regex()));
  const Tokenizer back = reload(export_bytes(tok, tok.n_vocab()));
  expect_same_tokenizer(tok, back);
  EXPECT_EQ(back.encode("hello world<|end|>[[x]]", false, true),
            (Ids{259, 260, 'o', 'r', 'l', 'd', 262, 263}));
  EXPECT_EQ(back.token_type(262), TokenType::control);
  EXPECT_EQ(back.token_type(263), TokenType::user_defined);
}

// transformers 4.x saves a GGUF "gpt2" vocabulary of a Llama model (SmolLM2) with a Llama decoder chain and
// byte_fallback on; every byte has its character in the vocabulary, so byte fallback never acts and the GGUF
// form (which has no such flag) encodes alike. With a byte's character missing it could act: an error.
TEST(GgufExport, ByteLevelWithByteFallbackThatNeverActs) {
  nlohmann::json j = byte_level_json(byte_level_regex());
  j["model"]["byte_fallback"] = true;
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", nlohmann::json::array()}};
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders",
                   {{{"type", "ByteFallback"}},
                    {{"type", "Fuse"}},
                    {{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
                    {{"type", "ByteLevel"}}}}};
  const Tokenizer tok = from_json(j);
  const Tokenizer back = reload(export_bytes(tok, tok.n_vocab()));
  expect_same_tokenizer(tok, back);
  EXPECT_EQ(back.encode("hello world<|end|>[[x]]", false, true),
            (Ids{259, 260, 'o', 'r', 'l', 'd', 262, 263}));

  j["model"]["vocab"].erase("x");  // byte 0x78's character; its id named by another key
  j["model"]["vocab"]["<x>"] = 'x';
  const Tokenizer gap = from_json(j);
  gguf::Writer w;
  const Status st = write_gguf_tokenizer(gap, w, gap.n_vocab());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::unimplemented);
  EXPECT_NE(st.message().find("byte fallback"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("(0x78)"), std::string::npos) << st.message();
}

TEST(GgufExport, ByteLevelKeysAndMergesAsLlamaCppWritesThem) {
  const Tokenizer tok = from_json(byte_level_json(byte_level_regex()));
  const auto bytes = export_bytes(tok, tok.n_vocab());
  auto f = gguf::File::parse(bytes, "exported.gguf");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->get_string("tokenizer.ggml.model").value(), "gpt2");
  EXPECT_EQ(f->get_string("tokenizer.ggml.pre").value(), "gpt-2");
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.merges").value(),
            (std::vector<std::string>{"h e", "l l", "he ll", "hell o", "\xC4\xA0 w", "1 2"}));
  const auto tokens = f->get_string_array("tokenizer.ggml.tokens").value();
  EXPECT_EQ(tokens[262], "<|end|>");
  EXPECT_EQ(f->find("tokenizer.ggml.scores"), nullptr);
  EXPECT_FALSE(f->get_bool("tokenizer.ggml.add_bos_token").value());
}

TEST(GgufExport, DigitsFirstIsSmollm) {
  const nlohmann::json pre = {
      {"type", "Sequence"},
      {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, byte_level_regex()}}};
  const Tokenizer tok = from_json(byte_level_json(pre));
  auto f = gguf::File::parse(export_bytes(tok, tok.n_vocab()), "exported.gguf");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->get_string("tokenizer.ggml.pre").value(), "smollm");
}

TEST(GgufExport, PreNames) {
  EXPECT_EQ(gguf_pre_name({kGpt2Pattern}).value(), "gpt-2");
  EXPECT_EQ(gguf_pre_name({R"(\p{N})", kGpt2Pattern}).value(), "smollm");
  for (const char* name : {"llama-bpe", "qwen2", "deepseek-coder", "deepseek-v3"}) {
    EXPECT_EQ(gguf_pre_name(PreTokenizer::from_gguf_name(name)->patterns()).value(), name);
  }
  // Names kiln reads as GPT-2's regex come back as "gpt-2".
  EXPECT_EQ(gguf_pre_name(PreTokenizer::from_gguf_name("olmo")->patterns()).value(), "gpt-2");
  auto none = gguf_pre_name({R"(\p{N}+)", kGpt2Pattern});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::unimplemented);
  EXPECT_NE(none.status().message().find(R"(\p{N}+)"), std::string::npos) << none.status().message();
}

TEST(GgufExport, UnknownPreTokenizerIsAnError) {
  const nlohmann::json pre = {
      {"type", "Sequence"},
      {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", false}}, byte_level_regex()}}};
  const Tokenizer tok = from_json(byte_level_json(pre));
  gguf::Writer w;
  const Status st = write_gguf_tokenizer(tok, w, tok.n_vocab());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::unimplemented);
  EXPECT_NE(st.message().find("tokenizer.ggml.pre"), std::string::npos) << st.message();
}

TEST(GgufExport, SpmJsonRoundTripAndScores) {
  const Tokenizer tok = from_json(spm_json(false));
  const auto bytes = export_bytes(tok, tok.n_vocab());
  const Tokenizer back = reload(bytes);
  expect_same_tokenizer(tok, back);
  EXPECT_EQ(back.encode("ab ab", true, true), (Ids{1, 264, 264}));
  auto f = gguf::File::parse(bytes, "exported.gguf");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->get_string("tokenizer.ggml.model").value(), "llama");
  EXPECT_TRUE(f->get_bool("tokenizer.ggml.add_space_prefix").value());
  EXPECT_TRUE(f->get_bool("tokenizer.ggml.add_bos_token").value());
  const auto types = f->get_int_array("tokenizer.ggml.token_type").value();
  EXPECT_EQ(types[1], static_cast<int64_t>(TokenType::control));
  EXPECT_EQ(types[3 + 0x41], static_cast<int64_t>(TokenType::byte));
  EXPECT_EQ(types[260], static_cast<int64_t>(TokenType::normal));
  // Scores follow the merge ranks: "▁a" (rank 0) > "ab" (1) > "▁ab" (2) > "▁▁" (3) > unmerged tokens.
  const auto scores = f->get_float_array("tokenizer.ggml.scores").value();
  EXPECT_EQ(scores[262], 0.0);
  EXPECT_EQ(scores[263], -1.0);
  EXPECT_EQ(scores[264], -2.0);
  EXPECT_EQ(scores[265], -3.0);
  EXPECT_LT(scores[260], scores[265]);
  EXPECT_LT(scores[1], scores[265]);
}

TEST(GgufExport, SpmWithoutMergesRebuildsTheSameMergeOrderFromScores) {
  // A reader that ignores the merge list (llama.cpp) has only the scores; kiln's reader rebuilds merges
  // from them the way it does for SentencePiece files that list none.
  const Tokenizer tok = from_json(spm_json(false));
  gguf::Writer w;
  ASSERT_TRUE(write_gguf_tokenizer(tok, w, tok.n_vocab()).ok());
  w.set("tokenizer.ggml.merges", gguf::Value::array(gguf::ValueType::string, {}));
  auto full = w.to_bytes();
  ASSERT_TRUE(full.ok());
  // Drop the (now empty) merges key by copying every other key into a fresh writer.
  auto f = gguf::File::parse(*full, "exported.gguf");
  ASSERT_TRUE(f.ok());
  gguf::Writer w2;
  for (const auto& [key, value] : f->metadata()) {
    if (key != "tokenizer.ggml.merges") w2.set(key, value);
  }
  expect_same_tokenizer(tok, reload(w2.to_bytes().value()));
}

TEST(GgufExport, MetaspaceSplitAcrossATokenIsAnError) {
  const Tokenizer tok = from_json(spm_json(true));  // "a▁b" spans a U+2581: splitting changes merges
  gguf::Writer w;
  const Status st = write_gguf_tokenizer(tok, w, tok.n_vocab());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::unimplemented);
  EXPECT_NE(st.message().find("U+2581"), std::string::npos) << st.message();
}

TEST(GgufExport, PadsToTheModelsVocabulary) {
  const Tokenizer tok = from_json(byte_level_json(byte_level_regex()));
  const int32_t n = tok.n_vocab();
  const auto bytes = export_bytes(tok, n + 3);
  auto f = gguf::File::parse(bytes, "exported.gguf");
  ASSERT_TRUE(f.ok());
  const auto tokens = f->get_string_array("tokenizer.ggml.tokens").value();
  const auto types = f->get_int_array("tokenizer.ggml.token_type").value();
  ASSERT_EQ(tokens.size(), static_cast<size_t>(n + 3));
  ASSERT_EQ(types.size(), static_cast<size_t>(n + 3));
  for (int32_t id = n; id < n + 3; ++id) {
    EXPECT_EQ(tokens[id], fmt::format("[PAD{}]", id));
    EXPECT_EQ(types[id], static_cast<int64_t>(TokenType::unused));
  }
  const Tokenizer back = reload(bytes);
  EXPECT_EQ(back.n_vocab(), n + 3);
  for (const std::string& text : corpus())
    EXPECT_EQ(back.encode(text, true, true), tok.encode(text, true, true));
  EXPECT_EQ(back.decode(Ids{n + 1}, false).value(), fmt::format("[PAD{}]", n + 1));
}

TEST(GgufExport, SpmPaddingGetsTheLowestScore) {
  const Tokenizer tok = from_json(spm_json(false));
  auto f = gguf::File::parse(export_bytes(tok, tok.n_vocab() + 2), "exported.gguf");
  ASSERT_TRUE(f.ok());
  const auto scores = f->get_float_array("tokenizer.ggml.scores").value();
  ASSERT_EQ(scores.size(), static_cast<size_t>(tok.n_vocab() + 2));
  EXPECT_LT(scores.back(), scores[265]);
}

TEST(GgufExport, ModelVocabularySmallerThanTokenizerIsAnError) {
  const Tokenizer tok = from_json(byte_level_json(byte_level_regex()));
  gguf::Writer w;
  const Status st = write_gguf_tokenizer(tok, w, tok.n_vocab() - 1);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::invalid_argument);
  EXPECT_NE(st.message().find(std::to_string(tok.n_vocab() - 1)), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(std::to_string(tok.n_vocab())), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("n_vocab_model"), std::string::npos) << st.message();
  EXPECT_FALSE(write_gguf_tokenizer(tok, w, 0).ok());
  EXPECT_FALSE(write_gguf_tokenizer(tok, w, -5).ok());
  // A failed write sets no key.
  auto f = gguf::File::parse(w.to_bytes().value(), "failed.gguf");
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(f->metadata().empty());
}

TEST(GgufExport, ChatTemplateOnlyWhenGiven) {
  const Tokenizer tok = from_json(byte_level_json(byte_level_regex()));
  auto without = gguf::File::parse(export_bytes(tok, tok.n_vocab()), "a.gguf");
  ASSERT_TRUE(without.ok());
  EXPECT_EQ(without->find("tokenizer.chat_template"), nullptr);
  const std::string tmpl = "{% for m in messages %}{{ m.content }}{% endfor %}";
  auto with = gguf::File::parse(export_bytes(tok, tok.n_vocab(), tmpl), "b.gguf");
  ASSERT_TRUE(with.ok());
  EXPECT_EQ(with->get_string("tokenizer.chat_template").value(), tmpl);
}

}  // namespace
}  // namespace kiln
