#include "bench/eval/metrics.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace echokv::eval {
namespace {

using ::echokv::testing::IsOk;
using ::echokv::testing::StatusIs;

TEST(KlFromLogits, IdenticalDistributionsGiveZero) {
  const std::vector<float> p = {0.3f, -1.2f, 2.5f, 0.0f, 7.0f};
  ASSERT_OK_AND_ASSIGN(double kl, KlFromLogits(p, p));
  EXPECT_EQ(kl, 0.0);
  // Softmax is shift-invariant: logits + 3 are the same distribution.
  std::vector<float> shifted = p;
  for (float& v : shifted) v += 3.0f;
  ASSERT_OK_AND_ASSIGN(double kl2, KlFromLogits(p, shifted));
  EXPECT_NEAR(kl2, 0.0, 1e-7);
}

TEST(KlFromLogits, HandComputedValue) {
  // p = (1/2, 1/2), q = (1/4, 3/4): KL = 1/2 ln 2 + 1/2 ln(2/3).
  const std::vector<float> p = {0.0f, 0.0f};
  const std::vector<float> q = {static_cast<float>(std::log(0.25)), static_cast<float>(std::log(0.75))};
  ASSERT_OK_AND_ASSIGN(double kl, KlFromLogits(p, q));
  EXPECT_NEAR(kl, 0.5 * std::log(2.0) + 0.5 * std::log(2.0 / 3.0), 1e-6);
  // KL is not symmetric: KL(q || p) = 1/4 ln(1/2) + 3/4 ln(3/2).
  ASSERT_OK_AND_ASSIGN(double rev, KlFromLogits(q, p));
  EXPECT_NEAR(rev, 0.25 * std::log(0.5) + 0.75 * std::log(1.5), 1e-6);
}

TEST(KlFromLogits, RejectsBadInput) {
  EXPECT_THAT(KlFromLogits(std::vector<float>{1, 2}, std::vector<float>{1}),
              StatusIs(absl::StatusCode::kInvalidArgument, "sizes"));
  EXPECT_THAT(KlFromLogits(std::vector<float>{}, std::vector<float>{}),
              StatusIs(absl::StatusCode::kInvalidArgument, "logits"));
  EXPECT_THAT(KlFromLogits(std::vector<float>{1, NAN}, std::vector<float>{1, 2}),
              StatusIs(absl::StatusCode::kInvalidArgument, "index 1"));
}

TEST(MatchLength, CountsLeadingAgreementUpToCap) {
  EXPECT_EQ(MatchLength({1, 2, 3, 4}, {1, 2, 5, 4}, 10), 2);
  EXPECT_EQ(MatchLength({1, 2, 3, 4}, {1, 2, 3, 4}, 10), 4);
  EXPECT_EQ(MatchLength({1, 2, 3, 4}, {1, 2, 3, 4}, 3), 3);
  EXPECT_EQ(MatchLength({7, 2}, {1, 2}, 10), 0);
  EXPECT_EQ(MatchLength({1, 2, 3}, {1, 2}, 10), 2);
}

TEST(ExactMatch, PrefixOfOutput) {
  EXPECT_TRUE(ExactMatch({5, 6, 7}, {5, 6}));
  EXPECT_TRUE(ExactMatch({5, 6}, {5, 6}));
  EXPECT_FALSE(ExactMatch({5, 7}, {5, 6}));
  EXPECT_FALSE(ExactMatch({5}, {5, 6}));
  EXPECT_FALSE(ExactMatch({5}, {}));
}

TEST(SetOverlap, IdenticalAndHandCases) {
  const std::vector<int64_t> a = {1, 3, 5, 7};
  EXPECT_DOUBLE_EQ(SetOverlap(a, a), 1.0);
  EXPECT_DOUBLE_EQ(SetOverlap(a, {3, 4, 5, 6}), 0.5);
  EXPECT_DOUBLE_EQ(SetOverlap({0, 2}, {1, 3, 5}), 0.0);
  EXPECT_DOUBLE_EQ(SetOverlap({}, {}), 1.0);
  // The denominator is |b|: a superset of b overlaps fully.
  EXPECT_DOUBLE_EQ(SetOverlap({0, 1, 2, 3, 4, 5}, {2, 4}), 1.0);
  EXPECT_DOUBLE_EQ(SetOverlap({2, 4}, {0, 1, 2, 3}), 0.25);
}

TEST(EvidenceRetention, CraftedCase) {
  // Evidence = {2, 3} ∪ {10} (end exclusive). Two layers, two groups each.
  const std::vector<Span64> spans = {{2, 4}, {10, 11}};
  const std::vector<std::vector<std::vector<int64_t>>> kept = {
      {{2, 3, 10}, {0, 1}},   // 1, 0
      {{3, 10, 20}, {2}},     // 2/3, 1/3
  };
  ASSERT_OK_AND_ASSIGN(double r, EvidenceRetention(kept, spans));
  EXPECT_NEAR(r, 0.5, 1e-12);
  // Overlapping spans count each token once: evidence {2, 3, 4}.
  ASSERT_OK_AND_ASSIGN(double r2, EvidenceRetention({{{2, 3, 4}}, {{4}}}, std::vector<Span64>{{2, 4}, {3, 5}}));
  EXPECT_NEAR(r2, (1.0 + 1.0 / 3.0) / 2.0, 1e-12);
}

TEST(EvidenceRetention, RejectsEmptyInput) {
  EXPECT_THAT(EvidenceRetention({{{1}}}, std::vector<Span64>{}), StatusIs(absl::StatusCode::kInvalidArgument, "evidence"));
  EXPECT_THAT(EvidenceRetention({{{1}}}, std::vector<Span64>{{3, 3}}), StatusIs(absl::StatusCode::kInvalidArgument, "[3, 3)"));
  EXPECT_THAT(EvidenceRetention({}, std::vector<Span64>{{0, 1}}), StatusIs(absl::StatusCode::kInvalidArgument, "kept"));
}

TEST(Bootstrap, ConstantValuesGiveAPointInterval) {
  const std::vector<double> v(10, 0.25);
  MeanInterval m = BootstrapMeanInterval(v, {});
  EXPECT_EQ(m.count, 10);
  EXPECT_DOUBLE_EQ(m.mean, 0.25);
  EXPECT_DOUBLE_EQ(m.lo, 0.25);
  EXPECT_DOUBLE_EQ(m.hi, 0.25);
}

TEST(Bootstrap, SeededBracketingAndNarrowingWithMoreData) {
  std::vector<double> v;
  for (int i = 0; i < 20; ++i) v.push_back(i % 2);  // mean 0.5, sd 0.5
  BootstrapOptions o;
  o.seed = 7;
  const MeanInterval a = BootstrapMeanInterval(v, o);
  const MeanInterval b = BootstrapMeanInterval(v, o);
  EXPECT_DOUBLE_EQ(a.mean, 0.5);
  EXPECT_EQ(a.lo, b.lo);  // same seed, same interval
  EXPECT_EQ(a.hi, b.hi);
  EXPECT_LT(a.lo, 0.5);
  EXPECT_GT(a.hi, 0.5);
  // Normal approximation: half-width ≈ 1.96 · 0.5 / sqrt(20) ≈ 0.22.
  EXPECT_NEAR(a.hi - a.lo, 2 * 0.22, 0.12);
  std::vector<double> big;
  for (int i = 0; i < 2000; ++i) big.push_back(i % 2);
  const MeanInterval c = BootstrapMeanInterval(big, o);
  EXPECT_LT(c.hi - c.lo, (a.hi - a.lo) / 4);
  EXPECT_EQ(BootstrapMeanInterval(std::vector<double>{}, o).count, 0);
}

}  // namespace
}  // namespace echokv::eval
