#include "runtime/kv_cache/block_pool.h"

#include <openssl/evp.h>

#include <algorithm>

namespace kiln {

BlockHash block_hash(const BlockHash* parent, std::span<const int32_t> tokens) {
  // bytes: [32 parent bytes][4 bytes per token, little-endian]
  std::vector<uint8_t> bytes(32 + 4 * tokens.size(), 0);
  if (parent != nullptr) std::memcpy(bytes.data(), parent->data(), 32);
  for (size_t i = 0; i < tokens.size(); ++i) {
    uint32_t t = static_cast<uint32_t>(tokens[i]);
    for (int k = 0; k < 4; ++k) bytes[32 + 4 * i + k] = static_cast<uint8_t>(t >> (8 * k));
  }
  BlockHash out{};
  unsigned int out_len = 0;
  int ok = EVP_Digest(bytes.data(), bytes.size(), out.data(), &out_len, EVP_sha256(), nullptr);
  KILN_ASSERT(ok == 1 && out_len == out.size());
  return out;
}

BlockHash salt_hash(std::string_view salt) {
  KILN_ASSERT(!salt.empty());
  static constexpr std::string_view kDomain("kiln.cache_salt\0", 16);
  std::string bytes;
  bytes.reserve(kDomain.size() + salt.size());
  bytes.append(kDomain).append(salt);
  BlockHash out{};
  unsigned int out_len = 0;
  int ok = EVP_Digest(bytes.data(), bytes.size(), out.data(), &out_len, EVP_sha256(), nullptr);
  KILN_ASSERT(ok == 1 && out_len == out.size());
  return out;
}

std::string block_hash_short(const BlockHash& h) {
  std::string s;
  for (int i = 0; i < 8; ++i) s += fmt::format("{:02x}", h[i]);
  return s;
}

BlockPool::BlockPool(int32_t n_blocks) {
  KILN_ASSERT(n_blocks >= 0);
  ref_.assign(n_blocks, 0);
  state_.assign(n_blocks, BlockState::block_state_free);
  hash_.assign(n_blocks, std::nullopt);
  lru_pos_.assign(n_blocks, lru_.end());
  free_list_.reserve(n_blocks);
  // Pushed in reverse so that a fresh pool hands out 0, 1, 2, ...
  for (int32_t b = n_blocks - 1; b >= 0; --b) free_list_.push_back(b);
}

void BlockPool::check_id(int32_t block) const { KILN_ASSERT(block >= 0 && block < n_blocks()); }

Result<int32_t> BlockPool::allocate() {
  int32_t b = -1;
  if (!free_list_.empty()) {
    b = free_list_.back();
    free_list_.pop_back();
  } else if (!lru_.empty()) {
    b = lru_.front();  // least recently freed: evict, its content will be overwritten
    lru_.pop_front();
    lru_pos_[b] = lru_.end();
    index_.erase(*hash_[b]);
    hash_[b].reset();
  } else {
    return resource_exhausted("kv cache: all {} blocks are in use (none free, none cached)", n_blocks());
  }
  ref_[b] = 1;
  state_[b] = BlockState::block_state_used;
  return b;
}

void BlockPool::acquire(int32_t block) {
  check_id(block);
  KILN_ASSERT(state_[block] != BlockState::block_state_free);  // a free block has no content worth sharing
  if (state_[block] == BlockState::block_state_cached) {
    lru_.erase(lru_pos_[block]);
    lru_pos_[block] = lru_.end();
    state_[block] = BlockState::block_state_used;
  }
  ++ref_[block];
}

void BlockPool::release(int32_t block) {
  check_id(block);
  KILN_ASSERT(state_[block] == BlockState::block_state_used && ref_[block] > 0);
  if (--ref_[block] > 0) return;
  if (hash_[block].has_value()) {
    lru_.push_back(block);
    lru_pos_[block] = std::prev(lru_.end());
    state_[block] = BlockState::block_state_cached;
  } else {
    free_list_.push_back(block);
    state_[block] = BlockState::block_state_free;
  }
}

void BlockPool::set_hash(int32_t block, const BlockHash& hash) {
  check_id(block);
  KILN_ASSERT(state_[block] == BlockState::block_state_used);
  KILN_ASSERT(!hash_[block].has_value());
  auto [it, inserted] = index_.emplace(hash, block);
  KILN_ASSERT(inserted);  // another block already holds this hash
  hash_[block] = hash;
}

std::optional<int32_t> BlockPool::find_cached(const BlockHash& hash) const {
  auto it = index_.find(hash);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

int32_t BlockPool::ref_count(int32_t block) const {
  check_id(block);
  return ref_[block];
}

BlockState BlockPool::state(int32_t block) const {
  check_id(block);
  return state_[block];
}

const std::optional<BlockHash>& BlockPool::hash_of(int32_t block) const {
  check_id(block);
  return hash_[block];
}

Status BlockPool::check_invariants() const {
  const int32_t n = n_blocks();
  auto broken = [](std::string what) { return Status(StatusCode::internal, "block pool: " + what); };
  if (state_.size() != ref_.size() || hash_.size() != ref_.size() || lru_pos_.size() != ref_.size()) {
    return broken("per-block arrays differ in length");
  }
  // How often each block appears in the free list and in the LRU list.
  std::vector<int32_t> in_free(n, 0), in_lru(n, 0);
  for (int32_t b : free_list_) {
    if (b < 0 || b >= n) return broken(fmt::format("free list holds id {} outside [0, {})", b, n));
    if (++in_free[b] > 1) return broken(fmt::format("block {} is twice in the free list", b));
  }
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    int32_t b = *it;
    if (b < 0 || b >= n) return broken(fmt::format("LRU list holds id {} outside [0, {})", b, n));
    if (++in_lru[b] > 1) return broken(fmt::format("block {} is twice in the LRU list", b));
    if (lru_pos_[b] != it) return broken(fmt::format("block {}: stale LRU position", b));
  }
  int32_t n_hashed = 0;
  for (int32_t b = 0; b < n; ++b) {
    const bool hashed = hash_[b].has_value();
    n_hashed += hashed ? 1 : 0;
    if (in_free[b] + in_lru[b] > 1) return broken(fmt::format("block {} is both free and cached", b));
    switch (state_[b]) {
      case BlockState::block_state_used:
        if (ref_[b] <= 0) return broken(fmt::format("used block {} has ref count {}", b, ref_[b]));
        if (in_free[b] + in_lru[b] != 0) return broken(fmt::format("used block {} is in a free/LRU list", b));
        break;
      case BlockState::block_state_free:
        if (ref_[b] != 0) return broken(fmt::format("free block {} has ref count {}", b, ref_[b]));
        if (in_free[b] != 1) return broken(fmt::format("free block {} is not in the free list", b));
        if (hashed) return broken(fmt::format("free block {} holds a hash", b));
        break;
      case BlockState::block_state_cached:
        if (ref_[b] != 0) return broken(fmt::format("cached block {} has ref count {}", b, ref_[b]));
        if (in_lru[b] != 1) return broken(fmt::format("cached block {} is not in the LRU list", b));
        if (!hashed) return broken(fmt::format("cached block {} holds no hash", b));
        break;
      default: return broken(fmt::format("block {} has unknown state {}", b, static_cast<int>(state_[b])));
    }
    if (hashed) {
      auto it = index_.find(*hash_[b]);
      if (it == index_.end() || it->second != b) {
        return broken(fmt::format("block {}: hash {} is not indexed to it", b, block_hash_short(*hash_[b])));
      }
    }
  }
  for (const auto& [h, b] : index_) {
    if (b < 0 || b >= n || !hash_[b].has_value() || *hash_[b] != h) {
      return broken(
          fmt::format("hash index entry {} -> block {} does not match the block", block_hash_short(h), b));
    }
  }
  if (static_cast<int32_t>(index_.size()) != n_hashed) {
    return broken(fmt::format("hash index has {} entries, {} blocks hold a hash", index_.size(), n_hashed));
  }
  int32_t n_used_state =
      static_cast<int32_t>(std::count(state_.begin(), state_.end(), BlockState::block_state_used));
  if (n_used_state != n_used()) {
    return broken(fmt::format("{} blocks are used but the counts say {}", n_used_state, n_used()));
  }
  return Status::ok_status();
}

}  // namespace kiln
