// The transformer against an independent float64 naive reference (naive_reference.cc)
// on random tiny weights for every family, plus cache/chunking/view invariants.
#include "model/transformer.h"

#include <ATen/ATen.h>

#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/rope.h"
#include "tests/model/naive_reference.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_data.h"

namespace echokv::model {
namespace {

using ::echokv::testing::MakeRandomModel;
using ::echokv::testing::NaiveModel;
using ::echokv::testing::StatusIs;
using ::echokv::testing::TinyConfig;

// float32 runtime vs float64 reference: 1e-5 relative to the logit scale
// (max(1, max |logit|)), i.e. float32 round-off accumulated over the layers.
constexpr double kTol = 1e-5;

std::vector<int> Tokens(int n, int vocab, int seed) {
  std::vector<int> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 7 + seed * 13 + (i * i) % 5) % vocab;
  return t;
}

// Max |a - b| divided by the logit scale max(1, max |b|).
double MaxAbsDiff(const at::Tensor& a, const std::vector<double>& b) {
  double m = 0, scale = 1.0;
  const float* p = a.data_ptr<float>();
  for (size_t i = 0; i < b.size(); ++i) {
    m = std::max(m, std::abs(static_cast<double>(p[i]) - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return m / scale;
}

double MaxAbsDiff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

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
  EXPECT_LT(MaxAbsDiff(pre.logits, expected[2]), kTol);
  for (size_t t = 3; t < tokens.size(); ++t) {
    ASSERT_OK_AND_ASSIGN(DecodeResult step, model_->Decode(tokens[t], &cache));
    EXPECT_LT(MaxAbsDiff(step.logits, expected[t]), kTol) << "position " << t;
  }
  EXPECT_EQ(cache.next_position(), static_cast<int64_t>(tokens.size()));
  EXPECT_EQ(cache.size(0), static_cast<int64_t>(tokens.size()));
}

// Incremental decoding equals prefilling the whole prefix, at every step, and the
// chunk size of the prefill does not change anything.
TEST_P(TransformerFamilyTest, IncrementalDecodeEqualsPrefillAndChunkingIsInvisible) {
  const std::vector<int> tokens = Tokens(10, ref_.config.vocab_size, 2);
  KvCache inc = model_->NewCache();
  for (size_t t = 0; t < tokens.size(); ++t) {
    ASSERT_OK_AND_ASSIGN(DecodeResult step, model_->Decode(tokens[t], &inc));
    for (int chunk : {1, 3, 64}) {
      KvCache full = model_->NewCache();
      ForwardOptions fo;
      fo.chunk_size = chunk;
      ASSERT_OK_AND_ASSIGN(ForwardResult pre, model_->Forward(absl::MakeConstSpan(tokens.data(), t + 1), &full, fo));
      EXPECT_LT(MaxAbsDiff(step.logits, pre.logits), 1e-5) << "step " << t << " chunk " << chunk;
      if (t + 1 == tokens.size()) {
        for (int l = 0; l < ref_.config.num_layers; ++l) {
          EXPECT_LT(MaxAbsDiff(inc.keys(l), full.keys(l)), 1e-5);
          EXPECT_LT(MaxAbsDiff(inc.values(l), full.values(l)), 1e-5);
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
  EXPECT_LT(MaxAbsDiff(step.logits, expected[L]), kTol);
  // And it differs from full attention (the restriction is real).
  const auto unmasked = ref_.Forward(tokens, nullptr);
  EXPECT_GT(MaxAbsDiff(step.logits, unmasked[L]), 1e-3);
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
    EXPECT_LT(MaxAbsDiff(rotated.select(1, 0), r.queries[l].select(1, 3)), 1e-5);
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
    EXPECT_LT(MaxAbsDiff(fast.logits, slow.logits), 1e-5) << "step " << t;
    for (int l = 0; l < c.num_layers; ++l) {
      EXPECT_LT(MaxAbsDiff(fast.queries[l], slow.queries[l]), 1e-5);
      EXPECT_LT(MaxAbsDiff(va.keys(l), vb.keys(l)), 1e-5);
      EXPECT_LT(MaxAbsDiff(va.values(l), vb.values(l)), 1e-5);
    }
  }
  EXPECT_EQ(va.cells(), vb.cells());
}

// dtype is a runtime choice: the same checkpoint in bfloat16 (prefill + decode through
// the batched path) stays close to float32 (bf16 keeps ~3 significant digits).
TEST_P(TransformerFamilyTest, Bfloat16RunsAndStaysCloseToFloat32) {
  DeviceOptions bf16;
  bf16.dtype = "bfloat16";
  ASSERT_OK_AND_ASSIGN(auto low, Transformer::Load(dir_, bf16));
  const std::vector<int> tokens = Tokens(8, ref_.config.vocab_size, 6);
  KvCache a = model_->NewCache(), b = low->NewCache();
  ASSERT_OK_AND_ASSIGN(ForwardResult fa, model_->Forward(tokens, &a));
  ASSERT_OK_AND_ASSIGN(ForwardResult fb, low->Forward(tokens, &b));
  EXPECT_EQ(b.keys(0).scalar_type(), at::kBFloat16);
  const double scale = std::max(1.0, fa.logits.abs().max().item<double>());
  EXPECT_LT(MaxAbsDiff(fa.logits, fb.logits) / scale, 0.05);
  ASSERT_OK_AND_ASSIGN(DecodeResult da, model_->Decode(tokens[0], &a));
  ASSERT_OK_AND_ASSIGN(DecodeResult db, low->Decode(tokens[0], &b));
  EXPECT_LT(MaxAbsDiff(da.logits, db.logits) / scale, 0.05);
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
