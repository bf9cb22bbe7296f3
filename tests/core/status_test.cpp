// Status / Result: the error-propagation macros.
#include "core/status.h"

#include <gtest/gtest.h>

#include <string>

namespace kiln {
namespace {

Result<std::string> failing(int n) { return invalid_argument("bad value {}: {}", n, std::string(64, 'x')); }

Status try_status_of_temporary() {
  KILN_TRY(failing(7).status());  // the Result is a temporary: its Status must outlive it
  return Status();
}

Result<int> assign(bool ok) {
  KILN_ASSIGN_OR_RETURN(const std::string s, ok ? Result<std::string>(std::string("abc")) : failing(3));
  return static_cast<int>(s.size());
}

TEST(Status, TryOnATemporaryResultKeepsTheMessage) {
  const Status s = try_status_of_temporary();
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_EQ(s.message(), "bad value 7: " + std::string(64, 'x'));
}

TEST(Status, AssignOrReturn) {
  EXPECT_EQ(assign(true).value(), 3);
  EXPECT_EQ(assign(false).status().message(), "bad value 3: " + std::string(64, 'x'));
}

}  // namespace
}  // namespace kiln
