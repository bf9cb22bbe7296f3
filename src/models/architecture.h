// What one architecture file exports: its factory and what it loads from a Hugging Face folder. registry.cpp
// lists them, one line each.
#pragma once

#include <memory>

#include "models/hf_import.h"
#include "models/model.h"

namespace kiln {

struct Architecture {
  // Builds the model from a GGUF file (on disk, or assembled from a Hugging Face folder by hf_import).
  Result<std::unique_ptr<Model>> (*make)(std::shared_ptr<const gguf::File> file, Backend& backend,
                                         const ModelOptions& options);
  hf_import::HfSpec hf;  // hf.hf_classes empty: GGUF files only
};

}  // namespace kiln
