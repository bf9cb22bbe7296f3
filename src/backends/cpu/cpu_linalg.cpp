// Blocked Cholesky and triangular inverse (backends/cpu/cpu_linalg.h).
#include "backends/cpu/cpu_linalg.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "core/thread_pool.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define KILN_LINALG_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define KILN_LINALG_CLONES
#endif

namespace kiln::cpu_linalg {
namespace {

constexpr int64_t kPanel = 64;  // the Cholesky's column block, the inverse's row and column block
// A pivot below this share of its diagonal entry is a singular matrix seen through rounding: a rank-deficient
// Hessian without dampening would otherwise factor into an inverse of huge, meaningless entries.
constexpr double kMinPivot = 1e-10;
constexpr int64_t kTrailingColumns = 256;  // columns a trailing-update task takes: 128 KiB of the panel

static_assert(kLinalgAlign % kPanel == 0 && kTrailingColumns % 8 == 0 && kPanel % 8 == 0);

void for_rows(ThreadPool* pool, int64_t begin, int64_t end, int64_t chunk,
              const std::function<void(int64_t, int64_t)>& fn) {
  if (end <= begin) return;
  if (pool == nullptr) {
    fn(begin, end);
    return;
  }
  pool->parallel_dynamic(end - begin, chunk, [&](int64_t b, int64_t e, int) { fn(begin + b, begin + e); });
}

// The register tile of every product here: c[r][0 .. 2L-1] += sum_k a[r][k] * b[k][0 .. 2L-1] for r < R,
// k < kb (rows ldc, lda, ldb apart), the k in order; L = 32 bytes of T (GCC's vector extension: one AVX
// register, or two SSE2 ones in the baseline build): 8 doubles or 16 floats a row.
template <int R, class T>
inline __attribute__((always_inline)) void product_tile(T* c, int64_t ldc, const T* a, int64_t lda,
                                                        const T* b, int64_t ldb, int64_t kb) {
  typedef T Vec __attribute__((vector_size(32)));
  constexpr int64_t kLanes = sizeof(Vec) / sizeof(T);
  Vec acc[R][2];
  for (int r = 0; r < R; ++r) {
    std::memcpy(&acc[r][0], c + r * ldc, sizeof(Vec));
    std::memcpy(&acc[r][1], c + r * ldc + kLanes, sizeof(Vec));
  }
  for (int64_t k = 0; k < kb; ++k) {
    Vec b0, b1;
    std::memcpy(&b0, b + k * ldb, sizeof(Vec));
    std::memcpy(&b1, b + k * ldb + kLanes, sizeof(Vec));
    for (int r = 0; r < R; ++r) {
      const T x = a[r * lda + k];
      acc[r][0] += x * b0;
      acc[r][1] += x * b1;
    }
  }
  for (int r = 0; r < R; ++r) {
    std::memcpy(c + r * ldc, &acc[r][0], sizeof(Vec));
    std::memcpy(c + r * ldc + kLanes, &acc[r][1], sizeof(Vec));
  }
}

// Columns [j0, j1) of the trailing matrix, every row i >= j0 that reaches them: a[i][j] += sum_k a[i][k0 + k]
// * p[k][j] for k < kb and j <= i, in tiles of 4 rows by 8 columns (a tile may run past i into the scratch
// upper part, and past n into the padding). p [kb][ld] is the panel transposed and negated, zero in the
// padding; its columns [j0, j1) stay in cache while the rows go by.
KILN_LINALG_CLONES void trailing_columns(double* a, int64_t ld, const double* p, int64_t k0, int64_t kb,
                                         int64_t j0, int64_t j1, int64_t n) {
  int64_t i = j0;
  for (; i + 4 <= n; i += 4) {
    for (int64_t jc = j0; jc < j1 && jc <= i + 3; jc += 8)
      product_tile<4>(a + i * ld + jc, ld, a + i * ld + k0, ld, p + jc, ld, kb);
  }
  for (; i < n; ++i) {
    for (int64_t jc = j0; jc < j1 && jc <= i; jc += 8)
      product_tile<1>(a + i * ld + jc, ld, a + i * ld + k0, ld, p + jc, ld, kb);
  }
}

// Rows [i0, i0 + kPanel) of U = V^-1 (fewer at the end), in double in ut [kPanel][ld] (zero on entry) and in
// float in u. Row i: U[i][i] = 1 / V[i][i], U[i][k] = -(sum_{i <= m < k} U[i][m] V[m][k]) / V[k][k]. The
// columns k go by in blocks K of kPanel: first c[r][K] = sum over the m before K of U[r][m] V[m][K], a
// product of the rows' finished part and a block column of V in register tiles, m in runs of kRun (a run of
// V's block column, 8 columns at a time, is read from the L1 cache by every 4 rows); then within K one k at a
// time, each new U[r][k] added into c[r][later k of K]. false when an entry is not finite.
KILN_LINALG_CLONES bool inverse_rows(const double* v, int64_t n, int64_t ld, int64_t i0, double* ut,
                                     double* c, float* u) {
  constexpr int64_t kRun = 256;
  const int64_t rows = std::min(kPanel, n - i0);
  bool finite = true;
  for (int64_t k0 = i0; k0 < n; k0 += kPanel) {
    const int64_t kb = std::min(kPanel, n - k0);
    std::fill(c, c + kPanel * kPanel, 0.0);
    for (int64_t m0 = i0; m0 < k0; m0 += kRun) {
      const int64_t mb = std::min(kRun, k0 - m0);
      for (int64_t cg = 0; cg < kPanel; cg += 8) {
        int64_t r = 0;
        for (; r + 4 <= rows; r += 4)
          product_tile<4>(c + r * kPanel + cg, kPanel, ut + r * ld + m0, ld, v + m0 * ld + k0 + cg, ld, mb);
        for (; r < rows; ++r)
          product_tile<1>(c + r * kPanel + cg, kPanel, ut + r * ld + m0, ld, v + m0 * ld + k0 + cg, ld, mb);
      }
    }
    for (int64_t k = k0; k < k0 + kb; ++k) {
      const double* vk = v + k * ld;
      for (int64_t r = 0; r < rows && i0 + r <= k; ++r) {
        const int64_t i = i0 + r;
        double* cr = c + r * kPanel - k0;  // cr[k]: row r's sum for column k
        const double x = i == k ? 1.0 / vk[k] : -cr[k] / vk[k];
        ut[r * ld + k] = x;
        const float f = static_cast<float>(x);
        finite &= std::isfinite(f);
        u[i * n + k] = f;
        for (int64_t m = k + 1; m < k0 + kb; ++m) cr[m] += x * vk[m];
      }
    }
  }
  return finite;
}

}  // namespace

KILN_LINALG_CLONES void subtract_product(float* w, int64_t ldw, int64_t rows, const float* e, int64_t lde,
                                         int64_t kb, const float* u, int64_t ldu, int64_t k_begin,
                                         int64_t k_end) {
  // w += (-e) u: the negation is exact, so each element gets the same roundings as w -= e u.
  std::vector<float> neg(static_cast<size_t>(rows * kb));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t p = 0; p < kb; ++p) neg[static_cast<size_t>(r * kb + p)] = -e[r * lde + p];
  }
  int64_t k = k_begin;
  for (; k + 16 <= k_end; k += 16) {
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4)
      product_tile<4>(w + r * ldw + k, ldw, &neg[static_cast<size_t>(r * kb)], kb, u + k, ldu, kb);
    for (; r < rows; ++r)
      product_tile<1>(w + r * ldw + k, ldw, &neg[static_cast<size_t>(r * kb)], kb, u + k, ldu, kb);
  }
  for (int64_t r = 0; r < rows; ++r) {  // the last columns, one at a time
    for (int64_t c = k; c < k_end; ++c) {
      float v = w[r * ldw + c];
      for (int64_t p = 0; p < kb; ++p) v -= e[r * lde + p] * u[p * ldu + c];
      w[r * ldw + c] = v;
    }
  }
}

bool cholesky_lower(double* a, int64_t n, int64_t ld, ThreadPool* pool) {
  std::vector<double> diag(static_cast<size_t>(n));  // the input's diagonal: a pivot must keep a share of it
  for (int64_t i = 0; i < n; ++i) diag[static_cast<size_t>(i)] = a[i * ld + i];
  std::vector<double> p(static_cast<size_t>(kPanel * ld), 0.0);  // the panel, transposed and negated:
                                                                 // p[k][i] = -L[i][k0 + k]
  for (int64_t k0 = 0; k0 < n; k0 += kPanel) {
    const int64_t kb = std::min(kPanel, n - k0), k1 = k0 + kb;
    // The diagonal block, unblocked: every update from the columns before k0 is in already.
    for (int64_t i = k0; i < k1; ++i) {
      double* ai = a + i * ld;
      for (int64_t j = k0; j <= i; ++j) {
        const double* aj = a + j * ld;
        double s = ai[j];
        for (int64_t k = k0; k < j; ++k) s -= ai[k] * aj[k];
        if (i == j) {
          if (!(s > kMinPivot * diag[static_cast<size_t>(i)]) || !std::isfinite(s)) return false;
          ai[i] = std::sqrt(s);
        } else {
          ai[j] = s / aj[j];
        }
      }
    }
    if (k1 == n) break;
    // The panel below it (each row on its own), and its transpose.
    for_rows(pool, k1, n, 32, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        double* ai = a + i * ld;
        for (int64_t j = k0; j < k1; ++j) {
          const double* aj = a + j * ld;
          double s = ai[j];
          for (int64_t k = k0; k < j; ++k) s -= ai[k] * aj[k];
          ai[j] = s / aj[j];
          p[static_cast<size_t>((j - k0) * ld + i)] = -ai[j];
        }
      }
    });
    // The trailing matrix, rows k1 .. n - 1 (columns k1 .. i).
    const int64_t n_chunks = (ld - k1 + kTrailingColumns - 1) / kTrailingColumns;
    for_rows(pool, 0, n_chunks, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t j0 = k1 + c * kTrailingColumns;
        trailing_columns(a, ld, p.data(), k0, kb, j0, std::min(ld, j0 + kTrailingColumns), n);
      }
    });
  }
  return true;
}

bool upper_inverse(const double* v, int64_t n, int64_t ld, ThreadPool* pool, float* u) {
  std::fill(u, u + n * n, 0.0f);
  const int64_t n_tiles = (n + kPanel - 1) / kPanel;
  std::vector<int> finite(static_cast<size_t>(n_tiles), 1);
  // Tiles of rows are independent; each reads V from its first row down.
  for_rows(pool, 0, n_tiles, 1, [&](int64_t t0, int64_t t1) {
    std::vector<double> ut(static_cast<size_t>(kPanel * ld)), c(static_cast<size_t>(kPanel * kPanel));
    for (int64_t t = t0; t < t1; ++t) {
      std::fill(ut.begin(), ut.end(), 0.0);
      if (!inverse_rows(v, n, ld, t * kPanel, ut.data(), c.data(), u)) finite[static_cast<size_t>(t)] = 0;
    }
  });
  return std::all_of(finite.begin(), finite.end(), [](int f) { return f != 0; });
}

bool inverse_cholesky_upper(const float* a, int64_t n, double lambda, ThreadPool* pool, float* u) {
  const int64_t ld = padded_ld(n);
  std::vector<double> c(static_cast<size_t>(n * ld), 0.0);  // J (a + lambda I) J, then L, then V
  // c[i][j] = a[n-1-j][n-1-i] for j <= i (a's lower triangle), in 64 x 64 tiles so both sides stay in cache.
  for_rows(pool, 0, (n + kPanel - 1) / kPanel, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t i0 = t0 * kPanel; i0 < std::min(n, t1 * kPanel); i0 += kPanel) {
      for (int64_t j0 = 0; j0 <= i0; j0 += kPanel) {
        for (int64_t i = i0; i < std::min(n, i0 + kPanel); ++i) {
          for (int64_t j = j0; j < std::min(i + 1, j0 + kPanel); ++j)
            c[static_cast<size_t>(i * ld + j)] = static_cast<double>(a[(n - 1 - j) * n + (n - 1 - i)]);
        }
      }
    }
  });
  for (int64_t i = 0; i < n; ++i) c[static_cast<size_t>(i * ld + i)] += lambda;
  if (!cholesky_lower(c.data(), n, ld, pool)) return false;
  // V[i][j] = L[n-1-i][n-1-j]: the matrix turned half a turn in place (L's lower triangle becomes V's upper).
  for (int64_t i = 0; i <= (n - 1) / 2; ++i) {
    double* top = &c[static_cast<size_t>(i * ld)];
    double* bottom = &c[static_cast<size_t>((n - 1 - i) * ld)];
    const int64_t cols = top == bottom ? n / 2 : n;
    for (int64_t j = 0; j < cols; ++j) std::swap(top[j], bottom[n - 1 - j]);
  }
  return upper_inverse(c.data(), n, ld, pool, u);
}

}  // namespace kiln::cpu_linalg
