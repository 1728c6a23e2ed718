// Access to the real test data folder ($ECHOKV_TEST_DATA, set by .ci/run to ../shared)
// and to scratch directories.
//
//   TEST(Golden, Stories) {
//     ECHOKV_REQUIRE_TEST_DATA(dir);                 // GTEST_SKIP()s when unset
//     std::string model = dir + "/models/stories260K";
//   }
#ifndef ECHOKV_TESTS_TESTING_TEST_DATA_H_
#define ECHOKV_TESTS_TESTING_TEST_DATA_H_

#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace echokv::testing {

// $ECHOKV_TEST_DATA, or nullopt when unset/empty.
std::optional<std::string> TestDataDir();

// A fresh empty directory under $TMPDIR (or /tmp), removed by the caller if wanted.
std::string MakeTempDir(const std::string& prefix);

// Reads a whole file; aborts the test binary on failure (test setup only).
std::string ReadFileOrDie(const std::string& path);
void WriteFileOrDie(const std::string& path, const std::string& contents);

// Every file in `dir` whose name starts with `prefix` and ends with `suffix`, sorted.
// Used to run every golden_*.json a data folder holds (public and any fuller set).
std::vector<std::string> ListFiles(const std::string& dir, const std::string& prefix,
                                   const std::string& suffix);

}  // namespace echokv::testing

// Declares `std::string var` = $ECHOKV_TEST_DATA or skips the test with a clear message.
#define ECHOKV_REQUIRE_TEST_DATA(var)                                                   \
  auto var##_opt_ = ::echokv::testing::TestDataDir();                                   \
  if (!var##_opt_) {                                                                    \
    GTEST_SKIP() << "ECHOKV_TEST_DATA is not set: this test needs the real test data " \
                    "folder (../shared beside the checkout; .ci/run sets it)";         \
  }                                                                                     \
  const std::string var = *var##_opt_

#endif  // ECHOKV_TESTS_TESTING_TEST_DATA_H_
