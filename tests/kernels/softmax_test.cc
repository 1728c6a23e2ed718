// kernels/softmax.h's row primitives against the scalar loops they replace: MaxOf against
// `mx = std::max(mx, x[j])` from -inf (the same value; NaNs never taken, as there), and
// ScaleInPlace against `x[j] *= s` (the same bits), at every length 0-70 (the 16-lane
// body, the tail and both) and 1000-1040, on random values with -inf entries mixed in.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/softmax.h"

namespace echokv::kernels {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

float SequentialMax(const std::vector<float>& x) {
  float mx = kNegInf;
  for (float v : x) mx = std::max(mx, v);
  return mx;
}

std::vector<int64_t> Lengths() {
  std::vector<int64_t> n;
  for (int64_t i = 0; i <= 70; ++i) n.push_back(i);
  for (int64_t i = 1000; i <= 1040; ++i) n.push_back(i);
  return n;
}

std::vector<float> RandomRow(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::uniform_int_distribution<int> masked(0, 5);
  std::vector<float> x(n);
  for (float& v : x) v = masked(rng) == 0 ? kNegInf : normal(rng);
  return x;
}

TEST(MaxOfTest, EqualsTheSequentialLoopAtEveryLength) {
  std::mt19937 rng(11);
  for (int64_t n : Lengths()) {
    for (int rep = 0; rep < 4; ++rep) {
      std::vector<float> x = RandomRow(n, rng);
      // The largest value anywhere: the first lane, the last of the body, the tail.
      if (n > 0 && rep > 0) x[(rep * n) / 4 % n] = 100.0f + rep;
      EXPECT_EQ(MaxOf(x.data(), n), SequentialMax(x)) << "n=" << n << " rep " << rep;
    }
  }
}

TEST(MaxOfTest, AllMaskedEmptyAndNaN) {
  EXPECT_EQ(MaxOf(nullptr, 0), kNegInf);
  for (int64_t n : {1, 15, 16, 17, 40}) {
    std::vector<float> masked(n, kNegInf);
    EXPECT_EQ(MaxOf(masked.data(), n), kNegInf) << n;
    // A NaN is never taken, wherever it is (as std::max(mx, NaN) keeps mx).
    for (int64_t at = 0; at < n; ++at) {
      std::vector<float> x(n, -1.0f);
      x[n - 1] = 2.0f;
      x[at] = std::numeric_limits<float>::quiet_NaN();
      const float want = SequentialMax(x);
      const float got = MaxOf(x.data(), n);
      EXPECT_FALSE(std::isnan(got)) << "n=" << n << " NaN at " << at;
      EXPECT_EQ(got, want) << "n=" << n << " NaN at " << at;
    }
  }
}

TEST(ScaleInPlaceTest, SameBitsAsTheScalarLoop) {
  std::mt19937 rng(12);
  for (int64_t n : Lengths()) {
    std::vector<float> x = RandomRow(n, rng);
    for (float& v : x) v = std::exp(std::max(v, -80.0f) / 8.0f);  // softmax-like, positive
    const float s = 1.0f / 3.7f;
    std::vector<float> want = x;
    for (float& v : want) {
      volatile float product = v * s;  // one rounding, as the kernel's
      v = product;
    }
    ScaleInPlace(x.data(), n, s);
    // (data() of an empty vector may be null, which memcmp must not be given.)
    ASSERT_TRUE(n == 0 || std::memcmp(x.data(), want.data(), n * sizeof(float)) == 0) << "n=" << n;
  }
}

}  // namespace
}  // namespace echokv::kernels
