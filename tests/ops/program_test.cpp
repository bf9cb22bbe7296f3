// Program::version(): what a backend that keeps what it made of a program (a captured CUDA graph) relies on
// to know the same program run again without comparing its ops.
#include "ops/program.h"

#include <gtest/gtest.h>

#include <vector>

namespace kiln {
namespace {

TEST(Program, VersionChangesWithItsOpsAndNoOtherProgramHasIt) {
  std::vector<float> x(8, 1.0f), y(8);
  const ops::Scale op{make_tensor(DType::f32, x.data(), 8), 2.0f, make_tensor(DType::f32, y.data(), 8)};
  Program a, b;
  EXPECT_NE(a.version(), b.version());
  const uint64_t empty = a.version();
  ASSERT_TRUE(a.add(op).ok());
  const uint64_t one = a.version();
  EXPECT_NE(one, empty);
  Program copy = a;  // a copy has the same ops, so the same version, until either changes
  EXPECT_EQ(copy.version(), one);
  ASSERT_TRUE(copy.add(op).ok());
  EXPECT_NE(copy.version(), one);
  EXPECT_EQ(a.version(), one);
  // The same ops recorded again are another version: a backend compares them (or knows nothing of them).
  a.clear();
  EXPECT_NE(a.version(), one);
  ASSERT_TRUE(a.add(op).ok());
  EXPECT_NE(a.version(), one);
  EXPECT_NE(a.version(), copy.version());
  // An op refused by check() changes nothing.
  const uint64_t before = a.version();
  EXPECT_FALSE(a.add(ops::Scale{make_tensor(DType::f32, x.data(), 8), 2.0f, Tensor{}}).ok());
  EXPECT_EQ(a.version(), before);
  EXPECT_EQ(a.size(), 1u);
}

}  // namespace
}  // namespace kiln
