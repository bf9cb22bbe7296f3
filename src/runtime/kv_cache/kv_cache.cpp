#include "runtime/kv_cache/kv_cache.h"

#include <string>

#include "ops/ops.h"

namespace kiln {

KvCache::KvCache(int32_t n_blocks, int32_t block_size) : block_size_(block_size), pool_(n_blocks) {
  KILN_ASSERT(block_size >= 1);
}

Result<KvCache> KvCache::create(int32_t n_blocks, int32_t block_size) {
  if (n_blocks < 0) return invalid_argument("kv cache: n_blocks = {} must be >= 0", n_blocks);
  if (block_size < 1) return invalid_argument("kv cache: block_size = {} must be >= 1", block_size);
  return KvCache(n_blocks, block_size);
}

const KvCache::Sequence& KvCache::get(int64_t seq) const {
  auto it = seqs_.find(seq);
  KILN_ASSERT(it != seqs_.end());
  return it->second;
}

const BlockHash* KvCache::parent_hash(const Sequence& s, size_t i) {
  if (i > 0) return &s.hashes[i - 1];
  return s.root ? &*s.root : nullptr;
}

Result<int32_t> KvCache::add_sequence(int64_t seq, std::span<const int32_t> prompt,
                                      std::string_view cache_salt, bool reuse) {
  if (seqs_.contains(seq)) return invalid_argument("kv cache: sequence id {} already exists", seq);
  Sequence s;
  if (!cache_salt.empty()) s.root = salt_hash(cache_salt);
  // Full blocks strictly before the one holding the last prompt token.
  const size_t n_reusable = prompt.empty() || !reuse ? 0 : (prompt.size() - 1) / block_size_;
  for (size_t i = 0; i < n_reusable; ++i) {
    auto block_tokens = prompt.subspan(i * block_size_, block_size_);
    BlockHash h = block_hash(parent_hash(s, i), block_tokens);
    std::optional<int32_t> b = pool_.find_cached(h);
    if (!b) break;
    pool_.acquire(*b);
    s.blocks.push_back(*b);
    s.hashes.push_back(h);
    s.tokens.insert(s.tokens.end(), block_tokens.begin(), block_tokens.end());
  }
  const auto n_reused = static_cast<int32_t>(s.tokens.size());
  seqs_.emplace(seq, std::move(s));
  return n_reused;
}

Status KvCache::reserve(int64_t seq, int32_t n_new_tokens) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return not_found("kv cache: reserve for unknown sequence id {}", seq);
  if (n_new_tokens < 0) return invalid_argument("kv cache: n_new_tokens = {} must be >= 0", n_new_tokens);
  Sequence& s = it->second;
  const int64_t n_total = static_cast<int64_t>(s.tokens.size()) + n_new_tokens;
  const int64_t need_blocks = (n_total + block_size_ - 1) / block_size_;
  const int64_t missing = need_blocks - static_cast<int64_t>(s.blocks.size());
  if (missing <= 0) return Status::ok_status();
  if (missing > pool_.n_available()) {
    return resource_exhausted("kv cache: sequence {} needs {} more blocks for {} new tokens, {} available",
                              seq, missing, n_new_tokens, pool_.n_available());
  }
  for (int64_t i = 0; i < missing; ++i) {
    Result<int32_t> b = pool_.allocate();
    KILN_ASSERT(b.ok());  // n_available() counted it
    s.blocks.push_back(*b);
  }
  return Status::ok_status();
}

void KvCache::commit(int64_t seq, std::span<const int32_t> tokens) {
  auto it = seqs_.find(seq);
  KILN_ASSERT(it != seqs_.end());
  Sequence& s = it->second;
  KILN_ASSERT(s.tokens.size() + tokens.size() <= s.blocks.size() * static_cast<size_t>(block_size_));
  s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
  const size_t n_full = s.tokens.size() / block_size_;
  while (s.hashes.size() < n_full) {
    const size_t i = s.hashes.size();
    std::span<const int32_t> block_tokens(s.tokens.data() + i * block_size_, block_size_);
    BlockHash h = block_hash(parent_hash(s, i), block_tokens);
    s.hashes.push_back(h);
    // A block that became full here was written by this sequence alone (invariant 5): it holds no hash yet.
    // When an equal block is registered already, keep ours unregistered rather than swap mid-flight.
    if (!pool_.find_cached(h)) pool_.set_hash(s.blocks[i], h);
  }
}

void KvCache::free_sequence(int64_t seq) {
  auto it = seqs_.find(seq);
  KILN_ASSERT(it != seqs_.end());
  const std::vector<int32_t>& blocks = it->second.blocks;
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) {
    if (*b != ops::kFreedBlock) pool_.release(*b);
  }
  seqs_.erase(it);
}

int32_t KvCache::release_before(int64_t seq, int32_t pos) {
  auto it = seqs_.find(seq);
  KILN_ASSERT(it != seqs_.end());
  Sequence& s = it->second;
  // Never the block being written: only blocks whose every position is committed and below pos.
  const int32_t limit = std::min(pos, static_cast<int32_t>(s.tokens.size())) / block_size_;
  int32_t n = 0;
  for (; s.n_released < limit; ++s.n_released, ++n) {
    pool_.release(s.blocks[s.n_released]);
    s.blocks[s.n_released] = ops::kFreedBlock;
  }
  return n;
}

std::span<const int32_t> KvCache::block_table(int64_t seq) const { return get(seq).blocks; }

int32_t KvCache::n_tokens(int64_t seq) const { return static_cast<int32_t>(get(seq).tokens.size()); }

int32_t KvCache::capacity(int64_t seq) const {
  return static_cast<int32_t>(get(seq).blocks.size()) * block_size_;
}

std::pair<int32_t, int32_t> KvCache::slot(int64_t seq, int32_t pos) const {
  const Sequence& s = get(seq);
  KILN_ASSERT(pos >= 0 && static_cast<size_t>(pos) < s.blocks.size() * static_cast<size_t>(block_size_));
  return {s.blocks[pos / block_size_], pos % block_size_};
}

Status KvCache::check_invariants() const {
  KILN_TRY(pool_.check_invariants());
  auto broken = [](std::string what) { return Status(StatusCode::internal, "kv cache: " + what); };
  const int32_t n = pool_.n_blocks();
  std::vector<int32_t> n_tables(n, 0);     // [n_blocks] how many tables hold each block
  std::vector<int64_t> last_table(n, -1);  // [n_blocks] index of the last table seen holding each block
  int64_t table = 0;
  for (const auto& [id, s] : seqs_) {
    ++table;
    if (s.tokens.size() > s.blocks.size() * static_cast<size_t>(block_size_)) {
      return broken(fmt::format("sequence {}: {} committed tokens exceed the capacity of {} blocks", id,
                                s.tokens.size(), s.blocks.size()));
    }
    const size_t n_full = s.tokens.size() / block_size_;
    if (s.hashes.size() != n_full) {
      return broken(
          fmt::format("sequence {}: {} block hashes for {} full blocks", id, s.hashes.size(), n_full));
    }
    for (size_t i = 0; i < s.blocks.size(); ++i) {
      const int32_t b = s.blocks[i];
      if ((b == ops::kFreedBlock) != (i < static_cast<size_t>(s.n_released))) {
        return broken(fmt::format("sequence {}: entry {} is {} but {} leading blocks are released", id, i, b,
                                  s.n_released));
      }
      if (b == ops::kFreedBlock) continue;
      if (b < 0 || b >= n) return broken(fmt::format("sequence {}: block id {} outside [0, {})", id, b, n));
      if (pool_.state(b) != BlockState::block_state_used) {
        return broken(fmt::format("sequence {}: block {} at index {} is not in use", id, b, i));
      }
      if (last_table[b] == table) {
        return broken(fmt::format("sequence {}: block {} appears twice in its table", id, b));
      }
      last_table[b] = table;
      ++n_tables[b];
      const std::optional<BlockHash>& h = pool_.hash_of(b);
      if (i < n_full) {
        if (h && *h != s.hashes[i]) {
          return broken(
              fmt::format("sequence {}: block {} at index {} holds hash {}, its content hashes to {}", id, b,
                          i, block_hash_short(*h), block_hash_short(s.hashes[i])));
        }
      } else if (h || pool_.ref_count(b) != 1) {
        return broken(
            fmt::format("sequence {}: block {} at index {} is not full but shared or hashed", id, b, i));
      }
    }
    for (size_t i = 0; i < n_full; ++i) {
      std::span<const int32_t> block_tokens(s.tokens.data() + i * block_size_, block_size_);
      if (block_hash(parent_hash(s, i), block_tokens) != s.hashes[i]) {
        return broken(fmt::format("sequence {}: hash of block {} does not match its tokens", id, i));
      }
    }
  }
  for (int32_t b = 0; b < n; ++b) {
    if (pool_.ref_count(b) != n_tables[b]) {
      return broken(
          fmt::format("block {} has ref count {} but {} tables hold it", b, pool_.ref_count(b), n_tables[b]));
    }
  }
  return Status::ok_status();
}

}  // namespace kiln
