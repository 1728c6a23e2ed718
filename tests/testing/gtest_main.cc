// The main() of every echokv GoogleTest binary.
//
// ctest learns a binary's verdict from its exit code alone (echokv_cc_test sets
// SKIP_RETURN_CODE 77 and no output regular expression):
//   0   every case that ran passed and none was skipped;
//   1   at least one case failed (whatever else was skipped);
//   77  nothing failed and at least one case was skipped: each skipped case is listed
//       with the reason its GTEST_SKIP() gave, so "skipped" always says why.
// gtest's own main would exit 0 with skipped cases, and a regular expression on
// "[  SKIPPED ]" would outrank a failure; neither may decide a verdict here.
#include <cstdio>
#include <string>

#include "gtest/gtest.h"

namespace {

constexpr int kSkipExitCode = 77;

void PrintSkipped(const ::testing::UnitTest& unit) {
  std::fprintf(stderr, "echokv-test: %d case(s) skipped:\n", unit.skipped_test_count());
  for (int i = 0; i < unit.total_test_suite_count(); ++i) {
    const ::testing::TestSuite* suite = unit.GetTestSuite(i);
    for (int j = 0; j < suite->total_test_count(); ++j) {
      const ::testing::TestInfo* info = suite->GetTestInfo(j);
      const ::testing::TestResult* result = info->result();
      if (!info->should_run() || !result->Skipped()) continue;
      std::string reason;
      for (int k = 0; k < result->total_part_count(); ++k) {
        const ::testing::TestPartResult& part = result->GetTestPartResult(k);
        if (part.skipped() && part.message() != nullptr) reason = part.message();
      }
      std::fprintf(stderr, "  %s.%s: %s\n", suite->name(), info->name(),
                   reason.empty() ? "(no reason given)" : reason.c_str());
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  if (rc != 0 || unit.failed_test_count() > 0 || !unit.Passed()) return 1;
  if (unit.skipped_test_count() > 0) {
    PrintSkipped(unit);
    return kSkipExitCode;
  }
  return 0;
}
