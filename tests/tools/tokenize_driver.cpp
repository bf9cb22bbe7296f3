// Tokenizes batches for tests/python/test_tokenizer.py, in one process per tokenizer.
// usage: tokenize_driver gguf <model.gguf> | tokenize_driver hf <tokenizer.json> [<tokenizer_config.json>]
//        | tokenize_driver load <path>   (load_tokenizer: a GGUF file or a Hugging Face folder)
// stdout line 1: {"ok": true, "n_vocab", "bos", "eos", "eog": [...], "load_ms"} or {"ok": false, "error"}.
// stdin: JSON lines, one request each; stdout: one JSON line per request:
//   {"text": "...", "add_special": bool, "parse_special": bool}
//     -> {"ids": [...], "decoded": decode(ids, skip_special=false), "decoded_skip": decode(ids, true),
//         "stream": the StreamDecoder's chunks joined, "stream_split_char": a chunk ended inside a character}
//   {"decode": [ids], "skip_special": bool} -> {"ok": true, "text": "..."} | {"ok": false, "error": "..."}
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "formats/gguf.h"
#include "formats/json_file.h"
#include "tokenizer/load.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace {

using nlohmann::json;

kiln::Result<kiln::Tokenizer> open(int argc, char** argv) {
  const std::string mode = argv[1], path = argv[2];
  if (mode == "gguf") {
    KILN_ASSIGN_OR_RETURN(kiln::gguf::File f, kiln::gguf::File::open(path));
    return kiln::Tokenizer::from_gguf(f);
  }
  if (mode == "hf") {
    std::optional<json> config;
    if (argc > 3) {
      KILN_ASSIGN_OR_RETURN(config, kiln::json_file::read(argv[3], kiln::json_file::kMaxTokenizerBytes));
    }
    return kiln::Tokenizer::from_hf_json(path, config);
  }
  return kiln::load_tokenizer(path);
}

json encode_request(const kiln::Tokenizer& tok, const json& req) {
  const std::string text = req.at("text").get<std::string>();
  const auto ids = tok.encode(text, req.value("add_special", true), req.value("parse_special", true));
  json out = {{"ids", ids}};
  auto decoded = tok.decode(ids, false);
  auto decoded_skip = tok.decode(ids, true);
  out["decoded"] = decoded.ok() ? *decoded : "<error: " + decoded.status().message() + ">";
  out["decoded_skip"] =
      decoded_skip.ok() ? *decoded_skip : "<error: " + decoded_skip.status().message() + ">";
  kiln::StreamDecoder sd(tok, /*skip_special=*/false);
  std::string stream;
  bool split_char = false;
  for (int32_t id : ids) {
    auto chunk = sd.feed(id);
    if (!chunk.ok()) return {{"error", chunk.status().message()}};
    // A chunk of valid text must end on a character boundary.
    if (kiln::unicode::utf8_complete_prefix(*chunk) != chunk->size()) split_char = true;
    stream += *chunk;
  }
  stream += sd.flush();
  out["stream"] = stream;
  out["stream_split_char"] = split_char;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: tokenize_driver gguf|hf|load <path> [<tokenizer_config.json>]\n";
    return 2;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto tok = open(argc, argv);
  const double load_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const auto dump = [](const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); };
  if (!tok.ok()) {
    std::cout << dump({{"ok", false}, {"error", tok.status().to_string()}}) << std::endl;
    return 1;
  }
  std::cout << dump({{"ok", true},
                     {"n_vocab", tok->n_vocab()},
                     {"bos", tok->bos_id()},
                     {"eos", tok->eos_id()},
                     {"eog", tok->eog_ids()},
                     {"load_ms", load_ms}})
            << "\n";
  std::string line;
  while (std::getline(std::cin, line)) {
    json req = json::parse(line, nullptr, /*allow_exceptions=*/false);
    json out;
    if (req.is_discarded() || !req.is_object()) {
      out = {{"error", "request is not a JSON object"}};
    } else if (req.contains("decode")) {
      auto text = tok->decode(req["decode"].get<std::vector<int32_t>>(), req.value("skip_special", false));
      out = text.ok() ? json{{"ok", true}, {"text", *text}}
                      : json{{"ok", false}, {"error", text.status().message()}};
    } else {
      out = encode_request(*tok, req);
    }
    std::cout << dump(out) << "\n";
  }
  return 0;
}
