#include "models/batch.h"

namespace kiln {

Status check_batch(const Batch& b, int32_t n_vocab, int32_t block_size) {
  const size_t n = b.tokens.size();
  if (n == 0) return invalid_argument("batch: no tokens");
  if (b.positions.size() != n || b.seq.size() != n) {
    return invalid_argument("batch: {} tokens but {} positions and {} sequence indices", n,
                            b.positions.size(), b.seq.size());
  }
  for (size_t i = 0; i < n; ++i) {
    if (b.tokens[i] < 0 || b.tokens[i] >= n_vocab) {
      return out_of_range("batch: tokens[{}] = {} is outside the vocabulary of {}", i, b.tokens[i], n_vocab);
    }
    if (b.seq[i] < 0 || static_cast<size_t>(b.seq[i]) >= b.block_tables.size()) {
      return out_of_range("batch: seq[{}] = {} but there are {} sequences", i, b.seq[i],
                          b.block_tables.size());
    }
    if (b.positions[i] < 0 ||
        static_cast<size_t>(b.positions[i] / block_size) >= b.block_tables[b.seq[i]].size()) {
      return out_of_range("batch: positions[{}] = {} is beyond sequence {}'s {} blocks", i, b.positions[i],
                          b.seq[i], b.block_tables[b.seq[i]].size());
    }
  }
  for (size_t i = 0; i < b.logit_rows.size(); ++i) {
    if (b.logit_rows[i] < 0 || static_cast<size_t>(b.logit_rows[i]) >= n ||
        (i > 0 && b.logit_rows[i] <= b.logit_rows[i - 1])) {
      return invalid_argument("batch: logit_rows[{}] = {} is not an ascending token index below {}", i,
                              b.logit_rows[i], n);
    }
  }
  return Status::ok_status();
}

}  // namespace kiln
