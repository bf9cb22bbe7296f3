// The scalar reference of every op: plain loops, f64 accumulation, written to be read, never optimised. It is
// the oracle the op harness (tests/ops) holds every backend to. Preconditions: ops::check(op) is ok.
#pragma once

#include "ops/ops.h"

namespace kiln::ops::ref {

void get_rows(const GetRows& op);
// precision_fast: x rounded through activation_type() first, as the CPU rounds it.
void matmul(const Matmul& op, Precision precision = Precision::precision_exact);
void rms_norm(const RmsNorm& op);
void layer_norm(const LayerNorm& op);
void rope(const Rope& op);
void softmax(const Softmax& op);
void kv_write(const KvWrite& op);
void attention(const Attention& op);
void gated_act(const GatedAct& op);
void binary(const Binary& op);
void scale(const Scale& op);
void argmax(const Argmax& op);
void sample(const Sample& op);  // ops/sample.h: sample_row_reference, row by row
void moe_route(const MoeRoute& op);
void moe_matmul(const MoeMatmul& op, Precision precision = Precision::precision_exact);
void weighted_sum(const WeightedSum& op);
void sum_squares(const SumSquares& op);
void inverse_cholesky(const InverseCholesky& op);
// World 1: a copy; else the ranks of a HostGroup (ops/collective.h), every rank calling it on its own thread.
Status all_reduce(const AllReduce& op);
Status all_gather(const AllGather& op);

// Runs any op with its reference; `precision` applies to Matmul and MoeMatmul (Attention's reference is the
// exact result either way).
void run(const Op& op, Precision precision = Precision::precision_exact);

// Writes the f32 values `v` (dst.ne[0] of them) to a row of a float-activation tensor (f32, f16, bf16),
// rounding to nearest even.
void store_row(const Tensor& dst, uint8_t* row, const float* v);

// One row of `t` (any type) as f32: `out` holds t.ne[0] values.
void row_to_f32(const Tensor& t, const uint8_t* row, float* out);
// The activation of a gated unit: silu(x) = x * sigmoid(x); gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi)(x +
// 0.044715 x^3))); sigmoid(x) = 1 / (1 + exp(-x)).
double glu_act(GluKind kind, double x);

}  // namespace kiln::ops::ref
