// A grammar compiled once over a vocabulary of the 256 single bytes plus one end token (256), so that any
// text can be fed byte by byte: for the tests of the GBNF that json_schema.h and regex.h write.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <string_view>

#include "grammar/grammar.h"

namespace kiln::grammar::test {

inline std::shared_ptr<const Vocabulary> byte_vocabulary() {
  static const std::shared_ptr<const Vocabulary> vocab = [] {
    auto v = std::make_shared<Vocabulary>();
    for (int b = 0; b < 256; ++b) v->bytes.emplace_back(1, static_cast<char>(b));
    v->bytes.emplace_back("");  // 256: the end token
    v->excluded.assign(v->bytes.size(), 0);
    v->end_ids = {256};
    return v;
  }();
  return vocab;
}

class ByteMatcher {
 public:
  // Fails the test (and accepts nothing) when `gbnf` does not parse or compile.
  explicit ByteMatcher(const std::string& gbnf) : gbnf_(gbnf) {
    auto g = parse_gbnf(gbnf);
    EXPECT_TRUE(g.ok()) << g.status().to_string() << "\n" << gbnf;
    if (!g.ok()) return;
    auto cg = compile(*g, byte_vocabulary());
    EXPECT_TRUE(cg.ok()) << cg.status().to_string() << "\n" << gbnf;
    if (cg.ok()) compiled_ = *cg;
  }

  // `text` fed byte by byte stays in the grammar and is a complete sentence (the end token is accepted).
  bool accepts(std::string_view text) const {
    if (compiled_ == nullptr) return false;
    Matcher m(compiled_);
    for (unsigned char c : text) {
      if (!m.accept(c)) return false;
    }
    return m.can_end() && m.accept(256) && m.done();
  }

  const std::string& gbnf() const { return gbnf_; }

 private:
  std::string gbnf_;
  std::shared_ptr<const CompiledGrammar> compiled_;
};

}  // namespace kiln::grammar::test
