#include "tokenizer/jinja/strutil.h"

#include <cctype>
#include <cstdint>

#include "tokenizer/unicode.h"

namespace kiln::jinja {

std::vector<size_t> code_point_offsets(const std::string& s) {
  std::vector<size_t> out;
  for (size_t k = 0; k < s.size(); ++k) {
    if ((static_cast<unsigned char>(s[k]) & 0xC0) != 0x80 || out.empty()) out.push_back(k);
  }
  out.push_back(s.size());
  return out;
}

size_t code_point_count(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool is_py_space(unsigned char c) { return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f); }

namespace {

// Byte length of the UTF-8 code point at s[p]; 1 for an invalid byte.
size_t cp_len(const std::string& s, size_t p) {
  const unsigned char c = static_cast<unsigned char>(s[p]);
  const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
  if (p + n > s.size()) return 1;
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[p + k]) & 0xC0) != 0x80) return 1;
  }
  return n;
}

// Start of the code point that ends at s[e - 1] (e > lo).
size_t cp_start_before(const std::string& s, size_t lo, size_t e) {
  size_t q = e - 1;
  while (q > lo && e - q < 4 && (static_cast<unsigned char>(s[q]) & 0xC0) == 0x80) --q;
  return cp_len(s, q) == e - q ? q : e - 1;
}

// Python's str.isspace() for one code point given as its UTF-8 bytes.
bool is_space_cp(const std::string& s, size_t p, size_t n) {
  if (n == 1) return is_py_space(static_cast<unsigned char>(s[p]));
  static const char* const spaces[] = {"\xC2\x85",     "\xC2\xA0",     "\xE1\x9A\x80", "\xE2\x80\x80",
                                       "\xE2\x80\x81", "\xE2\x80\x82", "\xE2\x80\x83", "\xE2\x80\x84",
                                       "\xE2\x80\x85", "\xE2\x80\x86", "\xE2\x80\x87", "\xE2\x80\x88",
                                       "\xE2\x80\x89", "\xE2\x80\x8A", "\xE2\x80\xA8", "\xE2\x80\xA9",
                                       "\xE2\x80\xAF", "\xE2\x81\x9F", "\xE3\x80\x80"};
  for (const char* sp : spaces) {
    if (s.compare(p, n, sp) == 0) return true;
  }
  return false;
}

bool in_char_set(const std::string& s, size_t p, size_t n, const std::string& chars) {
  for (size_t q = 0; q < chars.size();) {
    size_t m = cp_len(chars, q);
    if (m == n && chars.compare(q, m, s, p, n) == 0) return true;
    q += m;
  }
  return false;
}

}  // namespace

std::string py_strip(const std::string& s, const std::string* chars, char which) {
  auto strip_me = [&](size_t p, size_t n) {
    return chars ? in_char_set(s, p, n, *chars) : is_space_cp(s, p, n);
  };
  size_t b = 0, e = s.size();
  if (which != 'r') {
    while (b < e && strip_me(b, cp_len(s, b))) b += cp_len(s, b);
  }
  if (which != 'l') {
    while (e > b) {
      size_t q = cp_start_before(s, b, e);
      if (!strip_me(q, e - q)) break;
      e = q;
    }
  }
  return s.substr(b, e - b);
}

std::vector<std::string> py_split(const std::string& s, const std::string* sep, long maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    size_t p = 0;
    for (;;) {
      size_t q = (maxsplit < 0 || long(out.size()) < maxsplit) ? s.find(*sep, p) : std::string::npos;
      if (q == std::string::npos) break;
      out.push_back(s.substr(p, q - p));
      p = q + sep->size();
    }
    out.push_back(s.substr(p));
    return out;
  }
  auto space_at = [&](size_t p) { return is_space_cp(s, p, cp_len(s, p)); };
  size_t p = 0;
  while (p < s.size()) {
    while (p < s.size() && space_at(p)) p += cp_len(s, p);
    if (p >= s.size()) break;
    if (maxsplit >= 0 && long(out.size()) >= maxsplit) {
      out.push_back(py_strip(s.substr(p), nullptr, 'r'));
      break;
    }
    size_t q = p;
    while (q < s.size() && !space_at(q)) q += cp_len(s, q);
    out.push_back(s.substr(p, q - p));
    p = q;
  }
  return out;
}

namespace {

// Decode one UTF-8 code point at s[p]; invalid bytes decode as themselves (and are left unchanged).
uint32_t decode_at(const std::string& s, size_t& p, bool& valid) {
  const unsigned char c = static_cast<unsigned char>(s[p]);
  const int n = c < 0x80 ? 0 : (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xE ? 2 : (c >> 3) == 0x1E ? 3 : -1;
  valid = n == 0;
  if (n <= 0 || p + size_t(n) >= s.size()) {
    ++p;
    return c;
  }
  uint32_t cp = c & (0x3Fu >> n);
  for (int k = 1; k <= n; ++k) {
    const unsigned char d = static_cast<unsigned char>(s[p + size_t(k)]);
    if ((d & 0xC0) != 0x80) {
      ++p;
      return c;
    }
    cp = (cp << 6) | (d & 0x3F);
  }
  p += size_t(n) + 1;
  valid = true;
  return cp;
}

uint32_t to_upper_cp(uint32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 32;
  if (c == 0xFF) return 0x178;
  if (c == 0xB5) return 0x39C;
  if (c >= 0x100 && c <= 0x17F && c != 0x131 && c != 0x138 && c != 0x149 && c != 0x17F) {
    bool odd_is_lower = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
    if (odd_is_lower ? (c % 2 == 0) : (c % 2 == 1)) return c - 1;
    return c;
  }
  if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 32;
  if (c == 0x3C2) return 0x3A3;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  return c;
}

uint32_t to_lower_cp(uint32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
  if (c == 0x178) return 0xFF;
  if (c >= 0x100 && c <= 0x17F && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 && c != 0x17F) {
    bool odd_is_lower = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
    if (odd_is_lower ? (c % 2 == 1) : (c % 2 == 0)) return c + 1;
    return c;
  }
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  return c;
}

std::string map_case(const std::string& s, bool upper) {
  std::string out;
  out.reserve(s.size());
  for (size_t p = 0; p < s.size();) {
    size_t start = p;
    bool valid = false;
    uint32_t cp = decode_at(s, p, valid);
    if (!valid) {
      out.append(s, start, p - start);
      continue;
    }
    if (upper && cp == 0xDF) {
      out += "SS";  // Python: 'ß'.upper() == 'SS'
      continue;
    }
    unicode::utf8_append(out, upper ? to_upper_cp(cp) : to_lower_cp(cp));
  }
  return out;
}

}  // namespace

std::string py_upper(const std::string& s) { return map_case(s, true); }
std::string py_lower(const std::string& s) { return map_case(s, false); }

std::string py_capitalize(const std::string& s) {
  std::string out = py_lower(s);
  if (!out.empty()) out[0] = char(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}

std::string py_title(const std::string& s) {
  std::string out = s;
  bool prev_cased = false;
  for (auto& c : out) {
    unsigned char u = static_cast<unsigned char>(c);
    bool alpha = std::isalpha(u) != 0;
    if (alpha) c = char(prev_cased ? std::tolower(u) : std::toupper(u));
    prev_cased = alpha;
  }
  return out;
}

std::string jinja_title(const std::string& s) {
  // Words start after a run of '-', whitespace, '(', '{', '[' or '<'.
  std::string out;
  bool word_start = true;
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    bool sep = c == '-' || is_py_space(u) || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) {
      out += c;
      word_start = true;
    } else {
      out += char(word_start ? std::toupper(u) : std::tolower(u));
      word_start = false;
    }
  }
  return out;
}

std::string py_replace(const std::string& s, const std::string& from, const std::string& to, long count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` between every code point (and at both ends).
    auto offs = code_point_offsets(s);
    long n = 0;
    for (size_t k = 0; k + 1 < offs.size() || (k + 1 == offs.size()); ++k) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      if (k + 1 < offs.size()) out += s.substr(offs[k], offs[k + 1] - offs[k]);
      if (k + 1 == offs.size()) break;
    }
    return out;
  }
  size_t p = 0;
  long n = 0;
  for (;;) {
    size_t q = (count < 0 || n < count) ? s.find(from, p) : std::string::npos;
    if (q == std::string::npos) break;
    out.append(s, p, q - p);
    out += to;
    p = q + from.size();
    ++n;
  }
  out.append(s, p, std::string::npos);
  return out;
}

const std::string_view* find_escape(std::span<const CharEscape> table, char c) {
  for (const CharEscape& e : table) {
    if (e.c == c) return &e.text;
  }
  return nullptr;
}

}  // namespace kiln::jinja
