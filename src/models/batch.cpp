#include "models/batch.h"

#include <algorithm>

#include "ops/ops.h"

namespace kiln {

namespace {

Status check_sampling(const Batch& b, int32_t n_vocab) {
  if (b.sample_vocab == 0) {
    if (!b.sample_rows.empty() || !b.sample_adjust.empty() || !b.sample_mask.empty())
      return invalid_argument("batch: sample_rows / sample_adjust / sample_mask given with sample_vocab = 0");
    return Status::ok_status();
  }
  if (b.sample_vocab < 0 || b.sample_vocab > n_vocab || b.argmax_vocab != 0) {
    return invalid_argument(
        "batch: sample_vocab = {} is outside [0, n_vocab = {}] or comes with argmax_vocab", b.sample_vocab,
        n_vocab);
  }
  if (b.sample_rows.size() != b.logit_rows.size()) {
    return invalid_argument("batch: {} sample_rows for {} logit_rows", b.sample_rows.size(),
                            b.logit_rows.size());
  }
  if (b.sample_n_top < 0 || b.sample_n_top > ops::kSampleMaxTop) {
    return invalid_argument("batch: sample_n_top = {} is outside [0, {}]", b.sample_n_top,
                            ops::kSampleMaxTop);
  }
  const auto n_adjust = static_cast<int64_t>(b.sample_adjust.size());
  const auto mask_words = (static_cast<size_t>(b.sample_vocab) + 31) / 32;
  if (b.sample_mask.size() % mask_words != 0) {
    return invalid_argument("batch: sample_mask has {} words, not rows of {} (sample_vocab {})",
                            b.sample_mask.size(), mask_words, b.sample_vocab);
  }
  const auto n_masks = static_cast<int64_t>(b.sample_mask.size() / mask_words);
  for (size_t i = 0; i < b.sample_rows.size(); ++i) {
    const ops::SampleRow& r = b.sample_rows[i];
    if (r.n_top < 0 || r.n_top > b.sample_n_top || r.adjust_begin < 0 || r.adjust_count < 0 ||
        int64_t{r.adjust_begin} + r.adjust_count > n_adjust || r.mask_row < -1 || r.mask_row >= n_masks) {
      return invalid_argument(
          "batch: sample_rows[{}]: n_top {} (at most {}), adjust [{}, +{}) of {}, mask_row {} of {}", i,
          r.n_top, b.sample_n_top, r.adjust_begin, r.adjust_count, n_adjust, r.mask_row, n_masks);
    }
    for (int32_t j = r.adjust_begin; j < r.adjust_begin + r.adjust_count; ++j) {
      const int32_t id = b.sample_adjust[static_cast<size_t>(j)].id;
      if (id < 0 || id >= b.sample_vocab || (j > r.adjust_begin && id <= b.sample_adjust[j - 1].id)) {
        return invalid_argument("batch: sample_adjust[{}].id = {} is not an ascending id below {}", j, id,
                                b.sample_vocab);
      }
    }
  }
  return Status::ok_status();
}

}  // namespace

Status check_batch(const Batch& b, int32_t n_vocab, const KvGeometry& kv) {
  const int32_t block_size = kv.block_size;
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
    const std::span<const int32_t> table = b.block_tables[b.seq[i]];
    const int32_t pos = b.positions[i];
    const int32_t first = kv.window > 0 ? std::max(0, pos - kv.window + 1) : 0;
    for (int32_t j = first / block_size; j <= pos / block_size; ++j) {
      if (table[j] == ops::kFreedBlock) {
        return out_of_range("batch: token {} (position {}) reads block_tables[{}][{}], which is freed", i,
                            pos, b.seq[i], j);
      }
    }
  }
  for (size_t s = 0; s < b.block_tables.size(); ++s) {
    for (size_t j = 0; j < b.block_tables[s].size(); ++j) {
      const int32_t blk = b.block_tables[s][j];
      if (blk != ops::kFreedBlock && (blk < 0 || blk >= kv.n_blocks)) {
        return out_of_range("batch: block_tables[{}][{}] = {} is outside the pool's {} blocks", s, j, blk,
                            kv.n_blocks);
      }
    }
  }
  for (size_t i = 0; i < b.logit_rows.size(); ++i) {
    if (b.logit_rows[i] < 0 || static_cast<size_t>(b.logit_rows[i]) >= n ||
        (i > 0 && b.logit_rows[i] <= b.logit_rows[i - 1])) {
      return invalid_argument("batch: logit_rows[{}] = {} is not an ascending token index below {}", i,
                              b.logit_rows[i], n);
    }
  }
  if (b.argmax_vocab < 0 || b.argmax_vocab > n_vocab) {
    return invalid_argument("batch: argmax_vocab = {} is outside [0, n_vocab = {}]", b.argmax_vocab, n_vocab);
  }
  KILN_TRY(check_sampling(b, n_vocab));
  return Status::ok_status();
}

bool pad_decode(Batch& b, int32_t rows, std::span<const int32_t> spare_table) {
  const auto n = static_cast<size_t>(b.n_tokens());
  const size_t n_seqs = b.block_tables.size();
  if (static_cast<size_t>(rows) <= n || spare_table.size() != 1 || n == 0 || n_seqs == 0 ||
      b.logit_rows.size() != n || (b.argmax_vocab == 0 && b.sample_vocab == 0) ||
      (b.sample_vocab > 0 && n_seqs != n))
    return false;
  // Every row wanted, each sequence's rows together in sequence order: decode rows, and verifying rows
  // (a token and its drafts).
  for (size_t i = 0; i < n; ++i) {
    const int32_t want_seq = i == 0 ? 0 : b.seq[i - 1];
    if (b.logit_rows[i] != static_cast<int32_t>(i) || (b.seq[i] != want_seq && b.seq[i] != want_seq + 1))
      return false;
  }
  if (b.seq[0] != 0 || static_cast<size_t>(b.seq[n - 1]) + 1 != n_seqs) return false;
  for (auto i = static_cast<int32_t>(n); i < rows; ++i) {
    b.tokens.push_back(0);
    b.positions.push_back(0);
    b.seq.push_back(static_cast<int32_t>(b.block_tables.size()));
    b.block_tables.push_back(spare_table);
    b.logit_rows.push_back(i);
    if (b.sample_vocab > 0) b.sample_rows.push_back(ops::SampleRow{});  // greedy, no mask, nothing reported
  }
  // As many sequences as rows (a verifying step's past its pads empty, which no row reads): the step then
  // has the shapes of a decode step of `rows` rows, and a backend replays what it recorded for that.
  b.block_tables.resize(static_cast<size_t>(rows));
  return true;
}

}  // namespace kiln
