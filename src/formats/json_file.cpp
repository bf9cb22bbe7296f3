#include "formats/json_file.h"

#include <algorithm>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace kiln::json_file {
namespace {

using nlohmann::json;

// One open container while parsing. Objects remember their keys (for duplicates) and the last key
// (for the path in messages).
struct Frame {
  bool is_object = false;
  std::unordered_set<std::string> keys;
  std::string last_key;
};

std::string frames_path(const std::vector<Frame>& frames) {
  std::string path;
  // The path of the innermost container: the keys (or "*" for array items) that lead to it.
  for (size_t i = 0; i + 1 < frames.size(); ++i) {
    path += '/';
    path += frames[i].is_object ? frames[i].last_key : std::string("*");
  }
  return path.empty() ? std::string("/") : path;
}

// The structure pass of parse(): nesting depth, duplicate keys and syntax, nothing built. A handler method
// returning false stops the parse.
struct StructureCheck {
  std::vector<Frame> frames;
  std::string error;       // a structure error (depth, duplicate key), with the path
  size_t error_byte = 0;   // a syntax error: nlohmann's 1-based byte offset
  std::string error_what;  // ... and its message

  bool open(bool is_object) {
    frames.push_back(Frame{is_object, {}, {}});
    if (frames.size() > static_cast<size_t>(kMaxDepth)) {
      error = fmt::format("nesting deeper than {} levels at {}", kMaxDepth, frames_path(frames));
      return false;
    }
    return true;
  }
  bool close() {
    if (!frames.empty()) frames.pop_back();
    return true;
  }
  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const json::string_t&) { return true; }
  bool string(json::string_t&) { return true; }
  bool binary(json::binary_t&) { return true; }
  bool start_object(size_t) { return open(true); }
  bool start_array(size_t) { return open(false); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(json::string_t& k) {
    if (frames.empty()) return true;
    Frame& top = frames.back();
    top.last_key = k;
    if (!top.keys.insert(k).second) {
      error = fmt::format("duplicate key \"{}\" in the object at {}", top.last_key, frames_path(frames));
      return false;
    }
    return true;
  }
  bool parse_error(size_t position, const std::string&, const json::exception& ex) {
    const auto* pe = dynamic_cast<const json::parse_error*>(&ex);
    error_byte = pe != nullptr ? pe->byte : position;
    error_what = ex.what();
    return false;
  }
};

// Strips nlohmann's "[json.exception.parse_error.101] parse error at line 1, column 2: " prefix.
std::string parse_error_reason(const char* what) {
  std::string s(what);
  const size_t col = s.find("column ");
  const size_t colon = s.find(": ", col == std::string::npos ? 0 : col);
  if (colon != std::string::npos) return s.substr(colon + 2);
  return s;
}

}  // namespace

LineColumn line_column(std::string_view text, size_t offset) {
  offset = std::min(offset, text.size());
  LineColumn lc;
  for (size_t i = 0; i < offset; ++i) {
    if (text[i] == '\n') {
      ++lc.line;
      lc.column = 1;
    } else {
      ++lc.column;
    }
  }
  return lc;
}

const char* type_name(const json& value) {
  switch (value.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "object";
    case json::value_t::array: return "array";
    case json::value_t::string: return "string";
    case json::value_t::boolean: return "boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "integer";
    case json::value_t::number_float: return "number";
    case json::value_t::binary: return "binary";
    case json::value_t::discarded: return "discarded";
  }
  return "unknown";
}

std::string preview(const json& value, size_t max_chars) {
  std::string s = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > max_chars) {
    s.resize(max_chars);
    s += "...";
  }
  return s;
}

Result<json> parse(std::string_view text, std::string_view name) {
  // Two linear passes: a SAX pass checks the structure (depth, duplicate keys, syntax) without building
  // anything, then the plain parser builds the DOM. (nlohmann's callback DOM parser, the one-pass way to do
  // both, rescans the parent array after every object it closes: quadratic in an array of objects.)
  StructureCheck check;
  const bool ok = json::sax_parse(text.begin(), text.end(), &check, json::input_format_t::json,
                                  /*strict=*/true, /*ignore_comments=*/false);
  if (!check.error.empty()) return invalid_argument("{}: {}", name, check.error);
  if (!ok) {
    // error_byte: 1-based offset of the last byte read when the error was found.
    const LineColumn lc = line_column(text, check.error_byte > 0 ? check.error_byte - 1 : 0);
    return invalid_argument("{}:{}:{}: invalid JSON: {}", name, lc.line, lc.column,
                            parse_error_reason(check.error_what.c_str()));
  }
  try {
    return json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/true,
                       /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    return invalid_argument("{}: invalid JSON: {}", name, e.what());
  }
}

Result<std::string> read_text(const std::string& path, size_t max_bytes) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status)) return not_found("file not found: {}", path);
  if (!std::filesystem::is_regular_file(status)) return invalid_argument("{} is not a regular file", path);
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) return io_error("cannot get the size of {}: {}", path, ec.message());
  if (size > max_bytes) {
    return invalid_argument("{} is {} bytes, over the limit of {} bytes for this file", path, size,
                            max_bytes);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error("cannot open {}", path);
  std::string text(static_cast<size_t>(size), '\0');
  in.read(text.data(), static_cast<std::streamsize>(size));
  if (static_cast<uintmax_t>(in.gcount()) != size) {
    return io_error("cannot read {}: got {} of {} bytes", path, in.gcount(), size);
  }
  return text;
}

Result<json> read(const std::string& path, size_t max_bytes) {
  KILN_ASSIGN_OR_RETURN(std::string text, read_text(path, max_bytes));
  return parse(text, path);
}

}  // namespace kiln::json_file
