// Constrained decoding: grammars that decide which tokens may come next.
//
//   text (GBNF, a JSON schema, a regular expression)
//     -> Grammar          (parse_gbnf; json_schema.h and regex.h write GBNF): rules over Unicode code points,
//                          vocabulary-free, shareable between requests
//     -> CompiledGrammar  (compile): the grammar against one tokenizer's vocabulary, with the per-state token
//                          masks that do not depend on the rest of the stack cached (a mask is then a few
//                          bitset operations plus a check of the few tokens that leave a rule), thread-safe
//     -> Matcher          (one per request): where the request's output is in the grammar; fill_mask() before
//                          each draw, accept() after it.
//
// GBNF is llama.cpp's grammar syntax: `name ::= alternatives`, string literals "..." with escapes
// (\n \r \t \\ \" \xHH \uHHHH \UHHHHHHHH), character classes [a-z] / [^"\\], `.` (any character), grouping,
// `*` `+` `?` and `{m}` `{m,}` `{m,n}` repetition, `#` comments. The start rule is `root`. Matching is over
// UTF-8 bytes of the output: a token is allowed when its bytes can continue the text so far inside the
// language (a token may end inside a multi-byte character).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace kiln::grammar {

// Bounds on what a request may make the server compile: beyond them, parse_gbnf / compile fail with
// resource_exhausted naming the bound.
struct Limits {
  size_t max_text_bytes = 1u << 20;  // the GBNF text
  int32_t max_rules = 10'000;        // rules after repetition is expanded
  int32_t max_states = 200'000;      // automaton states over all rules
  int32_t max_repeat = 10'000;       // m and n of {m,n}
};

struct Grammar;  // rules as automata over code points (grammar/ internals)

// Parses GBNF. Errors (invalid_argument): the line and column and what was expected; a rule used but never
// defined, no `root` rule, a rule that can loop without consuming anything (left recursion).
Result<std::shared_ptr<const Grammar>> parse_gbnf(std::string_view text, const Limits& limits = {});

// A tokenizer's vocabulary as the matcher sees it: each token's output bytes (what detokenizing it alone
// appends), the tokens that end generation (allowed exactly when the grammar can end there), and tokens that
// are never allowed (control tokens other than the end tokens, empty tokens).
struct Vocabulary {
  std::vector<std::string> bytes;  // [n_vocab]
  std::vector<int32_t> end_ids;    // e.g. EOS, EOT
  std::vector<uint8_t> excluded;   // [n_vocab] 1: never allowed (end_ids are handled apart)
  int32_t n_vocab() const { return static_cast<int32_t>(bytes.size()); }
};

struct CompiledGrammar;  // grammar + vocabulary + mask cache (grammar/ internals)

// Builds the token trie and the per-state masks. The vocabulary is shared (one per model), not copied.
Result<std::shared_ptr<const CompiledGrammar>> compile(std::shared_ptr<const Grammar> grammar,
                                                       std::shared_ptr<const Vocabulary> vocab,
                                                       const Limits& limits = {});

// Bytes a compiled grammar holds beyond its vocabulary and token trie (shared per vocabulary): the per-state
// masks built so far. It grows while matchers reach states that compile() left for their first use.
// Thread-safe.
size_t memory_bytes(const CompiledGrammar& grammar);

// One request's position in a compiled grammar. Not thread-safe; many matchers may share one grammar.
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const CompiledGrammar> grammar);
  ~Matcher();
  Matcher(Matcher&&) noexcept;
  Matcher& operator=(Matcher&&) noexcept;

  // words: [ceil(n_vocab / 32)]; bit (id % 32) of words[id / 32] is set exactly when token id may come next.
  // The end tokens are set when the text so far is a complete sentence of the grammar.
  void fill_mask(std::span<uint32_t> words);
  // The same mask found the slow way, each token's bytes tried against the stacks one by one (milliseconds on
  // a large vocabulary): the oracle fill_mask is tested against.
  void fill_mask_reference(std::span<uint32_t> words);
  // Moves past one token. False (and nothing changes) when the mask would not allow it. Accepting an end
  // token terminates the matcher.
  bool accept(int32_t token);
  // The text so far is a complete sentence (an end token is allowed).
  bool can_end() const;
  // An end token was accepted, or nothing but an end token can follow.
  bool done() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Words of a mask for n_vocab tokens.
inline size_t mask_words(int32_t n_vocab) { return (static_cast<size_t>(n_vocab) + 31) / 32; }

}  // namespace kiln::grammar
