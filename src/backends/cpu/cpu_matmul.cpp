// matmul on the CPU: dst[j, i] = w[:, j] . x[:, i]. Threads split the weight rows; each thread dequantizes
// kRows weight rows at a time into its own f32 buffer and reuses them for every activation row, so a weight
// byte is read once per call however many tokens the batch holds. f32 weights are used in place.
#include <vector>

#include "backends/cpu/cpu_ops.h"
#include "ops/ref/ref.h"

namespace kiln::cpu {

namespace {
constexpr int64_t kRows = 4;  // weight rows dequantized together
}  // namespace

void matmul(ThreadPool& pool, const ops::Matmul& op) {
  const int64_t k = op.w.ne[0], n = op.w.ne[1], m = op.x.n_rows();
  const bool in_place = op.w.type == DType::f32;
  const int64_t n_groups = (n + kRows - 1) / kRows;
  pool.parallel_for(
      n_groups,
      [&](int64_t g0, int64_t g1, int) {
        std::vector<float> buf(in_place ? 0 : kRows * k);  // [kRows, k]
        const float* rows[kRows];
        for (int64_t g = g0; g < g1; ++g) {
          const int64_t j0 = g * kRows, nj = std::min(kRows, n - j0);
          for (int64_t r = 0; r < nj; ++r) {
            if (in_place) {
              rows[r] = op.w.row_as<const float>(j0 + r);
            } else {
              ops::ref::row_to_f32(op.w, op.w.row(j0 + r), buf.data() + r * k);
              rows[r] = buf.data() + r * k;
            }
          }
          for (int64_t i = 0; i < m; ++i) {
            const auto* x = reinterpret_cast<const float*>(op.x.flat_row(i));
            auto* y = reinterpret_cast<float*>(op.dst.flat_row(i)) + j0;
            for (int64_t r = 0; r < nj; ++r) y[r] = dot_f32(rows[r], x, k);
          }
        }
      },
      /*min_chunk=*/4);
}

}  // namespace kiln::cpu
