#include "tokenizer/unicode.h"

namespace kiln::unicode {

size_t utf8_lead_length(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xC2) return 0;  // continuation bytes and the overlong leads 0xC0, 0xC1
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  if (lead < 0xF5) return 4;
  return 0;
}

size_t utf8_decode(std::string_view s, size_t pos, uint32_t& cp) {
  if (pos >= s.size()) return 0;
  const auto b0 = static_cast<uint8_t>(s[pos]);
  const size_t len = utf8_lead_length(b0);
  if (len == 0 || pos + len > s.size()) return 0;
  if (len == 1) {
    cp = b0;
    return 1;
  }
  uint32_t v = b0 & (0x7F >> len);
  for (size_t i = 1; i < len; ++i) {
    const auto b = static_cast<uint8_t>(s[pos + i]);
    if ((b & 0xC0) != 0x80) return 0;
    v = (v << 6) | (b & 0x3F);
  }
  // Overlong 3- and 4-byte forms, surrogates, and values past U+10FFFF.
  if ((len == 3 && v < 0x800) || (len == 4 && v < 0x10000) || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
    return 0;
  }
  cp = v;
  return len;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool utf8_valid(std::string_view s) {
  size_t pos = 0;
  uint32_t cp = 0;
  while (pos < s.size()) {
    const size_t n = utf8_decode(s, pos, cp);
    if (n == 0) return false;
    pos += n;
  }
  return true;
}

size_t utf8_complete_prefix(std::string_view s) {
  // An incomplete sequence is at most 3 bytes long: look back at most 3 bytes for its lead.
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto b = static_cast<uint8_t>(s[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte: keep looking for the lead
    const size_t len = utf8_lead_length(b);
    if (len <= back) return n;  // complete, or an invalid lead: nothing to wait for
    // A lead announcing more bytes than present: wait for them, unless the second byte already
    // rules out every completion (overlong E0/F0 forms, surrogates after ED, values past F4 8F).
    if (back >= 2) {
      const auto b1 = static_cast<uint8_t>(s[n - back + 1]);
      const bool bad = (b == 0xE0 && b1 < 0xA0) || (b == 0xED && b1 > 0x9F) || (b == 0xF0 && b1 < 0x90) ||
                       (b == 0xF4 && b1 > 0x8F);
      if (bad) return n;
    }
    return n - back;
  }
  return n;
}

namespace {

std::array<uint32_t, 256> make_byte_map() {
  std::array<uint32_t, 256> map{};
  std::array<bool, 256> direct{};
  for (int b = '!'; b <= '~'; ++b) direct[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) map[b] = direct[b] ? static_cast<uint32_t>(b) : next++;
  return map;
}

}  // namespace

const std::array<uint32_t, 256>& byte_to_codepoint() {
  static const std::array<uint32_t, 256> map = make_byte_map();
  return map;
}

int codepoint_to_byte(uint32_t cp) {
  // Bytes map to themselves or to 256 + k (k < 68, in byte order); invert without a table.
  static const std::array<int16_t, 324> inverse = [] {
    std::array<int16_t, 324> inv{};
    inv.fill(-1);
    const auto& map = byte_to_codepoint();
    for (int b = 0; b < 256; ++b) inv[map[b]] = static_cast<int16_t>(b);
    return inv;
  }();
  return cp < inverse.size() ? inverse[cp] : -1;
}

std::string bytes_to_byte_level(std::string_view bytes) {
  const auto& map = byte_to_codepoint();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) utf8_append(out, map[static_cast<uint8_t>(c)]);
  return out;
}

bool byte_level_to_bytes(std::string_view text, std::string& out) {
  size_t pos = 0;
  uint32_t cp = 0;
  while (pos < text.size()) {
    const size_t n = utf8_decode(text, pos, cp);
    if (n == 0) return false;
    const int b = codepoint_to_byte(cp);
    if (b < 0) return false;
    out.push_back(static_cast<char>(b));
    pos += n;
  }
  return true;
}

}  // namespace kiln::unicode
