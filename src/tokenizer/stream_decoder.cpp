#include "tokenizer/stream_decoder.h"

#include "tokenizer/unicode.h"

namespace kiln {

Result<std::string> StreamDecoder::feed(int32_t id) {
  if (!tok_.append_piece(id, skip_special_, first_, pending_)) {
    return out_of_range("stream decoder: token id {} is outside the vocabulary of {} tokens", id,
                        tok_.n_vocab());
  }
  if (!(skip_special_ && tok_.is_special(id))) first_ = false;
  const size_t n = unicode::utf8_complete_prefix(pending_);
  std::string out = pending_.substr(0, n);
  pending_.erase(0, n);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

void StreamDecoder::reset() {
  pending_.clear();
  first_ = true;
}

}  // namespace kiln
