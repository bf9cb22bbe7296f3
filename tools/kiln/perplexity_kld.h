// How kiln perplexity --kl-divergence prints what it measured: llama.cpp's llama-perplexity layout (a line
// per chunk with the running figures, then the perplexity, KL-divergence and token-probability statistics),
// or one JSON object.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"
#include "quant/kld_stats.h"

namespace kiln::cli {

void print_kld_chunk_header();
void print_kld_chunk_line(int64_t chunk, const kld::Report& running);
void print_kld_summary(const kld::Report& report);
nlohmann::json kld_report_json(const kld::Report& report);

// kiln perplexity --kl-divergence run in-process, printing nothing (kiln quantize --target-kld): `model`'s
// distributions against those of the base file `base` (--kl-divergence-base), on its tokens.
struct KldScoreOptions {
  std::string model, base;
  std::string device = "auto";
  int32_t gpu_layers = -1;
  int32_t threads = 0;
};
Result<kld::Report> score_kld(const KldScoreOptions& o);

}  // namespace kiln::cli
