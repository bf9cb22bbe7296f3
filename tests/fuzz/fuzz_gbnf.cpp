// libFuzzer target: arbitrary bytes as GBNF. Every input must end in a Status or a grammar that compiles and
// matches a few tokens over a small vocabulary — never a crash, a sanitizer report, a hang or an unbounded
// allocation.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"

namespace {

std::shared_ptr<const kiln::grammar::Vocabulary> small_vocab() {
  auto v = std::make_shared<kiln::grammar::Vocabulary>();
  for (int b = 1; b < 256; ++b) v->bytes.emplace_back(1, static_cast<char>(b));
  for (const char* t : {"\xCE\xB1", "\xE2\x82\xAC", "ab", "{\"", "\":", "12", " ", "  "})
    v->bytes.emplace_back(t);
  v->bytes.emplace_back("");
  v->excluded.assign(v->bytes.size(), 0);
  v->end_ids = {static_cast<int32_t>(v->bytes.size()) - 1};
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto vocab = small_vocab();
  kiln::grammar::Limits limits;
  limits.max_states = 20'000;
  limits.max_repeat = 100;
  auto g = kiln::grammar::parse_gbnf(std::string_view(reinterpret_cast<const char*>(data), size), limits);
  if (!g.ok()) return 0;
  auto cg = kiln::grammar::compile(*g, vocab);
  if (!cg.ok()) return 0;
  kiln::grammar::Matcher m(*cg);
  std::vector<uint32_t> words(kiln::grammar::mask_words(vocab->n_vocab()));
  for (int step = 0; step < 8 && !m.done(); ++step) {
    m.fill_mask(words);
    int32_t pick = -1;
    for (int32_t id = 0; id < vocab->n_vocab() && pick < 0; ++id) {
      if (words[static_cast<size_t>(id) / 32] >> (id % 32) & 1u) pick = id;
    }
    if (pick < 0 || !m.accept(pick)) break;
  }
  return 0;
}
