// The GPU's kernel timeline of any CUDA program, kiln's included, where no Nsight Systems runs: an injection
// library that the CUDA driver loads at cuInit when CUDA_INJECTION64_PATH names it. It turns on CUPTI's
// concurrent-kernel activity records (each kernel's start and end on the GPU, kernels replayed from CUDA
// graphs and programmatic launches included, none of them serialised) and, as the program exits, writes one
// line a kernel to KILN_CUDA_TRACE_OUT (default cuda-trace.csv):
//   start_ns,end_ns,correlation,graph_id,graph_node,name
// where a graph's kernels share the correlation id of the launch that replayed it, and the name is demangled.
// With KILN_CUDA_TRACE_API=1 it also records every CUDA runtime and driver call the host makes (CUPTI's API
// records: each call's start and end on the host) and prints, as the program exits, the host's time in each
// function: calls, total, mean and median microseconds (a driver call made inside a runtime call counts in
// both).
// bench/cuda_trace.py says from it where a step's time goes (scripts/gpu-check.sh trace). Built by
// tests/CMakeLists.txt (target kiln_cuda_trace) in the cuda preset.
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace {

struct Kernel {
  uint64_t start, end;
  uint32_t correlation, graph_id;
  uint64_t graph_node;
  std::string name;
};

struct ApiTime {
  uint64_t ns = 0;
  std::vector<uint32_t> each_ns;  // every call's, for the median (a first call's loading skews the mean)
};

std::mutex g_mu;
std::vector<Kernel> g_kernels;
std::map<std::pair<int, uint32_t>, ApiTime> g_api;  // (CUPTI callback domain, callback id)
bool g_failed = false;

constexpr size_t kBufferBytes = size_t{8} << 20;

// CUPTI asks for a buffer to fill with records; 8-byte aligned, as it requires.
void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

std::string demangled(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = status == 0 && d != nullptr ? d : name;
  std::free(d);
  return s;
}

// A filled buffer: its kernel records are copied out (CUPTI owns the names only while the buffer lives).
void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::vector<Kernel> got;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind == CUPTI_ACTIVITY_KIND_RUNTIME || record->kind == CUPTI_ACTIVITY_KIND_DRIVER) {
      const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(record);
      const int domain = record->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? CUPTI_CB_DOMAIN_RUNTIME_API
                                                                     : CUPTI_CB_DOMAIN_DRIVER_API;
      const std::lock_guard<std::mutex> lock(g_mu);
      ApiTime& t = g_api[{domain, a->cbid}];
      t.ns += a->end - a->start;
      t.each_ns.push_back(static_cast<uint32_t>(std::min<uint64_t>(a->end - a->start, UINT32_MAX)));
      continue;
    }
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    got.push_back({k->start, k->end, k->correlationId, k->graphId, k->graphNodeId, demangled(k->name)});
  }
  std::free(buffer);
  const std::lock_guard<std::mutex> lock(g_mu);
  g_kernels.insert(g_kernels.end(), got.begin(), got.end());
}

// A CSV field: the name in quotes, its own quotes doubled (template arguments hold commas).
std::string quoted(const std::string& s) {
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

// The host's time in each API function, the costliest first.
void print_api() {
  std::vector<std::pair<std::string, ApiTime>> rows;
  for (auto& [key, t] : g_api) {
    std::sort(t.each_ns.begin(), t.each_ns.end());
    const char* name = nullptr;
    if (cuptiGetCallbackName(static_cast<CUpti_CallbackDomain>(key.first), key.second, &name) !=
        CUPTI_SUCCESS)
      name = nullptr;
    rows.emplace_back(std::string(key.first == CUPTI_CB_DOMAIN_RUNTIME_API ? "runtime " : "driver  ") +
                          (name != nullptr ? name : "?"),
                      t);
  }
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  std::fprintf(stderr, "kiln_cuda_trace: host time in CUDA calls\n%-52s %10s %12s %10s %10s\n", "function",
               "calls", "total us", "mean us", "median us");
  for (const auto& [name, t] : rows) {
    const size_t calls = t.each_ns.size();
    std::fprintf(stderr, "%-52s %10zu %12.1f %10.2f %10.2f\n", name.c_str(), calls, t.ns / 1e3,
                 t.ns / 1e3 / static_cast<double>(calls), t.each_ns[calls / 2] / 1e3);
  }
}

void write_trace() {
  if (g_failed) return;
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  if (!g_api.empty()) print_api();
  const char* out = std::getenv("KILN_CUDA_TRACE_OUT");
  const std::string path = out != nullptr && *out != '\0' ? out : "cuda-trace.csv";
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "kiln_cuda_trace: cannot write %s\n", path.c_str());
    return;
  }
  const std::lock_guard<std::mutex> lock(g_mu);
  std::fprintf(f, "start_ns,end_ns,correlation,graph_id,graph_node,name\n");
  for (const Kernel& k : g_kernels) {
    std::fprintf(f, "%llu,%llu,%u,%u,%llu,%s\n", static_cast<unsigned long long>(k.start),
                 static_cast<unsigned long long>(k.end), k.correlation, k.graph_id,
                 static_cast<unsigned long long>(k.graph_node), quoted(k.name).c_str());
  }
  std::fclose(f);
  std::fprintf(stderr, "kiln_cuda_trace: %zu kernels to %s\n", g_kernels.size(), path.c_str());
}

bool ok(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return true;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::fprintf(stderr, "kiln_cuda_trace: %s failed: %s\n", what, msg != nullptr ? msg : "?");
  g_failed = true;
  return false;
}

}  // namespace

// Called by the CUDA driver as it initialises (CUDA_INJECTION64_PATH); 1: loaded.
extern "C" int InitializeInjection() {
  if (!ok(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed),
          "cuptiActivityRegisterCallbacks") ||
      !ok(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL),
          "cuptiActivityEnable(CONCURRENT_KERNEL)"))
    return 1;
  const char* api = std::getenv("KILN_CUDA_TRACE_API");
  if (api != nullptr && std::string(api) == "1" &&
      (!ok(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME), "cuptiActivityEnable(RUNTIME)") ||
       !ok(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER), "cuptiActivityEnable(DRIVER)")))
    return 1;
  std::atexit(write_trace);
  return 1;
}
