// Tests of kernels/weighted_sum.h: each build against a reference written here with
// plain loops (every product stored to a volatile, so it is rounded before the sum
// whatever the compiler flags), bit for bit, and against a float64 sum.
#include "kernels/weighted_sum.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu_isa.h"
#include "gtest/gtest.h"

namespace echokv::kernels {
namespace {

std::vector<float> Random(int64_t n, uint32_t seed, bool positive) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& f : v) f = positive ? std::fabs(dist(rng)) / static_cast<float>(n) : dist(rng);
  return v;
}

// The order weighted_sum.h specifies: chains by row index mod `chains` while `chains`
// rows remain, the rest to chain 0, then ((c0 + c1) + c2) + c3.
std::vector<float> Reference(const std::vector<float>& p, const std::vector<float>& values, int64_t n, int64_t d) {
  const int64_t chains = d >= 32 ? 1 : 4;
  std::vector<std::vector<float>> acc(chains, std::vector<float>(d, 0.0f));
  const int64_t whole = n / chains * chains;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t c = j < whole ? j % chains : 0;
    for (int64_t i = 0; i < d; ++i) {
      volatile float product = p[j] * values[j * d + i];
      acc[c][i] = acc[c][i] + product;
    }
  }
  for (int64_t c = 1; c < chains; ++c) {
    for (int64_t i = 0; i < d; ++i) acc[0][i] = acc[0][i] + acc[c][i];
  }
  return acc[0];
}

std::vector<std::string> Builds() {
  std::vector<std::string> builds = {"portable"};
  if (CpuRunsIsa("avx512")) builds.push_back("avx512");
  return builds;
}

class WeightedSumTest : public ::testing::TestWithParam<std::string> {};

TEST_P(WeightedSumTest, MatchesTheSpecifiedOrderBitForBit) {
  for (const int64_t d : {int64_t{8}, int64_t{128}}) {
    for (int64_t n = 0; n <= 70; ++n) {
      for (const int64_t extra : {int64_t{0}, int64_t{1000}}) {
        const int64_t rows = n + extra;  // also 1000+ rows: long caches
        const std::vector<float> p = Random(rows, static_cast<uint32_t>(7 * rows + d), true);
        const std::vector<float> values = Random(rows * d, static_cast<uint32_t>(11 * rows + d), false);
        std::vector<float> out(d, -1.0f);
        ASSERT_TRUE(WeightedSumRowsChainsWith(GetParam().c_str(), p.data(), values.data(), rows, d, out.data()));
        const std::vector<float> want = Reference(p, values, rows, d);
        ASSERT_EQ(0, std::memcmp(out.data(), want.data(), sizeof(float) * d)) << "d " << d << " rows " << rows;
        // And close to the exact sum (catches a reference and build wrong alike).
        for (int64_t i = 0; i < d; ++i) {
          double exact = 0, magnitude = 0;
          for (int64_t j = 0; j < rows; ++j) {
            exact += static_cast<double>(p[j]) * values[j * d + i];
            magnitude += std::fabs(static_cast<double>(p[j]) * values[j * d + i]);
          }
          ASSERT_NEAR(out[i], exact, 1e-6 * magnitude + 1e-30) << "d " << d << " rows " << rows << " i " << i;
        }
      }
    }
  }
}

TEST_P(WeightedSumTest, ReadsNothingPastTheRows) {
  // NaN rows right after row n, in the same allocation: a build that let anything past
  // row n into the sum (e.g. a whole 16-float load for a last, single d = 8 row) gives
  // NaN. (A load past the end whose lanes are then ignored is not observable here.)
  for (const int64_t n : {int64_t{1}, int64_t{5}, int64_t{17}, int64_t{19}}) {
    std::vector<float> p = Random(n + 16, 3, true), values = Random((n + 16) * 8, 4, false);
    for (int64_t j = n; j < n + 16; ++j) {
      p[j] = std::nanf("");
      for (int64_t i = 0; i < 8; ++i) values[j * 8 + i] = std::nanf("");
    }
    std::vector<float> out(8);
    ASSERT_TRUE(WeightedSumRowsChainsWith(GetParam().c_str(), p.data(), values.data(), n, 8, out.data()));
    for (float f : out) EXPECT_FALSE(std::isnan(f)) << "rows " << n;
  }
}

INSTANTIATE_TEST_SUITE_P(EveryBuild, WeightedSumTest, ::testing::ValuesIn(Builds()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(WeightedSumBuilds, RejectsWhatItDoesNotHandle) {
  float p = 1, v[64] = {}, out[64];
  EXPECT_FALSE(WeightedSumRowsChainsWith("portable", &p, v, 1, 64, out));
  EXPECT_FALSE(WeightedSumRowsChainsWith("sse9", &p, v, 1, 8, out));
  EXPECT_TRUE(WeightedSumRowsChainsHandles(8));
  EXPECT_TRUE(WeightedSumRowsChainsHandles(128));
  EXPECT_FALSE(WeightedSumRowsChainsHandles(64));
}

}  // namespace
}  // namespace echokv::kernels
