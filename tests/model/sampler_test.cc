#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
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

// ---------------------------------------------------------------------------------
// Penalties, min-p, logprobs. Expected distributions are computed here in double from
// the formulas of sampler.h, independently of the sampler's code.

constexpr double kProbTol = 1e-12;

// softmax(z / t) in double over the finite entries.
std::vector<double> Softmax(const std::vector<double>& z, double t) {
  double mx = -INFINITY;
  for (double v : z) mx = std::max(mx, v);
  std::vector<double> p(z.size());
  double sum = 0;
  for (size_t i = 0; i < z.size(); ++i) sum += (p[i] = std::exp((z[i] - mx) / t));
  for (double& v : p) v /= sum;
  return p;
}

std::vector<double> ToDouble(const std::vector<float>& l) { return std::vector<double>(l.begin(), l.end()); }

// Keeps entries with p >= min_p * max(p) and renormalizes.
std::vector<double> MinP(std::vector<double> p, double min_p) {
  const double mx = *std::max_element(p.begin(), p.end());
  double sum = 0;
  for (double& v : p) sum += (v = v >= min_p * mx ? v : 0.0);
  for (double& v : p) v /= sum;
  return p;
}

void ExpectDistribution(const std::vector<double>& got, const std::vector<double>& want, double tol = kProbTol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "token " << i;
}

// Logits that make `token` the only possible draw (it is then recorded as generated).
std::vector<float> Forcing(int v, int token) {
  std::vector<float> l(v, -INFINITY);
  l[token] = 0.0f;
  return l;
}

TEST(SamplerTest, SeededSequencesAreUnchanged) {
  // Recorded with the sampler as it was before min-p, penalties and logprobs existed:
  // the same seed keeps giving the same text.
  const std::vector<float> logits = MakeLogits(50, 11);
  const std::vector<int> want_a = {33, 49, 43, 32, 32, 29, 49, 22, 27, 13, 35, 45, 16, 13, 48, 18, 20, 17, 16, 27,
                                   47, 43, 12, 17, 16, 16, 17, 41, 12, 16, 17, 32, 42, 19, 49, 17, 4,  29, 41, 17};
  const std::vector<int> want_b = {37, 19, 11, 19, 17, 17, 27, 20, 49, 49, 49, 20, 37, 16, 19, 20, 17, 37, 37, 17,
                                   11, 19, 19, 37, 12, 17, 19, 27, 11, 11, 20, 49, 16, 19, 11, 11, 49, 11, 27, 20};
  SamplingParams a;
  a.temperature = 0.7f;
  a.seed = 123;
  SamplingParams b;
  b.temperature = 1.3f;
  b.top_k = 10;
  b.top_p = 0.85f;
  b.seed = 99;
  EXPECT_EQ(Draw(a, logits, 40), want_a);
  EXPECT_EQ(Draw(b, logits, 40), want_b);
  // Neutral new options, logprobs on and a prompt change nothing either.
  for (SamplingParams p : {a, b}) {
    p.min_p = 0.0f;
    p.repetition_penalty = 1.0f;
    p.presence_penalty = 0.0f;
    p.frequency_penalty = 0.0f;
    p.logprobs = true;
    p.top_logprobs = 5;
    const std::vector<int> prompt = {1, 2, 3, 33, 37};
    Sampler sampler(p, prompt);
    std::vector<int> got;
    for (int i = 0; i < 40; ++i) got.push_back(sampler.Next(logits).token);
    EXPECT_EQ(got, p.seed == 123 ? want_a : want_b);
    EXPECT_EQ(sampler.generated(), got);
  }
}

TEST(SamplerTest, GreedyWithoutOptionsIsTheArgmax) {
  SamplingParams p;
  const std::vector<int> prompt = {0, 1, 2, 3, 4, 5};
  for (unsigned salt = 0; salt < 20; ++salt) {
    std::vector<float> logits = MakeLogits(64, salt);
    logits[7] = logits[40] = 100.0f;  // a tie at the top: the lower id
    Sampler sampler(p, prompt);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(sampler.Next(logits).token, 7);
    std::vector<double> one_hot(64, 0.0);
    one_hot[7] = 1.0;
    EXPECT_EQ(sampler.Probabilities(logits), one_hot);
    // top-k / top-p / min-p never change the greedy choice.
    SamplingParams q = p;
    q.top_k = 3;
    q.top_p = 0.1f;
    q.min_p = 0.9f;
    EXPECT_EQ(Sampler(q).Sample(logits), 7);
  }
}

TEST(SamplerTest, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  const std::vector<float> logits = {2.0f, -1.0f, 0.5f, 0.0f, 1.0f, -0.25f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.repetition_penalty = 2.0f;
  // Repeated ids count once; ids outside the vocabulary are ignored.
  const std::vector<int> prompt = {0, 1, 1, 0, 0, 3, 99, -4};
  Sampler sampler(p, prompt);
  ExpectDistribution(sampler.Probabilities(logits), Softmax({1.0, -2.0, 0.5, 0.0, 1.0, -0.25}, 1.0));

  // A penalty below 1 favours repeats: positive logits grow, negative ones shrink.
  p.repetition_penalty = 0.5f;
  ExpectDistribution(Sampler(p, prompt).Probabilities(logits), Softmax({4.0, -0.5, 0.5, 0.0, 1.0, -0.25}, 1.0));

  // Generated tokens count too, from the step after they are drawn.
  p.repetition_penalty = 2.0f;
  Sampler gen(p, prompt);
  EXPECT_EQ(gen.Next(Forcing(6, 4)).token, 4);
  EXPECT_EQ(gen.Next(Forcing(6, 5)).token, 5);
  ExpectDistribution(gen.Probabilities(logits), Softmax({1.0, -2.0, 0.5, 0.0, 0.5, -0.5}, 1.0));

  // Greedy applies the penalty too: 2.0 / 4 = 0.5 < 1.0.
  SamplingParams g;
  g.repetition_penalty = 4.0f;
  EXPECT_EQ(Sampler(g).Sample(logits), 0);
  EXPECT_EQ(Sampler(g, prompt).Sample(logits), 4);
}

TEST(SamplerTest, PresenceAndFrequencyPenaltiesCountGeneratedTokensOnly) {
  const std::vector<float> logits = {0.3f, 1.2f, -0.4f, 0.8f, 0.0f};
  SamplingParams p;
  p.temperature = 0.7f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  const double t = p.temperature;  // the float 0.7f, as the sampler sees it
  Sampler sampler(p, /*prompt_ids=*/{0, 2, 2, 4});  // the prompt does not count
  ExpectDistribution(sampler.Probabilities(logits), Softmax(ToDouble(logits), t));
  for (int token : {1, 3, 1}) ASSERT_EQ(sampler.Next(Forcing(5, token)).token, token);
  EXPECT_EQ(sampler.generated(), (std::vector<int>{1, 3, 1}));
  // counts: 1 -> 2, 3 -> 1.
  const std::vector<double> z = {0.3f, 1.2f - (0.25 * 2 + 0.5), -0.4f, 0.8f - (0.25 * 1 + 0.5), 0.0};
  ExpectDistribution(sampler.Probabilities(logits), Softmax(z, t));

  // Negative penalties encourage repeats.
  SamplingParams n = p;
  n.presence_penalty = -2.0f;
  n.frequency_penalty = -1.5f;
  Sampler enc(n);
  ASSERT_EQ(enc.Next(Forcing(5, 2)).token, 2);
  ExpectDistribution(enc.Probabilities(logits), Softmax({0.3f, 1.2f, -0.4f + 1.5 + 2.0, 0.8f, 0.0}, t));
  // With temperature 0: the argmax of the penalized logits.
  n.temperature = 0.0f;
  Sampler greedy(n);
  EXPECT_EQ(greedy.Next(logits).token, 1);  // nothing generated yet
  EXPECT_EQ(greedy.Next(logits).token, 1);  // 1.2 + 3.5 now
  SamplingParams discourage;
  discourage.presence_penalty = 2.0f;
  Sampler d(discourage);
  EXPECT_EQ(d.Next(logits).token, 1);
  EXPECT_EQ(d.Next(logits).token, 3);  // 1.2 - 2 < 0.8
  EXPECT_EQ(d.Next(logits).token, 0);  // 0.8 - 2 too
}

TEST(SamplerTest, PenaltiesApplyBeforeTemperature) {
  const std::vector<float> logits = {0.0f, 1.0f, 0.5f};
  SamplingParams p;
  p.temperature = 0.5f;
  p.frequency_penalty = 1.0f;
  Sampler sampler(p);
  ASSERT_EQ(sampler.Next(Forcing(3, 1)).token, 1);
  const std::vector<double> got = sampler.Probabilities(logits);
  ExpectDistribution(got, Softmax({0.0, 1.0 - 1.0, 0.5}, 0.5), 1e-9);   // exp((l - c) / T)
  const std::vector<double> other = Softmax({0.0, 2.0 - 1.0, 1.0}, 1.0);  // exp(l / T - c)
  EXPECT_GT(std::abs(got[1] - other[1]), 0.05);
}

TEST(SamplerTest, MinPKeepsTokensWithinAFractionOfTheTopAfterTemperature) {
  std::vector<float> logits;
  for (double q : {0.5, 0.25, 0.15, 0.1}) logits.push_back(static_cast<float>(std::log(q)));
  SamplingParams p;
  p.temperature = 1.0f;
  p.min_p = 0.25f;  // threshold 0.125: 0.1 goes
  ExpectDistribution(Sampler(p).Probabilities(logits), MinP(Softmax(ToDouble(logits), 1.0), p.min_p));
  EXPECT_EQ(Sampler(p).Probabilities(logits)[3], 0.0);
  // Temperature 2 flattens first: 0.1 / 0.5 = 0.2 becomes sqrt(0.2) = 0.45 of the top.
  p.temperature = 2.0f;
  const std::vector<double> flat = Sampler(p).Probabilities(logits);
  ExpectDistribution(flat, MinP(Softmax(ToDouble(logits), 2.0), p.min_p));
  EXPECT_GT(flat[3], 0.1);
  // min_p = 1: only the top (both of a tie).
  p.temperature = 1.0f;
  p.min_p = 1.0f;
  ExpectDistribution(Sampler(p).Probabilities({1.0f, 3.0f, 3.0f, 2.0f}), {0.0, 0.5, 0.5, 0.0});
  for (int id : Draw(p, logits, 200)) EXPECT_EQ(id, 0);
}

TEST(SamplerTest, TopKThenTopPThenMinP) {
  std::vector<float> logits;
  for (double q : {0.5, 0.3, 0.1, 0.1}) logits.push_back(static_cast<float>(std::log(q)));
  const std::vector<double> base = Softmax(ToDouble(logits), 1.0);
  // top_p 0.6 keeps {0.5, 0.3}; min_p 0.3 of the top (0.15) keeps both: 5/8, 3/8.
  // (min-p first would leave {0.625, 0.375}, and top-p 0.6 then only the first.)
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.6f;
  p.min_p = 0.3f;
  const double s = base[0] + base[1];
  ExpectDistribution(Sampler(p).Probabilities(logits), {base[0] / s, base[1] / s, 0.0, 0.0}, 1e-9);
  // top-k 2 then top-p 0.55: renormalized {0.625, 0.375}, so the first alone.
  // (top-p first would keep {0.5, 0.3}.)
  SamplingParams k;
  k.temperature = 1.0f;
  k.top_k = 2;
  k.top_p = 0.55f;
  ExpectDistribution(Sampler(k).Probabilities(logits), {1.0, 0.0, 0.0, 0.0});
}

// Chi-square check that draws follow the processed distribution (with every option
// on): 20000 samplers with seeds 0..19999 each draw once after the same history.
TEST(SamplerTest, DrawsFollowTheProcessedDistribution) {
  const std::vector<float> logits = {1.0f, 0.2f, -0.3f, 0.9f, 0.4f, -2.0f, 0.0f, 0.7f, -0.8f, 0.1f};
  const std::vector<int> prompt = {0, 4};
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 7;
  p.min_p = 0.45f;
  p.repetition_penalty = 1.3f;
  p.presence_penalty = 0.4f;
  p.frequency_penalty = 0.1f;
  // Expected: penalties (history: prompt {0, 4}, generated {3, 3}), / T, top-7, min-p,
  // with the parameters' float values.
  const double rp = p.repetition_penalty, pres = p.presence_penalty, freq = p.frequency_penalty;
  std::vector<double> z = ToDouble(logits);
  z[0] /= rp;
  z[4] /= rp;
  z[3] = z[3] / rp - (freq * 2 + pres);
  std::vector<double> want = Softmax(z, p.temperature);
  std::vector<int> order(10);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return z[a] > z[b]; });
  for (int i = 7; i < 10; ++i) want[order[i]] = 0.0;
  double sum = 0;
  for (double v : want) sum += v;
  for (double& v : want) v /= sum;
  want = MinP(want, p.min_p);
  int support = 0;
  for (double v : want) support += v > 0;
  ASSERT_GE(support, 3);  // the test would be weak otherwise
  ASSERT_LT(support, 7);  // min-p did cut something

  const int n = 20000;
  std::vector<int> counts(10, 0);
  for (int seed = 0; seed < n; ++seed) {
    p.seed = seed;
    Sampler sampler(p, prompt);
    sampler.Next(Forcing(10, 3));
    sampler.Next(Forcing(10, 3));
    if (seed == 0) ExpectDistribution(sampler.Probabilities(logits), want, 1e-9);
    ++counts[sampler.Next(logits).token];
  }
  double chi2 = 0;
  for (int i = 0; i < 10; ++i) {
    if (want[i] == 0.0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " has probability 0";
      continue;
    }
    const double e = want[i] * n;
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  // 99.9% quantiles of chi-square with support - 1 = 2..5 degrees of freedom.
  const double critical[] = {0, 0, 13.82, 16.27, 18.47, 20.52};
  EXPECT_LT(chi2, critical[support - 1]) << "support " << support;
}

TEST(SamplerTest, LogprobsAreTheRawLogSoftmax) {
  const std::vector<float> logits = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f, -INFINITY, std::nanf("")};
  double lse = 0;
  for (int i = 0; i < 5; ++i) lse += std::exp(static_cast<double>(logits[i]));
  lse = std::log(lse);
  auto raw = [&](int id) { return static_cast<double>(logits[id]) - lse; };

  SamplingParams p;
  p.temperature = 0.7f;
  p.repetition_penalty = 1.5f;
  p.presence_penalty = 1.0f;
  p.logprobs = true;
  p.top_logprobs = 4;
  p.seed = 3;
  Sampler sampler(p, /*prompt_ids=*/{1});
  for (int step = 0; step < 5; ++step) {  // penalties change the draw, not the logprobs
    const SampledToken t = sampler.Next(logits);
    ASSERT_GE(t.token, 0);
    ASSERT_LT(t.token, 5);
    EXPECT_NEAR(t.logprob, raw(t.token), 1e-6) << "step " << step;
    ASSERT_EQ(t.top_logprobs.size(), 4u);
    const int want_ids[] = {1, 3, 0, 4};  // tie 1/3: the lower id first
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(t.top_logprobs[i].token, want_ids[i]);
      EXPECT_NEAR(t.top_logprobs[i].logprob, raw(want_ids[i]), 1e-6);
    }
  }
  // More alternatives than tokens of non-zero probability: those only.
  p.top_logprobs = 20;
  const SampledToken all = Sampler(p).Next(logits);
  ASSERT_EQ(all.top_logprobs.size(), 5u);
  double mass = 0;
  for (const TokenLogprob& t : all.top_logprobs) mass += std::exp(static_cast<double>(t.logprob));
  EXPECT_NEAR(mass, 1.0, 1e-6);
  // Greedy reports the argmax's logprob.
  SamplingParams g;
  g.logprobs = true;
  const SampledToken gt = Sampler(g).Next(logits);
  EXPECT_EQ(gt.token, 1);
  EXPECT_NEAR(gt.logprob, raw(1), 1e-6);
  EXPECT_TRUE(gt.top_logprobs.empty());
  // Not asked: nothing computed.
  const SampledToken none = Sampler(SamplingParams()).Next(logits);
  EXPECT_EQ(none.logprob, 0.0f);
  EXPECT_TRUE(none.top_logprobs.empty());
  // No probability anywhere: -inf for the fallback token, no alternatives.
  g.top_logprobs = 3;
  const SampledToken dead = Sampler(g).Next(std::vector<float>(4, -INFINITY));
  EXPECT_EQ(dead.token, 0);
  EXPECT_EQ(dead.logprob, -INFINITY);
  EXPECT_TRUE(dead.top_logprobs.empty());
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

  // Boundaries are accepted.
  SamplingParams edge;
  edge.min_p = 1.0f;
  edge.presence_penalty = -2.0f;
  edge.frequency_penalty = 2.0f;
  edge.repetition_penalty = 1e-3f;
  edge.logprobs = true;
  edge.top_logprobs = 20;
  EXPECT_THAT(edge.Validate(), IsOk());
  edge.min_p = 0.0f;
  edge.presence_penalty = 2.0f;
  edge.frequency_penalty = -2.0f;
  edge.top_logprobs = 0;
  EXPECT_THAT(edge.Validate(), IsOk());

  const float nan = std::nanf("");
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    void (*set)(SamplingParams*, float);
    float value;
    const char* error;
  };
  const std::vector<Case> cases = {
      {[](SamplingParams* s, float v) { s->min_p = v; }, -0.1f, "min_p must be in [0, 1], got -0.1"},
      {[](SamplingParams* s, float v) { s->min_p = v; }, 1.5f, "min_p must be in [0, 1], got 1.5"},
      {[](SamplingParams* s, float v) { s->min_p = v; }, nan, "min_p"},
      {[](SamplingParams* s, float v) { s->repetition_penalty = v; }, 0.0f, "repetition_penalty must be finite and > 0, got 0"},
      {[](SamplingParams* s, float v) { s->repetition_penalty = v; }, -1.0f, "repetition_penalty must be finite and > 0, got -1"},
      {[](SamplingParams* s, float v) { s->repetition_penalty = v; }, nan, "repetition_penalty"},
      {[](SamplingParams* s, float v) { s->repetition_penalty = v; }, inf, "repetition_penalty"},
      {[](SamplingParams* s, float v) { s->presence_penalty = v; }, 2.5f, "presence_penalty must be in [-2, 2], got 2.5"},
      {[](SamplingParams* s, float v) { s->presence_penalty = v; }, -2.01f, "presence_penalty must be in [-2, 2]"},
      {[](SamplingParams* s, float v) { s->presence_penalty = v; }, nan, "presence_penalty"},
      {[](SamplingParams* s, float v) { s->frequency_penalty = v; }, -3.0f, "frequency_penalty must be in [-2, 2], got -3"},
      {[](SamplingParams* s, float v) { s->frequency_penalty = v; }, inf, "frequency_penalty"},
      {[](SamplingParams* s, float v) { s->frequency_penalty = v; }, nan, "frequency_penalty"},
  };
  for (const Case& c : cases) {
    SamplingParams bad;
    c.set(&bad, c.value);
    EXPECT_THAT(bad.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, c.error)) << c.error;
  }
  SamplingParams lp;
  lp.logprobs = true;
  lp.top_logprobs = -1;
  EXPECT_THAT(lp.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "top_logprobs must be in [0, 20], got -1"));
  lp.top_logprobs = 21;
  EXPECT_THAT(lp.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "top_logprobs must be in [0, 20], got 21"));
  lp.top_logprobs = 3;
  lp.logprobs = false;
  EXPECT_THAT(lp.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "top_logprobs (3) needs logprobs"));
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
