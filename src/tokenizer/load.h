// A tokenizer from a model path: a GGUF file, or a Hugging Face model folder (tokenizer.json, with
// tokenizer_config.json for bos/eos and add_bos_token when present).
#pragma once

#include <string>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

// Errors: not_found when the path does not exist or a folder has no tokenizer.json; any error of the
// files read.
Result<Tokenizer> load_tokenizer(const std::string& path);

}  // namespace kiln
