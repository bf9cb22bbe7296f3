// The step metadata every layer of one forward step reads, made once per step: the batch is checked
// (check_batch: every value an op will read), flattened into i32 arrays in the layout paged-attention kernels
// consume (vLLM's slot_mapping, FlashInfer's CSR block tables), and uploaded to backend memory in one
// transfer. Ops then take these tensors as operands and never see a host pointer to step data.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backends/backend.h"
#include "models/batch.h"
#include "models/model.h"

namespace kiln::blocks {

struct StepTensors {
  int32_t n_tokens = 0;      // tokens in the step
  int32_t n_seqs = 0;        // sequences (block tables) in the step
  int32_t n_logits = 0;      // rows whose logits are wanted
  int32_t argmax_vocab = 0;  // Batch::argmax_vocab: > 0, the output is each wanted row's argmax over these
  int32_t sample_vocab = 0;  // Batch::sample_vocab: > 0, the output is each wanted row's drawn token
  int32_t sample_n_top = 0;  // Batch::sample_n_top
  Tensor tokens;             // i32 [n_tokens] token ids
  Tensor positions;          // i32 [n_tokens] position of each token in its sequence
  Tensor slots;          // i32 [n_tokens] KV slot of each token: block * block_size + offset (slot_mapping)
  Tensor seq;            // i32 [n_tokens] the token's sequence, an index into the block tables
  Tensor bt_indptr;      // i32 [n_seqs + 1] sequence s's blocks: bt_indices[bt_indptr[s] .. bt_indptr[s + 1])
  Tensor bt_indices;     // i32 [total blocks, padded to a power of two >= 16] block ids, or ops::kFreedBlock
  Tensor logit_rows;     // i32 [n_logits] token indices whose logits are wanted, ascending (or none)
  Tensor sample_rows;    // i32 [16, n_logits] ops::SampleRow each (sampling steps; else empty)
  Tensor sample_adjust;  // i32 [4, n], ops::SampleAdjust each, padded to a power of two from 16 (or empty)
  // i32 [ceil(sample_vocab / 32), n_masks] Batch::sample_mask, the rows padded (with zeros) to a power of
  // two, or empty (no data) when no row has a mask
  Tensor sample_mask;
};

// Builds StepTensors into one backend buffer that it keeps and reuses (grown when a step needs more).
class StepBuilder {
 public:
  explicit StepBuilder(Backend& backend) : backend_(backend) {}
  // check_batch(batch, info.n_vocab, kv geometry), then the metadata, uploaded. The tensors are valid until
  // the next build().
  Result<StepTensors> build(const Batch& batch, const KvBuffers& kv, const ModelInfo& info);

 private:
  Backend& backend_;
  std::unique_ptr<Buffer> buffer_;
  std::vector<int32_t> host_;  // the packed arrays, each starting on a 64-byte boundary
};

}  // namespace kiln::blocks
