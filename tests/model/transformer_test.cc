// The transformer against an independent float64 naive reference (naive_reference.cc)
// on random tiny weights for every family, plus cache/chunking/view invariants.
#include "model/transformer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/rope.h"
#include "nlohmann/json.hpp"
#include "tests/model/rel_diff.h"
#include "tests/model/naive_reference.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_data.h"

namespace echokv::model {
namespace {

using ::echokv::testing::MakeRandomModel;
using ::echokv::testing::NaiveModel;
using ::echokv::testing::RelDiff;
using ::echokv::testing::StatusIs;
using ::echokv::testing::TinyConfig;

// Every tolerance below is relative to a scale: the largest magnitude of the value
// compared against, at least 1 (RelDiff). Logits of these random models reach 3 ... 8,
// so an absolute bound would mean something different for every family and seed.
//
// float32 runtime vs float64 reference (and float32 path vs float32 path): 1e-5 ≈ 170 u,
// with u = 2^-24 ≈ 6e-8 float32's unit round-off. Why that number: the deepest chain of
// float32 work before a logit is, per layer, inner products of length 32 (q/k/v), 8
// (scores), <= 12 (attention-weighted values), 32 (o_proj), 32 (gate/up) and 48 (down),
// then 32 (lm_head): about 350 accumulated terms over the two layers, and the classical
// worst-case bound of a length-n sum is n u relative to the magnitudes summed, so
// round-off cannot exceed ~350 u ≈ 2e-5 of the scale. Measured (all families, every
// position, chunk sizes 1, 3 and 64): at most 1.5e-6 ≈ 25 u against the float64
// reference and 1.4e-6 between two float32 paths. 1e-5 leaves ~7x headroom over the
// measurement (other CPUs' BLAS blocking and vector widths change the summation order)
// while staying below the worst-case bound: anything a wrong mask, position, chunk
// boundary or cache entry does is orders of magnitude larger (see the > 1e-3 and
// > 100 kTol checks below, which prove the comparisons can fail).
constexpr double kTol = 1e-5;

std::vector<int> Tokens(int n, int vocab, int seed) {
  std::vector<int> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 7 + seed * 13 + (i * i) % 5) % vocab;
  return t;
}

class TransformerFamilyTest : public ::testing::TestWithParam<ModelType> {
 protected:
  void SetUp() override {
    ref_ = MakeRandomModel(TinyConfig(GetParam()), 1234 + static_cast<int>(GetParam()));
    dir_ = testing::MakeTempDir("echokv_transformer_");
    testing::WriteModelDir(ref_, dir_);
    auto m = Transformer::Load(dir_, DeviceOptions());
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
  }
  NaiveModel ref_;
  std::string dir_;
  std::unique_ptr<Transformer> model_;
};

// Prefill of the first few tokens, then one decode step per token: every step's
// logits match the naive reference at that position (covers Mistral's sliding window,
// which the 12-token sequence exceeds, and Qwen2's biases).
TEST_P(TransformerFamilyTest, MatchesNaiveReferenceAtEveryPosition) {
  const std::vector<int> tokens = Tokens(12, ref_.config.vocab_size, 1);
  const auto expected = ref_.Forward(tokens, nullptr);
  KvCache cache = model_->NewCache();
  ASSERT_OK_AND_ASSIGN(ForwardResult pre, model_->Forward(absl::MakeConstSpan(tokens.data(), 3), &cache));
  EXPECT_LT(RelDiff(pre.logits, expected[2]), kTol);
  for (size_t t = 3; t < tokens.size(); ++t) {
    ASSERT_OK_AND_ASSIGN(DecodeResult step, model_->Decode(tokens[t], &cache));
    EXPECT_LT(RelDiff(step.logits, expected[t]), kTol) << "position " << t;
  }
  EXPECT_EQ(cache.next_position(), static_cast<int64_t>(tokens.size()));
  EXPECT_EQ(cache.size(0), static_cast<int64_t>(tokens.size()));
}

// Incremental decoding equals prefilling the whole prefix, at every step, and the
// chunk size of the prefill does not change anything. Each path is held to the float64
// reference (kTol relative): that is what catches a real difference (a chunk boundary
// that drops keys, a wrong position). The two float32 paths are then also held to kTol
// of each other: they compute the same function and differ only in summation order
// (chunk shapes change the BLAS blocking), so they agree to the same round-off each has
// against float64 (measured: 1.4e-6 between them, 1.5e-6 to the reference). A bound
// "(err_inc + err_pre) * factor" would be no test at all: by the triangle inequality
// the difference never exceeds err_inc + err_pre.
TEST_P(TransformerFamilyTest, IncrementalDecodeEqualsPrefillAndChunkingIsInvisible) {
  const std::vector<int> tokens = Tokens(10, ref_.config.vocab_size, 2);
  const auto expected = ref_.Forward(tokens, nullptr);
  KvCache inc = model_->NewCache();
  for (size_t t = 0; t < tokens.size(); ++t) {
    ASSERT_OK_AND_ASSIGN(DecodeResult step, model_->Decode(tokens[t], &inc));
    EXPECT_LT(RelDiff(step.logits, expected[t]), kTol) << "incremental, step " << t;
    for (int chunk : {1, 3, 64}) {
      KvCache full = model_->NewCache();
      ForwardOptions fo;
      fo.chunk_size = chunk;
      ASSERT_OK_AND_ASSIGN(ForwardResult pre, model_->Forward(absl::MakeConstSpan(tokens.data(), t + 1), &full, fo));
      EXPECT_LT(RelDiff(pre.logits, expected[t]), kTol) << "prefill, step " << t << " chunk " << chunk;
      EXPECT_LT(RelDiff(step.logits, pre.logits), kTol) << "step " << t << " chunk " << chunk;
      if (t + 1 == tokens.size()) {
        // Keys and values sit one layer's worth of work deep: a smaller share of the
        // same budget (measured <= 8e-7 of their scale, ~4).
        for (int l = 0; l < ref_.config.num_layers; ++l) {
          EXPECT_LT(RelDiff(inc.keys(l), full.keys(l)), kTol) << "layer " << l << " chunk " << chunk;
          EXPECT_LT(RelDiff(inc.values(l), full.values(l)), kTol) << "layer " << l << " chunk " << chunk;
        }
      }
    }
  }
}

// A view keeping a different subset per group gives exactly the logits of attention
// restricted to that subset (the naive reference with a mask).
TEST_P(TransformerFamilyTest, SubsetViewEqualsMaskedAttention) {
  const auto& c = ref_.config;
  const std::vector<int> tokens = Tokens(9, c.vocab_size, 3);
  const int L = 8;
  KvCache cache = model_->NewCache();
  ASSERT_OK(model_->Forward(absl::MakeConstSpan(tokens.data(), L), &cache).status());
  // Layer l, group g keeps 4 entries: a pattern that differs by layer and group.
  std::vector<std::vector<std::vector<int64_t>>> kept(c.num_layers);
  std::vector<at::Tensor> indices;
  for (int l = 0; l < c.num_layers; ++l) {
    at::Tensor idx = at::empty({c.num_kv_heads, 4}, at::kLong);
    for (int g = 0; g < c.num_kv_heads; ++g) {
      std::vector<int64_t> s = (l + g) % 2 == 0 ? std::vector<int64_t>{0, 2, 5, 7} : std::vector<int64_t>{1, 3, 4, 6};
      if (l == 1 && g == 1) s = {0, 1, 6, 7};
      kept[l].push_back(s);
      for (int i = 0; i < 4; ++i) idx[g][i] = s[i];
    }
    indices.push_back(idx);
  }
  ASSERT_OK_AND_ASSIGN(KvCache view, KvCache::Gather(cache, indices));
  EXPECT_EQ(view.next_position(), L);
  ASSERT_OK_AND_ASSIGN(DecodeResult step, model_->Decode(tokens[L], &view));
  auto mask = [&](int layer, int group, int q, int k) {
    if (q < L || k == q) return true;  // context tokens saw everything; the new token sees itself
    for (int64_t p : kept[layer][group]) {
      if (p == k) return true;
    }
    return false;
  };
  const auto expected = ref_.Forward(tokens, mask);
  EXPECT_LT(RelDiff(step.logits, expected[L]), kTol);
  // And it differs from full attention (the restriction is real).
  const auto unmasked = ref_.Forward(tokens, nullptr);
  EXPECT_GT(RelDiff(step.logits, unmasked[L]), 1e-3);
  for (int g = 0; g < c.num_kv_heads; ++g) {
    std::vector<int64_t> want = kept[1][g];  // positions equal indices after a fresh prefill
    want.push_back(L);
    EXPECT_EQ(view.cells().positions(1, g), want);
  }
}

// The anchor (pre-RoPE) query rotated to the last position equals the returned
// post-RoPE query of that position; kept queries have the requested positions.
TEST_P(TransformerFamilyTest, AnchorAndKeptQueriesAreConsistent) {
  const auto& c = ref_.config;
  const std::vector<int> tokens = Tokens(11, c.vocab_size, 4);
  KvCache cache = model_->NewCache();
  ForwardOptions fo;
  fo.return_anchor_queries = true;
  fo.keep_last_queries = 4;
  fo.chunk_size = 3;
  ASSERT_OK_AND_ASSIGN(ForwardResult r, model_->Forward(tokens, &cache, fo));
  ASSERT_EQ(r.anchor_queries.size(), static_cast<size_t>(c.num_layers));
  ASSERT_EQ(r.queries.size(), static_cast<size_t>(c.num_layers));
  EXPECT_EQ(r.query_positions, (std::vector<int64_t>{7, 8, 9, 10}));
  for (int l = 0; l < c.num_layers; ++l) {
    EXPECT_EQ(r.anchor_queries[l].sizes(), (std::vector<int64_t>{c.num_heads, c.head_dim}));
    EXPECT_EQ(r.queries[l].sizes(), (std::vector<int64_t>{c.num_heads, 4, c.head_dim}));
    at::Tensor rotated = kernels::RotateToPositions(r.anchor_queries[l], {10}, model_->RopeInvFreq());
    // A rotation is a few float32 operations on top of the same query: far inside kTol.
    EXPECT_LT(RelDiff(rotated.select(1, 0), r.queries[l].select(1, 3)), kTol);
  }
  // Decode returns one post-RoPE query per head per layer.
  ASSERT_OK_AND_ASSIGN(DecodeResult d, model_->Decode(tokens[0], &cache, /*return_queries=*/true));
  ASSERT_EQ(d.queries.size(), static_cast<size_t>(c.num_layers));
  EXPECT_EQ(d.queries[0].sizes(), (std::vector<int64_t>{c.num_heads, c.head_dim}));
}

// The CPU float32 decode fast path and the batched Forward path agree step by step
// (logits, queries and the appended KV), including on a per-group subset view.
TEST_P(TransformerFamilyTest, DecodeFastPathEqualsForwardPath) {
  const auto& c = ref_.config;
  const std::vector<int> tokens = Tokens(14, c.vocab_size, 5);
  KvCache a = model_->NewCache(), b = model_->NewCache();
  ASSERT_OK(model_->Forward(absl::MakeConstSpan(tokens.data(), 6), &a).status());
  ASSERT_OK(model_->Forward(absl::MakeConstSpan(tokens.data(), 6), &b).status());
  std::vector<at::Tensor> idx;
  for (int l = 0; l < c.num_layers; ++l) {
    idx.push_back(at::tensor({0, 2, 3, 5, 1, 2, 4, 5}, at::kLong).view({2, 4}).narrow(0, 0, c.num_kv_heads));
  }
  ASSERT_OK_AND_ASSIGN(KvCache va, KvCache::Gather(a, idx));
  ASSERT_OK_AND_ASSIGN(KvCache vb, KvCache::Gather(b, idx));
  for (size_t t = 6; t < tokens.size(); ++t) {
    ASSERT_OK_AND_ASSIGN(DecodeResult fast, model_->Decode(tokens[t], &va, true));
    ASSERT_OK_AND_ASSIGN(DecodeResult slow, model_->DecodeWithForward(tokens[t], &vb, true));
    // Two float32 paths of the same function: round-off apart, kTol as above.
    EXPECT_LT(RelDiff(fast.logits, slow.logits), kTol) << "step " << t;
    for (int l = 0; l < c.num_layers; ++l) {
      EXPECT_LT(RelDiff(fast.queries[l], slow.queries[l]), kTol);
      EXPECT_LT(RelDiff(va.keys(l), vb.keys(l)), kTol);
      EXPECT_LT(RelDiff(va.values(l), vb.values(l)), kTol);
    }
  }
  EXPECT_EQ(va.cells(), vb.cells());
}

// dtype is a runtime choice: the same checkpoint in bfloat16 (prefill + decode through
// the batched path) stays close to the float64 reference and to float32.
//
// Why 5 % of the logit scale: bfloat16 keeps 8 significant bits, so every rounding (the
// weights once, then the activations after each op) is off by up to u = 2^-8 ≈ 0.39 %
// of the value. A logit here is the end of ~20 such roundings in sequence (2 layers of
// norm, q/k/v, scores, softmax, attention, o_proj, residual, norm, gate/up, down,
// residual; final norm, lm_head): independent roundings add up like a random walk,
// sqrt(20) u ≈ 1.7 %, and cannot exceed the worst case 20 u ≈ 7.8 % (to first order).
// Measured on these models: 1.0 ... 2.9 % (mistral's decode step; ≈ 7.4 u). 5 % (≈ 13 u)
// is inside the worst-case bound and gives 1.7x headroom over the measurement for CPUs
// whose bf16 kernels accumulate differently; a real bug (a wrong position, a dropped
// key, a layer skipped) moves logits by tens of percent. The float32 model meanwhile
// stays within kTol of the reference, so the gap is bfloat16's own.
TEST_P(TransformerFamilyTest, Bfloat16RunsAndStaysCloseToFloat32) {
  constexpr double kBf16Tol = 0.05;
  DeviceOptions bf16;
  bf16.dtype = "bfloat16";
  ASSERT_OK_AND_ASSIGN(auto low, Transformer::Load(dir_, bf16));
  std::vector<int> tokens = Tokens(8, ref_.config.vocab_size, 6);
  KvCache a = model_->NewCache(), b = low->NewCache();
  ASSERT_OK_AND_ASSIGN(ForwardResult fa, model_->Forward(tokens, &a));
  ASSERT_OK_AND_ASSIGN(ForwardResult fb, low->Forward(tokens, &b));
  EXPECT_EQ(b.keys(0).scalar_type(), at::kBFloat16);
  ASSERT_OK_AND_ASSIGN(DecodeResult da, model_->Decode(tokens[0], &a));
  ASSERT_OK_AND_ASSIGN(DecodeResult db, low->Decode(tokens[0], &b));
  tokens.push_back(tokens[0]);
  const auto expected = ref_.Forward(tokens, nullptr);
  EXPECT_LT(RelDiff(fa.logits, expected[7]), kTol);
  EXPECT_LT(RelDiff(da.logits, expected[8]), kTol);
  EXPECT_LT(RelDiff(fb.logits, expected[7]), kBf16Tol) << "bfloat16 prefill";
  EXPECT_LT(RelDiff(db.logits, expected[8]), kBf16Tol) << "bfloat16 decode";
  EXPECT_LT(RelDiff(fb.logits, fa.logits), kBf16Tol);
  EXPECT_LT(RelDiff(db.logits, da.logits), kBf16Tol);
}

TEST_P(TransformerFamilyTest, RejectsBadInput) {
  KvCache cache = model_->NewCache();
  EXPECT_THAT(model_->Forward({}, &cache), StatusIs(absl::StatusCode::kInvalidArgument, "at least one token"));
  const std::vector<int> bad = {1, ref_.config.vocab_size};
  EXPECT_THAT(model_->Forward(bad, &cache), StatusIs(absl::StatusCode::kInvalidArgument, "token id"));
  EXPECT_THAT(model_->Decode(-1, &cache), StatusIs(absl::StatusCode::kInvalidArgument, "token id -1"));
  EXPECT_EQ(cache.size(0), 0);  // nothing appended by failed calls
  KvCache wrong(1, 1, 8, at::kFloat);
  EXPECT_THAT(model_->Forward({1}, &wrong), StatusIs(absl::StatusCode::kInvalidArgument, "cache shape"));
}

INSTANTIATE_TEST_SUITE_P(Families, TransformerFamilyTest,
                         ::testing::Values(ModelType::kLlama, ModelType::kMistral, ModelType::kQwen2),
                         [](const auto& info) { return std::string(ModelTypeName(info.param)); });

// ---------------------------------------------------------------------------------
// RoPE scaling (config.json rope_scaling: llama3, linear).

// Which of Llama 3's three frequency bands an inverse frequency falls in.
enum Band { kUnchanged = 0, kSmoothed = 1, kScaled = 2 };

// Llama 3's scaled inverse frequencies from the published formula, entirely in double
// (independent of the runtime's float32 tensor arithmetic): base theta^(-2i/d),
// wavelength 2 pi / inv; < original / high_freq_factor: unchanged; > original /
// low_freq_factor: divided by factor; otherwise (1 - s) inv / factor + s inv with
// s = (original / wavelength - low) / (high - low).
std::vector<double> Llama3InvFreqDouble(int d, double theta, const RopeScaling& rs, std::vector<Band>* bands) {
  std::vector<double> out(d / 2);
  if (bands != nullptr) bands->assign(d / 2, kUnchanged);
  const double original = rs.original_max_position_embeddings;
  for (int i = 0; i < d / 2; ++i) {
    const double inv = std::pow(theta, -2.0 * i / d);
    const double wavelen = 2.0 * M_PI / inv;
    Band band;
    if (wavelen < original / rs.high_freq_factor) {
      out[i] = inv;
      band = kUnchanged;
    } else if (wavelen > original / rs.low_freq_factor) {
      out[i] = inv / rs.factor;
      band = kScaled;
    } else {
      const double smooth = (original / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
      out[i] = (1.0 - smooth) * inv / rs.factor + smooth * inv;
      band = kSmoothed;
    }
    if (bands != nullptr) (*bands)[i] = band;
  }
  return out;
}

// transformers' _compute_llama3_parameters transcribed to float32 scalar arithmetic,
// each Python scalar rounded to float32 as torch does inside a tensor op, and
// `2 * math.pi / inv_freq` as torch evaluates it (inv_freq.reciprocal() * 2pi).
// `base`: the unscaled float32 frequencies.
std::vector<float> Llama3InvFreqHfFloat32(const std::vector<float>& base, const RopeScaling& rs) {
  const double original = rs.original_max_position_embeddings;
  const float low_wavelen = static_cast<float>(original / rs.low_freq_factor);
  const float high_wavelen = static_cast<float>(original / rs.high_freq_factor);
  const float factor = static_cast<float>(rs.factor);
  const float two_pi = static_cast<float>(2.0 * M_PI);
  const float band = static_cast<float>(rs.high_freq_factor - rs.low_freq_factor);
  std::vector<float> out(base.size());
  for (size_t i = 0; i < base.size(); ++i) {
    const float inv = base[i];
    const float wavelen = (1.0f / inv) * two_pi;
    const float scaled = wavelen > low_wavelen ? inv / factor : inv;
    const float smooth = ((1.0f / wavelen) * static_cast<float>(original) - static_cast<float>(rs.low_freq_factor)) / band;
    const float one_minus = 1.0f - smooth;
    const float a = one_minus * scaled;
    const float b = a / factor;
    const float c = smooth * scaled;
    const float smoothed = b + c;
    const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    out[i] = medium ? smoothed : scaled;
  }
  return out;
}

std::vector<float> Floats(const at::Tensor& t) {
  at::Tensor c = t.to(at::kFloat).contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

ModelConfig Llama3Config(int head_dim, double theta, double factor, double low, double high, int original) {
  ModelConfig c = TinyConfig(ModelType::kLlama);
  c.head_dim = head_dim;
  c.rope_theta = theta;
  c.rope_scaling.type = RopeScalingType::kLlama3;
  c.rope_scaling.factor = factor;
  c.rope_scaling.low_freq_factor = low;
  c.rope_scaling.high_freq_factor = high;
  c.rope_scaling.original_max_position_embeddings = original;
  return c;
}

TEST(RopeScalingTest, NoScalingIsTheUnscaledRecipe) {
  ModelConfig c = TinyConfig(ModelType::kLlama);
  for (int d : {8, 64, 128}) {
    c.head_dim = d;
    EXPECT_EQ(Floats(ComputeRopeInvFreq(c)), Floats(kernels::RopeInvFreq(d, c.rope_theta))) << d;
  }
}

// Llama 3.1 8B (d 128, factor 8), Llama 3.2 1B (d 64, factor 32), the tiny test model
// of the end-to-end test below (d 8, original 128) and odd factors: the runtime's
// frequencies equal HF's float32 recipe bit for bit, agree with the double formula to
// float32 precision, and every band is populated (so each branch is checked).
TEST(RopeScalingTest, Llama3InvFreqMatchesFormulaInEveryBand) {
  const std::vector<ModelConfig> configs = {
      Llama3Config(128, 500000.0, 8.0, 1.0, 4.0, 8192),
      Llama3Config(64, 500000.0, 32.0, 1.0, 4.0, 8192),
      Llama3Config(8, 10000.0, 8.0, 1.0, 4.0, 128),
      Llama3Config(96, 1e6, 3.0, 1.5, 5.25, 3000),
  };
  for (const ModelConfig& c : configs) {
    ASSERT_OK(c.Validate());
    const std::vector<float> got = Floats(ComputeRopeInvFreq(c));
    const std::vector<float> base = Floats(kernels::RopeInvFreq(c.head_dim, c.rope_theta));
    std::vector<Band> bands;
    const std::vector<double> exact = Llama3InvFreqDouble(c.head_dim, c.rope_theta, c.rope_scaling, &bands);
    ASSERT_EQ(got.size(), exact.size());
    EXPECT_EQ(got, Llama3InvFreqHfFloat32(base, c.rope_scaling)) << "d=" << c.head_dim;
    int count[3] = {0, 0, 0};
    for (size_t i = 0; i < got.size(); ++i) {
      ++count[bands[i]];
      // The base recipe is within 2e-6 of theta^(-2i/d) (kernels/rope_test); the
      // scaling adds a few float32 roundings.
      EXPECT_NEAR(got[i], exact[i], 4e-6 * exact[i]) << "d=" << c.head_dim << " i=" << i << " band " << bands[i];
      if (bands[i] == kUnchanged) {
        EXPECT_EQ(got[i], base[i]) << i;
      } else if (bands[i] == kScaled) {
        EXPECT_EQ(got[i], base[i] / static_cast<float>(c.rope_scaling.factor)) << i;
      } else {
        EXPECT_LT(got[i], base[i]) << i;
        EXPECT_GT(got[i], base[i] / static_cast<float>(c.rope_scaling.factor)) << i;
      }
    }
    EXPECT_GT(count[kUnchanged], 0) << "d=" << c.head_dim;
    EXPECT_GT(count[kSmoothed], 0) << "d=" << c.head_dim;
    EXPECT_GT(count[kScaled], 0) << "d=" << c.head_dim;
  }
}

float FromBits(const nlohmann::json& hex) {
  const uint32_t bits = static_cast<uint32_t>(std::stoul(hex.get<std::string>(), nullptr, 16));
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// PyTorch's own float32 results for the same formulas (testdata/make_rope_scaling_golden.py
// runs them with torch's Python operators): ApplyRopeScaling on PyTorch's base
// frequencies equals PyTorch's scaled ones bit for bit; ComputeRopeInvFreq (whose base
// pow may round differently by an ulp on another CPU's vector width) to 1e-6.
TEST(RopeScalingTest, MatchesPyTorchGolden) {
  const nlohmann::json golden = nlohmann::json::parse(testing::ReadFileOrDie(ECHOKV_ROPE_GOLDEN));
  ASSERT_GE(golden.at("cases").size(), 7u);
  for (const nlohmann::json& g : golden.at("cases")) {
    ModelConfig c = TinyConfig(ModelType::kLlama);
    c.head_dim = g.at("head_dim").get<int>();
    c.rope_theta = g.at("rope_theta").get<double>();
    const nlohmann::json& rs = g.at("rope_scaling");
    c.rope_scaling.factor = rs.at("factor").get<double>();
    if (rs.at("rope_type") == "llama3") {
      c.rope_scaling.type = RopeScalingType::kLlama3;
      c.rope_scaling.low_freq_factor = rs.at("low_freq_factor").get<double>();
      c.rope_scaling.high_freq_factor = rs.at("high_freq_factor").get<double>();
      c.rope_scaling.original_max_position_embeddings = rs.at("original_max_position_embeddings").get<int>();
    } else {
      c.rope_scaling.type = RopeScalingType::kLinear;
    }
    ASSERT_OK(c.Validate());
    std::vector<float> base, want;
    for (const auto& h : g.at("base_inv_freq_bits")) base.push_back(FromBits(h));
    for (const auto& h : g.at("inv_freq_bits")) want.push_back(FromBits(h));
    ASSERT_EQ(base.size(), static_cast<size_t>(c.head_dim / 2));
    ASSERT_EQ(want.size(), base.size());
    const at::Tensor base_t = at::tensor(base, at::kFloat);
    EXPECT_EQ(Floats(ApplyRopeScaling(base_t, c.rope_scaling)), want) << g.at("name");
    const std::vector<float> full = Floats(ComputeRopeInvFreq(c));
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(full[i], want[i], 1e-6 * want[i]) << g.at("name") << " " << i;
  }
}

TEST(RopeScalingTest, LinearDividesTheFrequenciesByTheFactor) {
  ModelConfig c = TinyConfig(ModelType::kLlama);
  c.head_dim = 64;
  c.rope_scaling.type = RopeScalingType::kLinear;
  for (double factor : {1.0, 2.0, 2.5, 7.0}) {
    c.rope_scaling.factor = factor;
    const std::vector<float> got = Floats(ComputeRopeInvFreq(c));
    const std::vector<float> base = Floats(kernels::RopeInvFreq(c.head_dim, c.rope_theta));
    for (int i = 0; i < c.head_dim / 2; ++i) {
      EXPECT_EQ(got[i], base[i] / static_cast<float>(factor)) << i;  // HF: inv_freq /= factor
      const double exact = std::pow(c.rope_theta, -2.0 * i / c.head_dim) / factor;
      EXPECT_NEAR(got[i], exact, 4e-6 * exact) << i;
    }
  }
}

// A tiny random llama with rope_scaling against the float64 reference given the
// scaled frequencies computed by the formula in double, at positions 0..159, past
// original_max_position_embeddings (128) and both band thresholds (wavelengths
// 32 and 128; the model's four frequencies have wavelengths 6.3, 63, 628, 6283: one
// unchanged, one smoothed, two scaled for llama3).
class ScaledRopeTransformerTest : public ::testing::TestWithParam<RopeScalingType> {
 protected:
  void SetUp() override {
    ModelConfig c = TinyConfig(ModelType::kLlama);
    c.max_position_embeddings = 1024;
    c.rope_scaling.type = GetParam();
    if (GetParam() == RopeScalingType::kLlama3) {
      c.rope_scaling.factor = 8.0;
      c.rope_scaling.low_freq_factor = 1.0;
      c.rope_scaling.high_freq_factor = 4.0;
      c.rope_scaling.original_max_position_embeddings = 128;
      exact_ = Llama3InvFreqDouble(c.head_dim, c.rope_theta, c.rope_scaling, &bands_);
    } else {
      c.rope_scaling.factor = 2.5;
      for (int i = 0; i < c.head_dim / 2; ++i) exact_.push_back(std::pow(c.rope_theta, -2.0 * i / c.head_dim) / 2.5);
    }
    ref_ = MakeRandomModel(c, 4321);
    ref_.rope_inv_freq = exact_;
    dir_ = testing::MakeTempDir("echokv_scaled_rope_");
    testing::WriteModelDir(ref_, dir_);
    auto m = Transformer::Load(dir_, DeviceOptions());
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
  }
  std::vector<double> exact_;  // [d/2] the scaled frequencies, double
  std::vector<Band> bands_;    // llama3 only
  NaiveModel ref_;
  std::string dir_;
  std::unique_ptr<Transformer> model_;
};

TEST_P(ScaledRopeTransformerTest, LoadsTheScalingFromConfigJson) {
  EXPECT_EQ(model_->config().rope_scaling.type, GetParam());
  const std::vector<float> inv = Floats(model_->RopeInvFreq());
  for (size_t i = 0; i < exact_.size(); ++i) EXPECT_NEAR(inv[i], exact_[i], 4e-6 * exact_[i]) << i;
  if (GetParam() == RopeScalingType::kLlama3) {
    EXPECT_EQ(bands_, (std::vector<Band>{kUnchanged, kSmoothed, kScaled, kScaled}));
  }
}

TEST_P(ScaledRopeTransformerTest, MatchesReferencePastTheOriginalContext) {
  const int T = 160;
  const std::vector<int> tokens = Tokens(T, ref_.config.vocab_size, 7);
  const auto expected = ref_.Forward(tokens, nullptr);
  ASSERT_EQ(expected.size(), static_cast<size_t>(T));
  KvCache cache = model_->NewCache();
  ForwardOptions fo;
  fo.chunk_size = 48;
  const int prefill = 120;
  ASSERT_OK_AND_ASSIGN(ForwardResult pre, model_->Forward(absl::MakeConstSpan(tokens.data(), prefill), &cache, fo));
  EXPECT_LT(RelDiff(pre.logits, expected[prefill - 1]), kTol);
  at::Tensor last;
  for (int t = prefill; t < T; ++t) {
    ASSERT_OK_AND_ASSIGN(DecodeResult step, model_->Decode(tokens[t], &cache));
    EXPECT_LT(RelDiff(step.logits, expected[t]), kTol) << "position " << t;
    last = step.logits;
  }
  // The comparison can fail: the reference with any one frequency wrong (a scaled or
  // smoothed one left unscaled, the unchanged one scaled, or linear not applied) is
  // far outside the tolerance at the last position.
  const std::vector<float> base = Floats(kernels::RopeInvFreq(ref_.config.head_dim, ref_.config.rope_theta));
  for (size_t i = 0; i < exact_.size(); ++i) {
    NaiveModel wrong = ref_;
    const bool was_base = static_cast<float>(exact_[i]) == base[i];
    wrong.rope_inv_freq[i] = was_base ? base[i] / ref_.config.rope_scaling.factor : base[i];
    const auto off = wrong.Forward(tokens, nullptr);
    EXPECT_GT(RelDiff(last, off[T - 1]), 100 * kTol) << "frequency " << i;
  }
}

// Keys stay post-RoPE at their original positions: an anchor query rotated with the
// model's (scaled) frequencies to a position past the original context equals the
// query the model computed there (what EchoKV's proposals rely on).
TEST_P(ScaledRopeTransformerTest, AnchorRotatedWithScaledFrequenciesEqualsTheQuery) {
  const int T = 150;
  const std::vector<int> tokens = Tokens(T, ref_.config.vocab_size, 8);
  KvCache cache = model_->NewCache();
  ForwardOptions fo;
  fo.return_anchor_queries = true;
  fo.keep_last_queries = 1;
  ASSERT_OK_AND_ASSIGN(ForwardResult r, model_->Forward(tokens, &cache, fo));
  for (int l = 0; l < ref_.config.num_layers; ++l) {
    at::Tensor rotated = kernels::RotateToPositions(r.anchor_queries[l], {T - 1}, model_->RopeInvFreq());
    EXPECT_LT(RelDiff(rotated.select(1, 0), r.queries[l].select(1, 0)), kTol);
  }
}

INSTANTIATE_TEST_SUITE_P(Types, ScaledRopeTransformerTest,
                         ::testing::Values(RopeScalingType::kLlama3, RopeScalingType::kLinear),
                         [](const auto& info) { return std::string(RopeScalingTypeName(info.param)); });

// The decode fast path specialises its attention loops for head dims 8, 64 and 128
// (others take the generic loop) and scores keys in blocks of 64, several at a time;
// the family tests above only use d = 8 and short contexts. Here every head dim path,
// GQA ratios 2 and 4 (with 2 threads a lone KV group's heads are split over them) and
// 150 positions (whole key blocks, a partial one and every remainder of the smaller
// key groups) are held to the float64 reference at every decoded position, with and
// without a sliding window.
struct HeadDimCase {
  int head_dim, kv_heads;
  ModelType type;
};

class DecodeHeadDimTest : public ::testing::TestWithParam<HeadDimCase> {};

TEST_P(DecodeHeadDimTest, MatchesNaiveReferenceAtEveryPosition) {
  ModelConfig c = TinyConfig(GetParam().type);
  c.head_dim = GetParam().head_dim;
  c.num_kv_heads = GetParam().kv_heads;
  if (c.sliding_window > 0) c.sliding_window = 70;  // crosses key-block boundaries
  NaiveModel ref = MakeRandomModel(c, 99 + c.head_dim + c.num_kv_heads);
  const std::string dir = testing::MakeTempDir("echokv_head_dim_");
  testing::WriteModelDir(ref, dir);
  DeviceOptions dev;
  dev.num_threads = 2;
  // Decode's loops split over the 2 threads (a lone KV group's heads too), as for models of
  // 4 M parameters and more: these tiny models would keep them on the calling thread.
  setenv("ECHOKV_DECODE_SPLIT", "ops", 1);  // read at load
  absl::StatusOr<std::unique_ptr<Transformer>> loaded = Transformer::Load(dir, dev);
  unsetenv("ECHOKV_DECODE_SPLIT");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Transformer> model, std::move(loaded));
  const int T = 150;
  const std::vector<int> tokens = Tokens(T, c.vocab_size, 3);
  const auto expected = ref.Forward(tokens, nullptr);
  KvCache cache = model->NewCache();
  ASSERT_OK(model->Forward(absl::MakeConstSpan(tokens.data(), 2), &cache).status());
  double worst = 0;
  for (int t = 2; t < T; ++t) {
    ASSERT_OK_AND_ASSIGN(DecodeResult step, model->Decode(tokens[t], &cache));
    const double diff = RelDiff(step.logits, expected[t]);
    EXPECT_LT(diff, kTol) << "position " << t;
    worst = std::max(worst, diff);
  }
  std::printf("[ d=%d, %d/%d heads, %s ] worst |decode - float64| %.2e of the logit scale\n", c.head_dim,
              c.num_heads, c.num_kv_heads, c.sliding_window > 0 ? "sliding window" : "full attention", worst);
}

INSTANTIATE_TEST_SUITE_P(HeadDims, DecodeHeadDimTest,
                         ::testing::Values(HeadDimCase{8, 1, ModelType::kLlama}, HeadDimCase{16, 2, ModelType::kLlama},
                                           HeadDimCase{64, 1, ModelType::kLlama},
                                           HeadDimCase{64, 2, ModelType::kMistral},
                                           HeadDimCase{128, 2, ModelType::kLlama},
                                           HeadDimCase{128, 1, ModelType::kMistral}),
                         [](const ::testing::TestParamInfo<HeadDimCase>& info) {
                           return "d" + std::to_string(info.param.head_dim) + "_kv" +
                                  std::to_string(info.param.kv_heads) + "_" +
                                  std::string(ModelTypeName(info.param.type));
                         });

TEST(DeviceOptionsTest, ValidateNamesTheField) {
  DeviceOptions d;
  EXPECT_OK(d.Validate());
  d.dtype = "int8";
  EXPECT_THAT(d.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "dtype"));
  d = DeviceOptions();
  d.device = "tpu";
  EXPECT_THAT(d.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "device"));
  if (!at::hasCUDA()) {
    d.device = "cuda";
    EXPECT_THAT(d.Validate(), StatusIs(absl::StatusCode::kFailedPrecondition, "CUDA"));
  }
  d = DeviceOptions();
  d.dtype = "float16";
  EXPECT_THAT(d.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "float16 needs device cuda"));
  d.dtype = "bfloat16";
  EXPECT_OK(d.Validate());
}

}  // namespace
}  // namespace echokv::model
