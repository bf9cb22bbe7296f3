// Formatting shared by the inspect views.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::cli {

// 1536 -> "1.50 KiB"; below 1 KiB, "N B".
std::string human_bytes(uint64_t n);
// {4096, 32000} -> "[4096, 32000]"
std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace kiln::cli
