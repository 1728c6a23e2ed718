// Transformer::DecodeBatch (one batched decode step over many caches) against two
// independent oracles: sequential Decode of each row on its own copy of the cache, and
// the float64 naive reference (naive_reference.cc) with each row's own attention mask.
// Rows differ in length, position and per-group retained entries (ragged caches), on
// the tiny random model of every family (llama GQA, mistral sliding window, qwen2 biases).
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "model/transformer.h"
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

// Relative to max(1, max |reference|), as in transformer_test.cc, whose comment derives
// the bound: 1e-5 ≈ 170 float32 unit round-offs, below the ~350 u worst case of the
// deepest float32 chain of these models and ~7x above what two float32 paths measure.
// With ECHOKV_DECODE_BATCH_BLAS=1 a batched product sums in another order than Decode's
// dot products, so the two are round-off apart, no more (by default they are the same
// bits, checked below); a wrong position, mask, cache entry or row mix-up moves
// logits by > 1e-2 (checked below: the comparison can fail).
constexpr double kTol = 1e-5;

// ECHOKV_DECODE_BATCH_BLAS=1: the batched products are OpenBLAS's, in another order.
bool BatchUsesBlas() {
  const char* e = std::getenv("ECHOKV_DECODE_BATCH_BLAS");
  return e != nullptr && std::string(e) == "1";
}

// One row of the test: its token sequence (prompt, then the decoded tokens), how long
// its prompt is, and, for subset rows, which prompt positions each layer/group keeps.
struct RowSpec {
  std::vector<int> tokens;
  int prompt = 0;
  std::vector<std::vector<std::vector<int64_t>>> kept;  // [layer][group] -> positions; empty = full cache
};

constexpr int kSteps = 3;  // decode steps per row

RowSpec MakeRow(const ModelConfig& c, int i) {
  RowSpec r;
  r.prompt = 1 + (i * 5) % 17 + i;  // 1 ... 31: different lengths and positions
  for (int t = 0; t < r.prompt + kSteps; ++t) r.tokens.push_back((t * 7 + i * 13 + (t * t) % 5) % c.vocab_size);
  if (i % 3 == 2 && r.prompt >= 4) {
    // A compact cache: layer l, group g keeps its own subset of the prompt (different
    // counts per layer, like PyramidKV, and different positions per group).
    r.kept.resize(c.num_layers);
    for (int l = 0; l < c.num_layers; ++l) {
      const int keep = std::max(2, r.prompt / (l + 2));
      for (int g = 0; g < c.num_kv_heads; ++g) {
        std::vector<int64_t> s;
        for (int p = 0; p < r.prompt && static_cast<int>(s.size()) < keep; ++p) {
          if ((p + g + l) % 2 == 0 || p == r.prompt - 1) s.push_back(p);
        }
        while (static_cast<int>(s.size()) < keep) {  // fill from the positions skipped
          for (int p = 0; p < r.prompt && static_cast<int>(s.size()) < keep; ++p) {
            if (std::find(s.begin(), s.end(), p) == s.end()) s.push_back(p);
          }
        }
        std::sort(s.begin(), s.end());
        r.kept[l].push_back(s);
      }
    }
  }
  return r;
}

// How a batched step is split over the 2 threads (ECHOKV_DECODE_SPLIT): by operation
// (the default for models of 4M parameters and more) or by rows (each thread runs the
// whole step for its share of the rows: the default for smaller models, these included).
struct BatchCase {
  ModelType type;
  const char* split;
};

void PrintTo(const BatchCase& c, std::ostream* os) { *os << ModelTypeName(c.type) << ", split by " << c.split; }

class DecodeBatchTest : public ::testing::TestWithParam<BatchCase> {
 protected:
  void SetUp() override {
    const ModelType type = GetParam().type;
    ref_ = MakeRandomModel(TinyConfig(type), 777 + static_cast<int>(type));
    dir_ = testing::MakeTempDir("echokv_decode_batch_");
    testing::WriteModelDir(ref_, dir_);
    DeviceOptions dev;
    dev.num_threads = 2;  // the products' blocking and the pools as served
    setenv("ECHOKV_DECODE_SPLIT", GetParam().split, 1);  // read at load
    auto m = Transformer::Load(dir_, dev);
    unsetenv("ECHOKV_DECODE_SPLIT");
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
  }

  // The cache of `row` after its prompt: a full prefill, or the subset view of it.
  KvCache Prefilled(const RowSpec& row) {
    KvCache cache = model_->NewCache();
    EXPECT_OK(model_->Forward(absl::MakeConstSpan(row.tokens.data(), row.prompt), &cache).status());
    if (row.kept.empty()) return cache;
    std::vector<at::Tensor> idx;
    for (const auto& layer : row.kept) {
      at::Tensor t = at::empty({static_cast<int64_t>(layer.size()), static_cast<int64_t>(layer[0].size())}, at::kLong);
      for (size_t g = 0; g < layer.size(); ++g) {
        for (size_t j = 0; j < layer[g].size(); ++j) t[g][j] = layer[g][j];  // position == index after a prefill
      }
      idx.push_back(t);
    }
    absl::StatusOr<KvCache> view = KvCache::Gather(cache, idx);
    EXPECT_OK(view.status());
    return std::move(*view);
  }

  // The float64 reference logits of `row` at every position, with its subset mask.
  std::vector<std::vector<double>> Reference(const RowSpec& row) const {
    if (row.kept.empty()) return ref_.Forward(row.tokens, nullptr);
    auto mask = [&row](int layer, int group, int q, int k) {
      if (q < row.prompt || k >= row.prompt) return true;  // the prompt saw everything; new tokens see each other
      const auto& s = row.kept[layer][group];
      return std::find(s.begin(), s.end(), k) != s.end();
    };
    return ref_.Forward(row.tokens, mask);
  }

  NaiveModel ref_;
  std::string dir_;
  std::unique_ptr<Transformer> model_;
};

// For 1 ... 16 rows: every step's logits, queries and appended entries equal
// sequential Decode of each row alone (kTol), and the logits equal the float64
// reference at that row's own position with that row's own retained entries.
TEST_P(DecodeBatchTest, EqualsSequentialDecodeAndTheReference) {
  const ModelConfig& c = ref_.config;
  double worst_seq = 0, worst_ref = 0, min_margin = 1e9;
  for (int n : {1, 2, 3, 5, 8, 16}) {
    std::vector<RowSpec> specs;
    std::vector<KvCache> batch, alone;
    std::vector<std::vector<std::vector<double>>> expected;
    for (int i = 0; i < n; ++i) {
      specs.push_back(MakeRow(c, i + n));
      batch.push_back(Prefilled(specs.back()));
      alone.push_back(batch.back().Clone());
      expected.push_back(Reference(specs.back()));
    }
    const int64_t batches_before = model_->pool_trace().decode_batches;
    for (int step = 0; step < kSteps; ++step) {
      std::vector<DecodeRow> rows;
      for (int i = 0; i < n; ++i) rows.push_back({specs[i].tokens[specs[i].prompt + step], &batch[i], i % 2 == 1});
      ASSERT_OK_AND_ASSIGN(std::vector<DecodeResult> got, model_->DecodeBatch(rows));
      ASSERT_EQ(got.size(), static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) {
        const RowSpec& s = specs[i];
        const int t = s.prompt + step;
        SCOPED_TRACE(::testing::Message() << "n=" << n << " row " << i << " (prompt " << s.prompt
                                          << (s.kept.empty() ? ", full" : ", subset") << ") step " << step);
        ASSERT_OK_AND_ASSIGN(DecodeResult want, model_->Decode(s.tokens[t], &alone[i], i % 2 == 1));
        ASSERT_EQ(got[i].logits.sizes(), (std::vector<int64_t>{c.vocab_size}));
        const double seq = RelDiff(got[i].logits, want.logits);
        const double ref = RelDiff(got[i].logits, expected[i][t]);
        EXPECT_LT(seq, kTol);
        EXPECT_LT(ref, kTol);
        // Our own products (the default) compute each row as Decode does: the same bits,
        // however the step is split over threads.
        if (!BatchUsesBlas()) {
          EXPECT_TRUE(at::equal(got[i].logits, want.logits));
        }
        worst_seq = std::max(worst_seq, seq);
        worst_ref = std::max(worst_ref, ref);
        // Greedy decisions: how far the top two logits are apart, against the round-off.
        at::Tensor top = std::get<0>(got[i].logits.topk(2));
        min_margin = std::min(min_margin, (top[0] - top[1]).item<double>());
        EXPECT_EQ(got[i].logits.argmax().item<int64_t>(), want.logits.argmax().item<int64_t>());
        ASSERT_EQ(got[i].queries.size(), i % 2 == 1 ? static_cast<size_t>(c.num_layers) : 0u);
        for (size_t l = 0; l < got[i].queries.size(); ++l) {
          EXPECT_EQ(got[i].queries[l].sizes(), (std::vector<int64_t>{c.num_heads, c.head_dim}));
          EXPECT_LT(RelDiff(got[i].queries[l], want.queries[l]), kTol) << "layer " << l;
        }
        EXPECT_EQ(batch[i].next_position(), t + 1);
        EXPECT_EQ(batch[i].cells(), alone[i].cells());
        for (int l = 0; l < c.num_layers; ++l) {
          EXPECT_LT(RelDiff(batch[i].keys(l), alone[i].keys(l)), kTol) << "layer " << l;
          EXPECT_LT(RelDiff(batch[i].values(l), alone[i].values(l)), kTol) << "layer " << l;
        }
      }
    }
    // More than one row takes the batched path; one row is Decode itself.
    EXPECT_EQ(model_->pool_trace().decode_batches - batches_before, n > 1 ? kSteps : 0) << "n=" << n;
  }
  std::printf("[ %s ] worst |batched - sequential| %.2e, |batched - float64| %.2e (of the logit scale); "
              "smallest top-2 logit gap %.2e\n",
              absl::StrCat(ModelTypeName(GetParam().type), " ", GetParam().split).c_str(), worst_seq, worst_ref,
              min_margin);
}

// The comparison can fail: a row decoded at another row's position, or with another
// row's cache, is far outside the tolerance.
TEST_P(DecodeBatchTest, MixedUpRowsAreCaught) {
  const ModelConfig& c = ref_.config;
  RowSpec a = MakeRow(c, 3), b = MakeRow(c, 9);
  ASSERT_NE(a.prompt, b.prompt);
  KvCache ca = Prefilled(a), cb = Prefilled(b);
  std::vector<DecodeRow> rows = {{a.tokens[a.prompt], &ca, false}, {b.tokens[b.prompt], &cb, false}};
  ASSERT_OK_AND_ASSIGN(std::vector<DecodeResult> got, model_->DecodeBatch(rows));
  EXPECT_LT(RelDiff(got[0].logits, Reference(a)[a.prompt]), kTol);
  EXPECT_LT(RelDiff(got[1].logits, Reference(b)[b.prompt]), kTol);
  EXPECT_GT(RelDiff(got[0].logits, Reference(b)[b.prompt]), 1e-2);
  // Row a's token at row b's position: what a shared position would compute.
  RowSpec moved = b;
  moved.tokens[b.prompt] = a.tokens[a.prompt];
  EXPECT_GT(RelDiff(got[0].logits, Reference(moved)[b.prompt]), 1e-2);
}

TEST_P(DecodeBatchTest, BadRowsFailTheCallBeforeAnyCacheChanges) {
  const ModelConfig& c = ref_.config;
  RowSpec a = MakeRow(c, 1);
  KvCache ca = Prefilled(a), cb = Prefilled(a);
  const int64_t size = ca.size(0);
  EXPECT_THAT(model_->DecodeBatch(std::vector<DecodeRow>{{1, &ca, false}, {1, &ca, false}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "share one cache"));
  EXPECT_THAT(model_->DecodeBatch(std::vector<DecodeRow>{{1, &ca, false}, {c.vocab_size, &cb, false}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "rows[1].token"));
  EXPECT_THAT(model_->DecodeBatch(std::vector<DecodeRow>{{1, &ca, false}, {1, nullptr, false}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "rows[1].cache"));
  KvCache wrong(1, 1, 8, at::kFloat);
  EXPECT_THAT(model_->DecodeBatch(std::vector<DecodeRow>{{1, &ca, false}, {1, &wrong, false}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "rows[1].cache shape"));
  EXPECT_EQ(ca.size(0), size);
  EXPECT_EQ(cb.size(0), size);
  EXPECT_EQ(ca.next_position(), a.prompt);
  ASSERT_OK_AND_ASSIGN(std::vector<DecodeResult> none, model_->DecodeBatch({}));
  EXPECT_TRUE(none.empty());
}

INSTANTIATE_TEST_SUITE_P(FamiliesAndSplits, DecodeBatchTest,
                         ::testing::Values(BatchCase{ModelType::kLlama, "ops"}, BatchCase{ModelType::kLlama, "rows"},
                                           BatchCase{ModelType::kMistral, "ops"},
                                           BatchCase{ModelType::kMistral, "rows"},
                                           BatchCase{ModelType::kQwen2, "ops"}, BatchCase{ModelType::kQwen2, "rows"}),
                         [](const auto& info) {
                           return absl::StrCat(ModelTypeName(info.param.type), "_", info.param.split);
                         });

// A bad ECHOKV_DECODE_SPLIT fails the load and names the variable.
TEST(DecodeSplitTest, UnknownValueFailsTheLoad) {
  NaiveModel ref = MakeRandomModel(TinyConfig(ModelType::kLlama), 5);
  const std::string dir = testing::MakeTempDir("echokv_decode_split_");
  testing::WriteModelDir(ref, dir);
  setenv("ECHOKV_DECODE_SPLIT", "columns", 1);
  absl::StatusOr<std::unique_ptr<Transformer>> m = Transformer::Load(dir, DeviceOptions{});
  unsetenv("ECHOKV_DECODE_SPLIT");
  EXPECT_THAT(m.status(), StatusIs(absl::StatusCode::kInvalidArgument, "ECHOKV_DECODE_SPLIT is 'columns'"));
}

}  // namespace
}  // namespace echokv::model
