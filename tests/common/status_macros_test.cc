#include "common/status_macros.h"

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace echokv {
namespace {

using ::echokv::testing::IsOk;
using ::echokv::testing::StatusIs;

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("x must be even");
  return x / 2;
}

absl::StatusOr<int> Quarter(int x) {
  ECHOKV_ASSIGN_OR_RETURN(int h, Half(x));
  ECHOKV_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

absl::Status CheckEven(int x) {
  ECHOKV_RETURN_IF_ERROR(Half(x).status());
  return absl::OkStatus();
}

TEST(StatusMacros, AssignOrReturnPropagatesValueAndError) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_THAT(Quarter(6), StatusIs(absl::StatusCode::kInvalidArgument, "x must be even"));
}

TEST(StatusMacros, ReturnIfErrorStopsAtFirstError) {
  EXPECT_THAT(CheckEven(4), IsOk());
  EXPECT_THAT(CheckEven(3), StatusIs(absl::StatusCode::kInvalidArgument, "even"));
}

}  // namespace
}  // namespace echokv
