// Writes a vocab-only GGUF (tokenizer metadata, no tensors) for tests/python/test_tokenizer_export.py.
// usage: tokenizer_export_driver <tokenizer: GGUF file or Hugging Face folder> <out.gguf>
//                                [--n-vocab N] [--arch NAME]
// The tokenizer comes from load_tokenizer(path); the chat template from the GGUF's tokenizer.chat_template
// or the folder's tokenizer_config.json "chat_template" / chat_template.jinja. general.architecture is the
// source GGUF's, else --arch (default "llama"), with small placeholder hyper-parameters for it so that
// llama.cpp accepts the file with vocab_only. --n-vocab: the embedding rows to pad the token list to.
// stdout: one JSON line, {"ok": true, "n_tokens", "pre", "model"} or {"ok": false, "error"} (exit 1).
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>

#include "formats/gguf.h"
#include "formats/json_file.h"
#include "tokenizer/gguf_export.h"
#include "tokenizer/load.h"

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

struct Source {
  std::string arch;
  std::optional<std::string> chat_template;
};

kiln::Result<Source> read_source(const std::string& path, const std::string& default_arch) {
  Source s{default_arch, std::nullopt};
  if (fs::is_directory(path)) {
    const fs::path config = fs::path(path) / "tokenizer_config.json";
    if (fs::exists(config)) {
      KILN_ASSIGN_OR_RETURN(json c,
                            kiln::json_file::read(config.string(), kiln::json_file::kMaxTokenizerBytes));
      if (c.is_object() && c.contains("chat_template") && c["chat_template"].is_string()) {
        s.chat_template = c["chat_template"].get<std::string>();
      }
    }
    const fs::path jinja = fs::path(path) / "chat_template.jinja";
    if (!s.chat_template && fs::exists(jinja)) {
      std::ifstream in(jinja, std::ios::binary);
      std::ostringstream text;
      text << in.rdbuf();
      s.chat_template = text.str();
    }
    return s;
  }
  KILN_ASSIGN_OR_RETURN(kiln::gguf::File f, kiln::gguf::File::open(path));
  if (!f.architecture().empty()) s.arch = f.architecture();
  KILN_ASSIGN_OR_RETURN(std::string tmpl, f.get_string_or("tokenizer.chat_template", ""));
  if (!tmpl.empty()) s.chat_template = tmpl;
  return s;
}

kiln::Status run(const std::string& in, const std::string& out, int32_t n_vocab, const std::string& arch,
                 json& summary) {
  KILN_ASSIGN_OR_RETURN(kiln::Tokenizer tok, kiln::load_tokenizer(in));
  KILN_ASSIGN_OR_RETURN(Source src, read_source(in, arch));
  using kiln::gguf::Value;
  kiln::gguf::Writer w;
  w.set("general.architecture", Value::str(src.arch));
  w.set("general.name", Value::str("tokenizer"));
  // Placeholders: llama.cpp reads these before the vocabulary even with vocab_only.
  w.set(src.arch + ".context_length", Value::u32(2048));
  w.set(src.arch + ".embedding_length", Value::u32(64));
  w.set(src.arch + ".block_count", Value::u32(1));
  w.set(src.arch + ".feed_forward_length", Value::u32(128));
  w.set(src.arch + ".attention.head_count", Value::u32(1));
  w.set(src.arch + ".attention.head_count_kv", Value::u32(1));
  w.set(src.arch + ".attention.layer_norm_rms_epsilon", Value::f32(1e-6f));
  KILN_TRY(kiln::write_gguf_tokenizer(tok, w, n_vocab > 0 ? n_vocab : tok.n_vocab(), src.chat_template));
  KILN_TRY(w.write(out));
  KILN_ASSIGN_OR_RETURN(kiln::gguf::File f, kiln::gguf::File::open(out));
  KILN_ASSIGN_OR_RETURN(auto tokens, f.get_string_array("tokenizer.ggml.tokens"));
  KILN_ASSIGN_OR_RETURN(std::string pre, f.get_string("tokenizer.ggml.pre"));
  KILN_ASSIGN_OR_RETURN(std::string model, f.get_string("tokenizer.ggml.model"));
  summary = {{"ok", true}, {"n_tokens", tokens.size()}, {"pre", pre}, {"model", model}, {"arch", src.arch}};
  return kiln::Status::ok_status();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: tokenizer_export_driver <tokenizer path> <out.gguf> [--n-vocab N] [--arch NAME]\n";
    return 2;
  }
  int32_t n_vocab = 0;
  std::string arch = "llama";
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--n-vocab") {
      n_vocab = static_cast<int32_t>(std::stol(argv[i + 1]));
    } else if (flag == "--arch") {
      arch = argv[i + 1];
    } else {
      std::cerr << "unknown flag " << flag << "\n";
      return 2;
    }
  }
  json summary;
  const kiln::Status st = run(argv[1], argv[2], n_vocab, arch, summary);
  if (!st.ok()) {
    std::cout << json{{"ok", false}, {"error", st.message()}}.dump() << "\n";
    return 1;
  }
  std::cout << summary.dump() << "\n";
  return 0;
}
