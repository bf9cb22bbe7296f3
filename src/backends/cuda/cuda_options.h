// The CUDA backend's options: read once, when the backend is made (cuda_options_from_env), logged at debug
// level, and carried in the kernels' Context (cuda_kernels.h), whose launch code reads the fields. Nothing
// else in the backend reads the environment.
//
// | variable           | default | field   | what it changes                                                |
// |--------------------|---------|---------|----------------------------------------------------------------|
// | KILN_CUDA_GRAPHS=N | 32      | graphs  | decode-step graphs kept (0: steps launched op by op)          |
// | KILN_CUDA_PDL=0    | 1       | pdl     | no programmatic dependent launch (sm_90 and newer only anyway) |
// | KILN_CUDA_FUSE=0   | 1       | fuse    | every op its own kernel (fused sequences: run_fused)           |
// | KILN_CUDA_MMQ=0    | 1       | mmq     | K-quant batches take the integer GEMV or cuBLAS, not mmq       |
// | KILN_CUDA_WGMMA=0  | 1       | wgmma   | no warpgroup kernels (Hopper): FP8 batches of 9-64 rows take   |
// |                    |         |         | cuBLASLt, prefill attention mma.sync                           |
// | KILN_CUDA_PROFILE=1| 0       | profile | each op timed alone, a table printed when the backend goes     |
//
// precision comes from BackendOptions, batch_invariant from the engine. The other fields have no variable:
// tests and bench/matmul_bench set them to reach each kernel path.
#pragma once

#include <string>

#include "ops/ops.h"

namespace kiln {

// The fewest x rows of a batch of K-quant weights that the integer tensor-core kernel takes (matmul/mmq.cu).
// Measured on an H100 (the 8B's Q4_K_M, kiln bench --batch, from 9 rows against 4 and 5): 4 requests decode
// 651-663 tokens/s by the GEMV and 557-566 by this kernel; 5 requests 639-641 and 694-695, 8 requests
// 897-899 and 1,075-1,095.
inline constexpr int kMmqMinCols = 5;
// The most x rows a batch that takes it may have.
inline constexpr int kMmqMaxCols = 64;

struct CudaOptions {
  // ---- from BackendOptions ----
  // precision_fast: Matmul, MoeMatmul and Attention on the integer GEMV and tensor cores; else exact f32.
  ops::Precision precision = ops::Precision::precision_exact;
  // ---- set by the engine (--deterministic) ----
  // Batch-invariant execution: every op's result for a token (a row of x, a query of Attention, an expert
  // slot of MoeMatmul) is bitwise independent of the other rows, tokens and sequences of the step (alone, in
  // a decode of 64 sequences, or a prefill chunk among decodes), for every weight type and both precisions.
  // Each op then takes one kernel whatever the batch, one whose order of sums for a row depends on shapes
  // alone: matmuls never take cuBLAS, attention always the split-KV kernel, split by the token's span alone
  // (docs/cuda.md, "Batch-invariant mode"). Slower where the default would take cuBLAS or the prefill
  // attention kernels.
  bool batch_invariant = false;
  // ---- from the environment (the table above) ----
  // Decode steps (few tokens a request) captured and replayed as CUDA graphs, up to this many kept at once
  // (a server's batch changes size as requests come and go; each size is a graph); 0: none.
  int graphs = 32;
  bool pdl = true;   // programmatic dependent launches where the device has them (sm_90 and newer)
  bool fuse = true;  // the sequences cuda::run_fused knows run as one kernel each
  bool mmq = true;   // batches of K-quant weights take the integer tensor-core kernel (kMmqMaxCols)
  // The warpgroup (wgmma) kernels on Hopper: FP8 batches of 9-64 rows (matmul/fp8_wgmma.cu) and prefill
  // attention of head dims 65-128 (attention/attention.cu).
  bool wgmma = true;
  bool profile = false;  // each op timed alone (events and a wait), summed per kind, printed to stderr
  // ---- fields only (tests, bench/matmul_bench) ----
  // The integer GEMV copies weight rows to shared memory ahead of use (cp.async) where their alignment
  // allows (K-quant rows, rows in grouped form); false: it loads them directly.
  bool staged_gemv = true;
  int staged_gemv_grid = 0;  // > 0: at most this many blocks a staged GEMV launch; else the device's fill
  // 1, 2, 4 or 8: the rows a block of one-column GEMVs (FP8 rows on the CUDA cores); 16: FP8 rows on the
  // tensor cores where they can, for any tokens (others by shape); 0: by shape (FP8 rows of 5 to 8 tokens on
  // the tensor cores where they can)
  int gemv_rows = 0;
  int mmq_min_cols = kMmqMinCols;  // the fewest x rows that take mmq (2 .. kMmqMaxCols)
  // Matmul weights of the legacy block types and of Q6_K held in grouped form (cuda_kernels.h: WeightLayout);
  // false: in the file's.
  bool grouped_weights = true;
  // The matmul weights prepared together (Q, K, V) held as one matrix; false: apart, as any other.
  bool stack_weights = true;
  // The GEMV of Q, K and V applies RoPE to q and k and writes k and v to the pools as it stores them
  // (matmul_gemv_rope_group); false: the RoPE + KV write kernel runs after it.
  bool gemv_rope = true;
  // ... also where V's weight has another type than Q and K's: V's GEMV a launch of its own on the same
  // rounding of x.
  bool gemv_rope_split = true;
};

// The defaults, with the variables of the table above that are set applied (any value but "0" turns a
// default-on option on; KILN_CUDA_GRAPHS takes a count, and a value that is not one keeps the default;
// KILN_CUDA_PROFILE only "1" turns profiling on).
CudaOptions cuda_options_from_env();
// The options as one line, for the log.
std::string describe(const CudaOptions& o);

}  // namespace kiln
