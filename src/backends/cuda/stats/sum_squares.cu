// sum_squares on CUDA: an importance matrix's column sums of squares (ops::SumSquares). Each thread owns one
// column and a slice of the rows (the (slot, token) pairs of a routed x), sums the squares of a run of rows
// that go to one matrix in a register, and adds each run to the sums with an f32 atomic: slices of rows
// run in parallel, so the order of the additions (the last bits of a sum) may differ from run to run.
// A Gram matrix (kiln imatrix --full) is added by cuBLAS: gram += X^T X in f32, one SGEMM over the op's rows.
#include <algorithm>
#include <cstdint>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_launch.cuh"

namespace kiln::cuda {

namespace {

constexpr int kThreads = 256;

// Rows of x [n, n_x, n_tokens, ...]: pair p is row p of x (ids == nullptr), or slot p % n_used of token
// p / n_used (x row (n_x == 1 ? 0 : slot) + n_x * token) going to matrix ids[p].
// amax (not null): each run's largest |x|, a warp's reduced by its lanes (every lane takes the same rows),
// then one atomic max on the value's bits (non-negative floats order as their bits; a NaN's bits, its sign
// cleared, above every other's).
__global__ void sum_squares_kernel(Rows x, const int32_t* ids, int64_t n_used, int64_t n_x, char* sums,
                                   int64_t sums_nb1, char* counts, int64_t counts_nb1, char* amax,
                                   int64_t amax_nb1, int64_t n, int64_t n_pairs, int64_t slice) {
  pdl_begin();
  const int64_t j = blockIdx.x * int64_t{kThreads} + threadIdx.x;
  const int64_t p0 = blockIdx.y * slice, p1 = p0 + slice < n_pairs ? p0 + slice : n_pairs;
  const bool counter = j == 0;  // the column-0 thread of each slice also counts its rows
  float acc = 0.0f, rows = 0.0f;
  uint32_t mx = 0;  // the bits of the run's largest |x|
  int32_t m = -1;
  const auto flush = [&] {
    if (m < 0) return;
    if (j < n) atomicAdd(reinterpret_cast<float*>(sums + m * sums_nb1) + j, acc);
    if (counter) atomicAdd(reinterpret_cast<float*>(counts + m * counts_nb1), rows);
    if (amax != nullptr) {
      mx = __reduce_max_sync(0xffffffffu, mx);
      if (threadIdx.x % 32 == 0 && mx != 0) atomicMax(reinterpret_cast<uint32_t*>(amax + m * amax_nb1), mx);
    }
    acc = 0.0f, rows = 0.0f, mx = 0;
  };
  for (int64_t p = p0; p < p1; ++p) {
    int64_t r = p;
    int32_t mp = 0;
    if (ids != nullptr) {
      const DivMod st = divmod(p, n_used);
      r = (n_x == 1 ? 0 : st.r) + n_x * st.q;
      mp = ids[p];
    }
    if (mp != m) flush(), m = mp;
    if (j < n) {
      const float v = x.row_as<const float>(r)[j];
      acc += v * v;
      mx = max(mx, __float_as_uint(fabsf(v)));
    }
    rows += 1.0f;
  }
  flush();
}

}  // namespace

bool gram_rows_supported(const ops::SumSquares& op) {
  // cuBLAS takes a leading dimension: the rows of each matrix of x, and of the Gram matrix, evenly spaced.
  const int64_t n = op.x.ne[0];
  return op.x.nb[0] == 4 && op.x.nb[1] % 4 == 0 && op.x.nb[1] >= 4 * n && op.gram.nb[0] == 4 &&
         op.gram.nb[1] % 4 == 0 && op.gram.nb[1] >= 4 * n;
}

cudaError_t sum_squares(const Context& ctx, const ops::SumSquares& op) {
  const int64_t n = op.x.ne[0];
  const bool routed = op.ids.data != nullptr;
  const int64_t n_used = routed ? op.ids.ne[0] : 1;
  const int64_t n_pairs = routed ? op.ids.n_elements() : op.x.n_rows();
  if (n_pairs == 0) return cudaSuccess;
  // About two blocks per multiprocessor, at least 16 rows a slice.
  const int64_t col_blocks = (n + kThreads - 1) / kThreads;
  const int64_t want = std::max<int64_t>(1, 2 * int64_t{ctx.n_sms} / col_blocks);
  const int64_t slice = std::max<int64_t>(16, (n_pairs + want - 1) / want);
  const int64_t slices = std::min<int64_t>((n_pairs + slice - 1) / slice, 65535);
  const int64_t per = (n_pairs + slices - 1) / slices;
  const dim3 grid(grid_for(n, kThreads), static_cast<unsigned>(slices));
  (void)launch_kernel(ctx, sum_squares_kernel, grid, kThreads, 0, rows_of(op.x),
                      static_cast<const int32_t*>(op.ids.data), n_used, op.x.ne[1],
                      static_cast<char*>(op.sums.data), op.sums.nb[1], static_cast<char*>(op.counts.data),
                      op.counts.nb[1], static_cast<char*>(op.amax.data), op.amax.nb[1], n, n_pairs, per);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess || op.gram.data == nullptr) return e;
  // Column-major, each matrix of x is n x ne[1] (leading dimension nb[1] / 4) and the Gram matrix n x n:
  // gram += x x^T, one SGEMM a matrix of rows. The full square, as the CPU writes it (a SYRK would leave half
  // for the host to mirror).
  const float one = 1.0f;
  const auto ni = static_cast<int>(n), rows = static_cast<int>(op.x.ne[1]);
  const auto ld = static_cast<int>(op.x.nb[1] / 4), ldg = static_cast<int>(op.gram.nb[1] / 4);
  for (int64_t i3 = 0; i3 < op.x.ne[3]; ++i3) {
    for (int64_t i2 = 0; i2 < op.x.ne[2]; ++i2) {
      const auto* x = reinterpret_cast<const float*>(static_cast<const char*>(op.x.data) + i2 * op.x.nb[2] +
                                                     i3 * op.x.nb[3]);
      const cublasStatus_t s = cublasSgemm(ctx.cublas, CUBLAS_OP_N, CUBLAS_OP_T, ni, ni, rows, &one, x, ld, x,
                                           ld, &one, static_cast<float*>(op.gram.data), ldg);
      if (s != CUBLAS_STATUS_SUCCESS) return cudaErrorUnknown;
    }
  }
  return cudaSuccess;
}

}  // namespace kiln::cuda
