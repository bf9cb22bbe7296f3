// A Hugging Face folder as the quantization tools write it to GGUF: the tensors and metadata the model code
// imports (models/hf_import.h), checked by loading the model, and the tokenizer and chat template as GGUF
// keys.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "formats/gguf.h"

namespace kiln::quant {

// The folder as a GGUF file in memory. The model code checks every tensor it needs (present, shaped as the
// hyper-parameters say) first: a folder kiln could not run is an error here, before anything is written.
Result<std::shared_ptr<const gguf::File>> open_hf_folder(const std::string& folder);

// Sets on `w` the metadata of `file` (opened by open_hf_folder from `folder`), the folder's tokenizer as
// tokenizer.ggml.* keys and its chat template. Errors: a tokenizer GGUF keys cannot express, no 2-d token
// embedding.
Status set_hf_folder_keys(const std::string& folder, const gguf::File& file, gguf::Writer& w);

}  // namespace kiln::quant
