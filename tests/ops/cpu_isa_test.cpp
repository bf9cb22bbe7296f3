// The CPU backend's ISA level: names, the KILN_CPU_ISA override and its errors.
#include "backends/cpu/cpu_isa.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "backends/backend.h"

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
