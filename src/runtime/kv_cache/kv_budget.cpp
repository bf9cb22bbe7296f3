#include "runtime/kv_cache/kv_budget.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <sstream>
#include <string>

namespace kiln {

Result<int64_t> kv_blocks_for_budget(const KvBudgetInput& in) {
  KILN_ASSERT(in.block_bytes > 0 && in.full_blocks >= 1);
  if (in.budget_bytes > 0) {
    const uint64_t n = in.budget_bytes / in.block_bytes;
    if (n == 0) {
      return invalid_argument(
          "kv_memory_bytes = {} (--kv-memory) holds no KV block: one block (K and V of every layer) takes {} "
          "bytes",
          in.budget_bytes, in.block_bytes);
    }
    if (n > static_cast<uint64_t>(kMaxKvBlocks)) {
      return invalid_argument("kv_memory_bytes = {} makes {} KV blocks, more than the {} a pool may have",
                              in.budget_bytes, n, kMaxKvBlocks);
    }
    return static_cast<int64_t>(n);
  }
  int64_t n = std::min(in.full_blocks, kMaxKvBlocks);
  if (in.mem_available) {
    const uint64_t fit = *in.mem_available / 2 / in.block_bytes;
    n = std::max<int64_t>(1, std::min<uint64_t>(static_cast<uint64_t>(n), fit));
  }
  return n;
}

std::optional<uint64_t> parse_mem_available(std::string_view meminfo) {
  constexpr std::string_view kKey = "MemAvailable:";
  size_t at = meminfo.find(kKey);
  // The key starts a line.
  while (at != std::string_view::npos && at != 0 && meminfo[at - 1] != '\n') at = meminfo.find(kKey, at + 1);
  if (at == std::string_view::npos) return std::nullopt;
  std::string_view rest = meminfo.substr(at + kKey.size());
  rest = rest.substr(0, rest.find('\n'));
  const size_t digits = rest.find_first_not_of(' ');
  if (digits == std::string_view::npos) return std::nullopt;
  rest.remove_prefix(digits);
  uint64_t kib = 0;
  auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), kib);
  if (ec != std::errc() || end == rest.data()) return std::nullopt;
  if (std::string_view(end, rest.data() + rest.size() - end) != " kB") return std::nullopt;
  if (kib > UINT64_MAX / 1024) return std::nullopt;
  return kib * 1024;
}

std::optional<uint64_t> mem_available_bytes() {
  std::ifstream f("/proc/meminfo");
  if (!f) return std::nullopt;
  std::ostringstream text;
  text << f.rdbuf();
  return parse_mem_available(text.str());
}

}  // namespace kiln
