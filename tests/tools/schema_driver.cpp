// Matches texts against JSON schemas for tests/python/test_schema_suite.py: each schema's GBNF
// (json_schema_to_gbnf) compiled over a vocabulary of the 256 single bytes plus an end token.
// stdin: JSON lines {"schema": {...}, "texts": ["...", ...]}; stdout: one JSON line each,
//   {"ok": true, "accepted": [bool, ...]} or {"ok": false, "error": "<code>: <message>"}.
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"

namespace {

using Json = nlohmann::ordered_json;

std::shared_ptr<const kiln::grammar::Vocabulary> byte_vocabulary() {
  auto v = std::make_shared<kiln::grammar::Vocabulary>();
  for (int b = 0; b < 256; ++b) v->bytes.emplace_back(1, static_cast<char>(b));
  v->bytes.emplace_back("");  // 256: the end token
  v->excluded.assign(v->bytes.size(), 0);
  v->end_ids = {256};
  return v;
}

Json run(const Json& request, const std::shared_ptr<const kiln::grammar::Vocabulary>& vocab) {
  auto fail = [](const kiln::Status& s) { return Json{{"ok", false}, {"error", s.to_string()}}; };
  auto gbnf = kiln::grammar::json_schema_to_gbnf(request.at("schema"));
  if (!gbnf.ok()) return fail(gbnf.status());
  auto grammar = kiln::grammar::parse_gbnf(*gbnf);
  if (!grammar.ok()) return fail(grammar.status());
  auto compiled = kiln::grammar::compile(*grammar, vocab);
  if (!compiled.ok()) return fail(compiled.status());
  Json accepted = Json::array();
  for (const auto& t : request.at("texts")) {
    kiln::grammar::Matcher m(*compiled);
    bool ok = true;
    for (unsigned char c : t.get<std::string>()) {
      if (!m.accept(c)) {
        ok = false;
        break;
      }
    }
    accepted.push_back(ok && m.can_end() && m.accept(256));
  }
  return Json{{"ok", true}, {"accepted", accepted}};
}

}  // namespace

int main() {
  const auto vocab = byte_vocabulary();
  std::string line;
  while (std::getline(std::cin, line)) {
    Json out;
    try {
      out = run(Json::parse(line), vocab);
    } catch (const std::exception& e) {
      out = Json{{"ok", false}, {"error", std::string("bad request: ") + e.what()}};
    }
    std::cout << out.dump() << std::endl;
  }
  return 0;
}
