// Attention kernel timings through the public backend API: the paged Attention op of one model shape, as a
// step records it, in prefill (one sequence of T tokens at positions 0 .. T-1, causal) and in decode (B
// sequences of C positions each, one new token each), the pools' block tables shuffled. Prints a markdown
// table (or JSON lines with --json): us per call, TFLOP/s of the causal products (4 x head_dim flops per
// query head and position seen), and for decode the K/V bytes read per second.
//   build/<preset>/tests/attention_bench [--device cpu|cuda] [--json] [--shape 8b|135m|HxKVxD]
//       [--prefill 512,2048] [--decode 1x128,1x1024,16x1024] [--kv-type f16|f32|q8_0|q8_64] [--block 16]
//       [--exact]
// Default: the Llama-3-8B shape (32 query heads, 8 KV heads, head dim 128), f16 pools, the fast precision
// (the engine's default on a GPU; --exact: the f32 path).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "backends/backend.h"
#include "bench_args.h"
#include "core/half.h"
#include "ops/program.h"

namespace kiln {
namespace {

using bench::check;
using bench::list_arg;

struct Shape {
  int64_t n_heads, n_kv, head_dim;
};

struct Options {
  Shape shape{32, 8, 128};
  DType kv_type = DType::f16;
  int64_t block_size = 16;
  bool fast = true;  // the backend's precision: fast, or exact (--exact)
  bool json = false;
};

// Device memory holding `host`'s bytes, and a tensor of it.
struct DeviceTensor {
  std::unique_ptr<Buffer> buf;
  Tensor t;
};

template <class T>
DeviceTensor upload(Backend& b, DType type, const std::vector<T>& host, int64_t ne0, int64_t ne1 = 1,
                    int64_t ne2 = 1, int64_t ne3 = 1) {
  const size_t bytes = host.size() * sizeof(T);
  DeviceTensor d{check(b.allocate(bytes), "allocate"), {}};
  d.t = make_tensor(type, *d.buf, 0, ne0, ne1, ne2, ne3);
  check(b.upload(d.t, host.data(), bytes), "upload");
  return d;
}

// A K or V pool of `n_blocks` blocks, values uniform in [-1, 1].
DeviceTensor make_pool(Backend& b, const Options& o, int64_t n_blocks, std::mt19937& rng) {
  const int64_t n = o.shape.head_dim * o.shape.n_kv * o.block_size * n_blocks;
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  if (o.kv_type == DType::f16) {
    std::vector<uint16_t> h(static_cast<size_t>(n));
    for (auto& v : h) v = f32_to_f16(uni(rng));
    return upload(b, DType::f16, h, o.shape.head_dim, o.shape.n_kv, o.block_size, n_blocks);
  }
  std::vector<float> h(static_cast<size_t>(n));
  for (auto& v : h) v = uni(rng);
  if (o.kv_type == DType::q8_0 || o.kv_type == DType::q8_64) {  // rows quantized by the reference quantizer
    const int64_t row_bytes = *dtype_row_bytes(o.kv_type, o.shape.head_dim), rows = n / o.shape.head_dim;
    std::vector<uint8_t> q(static_cast<size_t>(rows * row_bytes));
    for (int64_t r = 0; r < rows; ++r) {
      dtype_info(o.kv_type).quantize_row(h.data() + r * o.shape.head_dim, q.data() + r * row_bytes,
                                         o.shape.head_dim);
    }
    return upload(b, o.kv_type, q, o.shape.head_dim, o.shape.n_kv, o.block_size, n_blocks);
  }
  return upload(b, DType::f32, h, o.shape.head_dim, o.shape.n_kv, o.block_size, n_blocks);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One row: `n_seqs` sequences, each of `ctx` positions, whose last `n_new` tokens the step computes.
void bench_case(Backend& b, const Options& o, const char* kind, int64_t n_seqs, int64_t ctx, int64_t n_new,
                std::mt19937& rng) {
  const Shape& s = o.shape;
  const int64_t per_seq = (ctx + o.block_size - 1) / o.block_size;
  const int64_t n_blocks = n_seqs * per_seq;
  std::vector<int32_t> ids(static_cast<size_t>(n_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> indptr{0}, positions, seq;
  for (int64_t r = 0; r < n_seqs; ++r) {
    indptr.push_back(static_cast<int32_t>((r + 1) * per_seq));
    for (int64_t p = ctx - n_new; p < ctx; ++p) {
      positions.push_back(static_cast<int32_t>(p));
      seq.push_back(static_cast<int32_t>(r));
    }
  }
  const auto n_tokens = static_cast<int64_t>(positions.size());
  std::uniform_real_distribution<float> uni(-2.0f, 2.0f);
  std::vector<float> qh(static_cast<size_t>(s.head_dim * s.n_heads * n_tokens));
  for (float& v : qh) v = uni(rng);
  const DeviceTensor k = make_pool(b, o, n_blocks, rng), v = make_pool(b, o, n_blocks, rng);
  const DeviceTensor q = upload(b, DType::f32, qh, s.head_dim, s.n_heads, n_tokens);
  const DeviceTensor pos = upload(b, DType::i32, positions, n_tokens),
                     sq = upload(b, DType::i32, seq, n_tokens);
  const DeviceTensor ip = upload(b, DType::i32, indptr, n_seqs + 1),
                     bt = upload(b, DType::i32, ids, n_blocks);
  DeviceTensor dst{check(b.allocate(qh.size() * 4), "allocate"), {}};
  dst.t = make_tensor(DType::f32, *dst.buf, 0, s.head_dim, s.n_heads, n_tokens);
  Program p;
  check(p.add(ops::Attention{q.t, k.t, v.t, pos.t, sq.t, ip.t, bt.t,
                             1.0f / std::sqrt(static_cast<float>(s.head_dim)), 0.0f, 0, dst.t}),
        "program");
  p.n_tokens = static_cast<int32_t>(n_tokens);
  check(b.run(p), "attention");
  check(b.synchronize(), "synchronize");
  // As many calls as take about 0.2 s, at least 5.
  auto t0 = std::chrono::steady_clock::now();
  check(b.run(p), "attention");
  check(b.synchronize(), "synchronize");
  const double once = seconds_since(t0);
  const int reps = std::clamp(static_cast<int>(0.2 / std::max(once, 1e-6)), 5, 2000);
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) check(b.run(p), "attention");
  check(b.synchronize(), "synchronize");
  const double sec = seconds_since(t0) / reps;
  // Positions seen: each new token at position t sees t + 1 of them.
  double seen = 0.0;
  for (int32_t t : positions) seen += t + 1;
  const double tflops = 4.0 * static_cast<double>(s.head_dim * s.n_heads) * seen / sec / 1e12;
  const double kv_bytes = 2.0 * static_cast<double>(n_seqs * ctx * s.n_kv) *
                          static_cast<double>(*dtype_row_bytes(o.kv_type, s.head_dim));
  const double gbs = kv_bytes / sec / 1e9;
  if (o.json) {
    std::printf(
        "{\"kind\":\"%s\",\"heads\":%lld,\"kv_heads\":%lld,\"head_dim\":%lld,\"seqs\":%lld,\"context\":%lld,"
        "\"tokens\":%lld,\"us\":%.2f,\"tflops\":%.2f,\"kv_gbs\":%.1f}\n",
        kind, static_cast<long long>(s.n_heads), static_cast<long long>(s.n_kv),
        static_cast<long long>(s.head_dim), static_cast<long long>(n_seqs), static_cast<long long>(ctx),
        static_cast<long long>(n_tokens), sec * 1e6, tflops, gbs);
  } else {
    std::printf("| %-7s | %2lld/%lld/%3lld | %4lld | %6lld | %6lld | %10.2f | %7.1f | %8.1f |\n", kind,
                static_cast<long long>(s.n_heads), static_cast<long long>(s.n_kv),
                static_cast<long long>(s.head_dim), static_cast<long long>(n_seqs),
                static_cast<long long>(ctx), static_cast<long long>(n_tokens), sec * 1e6, tflops, gbs);
  }
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  using namespace kiln;  // NOLINT
  Options o;
  for (int i = 1; i < argc; ++i) {
    o.json = o.json || std::string_view(argv[i]) == "--json";
    if (std::string_view(argv[i]) == "--exact") o.fast = false;
  }
  const std::string device = list_arg(argc, argv, "--device", {"cuda"}).at(0);
  if (device != "cpu" && device != "cuda") {
    std::fprintf(stderr, "--device: %s is not cpu or cuda\n", device.c_str());
    return 2;
  }
  const std::string shape = list_arg(argc, argv, "--shape", {"8b"}).at(0);
  if (shape == "135m") {
    o.shape = {9, 3, 64};
  } else if (shape != "8b") {
    long long h = 0, kv = 0, d = 0;
    if (std::sscanf(shape.c_str(), "%lldx%lldx%lld", &h, &kv, &d) != 3 || h < 1 || kv < 1 || d < 1 ||
        h % kv != 0) {
      std::fprintf(stderr, "--shape: %s is not 8b, 135m or HxKVxD (query heads a multiple of KV heads)\n",
                   shape.c_str());
      return 2;
    }
    o.shape = {h, kv, d};
  }
  const std::string kv_type = list_arg(argc, argv, "--kv-type", {"f16"}).at(0);
  if (kv_type != "f16" && kv_type != "f32" && kv_type != "q8_0" && kv_type != "q8_64") {
    std::fprintf(stderr, "--kv-type: %s is not f16, f32, q8_0 or q8_64\n", kv_type.c_str());
    return 2;
  }
  o.kv_type = *dtype_from_name(kv_type);
  o.block_size = std::stoll(list_arg(argc, argv, "--block", {"16"}).at(0));
  if (o.block_size < 1) {
    std::fprintf(stderr, "--block: must be at least 1\n");
    return 2;
  }
  BackendOptions bo;
  bo.precision = o.fast ? ops::Precision::precision_fast : ops::Precision::precision_exact;
  auto b = check(make_backend(device, bo), "make_backend");
  if (!o.json) {
    std::printf("%s, %s pools, %s\n\n", device.c_str(), kv_type.c_str(), o.fast ? "fast" : "exact");
    std::printf("| kind    | heads     | seqs | context | tokens |   us/call | TFLOP/s | K/V GB/s |\n");
    std::printf("|---------|----------:|-----:|--------:|-------:|----------:|--------:|---------:|\n");
  }
  std::mt19937 rng(1234);
  for (const std::string& t : list_arg(argc, argv, "--prefill", {"512", "2048"})) {
    const int64_t n = std::stoll(t);
    if (n < 1) {
      std::fprintf(stderr, "--prefill: %s is not a token count\n", t.c_str());
      return 2;
    }
    bench_case(*b, o, "prefill", 1, n, n, rng);
  }
  for (const std::string& c : list_arg(argc, argv, "--decode", {"1x128", "1x1024", "1x4096", "16x1024"})) {
    long long bs = 0, ctx = 0;
    if (std::sscanf(c.c_str(), "%lldx%lld", &bs, &ctx) != 2 || bs < 1 || ctx < 1) {
      std::fprintf(stderr, "--decode: %s is not BxC (sequences x context)\n", c.c_str());
      return 2;
    }
    bench_case(*b, o, "decode", bs, ctx, 1, rng);
  }
  return 0;
}
