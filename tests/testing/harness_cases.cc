// Cases for tests/testing/harness_test.sh, which runs this binary under ctest with the
// properties every echokv test gets and checks the verdicts. Not a test by itself.
#include "gtest/gtest.h"

TEST(Harness, Passes) { EXPECT_EQ(2 + 2, 4); }

TEST(Harness, Skips) { GTEST_SKIP() << "harness: deliberately skipped for a stated reason"; }

TEST(Harness, Fails) { EXPECT_EQ(2 + 2, 5) << "harness: deliberately failing case"; }
