// Hopper's warpgroup tensor-core products (wgmma, sm_90a) as the kernels here use them: shared-memory matrix
// descriptors in the 128-byte swizzle, the fences and waits around the asynchronous products, and the
// products (f16 with A in registers, e4m3 with both operands in shared memory). Defined only where the kernel
// is built for sm_90a (KILN_WGMMA); a kernel built for other architectures must not call them (its launcher
// asks cudaFuncGetAttributes first).
#pragma once

#include <cstdint>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KILN_WGMMA 1
#endif

namespace kiln::cuda {

#ifdef KILN_WGMMA
// A shared-memory matrix descriptor for a tile in the 128-byte swizzle (rows of 128 bytes, 8-row atoms of
// 1 KB, the atoms 1 KB aligned): `addr` its start; `lbo` the bytes between 64-element column groups of an
// MN-major tile (unused by K-major tiles, which take 16); 8-row groups 1 KB apart.
__device__ __forceinline__ uint64_t smem_desc_sw128(uint32_t addr, uint32_t lbo = 16) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | static_cast<uint64_t>((lbo & 0x3FFFF) >> 4) << 16 |
         uint64_t{1024 >> 4} << 32 | uint64_t{1} << 62;
}

// Before a warpgroup's products whose accumulators or A registers other instructions wrote.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

// Closes the products issued since the last commit into a group, and waits until none is in flight.
__device__ __forceinline__ void wgmma_commit_and_wait() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}

// Keeps the compiler from moving the accumulators' uses across the asynchronous products' fence and wait.
template <int N>
__device__ __forceinline__ void wgmma_pin(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Makes this thread's writes to shared memory (st.shared, cp.async) visible to the products' reads.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// The asm operand lists of a thread's f32 accumulators d[] of a 64 x N warpgroup tile (N / 2 of them): eight
// from d[i], and all of a tile of N = 64 or 128.
#define KILN_WGMMA_D8(i)                                                                      \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define KILN_WGMMA_D32 KILN_WGMMA_D8(0), KILN_WGMMA_D8(8), KILN_WGMMA_D8(16), KILN_WGMMA_D8(24)
#define KILN_WGMMA_D64 \
  KILN_WGMMA_D32, KILN_WGMMA_D8(32), KILN_WGMMA_D8(40), KILN_WGMMA_D8(48), KILN_WGMMA_D8(56)

// d (64 x 64 f32, the warpgroup's fragments) += A (64 x 16 f16, registers: each warp's 16 rows as
// mma.sync's m16n8k16 A fragment) B (16 x 64 f16 in shared memory: K-major when kTransB is 0, N-major when
// 1).
template <int kTransB>
__device__ __forceinline__ void wgmma_f16_m64n64k16(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
      "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, %37;\n"
      "}\n"
      : KILN_WGMMA_D32
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(kTransB));
}

// d (64 x 128 f32, the warpgroup's fragments) += A (64 x 16 f16, registers: each warp's 16 rows as
// mma.sync's m16n8k16 A fragment) B (16 x 128 f16 in shared memory: K-major when kTransB is 0, N-major when
// 1).
template <int kTransB>
__device__ __forceinline__ void wgmma_f16_m64n128k16(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, "
      "%11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, "
      "%31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, "
      "%51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, "
      "%69;\n"
      "}\n"
      : KILN_WGMMA_D64
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(kTransB));
}

// d (64 x 128 f32, the warpgroup's fragments) += A (64 x 32 e4m3) B^T (128 x 32 e4m3), both K-major in shared
// memory.
__device__ __forceinline__ void wgmma_e4m3_m64n128k32(float (&d)[64], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1;\n"
      "}\n"
      : KILN_WGMMA_D64
      : "l"(a), "l"(b));
}

#endif  // KILN_WGMMA

}  // namespace kiln::cuda
