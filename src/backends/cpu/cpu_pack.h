// Weights repacked at load into the packed layouts of kernels/cpu_kernels.h, 16 rows interleaved: the
// block-quantized types with their scales beside their quants, which the backend's packed kernel streams for
// every precision_fast matmul; f32 / f16 / bf16 element by element, for every matmul of those weights (exact
// or not). The layouts belong to the CPU backend: the model and the ops see the file's tensor, and the exact
// path (--exact) reads a quantized tensor's file blocks.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backends/cpu/kernels/cpu_kernels.h"
#include "core/thread_pool.h"
#include "ops/ops.h"

namespace kiln::cpu {

class PackedWeight final : public ops::PreparedWeight {
 public:
  explicit PackedWeight(size_t bytes);
  ~PackedWeight() override;
  PackedWeight(const PackedWeight&) = delete;
  PackedWeight& operator=(const PackedWeight&) = delete;

  uint8_t* data() { return data_; }
  size_t bytes() const override { return bytes_; }
  // One per matrix of the weight (w.ne[2] of them: a MoE's experts), in one of the two layouts: mats for a
  // block-quantized weight, fmats for a float one (the other empty).
  std::vector<PackedMatrix> mats;
  std::vector<PackedFloatMatrix> fmats;

 private:
  uint8_t* data_;
  size_t bytes_;
};

// `w` [k, n, n_mats] (rows contiguous) in the packed layout of its type, packed by `pool`'s threads; null
// when the level has no packed kernel for it, the type no packed form (types without a q8 activation
// format), or a scale of this tensor is not exactly what the layout can hold (then the file's blocks serve
// it as before). f32 / f16 / bf16 go to the packed float layout, their bits unchanged.
// `read_done`, if set, is told (from the pool's threads) of each run of w's rows once packed, a few MiB at a
// time.
std::unique_ptr<PackedWeight> pack_weight(ThreadPool& pool, const CpuKernels& kern, const Tensor& w,
                                          const std::function<void(const void*, size_t)>& read_done = {});

// Row j of a packed matrix as f32 [k], the same bits as the reference dequantizer gives from the file's
// blocks (get_rows on a tied embedding table reads its packed copy, so the file's pages stay out of memory).
void dequantize_packed_row(const PackedMatrix& w, int64_t j, float* out);
// Row j of a packed float matrix as f32 [k] (exact: the file's values widened, as the reference does).
void packed_float_row(const PackedFloatMatrix& w, int64_t j, float* out);

// The packed form of an op's weight, or null.
const PackedWeight* packed_form(const ops::Weight& w);

}  // namespace kiln::cpu
