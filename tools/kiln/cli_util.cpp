#include "cli_util.h"

#include <sys/stat.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>

namespace kiln::cli {

void add_spec_options(CLI::App& cmd, SpecOptions& o) {
  cmd.add_option(
         "--spec", o.spec,
         "Speculative decoding, the same tokens faster: ngram (a request drafts the tokens that followed "
         "its last tokens earlier in the prompt or output: fast where the text repeats) or draft (a "
         "smaller model with the same tokenizer drafts: --draft-model)")
      ->check(CLI::IsMember({"none", "ngram", "draft"}));
  cmd.add_option(
         "--draft-model", o.draft_model,
         "GGUF model that drafts (--spec draft, implied): a smaller one of the family, or this one at "
         "fewer bits made by kiln quantize")
      ->check(CLI::ExistingFile);
  cmd.add_option("--draft-max", o.draft_max, "Draft tokens per request and step, 1-64 (with --spec)")
      ->capture_default_str();
  cmd.add_option("--draft-p-min", o.draft_p_min,
                 "--spec draft: drafting stops at a token the draft model gives less than this probability")
      ->capture_default_str();
  cmd.add_flag("--draft-always", o.draft_always,
               "Draft in every decode step (by default a step drafts where drafting has been the faster, as "
               "measured while serving)");
}

void add_tensor_parallel_option(CLI::App& cmd, int32_t& tensor_parallel) {
  cmd.add_option("--tensor-parallel", tensor_parallel,
                 "Split the model over N GPUs (tensor parallelism, -tp N): cuda:0 .. N-1 (from cuda:K with "
                 "-d cuda:K); with -d cpu, N ranks sharing the threads")
      ->check(CLI::Range(1, 64));
}

void add_kv_type_option(CLI::App& cmd, std::string& kv_type) {
  cmd.add_option("--kv-type", kv_type,
                 "KV cache type: f32, f16, q8_0 (8-bit blocks of 32: 1.88x the tokens of f16), q8_64 (8-bit "
                 "blocks of 64: 1.94x), or auto (f16 on a GPU unless --exact, else f32)")
      ->check(CLI::IsMember({"f32", "f16", "q8_0", "q8_64", "auto"}));
}

void SpecOptions::apply(EngineOptions& eo) const {
  eo.speculation = spec;
  eo.draft_model = draft_model;
  eo.draft_max = draft_max;
  eo.draft_p_min = draft_p_min;
  eo.speculation_adaptive = !draft_always;
}

Result<std::string> read_text_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return make_status(StatusCode::not_found, "cannot read {}: {}", path,
                       std::error_code(errno, std::generic_category()).message());
  }
  if (!S_ISREG(st.st_mode)) return invalid_argument("{} is not a regular file", path);
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_status(StatusCode::not_found, "cannot open {}", path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return io_error("cannot read {}", path);
  return text;
}

std::string models_dir() {
  if (const char* d = std::getenv("KILN_MODELS_DIR"); d != nullptr && *d != '\0') return d;
  std::string cache;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0') {
    cache = x;
  } else if (const char* h = std::getenv("HOME"); h != nullptr) {
    cache = std::string(h) + "/.cache";
  } else {
    cache = ".cache";
  }
  return cache + "/kiln/models";
}

std::string default_model_path() { return models_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf"; }

Result<std::string> resolve_model_path(const std::string& path) {
  if (!path.empty()) {
    if (!std::filesystem::exists(path)) return not_found("model not found: {}", path);
    return path;
  }
  std::string def = default_model_path();
  if (!std::filesystem::exists(def)) {
    return not_found("the default model is not at {}; run scripts/fetch-models.sh (or pass -m MODEL)", def);
  }
  return def;
}

Result<uint64_t> parse_byte_size(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return invalid_argument(
        "\"{}\" is not a size: {} (a number with an optional unit K, M, G or T, powers of 1024, "
        "such as 512M or 2G)",
        text, why);
  };
  size_t i = 0;
  uint64_t whole = 0;
  double frac = 0, scale = 0.1;
  if (!text.empty() && (text[0] == '-' || text[0] == '+'))
    return bad("it must be a positive number, no sign");
  const size_t n_digits_start = i;
  for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i) {
    if (whole > (UINT64_MAX - 9) / 10) return bad("it is too large");
    whole = whole * 10 + static_cast<uint64_t>(text[i] - '0');
  }
  if (i == n_digits_start) return bad("it does not start with a number");
  if (i < text.size() && text[i] == '.') {
    ++i;
    const size_t frac_start = i;
    for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i, scale /= 10) {
      frac += (text[i] - '0') * scale;
    }
    if (i == frac_start) return bad("no digits after the decimal point");
  }
  int shift = 0;  // log2 of the unit
  if (i < text.size()) {
    switch (std::toupper(static_cast<unsigned char>(text[i]))) {
      case 'K': shift = 10; break;
      case 'M': shift = 20; break;
      case 'G': shift = 30; break;
      case 'T': shift = 40; break;
      case 'B': shift = -1; break;  // bytes: only "B" may follow
      default: return bad(fmt::format("unknown unit '{}'", text[i]));
    }
    ++i;
    std::string_view rest = text.substr(i);
    if (shift < 0) {
      shift = 0;
      if (!rest.empty()) return bad(fmt::format("unexpected \"{}\" after the unit", rest));
    } else if (!rest.empty() && rest != "B" && rest != "b" && rest != "iB" && rest != "ib") {
      return bad(fmt::format("unexpected \"{}\" after the unit", rest));
    }
  }
  const long double bytes =
      (static_cast<long double>(whole) + frac) * static_cast<long double>(uint64_t{1} << shift);
  if (bytes >= static_cast<long double>(uint64_t{1} << 63))
    return bad("it is too large (at most 2^63 bytes)");
  const auto out = static_cast<uint64_t>(bytes);
  if (out == 0) return bad("it must be at least one byte");
  return out;
}

int report_error(const char* cmd, const Status& status) {
  std::fprintf(stderr, "kiln %s: error: %s\n", cmd, status.message().c_str());
  switch (status.code()) {
    case StatusCode::not_found: return 2;
    case StatusCode::invalid_argument: return 3;
    case StatusCode::unimplemented: return 4;
    default: return 1;
  }
}

}  // namespace kiln::cli
