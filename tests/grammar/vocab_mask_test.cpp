// The fast mask against the reference mask (every token's bytes tried) along token paths, on real
// vocabularies: SmolLM2's 49,152 tokens, and Qwen2.5's 151,936 when its GGUF is in KILN_MODELS_DIR
// (skipped otherwise).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>

#include "formats/gguf.h"
#include "grammar/grammar.h"
#include "grammar/vocabulary.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace kiln::grammar {
namespace {

std::string models_dir() {
  const char* dir = std::getenv("KILN_MODELS_DIR");
  return dir != nullptr && *dir != '\0' ? dir : std::string(std::getenv("HOME")) + "/.cache/kiln/models";
}

struct Model {
  std::unique_ptr<Tokenizer> tokenizer;
  std::shared_ptr<const Vocabulary> vocab;
};

// Loaded once per file; null when the file is absent.
const Model* load_model(const std::string& file) {
  static std::map<std::string, std::unique_ptr<Model>> models;
  auto it = models.find(file);
  if (it != models.end()) return it->second.get();
  std::unique_ptr<Model>& m = models[file];
  const std::string path = models_dir() + "/" + file;
  if (!std::filesystem::exists(path)) return nullptr;
  auto f = gguf::File::open(path);
  EXPECT_TRUE(f.ok()) << f.status().message();
  if (!f.ok()) return nullptr;
  auto tok = Tokenizer::from_gguf(*f);
  EXPECT_TRUE(tok.ok()) << tok.status().message();
  if (!tok.ok()) return nullptr;
  m = std::make_unique<Model>();
  m->tokenizer = std::make_unique<Tokenizer>(std::move(tok).value());
  m->vocab = vocabulary_from(*m->tokenizer);
  return m.get();
}

const char* kJson = R"gbnf(
root   ::= ws value ws
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( member ( ws "," ws member )* ws )? "}"
member ::= string ws ":" ws value
array  ::= "[" ws ( value ( ws "," ws value )* ws )? "]"
string ::= "\"" char* "\""
char   ::= [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws     ::= [ \t\n]*
)gbnf";

const char* kPerson = R"gbnf(
root ::= "{" space "\"name\"" space ":" space string "," space "\"age\"" space ":" space integer "," space "\"tags\"" space ":" space tags ( "," space "\"email\"" space ":" space string )? "}" space
tags ::= "[" space ( string ( "," space string )* )? "]" space
string ::= "\"" char* "\"" space
char ::= [^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})
integer ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) space
space ::= | " " | "\n" [ \t]{0,20}
)gbnf";

const char* kArithmetic = R"gbnf(
root  ::= (expr "=" ws term "\n")+
expr  ::= term ([-+*/] term)*
term  ::= ident | num | "(" ws expr ")" ws
ident ::= [a-z] [a-z0-9_]* ws
num   ::= [0-9]+ ws
ws    ::= [ \t\n]*
)gbnf";

// Code points beyond ASCII: tokens end inside multi-byte characters.
const char* kUnicode = R"gbnf(
root ::= line+
line ::= ("- " [一-鿿ぁ-ゟ゠-ヿ]+ | "* " [À-ɏ ]+ | "> " .{1,12}) "\n"
)gbnf";

struct PathCase {
  const char* name;
  const char* grammar;
  const char* document;
};

const PathCase kCases[] = {
    {"json", kJson,
     R"({"name": "Ada Lovelace", "born": 1815, "tags": ["math", "poetry\n"], "ok": true, "x": [[1, 2.5e3], {}, null]})"},
    {"person", kPerson,
     R"({"name": "Grace \"Amazing\" Hopper", "age": 85, "tags": ["navy", "cobol"], "email": "grace@example.com"})"},
    {"arithmetic", kArithmetic, "x = (a + 12) * b\nyy = 3 / (c - 4)\n"},
    {"unicode", kUnicode, "- 日本語のテキスト\n* Ça été très ŕ\n> ∑ emoji 😀 ok\n"},
};

// Walks `steps` tokens: the document's tokens while the grammar allows them, then (or with `random`) a token
// drawn from the mask; checks fast == reference at each step.
void walk(const Model& m, const PathCase& c, bool random, int32_t steps) {
  SCOPED_TRACE(c.name);
  auto cg = test::compile_text(c.grammar, m.vocab);
  ASSERT_NE(cg, nullptr);
  Matcher matcher(cg);
  const int32_t n = m.vocab->n_vocab();
  const std::vector<int32_t> doc = m.tokenizer->encode(c.document, false, false);
  std::mt19937 rng(1234);
  size_t next_doc = 0;
  for (int32_t step = 0; step < steps && !matcher.done(); ++step) {
    SCOPED_TRACE(step);
    const std::vector<int32_t> ok = test::checked_mask(matcher, n);
    if (::testing::Test::HasFailure()) return;
    ASSERT_FALSE(ok.empty());
    int32_t pick = -1;
    if (!random && next_doc < doc.size() && std::binary_search(ok.begin(), ok.end(), doc[next_doc])) {
      pick = doc[next_doc++];
    } else {
      next_doc = doc.size();
      pick = ok[std::uniform_int_distribution<size_t>(0, ok.size() - 1)(rng)];
      if (matcher.can_end() && ok.size() > 1 && m.vocab->bytes[static_cast<size_t>(pick)].empty()) {
        pick = ok[0];  // keep going rather than end
      }
    }
    if (std::getenv("GRAMMAR_TEST_TRACE"))
      std::fprintf(stderr, "%s step %d allowed %zu pick [%s]\n", c.name, step, ok.size(),
                   m.vocab->bytes[static_cast<size_t>(pick)].c_str());
    ASSERT_TRUE(matcher.accept(pick)) << "token " << pick;
  }
}

TEST(GrammarVocab, SmolLm2FastMaskEqualsReference) {
  const Model* m = load_model("SmolLM2-135M-Instruct.Q4_1.gguf");
  if (m == nullptr) GTEST_SKIP() << "no SmolLM2 model in " << models_dir();
  for (const PathCase& c : kCases) {
    walk(*m, c, /*random=*/false, 48);
    walk(*m, c, /*random=*/true, 24);
  }
}

TEST(GrammarVocab, Qwen25FastMaskEqualsReference) {
  const Model* m = load_model("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf");
  if (m == nullptr) GTEST_SKIP() << "no Qwen2.5 model in " << models_dir();
  for (const PathCase& c : kCases) {
    walk(*m, c, /*random=*/false, 24);
    walk(*m, c, /*random=*/true, 12);
  }
}

}  // namespace
}  // namespace kiln::grammar
