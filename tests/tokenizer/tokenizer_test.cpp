// Tokenizer unit tests on small hand-built vocabularies: the merge loop, added tokens, both families,
// decode, the stream decoder, the UTF-8 helpers, and the errors bad GGUF / tokenizer.json input gets.
// Parity with Hugging Face on the real models is tests/python/test_tokenizer.py.
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "formats/gguf.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/unicode.h"

namespace kiln {
namespace {

using gguf::Value;
using gguf::ValueType;
using Ids = std::vector<int32_t>;

// ---------------------------------------------------------------------------------------------------
// UTF-8 helpers

TEST(Unicode, DecodeRejectsInvalidForms) {
  uint32_t cp = 0;
  EXPECT_EQ(unicode::utf8_decode("\xC3\xA9", 0, cp), 2u);
  EXPECT_EQ(cp, 0xE9u);
  EXPECT_EQ(unicode::utf8_decode("\xF0\x9F\x98\x80", 0, cp), 4u);
  EXPECT_EQ(cp, 0x1F600u);
  EXPECT_EQ(unicode::utf8_decode("\xC0\xAF", 0, cp), 0u);          // overlong
  EXPECT_EQ(unicode::utf8_decode("\xED\xA0\x80", 0, cp), 0u);      // surrogate
  EXPECT_EQ(unicode::utf8_decode("\xF4\x90\x80\x80", 0, cp), 0u);  // above U+10FFFF
  EXPECT_EQ(unicode::utf8_decode("\xE2\x82", 0, cp), 0u);          // truncated
  EXPECT_EQ(unicode::utf8_decode("\x80", 0, cp), 0u);              // lone continuation
}

TEST(Unicode, CompletePrefixHoldsBackOnlyUnfinishedCharacters) {
  EXPECT_EQ(unicode::utf8_complete_prefix("abc"), 3u);
  EXPECT_EQ(unicode::utf8_complete_prefix("a\xC3"), 1u);
  EXPECT_EQ(unicode::utf8_complete_prefix("a\xE2\x82"), 1u);
  EXPECT_EQ(unicode::utf8_complete_prefix("a\xF0\x9F\x98"), 1u);
  EXPECT_EQ(unicode::utf8_complete_prefix("a\xF0\x9F\x98\x80"), 5u);
  // Bytes that can never become valid are not held back.
  EXPECT_EQ(unicode::utf8_complete_prefix("a\xFF"), 2u);
  EXPECT_EQ(unicode::utf8_complete_prefix("a\xE0\x80"), 3u);  // overlong E0 form
  EXPECT_EQ(unicode::utf8_complete_prefix("a\xED\xA0"), 3u);  // surrogate
}

TEST(Unicode, ByteAlphabetRoundTripsEveryByte) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::string spelled = unicode::bytes_to_byte_level(all);
  EXPECT_TRUE(unicode::utf8_valid(spelled));
  std::string back;
  ASSERT_TRUE(unicode::byte_level_to_bytes(spelled, back));
  EXPECT_EQ(back, all);
  EXPECT_EQ(unicode::bytes_to_byte_level(" "), "\xC4\xA0");          // "Ġ"
  EXPECT_FALSE(unicode::byte_level_to_bytes("\xE4\xBD\xA0", back));  // 你 is not in the alphabet
}

// ---------------------------------------------------------------------------------------------------
// Byte-level BPE from a tokenizer.json

// Every byte as a token (ids 0..255), then merges h+e, l+l, he+ll, hell+o, Ġ+w; plus two added tokens.
std::string byte_level_json() {
  nlohmann::json vocab = nlohmann::json::object();
  std::string all;
  for (int b = 0; b < 256; ++b) {
    vocab[unicode::bytes_to_byte_level(std::string(1, static_cast<char>(b)))] = b;
  }
  vocab["he"] = 256;
  vocab["ll"] = 257;
  vocab["hell"] = 258;
  vocab["hello"] = 259;
  vocab["\xC4\xA0w"] = 260;  // "Ġw"
  nlohmann::json j = {
      {"model",
       {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"h e", "l l", "he ll", "hell o", "\xC4\xA0 w"}}}},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"added_tokens",
       {{{"id", 261}, {"content", "<|end|>"}, {"special", true}},
        {{"id", 262}, {"content", "[[x]]"}, {"special", false}}}},
  };
  return j.dump();
}

Tokenizer byte_level() {
  auto tok = Tokenizer::from_hf_json(byte_level_json());
  EXPECT_TRUE(tok.ok()) << tok.status().message();
  return std::move(tok).value();
}

TEST(ByteLevelBpe, MergesByRank) {
  const Tokenizer tok = byte_level();
  EXPECT_EQ(tok.model(), TokenizerModel::byte_level_bpe);
  EXPECT_EQ(tok.n_vocab(), 263);
  EXPECT_EQ(tok.encode("hello", false, true), (Ids{259}));
  // "hellx": he+ll -> hell, then no merge with x.
  EXPECT_EQ(tok.encode("hellx", false, true), (Ids{258, 'x'}));
  // The regex splits " world" from "hello": "Ġw" merges, the rest are single bytes.
  EXPECT_EQ(tok.encode("hello world", false, true), (Ids{259, 260, 'o', 'r', 'l', 'd'}));
}

TEST(ByteLevelBpe, SpecialTokensOnlyWithParseSpecial) {
  const Tokenizer tok = byte_level();
  EXPECT_EQ(tok.encode("a<|end|>", false, true), (Ids{'a', 261}));
  const Ids plain = tok.encode("a<|end|>", false, false);
  EXPECT_EQ(plain.size(), 8u);
  EXPECT_EQ(tok.decode(plain, false).value(), "a<|end|>");
  // A non-special added token is recognised either way.
  EXPECT_EQ(tok.encode("[[x]]", false, false), (Ids{262}));
  EXPECT_TRUE(tok.is_special(261));
  EXPECT_FALSE(tok.is_special(262));
  EXPECT_TRUE(tok.is_eog(261));  // <|end|> ends a turn
}

TEST(ByteLevelBpe, DecodeRoundTripsAndSkipsSpecial) {
  const Tokenizer tok = byte_level();
  for (std::string text : {"hello world", "", "  tabs\tand\nnewlines  ", "日本語 😀", "a<|end|>b"}) {
    const Ids ids = tok.encode(text, false, true);
    EXPECT_EQ(tok.decode(ids, false).value(), text);
  }
  EXPECT_EQ(tok.decode(Ids{'a', 261, 'b'}, true).value(), "ab");
  EXPECT_EQ(tok.token_to_piece(260), " w");
  EXPECT_EQ(tok.token_id(" w"), 260);
  EXPECT_EQ(tok.token_id("<|end|>"), 261);
  EXPECT_FALSE(tok.token_id("nope").has_value());
}

TEST(ByteLevelBpe, InvalidUtf8IsReplaced) {
  const Tokenizer tok = byte_level();
  const Ids ids = tok.encode(
      "a\xFF"
      "b",
      false, true);
  EXPECT_EQ(tok.decode(ids, false).value(),
            "a\xEF\xBF\xBD"
            "b");
}

// A regex that backtracks without bound runs out of its work budget, in a fraction of a second, and the
// tokenizer then encodes the text unsplit: every byte is still there.
TEST(PreTokenizer, BacktrackingPatternRunsOutOfItsBudget) {
  std::string text;
  for (int i = 0; i < 2500; ++i) text += std::string(40, 'a') + "c";
  text += "b";
  auto pre = PreTokenizer::from_patterns({"(a|aa)+b"});
  ASSERT_TRUE(pre.ok()) << pre.status().message();
  std::vector<std::string_view> pieces;
  const Status st = pre->split(text, pieces);
  EXPECT_EQ(st.code(), StatusCode::resource_exhausted);
  EXPECT_NE(st.message().find("(a|aa)+b"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("102501-byte"), std::string::npos) << st.message();

  nlohmann::json j = nlohmann::json::parse(byte_level_json());
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(a|aa)+b"}}}, {"behavior", "Isolated"}};
  auto tok = Tokenizer::from_hf_json(j.dump());
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tok->decode(tok->encode(text, false, false), false).value(), text);
}

// The patterns of real tokenizers stay far inside the budget on long runs of one character class, the
// texts where a pattern with lookahead or nested quantifiers would backtrack.
TEST(PreTokenizer, RealPatternsFitTheBudget) {
  const std::vector<std::string> texts = {
      std::string(100000, ' ') + "x",
      std::string(100000, '\n') + "x",
      std::string(100000, '1'),
      std::string(100000, '!') + "x",
      [] {
        std::string s;
        for (int i = 0; i < 50000; ++i) s += i % 7 ? " \t" : "\r\n";
        return s + "x";
      }(),
      [] {
        std::string s;
        for (int i = 0; i < 20000; ++i) s += "it's 12345 \xE4\xBD\xA0 ";
        return s;
      }(),
  };
  for (const char* name : {"gpt2", "llama-bpe", "qwen2", "deepseek-coder", "deepseek-v3", "smollm"}) {
    auto pre = PreTokenizer::from_gguf_name(name);
    ASSERT_TRUE(pre.ok()) << name;
    for (const std::string& text : texts) {
      std::vector<std::string_view> pieces;
      const Status st = pre->split(text, pieces);
      ASSERT_TRUE(st.ok()) << name << ": " << st.message();
      std::string joined;
      for (std::string_view p : pieces) joined += p;
      EXPECT_EQ(joined, text) << name;
    }
  }
}

// SmolLM's and StarCoder's GGUF names split every digit off first, as llama.cpp and the vocabularies'
// tokenizer.json do: a blank line before a digit stays one piece ("\n\n" then "1"; GPT-2's regex alone would
// give "\n" "\n" "1"), and a number is one piece a digit.
TEST(PreTokenizer, DigitNamesSplitDigitsBeforeGpt2Regex) {
  const std::vector<std::string_view> want = {"bowl", ".", "\n\n", "1", ".", " Mix", " ", "4", "2", "%"};
  for (const char* name : {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone"}) {
    auto pre = PreTokenizer::from_gguf_name(name);
    ASSERT_TRUE(pre.ok()) << name;
    std::vector<std::string_view> pieces;
    ASSERT_TRUE(pre->split("bowl.\n\n1. Mix 42%", pieces).ok()) << name;
    EXPECT_EQ(pieces, want) << name;
  }
  auto gpt2 = PreTokenizer::from_gguf_name("gpt2");
  ASSERT_TRUE(gpt2.ok());
  std::vector<std::string_view> pieces;
  ASSERT_TRUE(gpt2->split("bowl.\n\n1. Mix 42%", pieces).ok());
  EXPECT_EQ(pieces, (std::vector<std::string_view>{"bowl", ".", "\n", "\n", "1", ".", " Mix", " 42", "%"}));
}

TEST(ByteLevelBpe, DecodeRejectsOutOfRangeIds) {
  const Tokenizer tok = byte_level();
  auto r = tok.decode(Ids{1, 2, 263}, false);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::out_of_range);
  EXPECT_NE(r.status().message().find("token 2 is id 263"), std::string::npos) << r.status().message();
  EXPECT_FALSE(tok.decode(Ids{-5}, false).ok());
  EXPECT_EQ(tok.token_to_piece(-1), "");
}

// ---------------------------------------------------------------------------------------------------
// SentencePiece-style BPE from GGUF metadata

struct SpmSpec {
  std::vector<std::string> tokens;
  std::vector<int64_t> types;
  std::vector<double> scores;
};

// <unk> <s> </s>, the 256 byte tokens, then a few pieces; scores rank "▁he" < "▁hel" < "▁hello".
SpmSpec spm_spec() {
  SpmSpec s;
  auto add = [&](std::string t, int64_t type, double score) {
    s.tokens.push_back(std::move(t));
    s.types.push_back(type);
    s.scores.push_back(score);
  };
  add("<unk>", 2, 0);
  add("<s>", 3, 0);
  add("</s>", 3, 0);
  for (int b = 0; b < 256; ++b) add(fmt::format("<0x{:02X}>", b), 6, 0);
  for (std::string c : {"\xE2\x96\x81", "h", "e", "l", "o"}) add(c, 1, -100);
  add("\xE2\x96\x81h", 1, -1);
  add("\xE2\x96\x81he", 1, -2);
  add("\xE2\x96\x81hel", 1, -3);
  add("\xE2\x96\x81hell", 1, -4);
  add("\xE2\x96\x81hello", 1, -5);
  return s;
}

Value string_array(const std::vector<std::string>& v) {
  std::vector<Value> items;
  for (const auto& s : v) items.push_back(Value::str(s));
  return Value::array(ValueType::string, std::move(items));
}

gguf::Writer spm_writer(const SpmSpec& s) {
  gguf::Writer w;
  w.set("general.architecture", Value::str("llama"));
  w.set("tokenizer.ggml.model", Value::str("llama"));
  w.set("tokenizer.ggml.tokens", string_array(s.tokens));
  std::vector<Value> types, scores;
  for (int64_t t : s.types) types.push_back(Value::i32(static_cast<int32_t>(t)));
  for (double x : s.scores) scores.push_back(Value::f32(static_cast<float>(x)));
  w.set("tokenizer.ggml.token_type", Value::array(ValueType::int32, std::move(types)));
  w.set("tokenizer.ggml.scores", Value::array(ValueType::float32, std::move(scores)));
  w.set("tokenizer.ggml.bos_token_id", Value::u32(1));
  w.set("tokenizer.ggml.eos_token_id", Value::u32(2));
  w.set("tokenizer.ggml.unknown_token_id", Value::u32(0));
  return w;
}

Result<Tokenizer> from_writer(const gguf::Writer& w) {
  KILN_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, w.to_bytes());
  KILN_ASSIGN_OR_RETURN(gguf::File f, gguf::File::parse(bytes, "test.gguf"));
  return Tokenizer::from_gguf(f);
}

constexpr int32_t kByte0 = 3;            // id of <0x00>
constexpr int32_t kHello = 3 + 256 + 9;  // id of "▁hello"

TEST(SpmBpe, SpaceEscapingMergesAndByteFallback) {
  auto tok = from_writer(spm_writer(spm_spec()));
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tok->model(), TokenizerModel::spm_bpe);
  EXPECT_TRUE(tok->add_bos());
  // BOS, then "▁hello" (add_space_prefix puts the ▁ before the text).
  EXPECT_EQ(tok->encode("hello", true, true), (Ids{1, kHello}));
  // 'x' is not in the vocabulary: byte fallback gives <0x78>.
  EXPECT_EQ(tok->encode("hellox", false, true), (Ids{kHello, kByte0 + 'x'}));
  // é is two bytes, two byte tokens; decode puts the character back together.
  const Ids ids = tok->encode("h\xC3\xA9", false, true);
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[1], kByte0 + 0xC3);
  EXPECT_EQ(ids[2], kByte0 + 0xA9);
  EXPECT_EQ(tok->decode(ids, false).value(), "h\xC3\xA9");  // the prefix space is dropped again
  EXPECT_EQ(tok->decode(Ids{1, kHello, 2}, true).value(), "hello");
  // As Hugging Face: only the first token's prefix space is dropped, and here that is <s>.
  EXPECT_EQ(tok->decode(Ids{1, kHello, 2}, false).value(), "<s> hello</s>");
  EXPECT_TRUE(tok->is_eog(2));
  EXPECT_FALSE(tok->is_eog(1));
}

TEST(StreamDecoder, NeverEmitsHalfACharacterAndMatchesDecode) {
  auto tok = from_writer(spm_writer(spm_spec()));
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  // "hello 😀é": the emoji is four byte tokens, é two.
  const std::string text = "hello \xF0\x9F\x98\x80\xC3\xA9";
  const Ids ids = tok->encode(text, true, true);
  StreamDecoder sd(*tok);
  std::string joined;
  size_t emitted_empty = 0;
  for (int32_t id : ids) {
    auto chunk = sd.feed(id);
    ASSERT_TRUE(chunk.ok());
    EXPECT_EQ(unicode::utf8_complete_prefix(*chunk), chunk->size()) << "chunk ends inside a character";
    EXPECT_TRUE(unicode::utf8_valid(*chunk));
    emitted_empty += chunk->empty();
    joined += *chunk;
  }
  joined += sd.flush();
  EXPECT_EQ(joined, tok->decode(ids, true).value());
  EXPECT_EQ(joined, text);
  EXPECT_GE(emitted_empty, 4u);  // BOS, and the held-back bytes of the emoji and é
}

TEST(StreamDecoder, BadIdIsAnErrorAndFlushReturnsTheRest) {
  auto tok = from_writer(spm_writer(spm_spec()));
  ASSERT_TRUE(tok.ok());
  StreamDecoder sd(*tok);
  EXPECT_EQ(sd.feed(kByte0 + 0xE2).value(), "");
  EXPECT_EQ(sd.pending_bytes(), 1u);
  auto bad = sd.feed(tok->n_vocab());
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::out_of_range);
  EXPECT_EQ(sd.pending_bytes(), 1u);  // nothing consumed
  EXPECT_EQ(sd.flush(), "\xE2");
  sd.reset();
  EXPECT_EQ(sd.feed(kHello).value(), "hello");
}

// ---------------------------------------------------------------------------------------------------
// Bad metadata: each error names the key and the value.

void expect_error(const gguf::Writer& w, std::string_view needle) {
  auto tok = from_writer(w);
  ASSERT_FALSE(tok.ok()) << "expected an error naming " << needle;
  EXPECT_NE(tok.status().message().find(needle), std::string::npos) << tok.status().message();
}

TEST(FromGguf, BadMetadataIsAClearError) {
  {
    gguf::Writer w = spm_writer(spm_spec());
    w.set("tokenizer.ggml.bos_token_id", Value::u32(100000));
    expect_error(w, "tokenizer.ggml.bos_token_id = 100000");
  }
  {
    SpmSpec s = spm_spec();
    s.types.pop_back();
    expect_error(spm_writer(s), "tokenizer.ggml.token_type has");
  }
  {
    SpmSpec s = spm_spec();
    s.types[5] = 9;
    expect_error(spm_writer(s), "tokenizer.ggml.token_type[5] = 9");
  }
  {
    SpmSpec s = spm_spec();
    s.tokens[4] = "<0xZZ>";
    expect_error(spm_writer(s), "tokenizer.ggml.tokens[4] = \"<0xZZ>\"");
  }
  {
    gguf::Writer w = spm_writer(spm_spec());
    w.set("tokenizer.ggml.model", Value::str("wordpiece"));
    expect_error(w, "\"wordpiece\"");
  }
  {
    gguf::Writer w = spm_writer(spm_spec());
    w.set("tokenizer.ggml.merges", string_array({"\xE2\x96\x81h e", "noseparator"}));
    expect_error(w, "tokenizer.ggml.merges[1] = \"noseparator\"");
  }
  {
    gguf::Writer w = spm_writer(spm_spec());
    w.set("tokenizer.ggml.model", Value::str("gpt2"));
    w.set("tokenizer.ggml.merges", string_array({}));
    w.set("tokenizer.ggml.pre", Value::str("no-such-pre"));
    expect_error(w, "no-such-pre");
  }
  {
    gguf::Writer w = spm_writer(spm_spec());
    w.set("tokenizer.ggml.tokens", Value::u32(3));
    expect_error(w, "tokenizer.ggml.tokens");
  }
}

TEST(FromGguf, TokensTooLongToIndexAreRefusedBeforeTheWork) {
  // One 600,000-character token took 31 s (the SentencePiece merge derivation is quadratic in a token's
  // length).
  SpmSpec s = spm_spec();
  s.tokens.push_back(std::string(600000, 'h'));
  s.types.push_back(1);
  s.scores.push_back(-1000);
  expect_error(spm_writer(s), "too long to derive merges");
}

TEST(FromHfJson, AddedTokenTextIsBounded) {
  // One 40 MB control token cost 2.1 GB (the added-token index takes ~50 bytes per byte of text).
  nlohmann::json j = nlohmann::json::parse(byte_level_json());
  j["added_tokens"].push_back(
      {{"id", 263}, {"content", std::string(size_t{8} << 20, 'x')}, {"special", true}});
  auto tok = Tokenizer::from_hf_json(j.dump());
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), StatusCode::resource_exhausted) << tok.status().message();
  EXPECT_NE(tok.status().message().find("added and special tokens hold more than"), std::string::npos)
      << tok.status().message();
  EXPECT_LT(tok.status().message().size(), 300u);
}

TEST(FromHfJson, BadJsonIsAClearError) {
  auto err = [](const std::string& text) {
    auto tok = Tokenizer::from_hf_json(text);
    EXPECT_FALSE(tok.ok());
    return tok.ok() ? std::string() : tok.status().message();
  };
  EXPECT_NE(err("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}").find("WordPiece"),
            std::string::npos);
  EXPECT_NE(
      err("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}}").find("merges[0]"),
      std::string::npos);
  EXPECT_NE(err("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 5}}}").find("reach 5"),
            std::string::npos);
  EXPECT_NE(err("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}}}").find("model.vocab[\"a\"]"),
            std::string::npos);
  EXPECT_NE(err("{\"model\": 3}").find("model"), std::string::npos);
  EXPECT_FALSE(Tokenizer::from_hf_json("{\"model\": {").ok());
  EXPECT_FALSE(Tokenizer::from_hf_json("/no/such/tokenizer.json").ok());
}

}  // namespace
}  // namespace kiln
