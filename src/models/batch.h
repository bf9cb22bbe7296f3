// Batch: the input of Model::forward, the one path every token takes (docs/architecture.md).
// A flat list of tokens from any number of sequences: a prefill is many tokens of one sequence, a decode one
// token of each of many sequences, and a step may mix both. Nothing is padded unless pad_decode() says so.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "ops/sample.h"

namespace kiln {

struct Batch {
  std::vector<int32_t> tokens;                         // [n_tokens] token ids
  std::vector<int32_t> positions;                      // [n_tokens] position of each token in its sequence
  std::vector<int32_t> seq;                            // [n_tokens] index into block_tables
  std::vector<std::span<const int32_t>> block_tables;  // [n_seqs] each sequence's KV blocks, in order
  std::vector<int32_t> logit_rows;                     // token indices whose logits are wanted, ascending
  // > 0: reduce each wanted row to the argmax of its first argmax_vocab logits on the backend (ops::Argmax;
  // the tokenizer's vocabulary, when the model's rows are padded past it). forward() then returns i32 token
  // ids: a step of greedy requests downloads 4 bytes a row instead of n_vocab floats.
  int32_t argmax_vocab = 0;
  // > 0 (argmax_vocab then 0): draw each wanted row's token on the backend from its first sample_vocab logits
  // (ops::Sample), row i under sample_rows[i], its entries of sample_adjust and, when its mask_row >= 0, that
  // row of sample_mask (the tokens a grammar allows). forward() then returns i32
  // [2 + 2 * sample_n_top, logit_rows.size()]: a sampled step downloads its tokens and the logprobs asked
  // for, not its logits.
  int32_t sample_vocab = 0;
  int32_t sample_n_top = 0;  // every row's n_top at most, <= ops::kSampleMaxTop
  std::vector<ops::SampleRow> sample_rows;
  std::vector<ops::SampleAdjust> sample_adjust;
  std::vector<uint32_t> sample_mask;  // [ceil(sample_vocab / 32), n_masks] bitmasks; empty: no row has one

  int32_t n_tokens() const { return static_cast<int32_t>(tokens.size()); }
  void clear() {
    tokens.clear();
    positions.clear();
    seq.clear();
    block_tables.clear();
    logit_rows.clear();
    argmax_vocab = 0;
    sample_vocab = 0;
    sample_n_top = 0;
    sample_rows.clear();
    sample_adjust.clear();
    sample_mask.clear();
  }
};

// The KV pool geometry a batch is checked against.
struct KvGeometry {
  int32_t block_size = 0;  // tokens per block
  int32_t n_blocks = 0;    // blocks in the pool
  int32_t window = 0;  // every layer attends to the last `window` positions only (0: some layer reads all)
};

// Checks everything the step's ops will read, once per step (the ops themselves check only shapes): lengths,
// sequence indices, ascending logit rows, token ids < n_vocab, each position inside its sequence's blocks,
// every block id inside the pool, and no token reading a freed block (ops::kFreedBlock) inside its window.
// invalid_argument / out_of_range naming the field and index.
Status check_batch(const Batch& batch, int32_t n_vocab, const KvGeometry& kv);

// Pads a decode step (every row wanted, its tokens drawn on the backend: one token a sequence, or under an
// argmax a token and its drafts, each sequence's rows together) to `rows` rows with rows that change nothing:
// each a sequence of its own, token 0 at position 0 of the block table `spare_table` (one block that no
// sequence owns: each pad writes its K/V there and reads them back), greedy when the step samples; then,
// where drafts made fewer sequences than rows, empty sequences up to `rows`. Every padded step of `rows` rows
// then has the same shapes, drafts or not, and a backend that replays recorded steps (CUDA graphs) records
// one step per padded size instead of one per batch size and draft length. The real rows keep their indices;
// the pads' results follow them and are not read. spare_table must outlive the batch's use. Returns false,
// the batch unchanged, when it is not such a step or has `rows` rows or more.
bool pad_decode(Batch& batch, int32_t rows, std::span<const int32_t> spare_table);

}  // namespace kiln
