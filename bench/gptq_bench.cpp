// Wall seconds of GPTQ (quant/gptq.h) on the thread pool, as `kiln quantize --method gptq` runs it: for each
// Hessian size n, the factor alone (gptq_quantize of no rows: the checked, permuted Hessian, its Cholesky
// factorization and the triangular inverse, 2n^3/3 flops) and then `rows` rows of `type` (the column loop:
// about rows * n^2 flops of lazy updates, plus each block's parameter search). The Hessian is a random
// diagonally dominant one (positive definite without building X^T X). Not a test; prints a markdown table
// with GFLOP/s, to set against the machine's peak.
//   build/release/tests/gptq_bench [--n 2048,4096,8960] [--rows 1536] [--threads 2] [--type q4_k]
#include <chrono>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bench_args.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "quant/gptq.h"

using kiln::bench::check;
using kiln::bench::list_arg;

namespace {

template <class F>
double wall_seconds(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> sizes = list_arg(argc, argv, "--n", {"2048", "4096", "8960"});
  const int64_t rows = std::stoll(list_arg(argc, argv, "--rows", {"1536"}).at(0));
  const int threads = std::stoi(list_arg(argc, argv, "--threads", {"2"}).at(0));
  const std::string type_name = list_arg(argc, argv, "--type", {"q4_k"}).at(0);
  const std::optional<kiln::DType> parsed = kiln::dtype_from_name(type_name);
  if (!parsed || !kiln::gptq_supports(*parsed)) {
    std::fprintf(stderr, "--type %s: not a type GPTQ writes\n", type_name.c_str());
    return 1;
  }
  const kiln::DType type = *parsed;
  kiln::ThreadPool pool(threads);
  kiln::GptqOptions o;
  o.act_order = true;
  o.pool = &pool;
  std::printf("%d threads, %s, act order\n\n", threads, type_name.c_str());
  std::printf("| n | factor s | factor GFLOP/s | %lld rows s | rows GFLOP/s |\n|---:|---:|---:|---:|---:|\n",
              static_cast<long long>(rows));
  for (const std::string& s : sizes) {
    const int64_t n = std::stoll(s);
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> h(static_cast<size_t>(n * n));
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j <= i; ++j) {
        const float v = i == j ? static_cast<float>(n) : 0.3f * normal(rng);
        h[static_cast<size_t>(i * n + j)] = h[static_cast<size_t>(j * n + i)] = v;
      }
    }
    std::vector<float> w(static_cast<size_t>(rows * n));
    for (float& v : w) v = normal(rng);
    const int64_t row_bytes = check(kiln::dtype_row_bytes(type, n), "row bytes");
    std::vector<uint8_t> q(static_cast<size_t>(rows * row_bytes));
    const double factor = wall_seconds(
        [&] { check(kiln::gptq_quantize(w.data(), 0, n, h.data(), type, o, q.data()), "gptq"); });
    const double all = wall_seconds(
        [&] { check(kiln::gptq_quantize(w.data(), rows, n, h.data(), type, o, q.data()), "gptq"); });
    const double nd = static_cast<double>(n), loop = all - factor;
    std::printf("| %lld | %.2f | %.1f | %.2f | %.1f |\n", static_cast<long long>(n), factor,
                2.0 * nd * nd * nd / 3.0 / factor / 1e9, loop,
                static_cast<double>(rows) * nd * nd / loop / 1e9);
  }
  return 0;
}
