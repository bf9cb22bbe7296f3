// StreamDecoder: turns token ids, fed one at a time, into text that never ends inside a UTF-8 character
// (a character split over byte tokens is held back until its last byte arrives). The concatenation of
// every feed() and the final flush() equals Tokenizer::decode of the same ids.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

class StreamDecoder {
 public:
  // Keeps its own (cheap, shared) copy of the tokenizer.
  explicit StreamDecoder(Tokenizer tok, bool skip_special = true)
      : tok_(std::move(tok)), skip_special_(skip_special) {}

  // The text completed by `id` (possibly empty). Error: out_of_range for an id outside the vocabulary
  // (nothing is consumed).
  Result<std::string> feed(int32_t id);
  // The bytes still held back (an unfinished character at the end of generation), as they are.
  std::string flush();
  // Forgets everything, to decode a new sequence.
  void reset();
  // Bytes held back now (at most 3 of an unfinished character).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  Tokenizer tok_;
  bool skip_special_;
  bool first_ = true;    // no token has produced output yet (decode's leading-space rule)
  std::string pending_;  // bytes not yet returned
};

}  // namespace kiln
