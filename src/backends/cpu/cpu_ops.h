// The CPU kernels of every op (cpu_ops.cpp: elementwise, norms, rope, MoE routing and mixing; cpu_matmul.cpp:
// matmul, moe_matmul; cpu_attention.cpp).
// Preconditions: ops::check(op) is ok.
#pragma once

#include "backends/cpu/cpu_isa.h"
#include "core/thread_pool.h"
#include "ops/ops.h"

// The row-wise ops' and attention's hot loops are compiled for AVX2 and for baseline x86-64 and picked at
// load time from cpuid (GCC target_clones); the matmul kernels have their own per-level files (kernels/).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define KILN_CPU_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define KILN_CPU_CLONES
#endif

namespace kiln::cpu {

// `kern`: the matmul kernels of the backend's ISA level.
void run(ThreadPool& pool, const CpuKernels& kern, const ops::Op& op, ops::Precision precision);

void matmul(ThreadPool& pool, const CpuKernels& kern, const ops::Matmul& op, ops::Precision precision);
void moe_matmul(ThreadPool& pool, const CpuKernels& kern, const ops::MoeMatmul& op, ops::Precision precision);
void attention(ThreadPool& pool, const CpuKernels& kern, const ops::Attention& op, ops::Precision precision);

// sum a[i] * b[i] over n floats, in eight interleaved f32 lanes (vectorisable without reassociation flags).
inline float dot_f32(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  }
  for (; i < n; ++i) acc[0] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

}  // namespace kiln::cpu
