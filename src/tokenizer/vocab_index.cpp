#include "tokenizer/vocab_index.h"

#include <functional>
#include <utility>

namespace kiln::tokenizer_detail {

namespace {

// The power of two that keeps n entries at most half full (at least 16 slots).
size_t table_size(size_t n) {
  size_t s = 16;
  while (s < 2 * n) s *= 2;
  return s;
}

uint64_t mix(uint64_t x) {  // splitmix64's finaliser: every key bit reaches the low bits the mask keeps
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

void KeyIndex::build(const std::vector<std::string>& keys, bool first_wins) {
  keys_ = keys.data();
  slots_.assign(table_size(keys.size()), -1);
  mask_ = slots_.size() - 1;
  for (size_t id = 0; id < keys.size(); ++id) {
    const std::string_view key = keys[id];
    for (size_t i = std::hash<std::string_view>{}(key)&mask_;; i = (i + 1) & mask_) {
      if (slots_[i] < 0) {
        slots_[i] = static_cast<int32_t>(id);
        break;
      }
      if (keys_[slots_[i]] == key) {
        if (!first_wins) slots_[i] = static_cast<int32_t>(id);
        break;
      }
    }
  }
}

int32_t KeyIndex::find(std::string_view key) const {
  if (slots_.empty()) return -1;
  for (size_t i = std::hash<std::string_view>{}(key)&mask_;; i = (i + 1) & mask_) {
    const int32_t id = slots_[i];
    if (id < 0 || keys_[id] == key) return id;
  }
}

void MergeTable::reserve(size_t n) {
  if (table_size(n) > slots_.size()) grow(table_size(n));
}

void MergeTable::grow(size_t min_slots) {
  std::vector<Slot> old = std::exchange(slots_, std::vector<Slot>(min_slots));
  mask_ = slots_.size() - 1;
  size_ = 0;
  for (const Slot& s : old) {
    if (s.pair != kEmpty) insert_or_assign(s.pair, s.merge);
  }
}

void MergeTable::put(uint64_t pair, Merge m, bool assign) {
  if (2 * (size_ + 1) > slots_.size()) grow(table_size(size_ + 1));
  for (size_t i = mix(pair) & mask_;; i = (i + 1) & mask_) {
    if (slots_[i].pair == kEmpty) {
      slots_[i] = {pair, m};
      ++size_;
      return;
    }
    if (slots_[i].pair == pair) {
      if (assign) slots_[i].merge = m;
      return;
    }
  }
}

const Merge* MergeTable::find(uint64_t pair) const {
  if (size_ == 0) return nullptr;
  for (size_t i = mix(pair) & mask_;; i = (i + 1) & mask_) {
    const Slot& s = slots_[i];
    if (s.pair == pair) return &s.merge;
    if (s.pair == kEmpty) return nullptr;
  }
}

void MergeTable::clear() {
  slots_.clear();
  slots_.shrink_to_fit();
  mask_ = size_ = 0;
}

}  // namespace kiln::tokenizer_detail
