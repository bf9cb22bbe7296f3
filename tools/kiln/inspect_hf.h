// kiln inspect on a Hugging Face model folder (config.json, safetensors, tokenizer files).
#pragma once

#include <string>

#include "core/status.h"

namespace kiln::cli {

Status inspect_hf_dir(const std::string& dir, bool show_tensors);

}  // namespace kiln::cli
