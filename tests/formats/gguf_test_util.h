// Builds GGUF bytes field by field for the gguf tests (valid and deliberately malformed files).
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

namespace kiln::gguf::testing {

struct Buf {
  std::vector<uint8_t> b;
  template <class T>
  Buf& put(T x) {
    size_t n = b.size();
    b.resize(n + sizeof(T));
    std::memcpy(b.data() + n, &x, sizeof(T));
    return *this;
  }
  Buf& str(std::string_view s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Buf& raw(const std::vector<uint8_t>& r) {
    b.insert(b.end(), r.begin(), r.end());
    return *this;
  }
};

// One key-value pair: key, u32 type tag, then `payload` (already encoded).
inline std::vector<uint8_t> kv(std::string_view key, uint32_t type, const Buf& payload) {
  Buf k;
  k.str(key).put<uint32_t>(type).raw(payload.b);
  return k.b;
}
inline std::vector<uint8_t> kv_u32(std::string_view key, uint32_t v) {
  return kv(key, 4, Buf().put<uint32_t>(v));
}
inline std::vector<uint8_t> kv_str(std::string_view key, std::string_view v) {
  return kv(key, 8, Buf().str(v));
}

inline std::vector<uint8_t> tinfo(std::string_view name, const std::vector<uint64_t>& dims, uint32_t type,
                                  uint64_t offset) {
  Buf t;
  t.str(name).put<uint32_t>(static_cast<uint32_t>(dims.size()));
  for (uint64_t d : dims) t.put<uint64_t>(d);
  t.put<uint32_t>(type).put<uint64_t>(offset);
  return t.b;
}

struct Spec {
  uint32_t magic = 0x46554747;  // "GGUF"
  uint32_t version = 3;
  int64_t n_tensors = -1;  // -1: the number of tinfos
  int64_t n_kv = -1;       // -1: the number of kvs
  std::vector<std::vector<uint8_t>> kvs;
  std::vector<std::vector<uint8_t>> tinfos;
  uint64_t alignment = 32;  // padding before the data section
  uint64_t data_bytes = 0;  // zero bytes appended as the data section
};

inline std::vector<uint8_t> build(const Spec& s) {
  Buf b;
  b.put(s.magic).put(s.version);
  b.put<uint64_t>(s.n_tensors >= 0 ? static_cast<uint64_t>(s.n_tensors) : s.tinfos.size());
  b.put<uint64_t>(s.n_kv >= 0 ? static_cast<uint64_t>(s.n_kv) : s.kvs.size());
  for (const auto& k : s.kvs) b.raw(k);
  for (const auto& t : s.tinfos) b.raw(t);
  if (!s.tinfos.empty()) {
    while (b.b.size() % s.alignment != 0) b.b.push_back(0);
  }
  b.b.resize(b.b.size() + s.data_bytes, 0);
  return b.b;
}

// A small valid file: two metadata keys and one f32 tensor "t" of shape [4] (16 data bytes).
inline Spec valid_spec() {
  Spec s;
  s.kvs = {kv_str("general.architecture", "llama"), kv_u32("test.count", 7)};
  s.tinfos = {tinfo("t", {4}, 0, 0)};
  s.data_bytes = 32;
  return s;
}

}  // namespace kiln::gguf::testing
