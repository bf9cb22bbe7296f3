#include "runtime/grammar_cache.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "grammar/json_schema.h"
#include "grammar/regex.h"

namespace kiln {

namespace {

const char* kind_name(OutputConstraint::Kind k) {
  switch (k) {
    case OutputConstraint::Kind::none: return "none";
    case OutputConstraint::Kind::gbnf: return "gbnf";
    case OutputConstraint::Kind::json_schema: return "json_schema";
    case OutputConstraint::Kind::regex: return "regex";
  }
  return "none";
}

// The status with "constraint (<kind>): " before its message, its code kept.
Status in_constraint(OutputConstraint::Kind k, const Status& st) {
  return make_status(st.code(), "constraint ({}): {}", kind_name(k), st.message());
}

}  // namespace

Result<std::string> constraint_gbnf(const OutputConstraint& c) {
  switch (c.kind) {
    case OutputConstraint::Kind::none: break;
    case OutputConstraint::Kind::gbnf: return c.text;
    case OutputConstraint::Kind::regex: {
      Result<std::string> g = grammar::regex_to_gbnf(c.text);
      if (!g.ok()) return in_constraint(c.kind, g.status());
      return g;
    }
    case OutputConstraint::Kind::json_schema: {
      nlohmann::ordered_json schema;
      try {
        schema = nlohmann::ordered_json::parse(c.text);
      } catch (const nlohmann::json::exception& e) {
        return invalid_argument("constraint (json_schema): the schema is not JSON: {}", e.what());
      }
      Result<std::string> g = grammar::json_schema_to_gbnf(schema);
      if (!g.ok()) return in_constraint(c.kind, g.status());
      return g;
    }
  }
  return invalid_argument("constraint: kind none has no grammar");
}

GrammarCache::GrammarCache(std::shared_ptr<const grammar::Vocabulary> vocab, size_t capacity,
                           size_t max_bytes)
    : vocab_(std::move(vocab)), capacity_(capacity), max_bytes_(max_bytes) {
  KILN_ASSERT(vocab_ != nullptr && capacity_ > 0);
}

Result<std::shared_ptr<const grammar::CompiledGrammar>> GrammarCache::get(const OutputConstraint& c) {
  KILN_ASSERT(c.kind != OutputConstraint::Kind::none);
  Key key(1, static_cast<char>('0' + static_cast<int>(c.kind)));
  key += c.text;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      ++hits_;
      evict_locked();  // the grammars grow as requests use them
      return lru_.front().grammar;
    }
  }
  KILN_ASSIGN_OR_RETURN(const std::string gbnf, constraint_gbnf(c));
  Result<std::shared_ptr<const grammar::Grammar>> parsed = grammar::parse_gbnf(gbnf);
  if (!parsed.ok()) return in_constraint(c.kind, parsed.status());
  Result<std::shared_ptr<const grammar::CompiledGrammar>> compiled = grammar::compile(*parsed, vocab_);
  if (!compiled.ok()) return in_constraint(c.kind, compiled.status());

  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = index_.find(key); it != index_.end()) {  // another caller compiled it meanwhile
    lru_.splice(lru_.begin(), lru_, it->second);
    return it->second->grammar;
  }
  lru_.push_front(Entry{key, *compiled});
  index_.emplace(std::move(key), lru_.begin());
  evict_locked();
  return lru_.front().grammar;
}

void GrammarCache::evict_locked() {
  size_t total = 0;
  for (const Entry& e : lru_) total += grammar::memory_bytes(*e.grammar);
  while (lru_.size() > 1 && (lru_.size() > capacity_ || total > max_bytes_)) {
    total -= std::min(total, grammar::memory_bytes(*lru_.back().grammar));
    index_.erase(lru_.back().key);
    lru_.pop_back();
  }
}

size_t GrammarCache::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t total = 0;
  for (const Entry& e : lru_) total += grammar::memory_bytes(*e.grammar);
  return total;
}

size_t GrammarCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lru_.size();
}

uint64_t GrammarCache::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

}  // namespace kiln
