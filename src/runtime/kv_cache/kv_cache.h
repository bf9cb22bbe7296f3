// KvCache: per-sequence block tables over one BlockPool, with prefix caching by chained block hashes.
// Token position p of a sequence lives at slot(seq, p) = (block_table[p / block_size], p % block_size) in
// every layer's K/V storage [head_dim, n_kv_heads, block_size, n_blocks] (innermost first, as every shape).
//
// Invariants (checked by check_invariants(), on top of the pool's own):
//  1. Block tables are append-only while a sequence lives; its blocks are released (tail first) by
//     free_sequence(), and, for sliding-window models, a leading run of them by release_before(), which
//     leaves ops::kFreedBlock in their table entries.
//  2. A block appears at most once in a table, and its pool ref count equals the number of tables holding
//     it (the cache is the pool's only user).
//  3. reserved capacity (table length * block_size) >= committed tokens (n_tokens).
//  4. A sequence keeps the chained hash of each of its full blocks: hashes.size() == n_tokens / block_size,
//     hashes[i] = block_hash(&hashes[i-1], tokens of block i); the parent of block 0 is salt_hash(salt) for
//     a sequence added with a cache salt, none without. Where the pool holds a hash for table[i], it
//     equals hashes[i]; a block may be full and unhashed when an equal block was registered first.
//  5. Only full blocks are shared: a block past the full ones (partly written or only reserved) has ref
//     count 1 and no hash. So writing the K/V of new tokens never touches a block another sequence reads.
//  6. Prefix reuse never covers the block that holds the last prompt token: at least one prompt token is
//     computed, which yields the logits for the first sampled token.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/status.h"
#include "runtime/kv_cache/block_pool.h"

namespace kiln {

class KvCache {
 public:
  // Programmer error (assert) when n_blocks < 0 or block_size < 1; use create() for unchecked values.
  explicit KvCache(int32_t n_blocks, int32_t block_size = 16);
  // invalid_argument naming the field when n_blocks < 0 or block_size < 1.
  static Result<KvCache> create(int32_t n_blocks, int32_t block_size = 16);

  // Creates sequence `seq` and shares the cached blocks whose chained hashes match the prompt's leading full
  // blocks, stopping before the block that holds the last prompt token. Returns the number of prompt tokens
  // already present (reused blocks * block_size); they count as committed. invalid_argument for an id in use.
  // cache_salt: a namespace for prefix sharing (a tenant, say); it is mixed into the first block's hash, so
  // sequences share blocks only when their salts are equal. Empty: the shared default namespace.
  // reuse = false: no block is shared (0 returned); the sequence's own full blocks are still cached as usual.
  Result<int32_t> add_sequence(int64_t seq, std::span<const int32_t> prompt, std::string_view cache_salt = {},
                               bool reuse = true);
  // Grows the block table so that n_tokens(seq) + n_new_tokens positions fit. All or nothing: on
  // resource_exhausted nothing changed. not_found for an unknown id, invalid_argument for n_new_tokens < 0.
  Status reserve(int64_t seq, int32_t n_new_tokens);
  // Records that the K/V of `tokens` (the next positions) are written; hashes every block that became full
  // and registers it for sharing unless an equal block is registered already (the sequence keeps its own
  // block). Precondition (assert): the sequence exists and the tokens fit in the reserved capacity.
  void commit(int64_t seq, std::span<const int32_t> tokens);
  // Releases the sequence's blocks, tail first, so the LRU list evicts the tail of a prefix before its
  // head. Precondition (assert): the sequence exists.
  void free_sequence(int64_t seq);
  // Gives back the blocks that hold only positions < pos (no layer reads them again when every layer attends
  // to a window that starts at pos or later); their table entries become ops::kFreedBlock. Full blocks stay
  // hashed in the pool's LRU list for prefix reuse until evicted. Returns the blocks released by this call.
  // Precondition (assert): the sequence exists.
  int32_t release_before(int64_t seq, int32_t pos);

  bool has_sequence(int64_t seq) const { return seqs_.contains(seq); }
  int32_t n_sequences() const { return static_cast<int32_t>(seqs_.size()); }
  // Block ids, [ceil(capacity / block_size)]. Valid until the next call that changes this sequence.
  std::span<const int32_t> block_table(int64_t seq) const;
  // Committed tokens (their K/V are written).
  int32_t n_tokens(int64_t seq) const;
  // Reserved positions: block_table(seq).size() * block_size.
  int32_t capacity(int64_t seq) const;
  // (block id, offset in block) of position pos; precondition 0 <= pos < capacity(seq).
  std::pair<int32_t, int32_t> slot(int64_t seq, int32_t pos) const;
  int32_t block_size() const { return block_size_; }
  int32_t n_blocks() const { return pool_.n_blocks(); }
  const BlockPool& pool() const { return pool_; }

  // ok, or internal naming the first broken invariant (see the top of this file and block_pool.h).
  Status check_invariants() const;

 private:
  struct Sequence {
    std::vector<int32_t> blocks;    // [n_reserved_blocks] block table; [0, n_released) are kFreedBlock
    int32_t n_released = 0;         // leading blocks given back by release_before()
    std::vector<int32_t> tokens;    // [n_tokens] committed token ids
    std::vector<BlockHash> hashes;  // [n_tokens / block_size] chained hashes of the full blocks
    std::optional<BlockHash> root;  // the parent of block 0: salt_hash(cache salt); none without a salt
  };
  // The parent hash of full block i of s (nullptr: none).
  static const BlockHash* parent_hash(const Sequence& s, size_t i);
  const Sequence& get(int64_t seq) const;

  int32_t block_size_;  // tokens per block
  BlockPool pool_;
  std::unordered_map<int64_t, Sequence> seqs_;
};

}  // namespace kiln
