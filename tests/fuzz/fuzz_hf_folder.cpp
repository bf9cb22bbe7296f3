// libFuzzer target: arbitrary bytes as a Hugging Face model folder, loaded as `kiln run DIR` and
// `kiln convert DIR` load it: config.json, the safetensors files and their index, the tokenizer files and
// the chat template, imported as a GGUF, the model loaded on the CPU, the tokenizer loaded. Every input
// must end in a model or a Status: never a crash, a sanitizer report, a hang or an unbounded allocation.
//
// An input is a list of files, each introduced by a line "@@ NAME" (NAME one of kNames below) and holding
// the bytes up to the next such line; bytes before the first are ignored. The seed is a tiny Llama folder.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "backends/backend.h"
#include "models/model.h"
#include "tokenizer/load.h"

namespace {

constexpr std::string_view kNames[] = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
};

// One folder per process, emptied before each input, and removed when the process exits (libFuzzer ends
// with exit(), which runs this destructor).
class Folder {
 public:
  Folder() {
    char tmpl[] = "/tmp/kiln_fuzz_hf_XXXXXX";
    if (mkdtemp(tmpl) == nullptr) std::abort();
    dir_ = tmpl;
  }
  ~Folder() {
    empty();
    rmdir(dir_.c_str());
  }
  Folder(const Folder&) = delete;
  Folder& operator=(const Folder&) = delete;
  const std::string& dir() const { return dir_; }
  void empty() const {
    for (std::string_view name : kNames) unlink((dir_ + "/" + std::string(name)).c_str());
  }

 private:
  std::string dir_;
};

const Folder& folder() {
  static const Folder f;
  return f;
}

void write_file(const std::string& path, std::string_view bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
  std::fclose(f);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  folder().empty();
  const std::string& dir = folder().dir();
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  constexpr std::string_view kMark = "@@ ";
  size_t at = in.starts_with(kMark) ? 0 : in.find("\n@@ ");
  while (at != std::string_view::npos) {
    if (in[at] == '\n') ++at;
    const size_t eol = in.find('\n', at);
    if (eol == std::string_view::npos) break;
    const std::string_view name = in.substr(at + kMark.size(), eol - at - kMark.size());
    size_t next = in.find("\n@@ ", eol);
    const std::string_view body =
        in.substr(eol + 1, (next == std::string_view::npos ? in.size() : next) - eol - 1);
    for (std::string_view known : kNames) {
      if (name == known) write_file(dir + "/" + std::string(name), body);
    }
    at = next;
  }

  auto file = kiln::import_hf_folder(dir);
  if (!file.ok()) return 0;
  auto backend = kiln::make_backend("cpu", kiln::BackendOptions{1});
  if (!backend.ok()) std::abort();
  auto model = kiln::load_model(*file, **backend, kiln::ModelOptions{.n_ctx = 64});
  auto tok = kiln::load_tokenizer(dir);
  (void)model;
  (void)tok;
  return 0;
}
