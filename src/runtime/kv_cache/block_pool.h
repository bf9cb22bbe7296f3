// BlockPool: the bookkeeping of a paged KV cache's blocks (ids 0..n_blocks-1). The K/V storage itself
// ([head_dim, n_kv_heads, block_size, n_blocks] per layer, innermost first) lives elsewhere; a block id indexes
// its last dimension.
//
// Invariants (checked by check_invariants()):
//  1. Every block is in exactly one state: used, free or cached.
//  2. used   <=> ref count > 0; such a block is in neither the free list nor the LRU list.
//     free   <=> ref count == 0 and no hash; it appears exactly once in the free list.
//     cached <=> ref count == 0 and a hash; it appears exactly once in the LRU list.
//  3. The hash index maps h -> b exactly when block b holds hash h: one block per hash, and only used or
//     cached blocks hold a hash (a free block never does).
//  4. n_free() + n_cached() + n_used() == n_blocks().
// The free list is LIFO (the most recently freed block is reused first, it is likely still warm). The LRU
// list is ordered by the time a block became cached: allocate() evicts its front (the least recently freed
// block), forgetting the hash, only when the free list is empty.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"

namespace kiln {

// SHA-256 of a full block's tokens chained with the hash of the block before it in its sequence.
using BlockHash = std::array<uint8_t, 32>;

// SHA-256 over (parent hash, or 32 zero bytes for the first block) || tokens as little-endian int32.
BlockHash block_hash(const BlockHash* parent, std::span<const int32_t> tokens);

// The parent hash of the first block of a sequence with a cache salt: SHA-256 of "kiln.cache_salt\0" || salt.
// Chained from it, the block hashes of sequences with different salts (or none) differ unless SHA-256 is
// broken, so they never share a block. Precondition: the salt is not empty (an empty salt means no salt: the
// first block has no parent, as block_hash(nullptr, ...)).
BlockHash salt_hash(std::string_view salt);

// The first 8 bytes as hex, for messages.
std::string block_hash_short(const BlockHash& h);

struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const {
    size_t v = 0;  // SHA-256 output is uniform: any 8 bytes make a good bucket hash
    std::memcpy(&v, h.data(), sizeof(v));
    return v;
  }
};

enum class BlockState : uint8_t { block_state_free, block_state_cached, block_state_used };

class BlockPool {
 public:
  // Programmer error (assert) when n_blocks < 0; callers validate configuration first.
  explicit BlockPool(int32_t n_blocks);
  // Not copyable: lru_pos_ holds iterators into lru_ (a move keeps them valid).
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;
  BlockPool(BlockPool&&) = default;
  BlockPool& operator=(BlockPool&&) = default;

  // A block with ref count 1 and no hash: from the free list, else the least recently freed cached block
  // (its hash is forgotten). resource_exhausted when neither has one.
  Result<int32_t> allocate();
  // ref + 1. A cached block leaves the LRU list and becomes used again (keeping its hash).
  // Programmer error on a free block (it has no content worth sharing).
  void acquire(int32_t block);
  // ref - 1. At 0 the block goes to the back of the LRU list when it holds a hash, else to the free list.
  void release(int32_t block);
  // Registers a used block's content hash. Precondition: the block holds no hash yet and no other block holds
  // `hash` (check find_cached() first).
  void set_hash(int32_t block, const BlockHash& hash);

  // The block holding `hash`, used or cached, if any.
  std::optional<int32_t> find_cached(const BlockHash& hash) const;

  int32_t n_blocks() const { return static_cast<int32_t>(ref_.size()); }
  int32_t n_free() const { return static_cast<int32_t>(free_list_.size()); }
  int32_t n_cached() const { return static_cast<int32_t>(lru_.size()); }
  int32_t n_used() const { return n_blocks() - n_free() - n_cached(); }
  // n_free() + n_cached(): how many allocate() calls can succeed in a row.
  int32_t n_available() const { return n_free() + n_cached(); }

  int32_t ref_count(int32_t block) const;
  BlockState state(int32_t block) const;
  const std::optional<BlockHash>& hash_of(int32_t block) const;

  // ok, or internal naming the first broken invariant (see the top of this file).
  Status check_invariants() const;

 private:
  void check_id(int32_t block) const;

  std::vector<int32_t> ref_;                           // [n_blocks] reference counts
  std::vector<BlockState> state_;                      // [n_blocks]
  std::vector<std::optional<BlockHash>> hash_;         // [n_blocks] content hash of a full block
  std::vector<std::list<int32_t>::iterator> lru_pos_;  // [n_blocks] valid only while cached
  std::vector<int32_t> free_list_;                     // LIFO stack of free block ids
  std::list<int32_t> lru_;                             // cached block ids, least recently freed first
  std::unordered_map<BlockHash, int32_t, BlockHashHasher> index_;  // hash -> block holding it
};

}  // namespace kiln
