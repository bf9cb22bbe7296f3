// String helpers with Python's semantics on UTF-8 text (indices count code points).
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::jinja {

// Byte offset of each code point start, plus s.size() at the end. Invalid bytes count as one code point each.
std::vector<size_t> code_point_offsets(const std::string& s);
size_t code_point_count(const std::string& s);
bool is_py_space(unsigned char c);
// str.strip/lstrip/rstrip: chars empty = whitespace; which: 'b' both, 'l', 'r'.
std::string py_strip(const std::string& s, const std::string* chars, char which);
std::vector<std::string> py_split(const std::string& s, const std::string* sep, long maxsplit);
// str.upper()/str.lower() for ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic (other scripts unchanged).
std::string py_upper(const std::string& s);
std::string py_lower(const std::string& s);
std::string py_capitalize(const std::string& s);
std::string py_title(const std::string& s);     // str.title()
std::string jinja_title(const std::string& s);  // the `title` filter
std::string py_replace(const std::string& s, const std::string& from, const std::string& to, long count);

// One character of an escaping and the text that stands for it ('&' and "&amp;").
struct CharEscape {
  char c;
  std::string_view text;
};
// The text that stands for c in table; nullptr when c has none.
const std::string_view* find_escape(std::span<const CharEscape> table, char c);

}  // namespace kiln::jinja
