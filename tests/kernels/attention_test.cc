// The fused causal attention kernel against a float64 softmax written out naively,
// for every instruction set this CPU has (avx512, avx2, scalar): full prefills,
// compressed histories whose groups hold different positions, sliding windows, GQA
// ratios 1..8, head dims that are and are not multiples of the vector width, ragged
// block edges, large scores (the online softmax's rescaling), both memory layouts the
// model uses, and item ranges split across calls.
#include "kernels/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace echokv::kernels {
namespace {

struct Problem {
  int64_t H = 8, G = 4, d = 8, m = 1, n = 1, window = 0;
  float scale = 0;
  std::vector<float> q;                     // [m, H, d]
  std::vector<int64_t> qpos;                // [m]
  std::vector<float> k, v;                  // [G, n, d]
  std::vector<std::vector<int64_t>> kpos;   // [G][n]
};

// Keys: group g holds n ascending positions drawn from [0, history) (a compressed
// cache: every group its own), then the m new positions history .. history+m-1
// (the chunk's own entries), as a prefill chunk after a compression sees them.
Problem MakeProblem(int64_t H, int64_t G, int64_t d, int64_t m, int64_t history, int64_t kept, int64_t window,
                    uint32_t seed, float magnitude = 1.0f) {
  Problem p;
  p.H = H;
  p.G = G;
  p.d = d;
  p.m = m;
  p.window = window;
  p.scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, magnitude);
  p.n = kept + m;
  p.kpos.assign(G, {});
  for (int64_t g = 0; g < G; ++g) {
    std::vector<int64_t> all(history);
    for (int64_t i = 0; i < history; ++i) all[i] = i;
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(kept);
    std::sort(all.begin(), all.end());
    for (int64_t i = 0; i < m; ++i) all.push_back(history + i);
    p.kpos[g] = all;
  }
  for (int64_t i = 0; i < m; ++i) p.qpos.push_back(history + i);
  p.q.resize(m * H * d);
  p.k.resize(G * p.n * d);
  p.v.resize(G * p.n * d);
  for (float& x : p.q) x = normal(rng);
  for (float& x : p.k) x = normal(rng);
  for (float& x : p.v) x = normal(rng) / magnitude;
  return p;
}

// out[i, h, :] in float64 straight from the definition.
std::vector<double> Reference(const Problem& p) {
  const int64_t r = p.H / p.G;
  std::vector<double> out(p.m * p.H * p.d, 0.0);
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t h = 0; h < p.H; ++h) {
      const int64_t g = h / r;
      std::vector<double> logit(p.n, -INFINITY);
      double mx = -INFINITY;
      for (int64_t j = 0; j < p.n; ++j) {
        const int64_t kp = p.kpos[g][j];
        if (kp > p.qpos[i] || (p.window > 0 && p.qpos[i] - kp >= p.window)) continue;
        double dot = 0;
        for (int64_t t = 0; t < p.d; ++t) {
          dot += static_cast<double>(p.q[(i * p.H + h) * p.d + t]) * p.k[(g * p.n + j) * p.d + t];
        }
        logit[j] = dot * static_cast<double>(p.scale);
        mx = std::max(mx, logit[j]);
      }
      if (mx == -INFINITY) continue;  // sees nothing: zeros
      double den = 0;
      for (int64_t j = 0; j < p.n; ++j) den += logit[j] == -INFINITY ? 0.0 : std::exp(logit[j] - mx);
      for (int64_t j = 0; j < p.n; ++j) {
        if (logit[j] == -INFINITY) continue;
        const double w = std::exp(logit[j] - mx) / den;
        for (int64_t t = 0; t < p.d; ++t) out[(i * p.H + h) * p.d + t] += w * p.v[(g * p.n + j) * p.d + t];
      }
    }
  }
  return out;
}

enum class Layout { kRowMajor, kHeadMajor };  // [m, H, d] (Forward's qkv rows) or [H, m, d]

// Runs the kernel; `splits` cuts the item range into that many calls.
std::vector<float> RunKernel(const Problem& p, Layout layout, int splits = 1) {
  std::vector<float> q(p.q.size());
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t h = 0; h < p.H; ++h) {
      for (int64_t t = 0; t < p.d; ++t) {
        const int64_t dst = layout == Layout::kRowMajor ? (i * p.H + h) * p.d + t : (h * p.m + i) * p.d + t;
        q[dst] = p.q[(i * p.H + h) * p.d + t];
      }
    }
  }
  std::vector<const int64_t*> kpos;
  for (const auto& g : p.kpos) kpos.push_back(g.data());
  std::vector<float> out(p.m * p.H * p.d, -7.0f);  // every element must be written
  CausalAttentionArgs a;
  a.num_heads = p.H;
  a.num_kv_heads = p.G;
  a.head_dim = p.d;
  a.q = q.data();
  a.q_row_stride = layout == Layout::kRowMajor ? p.H * p.d : p.d;
  a.q_head_stride = layout == Layout::kRowMajor ? p.d : p.m * p.d;
  a.m = p.m;
  a.q_positions = p.qpos.data();
  a.k = p.k.data();
  a.v = p.v.data();
  a.kv_group_stride = p.n * p.d;
  a.n = p.n;
  a.key_positions = kpos.data();
  a.sliding_window = p.window;
  a.scale = p.scale;
  a.out = out.data();
  a.out_row_stride = p.H * p.d;
  a.out_head_stride = p.d;
  const int64_t items = CausalAttentionWorkItems(a);
  EXPECT_GT(items, 0);
  for (int s = 0; s < splits; ++s) CausalAttention(a, items * s / splits, items * (s + 1) / splits);
  return out;
}

// Max |a - b| / max(1, max |b|): float32 accumulation over n keys against float64.
double RelDiff(const std::vector<float>& a, const std::vector<double>& b) {
  double m = 0, scale = 1.0;
  for (size_t i = 0; i < b.size(); ++i) {
    m = std::max(m, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return m / scale;
}

// 1e-5 of the output scale (~170 float32 ulps): the kernel sums up to a few thousand
// products in float32 in an order of its own and exponentiates with a polynomial
// (~2e-7 relative); a wrong mask, a missed rescale or a dropped block is >= 1e-2.
constexpr double kTol = 1e-5;

class AttentionKernelTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(SetAttentionIsa(GetParam()));
    ASSERT_EQ(AttentionIsa(), GetParam());
  }
  void TearDown() override { SetAttentionIsa("auto"); }
};

TEST_P(AttentionKernelTest, FullPrefillMatchesFloat64) {
  struct Shape {
    int64_t H, G, d, m;
  };
  // stories260K (8/4 heads, d 8), the 40M bench model (8/4, d 64), MHA d 128,
  // GQA 8:1, head dims 12 (4-wide vectors only) and 5 (scalar lanes), one head.
  for (const Shape& s : {Shape{8, 4, 8, 70}, Shape{8, 4, 64, 130}, Shape{4, 4, 128, 65}, Shape{8, 1, 16, 33},
                         Shape{6, 2, 12, 40}, Shape{2, 1, 5, 17}, Shape{1, 1, 64, 1}}) {
    SCOPED_TRACE(testing::Message() << "H " << s.H << " G " << s.G << " d " << s.d << " m " << s.m);
    const Problem p = MakeProblem(s.H, s.G, s.d, s.m, /*history=*/0, /*kept=*/0, /*window=*/0, 11);
    EXPECT_LT(RelDiff(RunKernel(p, Layout::kRowMajor), Reference(p)), kTol);
    EXPECT_LT(RelDiff(RunKernel(p, Layout::kHeadMajor), Reference(p)), kTol);
  }
}

TEST_P(AttentionKernelTest, CompressedHistoryWithPerGroupPositions) {
  // A chunk of new tokens against a history whose groups each kept their own
  // positions; key counts on and off the 64-key block edges.
  for (int64_t kept : {1, 63, 64, 65, 300}) {
    for (int64_t m : {1, 31, 64, 100}) {
      SCOPED_TRACE(testing::Message() << "kept " << kept << " m " << m);
      const Problem p = MakeProblem(8, 4, 64, m, /*history=*/kept * 3, kept, /*window=*/0, 100 + kept + m);
      EXPECT_LT(RelDiff(RunKernel(p, Layout::kRowMajor), Reference(p)), kTol);
    }
  }
}

TEST_P(AttentionKernelTest, SlidingWindow) {
  // Windows shorter than a block, than the chunk, and longer than everything (Mistral).
  for (int64_t window : {1, 5, 64, 100, 5000}) {
    SCOPED_TRACE(testing::Message() << "window " << window);
    const Problem p = MakeProblem(8, 2, 32, /*m=*/90, /*history=*/400, /*kept=*/400, window, 7 + window);
    EXPECT_LT(RelDiff(RunKernel(p, Layout::kRowMajor), Reference(p)), kTol);
    const Problem fresh = MakeProblem(4, 2, 8, /*m=*/150, 0, 0, window, 9 + window);
    EXPECT_LT(RelDiff(RunKernel(fresh, Layout::kHeadMajor), Reference(fresh)), kTol);
  }
}

TEST_P(AttentionKernelTest, LargeScoresNeedTheOnlineRescale) {
  // |q.k| * scale in the hundreds: exp overflows float32 without the running max, and
  // the maximum moves between key blocks.
  const Problem p = MakeProblem(4, 2, 64, 80, 500, 250, 0, 5, /*magnitude=*/6.0f);
  EXPECT_LT(RelDiff(RunKernel(p, Layout::kRowMajor), Reference(p)), kTol);
}

TEST_P(AttentionKernelTest, QueryThatSeesNoKeyGetsZeros) {
  Problem p = MakeProblem(2, 1, 8, 3, 10, 10, 0, 3);
  p.qpos = {-5, -1, 4};  // the first two precede every key
  const std::vector<float> out = RunKernel(p, Layout::kRowMajor);
  for (int64_t i = 0; i < 2 * 2 * 8; ++i) EXPECT_EQ(out[i], 0.0f) << i;
  EXPECT_LT(RelDiff(out, Reference(p)), kTol);
}

TEST_P(AttentionKernelTest, SplitItemRangesGiveTheSameBits) {
  const Problem p = MakeProblem(8, 4, 64, 200, 300, 120, 0, 21);
  const std::vector<float> one = RunKernel(p, Layout::kRowMajor, 1);
  EXPECT_EQ(RunKernel(p, Layout::kRowMajor, 3), one);
  EXPECT_EQ(RunKernel(p, Layout::kRowMajor, 7), one);
}

// Every build this CPU can run (a CPU without AVX-512 tests the other two; nothing is
// skipped). On x86-64 the scalar and AVX2 builds always run; AutoPicksTheWidest below
// checks that an AVX-512 CPU gets that build.
std::vector<std::string> SupportedIsas() {
  std::vector<std::string> isas;
  for (const char* isa : {"avx512", "avx2", "scalar"}) {
    if (SetAttentionIsa(isa)) isas.push_back(isa);
  }
  SetAttentionIsa("auto");
  return isas;
}

INSTANTIATE_TEST_SUITE_P(Isa, AttentionKernelTest, ::testing::ValuesIn(SupportedIsas()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

TEST(AttentionKernelIsa, AutoPicksTheWidest) {
  ASSERT_TRUE(SetAttentionIsa("auto"));
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  EXPECT_EQ(AttentionIsa(), avx512 ? "avx512" : avx2 ? "avx2" : "scalar");
#else
  EXPECT_EQ(AttentionIsa(), "scalar");
#endif
}

TEST(AttentionKernelIsa, UnknownIsaIsRefused) {
  const std::string before = AttentionIsa();
  EXPECT_FALSE(SetAttentionIsa("sse9"));
  EXPECT_EQ(AttentionIsa(), before);
  EXPECT_TRUE(SetAttentionIsa("scalar"));
  EXPECT_EQ(AttentionIsa(), "scalar");
  EXPECT_TRUE(SetAttentionIsa("auto"));
}

}  // namespace
}  // namespace echokv::kernels
