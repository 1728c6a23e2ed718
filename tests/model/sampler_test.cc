#include "model/sampler.h"

#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace echokv::model {
namespace {

using ::echokv::testing::IsOk;
using ::echokv::testing::StatusIs;

// A fixed pseudo-random logit vector (independent of the sampler's generator).
std::vector<float> MakeLogits(int n, unsigned salt) {
  std::vector<float> logits(n);
  unsigned x = 12345u + salt;
  for (int i = 0; i < n; ++i) {
    x = x * 1103515245u + 12345u;
    logits[i] = static_cast<float>((x >> 8) % 1000) / 250.0f - 2.0f;
  }
  return logits;
}

std::vector<int> Draw(const SamplingParams& params, const std::vector<float>& logits, int n) {
  Sampler sampler(params);
  std::vector<int> out;
  for (int i = 0; i < n; ++i) out.push_back(sampler.Sample(logits));
  return out;
}

TEST(ArgmaxTest, TiesGoToLowestId) {
  EXPECT_EQ(Argmax(std::vector<float>{1.0f, 3.0f, 3.0f, 2.0f}), 1);
  EXPECT_EQ(Argmax(std::vector<float>{5.0f, 5.0f}), 0);
  EXPECT_EQ(Argmax(std::vector<float>{-1.0f, -0.5f, -0.5f}), 1);
  EXPECT_EQ(Argmax(std::vector<float>{-INFINITY, std::nanf(""), 0.25f}), 2);
}

TEST(SamplerTest, TemperatureZeroIsGreedyWithTies) {
  SamplingParams p;  // temperature 0
  Sampler sampler(p);
  std::vector<float> logits = {0.5f, 2.0f, 1.0f, 2.0f};
  for (int i = 0; i < 10; ++i) EXPECT_EQ(sampler.Sample(logits), 1);
}

TEST(SamplerTest, SameSeedSameSequence) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 7;
  std::vector<float> logits = MakeLogits(50, 1);
  std::vector<int> a = Draw(p, logits, 200);
  std::vector<int> b = Draw(p, logits, 200);
  EXPECT_EQ(a, b);
  p.top_k = 10;
  p.top_p = 0.8f;
  EXPECT_EQ(Draw(p, logits, 200), Draw(p, logits, 200));
}

TEST(SamplerTest, DifferentSeedsDiffer) {
  SamplingParams p;
  p.temperature = 1.0f;
  std::vector<float> logits = MakeLogits(50, 2);
  p.seed = 1;
  std::vector<int> a = Draw(p, logits, 200);
  p.seed = 2;
  std::vector<int> b = Draw(p, logits, 200);
  EXPECT_NE(a, b);
}

TEST(SamplerTest, TopKOneIsGreedy) {
  SamplingParams p;
  p.temperature = 5.0f;  // flat distribution: any leak past the cut would show
  p.top_k = 1;
  p.seed = 3;
  for (unsigned salt = 0; salt < 5; ++salt) {
    std::vector<float> logits = MakeLogits(100, salt);
    for (int id : Draw(p, logits, 50)) EXPECT_EQ(id, Argmax(logits));
  }
  // Tie at the top: top_k = 1 keeps the lower id.
  std::vector<float> tied = {0.0f, 4.0f, 1.0f, 4.0f};
  for (int id : Draw(p, tied, 50)) EXPECT_EQ(id, 1);
}

TEST(SamplerTest, TinyTopPIsGreedy) {
  SamplingParams p;
  p.temperature = 5.0f;
  p.top_p = 1e-6f;
  p.seed = 4;
  for (unsigned salt = 0; salt < 5; ++salt) {
    std::vector<float> logits = MakeLogits(100, salt);
    for (int id : Draw(p, logits, 50)) EXPECT_EQ(id, Argmax(logits));
  }
}

TEST(SamplerTest, TopKRestrictsToTheKBest) {
  SamplingParams p;
  p.temperature = 10.0f;
  p.top_k = 3;
  p.seed = 5;
  std::vector<float> logits = {0.0f, 3.0f, 1.0f, 2.5f, 2.0f, -1.0f};
  std::map<int, int> seen;
  for (int id : Draw(p, logits, 3000)) ++seen[id];
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_GT(seen[1], 0);
  EXPECT_GT(seen[3], 0);
  EXPECT_GT(seen[4], 0);
}

TEST(SamplerTest, TopPKeepsTheSmallestNucleus) {
  // Probabilities (T = 1) 0.5, 0.3, 0.2 at ids 2, 0, 1: top_p = 0.75 needs {2, 0}.
  std::vector<float> logits = {std::log(0.3f), std::log(0.2f), std::log(0.5f)};
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.75f;
  p.seed = 6;
  std::map<int, int> seen;
  const int n = 20000;
  for (int id : Draw(p, logits, n)) ++seen[id];
  EXPECT_EQ(seen.count(1), 0u);
  // Renormalised: 0.5/0.8 and 0.3/0.8.
  EXPECT_NEAR(seen[2] / static_cast<double>(n), 0.625, 0.02);
  EXPECT_NEAR(seen[0] / static_cast<double>(n), 0.375, 0.02);
}

TEST(SamplerTest, EmpiricalFrequenciesMatchSoftmax) {
  // Target probabilities 0.2, 0.5, 0.3 at temperature 0.5: logits = 0.5 * log(p).
  const std::vector<double> probs = {0.2, 0.5, 0.3};
  std::vector<float> logits;
  for (double q : probs) logits.push_back(static_cast<float>(0.5 * std::log(q)));
  SamplingParams p;
  p.temperature = 0.5f;
  p.seed = 42;
  const int n = 20000;
  std::vector<int> counts(3, 0);
  for (int id : Draw(p, logits, n)) {
    ASSERT_GE(id, 0);
    ASSERT_LT(id, 3);
    ++counts[id];
  }
  // Binomial std is <= 0.0036 at n = 20000; 0.015 is > 4 sigma (and the seed is fixed).
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(counts[i] / static_cast<double>(n), probs[i], 0.015) << "token " << i;
  }
}

TEST(SamplerTest, NegativeInfinityIsNeverSampled) {
  std::vector<float> logits = {-INFINITY, 0.0f, -INFINITY, 0.0f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 9;
  for (int id : Draw(p, logits, 500)) EXPECT_TRUE(id == 1 || id == 3) << id;
}

TEST(SamplingParamsTest, ValidateNamesTheBadField) {
  SamplingParams ok;
  EXPECT_THAT(ok.Validate(), IsOk());
  ok.temperature = 0.7f;
  ok.top_p = 1.0f;
  ok.top_k = 40;
  EXPECT_THAT(ok.Validate(), IsOk());

  SamplingParams p;
  p.temperature = -0.1f;
  EXPECT_THAT(p.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "temperature"));
  p.temperature = std::numeric_limits<float>::infinity();
  EXPECT_THAT(p.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "temperature"));
  p.temperature = std::nanf("");
  EXPECT_THAT(p.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "temperature"));

  SamplingParams q;
  q.top_p = 0.0f;
  EXPECT_THAT(q.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "top_p"));
  q.top_p = 1.5f;
  EXPECT_THAT(q.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "top_p"));
  q.top_p = std::nanf("");
  EXPECT_THAT(q.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "top_p"));

  SamplingParams k;
  k.top_k = -1;
  EXPECT_THAT(k.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "top_k"));
}

TEST(StopCriteriaTest, EosStopIdAndLength) {
  StopCriteria stop;
  stop.max_tokens = 3;
  stop.eos_ids = {2, 7};
  stop.stop_ids = {13};
  EXPECT_EQ(stop.Check(5, 1), StopReason::kNone);
  EXPECT_EQ(stop.Check(2, 1), StopReason::kEos);
  EXPECT_EQ(stop.Check(7, 2), StopReason::kEos);
  EXPECT_EQ(stop.Check(13, 1), StopReason::kStopId);
  EXPECT_EQ(stop.Check(5, 3), StopReason::kLength);
  EXPECT_EQ(stop.Check(5, 2), StopReason::kNone);
  // An eos at the length limit reports eos.
  EXPECT_EQ(stop.Check(2, 3), StopReason::kEos);
}

TEST(StopReasonTest, Names) {
  EXPECT_EQ(StopReasonName(StopReason::kNone), "none");
  EXPECT_EQ(StopReasonName(StopReason::kLength), "length");
  EXPECT_EQ(StopReasonName(StopReason::kEos), "eos");
  EXPECT_EQ(StopReasonName(StopReason::kStopId), "stop_id");
}

}  // namespace
}  // namespace echokv::model
