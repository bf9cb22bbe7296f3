// Shared by the grammar tests: small vocabularies, matchers from GBNF text, masks as token lists.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "grammar/grammar.h"

namespace kiln::grammar::test {

// A vocabulary of the given token strings; `ends` are end tokens (their bytes ignored).
inline std::shared_ptr<const Vocabulary> make_vocab(std::vector<std::string> tokens,
                                                    std::vector<int32_t> ends = {}) {
  auto v = std::make_shared<Vocabulary>();
  v->bytes = std::move(tokens);
  v->excluded.assign(v->bytes.size(), 0);
  v->end_ids = std::move(ends);
  return v;
}

inline std::shared_ptr<const CompiledGrammar> compile_text(const std::string& gbnf,
                                                           const std::shared_ptr<const Vocabulary>& vocab) {
  auto g = parse_gbnf(gbnf);
  EXPECT_TRUE(g.ok()) << g.status().message();
  if (!g.ok()) return nullptr;
  auto cg = compile(*g, vocab);
  EXPECT_TRUE(cg.ok()) << cg.status().message();
  return cg.ok() ? *cg : nullptr;
}

inline std::vector<int32_t> allowed(std::span<const uint32_t> words, int32_t n_vocab) {
  std::vector<int32_t> out;
  for (int32_t id = 0; id < n_vocab; ++id) {
    if (words[static_cast<size_t>(id) / 32] >> (id % 32) & 1u) out.push_back(id);
  }
  return out;
}

// The fast mask, checked against the reference mask.
inline std::vector<int32_t> checked_mask(Matcher& m, int32_t n_vocab) {
  std::vector<uint32_t> fast(mask_words(n_vocab)), ref(mask_words(n_vocab));
  m.fill_mask(fast);
  m.fill_mask_reference(ref);
  EXPECT_EQ(allowed(fast, n_vocab), allowed(ref, n_vocab));
  return allowed(fast, n_vocab);
}

// Whether `text` (fed one byte-token at a time over a vocabulary of all 256 bytes) is a sentence.
inline bool matches(const std::string& gbnf, const std::string& text) {
  static std::shared_ptr<const Vocabulary> bytes = [] {
    std::vector<std::string> t;
    for (int b = 0; b < 256; ++b) t.emplace_back(1, static_cast<char>(b));
    t.emplace_back("");  // 256: the end token
    return make_vocab(std::move(t), {256});
  }();
  auto cg = compile_text(gbnf, bytes);
  if (cg == nullptr) return false;
  Matcher m(cg);
  for (unsigned char c : text) {
    if (!m.accept(c)) return false;
  }
  return m.can_end() && m.accept(256) && m.done();
}

}  // namespace kiln::grammar::test
