// The dense linear algebra of ops::InverseCholesky on the CPU and of GPTQ's rounding (quant/gptq.cpp): a
// blocked Cholesky factorization and the inverse of an upper triangular matrix, in double, over a thread
// pool, and GPTQ's lazy update in float. Matrices are row-major with a leading dimension `ld` >= n that is a
// multiple of kLinalgAlign; their hot loops are compiled for x86-64-v3 (AVX2, FMA) and for baseline x86-64
// and picked at load time. For n = 8960 (a 1.5B model's FFN down) both take seconds on two cores where the
// unblocked loops took minutes.
#pragma once

#include <cstdint>

namespace kiln {

class ThreadPool;

namespace cpu_linalg {

inline constexpr int64_t kLinalgAlign = 64;  // ld's multiple: whole column blocks, padding included

// The ld to use for n columns.
inline int64_t padded_ld(int64_t n) { return (n + kLinalgAlign - 1) / kLinalgAlign * kLinalgAlign; }

// a [n][ld]: its lower triangle (j <= i, the input) becomes L, lower, with L L^T = the symmetric matrix it
// held; the rest of a is scratch (overwritten with unspecified finite or infinite values). false when the
// matrix is not numerically positive definite (a pivot that is not finite or not above 1e-10 of its diagonal
// entry).
bool cholesky_lower(double* a, int64_t n, int64_t ld, ThreadPool* pool);

// v [n][ld]: its upper triangle (j >= i) is read, an upper triangular matrix with a non-zero diagonal. u
// [n][n] (float, row-major, no padding) becomes V^-1, upper, zeros below the diagonal. false when an entry of
// the inverse is not finite.
bool upper_inverse(const double* v, int64_t n, int64_t ld, ThreadPool* pool, float* u);

// u [n][n] (float, row-major) becomes U, upper, zeros below the diagonal, with U^T U = (a + lambda I)^-1,
// read from the lower triangle (j <= i) of a [n][n] (float, row-major) widened to double: the transpose of
// ops::InverseCholesky's l. With J the order reversal, chol(J (a + lambda I) J) = L gives a + lambda I = V
// V^T with V = J L J upper, so (a + lambda I)^-1 = U^T U with U = V^-1: one factorization and one triangular
// inverse. false when cholesky_lower or upper_inverse is (u is then unspecified).
bool inverse_cholesky_upper(const float* a, int64_t n, double lambda, ThreadPool* pool, float* u);

// w[r][k] -= sum_p e[r][p] * u[p][k] for r < rows, p < kb, k in [k_begin, k_end), the p in order for each
// element (GPTQ's lazy batch update; rows ldw, lde, ldu floats apart). In 4 x 16 register tiles, each 16
// columns of the kb rows of u read once for every 4 rows of w. With FMA where the machine has it, so the
// last bit may differ between machines with and without it.
void subtract_product(float* w, int64_t ldw, int64_t rows, const float* e, int64_t lde, int64_t kb,
                      const float* u, int64_t ldu, int64_t k_begin, int64_t k_end);

}  // namespace cpu_linalg
}  // namespace kiln
