// Every policy on the real stories260K model (label `model`): compression of a ~400-token
// story, byte accounting, generation on the compact cache, and L <= B == FullKV.
#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "compression/config.h"
#include "compression/policy.h"
#include "compression/selection.h"
#include "compression/transformer_decoder.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/kv_cache.h"
#include "model/tokenizer.h"
#include "model/transformer.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_data.h"

namespace echokv::compression {
namespace {

// A TinyStories-style "long_story" prompt: several paragraphs, ~400 tokens.
constexpr const char* kLongStory =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in "
    "the park with her red ball. One day, she saw a big dog near the tree. The dog was "
    "sad because it could not find its home. Lily wanted to help the dog.\n"
    "Lily said, \"Do not be sad, dog. I will help you find your home.\" The dog wagged "
    "its tail and followed Lily. They walked past the pond where the ducks were "
    "swimming. They walked past the big hill where the kids were running and laughing.\n"
    "Then they saw a small house with a blue door. A boy named Tom came out of the "
    "house. He saw the dog and smiled. \"Max! You are home!\" he said. Tom hugged the "
    "dog and thanked Lily. Lily was very happy that she could help.\n"
    "The next day, Lily and Tom played together in the park. They threw the red ball "
    "and Max ran to get it. They had so much fun. Mom called Lily to come home for "
    "lunch. Lily said goodbye to Tom and Max and ran home.";

constexpr const char* kShortStory =
    "Once upon a time, there was a little cat named Tim. Tim liked to play with his "
    "ball in the sun. One day,";

class StoriesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = ::echokv::testing::TestDataDir();
    if (!dir) {
      GTEST_SKIP() << "ECHOKV_TEST_DATA is not set: this test needs the real test data "
                      "folder (../shared beside the checkout; .ci/run sets it)";
    }
    const std::string model_dir = *dir + "/models/stories260K";
    auto model = model::Transformer::Load(model_dir, model::DeviceOptions{});
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(model).value();
    auto tok = model::LoadTokenizer(model_dir);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = std::move(tok).value();
  }

  std::vector<int> Encode(const char* text) {
    auto ids = tokenizer_->Encode(text);
    EXPECT_TRUE(ids.ok()) << ids.status();
    return ids.ok() ? *ids : std::vector<int>{};
  }

  // Prefills `prompt` into *cache with what `cfg` needs (PrefillNeeds).
  absl::StatusOr<model::ForwardResult> Prefill(const CompressionConfig& cfg,
                                               const std::vector<int>& prompt,
                                               model::KvCache* cache) {
    *cache = model_->NewCache();
    const PrefillNeeds needs = NeedsFor(cfg);
    model::ForwardOptions fo;
    fo.return_anchor_queries = needs.anchor_queries;
    fo.keep_last_queries = needs.last_queries;
    return model_->Forward(prompt, cache, fo);
  }

  // Compresses the prefilled `cache` with `cfg`; *decoder_calls = decode steps run.
  absl::StatusOr<CompressionResult> CompressPrefilled(const CompressionConfig& cfg,
                                                      const model::KvCache& cache,
                                                      const model::ForwardResult& pre,
                                                      int* decoder_calls) {
    TransformerDecoder decoder(model_.get());
    CompressionInput in;
    in.context = &cache;
    in.anchor_queries = pre.anchor_queries;
    in.last_queries = pre.queries;
    in.last_query_positions = pre.query_positions;
    in.last_logits = pre.logits;
    in.rope_inv_freq = model_->RopeInvFreq();
    in.decoder = &decoder;
    auto r = Compress(cfg, in);
    *decoder_calls = decoder.calls();
    return r;
  }

  // Greedy-decodes `n` tokens on `cache` starting from the prefill logits.
  std::vector<int> Greedy(const at::Tensor& logits, model::KvCache* cache, int n) {
    std::vector<int> out;
    int token = internal::GreedyToken(logits);
    for (int i = 0; i < n; ++i) {
      out.push_back(token);
      auto step = model_->Decode(token, cache);
      EXPECT_TRUE(step.ok()) << step.status();
      if (!step.ok()) break;
      token = internal::GreedyToken(step->logits);
    }
    return out;
  }

  std::unique_ptr<model::Transformer> model_;
  std::unique_ptr<model::Tokenizer> tokenizer_;
};

TEST_F(StoriesTest, EveryPolicyCompressesTheLongStoryAndGenerates) {
  std::vector<int> prompt = Encode(kLongStory);
  ASSERT_GE(prompt.size(), 300u);
  ASSERT_LE(prompt.size(), 480u);  // room for 16 new tokens in the 512-token context
  const int64_t n = static_cast<int64_t>(prompt.size());
  const int layers = model_->config().num_layers;
  const int groups = model_->config().num_kv_heads;
  for (PolicyKind kind : AllPolicies()) {
    // One prefill per policy (its PrefillNeeds); compression leaves the cache intact.
    CompressionConfig base;
    base.policy = kind;
    model::KvCache cache;
    ASSERT_OK_AND_ASSIGN(model::ForwardResult pre, Prefill(base, prompt, &cache));
    const at::Tensor& logits = pre.logits;
    for (int budget : {32, 64, 128}) {
      SCOPED_TRACE(std::string(PolicyName(kind)) + " B=" + std::to_string(budget));
      CompressionConfig cfg = base;
      cfg.budget = budget;
      cfg.lookahead = 8;
      if (kind == PolicyKind::kEchoKv) cfg.workspace = 128;
      int calls = 0;
      auto r = CompressPrefilled(cfg, cache, pre, &calls);
      ASSERT_THAT(r, ::echokv::testing::IsOk());
      const CompressionReport& rep = r->report;

      // Retained sets: per layer [G, n_l], ascending, unique, in range.
      ASSERT_EQ(static_cast<int>(r->indices.size()), layers);
      const std::vector<int64_t> pyramid =
          internal::PyramidKvBudgets(budget, cfg.snapkv_window, layers);
      int64_t kept = 0;
      for (int l = 0; l < layers; ++l) {
        const at::Tensor& idx = r->indices[l];
        ASSERT_EQ(idx.size(0), groups);
        const int64_t expected = kind == PolicyKind::kFull        ? n
                                 : kind == PolicyKind::kPyramidKv ? std::min(pyramid[l], n)
                                                                  : std::min<int64_t>(budget, n);
        EXPECT_EQ(idx.size(1), expected) << "layer " << l;
        if (idx.size(1) > 1) {
          at::Tensor diff = idx.narrow(1, 1, idx.size(1) - 1) - idx.narrow(1, 0, idx.size(1) - 1);
          EXPECT_TRUE(diff.gt(0).all().item<bool>()) << "layer " << l << " not strictly ascending";
        }
        EXPECT_GE(idx.min().item<int64_t>(), 0);
        EXPECT_LT(idx.max().item<int64_t>(), n);
        kept += idx.size(1);
      }
      // Bytes ratio == retained / total entries, exactly.
      EXPECT_EQ(rep.retained_entries, groups * kept);
      EXPECT_EQ(rep.total_entries, groups * layers * n);
      EXPECT_EQ(rep.retained_kv_bytes * rep.total_entries, rep.full_kv_bytes * rep.retained_entries);
      EXPECT_EQ(static_cast<double>(rep.retained_kv_bytes) / rep.full_kv_bytes,
                static_cast<double>(rep.retained_entries) / rep.total_entries);
      EXPECT_EQ(rep.full_kv_bytes, cache.KvBytes());
      EXPECT_EQ(rep.context_tokens, n);

      const bool lookahead = kind == PolicyKind::kLaq || kind == PolicyKind::kEchoKv;
      EXPECT_EQ(calls, lookahead ? 8 : 0);
      EXPECT_EQ(rep.forward_passes, lookahead ? 8 : 0);
      if (kind == PolicyKind::kEchoKv) {
        EXPECT_EQ(rep.scoring_passes, 3);
      }

      // Generation continues on the compact cache at position L.
      ASSERT_OK_AND_ASSIGN(model::KvCache compact, model::KvCache::Gather(cache, r->indices));
      EXPECT_EQ(compact.KvBytes(), rep.retained_kv_bytes);
      EXPECT_EQ(compact.next_position(), n);
      std::vector<int> gen = Greedy(logits, &compact, 16);
      EXPECT_EQ(gen.size(), 16u);
      for (int id : gen) {
        EXPECT_GE(id, 0);
        EXPECT_LT(id, model_->config().vocab_size);
      }
      EXPECT_EQ(compact.next_position(), n + 16);
    }
  }
}

TEST_F(StoriesTest, ContextWithinBudgetGeneratesExactlyLikeFullKv) {
  std::vector<int> prompt = Encode(kShortStory);
  ASSERT_GE(prompt.size(), 20u);
  ASSERT_LE(prompt.size(), 64u);
  // The uncompressed model's greedy continuation.
  model::KvCache full = model_->NewCache();
  auto pre = model_->Forward(prompt, &full);
  ASSERT_TRUE(pre.ok()) << pre.status();
  const std::vector<int> reference = Greedy(pre->logits, &full, 32);
  for (PolicyKind kind : AllPolicies()) {
    SCOPED_TRACE(PolicyName(kind));
    CompressionConfig cfg;
    cfg.policy = kind;
    cfg.budget = 64;
    model::KvCache cache;
    ASSERT_OK_AND_ASSIGN(model::ForwardResult pre2, Prefill(cfg, prompt, &cache));
    const at::Tensor& logits = pre2.logits;
    int calls = 0;
    auto r = CompressPrefilled(cfg, cache, pre2, &calls);
    ASSERT_THAT(r, ::echokv::testing::IsOk());
    EXPECT_EQ(calls, 0);
    EXPECT_FALSE(r->report.evicted);
    ASSERT_OK_AND_ASSIGN(model::KvCache compact, model::KvCache::Gather(cache, r->indices));
    EXPECT_EQ(Greedy(logits, &compact, 32), reference);
  }
}

}  // namespace
}  // namespace echokv::compression
