// UTF-8 helpers and the GPT-2 byte <-> unicode map used by byte-level BPE vocabularies.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::unicode {

// Decodes the code point starting at byte `pos` of `s`. On success returns its length in bytes
// (1..4) and writes the code point to `cp`; returns 0 for an invalid or truncated sequence
// (overlong forms, surrogates and values above U+10FFFF are invalid).
size_t utf8_decode(std::string_view s, size_t pos, uint32_t& cp);

// Appends the UTF-8 encoding of `cp` (<= U+10FFFF; a surrogate gets its 3-byte form, which no decoder here
// accepts).
void utf8_append(std::string& out, uint32_t cp);

// The byte length a sequence announces from its lead byte: 1..4, or 0 for a continuation byte or
// a byte that never starts a sequence (0xC0, 0xC1, 0xF5..0xFF).
size_t utf8_lead_length(uint8_t lead);

// True when every byte of `s` belongs to a valid UTF-8 sequence.
bool utf8_valid(std::string_view s);

// The length of the longest prefix of `s` that does not end inside an incomplete (but so far
// valid) UTF-8 sequence: the bytes after it may still be completed by more input. Invalid bytes
// count as complete (they can never become valid).
size_t utf8_complete_prefix(std::string_view s);

// GPT-2's reversible map of the 256 byte values to printable code points ("Ġ" = U+0120 is 0x20).
const std::array<uint32_t, 256>& byte_to_codepoint();
// The byte a code point stands for in that map, or -1 when it is not one of the 256.
int codepoint_to_byte(uint32_t cp);

// Spells raw bytes in the byte alphabet: each byte becomes its code point, UTF-8 encoded.
std::string bytes_to_byte_level(std::string_view bytes);
// The inverse: false (and `out` unspecified) when `text` is not valid UTF-8 or has a code point
// outside the byte alphabet.
bool byte_level_to_bytes(std::string_view text, std::string& out);

}  // namespace kiln::unicode
