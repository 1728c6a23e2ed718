// Tests of kernels/score.h against float64 brute-force references written here with
// plain loops (no code shared with the implementation).
//
// Accuracy criterion for Eq. 3 (float32 implementation vs float64 reference): per head
// row, max_i |a_i - b_i| <= tol * max_i |b_i|. Why relative to the row maximum and not
// per element: the implementation works in float32 as specified, so every probability
// exp(logit - lse) carries a relative error of about (|logit| + |lse|) * 2^-24, which for
// logits of a few units is already ~1e-6 per element; tiny entries of the row can never
// meet a pure per-element 1e-6 bound and they do not matter for top-k. The row-max
// relative error bounds how far any score can move against the scale of the scores that
// compete for the top-k, which is what the policies consume.
#include "kernels/score.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace echokv::kernels {
namespace {

// Row-major [H][L] float64 scores.
using Matrix = std::vector<std::vector<double>>;

at::Tensor RandN(std::vector<int64_t> sizes, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randn(sizes, gen, at::TensorOptions().dtype(at::kFloat));
}

// Brute-force Eq. 3 in float64. queries [H, nq, d], keys [G, L, d] float32 CPU.
// qpos / kpos empty = every query sees every key; else query q sees key j of group g
// iff kpos[g][j] <= qpos[q].
Matrix ReferenceScores(const at::Tensor& queries, const at::Tensor& keys,
                       const std::vector<int64_t>& qpos,
                       const std::vector<std::vector<int64_t>>& kpos, double scale = 0.0) {
  at::Tensor qc = queries.to(at::kFloat).contiguous();
  at::Tensor kc = keys.to(at::kFloat).contiguous();
  auto q = qc.accessor<float, 3>();
  auto k = kc.accessor<float, 3>();
  const int64_t h_count = qc.size(0), nq = qc.size(1), d = qc.size(2);
  const int64_t g_count = kc.size(0), l = kc.size(1);
  const int64_t r = h_count / g_count;
  if (scale == 0.0) scale = 1.0 / std::sqrt(static_cast<double>(d));
  Matrix out(h_count, std::vector<double>(l, 0.0));
  std::vector<double> logits(l);
  for (int64_t h = 0; h < h_count; ++h) {
    const int64_t g = h / r;
    for (int64_t qi = 0; qi < nq; ++qi) {
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < l; ++j) {
        const bool visible = qpos.empty() || kpos[g][j] <= qpos[qi];
        if (!visible) {
          logits[j] = -std::numeric_limits<double>::infinity();
          continue;
        }
        double dot = 0.0;
        for (int64_t t = 0; t < d; ++t) dot += static_cast<double>(q[h][qi][t]) * k[g][j][t];
        logits[j] = dot * scale;
        mx = std::max(mx, logits[j]);
      }
      if (mx == -std::numeric_limits<double>::infinity()) continue;  // sees nothing
      double denom = 0.0;
      for (int64_t j = 0; j < l; ++j) denom += std::exp(logits[j] - mx);
      for (int64_t j = 0; j < l; ++j) out[h][j] += std::exp(logits[j] - mx) / denom;
    }
  }
  return out;
}

// Max over rows of (max_i |a_i - b_i|) / max_i |b_i| (rows with max 0 must match exactly:
// their error is reported absolute).
double RowRelativeError(const at::Tensor& actual, const Matrix& expected) {
  at::Tensor a = actual.to(at::kDouble).cpu().contiguous();
  EXPECT_EQ(a.size(0), static_cast<int64_t>(expected.size()));
  auto acc = a.accessor<double, 2>();
  double worst = 0.0;
  for (size_t h = 0; h < expected.size(); ++h) {
    EXPECT_EQ(a.size(1), static_cast<int64_t>(expected[h].size()));
    double row_max = 0.0, err = 0.0;
    for (size_t i = 0; i < expected[h].size(); ++i) {
      row_max = std::max(row_max, std::abs(expected[h][i]));
      const double diff = std::abs(acc[h][i] - expected[h][i]);
      err = std::max(err, std::isnan(diff) ? std::numeric_limits<double>::infinity() : diff);
    }
    worst = std::max(worst, row_max > 0 ? err / row_max : err);
  }
  return worst;
}

double TensorRowRelativeError(const at::Tensor& actual, const at::Tensor& expected) {
  at::Tensor e = expected.to(at::kDouble).cpu().contiguous();
  Matrix m(e.size(0), std::vector<double>(e.size(1)));
  auto acc = e.accessor<double, 2>();
  for (int64_t h = 0; h < e.size(0); ++h)
    for (int64_t i = 0; i < e.size(1); ++i) m[h][i] = acc[h][i];
  return RowRelativeError(actual, m);
}

at::Tensor ToTensor(const std::vector<int64_t>& v) {
  return at::tensor(std::vector<int64_t>(v), at::kLong);
}

at::Tensor ToTensor(const std::vector<std::vector<int64_t>>& v) {
  std::vector<at::Tensor> rows;
  for (const auto& row : v) rows.push_back(ToTensor(row));
  return at::stack(rows);
}

// Sorted distinct random positions in [0, range) for each of g groups.
std::vector<std::vector<int64_t>> RandomKeyPositions(int64_t g, int64_t l, int64_t range,
                                                     uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int64_t>> out;
  for (int64_t gi = 0; gi < g; ++gi) {
    std::vector<int64_t> all(range);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<int64_t> pick(all.begin(), all.begin() + l);
    std::sort(pick.begin(), pick.end());
    out.push_back(pick);
  }
  return out;
}

struct Shape {
  int64_t h, g, d, l, nq;
};

constexpr double kTol = 1e-6;

TEST(AttentionScoresTest, MatchesFloat64ReferenceAllVisible) {
  const std::vector<Shape> shapes = {
      {1, 1, 8, 37, 5}, {4, 2, 16, 100, 9}, {8, 2, 64, 130, 16}, {8, 8, 32, 50, 3},
      {4, 1, 128, 64, 4}};
  uint64_t seed = 1;
  for (const Shape& s : shapes) {
    at::Tensor q = RandN({s.h, s.nq, s.d}, seed++);
    at::Tensor k = RandN({s.g, s.l, s.d}, seed++);
    const Matrix ref = ReferenceScores(q, k, {}, {});
    for (int64_t chunk : {int64_t{1024}, int64_t{16}}) {
      ScoreOptions o;
      o.chunk = chunk;
      o.query_chunk = chunk == 16 ? 4 : 256;
      at::Tensor out = AttentionScores(q, k, o);
      ASSERT_EQ(out.scalar_type(), at::kFloat);
      ASSERT_EQ(out.sizes(), (at::IntArrayRef{s.h, s.l}));
      EXPECT_LE(RowRelativeError(out, ref), kTol)
          << "H=" << s.h << " G=" << s.g << " d=" << s.d << " L=" << s.l << " nq=" << s.nq
          << " chunk=" << chunk;
    }
  }
}

TEST(AttentionScoresTest, ExplicitScaleIsUsed) {
  at::Tensor q = RandN({2, 3, 8}, 11);
  at::Tensor k = RandN({1, 20, 8}, 12);
  ScoreOptions o;
  o.scale = 0.9;
  EXPECT_LE(RowRelativeError(AttentionScores(q, k, o), ReferenceScores(q, k, {}, {}, 0.9)), kTol);
  // And the default differs from it (the test above would not notice a dropped scale).
  EXPECT_GT(RowRelativeError(AttentionScores(q, k, ScoreOptions{}),
                             ReferenceScores(q, k, {}, {}, 0.9)),
            1e-3);
}

TEST(AttentionScoresTest, EachQueryContributesMassOne) {
  at::Tensor q = RandN({4, 7, 16}, 21);
  at::Tensor k = RandN({2, 90, 16}, 22);
  at::Tensor out = AttentionScores(q, k, ScoreOptions{});
  at::Tensor mass = out.sum(1).to(at::kDouble);
  for (int64_t h = 0; h < 4; ++h) EXPECT_NEAR(mass[h].item<double>(), 7.0, 1e-5);
}

TEST(AttentionScoresTest, ChunkedEqualsUnchunked) {
  for (bool causal : {false, true}) {
    const int64_t h = 8, g = 2, d = 32, l = 61, nq = 10;
    at::Tensor q = RandN({h, nq, d}, causal ? 31 : 32);
    at::Tensor k = RandN({g, l, d}, causal ? 33 : 34);
    ScoreOptions whole;
    whole.chunk = l;
    whole.query_chunk = nq;
    if (causal) {
      const auto kpos = RandomKeyPositions(g, l, 120, 5);
      std::vector<int64_t> qpos;
      for (int64_t i = 0; i < nq; ++i) qpos.push_back(10 + 11 * i);
      whole.query_positions = ToTensor(qpos);
      whole.key_positions = ToTensor(kpos);
    }
    at::Tensor expected = AttentionScores(q, k, whole);
    for (int64_t chunk : {int64_t{1}, int64_t{7}, l}) {
      for (int64_t qchunk : {int64_t{1}, int64_t{3}, nq}) {
        ScoreOptions o = whole;
        o.chunk = chunk;
        o.query_chunk = qchunk;
        EXPECT_LE(TensorRowRelativeError(AttentionScores(q, k, o), expected), kTol)
            << "causal=" << causal << " chunk=" << chunk << " query_chunk=" << qchunk;
      }
    }
  }
}

TEST(AttentionScoresTest, CausalRuleWithPerGroupKeyPositions) {
  const int64_t h = 8, g = 4, d = 16, l = 40, nq = 12;
  at::Tensor q = RandN({h, nq, d}, 41);
  at::Tensor k = RandN({g, l, d}, 42);
  const auto kpos = RandomKeyPositions(g, l, 100, 7);
  std::vector<int64_t> qpos;
  std::mt19937 rng(3);
  for (int64_t i = 0; i < nq; ++i) qpos.push_back(static_cast<int64_t>(rng() % 110));
  qpos[0] = 0;  // sees at most one key per group
  // The groups really differ, so a kernel that used group 0's positions for all fails.
  ASSERT_NE(kpos[0], kpos[1]);
  const Matrix ref = ReferenceScores(q, k, qpos, kpos);
  for (int64_t chunk : {int64_t{1024}, int64_t{5}}) {
    ScoreOptions o;
    o.chunk = chunk;
    o.query_chunk = 5;
    o.query_positions = ToTensor(qpos);
    o.key_positions = ToTensor(kpos);
    at::Tensor out = AttentionScores(q, k, o);
    EXPECT_LE(RowRelativeError(out, ref), kTol) << "chunk=" << chunk;
    // Keys no query can see score exactly 0.
    const int64_t max_q = *std::max_element(qpos.begin(), qpos.end());
    for (int64_t hi = 0; hi < h; ++hi) {
      for (int64_t j = 0; j < l; ++j) {
        if (kpos[hi / (h / g)][j] > max_q) {
          EXPECT_EQ(out[hi][j].item<float>(), 0.0f);
        }
      }
    }
  }
}

TEST(AttentionScoresTest, QueriesThatSeeNothingContributeNothing) {
  const int64_t h = 4, g = 2, d = 8, l = 30, nq = 6;
  at::Tensor q = RandN({h, nq, d}, 51);
  at::Tensor k = RandN({g, l, d}, 52);
  std::vector<std::vector<int64_t>> kpos(g);
  for (int64_t j = 0; j < l; ++j) {
    kpos[0].push_back(100 + j);
    kpos[1].push_back(200 + j);
  }
  ScoreOptions o;
  o.chunk = 8;
  o.key_positions = ToTensor(kpos);
  // Nobody sees anything: all zeros, no NaN.
  o.query_positions = ToTensor(std::vector<int64_t>{0, 1, 2, 50, 99, 3});
  at::Tensor none = AttentionScores(q, k, o);
  EXPECT_FALSE(none.isnan().any().item<bool>());
  EXPECT_EQ(none.abs().max().item<float>(), 0.0f);
  // Mixed: group 0 is seen by queries at 110 and 150, group 1 by nobody but the query at 215.
  const std::vector<int64_t> qpos = {0, 110, 5, 150, 215, 1};
  o.query_positions = ToTensor(qpos);
  at::Tensor out = AttentionScores(q, k, o);
  EXPECT_FALSE(out.isnan().any().item<bool>());
  EXPECT_LE(RowRelativeError(out, ReferenceScores(q, k, qpos, kpos)), kTol);
  // Group 0 heads: 3 queries see something (110, 150, 215) -> mass 3; group 1: 1.
  at::Tensor mass = out.sum(1).to(at::kDouble);
  EXPECT_NEAR(mass[0].item<double>(), 3.0, 1e-5);
  EXPECT_NEAR(mass[1].item<double>(), 3.0, 1e-5);
  EXPECT_NEAR(mass[2].item<double>(), 1.0, 1e-5);
  EXPECT_NEAR(mass[3].item<double>(), 1.0, 1e-5);
}

TEST(AttentionScoresTest, LargeMagnitudeLogitsStayFinite) {
  // Unit keys and queries of norm M with scale 1: logits in [-M, M]. exp(300) overflows
  // float32, so only a log-sum-exp that subtracts the running max survives.
  for (double magnitude : {80.0, 300.0}) {
    const int64_t h = 2, g = 1, d = 4, l = 200, nq = 5;
    at::Tensor k = RandN({g, l, d}, 61);
    k = k / k.norm(2, -1, /*keepdim=*/true);
    at::Tensor q = RandN({h, nq, d}, 62);
    q = q / q.norm(2, -1, true) * magnitude;
    ScoreOptions o;
    o.scale = 1.0;
    o.chunk = 16;  // the max moves between chunks: exercises the running rescale
    at::Tensor out = AttentionScores(q, k, o);
    EXPECT_TRUE(at::isfinite(out).all().item<bool>()) << "M=" << magnitude;
    at::Tensor mass = out.sum(1).to(at::kDouble);
    for (int64_t hi = 0; hi < h; ++hi) EXPECT_NEAR(mass[hi].item<double>(), nq, 1e-4);
    // Logit rounding grows with |logit| (|logit| * 2^-24 relative per probability).
    EXPECT_LE(RowRelativeError(out, ReferenceScores(q, k, {}, {}, 1.0)), 1e-4)
        << "M=" << magnitude;
  }
}

TEST(AttentionScoresTest, GroupsAreIsolated) {
  const int64_t h = 4, g = 2, d = 16, l = 50, nq = 5;
  at::Tensor q = RandN({h, nq, d}, 71);
  at::Tensor k = RandN({g, l, d}, 72);
  at::Tensor before = AttentionScores(q, k, ScoreOptions{});
  at::Tensor k2 = k.clone();
  k2[1] = RandN({l, d}, 73) * 3.0;
  at::Tensor after = AttentionScores(q, k2, ScoreOptions{});
  // Heads 0, 1 read group 0 only: bitwise unchanged. Heads 2, 3 read group 1: changed.
  EXPECT_TRUE(at::equal(before.narrow(0, 0, 2), after.narrow(0, 0, 2)));
  EXPECT_GT((before.narrow(0, 2, 2) - after.narrow(0, 2, 2)).abs().max().item<float>(), 1e-3);
}

TEST(AttentionScoresTest, HalfPrecisionInputsAreComputedInFloat32) {
  at::Tensor q = RandN({4, 6, 32}, 81);
  at::Tensor k = RandN({2, 70, 32}, 82);
  for (at::ScalarType t : {at::kBFloat16, at::kHalf}) {
    at::Tensor qh = q.to(t), kh = k.to(t);
    ScoreOptions o;
    o.chunk = 9;
    at::Tensor out = AttentionScores(qh, kh, o);
    EXPECT_EQ(out.scalar_type(), at::kFloat);
    // Same values, upcast: the float32 computation on them is the reference.
    EXPECT_LE(RowRelativeError(out, ReferenceScores(qh.to(at::kFloat), kh.to(at::kFloat), {}, {})),
              kTol);
  }
}

TEST(AttentionScoresTest, EmptyInputs) {
  at::Tensor out = AttentionScores(at::zeros({4, 0, 8}), RandN({2, 10, 8}, 1), ScoreOptions{});
  EXPECT_EQ(out.sizes(), (at::IntArrayRef{4, 10}));
  EXPECT_EQ(out.abs().sum().item<float>(), 0.0f);
  EXPECT_EQ(AttentionScores(RandN({4, 3, 8}, 2), at::zeros({2, 0, 8}), ScoreOptions{}).sizes(),
            (at::IntArrayRef{4, 0}));
}

TEST(AttentionScoresTest, RejectsBadShapesAndOptions) {
  at::Tensor q = RandN({4, 3, 8}, 1);
  at::Tensor k = RandN({2, 10, 8}, 2);
  EXPECT_THROW(AttentionScores(RandN({3, 3, 8}, 1), k, ScoreOptions{}), c10::Error);  // H % G
  EXPECT_THROW(AttentionScores(q, RandN({2, 10, 4}, 1), ScoreOptions{}), c10::Error);  // d
  EXPECT_THROW(AttentionScores(q.view({12, 8}), k, ScoreOptions{}), c10::Error);       // rank
  ScoreOptions o;
  o.chunk = 0;
  EXPECT_THROW(AttentionScores(q, k, o), c10::Error);
  o = ScoreOptions{};
  o.query_chunk = 0;
  EXPECT_THROW(AttentionScores(q, k, o), c10::Error);
  o = ScoreOptions{};
  o.query_positions = at::arange(3, at::kLong);  // key_positions missing
  EXPECT_THROW(AttentionScores(q, k, o), c10::Error);
  o.key_positions = at::zeros({2, 9}, at::kLong);  // wrong L
  EXPECT_THROW(AttentionScores(q, k, o), c10::Error);
  try {
    o.key_positions = at::zeros({2, 10}, at::kLong);
    o.query_positions = at::arange(4, at::kLong);  // wrong nq
    AttentionScores(q, k, o);
    ADD_FAILURE() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("query_positions"), std::string::npos) << e.what();
  }
}

TEST(AttentionScoresTest, LongContextCompletes) {
  // L = 65536, nq = 64: an unchunked kernel would hold 16 MB of logits per head; the
  // chunked one holds query_chunk * chunk per head. Only completion and sanity here.
  const int64_t l = 65536, nq = 64;
  at::Tensor q = RandN({2, nq, 16}, 91);
  at::Tensor k = RandN({1, l, 16}, 92);
  at::Tensor out = AttentionScores(q, k, ScoreOptions{});
  ASSERT_EQ(out.sizes(), (at::IntArrayRef{2, l}));
  EXPECT_TRUE(at::isfinite(out).all().item<bool>());
  at::Tensor mass = out.sum(1).to(at::kDouble);
  EXPECT_NEAR(mass[0].item<double>(), nq, 1e-3);
  EXPECT_NEAR(mass[1].item<double>(), nq, 1e-3);
}

TEST(CausalColumnSumsTest, MatchesBruteForceWithDiagonal) {
  const int64_t h = 4, g = 2, d = 16, l = 45;
  at::Tensor q = RandN({h, l, d}, 101);
  at::Tensor k = RandN({g, l, d}, 102);
  std::vector<int64_t> pos(l);
  std::iota(pos.begin(), pos.end(), 0);
  const std::vector<std::vector<int64_t>> kpos(g, pos);
  at::Tensor out = CausalColumnSums(q, ToTensor(pos), k, ToTensor(kpos));
  EXPECT_LE(RowRelativeError(out, ReferenceScores(q, k, pos, kpos)), kTol);
  // Every query sees at least itself: each contributes mass exactly 1.
  at::Tensor mass = out.sum(1).to(at::kDouble);
  for (int64_t hi = 0; hi < h; ++hi) EXPECT_NEAR(mass[hi].item<double>(), l, 1e-4);
  // Diagonal included: query 0 sees only key 0, so key 0 collects at least 1, and the
  // last key is seen only by the last query with weight < 1 (> 0).
  for (int64_t hi = 0; hi < h; ++hi) {
    EXPECT_GE(out[hi][0].item<float>(), 1.0f - 1e-6f);
    EXPECT_GT(out[hi][l - 1].item<float>(), 0.0f);
    EXPECT_LT(out[hi][l - 1].item<float>(), 1.0f);
  }
}

TEST(CausalColumnSumsTest, SingleFirstQueryPutsAllMassOnKeyZero) {
  at::Tensor q = RandN({2, 1, 8}, 111);
  at::Tensor k = RandN({1, 6, 8}, 112);
  at::Tensor out = CausalColumnSums(q, at::zeros({1}, at::kLong), k,
                                    at::arange(6, at::kLong).unsqueeze(0));
  for (int64_t hi = 0; hi < 2; ++hi) {
    EXPECT_FLOAT_EQ(out[hi][0].item<float>(), 1.0f);
    for (int64_t j = 1; j < 6; ++j) EXPECT_EQ(out[hi][j].item<float>(), 0.0f);
  }
}

TEST(CausalColumnSumsTest, PerGroupPositionsAndEqualsAttentionScores) {
  const int64_t h = 4, g = 2, d = 8, l = 33, nq = 20;
  at::Tensor q = RandN({h, nq, d}, 121);
  at::Tensor k = RandN({g, l, d}, 122);
  const auto kpos = RandomKeyPositions(g, l, 60, 9);
  std::vector<int64_t> qpos;
  for (int64_t i = 0; i < nq; ++i) qpos.push_back(40 + i);
  at::Tensor out = CausalColumnSums(q, ToTensor(qpos), k, ToTensor(kpos));
  EXPECT_LE(RowRelativeError(out, ReferenceScores(q, k, qpos, kpos)), kTol);
  ScoreOptions o;
  o.query_positions = ToTensor(qpos);
  o.key_positions = ToTensor(kpos);
  EXPECT_TRUE(at::equal(out, AttentionScores(q, k, o)));
}

TEST(SumHeadsPerGroupTest, SumsConsecutiveHeads) {
  at::Tensor s = at::arange(24, at::kFloat).view({6, 4});  // H=6
  at::Tensor out = SumHeadsPerGroup(s, 2);                 // r=3
  ASSERT_EQ(out.sizes(), (at::IntArrayRef{2, 4}));
  for (int64_t j = 0; j < 4; ++j) {
    EXPECT_EQ(out[0][j].item<float>(), static_cast<float>(j + (4 + j) + (8 + j)));
    EXPECT_EQ(out[1][j].item<float>(), static_cast<float>((12 + j) + (16 + j) + (20 + j)));
  }
  EXPECT_TRUE(at::equal(SumHeadsPerGroup(s, 6), s));
  EXPECT_THROW(SumHeadsPerGroup(s, 4), c10::Error);
  EXPECT_THROW(SumHeadsPerGroup(s, 0), c10::Error);
}

std::vector<float> Pool(const std::vector<float>& x, int64_t kernel) {
  at::Tensor t = at::tensor(std::vector<float>(x), at::kFloat).unsqueeze(0);
  at::Tensor out = MaxPool1d(t, kernel).contiguous();
  EXPECT_EQ(out.sizes(), t.sizes());
  return std::vector<float>(out.data_ptr<float>(), out.data_ptr<float>() + out.numel());
}

TEST(MaxPool1dTest, HandCasesIncludingBorders) {
  using V = std::vector<float>;
  EXPECT_EQ(Pool({1, 3, 2, 5, 4}, 3), (V{3, 3, 5, 5, 5}));
  EXPECT_EQ(Pool({5, 1, 1, 1, 7}, 3), (V{5, 5, 1, 7, 7}));
  EXPECT_EQ(Pool({5, 1, 1, 1, 7}, 5), (V{5, 5, 7, 7, 7}));
  // Out-of-range positions are ignored, not zero-padded.
  EXPECT_EQ(Pool({-5, -6, -7}, 3), (V{-5, -5, -6}));
  EXPECT_EQ(Pool({-5, -6, -7, -8}, 7), (V{-5, -5, -5, -5}));
  EXPECT_EQ(Pool({2}, 7), (V{2}));
  EXPECT_EQ(Pool({1, 9, 2, 8}, 1), (V{1, 9, 2, 8}));
}

TEST(MaxPool1dTest, MatchesLoopReferenceOnRandomRows) {
  at::Tensor x = RandN({3, 50}, 131);
  for (int64_t kernel : {1, 3, 7, 9}) {
    at::Tensor out = MaxPool1d(x, kernel);
    ASSERT_EQ(out.sizes(), x.sizes());
    auto xa = x.accessor<float, 2>();
    for (int64_t r = 0; r < 3; ++r) {
      for (int64_t i = 0; i < 50; ++i) {
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t j = std::max<int64_t>(0, i - kernel / 2);
             j <= std::min<int64_t>(49, i + kernel / 2); ++j) {
          m = std::max(m, xa[r][j]);
        }
        EXPECT_EQ(out[r][i].item<float>(), m) << "kernel=" << kernel << " r=" << r << " i=" << i;
      }
    }
  }
}

TEST(MaxPool1dTest, RejectsBadKernel) {
  at::Tensor x = RandN({1, 10}, 1);
  EXPECT_THROW(MaxPool1d(x, 0), c10::Error);
  EXPECT_THROW(MaxPool1d(x, 4), c10::Error);
  EXPECT_THROW(MaxPool1d(x, -3), c10::Error);
}

std::vector<int64_t> TopK(const std::vector<float>& row, int64_t k) {
  at::Tensor out = TopKIndices(at::tensor(std::vector<float>(row), at::kFloat).unsqueeze(0), k);
  EXPECT_EQ(out.scalar_type(), at::kLong);
  EXPECT_EQ(out.device(), at::Device(at::kCPU));
  out = out.contiguous();
  return std::vector<int64_t>(out.data_ptr<int64_t>(), out.data_ptr<int64_t>() + out.numel());
}

TEST(TopKIndicesTest, TiesGoToLowerIndex) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(TopK(std::vector<float>(10, 0.5f), 4), (V{0, 1, 2, 3}));
  EXPECT_EQ(TopK({1, 3, 3, 2, 3}, 2), (V{1, 2}));
  EXPECT_EQ(TopK({1, 3, 3, 2, 3}, 4), (V{1, 2, 3, 4}));
  EXPECT_EQ(TopK({5, 1, 5, 1, 1}, 3), (V{0, 1, 2}));
}

TEST(TopKIndicesTest, NanIsMinusInfinity) {
  using V = std::vector<int64_t>;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(TopK({nan, 1, nan, 0}, 2), (V{1, 3}));
  EXPECT_EQ(TopK({nan, 1, nan, 0}, 3), (V{0, 1, 3}));  // NaN ties with NaN: lower index
  EXPECT_EQ(TopK({-inf, nan, 5}, 2), (V{0, 2}));        // NaN ties with -inf: lower index
  EXPECT_EQ(TopK({nan, -100, nan}, 1), (V{1}));
}

TEST(TopKIndicesTest, KAtLeastLReturnsAllAndZeroReturnsNone) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(TopK({3, 1, 2}, 3), (V{0, 1, 2}));
  EXPECT_EQ(TopK({3, 1, 2}, 100), (V{0, 1, 2}));
  EXPECT_TRUE(TopK({3, 1, 2}, 0).empty());
  EXPECT_EQ(TopKIndices(at::zeros({2, 5}), 9).sizes(), (at::IntArrayRef{2, 5}));
  EXPECT_EQ(TopKIndices(at::zeros({2, 5}), 0).sizes(), (at::IntArrayRef{2, 0}));
  EXPECT_THROW(TopKIndices(at::zeros({2, 5}), -1), c10::Error);
  EXPECT_THROW(TopKIndices(at::zeros({5}), 2), c10::Error);
}

TEST(TopKIndicesTest, MatchesSortReferenceOnRandomRowsWithTies) {
  std::mt19937 rng(17);
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t rows = 1 + rng() % 4, l = 1 + rng() % 300, k = rng() % (l + 3);
    const bool many_ties = trial % 2 == 0;
    std::vector<float> values(rows * l);
    for (float& v : values) {
      v = many_ties ? static_cast<float>(rng() % 5)
                    : std::uniform_real_distribution<float>(-1, 1)(rng);
    }
    at::Tensor scores = at::tensor(values, at::kFloat).view({rows, l});
    if (trial % 4 == 1) scores = scores.to(at::kBFloat16);  // bf16 values: many ties
    at::Tensor out = TopKIndices(scores, k);
    const int64_t kk = std::min(k, l);
    ASSERT_EQ(out.sizes(), (at::IntArrayRef{rows, kk}));
    at::Tensor sf = scores.to(at::kFloat).contiguous();
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<int64_t> idx(l);
      std::iota(idx.begin(), idx.end(), 0);
      const float* v = sf.data_ptr<float>() + r * l;
      std::stable_sort(idx.begin(), idx.end(), [v](int64_t a, int64_t b) { return v[a] > v[b]; });
      std::vector<int64_t> expected(idx.begin(), idx.begin() + kk);
      std::sort(expected.begin(), expected.end());
      for (int64_t i = 0; i < kk; ++i) {
        EXPECT_EQ(out[r][i].item<int64_t>(), expected[i]) << "trial=" << trial << " row=" << r;
        if (i > 0) {
          EXPECT_LT(out[r][i - 1].item<int64_t>(), out[r][i].item<int64_t>());
        }
      }
    }
  }
}

}  // namespace
}  // namespace echokv::kernels
