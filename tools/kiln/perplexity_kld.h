// How kiln perplexity --kl-divergence prints what it measured: llama.cpp's llama-perplexity layout (a line
// per chunk with the running figures, then the perplexity, KL-divergence and token-probability statistics),
// or one JSON object.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

#include "quant/kld_stats.h"

namespace kiln::cli {

void print_kld_chunk_header();
void print_kld_chunk_line(int64_t chunk, const kld::Report& running);
void print_kld_summary(const kld::Report& report);
nlohmann::json kld_report_json(const kld::Report& report);

}  // namespace kiln::cli
