// kiln tokenize [-m MODEL] [--ids|--pieces] TEXT: the model's token ids for a text.
#include <fmt/format.h>

#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>

#include "cli_util.h"
#include "commands.h"
#include "tokenizer/load.h"
#include "tokenizer/unicode.h"

namespace kiln::cli {
namespace {

struct TokenizeOptions {
  std::string model;
  std::string text;
  bool ids_only = false;
  bool pieces_only = false;
  bool no_bos = false;
  bool no_parse_special = false;
};

// A piece shown between quotes: control characters escaped, and so is every byte that is not part of a
// whole UTF-8 character (a byte token, or half of a character split over two tokens).
std::string quoted(const std::string& s) {
  std::string out = "'";
  uint32_t cp = 0;
  for (size_t pos = 0; pos < s.size();) {
    const auto c = static_cast<unsigned char>(s[pos]);
    const size_t len = unicode::utf8_decode(s, pos, cp);
    if (len > 1) {
      out.append(s, pos, len);
      pos += len;
      continue;
    }
    ++pos;
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\'' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (len == 0 || c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "'";
}

Status run_tokenize(const TokenizeOptions& opt) {
  KILN_ASSIGN_OR_RETURN(std::string path, resolve_model_path(opt.model));
  KILN_ASSIGN_OR_RETURN(Tokenizer tok, load_tokenizer(path));
  std::string text = opt.text;
  if (text == "-") text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  const std::vector<int32_t> ids = tok.encode(text, !opt.no_bos, !opt.no_parse_special);
  if (opt.ids_only) {
    std::string line = "[";
    for (size_t i = 0; i < ids.size(); ++i) line += fmt::format("{}{}", i ? ", " : "", ids[i]);
    std::printf("%s]\n", line.c_str());
  } else if (opt.pieces_only) {
    std::string line = "[";
    for (size_t i = 0; i < ids.size(); ++i)
      line += fmt::format("{}{}", i ? ", " : "", quoted(tok.token_to_piece(ids[i])));
    std::printf("%s]\n", line.c_str());
  } else {
    for (int32_t id : ids) std::printf("%6d -> %s\n", id, quoted(tok.token_to_piece(id)).c_str());
  }
  std::fflush(stdout);
  std::fprintf(stderr, "%zu tokens\n", ids.size());
  return Status();
}

}  // namespace

void register_tokenize(CLI::App& app, int& rc) {
  auto opt = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Show the token ids (and pieces) of a text");
  cmd->add_option("-m,--model", opt->model,
                  "A GGUF file or a Hugging Face model folder (default: the default model)");
  cmd->add_option("text", opt->text, "The text; '-' reads standard input")->required();
  auto* ids = cmd->add_flag("--ids", opt->ids_only, "Print only the ids, as a list");
  cmd->add_flag("--pieces", opt->pieces_only, "Print only the pieces, as a list")->excludes(ids);
  cmd->add_flag("--no-bos", opt->no_bos, "Do not add the BOS/EOS tokens the model would add");
  cmd->add_flag("--no-parse-special", opt->no_parse_special,
                "Treat special-token text (e.g. '<|im_start|>') as plain text");
  cmd->callback([opt, &rc] {
    Status s = run_tokenize(*opt);
    if (!s.ok()) rc = report_error("tokenize", s);
  });
}

}  // namespace kiln::cli
