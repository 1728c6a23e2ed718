// GoogleTest matchers for absl::Status / absl::StatusOr.
//
//   EXPECT_THAT(LoadModelConfig(dir), IsOk());
//   EXPECT_THAT(cfg.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "budget"));
//   ASSERT_OK_AND_ASSIGN(auto model, Transformer::Load(dir, opts));
#ifndef ECHOKV_TESTS_TESTING_STATUS_MATCHERS_H_
#define ECHOKV_TESTS_TESTING_STATUS_MATCHERS_H_

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace echokv::testing {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

MATCHER(IsOk, "is OK") {
  const absl::Status& s = ::echokv::testing::GetStatus(arg);
  if (!s.ok()) *result_listener << "status: " << s.ToString();
  return s.ok();
}

// Matches a non-OK status with `code` whose message contains `substr`.
MATCHER_P2(StatusIs, code, substr,
           std::string("has code ") + absl::StatusCodeToString(code) + " and a message containing \"" +
               std::string(substr) + "\"") {
  const absl::Status& s = ::echokv::testing::GetStatus(arg);
  *result_listener << "status: " << s.ToString();
  return s.code() == code && std::string(s.message()).find(substr) != std::string::npos;
}

}  // namespace echokv::testing

#define ECHOKV_TESTING_CONCAT_INNER_(a, b) a##b
#define ECHOKV_TESTING_CONCAT_(a, b) ECHOKV_TESTING_CONCAT_INNER_(a, b)

#define ASSERT_OK(expr) ASSERT_THAT((expr), ::echokv::testing::IsOk())
#define EXPECT_OK(expr) EXPECT_THAT((expr), ::echokv::testing::IsOk())

// Asserts `rexpr` (a StatusOr) is OK and moves its value into `lhs`.
#define ASSERT_OK_AND_ASSIGN(lhs, rexpr) \
  ASSERT_OK_AND_ASSIGN_IMPL_(ECHOKV_TESTING_CONCAT_(echokv_test_statusor_, __LINE__), lhs, rexpr)
#define ASSERT_OK_AND_ASSIGN_IMPL_(statusor, lhs, rexpr)                   \
  auto statusor = (rexpr);                                                 \
  ASSERT_TRUE(statusor.ok()) << "status: " << statusor.status().ToString(); \
  lhs = std::move(statusor).value()

#endif  // ECHOKV_TESTS_TESTING_STATUS_MATCHERS_H_
