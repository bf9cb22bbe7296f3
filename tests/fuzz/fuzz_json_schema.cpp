// libFuzzer target: arbitrary bytes as a JSON schema (when they parse as JSON) or else as a regular
// expression (regex_to_gbnf, and a string schema with that pattern). Every input must end in a Status or in
// GBNF that parse_gbnf accepts (a converter that writes GBNF the engine refuses is a bug: abort), then
// compiles and matches a few byte tokens — never a crash, a sanitizer report, a hang or an unbounded
// allocation.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"

namespace {

std::shared_ptr<const kiln::grammar::Vocabulary> byte_vocab() {
  auto v = std::make_shared<kiln::grammar::Vocabulary>();
  for (int b = 0; b < 256; ++b) v->bytes.emplace_back(1, static_cast<char>(b));
  v->bytes.emplace_back("");
  v->excluded.assign(v->bytes.size(), 0);
  v->end_ids = {256};
  return v;
}

void check(const kiln::Result<std::string>& gbnf) {
  static const auto vocab = byte_vocab();
  if (!gbnf.ok()) return;
  kiln::grammar::Limits limits;
  limits.max_states = 50'000;
  auto g = kiln::grammar::parse_gbnf(*gbnf, limits);
  if (!g.ok()) {
    if (g.status().code() == kiln::StatusCode::resource_exhausted) return;
    std::fprintf(stderr, "written GBNF does not parse: %s\n%s\n", g.status().to_string().c_str(),
                 gbnf->c_str());
    std::abort();
  }
  auto cg = kiln::grammar::compile(*g, vocab, limits);
  if (!cg.ok()) return;
  kiln::grammar::Matcher m(*cg);
  std::vector<uint32_t> words(kiln::grammar::mask_words(vocab->n_vocab()));
  for (int step = 0; step < 16 && !m.done(); ++step) {
    m.fill_mask(words);
    int32_t pick = -1;
    for (int32_t id = 0; id < vocab->n_vocab() && pick < 0; ++id) {
      if (words[static_cast<size_t>(id) / 32] >> (id % 32) & 1u) pick = id;
    }
    if (pick < 0 || !m.accept(pick)) break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto schema = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!schema.is_discarded()) {
    check(kiln::grammar::json_schema_to_gbnf(schema));
    return 0;
  }
  check(kiln::grammar::regex_to_gbnf(text));
  nlohmann::ordered_json s = {{"type", "string"}, {"pattern", std::string(text)}};
  check(kiln::grammar::json_schema_to_gbnf(s));
  return 0;
}
