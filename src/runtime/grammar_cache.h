// The compiled grammars of Request::constraint, shared by the requests that give the same constraint: a
// cache keyed by (kind, text), made once per engine against the model's vocabulary, bounded by entries and by
// the bytes its grammars hold (grammar::memory_bytes, which grows as requests reach states first used):
// least recently used out first, the newest always kept. A request holds its grammar while it runs, evicted
// or not. A miss compiles on the calling thread (submit()'s, never the engine thread), outside
// the lock: two callers that miss on one key at once both compile, and the first to finish is kept.
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/status.h"
#include "grammar/grammar.h"
#include "kiln/kiln.h"

namespace kiln {

// The constraint's text as GBNF: json_schema through grammar::json_schema_to_gbnf, regex through
// grammar::regex_to_gbnf, gbnf as it is. Errors name the kind ("json_schema: ...") and keep the converter's
// code (invalid_argument, unimplemented, resource_exhausted).
Result<std::string> constraint_gbnf(const OutputConstraint& constraint);

class GrammarCache {
 public:
  GrammarCache(std::shared_ptr<const grammar::Vocabulary> vocab, size_t capacity, size_t max_bytes);

  // The constraint compiled against the vocabulary (kind none: precondition, asserted). Errors: those of
  // constraint_gbnf, grammar::parse_gbnf and grammar::compile, each prefixed with the kind. Failures are not
  // cached. Thread-safe.
  Result<std::shared_ptr<const grammar::CompiledGrammar>> get(const OutputConstraint& constraint);

  size_t size() const;
  // The bytes its grammars hold now (grammar::memory_bytes summed).
  size_t bytes() const;
  uint64_t hits() const;

 private:
  using Key = std::string;  // the kind's letter, then the text
  struct Entry {
    Key key;
    std::shared_ptr<const grammar::CompiledGrammar> grammar;
  };

  std::shared_ptr<const grammar::Vocabulary> vocab_;
  size_t capacity_;
  size_t max_bytes_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // most recently used first; at most capacity_ entries
  std::unordered_map<Key, std::list<Entry>::iterator> index_;
  uint64_t hits_ = 0;

  // Drops least recently used entries, never the newest, while the entries or their bytes exceed the bounds.
  void evict_locked();
};

}  // namespace kiln
