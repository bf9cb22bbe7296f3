// How many KV blocks an engine allocates: from a memory budget in bytes rather than n_seq_max x n_ctx, so
// that more sequences can run than fit at full length together (they grow into the shared pool, and the
// scheduler preempts the newest when it runs out).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace kiln {

// The most blocks a pool may have (block ids and counts are int32).
inline constexpr int64_t kMaxKvBlocks = int64_t{1} << 30;

struct KvBudgetInput {
  uint64_t budget_bytes = 0;  // an explicit budget (EngineOptions::kv_memory_bytes); 0: the default
  uint64_t block_bytes = 0;   // one block: K and V of every layer, > 0
  int64_t full_blocks = 0;    // n_seq_max x ceil(n_ctx / block_size): every sequence at full length, >= 1
  std::optional<uint64_t> mem_available;  // bytes the OS can still give (MemAvailable); nullopt: unknown
};

// The pool size in blocks, in [1, kMaxKvBlocks]:
//  - explicit budget: floor(budget_bytes / block_bytes), all of it (blocks past full_blocks keep more
//  prefixes
//    cached); invalid_argument naming kv_memory_bytes when the budget holds no block;
//  - default: min(full_blocks, floor(mem_available / 2 / block_bytes)), at least 1 block; full_blocks when
//  the
//    available memory is unknown. On a machine with room, this is exactly the pool kiln sized before budgets
//    existed (every sequence at full length); on a small one it stops at half of what is free.
Result<int64_t> kv_blocks_for_budget(const KvBudgetInput& in);

// MemAvailable from the text of /proc/meminfo ("MemAvailable:   23670480 kB"), in bytes; nullopt when absent
// or malformed.
std::optional<uint64_t> parse_mem_available(std::string_view meminfo);
// parse_mem_available of this machine's /proc/meminfo; nullopt where there is none (not Linux).
std::optional<uint64_t> mem_available_bytes();

}  // namespace kiln
