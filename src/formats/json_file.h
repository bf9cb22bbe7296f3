// JSON files and texts from untrusted sources (config.json, index files, safetensors headers).
// Reads are size-capped before anything is allocated; parse errors name the file, line and column;
// duplicate object keys are an error (RFC 8259 leaves them undefined, and nlohmann would keep one
// silently); nesting is depth-capped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/status.h"

namespace kiln::json_file {

// Size caps, in bytes. Config files are small; tokenizer files carry whole vocabularies.
inline constexpr size_t kMaxConfigBytes = size_t{16} << 20;     // config.json, generation_config.json
inline constexpr size_t kMaxTokenizerBytes = size_t{64} << 20;  // tokenizer_config.json, tokenizer.json
inline constexpr int kMaxDepth = 128;                           // nesting of objects and arrays

// Parses `text` as one JSON value. `name` (a path, or "x.safetensors header") starts every error.
// Errors: invalid_argument "<name>:<line>:<column>: <what>" for syntax errors; duplicate keys
// ("duplicate key \"k\" in object at /a/b"); nesting deeper than kMaxDepth.
Result<nlohmann::json> parse(std::string_view text, std::string_view name);

// Reads and parses the file at `path`. Errors: not_found for a missing file, invalid_argument when
// it is larger than `max_bytes` (checked before reading) or not valid JSON (see parse()).
Result<nlohmann::json> read(const std::string& path, size_t max_bytes);

// Reads a whole text file (no parsing), capped at `max_bytes` before allocating.
Result<std::string> read_text(const std::string& path, size_t max_bytes);

// A short rendering of a JSON value for error messages: at most `max_chars` of its dump, then "...".
std::string preview(const nlohmann::json& value, size_t max_chars = 60);

// The JSON type name of a value: "string", "number", "object", "array", "boolean", "null".
const char* type_name(const nlohmann::json& value);

// 1-based line and column of the byte at 0-based `offset` in `text` (offset clamped to the text).
struct LineColumn {
  int64_t line = 1;
  int64_t column = 1;
};
LineColumn line_column(std::string_view text, size_t offset);

}  // namespace kiln::json_file
