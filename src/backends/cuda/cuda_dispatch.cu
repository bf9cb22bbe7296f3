// cuda::supports and cuda::run: which ops and operand types the kernels take, and the dispatch to them
// (the sequences of ops that run as one kernel: fusion/fusion.cu).
#include <cstdint>

#include "backends/cuda/cuda_kernels.h"
#include "core/overloaded.h"
#include "ops/collective.h"

namespace kiln::cuda {

namespace {

bool f32(const Tensor& t) { return t.type == DType::f32; }
bool f32_or_none(const ops::Weight& w) { return w.tensor.data == nullptr || f32(w.tensor); }
bool pool_type(const Tensor& t) { return t.type == DType::f32 || t.type == DType::f16; }
// 8-bit pools: K's and V's both of one type, q8_0 or q8_64 (no kernel writes or reads an 8-bit pool beside
// another type), rows of whole blocks of 32 or 64, 2-byte aligned (a block's f16 scale is read as one).
bool q8_pools(const Tensor& k, const Tensor& v) {
  const auto q8 = [](const Tensor& t) {
    const int64_t block = kv_q8_block(t.type);
    return block > 0 && t.ne[0] % block == 0 && reinterpret_cast<uintptr_t>(t.data) % 2 == 0;
  };
  return q8(k) && q8(v) && k.type == v.type;
}
// Tensor parallelism's collectives: contiguous f32 operands, over NCCL, or a group of one rank (a copy).
bool collective(const Tensor& x, const Tensor& dst, const Collective* group) {
  return f32(x) && f32(dst) && x.is_contiguous() && dst.is_contiguous() && group != nullptr &&
         (group->transport() == Collective::Transport::nccl || group->world() == 1);
}

}  // namespace

bool supports(const ops::Op& op) {
  if (const Tensor* dst = ops::float_dst(op); dst != nullptr && !ops::is_float_activation(dst->type))
    return false;
  return std::visit(
      Overloaded{
          [](const ops::GetRows& o) { return supports_weight_type(o.table.tensor.type); },
          [](const ops::Matmul& o) { return supports_weight_type(o.w.tensor.type); },
          [](const ops::MoeMatmul& o) { return supports_weight_type(o.w.tensor.type) && f32(o.dst); },
          [](const ops::RmsNorm& o) { return f32_or_none(o.w); },
          [](const ops::LayerNorm& o) { return f32_or_none(o.w) && f32_or_none(o.b) && f32(o.dst); },
          [](const ops::Rope& o) { return f32(o.dst); },
          [](const ops::Softmax& o) { return f32(o.dst); },
          [](const ops::KvWrite& o) {
            return (pool_type(o.k_pool) && pool_type(o.v_pool)) || q8_pools(o.k_pool, o.v_pool);
          },
          [](const ops::Attention& o) {
            return ((pool_type(o.k_pool) && o.k_pool.type == o.v_pool.type) ||
                    q8_pools(o.k_pool, o.v_pool)) &&
                   f32(o.dst) && attention_supported(o);
          },
          [](const ops::GatedAct&) { return true; },
          [](const ops::Binary& o) { return f32(o.b.tensor); },
          [](const ops::Scale& o) { return f32(o.dst); },
          [](const ops::Argmax&) { return true; },
          [](const ops::Sample&) { return true; },
          [](const ops::MoeRoute&) { return true; },
          [](const ops::WeightedSum& o) { return f32(o.dst); },
          [](const ops::SumSquares& o) { return o.gram.data == nullptr || gram_rows_supported(o); },
          [](const ops::InverseCholesky&) { return inverse_cholesky_supported(); },
          [](const ops::AllReduce& o) { return collective(o.x, o.dst, o.group); },
          [](const ops::AllGather& o) { return collective(o.x, o.dst, o.group); },
      },
      op);
}

cudaError_t run(const Context& ctx, const ops::Op& op) {
  return std::visit(Overloaded{
                        [&](const ops::GetRows& o) { return get_rows(ctx, o); },
                        [&](const ops::Matmul& o) { return matmul(ctx, o); },
                        [&](const ops::MoeMatmul& o) { return moe_matmul(ctx, o); },
                        [&](const ops::RmsNorm& o) { return rms_norm(ctx, o); },
                        [&](const ops::LayerNorm& o) { return layer_norm(ctx, o); },
                        [&](const ops::Rope& o) { return rope(ctx, o); },
                        [&](const ops::Softmax& o) { return softmax(ctx, o); },
                        [&](const ops::KvWrite& o) { return kv_write(ctx, o); },
                        [&](const ops::Attention& o) { return attention(ctx, o); },
                        [&](const ops::GatedAct& o) { return gated_act(ctx, o); },
                        [&](const ops::Binary& o) { return binary(ctx, o); },
                        [&](const ops::Scale& o) { return scale(ctx, o); },
                        [&](const ops::Argmax& o) { return argmax(ctx, o); },
                        [&](const ops::Sample& o) { return sample(ctx, o); },
                        [&](const ops::MoeRoute& o) { return moe_route(ctx, o); },
                        [&](const ops::WeightedSum& o) { return weighted_sum(ctx, o); },
                        [&](const ops::SumSquares& o) { return sum_squares(ctx, o); },
                        [&](const ops::InverseCholesky& o) { return inverse_cholesky(ctx, o); },
                        [&](const ops::AllReduce& o) { return all_reduce(ctx, o); },
                        [&](const ops::AllGather& o) { return all_gather(ctx, o); },
                    },
                    op);
}

}  // namespace kiln::cuda
