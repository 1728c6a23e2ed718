// Decode attention over an int8 cache (kernels/attention_int8.h), for every instruction
// set this CPU has, against two float64 references:
//  1. the same attention on the dequantized cache and the dequantized int8 query: only
//     the kernel's float rounding differs (tolerance below, ~1e-6 relative);
//  2. the float32 cache it was quantized from, with the bound the quantization steps
//     give (derivation at QuantizationBound);
// and the AVX2 build against the scalar one bit for bit; keys per token and per channel
// block (Int8KeyScaling). Shapes: head dims 64 and 128
// (AVX2) and 8 (scalar fallback), GQA 1-4 heads per group, lengths 1 to 1,000 (ragged
// edges of the 8-key and 64-key blocks), sliding windows and invisible entries, an
// all-zero token, a single huge outlier key.
#include "kernels/attention_int8.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu_isa.h"
#include "kernels/kv_quant.h"

namespace echokv::kernels {
namespace {

struct Cache {
  int64_t H = 0, G = 0, d = 0, n = 0, qpos = 0, window = 0;
  std::vector<float> q, k, v;              // float32 originals: q [H, d], k/v [G, n, d]
  std::vector<int8_t> kq, vq;              // [G, n, d]
  std::vector<float> ks, vs;               // [G, n]; ks [G, blocks, d] per channel block
  std::vector<std::vector<int64_t>> kpos;  // [G][n]
  bool per_channel = false;                // keys per channel block (else per token)
  int64_t KeyScaleStride() const { return per_channel ? Blocks() * d : n; }
  int64_t Blocks() const { return (n + kInt8KeyBlock - 1) / kInt8KeyBlock; }
  // Key j of group g's scale of channel i.
  double KeyScale(int64_t g, int64_t j, int64_t i) const {
    return per_channel ? ks[g * KeyScaleStride() + (j / kInt8KeyBlock) * d + i] : ks[g * n + j];
  }
};

// Keys with outlier channels (a few 10x the rest, as real models' keys have), values
// N(0, 1), positions 0..n-1 (or a spread-out compressed history), the query at qpos.
Cache MakeCache(int64_t H, int64_t G, int64_t d, int64_t n, uint32_t seed, float key_scale = 1.0f) {
  Cache c;
  c.H = H;
  c.G = G;
  c.d = d;
  c.n = n;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  c.q.resize(H * d);
  c.k.resize(G * n * d);
  c.v.resize(G * n * d);
  for (int64_t i = 0; i < H * d; ++i) c.q[i] = normal(rng) * ((i % d) % 13 == 5 ? 4.0f : 1.0f);
  for (int64_t i = 0; i < G * n * d; ++i) {
    c.k[i] = key_scale * normal(rng) * ((i % d) % 13 == 5 ? 10.0f : 1.0f);
    c.v[i] = normal(rng);
  }
  c.kpos.assign(G, std::vector<int64_t>(n));
  for (int64_t g = 0; g < G; ++g) {
    int64_t p = 0;
    for (int64_t j = 0; j < n; ++j) c.kpos[g][j] = p += 1 + (g * j) % 3;
  }
  c.qpos = 1;
  for (const auto& kp : c.kpos) c.qpos = std::max(c.qpos, kp.empty() ? 0 : kp.back());
  return c;
}

void Quantize(Cache& c) {
  c.kq.resize(c.G * c.n * c.d);
  c.vq.resize(c.G * c.n * c.d);
  c.ks.resize(c.G * c.KeyScaleStride());
  c.vs.resize(c.G * c.n);
  if (c.per_channel) {
    for (int64_t g = 0; g < c.G; ++g) {
      QuantizeChannelBlocksInt8(c.k.data() + g * c.n * c.d, c.n, c.d, kInt8KeyBlock, c.kq.data() + g * c.n * c.d,
                                c.ks.data() + g * c.KeyScaleStride());
    }
  } else {
    QuantizeRowsInt8(c.k.data(), c.G * c.n, c.d, c.kq.data(), c.ks.data());
  }
  QuantizeRowsInt8(c.v.data(), c.G * c.n, c.d, c.vq.data(), c.vs.data());
}

std::vector<float> RunKernel(const Cache& c, int64_t split = 1) {
  std::vector<const int64_t*> kp(c.G);
  for (int64_t g = 0; g < c.G; ++g) kp[g] = c.kpos[g].data();
  DecodeAttentionInt8Args a;
  a.num_heads = c.H;
  a.num_kv_heads = c.G;
  a.head_dim = c.d;
  a.q = c.q.data();
  a.q_head_stride = c.d;
  a.q_position = c.qpos;
  a.k = c.kq.data();
  a.k_scales = c.ks.data();
  a.v = c.vq.data();
  a.v_scales = c.vs.data();
  a.kv_group_stride = c.n * c.d;
  a.key_scaling = c.per_channel ? Int8KeyScaling::kPerChannelBlock : Int8KeyScaling::kPerToken;
  a.k_scale_group_stride = c.KeyScaleStride();
  a.v_scale_group_stride = c.n;
  a.n = c.n;
  a.key_positions = kp.data();
  a.sliding_window = c.window;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  std::vector<float> out(c.H * c.d, -7.0f);
  a.out = out.data();
  a.out_head_stride = c.d;
  const int64_t items = DecodeAttentionInt8WorkItems(a);
  EXPECT_EQ(items, c.G);
  for (int64_t s = 0; s < split; ++s) DecodeAttentionInt8(a, items * s / split, items * (s + 1) / split);
  return out;
}

bool Visible(const Cache& c, int64_t kp) { return kp <= c.qpos && (c.window <= 0 || c.qpos - kp < c.window); }

struct Reference {
  std::vector<double> out;      // [H, d]
  std::vector<double> logits;   // [H, n] (visible ones)
  std::vector<double> p;        // [H, n]
};

// Float64 softmax attention over values v [G, n, d] with the logits
// scale * dot(h, j) (h a query head, j an entry of its group).
Reference Attend(const Cache& c, const std::function<double(int64_t, int64_t)>& dot, const std::vector<double>& v) {
  const int64_t r = c.H / c.G, d = c.d, n = c.n;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  Reference ref;
  ref.out.assign(c.H * d, 0.0);
  ref.logits.assign(c.H * n, -INFINITY);
  ref.p.assign(c.H * n, 0.0);
  for (int64_t h = 0; h < c.H; ++h) {
    const int64_t g = h / r;
    double mx = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
      if (!Visible(c, c.kpos[g][j])) continue;
      const double s = dot(h, j);
      ref.logits[h * n + j] = s * scale;
      mx = std::max(mx, s * scale);
    }
    if (mx == -INFINITY) continue;
    double den = 0;
    for (int64_t j = 0; j < n; ++j) {
      if (Visible(c, c.kpos[g][j])) den += ref.p[h * n + j] = std::exp(ref.logits[h * n + j] - mx);
    }
    for (int64_t j = 0; j < n; ++j) {
      ref.p[h * n + j] /= den;
      for (int64_t i = 0; i < d; ++i) ref.out[h * d + i] += ref.p[h * n + j] * v[(g * n + j) * d + i];
    }
  }
  return ref;
}

std::vector<double> ToDouble(const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); }

std::vector<double> Dequantized(const std::vector<int8_t>& q, const std::vector<float>& s, int64_t d) {
  std::vector<double> x(q.size());
  for (size_t i = 0; i < q.size(); ++i) x[i] = static_cast<double>(s[i / d]) * q[i];
  return x;
}

// The query the kernel multiplies with, two int8 halves per element: hi =
// QuantizeRowsInt8's (scale s), lo = round((x / s - hi) * 254), i.e. 254 hi + lo in
// steps of s / 254; per head for keys per token, per head and block of the query scaled
// by the block's key scales for keys per channel block. q [H, blocks, d] (254 hi + lo),
// scales [H, blocks] (s / 254; one block for keys per token).
struct QueryInt8 {
  std::vector<int32_t> q;
  std::vector<double> scales;
  int64_t blocks = 1;
};
QueryInt8 QuantizedQuery(const Cache& c) {
  QueryInt8 out;
  out.blocks = c.per_channel ? c.Blocks() : 1;
  out.q.resize(c.H * out.blocks * c.d);
  out.scales.resize(c.H * out.blocks);
  const int64_t r = c.H / c.G;
  std::vector<float> scaled(c.d);
  for (int64_t h = 0; h < c.H; ++h) {
    for (int64_t b = 0; b < out.blocks; ++b) {
      for (int64_t i = 0; i < c.d; ++i) {
        scaled[i] = c.q[h * c.d + i] * (c.per_channel ? c.ks[(h / r) * c.KeyScaleStride() + b * c.d + i] : 1.0f);
      }
      std::vector<int8_t> hi(c.d);
      float sc;
      QuantizeRowsInt8(scaled.data(), 1, c.d, hi.data(), &sc);
      for (int64_t i = 0; i < c.d; ++i) {
        const float rest = sc > 0 ? scaled[i] / sc - hi[i] : 0.0f;
        const int32_t lo = static_cast<int32_t>(std::clamp(std::nearbyint(rest * 254.0f), -127.0f, 127.0f));
        out.q[(h * out.blocks + b) * c.d + i] = 254 * hi[i] + lo;
      }
      out.scales[h * out.blocks + b] = sc / 254.0;
    }
  }
  return out;
}

// The logit the kernel computes, in float64: the int8 query times the int8 key, scaled.
std::function<double(int64_t, int64_t)> QuantizedDot(const Cache& c, const QueryInt8& qq) {
  return [&c, &qq](int64_t h, int64_t j) {
    const int64_t g = h / (c.H / c.G), b = c.per_channel ? j / kInt8KeyBlock : 0;
    double dot = 0;
    for (int64_t i = 0; i < c.d; ++i) {
      dot += static_cast<double>(qq.q[(h * qq.blocks + b) * c.d + i]) * c.kq[(g * c.n + j) * c.d + i];
    }
    return dot * qq.scales[h * qq.blocks + b] * (c.per_channel ? 1.0 : c.ks[g * c.n + j]);
  };
}

// Reference 1: the kernel's float32 rounding only. Scores: the exact integer dot times
// two rounded products (relative 2^-23); exp by exp2_poly (2e-7 relative); the sum of
// n rounded fma's per channel: n * 2^-24 * sum_j w_j |v_jc| <= n * 2^-24 * max|v_c|.
void ExpectMatchesDequantized(const Cache& c, const std::vector<float>& out, const std::string& what) {
  const QueryInt8 qq = QuantizedQuery(c);
  const Reference ref = Attend(c, QuantizedDot(c, qq), Dequantized(c.vq, c.vs, c.d));
  const int64_t r = c.H / c.G;
  for (int64_t h = 0; h < c.H; ++h) {
    const int64_t g = h / r;
    double max_logit = 0, max_v = 0;
    for (int64_t j = 0; j < c.n; ++j) {
      if (!Visible(c, c.kpos[g][j])) continue;
      max_logit = std::max(max_logit, std::fabs(ref.logits[h * c.n + j]));
      for (int64_t i = 0; i < c.d; ++i) {
        max_v = std::max(max_v, std::fabs(static_cast<double>(c.vs[g * c.n + j]) * c.vq[(g * c.n + j) * c.d + i]));
      }
    }
    // A logit off by e changes every weight by a factor within exp(+-2e).
    // (the int32 dot to float, scale * s, / 254, * k scale, the product: 5 roundings)
    const double logit_err = 6 * std::ldexp(1.0, -23) * (1 + max_logit) + 4e-7;
    const double tol = max_v * (2 * logit_err + (c.n + 8) * std::ldexp(1.0, -23)) + 1e-30;
    for (int64_t i = 0; i < c.d; ++i) {
      ASSERT_NEAR(out[h * c.d + i], ref.out[h * c.d + i], tol) << what << " head " << h << " channel " << i;
    }
  }
}

// Reference 2: the float32 cache. Keys per token: with q^ = q + dq, k^ = k + dk,
// |dq_c| <= s_q / 2 (s_q: the query's step, s / 254) and |dk_c| <= s_k / 2
// (kv_quant.h), a logit moves by at most
//   D_j = scale * (s_q / 2 ||k_j||_1 + s_kj / 2 ||q||_1 + d s_q s_kj / 4).
// Keys per channel block b (scales s_c): the kernel's dot is q'^ . k8_j with q' = q * s,
// q'^ = q' + dq', |dq'_c| <= s_q'b / 2, and s_c k8_jc = k_jc + dk_jc, |dk_jc| <= s_c / 2:
//   q'^ . k8_j - q . k_j = q . dk_j + dq' . k8_j,
//   D_j = scale * (sum_c |q_c| s_c / 2 + s_q'b / 2 ||k8_j||_1).
// With D = max_j D_j every softmax weight moves by a factor within exp(+-2D), so
// |p^_j - p_j| <= p_j (exp(2D) - 1), and with |dv_jc| <= s_vj / 2:
//   |o^_c - o_c| <= (exp(2D) - 1) sum_j p_j |v_jc| + max_j s_vj / 2
// (plus the float rounding of reference 1 and the scales' own 2^-23 terms: 1% slack).
void ExpectWithinQuantizationBound(const Cache& c, const std::vector<float>& out, const std::string& what,
                                   double* worst_ratio) {
  const int64_t r = c.H / c.G, d = c.d, n = c.n;
  const Reference ref = Attend(
      c,
      [&c, r, d, n](int64_t h, int64_t j) {
        double s = 0;
        for (int64_t i = 0; i < d; ++i) s += static_cast<double>(c.q[h * d + i]) * c.k[((h / r) * n + j) * d + i];
        return s;
      },
      ToDouble(c.v));
  const QueryInt8 qq = QuantizedQuery(c);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (int64_t h = 0; h < c.H; ++h) {
    const int64_t g = h / r;
    double q1 = 0;
    for (int64_t i = 0; i < d; ++i) q1 += std::fabs(c.q[h * d + i]);
    double D = 0, max_sv = 0;
    for (int64_t j = 0; j < n; ++j) {
      if (!Visible(c, c.kpos[g][j])) continue;
      if (c.per_channel) {
        double qs_k = 0, k8 = 0;
        for (int64_t i = 0; i < d; ++i) {
          qs_k += std::fabs(c.q[h * d + i]) * c.KeyScale(g, j, i) / 2;
          k8 += std::abs(c.kq[(g * n + j) * d + i]);
        }
        const double sq = qq.scales[h * qq.blocks + j / kInt8KeyBlock];
        D = std::max(D, scale * (qs_k + sq / 2 * k8));
      } else {
        double k1 = 0;
        for (int64_t i = 0; i < d; ++i) k1 += std::fabs(c.k[(g * n + j) * d + i]);
        const double sk = c.ks[g * n + j], sq = qq.scales[h];
        D = std::max(D, scale * (sq / 2 * k1 + sk / 2 * q1 + d * sq * sk / 4));
      }
      max_sv = std::max(max_sv, static_cast<double>(c.vs[g * n + j]));
    }
    for (int64_t i = 0; i < d; ++i) {
      double pv = 0;
      for (int64_t j = 0; j < n; ++j) pv += ref.p[h * n + j] * std::fabs(c.v[(g * n + j) * d + i]);
      const double bound = 1.01 * (std::expm1(2 * D) * pv + max_sv / 2) + 1e-6;
      const double err = std::fabs(out[h * d + i] - ref.out[h * d + i]);
      ASSERT_LE(err, bound) << what << " head " << h << " channel " << i;
      *worst_ratio = std::max(*worst_ratio, err / bound);
    }
  }
}

std::vector<std::string> Isas() {
  std::vector<std::string> isas = {"scalar"};
  if (CpuRunsIsa("avx2")) isas.push_back("avx2");
  return isas;
}

// (instruction set, keys per channel block)
class AttentionInt8Test : public ::testing::TestWithParam<std::tuple<std::string, bool>> {
 protected:
  void SetUp() override { ASSERT_TRUE(SetDecodeAttentionInt8Isa(std::get<0>(GetParam()))); }
  bool PerChannel() const { return std::get<1>(GetParam()); }
  void TearDown() override { SetDecodeAttentionInt8Isa("auto"); }
};

TEST_P(AttentionInt8Test, MatchesBothReferences) {
  struct Case {
    int64_t H, G, d, n, window;
  };
  const Case cases[] = {{9, 3, 64, 1, 0},   {9, 3, 64, 203, 0}, {8, 8, 64, 64, 0},   {32, 8, 128, 517, 0},
                        {4, 1, 128, 9, 0},  {8, 4, 8, 130, 0},  {9, 3, 64, 300, 50}, {6, 2, 64, 1000, 0}};
  double worst = 0;
  for (const Case& k : cases) {
    Cache c = MakeCache(k.H, k.G, k.d, k.n, static_cast<uint32_t>(k.H * 1000 + k.d + k.n));
    c.window = k.window;
    c.per_channel = PerChannel();
    Quantize(c);
    const std::string what = "H " + std::to_string(k.H) + " G " + std::to_string(k.G) + " d " +
                             std::to_string(k.d) + " n " + std::to_string(k.n) + " window " +
                             std::to_string(k.window);
    const std::vector<float> out = RunKernel(c, /*split=*/2);
    ExpectMatchesDequantized(c, out, what);
    ExpectWithinQuantizationBound(c, out, what, &worst);
  }
  // The bound is not vacuous: the errors reach a visible fraction of it.
  EXPECT_GT(worst, 0.02);
}

TEST_P(AttentionInt8Test, ZeroTokenAndHugeOutlier) {
  Cache c = MakeCache(9, 3, 64, 77, 5);
  c.per_channel = PerChannel();
  for (int64_t g = 0; g < 3; ++g) {
    for (int64_t i = 0; i < 64; ++i) {
      c.k[(g * 77 + 10) * 64 + i] = 0.0f;  // an all-zero key and value
      c.v[(g * 77 + 10) * 64 + i] = 0.0f;
    }
    c.k[(g * 77 + 40) * 64 + 7] = 300.0f;  // one huge channel in one key: its row's step is 2.4
    c.v[(g * 77 + 41) * 64 + 3] = -1.0e4f;  // and one huge value
  }
  Quantize(c);
  const std::vector<float> out = RunKernel(c);
  ExpectMatchesDequantized(c, out, "zero token, outliers");
  double worst = 0;
  ExpectWithinQuantizationBound(c, out, "zero token, outliers", &worst);
}

TEST_P(AttentionInt8Test, NothingVisibleGivesZeros) {
  Cache c = MakeCache(4, 2, 64, 20, 9);
  c.per_channel = PerChannel();
  Quantize(c);
  c.qpos = 0;  // every key position is >= 1
  const std::vector<float> out = RunKernel(c);
  for (float x : out) EXPECT_EQ(x, 0.0f);
  c.n = 0;
  EXPECT_EQ(RunKernel(c), std::vector<float>(4 * 64, 0.0f));
}

INSTANTIATE_TEST_SUITE_P(Isas, AttentionInt8Test, ::testing::Combine(::testing::ValuesIn(Isas()), ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param) + (std::get<1>(info.param) ? "_per_channel" : "_per_token");
                         });

TEST(AttentionInt8IsaTest, Avx2MatchesScalarBitForBit) {
  ASSERT_TRUE(SetDecodeAttentionInt8Isa("auto"));
  if (!CpuRunsIsa("avx2")) {
    EXPECT_EQ(DecodeAttentionInt8Isa(), "scalar");
    return;
  }
  EXPECT_EQ(DecodeAttentionInt8Isa(), "avx2");
  for (int64_t d : {64, 128}) {
    for (int64_t n : {1, 7, 8, 65, 333}) {
      Cache c = MakeCache(12, 4, d, n, static_cast<uint32_t>(d * 7 + n), /*key_scale=*/3.0f);
      c.per_channel = n % 2 == 1;
      Quantize(c);
      ASSERT_TRUE(SetDecodeAttentionInt8Isa("avx2"));
      const std::vector<float> a = RunKernel(c);
      ASSERT_TRUE(SetDecodeAttentionInt8Isa("scalar"));
      const std::vector<float> s = RunKernel(c);
      EXPECT_EQ(std::memcmp(a.data(), s.data(), a.size() * sizeof(float)), 0) << "d " << d << " n " << n;
    }
  }
  SetDecodeAttentionInt8Isa("auto");
  EXPECT_FALSE(SetDecodeAttentionInt8Isa("avx512"));
  EXPECT_EQ(DecodeAttentionInt8Isa(), "avx2");
}

}  // namespace
}  // namespace echokv::kernels
