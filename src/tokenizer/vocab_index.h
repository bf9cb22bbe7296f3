// The vocabulary's two lookup tables, flat: open addressing with linear probing, at most half full. A
// std::unordered_map spends a heap node and a bucket on each entry (~56 bytes); these spend 4 (KeyIndex) and
// 16 (MergeTable) bytes a slot. Gemma 3's 262,144 tokens and 514,847 recovered merges are where that shows.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::tokenizer_detail {

// One BPE merge: the pair (left id, right id) becomes `merged`; lower rank merges first.
struct Merge {
  uint32_t rank = 0;
  int32_t merged = -1;
};

// Token key -> id, over the vocabulary's own strings (the table holds ids only).
class KeyIndex {
 public:
  // Indexes keys[0 .. n): a repeated key maps to its last id (its first with `first_wins`). `keys` must
  // outlive the index and not move its strings (the vector itself may move).
  void build(const std::vector<std::string>& keys, bool first_wins = false);
  // The id of `key`, or -1.
  int32_t find(std::string_view key) const;
  bool contains(std::string_view key) const { return find(key) >= 0; }
  size_t memory_bytes() const { return slots_.capacity() * sizeof(int32_t); }

 private:
  const std::string* keys_ = nullptr;
  std::vector<int32_t> slots_;  // ids, -1: empty
  size_t mask_ = 0;
};

// Token pair (left << 32 | right, pair_key) -> its merge.
class MergeTable {
 public:
  static uint64_t pair_key(int32_t left, int32_t right) {
    return static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32 | static_cast<uint32_t>(right);
  }
  // Room for n merges without growing.
  void reserve(size_t n);
  // Sets the merge of `pair` (a repeated pair: the last wins).
  void insert_or_assign(uint64_t pair, Merge m) { put(pair, m, true); }
  // Sets the merge of `pair` unless it has one (a repeated pair: the first wins).
  void insert(uint64_t pair, Merge m) { put(pair, m, false); }
  // The merge of `pair`, or null.
  const Merge* find(uint64_t pair) const;
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  void clear();
  size_t memory_bytes() const { return slots_.capacity() * sizeof(Slot); }
  // f(pair, merge) for every merge, in no particular order.
  template <class F>
  void for_each(F&& f) const {
    for (const Slot& s : slots_) {
      if (s.pair != kEmpty) f(s.pair, s.merge);
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // no pair of ids (both < 2^31) has this key
  struct Slot {
    uint64_t pair = kEmpty;
    Merge merge;
  };
  void put(uint64_t pair, Merge m, bool assign);
  void grow(size_t min_slots);
  std::vector<Slot> slots_;
  size_t mask_ = 0, size_ = 0;
};

}  // namespace kiln::tokenizer_detail
