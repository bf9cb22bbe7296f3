// The CUDA kernels behind the backend (cuda_backend.cpp): one launcher per op, enqueued on the context's
// stream. Launchers assume ops::check(op) is ok and cuda::supports(op) is true; they return cudaSuccess or
// the error of a launch or of a scratch allocation (the host code turns it into a Status naming the op). This
// header is plain C++ over the CUDA runtime's types, so that host code compiled by the C++ compiler and the
// .cu files compiled by nvcc share it.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "backends/cuda/cuda_options.h"
#include "ops/ops.h"

namespace kiln::cuda {

// The values a block of an 8-bit KV pool type holds (attention/kv_pool.cuh's KvQ8B<B>): 32 for q8_0, 64 for
// q8_64; 0 for any other type.
inline int64_t kv_q8_block(DType type) { return type == DType::q8_0 ? 32 : type == DType::q8_64 ? 64 : 0; }

// The weights of the next matmuls of a program (up to three ranges, each 16-byte aligned and a multiple of
// 16 bytes long; empty ranges have no bytes). A GEMV's blocks send them toward L2 as they finish their own
// rows (weights_ahead, fusion/fusion.cu), so that the next GEMV's loads hit L2 while its launch and the
// short kernels between the two run.
struct L2Ahead {
  const void* p[3] = {};
  int64_t bytes[3] = {};
};

// What a launcher may use besides its op: the stream, a cuBLAS handle bound to it, and scratch memory.
struct Context {
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  int n_sms = 0;          // multiprocessors of the device
  bool clusters = false;  // thread-block clusters (sm_90 and newer)
  bool wgmma = false;     // warpgroup tensor-core products (sm_90 alone: compute capability 9.0)
  // Kernels launched through cuda_launch.cuh's launch_kernel() overlap their predecessor's tail
  // (options.pdl on a device that has it).
  bool pdl = false;
  // The backend's options (cuda_options.h), read once when it was made: the launch code reads them here.
  CudaOptions options;
  // The backend's precision is precision_fast (CudaOptions::precision, from BackendOptions::precision):
  // Matmul, MoeMatmul and Attention may compute at lower precision (the integer GEMV, tensor cores); else
  // exact.
  bool fast = false;
  // What the GEMVs of this launch send toward L2 for the matmuls after them (set per sequence by the backend;
  // empty: nothing).
  L2Ahead ahead;
  // Device scratch of at least `bytes`, one buffer per slot (0 .. kScratchSlots-1); valid, in stream order,
  // until the next request for the same slot. Null when the device is out of memory.
  void* (*scratch_fn)(void* owner, int slot, size_t bytes) = nullptr;
  void* owner = nullptr;
  void* scratch(int slot, size_t bytes) const { return scratch_fn(owner, slot, bytes); }
  // The backend's cuSOLVER dense handle (a cusolverDnHandle_t), bound to the stream and made at the first
  // call; null when this build has no cuSOLVER or it could not be made.
  void* (*solver_fn)(void* owner) = nullptr;
  void* solver() const { return solver_fn != nullptr ? solver_fn(owner) : nullptr; }
  // The backend's cuBLASLt handle (a cublasLtHandle_t); null when it could not be made.
  void* (*lt_fn)(void* owner) = nullptr;
  void* lt() const { return lt_fn != nullptr ? lt_fn(owner) : nullptr; }
};
// Slots 0-2: matmul's dequantized weight, converted x and f32 result; 3: the partial results of work split
// over blocks (attention's split-KV states, argmax's slices); 4: counters, zero when allocated and left zero
// by every kernel that uses them (the blocks of split work that are done).
inline constexpr int kSlotPartial = 3, kSlotCounters = 4;
inline constexpr int kScratchSlots = 5;

// Matmuls of at most this many x rows take the GEMV kernel (matmul/matmul.cu); more take cuBLAS, except:
inline constexpr int kGemvMaxCols = 8;
// at the fast precision, block-quantized weights with an integer path (matmul/dot_q8.cuh) take the GEMV up to
// this many rows (batched decode), in groups of kGemvMaxCols. Measured on an H100 (Llama-3-8B Q4_K_M): 16
// requests decode 1.5x faster than through cuBLAS, 64 requests 2.2x slower.
inline constexpr int kQ8MaxCols = 16;

// GEMMs of at most this many x rows (batched decode) are fused with their neighbours: over stacked weights
// (WeightLayout) Q, K and V run as one GEMM, which costs little more than q's alone while the split of its
// result takes a few microseconds; and the kernel that produces x writes it in the GEMM's 16-bit type, which
// spares a conversion kernel of a few microseconds. A prefill's GEMMs run apart, writing their destinations
// directly, on x converted by the 8-wide kernel (H100, 8B BF16 pp2048, two interleaved rounds: 27,708 and
// 27,573 tokens/s that way, 27,455 and 26,674 with x written by the norm and the activation).
inline constexpr int kDecodeGemmMaxCols = 64;

// Whether the kernels take `op` with its operand types (weight types, destination float types, pool types).
bool supports(const ops::Op& op);
// Enqueues `op` (dispatches to the launchers below).
cudaError_t run(const Context& ctx, const ops::Op& op);
// Enqueues the ops that start `ops` as one fused kernel when they form a sequence it knows (fusion/fusion.cu:
// matmuls sharing their x, a gate and an up GEMV and their gated activation, a residual add and the norm of
// its sum (and the integer GEMVs that read it), RoPE of q and k with their KV write), with the arithmetic of
// the ops run one by one, so results are bit-identical. Sets `consumed` to the number of ops it ran: 0 when
// none of its sequences starts there.
cudaError_t run_fused(const Context& ctx, std::span<const ops::Op> ops, size_t& consumed);
// The length of the fused sequence run_fused would run at the start of `ops` (0: none).
size_t fused_length(const Context& ctx, std::span<const ops::Op> ops);
// The weights that the first GEMV matmuls in `ops` read (those of its first group: matmuls on one x, or a
// gate and up pair), when they take at most `cap` bytes in all; else, or when the first matmul in `ops` takes
// no GEMV, none.
L2Ahead weights_ahead(const Context& ctx, std::span<const ops::Op> ops, int64_t cap);

// Weight / table types the quantized kernels read (matmul/matmul_gemm.cu).
bool supports_weight_type(DType type);

// How the backend holds a matmul weight beyond a plain copy of the file's bytes. Weight::tensor keeps the
// file's type and shape, and:
// - grouped: the rows of a legacy block type (q4_0, q4_1, q5_0, q5_1, q8_0) or of q6_k are in grouped form
//   (matmul/dequant.cuh's legacy_block: each 8 blocks' headers, then their quants; q6k_block: each 8
//   super-blocks' scales, their d, then their quants; 16-byte aligned), grouped_row_bytes() apart; those of
//   f8_e4m3 with one scale a row in row form (Quant<f8_e4m3>: the scale, then the row's codes). Every kernel
//   that reads a Matmul weight reads both forms.
// - stack (not null): the weight is one of the matrices prepared together (Backend::prepare_weight_group: Q,
//   K, V), held as one matrix: each one's rows right after the previous one's, in the allocation that
//   `stack` points at. The GEMM computes such parts as one (matmul_gemm_group).
// - row_scales (not null): an f8_e4m3 weight in row form also has its rows' scales as one f32 vector (after
//   the rows, in the same allocation; a stack's parts' vectors follow one another), which the e4m3 GEMM
//   takes as it is.
class WeightLayout final : public ops::PreparedWeight {
 public:
  WeightLayout(bool grouped, const void* stack, const float* row_scales = nullptr)
      : grouped_(grouped), stack_(stack), row_scales_(row_scales) {}
  size_t bytes() const override { return 0; }  // the handle's storage holds the rows: no memory of its own
  bool grouped() const { return grouped_; }
  const void* stack() const { return stack_; }
  const float* row_scales() const { return row_scales_; }

 private:
  bool grouped_;
  const void* stack_;
  const float* row_scales_;
};
inline const WeightLayout* layout_of(const ops::Weight& w) {
  return dynamic_cast<const WeightLayout*>(w.prepared);
}
inline bool grouped(const ops::Weight& w) {
  const WeightLayout* l = layout_of(w);
  return l != nullptr && l->grouped();
}
// The bytes of a row of k elements of `type` in grouped form (a multiple of 16), or 0 when the type has no
// grouped form.
int64_t grouped_row_bytes(DType type, int64_t k);
// The same for the rows of these tensors (in host memory) held as one matrix: 0 unless they have one type and
// k, and for f8_e4m3 unless each row's blocks have one scale.
int64_t grouped_row_bytes(std::span<const Tensor> host);
// Writes the rows of `src` (a [k, n] matrix of such a type in device memory) to `dst` in grouped form,
// dst_nb1 (grouped_row_bytes) apart; the padding is zero.
cudaError_t group_rows(const Context& ctx, const Tensor& src, void* dst, int64_t dst_nb1);
// The scales of n f8_e4m3 rows in row form (nb1 apart from `rows`) as one f32 vector (WeightLayout).
cudaError_t fp8_row_scale_vector(const Context& ctx, const void* rows, int64_t nb1, int64_t n, float* out);

// matmul/matmul.cu (the decision table of which kernel a matmul takes is at its top) and
// matmul/matmul_gemm.cu
cudaError_t get_rows(const Context& ctx, const ops::GetRows& op);
cudaError_t matmul(const Context& ctx, const ops::Matmul& op);
// Whether `op` takes the GEMV kernel (its x rows and weight type, as above).
bool takes_gemv(const Context& ctx, const ops::Matmul& op);
// Whether it takes the integer GEMV (x rounded to 8 bits).
bool takes_q8(const Context& ctx, const ops::Matmul& op);
// 1-3 matmuls on the same x that take the GEMV, with weights of one type and k: one GEMV
// launch.
cudaError_t matmul_gemv_group(const Context& ctx, std::span<const ops::Matmul* const> group);
// RoPE of q, RoPE of k and the KV write after the matmuls that compute q, k and v (rope_kv_write's ops).
struct RopeOps {
  const ops::Rope* q;
  const ops::Rope* k;
  const ops::KvWrite* kv;
};
// Whether the Q, K and V matmuls of one GEMV launch (as matmul_gemv_group takes them, at most kGemvMaxCols
// tokens) may rotate and write the pools as they store (RopeOps: in place on their f32 results, in the
// normal layout, every dim of a head rotated); fusion/fusion.cu checks the operands. Or, on the integer GEMV,
// Q and K of one launch and V, whose weight has another type (of the same k), of a launch of its own on the
// same rounding of x (a Q4_K_M layer's Q6_K V).
bool gemv_rope_ok(const Context& ctx, std::span<const ops::Matmul* const> group, const RopeOps& rope);
// matmul_gemv_group of Q, K and V, then `rope` (rope_kv_write's ops on their results): in the GEMV's stores
// where its path rotates (matmul/gemv.cuh's GemvRope), else by rope_kv_write after it. The same bits either
// way. V of another type: two launches, which rotate where both paths allow, else neither does.
cudaError_t matmul_gemv_rope_group(const Context& ctx, std::span<const ops::Matmul* const> group,
                                   const RopeOps& rope);
// Whether a gate and an up matmul on one x (as matmul_gemv_group takes them) can run paired: the exact GEMV
// of at most kGemvMaxCols rows, as many rows each, f32 results.
bool gemv_pairs(const Context& ctx, const ops::Matmul& gate, const ops::Matmul& up);
// Such a pair and the gated activation of their results (glu.gate, glu.up: their destinations; f32 dst of
// that shape, written over one of them or apart from every operand): one GEMV launch whose blocks each
// compute rows i .. of both and store the activation of each pair beside them, with the arithmetic of the
// activation's own kernel (the same bits), so no kernel of its own runs.
cudaError_t gemv_act_pair(const Context& ctx, const ops::Matmul& gate, const ops::Matmul& up,
                          const ops::GatedAct& glu);
// Whether two matmuls that take the GEMM give it x in the same type.
bool same_gemm_input(const Context& ctx, const ops::Matmul& a, const ops::Matmul& b);
// 2-3 matmuls on the same x that take the GEMM, with one GEMM input type (same_gemm_input): x converted to it
// once, then each matmul's GEMM as matmul() runs it; or, when their weights are the parts of one stack in
// order (WeightLayout) and their destinations of one type, one GEMM over the stack whose f32 result one
// kernel splits into the destinations. FP8 weights that take the e4m3 GEMM: each matmul's as matmul() runs
// it.
cudaError_t matmul_gemm_group(const Context& ctx, std::span<const ops::Matmul* const> group);
// A residual add, the RMSNorm of its sum (add_rms_norm) and 1-3 matmuls on the norm's f32 result that take
// the integer GEMV (as matmul_gemv_group takes them): the norm's kernel also rounds x to 8 bits, so no kernel
// of its own does.
cudaError_t add_norm_gemv_group(const Context& ctx, const ops::Binary& add, const ops::RmsNorm& norm,
                                std::span<const ops::Matmul* const> group);
// The same for Q, K and V, then `rope` as matmul_gemv_rope_group.
cudaError_t add_norm_gemv_rope_group(const Context& ctx, const ops::Binary& add, const ops::RmsNorm& norm,
                                     std::span<const ops::Matmul* const> group, const RopeOps& rope);
// A gated activation (f32 dst, n a multiple of 32) and 1-3 matmuls on its result that take the integer GEMV:
// its kernel also rounds that result to 8 bits for them.
cudaError_t glu_gemv_group(const Context& ctx, const ops::GatedAct& glu,
                           std::span<const ops::Matmul* const> group);
// Whether a matmul that takes the GEMM reads x in 16 bits (bf16, or f16 saturated): the kernel that produces
// x then writes it so for the GEMM (add_norm_gemm_group, glu_gemm_group, attention_gemm_group), at any row
// count, where the conversion kernel would read the f32 result back (the 8B's pp2048: 96 conversions of 14.5
// to 21.7 us each). Not the e4m3 GEMM of FP8 weights, which rounds f32 x itself.
bool gemm_takes_half_x(const Context& ctx, const ops::Matmul& op);
// Whether matmuls on one x each take the e4m3 GEMM of FP8 weights (x rounded to e4m3 once for them).
bool gemm_takes_e4m3_x(const Context& ctx, std::span<const ops::Matmul* const> group);
// ... and whether the add + norm or the gated activation that produces x then rounds it as it writes it
// (add_norm_gemm_group, glu_gemm_group), where the rounding kernel would read the f32 result back (the 8B's
// pp2048: 2048 x 14336 values for down, 2048 x 4096 for Q/K/V and for gate and up, each layer): for rows
// enough to fill the device a row a block (at least its multiprocessors). Fewer rows keep the kernels apart:
// a block a row of the activation left most multiprocessors idle (H100, the 8B in FP8 at 64 requests: 9,087
// against 9,433 tokens/s with the rounding apart; pp2048 45,732 against 43,994).
bool produced_e4m3_x(const Context& ctx, std::span<const ops::Matmul* const> group);
// A residual add and the RMSNorm of its sum, then 1-3 matmuls on the norm's f32 result that take the GEMM in
// 16 bits (gemm_takes_half_x; one input type): the norm's kernel also writes that result in the GEMM's type,
// rounded as the GEMM's own conversion rounds it, so no conversion kernel runs (the same bits). Or matmuls
// that take the e4m3 GEMM (produced_e4m3_x): the kernel rounds the result to e4m3 as fp8_round_x would.
cudaError_t add_norm_gemm_group(const Context& ctx, const ops::Binary& add, const ops::RmsNorm& norm,
                                std::span<const ops::Matmul* const> group);
// The same for a gated activation (f32 dst; for the e4m3 GEMM, gated_act_rounds_e4m3) and the matmul(s) on
// its result.
cudaError_t glu_gemm_group(const Context& ctx, const ops::GatedAct& glu,
                           std::span<const ops::Matmul* const> group);
// The same for a prefill's attention (attention_writes_half) and the matmul on its result (the output
// projection), whose x is the attention's dst: the 8B's 2048 x 4096 in a pp2048, 50 MB read and written by
// the conversion kernel otherwise.
cudaError_t attention_gemm_group(const Context& ctx, const ops::Attention& att,
                                 std::span<const ops::Matmul* const> group);
// A decode's attention (attention_rounds_q8) and the matmul on its result that takes the integer GEMV: the
// attention's kernel rounds x for it, so quantize_x()'s kernel does not run (run_fused: where that matmul's
// rows are short).
cudaError_t attention_gemv_group(const Context& ctx, const ops::Attention& att,
                                 std::span<const ops::Matmul* const> group);
cudaError_t moe_matmul(const Context& ctx, const ops::MoeMatmul& op);
// norm_rope/norm.cu (rms_norm, layer_norm, add_rms_norm) and elementwise/elementwise.cu (the rest):
// row-wise and elementwise ops, MoE routing and mixing
//
// A result also rounded to e4m3 for the FP8 GEMM, as its own rounding kernel would (matmul/fp8_round.cuh):
// row r's codes at codes + r * n, its scale at scales[r]: `fixed` where it is a static scale (> 0), else the
// row's largest magnitude / 448.
struct E4m3Out {
  uint8_t* codes;
  float* scales;
  float fixed;
};
cudaError_t rms_norm(const Context& ctx, const ops::RmsNorm& op);
cudaError_t layer_norm(const Context& ctx, const ops::LayerNorm& op);
// binary (add, no broadcast, f32 dst) then rms_norm of its dst; with xq / xds (an f32 norm dst, n a multiple
// of 32) also that result rounded to 8 bits for the integer GEMV, in quantize_x's layout (matmul/matmul.cu).
// With xh (n a multiple of 8): also that result in 16 bits for a GEMM (bf16, or f16 saturated when f16), row
// r at xh + r * n. With e4 (an f32 norm dst): also that result in e4m3 (E4m3Out).
cudaError_t add_rms_norm(const Context& ctx, const ops::Binary& add, const ops::RmsNorm& norm,
                         int* xq = nullptr, float2* xds = nullptr, uint16_t* xh = nullptr, bool f16 = false,
                         const E4m3Out* e4 = nullptr);
cudaError_t softmax(const Context& ctx, const ops::Softmax& op);
// With xq / xds (an f32 dst, n a multiple of 32): also the result rounded to 8 bits, as add_rms_norm; with
// xh, also in 16 bits, as add_rms_norm; with e4 (only where gated_act_rounds_e4m3), also in e4m3.
cudaError_t gated_act(const Context& ctx, const ops::GatedAct& op, int* xq = nullptr, float2* xds = nullptr,
                      uint16_t* xh = nullptr, bool f16 = false, const E4m3Out* e4 = nullptr);
// Whether gated_act rounds its result to e4m3 (a row a block): f32 rows of a multiple of 4 elements, 16-byte
// aligned, a gate of the up's shape.
bool gated_act_rounds_e4m3(const ops::GatedAct& op);
cudaError_t binary(const Context& ctx, const ops::Binary& op);
cudaError_t scale(const Context& ctx, const ops::Scale& op);
cudaError_t argmax(const Context& ctx, const ops::Argmax& op);
cudaError_t moe_route(const Context& ctx, const ops::MoeRoute& op);
cudaError_t weighted_sum(const Context& ctx, const ops::WeightedSum& op);
// stats/sum_squares.cu
cudaError_t sum_squares(const Context& ctx, const ops::SumSquares& op);
// Whether sum_squares can add op.gram (x's rows evenly spaced, as cuBLAS takes them).
bool gram_rows_supported(const ops::SumSquares& op);
// linalg/inverse_cholesky.cu: cuSOLVER's Cholesky factorization and triangular inverse, in f64
cudaError_t inverse_cholesky(const Context& ctx, const ops::InverseCholesky& op);
// Whether this build has cuSOLVER (else the op is refused).
bool inverse_cholesky_supported();
// sampling/sample.cu: a token drawn per logits row (ops/sample.h's stages), a block a row
cudaError_t sample(const Context& ctx, const ops::Sample& op);
// norm_rope/rope.cu: RoPE and the KV write
cudaError_t rope(const Context& ctx, const ops::Rope& op);
cudaError_t kv_write(const Context& ctx, const ops::KvWrite& op);
// rope of q, rope of k (same positions and parameters), then kv_write of the rotated k and v.
cudaError_t rope_kv_write(const Context& ctx, const ops::Rope& q, const ops::Rope& k, const ops::KvWrite& kv);
// Whether rope_kv_write takes a RoPE of these parameters, and these pools: f16 or f32 each, or q8_0 or q8_64
// both (head rows of at most 256 values). The GEMVs that apply RoPE in their stores write the same pools
// (8-bit ones a head row at a time: matmul/gemv.cuh).
bool rope_supported(const ops::RopeParams& p);
bool rope_kv_write_pools(const ops::KvWrite& kv);
// attention/attention.cu (head_dim <= 256)
bool attention_supported(const ops::Attention& op);
// With xh: also the result in 16 bits for the GEMM after (bf16, or f16 saturated when f16; as add_rms_norm),
// row r (token t, head h: h + n_heads * t) at xh + r * head_dim; only where attention_writes_half(op). With
// xq / xds: also the result rounded to 8 bits for the integer GEMV after, in quantize_x's layout (token t's
// row of n_heads * head_dim); only where attention_rounds_q8(ctx, op).
cudaError_t attention(const Context& ctx, const ops::Attention& op, uint16_t* xh = nullptr, bool f16 = false,
                      int8_t* xq = nullptr, float2* xds = nullptr);
// Whether the op takes the tensor-core prefill kernel, which writes the 16-bit copy, into a contiguous f32
// dst.
bool attention_writes_half(const Context& ctx, const ops::Attention& op);
// Whether the op takes a decode kernel, which rounds the result for an integer GEMV: heads whose dims are
// whole blocks of 32, into a contiguous f32 dst.
bool attention_rounds_q8(const Context& ctx, const ops::Attention& op);
// collective/collective.cu: tensor parallelism's collectives (ops/collective.h) over the group's NCCL
// communicators (nccl_group.h), or a copy for a group of one rank of any transport. AllGather of more than
// one row gathers into scratch slot 0 ([world][rows][n]) and one kernel interleaves that into dst's rows.
cudaError_t all_reduce(const Context& ctx, const ops::AllReduce& op);
cudaError_t all_gather(const Context& ctx, const ops::AllGather& op);

}  // namespace kiln::cuda
