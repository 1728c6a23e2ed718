// The CUDA kernels' per-element math (kernels/cuda/device_math.h) on the CPU, in every
// build, against the CPU code each function mirrors and float64 references:
//  - the top-k composite key: its integer order is TopKIndices' order on crafted and
//    random values (NaN, +-inf, +-0, ties, denormals), and a top-k of the keys (as
//    kernels/cuda/ops.cc runs it on the device) keeps exactly TopKIndices' set;
//  - RoPE: the angle is the CPU's float32 angle, cos/sin within 1 ulp of LibTorch's,
//    and the rotation with LibTorch's tables gives ApplyRope's bits;
//  - the online softmax state: log-sum-exp against float64, splits merged in order,
//    empty states (no NaN), and the decode and scoring kernels' split / warp / pass
//    structure replayed on the host against kernels::CausalAttention and
//    kernels::AttentionScores.
#include "kernels/cuda/device_math.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "kernels/rope.h"
#include "kernels/score.h"

namespace echokv::kernels {
namespace {

using cuda_math::KeyVisible;
using cuda_math::NumSplits;
using cuda_math::ProbFromLse;
using cuda_math::RopeAngle;
using cuda_math::RopeCosSin;
using cuda_math::RopeRotate;
using cuda_math::SoftmaxState;
using cuda_math::TopKKey;
using cuda_math::TopKKeyIndex;

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// ---- top-k ----

// The composite-key top-k of kernels/cuda/ops.cc, with LibTorch's CPU topk in place of
// the device's: keys, an exact top-k of them in any order, their indices, sorted.
at::Tensor KeyTopK(const at::Tensor& scores, int64_t k) {
  const int64_t rows = scores.size(0), n = scores.size(1), kk = std::min(k, n);
  if (rows == 0 || kk == 0) return at::empty({rows, kk}, at::kLong);
  if (kk == n) return at::arange(n, at::kLong).unsqueeze(0).repeat({rows, 1});
  at::Tensor s = scores.to(at::kFloat).contiguous();
  at::Tensor keys = at::empty({rows, n}, at::kLong);
  for (int64_t i = 0; i < rows * n; ++i) keys.data_ptr<int64_t>()[i] = TopKKey(s.data_ptr<float>()[i], i % n);
  at::Tensor top = std::get<0>(at::topk(keys, kk, 1, /*largest=*/true, /*sorted=*/false)).contiguous();
  at::Tensor idx = at::empty({rows, kk}, at::kLong);
  for (int64_t i = 0; i < rows * kk; ++i) idx.data_ptr<int64_t>()[i] = TopKKeyIndex(top.data_ptr<int64_t>()[i]);
  return std::get<0>(at::sort(idx, 1));
}

// TopKIndices' order, written out: NaN ranks as -inf, then larger score, then lower index.
bool Better(float a, int64_t i, float b, int64_t j) {
  const double x = std::isnan(a) ? -std::numeric_limits<double>::infinity() : a;
  const double y = std::isnan(b) ? -std::numeric_limits<double>::infinity() : b;
  return x > y || (x == y && i < j);
}

std::vector<float> SpecialValues() {
  const float tiny = std::numeric_limits<float>::denorm_min();
  const float big = std::numeric_limits<float>::max();
  return {-kInf, -big, -1.5f, -1.0f, -std::nextafter(1.0f, 0.0f), -tiny, -0.0f, 0.0f, tiny,
          std::numeric_limits<float>::min(), 1e-30f, 0.5f, 1.0f, std::nextafter(1.0f, 2.0f), big, kInf, kNaN, -kNaN};
}

TEST(CudaMathTopK, KeyOrderIsTheCpuTieRule) {
  std::vector<float> values = SpecialValues();
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 100.0f);
  for (int i = 0; i < 40; ++i) values.push_back(normal(rng));
  for (int i = 0; i < 10; ++i) values.push_back(std::round(normal(rng) / 50.0f));  // exact repeats
  const std::vector<int64_t> indices = {0, 1, 2, 1000, 65535, 123456789, 2147483646};
  int64_t checked = 0;
  for (float a : values) {
    for (float b : values) {
      for (int64_t i : indices) {
        for (int64_t j : indices) {
          if (i == j) continue;
          ASSERT_EQ(TopKKey(a, i) > TopKKey(b, j), Better(a, i, b, j))
              << "a=" << a << " i=" << i << " b=" << b << " j=" << j;
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 100000);
}

TEST(CudaMathTopK, KeyGivesBackItsIndex) {
  for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{31}, int64_t{4095}, int64_t{131071}, int64_t{2147483647}}) {
    for (float s : SpecialValues()) EXPECT_EQ(TopKKeyIndex(TopKKey(s, i)), i) << s;
  }
}

TEST(CudaMathTopK, KeyTopKKeepsTopKIndicesSet) {
  std::vector<std::vector<float>> rows = {
      {1, 1, 1, 1, 1, 1, 1, 1},                          // all equal
      {5, 3, 3, 3, 1, 3, 0, 3},                          // ties at the threshold
      {-kInf, kInf, -kInf, 2, kInf, -1, 0, -kInf},       // infinities
      {0.0f, -0.0f, -0.0f, 0.0f, -1e-45f, 1e-45f, 0, 0},  // signed zeros, denormals
      {kNaN, 1, kNaN, -kInf, 0, kNaN, -kInf, 2},          // NaN ranks as -inf (ties with it)
      {kNaN, kNaN, kNaN, kNaN, kNaN, kNaN, kNaN, kNaN},
  };
  for (size_t r = 0; r < rows.size(); ++r) {
    at::Tensor s = at::tensor(rows[r], at::kFloat).unsqueeze(0);
    for (int64_t k = 0; k <= 9; ++k) {
      ASSERT_TRUE(KeyTopK(s, k).equal(TopKIndices(s, k))) << "row " << r << " k " << k;
    }
  }
  // Ragged lengths and many exact repeats, several rows at once.
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> coarse(-3, 3);
  for (int64_t n : {1, 2, 33, 257, 1000}) {
    std::vector<float> v(4 * n);
    for (float& x : v) x = static_cast<float>(coarse(rng)) * 0.25f;
    at::Tensor s = at::tensor(v, at::kFloat).view({4, n});
    for (int64_t k : {int64_t{1}, n / 3 + 1, n - 1, n, n + 5}) {
      ASSERT_TRUE(KeyTopK(s, k).equal(TopKIndices(s, k))) << "n " << n << " k " << k;
    }
  }
}

// ---- RoPE ----

std::vector<int64_t> Positions() { return {0, 1, 2, 7, 255, 1000, 4096, 16777217, 131071, 1000003}; }

TEST(CudaMathRope, AngleIsTheCpuAngle) {
  for (auto [d, theta] : {std::pair<int, double>{64, 10000.0}, {128, 500000.0}, {8, 10000.0}}) {
    at::Tensor inv = RopeInvFreq(d, theta);
    const std::vector<int64_t> pos = Positions();
    at::Tensor cpu = at::tensor(pos, at::kLong).to(at::kFloat).unsqueeze(1) * inv.unsqueeze(0);  // rope.cc's angles
    for (size_t p = 0; p < pos.size(); ++p) {
      for (int i = 0; i < d / 2; ++i) {
        ASSERT_EQ(RopeAngle(pos[p], inv[i].item<float>()), cpu[p][i].item<float>()) << "pos " << pos[p] << " i " << i;
      }
    }
  }
}

float UlpDistance(float a, float b) {
  if (a == b) return 0.0f;
  return std::fabs(a - b) / std::fabs(std::nextafter(a, kInf) - a);
}

TEST(CudaMathRope, CosSinWithinOneUlpOfLibTorch) {
  const int d = 128;
  at::Tensor inv = RopeInvFreq(d, 500000.0);
  const std::vector<int64_t> pos = Positions();
  at::Tensor cos, sin;
  RopeTables(pos, inv, at::kCPU, &cos, &sin);
  int64_t equal = 0, total = 0;
  for (size_t p = 0; p < pos.size(); ++p) {
    for (int i = 0; i < d / 2; ++i) {
      float c, s;
      RopeCosSin(pos[p], inv[i].item<float>(), &c, &s);
      const float cc = cos[p][i].item<float>(), ss = sin[p][i].item<float>();
      ASSERT_LE(UlpDistance(c, cc), 1.0f) << "cos pos " << pos[p] << " i " << i << ": " << c << " vs " << cc;
      ASSERT_LE(UlpDistance(s, ss), 1.0f) << "sin pos " << pos[p] << " i " << i << ": " << s << " vs " << ss;
      equal += (c == cc) + (s == ss);
      total += 2;
    }
  }
  EXPECT_GT(equal, total * 9 / 10) << equal << " of " << total << " cos/sin values equal LibTorch's";
}

TEST(CudaMathRope, RotationWithLibTorchTablesIsApplyRopeBitForBit) {
  const int d = 64;
  at::Tensor inv = RopeInvFreq(d, 10000.0);
  const std::vector<int64_t> pos = Positions();
  const int64_t n = static_cast<int64_t>(pos.size());
  at::Generator gen = at::detail::createCPUGenerator(3);
  at::Tensor x = at::randn({3, n, d}, gen, at::TensorOptions().dtype(at::kFloat)) * 4.0;
  at::Tensor want = ApplyRope(x, pos, inv);
  at::Tensor cos, sin;
  RopeTables(pos, inv, at::kCPU, &cos, &sin);
  at::Tensor got = at::empty_like(x);
  for (int64_t h = 0; h < 3; ++h) {
    for (int64_t p = 0; p < n; ++p) {
      for (int i = 0; i < d / 2; ++i) {
        float o1, o2;
        RopeRotate(x[h][p][i].item<float>(), x[h][p][i + d / 2].item<float>(), cos[p][i].item<float>(),
                   sin[p][i].item<float>(), &o1, &o2);
        got[h][p][i] = o1;
        got[h][p][i + d / 2] = o2;
      }
    }
  }
  EXPECT_TRUE(got.equal(want)) << "max |diff| " << (got - want).abs().max().item<float>();
}

TEST(CudaMathRope, DeviceRotationNearFloat64) {
  const int d = 128;
  at::Tensor inv = RopeInvFreq(d, 10000.0);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  double worst = 0.0;
  for (int64_t p : Positions()) {
    for (int i = 0; i < d / 2; ++i) {
      const float x1 = normal(rng), x2 = normal(rng);
      float c, s, o1, o2;
      RopeCosSin(p, inv[i].item<float>(), &c, &s);
      RopeRotate(x1, x2, c, s, &o1, &o2);
      const double a = RopeAngle(p, inv[i].item<float>());  // the float32 angle, exactly
      const double r1 = x1 * std::cos(a) - x2 * std::sin(a), r2 = x2 * std::cos(a) + x1 * std::sin(a);
      const double scale = std::max(std::fabs(x1), std::fabs(x2));
      worst = std::max({worst, std::fabs(o1 - r1) / scale, std::fabs(o2 - r2) / scale});
    }
  }
  EXPECT_LT(worst, 4e-7) << "rotation error relative to the pair's magnitude";
}

// ---- visibility ----

TEST(CudaMathVisibility, CausalRuleAndWindow) {
  EXPECT_TRUE(KeyVisible(5, 5, 0));
  EXPECT_TRUE(KeyVisible(0, 5, 0));
  EXPECT_FALSE(KeyVisible(6, 5, 0));
  EXPECT_TRUE(KeyVisible(3, 5, 3));   // 5 - 3 = 2 < 3
  EXPECT_FALSE(KeyVisible(2, 5, 3));  // 5 - 2 = 3 is outside a window of 3
  EXPECT_FALSE(KeyVisible(6, 5, 3));
}

// ---- online softmax ----

double Lse64(const std::vector<float>& x) {
  double mx = -std::numeric_limits<double>::infinity();
  for (float v : x) mx = std::max(mx, static_cast<double>(v));
  if (mx == -std::numeric_limits<double>::infinity()) return std::numeric_limits<double>::infinity();
  double sum = 0.0;
  for (float v : x) sum += std::exp(v - mx);
  return mx + std::log(sum);
}

TEST(CudaMathSoftmax, OnlineLseAndMergedSplitsMatchFloat64) {
  std::mt19937 rng(13);
  std::normal_distribution<float> normal(0.0f, 30.0f);  // large logits: many rescales
  std::vector<float> x(3000);
  for (float& v : x) v = normal(rng);
  x[17] = -kInf;
  x[2000] = -kInf;
  SoftmaxState one;
  float alpha;
  for (float v : x) one.Add(v, &alpha);
  const double want = Lse64(x);
  EXPECT_NEAR(one.Lse(), want, 1e-6 * std::fabs(want) + 1e-6);
  for (int64_t split : {1, 7, 512, 2999}) {
    SoftmaxState merged;
    for (int64_t s = 0; s < NumSplits(static_cast<int64_t>(x.size()), split); ++s) {
      SoftmaxState part;
      for (int64_t j = s * split; j < std::min<int64_t>((s + 1) * split, x.size()); ++j) part.Add(x[j], &alpha);
      float a, b;
      merged.Merge(part, &a, &b);
      ASSERT_FALSE(std::isnan(a) || std::isnan(b));
    }
    EXPECT_NEAR(merged.Lse(), want, 1e-6 * std::fabs(want) + 1e-6) << "split " << split;
  }
}

TEST(CudaMathSoftmax, EmptyStatesGiveZerosNeverNaN) {
  SoftmaxState empty;
  EXPECT_EQ(empty.Lse(), kInf);
  EXPECT_EQ(ProbFromLse(1.0f, empty.Lse()), 0.0f);
  EXPECT_EQ(ProbFromLse(-kInf, 3.0f), 0.0f);
  float alpha;
  EXPECT_EQ(empty.Add(-kInf, &alpha), 0.0f);  // an invisible key changes nothing
  EXPECT_EQ(alpha, 1.0f);
  EXPECT_EQ(empty.l, 0.0f);
  SoftmaxState other;
  float a = -1, b = -1;
  empty.Merge(other, &a, &b);
  EXPECT_EQ(a, 0.0f);
  EXPECT_EQ(b, 0.0f);
  EXPECT_EQ(empty.l, 0.0f);
  SoftmaxState seen;
  seen.Add(2.0f, &alpha);
  EXPECT_EQ(alpha, 0.0f);  // the first logit rescales the (empty) sums by 0
  empty.Merge(seen, &a, &b);
  EXPECT_EQ(a, 0.0f);
  EXPECT_EQ(b, 1.0f);
  EXPECT_EQ(empty.Lse(), 2.0f);
}

// The decode kernel's structure on the host (kernels/cuda/decode_attention.cu): one
// (row, group), splits of `split` keys, 4 "warps" per split taking every 4th key, each
// with an online state and output per head; warps merged in warp order, then splits in
// split order. Output [r, d].
std::vector<float> DecodeModel(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                               const std::vector<int64_t>& kpos, int64_t qpos, int64_t window, int64_t n, int64_t r,
                               int64_t d, float scale, int64_t split) {
  struct Acc {
    SoftmaxState st;
    std::vector<float> o;
  };
  std::vector<float> out(r * d, 0.0f);
  for (int64_t h = 0; h < r; ++h) {
    SoftmaxState total;
    std::vector<float> total_o(d, 0.0f);
    for (int64_t s = 0; s < NumSplits(n, split); ++s) {
      SoftmaxState split_st;
      std::vector<float> split_o(d, 0.0f);
      for (int w = 0; w < 4; ++w) {
        Acc acc{SoftmaxState(), std::vector<float>(d, 0.0f)};
        for (int64_t j = s * split + w; j < std::min(n, (s + 1) * split); j += 4) {
          float dot = 0.0f;
          for (int64_t t = 0; t < d; ++t) dot += (q[h * d + t] * scale) * k[j * d + t];
          const float logit = window > 0 && !KeyVisible(kpos[j], qpos, window) ? -kInf : dot;
          float alpha;
          const float p = acc.st.Add(logit, &alpha);
          for (int64_t t = 0; t < d; ++t) acc.o[t] = acc.o[t] * alpha + p * v[j * d + t];
        }
        float a, b;
        split_st.Merge(acc.st, &a, &b);
        for (int64_t t = 0; t < d; ++t) split_o[t] = split_o[t] * a + acc.o[t] * b;
      }
      float a, b;
      total.Merge(split_st, &a, &b);
      for (int64_t t = 0; t < d; ++t) total_o[t] = total_o[t] * a + split_o[t] * b;
    }
    for (int64_t t = 0; t < d; ++t) out[h * d + t] = total.l > 0.0f ? total_o[t] / total.l : 0.0f;
  }
  return out;
}

TEST(CudaMathSoftmax, DecodeSplitStructureMatchesCausalAttention) {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  struct Case {
    int64_t r, d, n, split, window;
  };
  for (const Case& c : {Case{1, 8, 0, 4, 0}, Case{2, 8, 1, 4, 0}, Case{4, 64, 37, 512, 0}, Case{8, 128, 3 * 16 + 5, 16, 0},
                        Case{3, 16, 100, 7, 0}, Case{4, 64, 200, 32, 50}}) {
    const int64_t H = c.r, G = 1, d = c.d, n = c.n;
    std::vector<float> q(H * d), k(std::max<int64_t>(n, 1) * d), v(std::max<int64_t>(n, 1) * d);
    for (float& x : q) x = normal(rng) * 2.0f;
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    std::vector<int64_t> kpos(n);
    for (int64_t j = 0; j < n; ++j) kpos[j] = 2 * j;  // a compact cache: gaps between positions
    const int64_t qpos = 2 * n + 1;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    const std::vector<float> got = DecodeModel(q, k, v, kpos, qpos, c.window, n, c.r, d, scale, c.split);
    std::vector<float> want(H * d, -1.0f);
    if (n > 0) {
      CausalAttentionArgs a;
      a.num_heads = H;
      a.num_kv_heads = G;
      a.head_dim = d;
      a.q = q.data();
      a.q_row_stride = H * d;
      a.q_head_stride = d;
      a.m = 1;
      a.q_positions = &qpos;
      a.k = k.data();
      a.v = v.data();
      a.kv_group_stride = n * d;
      a.n = n;
      const int64_t* kp = kpos.data();
      a.key_positions = &kp;
      a.sliding_window = c.window;
      a.scale = scale;
      a.out = want.data();
      a.out_row_stride = H * d;
      a.out_head_stride = d;
      CausalAttention(a, 0, CausalAttentionWorkItems(a));
    } else {
      std::fill(want.begin(), want.end(), 0.0f);
    }
    for (int64_t i = 0; i < H * d; ++i) {
      ASSERT_NEAR(got[i], want[i], 2e-5f * (1.0f + std::fabs(want[i]))) << "r " << c.r << " d " << d << " n " << n << " i " << i;
    }
  }
}

// The scoring kernels' two passes on the host (kernels/cuda/score.cu): pass 1 an online
// state per row over key splits, merged in order; pass 2 the probabilities per key.
at::Tensor ScoreModel(const at::Tensor& queries, const at::Tensor& keys, const std::vector<int64_t>& qpos,
                      const at::Tensor& kpos, int64_t split) {
  const int64_t H = queries.size(0), nq = queries.size(1), d = queries.size(2), G = keys.size(0), L = keys.size(1);
  const int64_t r = H / G;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  auto q = queries.accessor<float, 3>();
  auto k = keys.accessor<float, 3>();
  auto logit = [&](int64_t h, int64_t i, int64_t j) {
    if (!qpos.empty() && kpos[h / r][j].item<int64_t>() > qpos[i]) return -kInf;
    float dot = 0.0f;
    for (int64_t t = 0; t < d; ++t) dot += (q[h][i][t] * scale) * k[h / r][j][t];
    return dot;
  };
  at::Tensor out = at::zeros({H, L}, at::kFloat);
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t i = 0; i < nq; ++i) {
      SoftmaxState total;
      for (int64_t s = 0; s < NumSplits(L, split); ++s) {
        SoftmaxState part;
        float alpha;
        for (int64_t j = s * split; j < std::min(L, (s + 1) * split); ++j) part.Add(logit(h, i, j), &alpha);
        float a, b;
        total.Merge(part, &a, &b);
      }
      const float lse = total.Lse();
      for (int64_t j = 0; j < L; ++j) out[h][j] += ProbFromLse(logit(h, i, j), lse);
    }
  }
  return out;
}

TEST(CudaMathSoftmax, TwoPassScoreStructureMatchesAttentionScores) {
  at::Generator gen = at::detail::createCPUGenerator(19);
  const at::TensorOptions f32 = at::TensorOptions().dtype(at::kFloat);
  at::Tensor queries = at::randn({4, 6, 16}, gen, f32) * 2.0;
  at::Tensor keys = at::randn({2, 45, 16}, gen, f32);
  // Causal: query i at position 30 + 3 i; group g's keys at ascending positions with gaps.
  std::vector<int64_t> qpos;
  for (int64_t i = 0; i < 6; ++i) qpos.push_back(30 + 3 * i);
  at::Tensor kpos = at::arange(45, at::kLong).mul(1).unsqueeze(0).repeat({2, 1});
  kpos[1] = at::arange(45, at::kLong).mul(2) - 20;
  ScoreOptions causal;
  causal.query_positions = at::tensor(qpos, at::kLong);
  causal.key_positions = kpos;
  for (int64_t split : {1, 8, 1024}) {
    for (bool use_causal : {false, true}) {
      at::Tensor got = ScoreModel(queries, keys, use_causal ? qpos : std::vector<int64_t>{}, kpos, split);
      at::Tensor want = AttentionScores(queries, keys, use_causal ? causal : ScoreOptions());
      const float err = (got - want).abs().max().item<float>() / want.abs().max().item<float>();
      EXPECT_LT(err, 1e-5f) << "split " << split << " causal " << use_causal;
    }
  }
}

}  // namespace
}  // namespace echokv::kernels
