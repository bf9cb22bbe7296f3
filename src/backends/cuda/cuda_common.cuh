// Device-side helpers shared by the kernels: row addressing of (possibly strided) tensor views, stores into
// float destinations of any activation type, block reductions, launch shapes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/tensor.h"

namespace kiln::cuda {

// a / b and a % b for a >= 0 and b > 0, in 32 bits when both fit: a 64-bit division is a long instruction
// sequence on the GPU, and the small kernels of a decode step are bound by the instructions they issue.
struct DivMod {
  int64_t q, r;
};
__device__ inline DivMod divmod(int64_t a, int64_t b) {
  if (((a | b) >> 31) == 0) {
    const auto ua = static_cast<uint32_t>(a), ub = static_cast<uint32_t>(b), uq = ua / ub;
    return {int64_t{uq}, int64_t{ua - uq * ub}};
  }
  return {a / b, a % b};
}

// The rows of a tensor view (dims 1..3), as a kernel addresses them: row r of ne[1] * ne[2] * ne[3].
struct Rows {
  char* data;
  int64_t ne1, ne2;
  int64_t nb1, nb2, nb3;
  __device__ char* row(int64_t r) const {
    if (r < ne1) return data + r * nb1;  // a 2-D view, or the first ne1 rows of any
    const DivMod a = divmod(r, ne1), b = divmod(a.q, ne2);
    return data + a.r * nb1 + b.r * nb2 + b.q * nb3;
  }
  template <class T>
  __device__ T* row_as(int64_t r) const {
    return reinterpret_cast<T*>(row(r));
  }
};
inline Rows rows_of(const Tensor& t) {
  return {static_cast<char*>(t.data), t.ne[1], t.ne[2], t.nb[1], t.nb[2], t.nb[3]};
}
// Whether every row starts 16-byte aligned (for the kernels that move a row 16 bytes a load).
inline bool rows_aligned16(const Rows& r) {
  return reinterpret_cast<uintptr_t>(r.data) % 16 == 0 && r.nb1 % 16 == 0 && r.nb2 % 16 == 0 &&
         r.nb3 % 16 == 0;
}

// The activation type of a float destination, as a kernel argument.
enum class Store : uint8_t { f32, f16, bf16 };
inline Store store_of(DType t) {
  return t == DType::f16 ? Store::f16 : t == DType::bf16 ? Store::bf16 : Store::f32;
}
// row[i] = v rounded to the destination's type (to nearest even).
__device__ inline void store(Store s, char* row, int64_t i, float v) {
  switch (s) {
    case Store::f32: reinterpret_cast<float*>(row)[i] = v; break;
    case Store::f16: reinterpret_cast<__half*>(row)[i] = __float2half_rn(v); break;
    case Store::bf16: reinterpret_cast<__nv_bfloat16*>(row)[i] = __float2bfloat16_rn(v); break;
  }
}

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// The sum of v over the block (blockDim.x a multiple of 32, at most 1024), returned to every thread. `smem`
// holds 32 floats; the block synchronises.
__device__ inline float block_sum(float v, float* smem) {
  v = warp_sum(v);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
  __syncthreads();  // smem may still be read by a previous call
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < n_warps ? smem[lane] : 0.0f;
  return warp_sum(v);
}
__device__ inline float block_max(float v, float* smem) {
  v = warp_max(v);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < n_warps ? smem[lane] : -INFINITY;
  return warp_max(v);
}

// 16 bytes from global to shared memory without a register (cp.async, sm_80+), in groups that complete in
// order. The _zfill form writes zeros instead where `valid` is false (nothing is read from gmem then).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
// The same to a shared-memory address (__cvta_generic_to_shared once, offsets added to it: the conversion
// of a generic pointer, a read of the block's cluster id among them, is otherwise done again for each copy
// that sits under its own predicate).
__device__ __forceinline__ void cp_async16_at(unsigned smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async16_zfill(void* smem, const void* gmem, bool valid) {
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0)
               : "memory");
}
// 4 bytes (cp.async.ca: 4- and 8-byte copies go through L1), both addresses 4-byte aligned; zeros where
// `valid` is false.
__device__ __forceinline__ void cp_async4_zfill(void* smem, const void* gmem, bool valid) {
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Threads per block for a row of n elements: a multiple of 32 in [32, 1024].
inline int row_threads(int64_t n) {
  int t = 32;
  while (t < 1024 && t < n) t *= 2;
  return t;
}
// Blocks for n independent elements at `threads` per block, at most 2^31 - 1 (kernels loop past it).
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : b > 0x7fffffff ? 0x7fffffff : b);
}

}  // namespace kiln::cuda
