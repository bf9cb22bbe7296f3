// The integer tensor-core matmul of block-quantized weights (matmul/mmq.cu): batches of
// CudaOptions::mmq_min_cols (kMmqMinCols unless set) to kMmqMaxCols x rows at the fast precision, x rounded
// to 8 bits as for the integer GEMV (matmul/dot_q8.cuh).
#pragma once

#include <cstdint>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_kernels.h"

namespace kiln::cuda {

// One weight matrix times m x rows.
struct MmqArgs {
  const uint8_t* w;  // [k, n], rows w_nb1 apart; rows start 16-byte aligned and are whole 16-byte chunks
  int64_t w_nb1;
  int64_t n, k;
  int64_t m;
  // x rounded to 8 bits, in tiles of 8 tokens (mmq_tile_x).
  const int* xq;
  const float2* xds;
  Rows dst;  // rows of n
  DType dst_type;
  bool grouped;  // Q6_K rows in grouped form (matmul/dequant.cuh's q6k_block)
};

// The weight types the kernel reads: Q4_K, Q5_K and Q6_K.
bool mmq_type(DType type);
// Whether a weight of k elements a row, its rows nb1 bytes apart from `data` (in grouped form when
// `grouped`), is laid out as the kernel copies it: rows 16-byte aligned and whole 16-byte chunks.
bool mmq_rows_fit(DType type, const void* data, int64_t nb1, int64_t k, bool grouped);
// Copies x from quantize_x's layout (xq, xds: x row t at xq + t * k / 4 and xds + t * k / 32) into the
// kernel's tiles of 8 tokens in scratch slot `slot`, and points a.xq / a.xds there: once for the matmuls that
// share x.
cudaError_t mmq_tile_x(const Context& ctx, MmqArgs& a, int slot);
cudaError_t mmq(const Context& ctx, const MmqArgs& a, DType type);

}  // namespace kiln::cuda
