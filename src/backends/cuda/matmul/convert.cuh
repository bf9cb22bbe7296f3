// f32 rows to float rows of another layout and type (x into a GEMM's input type, a GEMM's f32 result into its
// destination): the kernels of matmul/matmul.cu's convert_rows.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_launch.cuh"

namespace kiln::cuda {

// Thread: one element; grid: (elements of a row, rows, grid-strided).
// saturate: values beyond f16's range become +-65504 rather than infinities (x as a tensor-core input).
__global__ void convert_rows_kernel(Rows src, int64_t ne0, int64_t n_rows, Rows dst, Store st,
                                    bool saturate) {
  pdl_begin();
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= ne0) return;
  for (int64_t r = blockIdx.y; r < n_rows; r += gridDim.y) {
    float v = reinterpret_cast<const float*>(src.row(r))[e];
    if (saturate) v = fminf(fmaxf(v, -65504.0f), 65504.0f);
    store(st, dst.row(r), e, v);
  }
}

// Stores 8 f32 values at dp (16-byte aligned) as T: two 16-byte stores for f32, one for f16 / bf16.
template <class T>
__device__ __forceinline__ void store8(T* dp, const float (&v)[8]) {
  if constexpr (std::is_same_v<T, float>) {
    reinterpret_cast<float4*>(dp)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(dp)[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    uint4 out;
    uint32_t* w = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if constexpr (std::is_same_v<T, __half>) {
        const __half2 h = __floats2half2_rn(v[2 * j], v[2 * j + 1]);
        w[j] = *reinterpret_cast<const uint32_t*>(&h);
      } else {
        const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
        w[j] = *reinterpret_cast<const uint32_t*>(&h);
      }
    }
    *reinterpret_cast<uint4*>(dp) = out;
  }
}

// The same, 8 elements a thread (two 16-byte loads, one or two 16-byte stores), for rows of a multiple of 8
// elements that start 16-byte aligned: at prefill sizes the per-element kernel moved a third of the bytes the
// memory could.
template <class T>
__global__ void convert_rows8_kernel(Rows src, int64_t ne0, int64_t n_rows, Rows dst, bool saturate) {
  pdl_begin();
  const int64_t e = 8 * (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x);
  if (e >= ne0) return;
  for (int64_t r = blockIdx.y; r < n_rows; r += gridDim.y) {
    const float4* sp = reinterpret_cast<const float4*>(reinterpret_cast<const float*>(src.row(r)) + e);
    const float4 a = sp[0], b = sp[1];
    float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    if (saturate) {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = fminf(fmaxf(v[j], -65504.0f), 65504.0f);
    }
    store8(reinterpret_cast<T*>(dst.row(r)) + e, v);
  }
}

// The column blocks of an f32 [n, n_rows] result (a stacked GEMM's parts) to their destinations: elements
// [first[p], first[p] + ne0[p]) of each row to the row of dst[p]. Each ne0 and first a multiple of 8, rows
// 16-byte aligned.
inline constexpr int kMaxSplitParts = 3;
struct SplitParts {
  int64_t first[kMaxSplitParts];
  int64_t ne0[kMaxSplitParts];
  Rows dst[kMaxSplitParts];
};
// Thread: 8 elements of one part; grid: (elements of the longest part / 8, rows, parts).
template <class T>
__global__ void split_rows8_kernel(Rows src, int64_t n_rows, SplitParts parts) {
  pdl_begin();
  const int p = static_cast<int>(blockIdx.z);
  const int64_t e = 8 * (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x);
  if (e >= parts.ne0[p]) return;
  for (int64_t r = blockIdx.y; r < n_rows; r += gridDim.y) {
    const float4* sp =
        reinterpret_cast<const float4*>(reinterpret_cast<const float*>(src.row(r)) + parts.first[p] + e);
    const float4 a = sp[0], b = sp[1];
    const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    store8(reinterpret_cast<T*>(parts.dst[p].row(r)) + e, v);
  }
}

}  // namespace kiln::cuda
