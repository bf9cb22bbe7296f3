// The machine's memory read bandwidth, the ceiling of a decode step that streams the weights once:
// T threads each sum their slice of one buffer (default 1 GiB, far larger than any cache), best of R passes.
// Prints one JSON line. Usage: read_bandwidth [THREADS [MIB [REPS]]]   (defaults: 1, 1024, 10)
// Used by bench/cpu_vs_llamacpp.py; built by tests/CMakeLists.txt (target read_bandwidth).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

// The widest loads the machine has (picked at load time from cpuid): baseline SSE2 loads read measurably
// less.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define READ_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define READ_CLONES
#endif

namespace {

// Sum of n words in eight independent lanes: the loop vectorises and is bound by loads, not by an add chain.
READ_CLONES uint64_t sum_words(const uint64_t* p, size_t n) {
  uint64_t acc[8] = {};
  for (size_t i = 0; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += p[i + l];
  }
  uint64_t s = 0;
  for (uint64_t a : acc) s += a;
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::max(1, std::atoi(argv[1])) : 1;
  const size_t mib = argc > 2 ? static_cast<size_t>(std::max(1, std::atoi(argv[2]))) : 1024;
  const int reps = argc > 3 ? std::max(1, std::atoi(argv[3])) : 10;
  const size_t n_words = (mib << 20) / sizeof(uint64_t);
  const size_t per_thread = n_words / static_cast<size_t>(threads) / 8 * 8;  // words, a multiple of 8
  std::vector<uint64_t> buf(n_words);
  for (size_t i = 0; i < n_words; ++i) buf[i] = i;  // touched: every page is resident before timing
  std::vector<uint64_t> sums(static_cast<size_t>(threads));
  double best = 0.0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] { sums[t] = sum_words(buf.data() + per_thread * t, per_thread); });
    }
    for (std::thread& th : pool) th.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(per_thread * threads * sizeof(uint64_t)) / s);
  }
  uint64_t check = 0;
  for (uint64_t s : sums) check ^= s;  // keeps the sums live
  std::printf("{\"threads\": %d, \"mib\": %zu, \"reps\": %d, \"read_gb_per_s\": %.3f, \"check\": %llu}\n",
              threads, mib, reps, best / 1e9, static_cast<unsigned long long>(check));
  return 0;
}
