// Matmul kernel timings through the public backend API (prepare_weight, run, synchronize) against the
// backend's copy bandwidth: each weight type, m = 1 .. 512 x rows, copies of the weight cycled so that every
// call reads memory, not a cache. Prints a markdown table (or JSON lines with --json): us per call, weight
// GB/s (the file's bytes), % of the measured copy bandwidth (bytes read + written), and TFLOP/s from m = 16.
//   build/<preset>/tests/matmul_bench [--device cpu|cuda] [--json] [--types bf16,q4_0,...] [--m 1,2,...]
//                                     [--shapes 4096x4096,576x1536,...]   (k x n)   [--cached]
//                                     [--gemv-rows 1|2|4|8] [--mmq-min N]
// --cached multiplies one copy of each weight, which then stays in the caches where it fits: the kernels'
// compute rate.
// CUDA only (options that no environment variable sets: cuda_options.h): --gemv-rows forces the rows a block
// of the one-column GEMVs (scripts/gpu-check.sh tune); --mmq-min N sends batches of N rows and more (2 ..
// 64) of K-quant weights to the integer tensor-core kernel (gpu-check.sh mmq).
// Default shapes: on cuda a Llama-3-8B layer (q/o, k/v, gate/up, down) and its output head; on cpu the layers
// of SmolLM2-135M and Qwen2.5-1.5B. The CPU's thread count is KILN_THREADS or the machine's.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "backends/backend.h"
#include "bench_args.h"
#ifdef KILN_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#endif
#include "core/half.h"
#include "ops/program.h"

namespace kiln {
namespace {

using bench::check;
using bench::list_arg;

constexpr int kReps = 200;
bool g_cached = false;  // --cached: one copy of each weight

// Byte offsets of the f16 scale fields in one block, which random bytes must not make huge or NaN.
std::vector<size_t> scale_offsets(DType type) {
  switch (type) {
    case DType::q4_0:
    case DType::q5_0:
    case DType::q8_0:
    case DType::iq4_nl:
    case DType::iq4_xs:
    case DType::iq2_xxs:
    case DType::iq2_xs:
    case DType::iq2_s:
    case DType::iq3_xxs:
    case DType::iq3_s:
    case DType::iq1_s: return {0};
    case DType::q4_1:
    case DType::q5_1:
    case DType::q4_k:
    case DType::q5_k: return {0, 2};
    case DType::q2_k: return {80, 82};
    case DType::q3_k: return {108};
    case DType::q6_k: return {208};
    default: return {};
  }
}

// A [k, n] weight of `type` in host memory: 16-bit floats uniform in [-1, 1], blocks random bytes with small
// finite scales (f8_e4m3: one a row, as the backend's row form takes it).
std::vector<uint8_t> make_weight(DType type, int64_t k, int64_t n, std::mt19937& rng) {
  const int64_t bytes = dtype_row_bytes(type, k).value() * n;
  std::vector<uint8_t> mem(static_cast<size_t>(bytes));
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  if (type == DType::f16 || type == DType::bf16) {
    for (int64_t i = 0; i < bytes / 2; ++i) {
      const uint16_t h = type == DType::f16 ? f32_to_f16(uni(rng)) : f32_to_bf16(uni(rng));
      std::memcpy(mem.data() + 2 * i, &h, 2);
    }
    return mem;
  }
  for (auto& b : mem) b = static_cast<uint8_t>(rng());
  if (type == DType::f8_e4m3) {  // one scale a row (a per-channel checkpoint's), codes that are not NaN
    const int64_t row_bytes = bytes / n;
    for (int64_t j = 0; j < n; ++j) {
      const float d = 0.01f * (1.0f + uni(rng));
      for (int64_t off = j * row_bytes; off < (j + 1) * row_bytes; off += 36) {
        std::memcpy(mem.data() + off, &d, 4);
        for (int64_t e = 4; e < 36; ++e) {
          if ((mem[static_cast<size_t>(off + e)] & 0x7F) == 0x7F) mem[static_cast<size_t>(off + e)] ^= 1;
        }
      }
    }
    return mem;
  }
  const int64_t block = dtype_info(type).type_size;
  for (int64_t off = 0; off < bytes; off += block) {
    for (size_t s : scale_offsets(type)) {
      const uint16_t d = f32_to_f16(0.01f * uni(rng));
      std::memcpy(mem.data() + off + s, &d, 2);
    }
  }
  return mem;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Bytes read + written per second of a 1 GiB device-to-device copy.
double copy_bandwidth(Backend& b) {
  constexpr int64_t n = int64_t{1} << 28;  // f32 elements: 1 GiB
  auto src = check(b.allocate(n * 4), "allocate"), dst = check(b.allocate(n * 4), "allocate");
  const Tensor ts = make_tensor(DType::f32, *src, 0, n), td = make_tensor(DType::f32, *dst, 0, n);
  check(b.copy(td, ts), "copy");
  check(b.synchronize(), "synchronize");
  constexpr int reps = 20;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) check(b.copy(td, ts), "copy");
  check(b.synchronize(), "synchronize");
  return 2.0 * n * 4 * reps / seconds_since(t0);
}

struct Shape {
  int64_t k, n;
};

// One row of the table: the weights (copies of one matrix of `w_bytes`, cycled so that together they overflow
// the caches and every call reads memory) times m columns of x.
void bench_m(Backend& b, const std::vector<std::unique_ptr<WeightHandle>>& ws, int64_t w_bytes, int64_t m,
             double copy_bw, bool json, std::mt19937& rng) {
  const Tensor& w0 = ws[0]->weight.tensor;
  const DType type = w0.type;
  const Shape sh{w0.ne[0], w0.ne[1]};
  std::vector<float> xh(static_cast<size_t>(sh.k * m));
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  for (float& v : xh) v = uni(rng);
  auto xbuf = check(b.allocate(xh.size() * 4), "allocate"),
       dbuf = check(b.allocate(sh.n * m * 4), "allocate");
  const Tensor x = make_tensor(DType::f32, *xbuf, 0, sh.k, m),
               dst = make_tensor(DType::f32, *dbuf, 0, sh.n, m);
  check(b.upload(x, xh.data(), xh.size() * 4), "upload");
  // The backend is made at the fast precision, the default path (on the GPU tensor cores for m > 8; its GEMV
  // is exact either way).
  std::vector<Program> calls(ws.size());
  for (size_t i = 0; i < ws.size(); ++i) check(calls[i].add(ops::Matmul{ws[i]->weight, x, dst}), "program");
  for (const Program& p : calls) check(b.run(p), "matmul");
  check(b.synchronize(), "synchronize");
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kReps; ++i) check(b.run(calls[static_cast<size_t>(i) % calls.size()]), "matmul");
  check(b.synchronize(), "synchronize");
  const double s = seconds_since(t0) / kReps;
  const double gbs = static_cast<double>(w_bytes) / s / 1e9;
  const double pct = 100.0 * static_cast<double>(w_bytes) / s / copy_bw;
  const double tflops = 2.0 * sh.k * sh.n * m / s / 1e12;
  if (json) {
    std::printf(
        "{\"type\":\"%s\",\"k\":%lld,\"n\":%lld,\"m\":%lld,\"us\":%.2f,\"gbs\":%.1f,\"pct_copy\":%.1f,"
        "\"tflops\":%.2f}\n",
        dtype_name(type), static_cast<long long>(sh.k), static_cast<long long>(sh.n),
        static_cast<long long>(m), s * 1e6, gbs, pct, tflops);
  } else {
    std::printf("| %-5s | %5lld | %6lld | %2lld | %9.2f | %7.1f | %5.1f | %s |\n", dtype_name(type),
                static_cast<long long>(sh.k), static_cast<long long>(sh.n), static_cast<long long>(m),
                s * 1e6, gbs, pct, m >= 16 ? std::to_string(tflops).substr(0, 6).c_str() : "");
  }
}

void bench_weight(Backend& b, DType type, Shape sh, const std::vector<int64_t>& ms, double copy_bw, bool json,
                  std::mt19937& rng) {
  if (!dtype_row_bytes(type, sh.k).ok()) return;  // k not a multiple of the type's block (q4_K at k = 576)
  std::vector<uint8_t> host = make_weight(type, sh.k, sh.n, rng);
  const Tensor logical = make_tensor(type, host.data(), sh.k, sh.n);
  // At least 256 MiB of copies (the H100's L2 is 50 MB; a CPU's last-level cache less); one with --cached
  // (the weights then stay in the caches where they fit: the kernel's compute rate).
  const size_t copies = g_cached ? 1 : std::max<size_t>(1, (size_t{256} << 20) / host.size() + 1);
  std::vector<std::unique_ptr<WeightHandle>> ws;
  for (size_t i = 0; i < copies; ++i) {
    ws.push_back(check(b.prepare_weight(logical, "w", WeightRole::weight_role_matmul), "prepare_weight"));
  }
  for (int64_t m : ms) bench_m(b, ws, static_cast<int64_t>(host.size()), m, copy_bw, json, rng);
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  using namespace kiln;  // NOLINT
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    json = json || std::string_view(argv[i]) == "--json";
    g_cached = g_cached || std::string_view(argv[i]) == "--cached";
  }
  const std::string device = list_arg(argc, argv, "--device", {"cpu"}).at(0);
  if (device != "cpu" && device != "cuda") {
    std::fprintf(stderr, "--device: %s is not cpu or cuda\n", device.c_str());
    return 2;
  }
  const std::vector<std::string> type_names = list_arg(
      argc, argv, "--types", {"bf16", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q4_k", "q5_k", "q6_k"});
  std::vector<int64_t> ms;
  for (const std::string& m : list_arg(argc, argv, "--m", {"1", "2", "4", "8", "16", "64", "512"})) {
    ms.push_back(std::stoll(m));
  }
  const std::vector<std::string> gemv_rows = list_arg(argc, argv, "--gemv-rows", {});
  const std::vector<std::string> mmq_min = list_arg(argc, argv, "--mmq-min", {});
  std::unique_ptr<Backend> b;
#ifdef KILN_HAVE_CUDA
  if (device == "cuda") {
    CudaOptions options = cuda_options_from_env();
    options.precision = ops::Precision::precision_fast;
    if (!gemv_rows.empty()) options.gemv_rows = std::stoi(gemv_rows.at(0));
    if (!mmq_min.empty()) options.mmq_min_cols = std::stoi(mmq_min.at(0));
    b = check(make_cuda_backend(0, options), "make_cuda_backend");
  }
#endif
  if (b == nullptr) {
    if (!gemv_rows.empty() || !mmq_min.empty()) {
      std::fprintf(stderr, "--gemv-rows and --mmq-min are options of a CUDA build's cuda device\n");
      return 2;
    }
    BackendOptions bo;
    bo.precision = ops::Precision::precision_fast;
    b = check(make_backend(device, bo), "make_backend");
  }
  const double copy_bw = copy_bandwidth(*b);
  if (json) {
    std::printf("{\"copy_gbs\":%.1f}\n", copy_bw / 1e9);
  } else {
    std::printf("%s, %d threads; copy: %.1f GB/s (read + write)\n\n", device.c_str(), b->n_threads(),
                copy_bw / 1e9);
    std::printf("| type  |     k |      n |  m |   us/call |    GB/s | %%copy | TFLOP/s |\n");
    std::printf("|-------|------:|-------:|---:|----------:|--------:|------:|--------:|\n");
  }
  std::mt19937 rng(1234);
  const std::vector<std::string> shape_names = list_arg(
      argc, argv, "--shapes",
      device == "cuda"
          ? std::vector<std::string>{"4096x4096", "4096x1024", "4096x14336", "14336x4096", "4096x128256"}
          : std::vector<std::string>{"576x576", "576x1536", "1536x576", "1536x1536", "1536x8960",
                                     "8960x1536"});
  std::vector<Shape> shapes;
  for (const std::string& sh : shape_names) {
    const size_t x = sh.find('x');
    if (x == std::string::npos) {
      std::fprintf(stderr, "--shapes: %s is not KxN\n", sh.c_str());
      return 2;
    }
    shapes.push_back({std::stoll(sh.substr(0, x)), std::stoll(sh.substr(x + 1))});
  }
  for (const std::string& name : type_names) {
    const std::optional<DType> t = dtype_from_name(name);
    if (!t) {
      std::fprintf(stderr, "--types: unknown type %s\n", name.c_str());
      return 2;
    }
    for (Shape sh : shapes) bench_weight(*b, *t, sh, ms, copy_bw, json, rng);
  }
  return 0;
}
