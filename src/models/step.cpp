#include "models/step.h"

#include <cstring>

namespace kiln::blocks {

Result<StepTensors> StepBuilder::build(const Batch& batch, const KvBuffers& kv, const ModelInfo& info) {
  KILN_TRY(check_batch(batch, info.n_vocab, {kv.block_size, kv.n_blocks, info.kv_window}));
  if (static_cast<int32_t>(kv.k.size()) != info.n_layers) {
    return invalid_argument("forward: KV buffers have {} layers, the model {}", kv.k.size(), info.n_layers);
  }
  const auto n = static_cast<int64_t>(batch.tokens.size());
  const auto n_seqs = static_cast<int64_t>(batch.block_tables.size());
  int64_t n_indices = 0;
  for (const auto& table : batch.block_tables) n_indices += static_cast<int64_t>(table.size());
  // Padded (with block 0, which no sequence's range reaches) to a power of two from 16: the step's shapes
  // then change only when the batch does, not each time a sequence takes a new block, and a backend that
  // replays recorded steps (CUDA graphs) seldom records anew.
  int64_t indices_len = 16;
  while (indices_len < n_indices) indices_len *= 2;
  const int64_t n_logits = static_cast<int64_t>(batch.logit_rows.size());
  // Sampling: the rows' parameters, and their adjustments padded as the block tables are (unused entries are
  // read by no row).
  const bool sampling = batch.sample_vocab > 0;
  int64_t adjust_len = sampling ? 16 : 0;
  while (adjust_len < static_cast<int64_t>(batch.sample_adjust.size())) adjust_len *= 2;
  // The masks of the constrained rows, their count padded to a power of two (a CUDA graph then seldom sees a
  // new shape).
  const int64_t mask_words = sampling ? (int64_t{batch.sample_vocab} + 31) / 32 : 1;
  const auto n_masks = static_cast<int64_t>(batch.sample_mask.size()) / mask_words;
  int64_t masks_len = n_masks > 0 ? 1 : 0;
  while (masks_len < n_masks) masks_len *= 2;

  // Ten arrays packed one after another, each padded to 16 elements (64 bytes).
  const int64_t rows_len = sampling ? 16 * n_logits : 0;
  const int64_t sizes[] = {
      n, n, n, n, n_seqs + 1, indices_len, n_logits, rows_len, 4 * adjust_len, mask_words * masks_len};
  int64_t offsets[std::size(sizes)];
  int64_t total = 0;
  for (size_t i = 0; i < std::size(sizes); ++i) {
    offsets[i] = total;
    total += (sizes[i] + 15) / 16 * 16;
  }
  total += 16;  // an empty array is a one-element view at its offset: room for one past the last
  host_.assign(static_cast<size_t>(total), 0);
  int32_t* tokens = host_.data() + offsets[0];
  int32_t* positions = host_.data() + offsets[1];
  int32_t* slots = host_.data() + offsets[2];
  int32_t* seq = host_.data() + offsets[3];
  int32_t* indptr = host_.data() + offsets[4];
  int32_t* indices = host_.data() + offsets[5];
  for (int64_t t = 0; t < n; ++t) {
    const int32_t pos = batch.positions[t], s = batch.seq[t];
    tokens[t] = batch.tokens[t];
    positions[t] = pos;
    slots[t] = batch.block_tables[s][pos / kv.block_size] * kv.block_size + pos % kv.block_size;
    seq[t] = s;
  }
  indptr[0] = 0;
  for (int64_t s = 0; s < n_seqs; ++s) {
    const auto& table = batch.block_tables[s];
    std::copy(table.begin(), table.end(), indices + indptr[s]);
    indptr[s + 1] = indptr[s] + static_cast<int32_t>(table.size());
  }
  std::copy(batch.logit_rows.begin(), batch.logit_rows.end(), host_.data() + offsets[6]);
  if (sampling) {
    std::memcpy(host_.data() + offsets[7], batch.sample_rows.data(),
                batch.sample_rows.size() * sizeof(ops::SampleRow));
    std::memcpy(host_.data() + offsets[8], batch.sample_adjust.data(),
                batch.sample_adjust.size() * sizeof(ops::SampleAdjust));
    std::memcpy(host_.data() + offsets[9], batch.sample_mask.data(),
                batch.sample_mask.size() * sizeof(uint32_t));
  }

  const size_t bytes = static_cast<size_t>(total) * sizeof(int32_t);
  if (!buffer_ || buffer_->size() < bytes) {
    KILN_ASSIGN_OR_RETURN(buffer_, backend_.allocate(std::max<size_t>(bytes * 2, 4096)));
  }
  const Tensor all = make_tensor(DType::i32, *buffer_, 0, total);
  KILN_TRY(backend_.upload(all, host_.data(), bytes));

  StepTensors st;
  st.n_tokens = static_cast<int32_t>(n);
  st.n_seqs = static_cast<int32_t>(n_seqs);
  st.n_logits = static_cast<int32_t>(n_logits);
  st.argmax_vocab = batch.argmax_vocab;
  st.sample_vocab = batch.sample_vocab;
  st.sample_n_top = batch.sample_n_top;
  Tensor* views[] = {&st.tokens,     &st.positions,  &st.slots,       &st.seq,           &st.bt_indptr,
                     &st.bt_indices, &st.logit_rows, &st.sample_rows, &st.sample_adjust, &st.sample_mask};
  for (size_t i = 0; i < std::size(sizes); ++i) {
    *views[i] = make_tensor(DType::i32, *buffer_, static_cast<size_t>(offsets[i]) * sizeof(int32_t),
                            std::max<int64_t>(sizes[i], 1));
    views[i]->ne[0] = sizes[i];  // an empty array is a 0-element view
  }
  for (Tensor* t : {&st.sample_rows, &st.sample_adjust, &st.sample_mask}) {  // rows of 16, 4, mask_words
    const int64_t width = t == &st.sample_rows ? 16 : t == &st.sample_adjust ? 4 : mask_words;
    t->ne[1] = t->ne[0] / width;
    t->ne[0] = width;
    t->nb[1] = t->nb[0] * width;
    t->nb[2] = t->nb[3] = t->nb[1] * t->ne[1];
  }
  if (masks_len == 0) st.sample_mask = Tensor{};  // no row has a mask: ops::Sample reads none
  return st;
}

}  // namespace kiln::blocks
