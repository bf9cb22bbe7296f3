// One thread's speed of kiln's row quantizers (DTypeInfo::quantize_rows) beside ggml's (ggml_quantize_chunk,
// from a libggml-base shared library loaded at run time), on the same random rows, without and with an
// importance vector; checks that the bytes are equal. Not a test; prints seconds per matrix and the ratio.
//   build/release/tests/quantize_rows_bench LIBGGML_BASE_SO [types=q4_k,q6_k] [rows=4096] [cols=4096]
//   [reps=3]
// (the test venv's copy: <site-packages>/llama_cpp/lib/libggml-base.so)
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace {

using GgmlQuantizeChunk = size_t (*)(int type, const float* src, void* dst, int64_t start, int64_t nrows,
                                     int64_t n_per_row, const float* imatrix);
using GgmlQuantizeInit = void (*)(int type);

// CPU seconds of this thread spent in f (time waiting for a core on a busy machine is not counted).
template <class F>
double seconds(F&& f) {
  auto now = [] {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  };
  const double t0 = now();
  f();
  return now() - t0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: quantize_rows_bench LIBGGML_BASE_SO [types] [rows] [cols] [reps]\n");
    return 1;
  }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::fprintf(stderr, "cannot load %s: %s\n", argv[1], dlerror());
    return 1;
  }
  auto ggml_quantize_chunk = reinterpret_cast<GgmlQuantizeChunk>(dlsym(lib, "ggml_quantize_chunk"));
  auto ggml_quantize_init = reinterpret_cast<GgmlQuantizeInit>(dlsym(lib, "ggml_quantize_init"));
  if (ggml_quantize_chunk == nullptr || ggml_quantize_init == nullptr) {
    std::fprintf(stderr, "%s has no ggml_quantize_chunk\n", argv[1]);
    return 1;
  }
  const std::string types = argc > 2 ? argv[2] : "q4_k,q6_k";
  const int64_t rows = argc > 3 ? std::atoll(argv[3]) : 4096;
  const int64_t cols = argc > 4 ? std::atoll(argv[4]) : 4096;
  const int reps = argc > 5 ? std::atoi(argv[5]) : 3;

  // [rows, cols] weights ~ N(0, 0.02^2); importance ~ exp(N(0, 1.5^2)) per column, like mean squared
  // activations
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (float& v : x) v = 0.02f * normal(gen);
  std::vector<float> importance(static_cast<size_t>(cols));
  for (float& v : importance) v = std::exp(1.5f * normal(gen));

  std::printf("%lld x %lld, one thread, CPU seconds, best of %d (ratio: the median of the reps')\n",
              static_cast<long long>(rows), static_cast<long long>(cols), reps);
  std::stringstream list(types);
  for (std::string name; std::getline(list, name, ',');) {
    const auto type = kiln::dtype_from_name(name);
    if (!type || kiln::dtype_info(*type).quantize_rows == nullptr) {
      std::fprintf(stderr, "no row quantizer for %s\n", name.c_str());
      return 1;
    }
    const kiln::DTypeInfo& info = kiln::dtype_info(*type);
    const size_t bytes = static_cast<size_t>(rows * (cols / info.block_size) * info.type_size);
    std::vector<uint8_t> ours(bytes), theirs(bytes);
    const int id = static_cast<int>(*type);
    ggml_quantize_init(id);
    info.quantize_rows(x.data(), ours.data(), 1, cols, importance.data());  // kiln's i-quant grids, likewise
    for (const float* imp :
         {static_cast<const float*>(nullptr), static_cast<const float*>(importance.data())}) {
      if (imp == nullptr && info.requires_importance) continue;  // IQ2_XXS, IQ2_XS, IQ1_S
      // kiln and ggml alternate, so that both see the same machine: best times and the median ratio
      std::vector<double> t_kiln, t_ggml, ratio;
      for (int r = 0; r < reps; ++r) {
        t_kiln.push_back(seconds([&] { info.quantize_rows(x.data(), ours.data(), rows, cols, imp); }));
        t_ggml.push_back(
            seconds([&] { ggml_quantize_chunk(id, x.data(), theirs.data(), 0, rows, cols, imp); }));
        ratio.push_back(t_kiln.back() / t_ggml.back());
      }
      std::sort(ratio.begin(), ratio.end());
      std::printf("%-7s %-13s kiln %.3f s  ggml %.3f s  kiln/ggml %.2f  %s\n", info.name,
                  imp != nullptr ? "importance" : "no importance",
                  *std::min_element(t_kiln.begin(), t_kiln.end()),
                  *std::min_element(t_ggml.begin(), t_ggml.end()), ratio[ratio.size() / 2],
                  ours == theirs ? "same bytes" : "BYTES DIFFER");
    }
  }
  dlclose(lib);
  return 0;
}
