// The CPU backend's ISA level: names, the KILN_CPU_ISA override and its errors; which weights a level keeps
// in its own memory and layout.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "backends/cpu/cpu_options.h"
#include "backends/cpu/kernels/cpu_kernels.h"
#include "core/half.h"
#include "core/quant/quant_blocks.h"
#include "ops/ref/ref.h"

namespace kiln {
namespace {

using cpu::CpuIsa;

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_.empty()) {
      unsetenv(name_);
    } else {
      setenv(name_, old_.c_str(), 1);
    }
  }

 private:
  const char* name_;
  std::string old_;
};

TEST(CpuIsa, NamesRoundTrip) {
  for (CpuIsa isa : cpu::kCpuIsaLevels) {
    Result<CpuIsa> back = cpu::cpu_isa_from_name(cpu::cpu_isa_name(isa));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, isa);
  }
  EXPECT_TRUE(cpu::cpu_isa_supported(CpuIsa::cpu_isa_scalar));
  EXPECT_TRUE(cpu::cpu_isa_supported(cpu::cpu_isa_best()));
}

TEST(CpuIsa, UnknownNameIsOneLineNamingTheValueAndTheChoices) {
  const Status s = cpu::cpu_isa_from_name("sse9").status();
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("\"sse9\""), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("scalar|avx2|avx512|avx512vnni"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find('\n'), std::string::npos);
}

TEST(CpuIsa, EnvironmentForcesALevel) {
  {
    ScopedEnv env("KILN_CPU_ISA", "scalar");
    Result<CpuIsa> isa = cpu::cpu_isa_select("");
    ASSERT_TRUE(isa.ok());
    EXPECT_EQ(*isa, CpuIsa::cpu_isa_scalar);
  }
  {
    ScopedEnv env("KILN_CPU_ISA", "avx1024");
    Result<std::unique_ptr<Backend>> b = make_backend("cpu");
    ASSERT_FALSE(b.ok());
    EXPECT_NE(b.status().message().find("KILN_CPU_ISA"), std::string::npos) << b.status().message();
    EXPECT_NE(b.status().message().find("avx1024"), std::string::npos) << b.status().message();
  }
  // The option wins over the environment.
  ScopedEnv env("KILN_CPU_ISA", "avx1024");
  BackendOptions options;
  options.cpu_isa = "scalar";
  EXPECT_TRUE(make_backend("cpu", options).ok());
}

// Product weights are repacked at load at every level but scalar (the op harness then holds the packed
// kernels to the references through prepared weights: this is what makes those cases reach them), with the
// layout's size; other roles, the scalar level and KILN_CPU_REPACK=0 keep the file's layout.
TEST(CpuIsa, ProductWeightsArePackedAboveScalar) {
  const int64_t k = 64, n = 37;  // 3 groups of 16 rows, the last one 5 rows
  std::vector<uint8_t> bytes(static_cast<size_t>(k * n * 4), 0x3c);
  for (const bool repack : {true, false}) {
    ScopedEnv env("KILN_CPU_REPACK", repack ? "1" : "0");
    for (CpuIsa isa : cpu::kCpuIsaLevels) {
      if (!cpu::cpu_isa_supported(isa)) continue;
      BackendOptions options;
      options.cpu_isa = std::string(cpu::cpu_isa_name(isa));
      options.n_threads = 2;
      Result<std::unique_ptr<Backend>> b = make_backend("cpu", options);
      ASSERT_TRUE(b.ok());
      const bool packs = repack && isa != CpuIsa::cpu_isa_scalar;
      for (DType type : {DType::f32, DType::f16, DType::bf16, DType::q8_0, DType::q4_k}) {
        const Tensor w = make_tensor(type, bytes.data(), type == DType::q4_k ? 256 : k, n);
        for (WeightRole role : {WeightRole::weight_role_matmul, WeightRole::weight_role_expert_matmul,
                                WeightRole::weight_role_tied_embedding, WeightRole::weight_role_embedding}) {
          Result<std::unique_ptr<WeightHandle>> h = (*b)->prepare_weight(w, "w", role);
          ASSERT_TRUE(h.ok());
          const bool want = packs && role != WeightRole::weight_role_embedding;
          EXPECT_EQ((*h)->prepared != nullptr, want)
              << cpu::cpu_isa_name(isa) << " " << dtype_name(type) << " " << weight_role_name(role)
              << " KILN_CPU_REPACK=" << repack;
          EXPECT_EQ((*h)->weight.prepared, (*h)->prepared.get());
          if (want && dtype_info(type).block_size == 1) {  // [k][16] elements a group, 64-byte aligned
            const int64_t group = (k * 16 * static_cast<int64_t>(dtype_info(type).type_size) + 63) / 64 * 64;
            EXPECT_EQ((*h)->prepared->bytes(), static_cast<size_t>(3 * group)) << dtype_name(type);
          }
        }
      }
    }
  }
}

// The packed form of each block-quantized type that has one: its bits a quant and its scales.
struct PackedForm {
  DType type;
  int bits;
  uint32_t scales;
  std::vector<size_t> f16_at;  // a block's f16 scales
};
const std::vector<PackedForm>& packed_forms() {
  using namespace quant;
  static const std::vector<PackedForm> forms = {
      {DType::q4_0, 4, cpu::kPackD, {0}},
      {DType::q4_1, 4, cpu::kPackDM, {0, 2}},
      {DType::q5_0, 5, cpu::kPackD, {0}},
      {DType::q5_1, 5, cpu::kPackDM, {0, 2}},
      {DType::q8_0, 8, cpu::kPackD, {0}},
      {DType::iq4_nl, 4, cpu::kPackD, {0}},
      {DType::iq4_xs, 4, cpu::kPackK16, {offsetof(BlockIQ4_XS, d)}},
      {DType::q2_k, 2, cpu::kPackKM16, {offsetof(BlockQ2_K, d), offsetof(BlockQ2_K, dmin)}},
      {DType::q3_k, 4, cpu::kPackK16, {offsetof(BlockQ3_K, d)}},
      {DType::q4_k, 4, cpu::kPackK32, {offsetof(BlockQ4_K, d), offsetof(BlockQ4_K, dmin)}},
      {DType::q5_k, 5, cpu::kPackK32, {offsetof(BlockQ5_K, d), offsetof(BlockQ5_K, dmin)}},
      {DType::q6_k, 6, cpu::kPackK16, {offsetof(BlockQ6_K, d)}},
      {DType::iq2_xxs, 8, cpu::kPackK16, {0}},
      {DType::iq2_xs, 8, cpu::kPackK16, {0}},
      {DType::iq2_s, 8, cpu::kPackK16, {0}},
      {DType::iq3_xxs, 8, cpu::kPackK16, {0}},
      {DType::iq3_s, 8, cpu::kPackK16, {0}},
      {DType::iq1_s, 8, cpu::kPackK16, {0}},
      {DType::iq1_m, 8, cpu::kPackK16, {}},  // its f16 scale is the top nibbles of bytes 49, 51, 53, 55
  };
  return forms;
}

// k * n elements of f's type as blocks of random bytes (every quant value and scale bit pattern) under the
// f16 scale `scale` (a second f16, a min or an offset: -0.75 `scale`).
std::vector<uint8_t> random_blocks(const PackedForm& f, int64_t k, int64_t n, uint16_t scale) {
  using namespace quant;
  const DTypeInfo& info = dtype_info(f.type);
  const int64_t n_blocks = n * k / info.block_size;
  std::vector<uint8_t> bytes(static_cast<size_t>(n_blocks * info.type_size));
  uint32_t state = 12345;
  for (uint8_t& v : bytes) {
    state = state * 1664525u + 1013904223u;
    v = static_cast<uint8_t>(state >> 24);
  }
  for (int64_t i = 0; i < n_blocks; ++i) {
    for (size_t j = 0; j < f.f16_at.size(); ++j) {
      const uint16_t h = j == 0 ? scale : f32_to_f16(-0.75f * f16_to_f32(scale));
      std::memcpy(&bytes[i * info.type_size + f.f16_at[j]], &h, 2);
    }
    if (f.type == DType::iq1_m) {  // nibble j of the f16 in the top nibble of scale word j
      for (int j = 0; j < 4; ++j) {
        uint8_t& v = bytes[i * info.type_size + offsetof(BlockIQ1_M, scales) + 2 * j + 1];
        v = static_cast<uint8_t>((v & 0x0F) | (scale >> 4 * j & 0x0F) << 4);
      }
    }
  }
  return bytes;
}

// A CPU backend at each packing level this machine runs (every supported level but scalar).
std::vector<std::pair<CpuIsa, std::unique_ptr<Backend>>> packing_backends() {
  std::vector<std::pair<CpuIsa, std::unique_ptr<Backend>>> out;
  for (CpuIsa isa : cpu::kCpuIsaLevels) {
    if (isa == CpuIsa::cpu_isa_scalar || !cpu::cpu_isa_supported(isa)) continue;
    BackendOptions options;
    options.cpu_isa = std::string(cpu::cpu_isa_name(isa));
    Result<std::unique_ptr<Backend>> b = make_backend("cpu", options);
    EXPECT_TRUE(b.ok()) << cpu::cpu_isa_name(isa);
    if (b.ok()) out.emplace_back(isa, std::move(*b));
  }
  return out;
}

// Every block-quantized type with a packed form packs (blocks of random bytes, every quant value and scale
// bit pattern, under finite f16 scales) into the layout's size at its bit width: 2 bits for q2_K (under its
// scale and min per 16), 4 for q4_*, q3_K (quants 0..7), iq4_nl and iq4_xs (the indices of their table's
// levels), 5 for q5_*, 6 for q6_K, 8 for q8_0 and the grid i-quants (grid values times signs, under integer
// scales per 16). A quant that did not fit would make the packer keep the file's layout.
TEST(CpuIsa, QuantizedWeightsPackAtTheirWidth) {
  const int64_t k = 512, n = 37;
  for (auto& [isa, b] : packing_backends()) {
    for (const PackedForm& f : packed_forms()) {
      std::vector<uint8_t> bytes = random_blocks(f, k, n, 0x3800);  // 0.5
      const Tensor w = make_tensor(f.type, bytes.data(), k, n);
      Result<std::unique_ptr<WeightHandle>> h = b->prepare_weight(w, "w", WeightRole::weight_role_matmul);
      ASSERT_TRUE(h.ok());
      ASSERT_NE((*h)->prepared, nullptr) << cpu::cpu_isa_name(isa) << " " << dtype_name(f.type);
      EXPECT_EQ((*h)->prepared->bytes(),
                static_cast<size_t>(3 * cpu::packed_group_bytes(k, f.bits, f.scales)))
          << cpu::cpu_isa_name(isa) << " " << dtype_name(f.type);
    }
  }
}

// get_rows on a tied table reads its rows from the packed copy: each row the reference dequantizer's bits,
// for every packed form, under scales that are not powers of two (their products then round).
TEST(CpuIsa, PackedRowsAreTheReferenceBits) {
  const int64_t k = 512, n = 37;
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = (i * 7) % static_cast<int32_t>(n);
  for (auto& [isa, b] : packing_backends()) {
    for (const PackedForm& f : packed_forms()) {
      for (const uint16_t scale : {uint16_t{0x2d3b}, uint16_t{0xa1f7}}) {  // 0.0817..., -0.0117...
        std::vector<uint8_t> bytes = random_blocks(f, k, n, scale);
        const Tensor w = make_tensor(f.type, bytes.data(), k, n);
        Result<std::unique_ptr<WeightHandle>> h =
            b->prepare_weight(w, "w", WeightRole::weight_role_tied_embedding);
        ASSERT_TRUE(h.ok());
        ASSERT_NE((*h)->prepared, nullptr) << cpu::cpu_isa_name(isa) << " " << dtype_name(f.type);
        std::vector<float> got(static_cast<size_t>(k * n)), want(static_cast<size_t>(k * n));
        const ops::GetRows op{(*h)->weight, make_tensor(DType::i32, ids.data(), n),
                              make_tensor(DType::f32, got.data(), k, n)};
        ASSERT_TRUE(b->run(op).ok());
        for (int64_t i = 0; i < n; ++i) ops::ref::row_to_f32(w, w.row(ids[i]), want.data() + i * k);
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
            << cpu::cpu_isa_name(isa) << " " << dtype_name(f.type) << " scale " << scale;
      }
    }
  }
}

// The packer tells the loader of the rows it has read, a few MiB at a time while it packs (so that a large
// table's file pages can go before its copy is whole): every byte of the tensor once, in runs inside it.
TEST(CpuIsa, PackingReportsTheRowsItHasRead) {
  BackendOptions options;
  options.n_threads = 2;
  Result<std::unique_ptr<Backend>> b = make_backend("cpu", options);
  ASSERT_TRUE(b.ok());
  if (!cpu::cpu_isa_supported(CpuIsa::cpu_isa_avx2)) GTEST_SKIP() << "no packed kernels on this CPU";
  for (DType type : {DType::q8_0, DType::f16}) {
    const int64_t k = 512, n = 16 * 2000 + 5;  // ~17 MB of q8_0, ~21 MB of f16: several runs a thread
    const int64_t row = dtype_row_bytes(type, k).value();
    std::vector<uint8_t> bytes(static_cast<size_t>(row * n), 0);
    for (int64_t i = 0; i < n * k / dtype_info(type).block_size; ++i) {
      bytes[i * dtype_info(type).type_size + 1] = 0x30;  // f16 scales (q8_0) and values (f16) of 0.125
    }
    const Tensor w = make_tensor(type, bytes.data(), k, n);
    std::mutex mu;
    std::vector<std::pair<const uint8_t*, size_t>> runs;
    const Backend::ReadDone read_done = [&](const void* p, size_t len) {
      std::lock_guard<std::mutex> lock(mu);
      runs.emplace_back(static_cast<const uint8_t*>(p), len);
    };
    Result<std::unique_ptr<WeightHandle>> h =
        (*b)->prepare_weight_reporting(w, "w", WeightRole::weight_role_matmul, read_done);
    ASSERT_TRUE(h.ok());
    ASSERT_NE((*h)->prepared, nullptr) << dtype_name(type);
    std::sort(runs.begin(), runs.end());
    EXPECT_GT(runs.size(), 2u) << dtype_name(type);
    const uint8_t* at = bytes.data();
    for (const auto& [p, len] : runs) {
      EXPECT_EQ(p, at) << dtype_name(type);  // no gap, no overlap
      at = p + len;
    }
    EXPECT_EQ(at, bytes.data() + bytes.size()) << dtype_name(type);
    // Rows that are not contiguous (a strided view) are not reported.
    runs.clear();
    const Tensor strided = make_tensor(type, bytes.data(), k / 2, n / 2);
    Tensor view = strided;
    view.nb[1] = 2 * row;
    ASSERT_TRUE((*b)->prepare_weight_reporting(view, "v", WeightRole::weight_role_matmul, read_done).ok());
    EXPECT_TRUE(runs.empty()) << dtype_name(type);
  }
}

// The vectors a step reads (norms, biases, rope factors) are copied at load, the same bytes (the loader then
// hands their file pages back: a step reads no page of the file).
TEST(CpuIsa, VectorWeightsAreCopied) {
  std::vector<float> v(37);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.25f * static_cast<float>(i) - 3.0f;
  const Tensor logical = make_tensor(DType::f32, v.data(), 37);
  for (CpuIsa isa : cpu::kCpuIsaLevels) {
    if (!cpu::cpu_isa_supported(isa)) continue;
    BackendOptions options;
    options.cpu_isa = std::string(cpu::cpu_isa_name(isa));
    Result<std::unique_ptr<Backend>> b = make_backend("cpu", options);
    ASSERT_TRUE(b.ok());
    for (WeightRole role :
         {WeightRole::weight_role_norm, WeightRole::weight_role_bias, WeightRole::weight_role_rope_factors}) {
      Result<std::unique_ptr<WeightHandle>> h = (*b)->prepare_weight(logical, "v", role);
      ASSERT_TRUE(h.ok());
      const Tensor& t = (*h)->weight.tensor;
      ASSERT_NE((*h)->storage, nullptr) << weight_role_name(role);
      EXPECT_NE(t.data, logical.data) << weight_role_name(role);
      EXPECT_EQ(t.type, DType::f32);
      EXPECT_EQ(t.ne, logical.ne);
      EXPECT_EQ(std::memcmp(t.data, v.data(), v.size() * sizeof(float)), 0) << weight_role_name(role);
    }
  }
}

TEST(CpuIsa, ALevelBeyondThisCpuIsRefused) {
  for (CpuIsa isa : cpu::kCpuIsaLevels) {
    if (cpu::cpu_isa_supported(isa)) continue;
    BackendOptions options;
    options.cpu_isa = std::string(cpu::cpu_isa_name(isa));
    Result<std::unique_ptr<Backend>> b = make_backend("cpu", options);
    ASSERT_FALSE(b.ok());
    EXPECT_NE(b.status().message().find("cannot run"), std::string::npos) << b.status().message();
  }
}

}  // namespace
}  // namespace kiln
