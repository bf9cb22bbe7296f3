#include "tokenizer/load.h"

#include <filesystem>

#include "formats/folder.h"
#include "formats/gguf.h"
#include "formats/hf_config.h"
#include "formats/json_file.h"

namespace kiln {

Result<Tokenizer> load_tokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path dir(path);
    const fs::path tokenizer_json = dir / "tokenizer.json";
    if (!fs::exists(tokenizer_json, ec)) return not_found("{}: no tokenizer.json in the folder", path);
    std::optional<nlohmann::json> config;
    const fs::path config_path = dir / "tokenizer_config.json";
    KILN_TRY(check_in_folder(path, tokenizer_json.string()));
    KILN_TRY(check_in_folder(path, config_path.string()));
    if (fs::exists(config_path, ec)) {
      // Validated by TokenizerConfig (types of bos_token, add_bos_token...), then passed on raw.
      KILN_ASSIGN_OR_RETURN(hf::TokenizerConfig tc, hf::TokenizerConfig::load(config_path.string()));
      config = tc.raw();
    }
    return Tokenizer::from_hf_json(tokenizer_json.string(), config);
  }
  if (!fs::exists(path, ec)) return not_found("{}: no such file or folder", path);
  KILN_ASSIGN_OR_RETURN(gguf::File f, gguf::File::open(path));
  return Tokenizer::from_gguf(f);
}

}  // namespace kiln
