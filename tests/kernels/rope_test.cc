// Tests of kernels/rope.h against a float64 hand-written rotate_half reference whose
// angle is float32(float32(pos) * inv_freq_i), as Hugging Face computes it.
#include "kernels/rope.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace echokv::kernels {
namespace {

at::Tensor RandN(std::vector<int64_t> sizes, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randn(sizes, gen, at::TensorOptions().dtype(at::kFloat));
}

std::vector<float> ToVector(const at::Tensor& t) {
  at::Tensor c = t.to(at::kFloat).contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

// x: [rows, n, d] float32 CPU; rotates row r, token t to positions[t] in float64 with
// the float32 angles of HF: out = x * cos(a) + rotate_half(x) * sin(a),
// rotate_half(x) = [-x2, x1], a_i = a_{i + d/2} = float32(float32(pos) * inv[i]).
std::vector<double> ReferenceRope(const at::Tensor& x, const std::vector<int64_t>& positions,
                                  const std::vector<float>& inv) {
  at::Tensor c = x.contiguous();
  const int64_t rows = c.size(0), n = c.size(1), d = c.size(2), half = d / 2;
  auto acc = c.accessor<float, 3>();
  std::vector<double> out(rows * n * d);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < d; ++i) {
        const int64_t f = i % half;
        const float angle = static_cast<float>(positions[t]) * inv[f];  // float32 product
        const double rotated = i < half ? -static_cast<double>(acc[r][t][i + half])
                                        : static_cast<double>(acc[r][t][i - half]);
        out[(r * n + t) * d + i] = acc[r][t][i] * std::cos(static_cast<double>(angle)) +
                                   rotated * std::sin(static_cast<double>(angle));
      }
    }
  }
  return out;
}

TEST(RopeInvFreqTest, MatchesHuggingFaceFormula) {
  for (int d : {8, 64, 128, 80}) {
    for (double theta : {1e4, 1e6, 5e5}) {
      at::Tensor inv = RopeInvFreq(d, theta);
      ASSERT_EQ(inv.scalar_type(), at::kFloat);
      ASSERT_EQ(inv.sizes(), (at::IntArrayRef{d / 2}));
      const std::vector<float> got = ToVector(inv);
      for (int i = 0; i < d / 2; ++i) {
        // HF: 1 / theta ** (arange(0, d, 2).float() / d); the float32 exponent and pow
        // keep it within a few float32 ulps of the exact value (ln(theta) * 2^-24 ~ 1e-6).
        const double exact = 1.0 / std::pow(theta, 2.0 * i / d);
        EXPECT_NEAR(got[i], exact, 2e-6 * exact) << "d=" << d << " theta=" << theta << " i=" << i;
        // And the float32 recipe itself, to 2 ulp.
        const float f32 = 1.0f / std::pow(static_cast<float>(theta),
                                          static_cast<float>(2 * i) / static_cast<float>(d));
        EXPECT_NEAR(got[i], f32, 2.5e-7 * f32) << "d=" << d << " theta=" << theta << " i=" << i;
      }
    }
  }
}

TEST(ApplyRopeTest, MatchesFloat64ReferenceUpTo8192) {
  std::mt19937 rng(5);
  uint64_t seed = 1;
  for (int d : {8, 64}) {
    for (double theta : {1e4, 1e6}) {
      std::vector<int64_t> positions = {0, 1, 2, 511, 4095, 8191, 8192};
      for (int i = 0; i < 9; ++i) positions.push_back(static_cast<int64_t>(rng() % 8193));
      const int64_t n = static_cast<int64_t>(positions.size());
      at::Tensor x = RandN({3, n, d}, seed++);
      at::Tensor inv = RopeInvFreq(d, theta);
      at::Tensor out = ApplyRope(x, positions, inv);
      ASSERT_EQ(out.sizes(), x.sizes());
      ASSERT_EQ(out.scalar_type(), at::kFloat);
      const std::vector<double> ref = ReferenceRope(x, positions, ToVector(inv));
      const std::vector<float> got = ToVector(out);
      double worst = 0.0;
      for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::abs(got[i] - ref[i]));
      // float32 cos/sin of the same float32 angle and one multiply-add: a few ulps of |x|.
      EXPECT_LE(worst, 4e-6) << "d=" << d << " theta=" << theta;
    }
  }
}

TEST(ApplyRopeTest, DetectsAnAngleErrorOfOnePosition) {
  // The tolerance above is meaningful: rotating to pos+1 instead of pos is far outside it.
  at::Tensor x = RandN({1, 1, 64}, 9);
  at::Tensor inv = RopeInvFreq(64, 1e4);
  const std::vector<double> ref = ReferenceRope(x, {8000}, ToVector(inv));
  const std::vector<float> got = ToVector(ApplyRope(x, {8001}, inv));
  double worst = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::abs(got[i] - ref[i]));
  EXPECT_GT(worst, 1e-2);
}

TEST(ApplyRopeTest, PositionZeroIsIdentityAndNormIsPreserved) {
  at::Tensor x = RandN({2, 4, 64}, 3);
  at::Tensor inv = RopeInvFreq(64, 1e4);
  EXPECT_TRUE(at::equal(ApplyRope(x, {0, 0, 0, 0}, inv), x));
  at::Tensor out = ApplyRope(x, {7, 100, 3000, 8192}, inv);
  EXPECT_TRUE(at::allclose(out.norm(2, -1), x.norm(2, -1), 1e-5, 1e-5));
}

TEST(ApplyRopeTest, LeadingDimsAndReducedPrecision) {
  at::Tensor x = RandN({2, 3, 5, 8}, 4);  // [B, H, n, d]
  at::Tensor inv = RopeInvFreq(8, 1e6);
  const std::vector<int64_t> positions = {10, 11, 12, 400, 8000};
  at::Tensor out = ApplyRope(x, positions, inv);
  for (int64_t b = 0; b < 2; ++b) {
    EXPECT_TRUE(at::equal(out[b], ApplyRope(x[b], positions, inv))) << "b=" << b;
  }
  for (at::ScalarType t : {at::kBFloat16, at::kHalf}) {
    at::Tensor xl = x.to(t);
    at::Tensor got = ApplyRope(xl, positions, inv);
    EXPECT_EQ(got.scalar_type(), t);
    // Computed in float32, cast back once.
    EXPECT_TRUE(at::equal(got, ApplyRope(xl.to(at::kFloat), positions, inv).to(t)));
  }
}

TEST(RotateToPositionsTest, EqualsApplyRopeOnRepeatedAnchor) {
  const int64_t h = 4, d = 64, t = 8, l = 8000;
  at::Tensor anchors = RandN({h, d}, 6);
  at::Tensor inv = RopeInvFreq(d, 1e6);
  std::vector<int64_t> positions;
  for (int64_t i = 0; i < t; ++i) positions.push_back(l + i);
  at::Tensor got = RotateToPositions(anchors, positions, inv);
  ASSERT_EQ(got.sizes(), (at::IntArrayRef{h, t, d}));
  at::Tensor repeated = anchors.unsqueeze(1).repeat({1, t, 1});
  EXPECT_TRUE(at::allclose(got, ApplyRope(repeated, positions, inv), 0.0, 0.0));
  // Row i is the anchor rotated to position L+i (independent reference).
  const std::vector<double> ref = ReferenceRope(repeated, positions, ToVector(inv));
  const std::vector<float> v = ToVector(got);
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(v[i], ref[i], 4e-6) << "i=" << i;
  // Rows differ from each other (each has its own position).
  EXPECT_FALSE(at::allclose(got.select(1, 0), got.select(1, 1)));
}

}  // namespace
}  // namespace echokv::kernels
