#include "quant/hf_folder.h"

#include <optional>

#include "backends/backend.h"
#include "formats/hf_config.h"
#include "models/model.h"
#include "tokenizer/gguf_export.h"
#include "tokenizer/load.h"

namespace kiln::quant {

Result<std::shared_ptr<const gguf::File>> open_hf_folder(const std::string& folder) {
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<const gguf::File> file, import_hf_folder(folder));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Backend> cpu, make_backend("cpu", BackendOptions{1}));
  KILN_ASSIGN_OR_RETURN(const std::unique_ptr<Model> model, load_model(file, *cpu));
  return file;
}

Status set_hf_folder_keys(const std::string& folder, const gguf::File& file, gguf::Writer& w) {
  KILN_ASSIGN_OR_RETURN(const Tokenizer tok, load_tokenizer(folder));
  KILN_ASSIGN_OR_RETURN(const hf::ModelFolder hf_folder, hf::ModelFolder::open(folder));
  std::optional<std::string> chat_template;
  if (hf_folder.tokenizer_config && hf_folder.tokenizer_config->chat_template() != nullptr)
    chat_template = hf_folder.tokenizer_config->chat_template()->source;
  const gguf::TensorInfo* embd = file.find_tensor("token_embd.weight");
  if (embd == nullptr || embd->shape.size() != 2)
    return invalid_argument("{}: the model has no 2-d token embedding", folder);
  for (const auto& [k, v] : file.metadata()) w.set(k, v);
  return write_gguf_tokenizer(tok, w, static_cast<int32_t>(embd->shape[1]), chat_template);
}

}  // namespace kiln::quant
