// The cost of a grammar's token mask (grammar::Matcher::fill_mask) on a model's vocabulary: compiles each
// grammar, walks a token path (the tokenized document next to it, GRAMMAR with .txt for .gbnf; where the
// tokenization leaves the grammar, the lowest allowed token instead) and times fill_mask at each step.
//
//   grammar_mask_bench MODEL.gguf GRAMMAR.gbnf... [--check]
//
// Prints per grammar: automaton states, compile ms (the vocabulary's token trie, built once per vocabulary,
// apart) and its work (trie nodes walked + uncertain tokens recorded, in millions), steps, fill_mask median /
// p90 / max microseconds. --check also compares each mask with the reference mask (slow).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "bench_args.h"
#include "formats/gguf.h"
#include "grammar/automaton.h"
#include "grammar/grammar.h"
#include "grammar/mask_cache.h"
#include "grammar/token_trie.h"
#include "grammar/vocabulary.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace kiln;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    std::exit(1);
  }
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

void run(const Tokenizer& tok, const std::shared_ptr<const grammar::Vocabulary>& vocab,
         const std::string& path, bool check) {
  const std::string text = read_file(path);
  const std::string doc_path = path.substr(0, path.rfind('.')) + ".txt";
  const std::string doc = read_file(doc_path);
  auto t0 = Clock::now();
  auto g = bench::check(grammar::parse_gbnf(text), "parse_gbnf");
  const double parse_ms = ms_since(t0);
  t0 = Clock::now();
  auto cg = bench::check(grammar::compile(g, vocab), "compile");
  const double compile_ms = ms_since(t0);

  grammar::Matcher m(cg);
  const int32_t n = vocab->n_vocab();
  std::vector<uint32_t> words(grammar::mask_words(n)), ref(words.size());
  const std::vector<int32_t> ids = tok.encode(doc, false, false);
  std::vector<double> us;
  size_t next = 0, fallbacks = 0, mismatches = 0;
  while (!m.done() && us.size() < 4096) {
    t0 = Clock::now();
    m.fill_mask(words);
    us.push_back(ms_since(t0) * 1000.0);
    if (check) {
      m.fill_mask_reference(ref);
      mismatches += words != ref ? 1 : 0;
    }
    auto allowed = [&](int32_t id) { return (words[static_cast<size_t>(id) / 32] >> (id % 32) & 1u) != 0; };
    int32_t pick = -1;
    if (next < ids.size() && allowed(ids[next])) {
      pick = ids[next++];
    } else {
      for (int32_t id = 0; id < n && pick < 0; ++id) {
        if (allowed(id) && !vocab->bytes[static_cast<size_t>(id)].empty()) pick = id;
      }
      if (pick < 0) break;  // only an end token
      ++fallbacks;
      if (next >= ids.size() && m.can_end()) break;  // the document is done; do not wander
    }
    if (!m.accept(pick)) {
      std::fprintf(stderr, "%s: accept(%d) refused a token the mask allowed\n", path.c_str(), pick);
      std::exit(1);
    }
  }
  std::printf(
      "%-14s states %6d  parse %6.2f ms  compile %7.1f ms (%5.1fM walk)  steps %5zu (doc %zu/%zu, fallback "
      "%zu)  "
      "fill_mask us: median %7.1f  p90 %7.1f  max %8.1f%s\n",
      path.substr(path.rfind('/') + 1).c_str(), g->n_states(), parse_ms, compile_ms,
      static_cast<double>(cg->compile_work) / 1e6, us.size(), next, ids.size(), fallbacks,
      percentile(us, 0.5), percentile(us, 0.9), percentile(us, 1.0),
      check ? (mismatches == 0 ? "  check ok" : "  CHECK FAILED") : "");
  if (check && mismatches != 0) std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL.gguf GRAMMAR.gbnf... [--check]\n", argv[0]);
    return 2;
  }
  bool check = false;
  std::vector<std::string> grammars;
  for (int i = 2; i < argc; ++i) {
    if (std::string(argv[i]) == "--check") {
      check = true;
    } else {
      grammars.emplace_back(argv[i]);
    }
  }
  auto file = bench::check(gguf::File::open(argv[1]), "open");
  auto tok = bench::check(Tokenizer::from_gguf(file), "tokenizer");
  auto vocab = grammar::vocabulary_from(tok);
  auto t0 = Clock::now();
  auto trie = grammar::token_trie_for(vocab);
  std::printf("%s: %d tokens, token trie %zu nodes in %.1f ms\n", argv[1], vocab->n_vocab(),
              trie->nodes.size(), ms_since(t0));
  for (const std::string& g : grammars) run(tok, vocab, g, check);
  return 0;
}
