#include "compression/policy.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compression/config.h"
#include "compression/report.h"
#include "compression/selection.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/rope.h"
#include "model/kv_cache.h"
#include "tests/compression/fake_decoder.h"
#include "tests/testing/status_matchers.h"

namespace echokv::compression {
namespace {

using ::absl::StatusCode;
using ::echokv::compression::testing::FakeDecoder;
using ::echokv::testing::IsOk;
using ::echokv::testing::StatusIs;

constexpr int kHeads = 4;   // H
constexpr int kGroups = 2;  // G (r = 2 query heads per group)
constexpr int kDim = 8;     // d
constexpr int kVocab = 16;  // V

// ---- helpers ----------------------------------------------------------------

std::vector<int64_t> Iota(int64_t begin, int64_t end) {
  std::vector<int64_t> v;
  for (int64_t i = begin; i < end; ++i) v.push_back(i);
  return v;
}

std::vector<int64_t> Concat(std::vector<int64_t> a, const std::vector<int64_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<int64_t> Row(const at::Tensor& t, int64_t g) {
  at::Tensor r = t.select(0, g).to(at::kLong).contiguous();
  return std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
}

bool Contains(const std::vector<int64_t>& v, int64_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// scale * e_i as a [d] vector.
at::Tensor Unit(int i, float scale) {
  at::Tensor v = at::zeros({kDim});
  v[i] = scale;
  return v;
}

// [H, n, d] (n > 0) or [H, d] (n == 0) queries: heads of group 0 along e_a, group 1 along e_b.
at::Tensor GroupQueries(int a, int b, float scale, int64_t n) {
  at::Tensor q = at::zeros({kHeads, kDim});
  for (int h = 0; h < kHeads; ++h) q[h] = Unit(h / (kHeads / kGroups) == 0 ? a : b, scale);
  if (n == 0) return q;
  return q.unsqueeze(1).expand({kHeads, n, kDim}).contiguous();
}

// A context holding keys[l] ([G, L, d]) at positions 0..L-1, next position L.
model::KvCache MakeContext(const std::vector<at::Tensor>& keys) {
  const int64_t n = keys[0].size(1);
  model::KvCache c(static_cast<int>(keys.size()), kGroups, kDim, at::TensorOptions().dtype(at::kFloat));
  const std::vector<int64_t> pos = Iota(0, n);
  for (size_t l = 0; l < keys.size(); ++l) {
    EXPECT_THAT(c.Append(static_cast<int>(l), keys[l], keys[l] * 0.5 + 1.0, pos), IsOk());
  }
  c.set_next_position(n);
  return c;
}

// Everything a Compress call needs except the decoder.
struct Inputs {
  model::KvCache context;
  std::vector<at::Tensor> last_queries;    // per layer [H, N, d]
  std::vector<int64_t> positions;          // N
  std::vector<at::Tensor> anchors;         // per layer [H, d]
  at::Tensor logits = at::zeros({kVocab});
  at::Tensor inv_freq = kernels::RopeInvFreq(kDim, 10000.0);

  CompressionInput Make(LookaheadDecoder* decoder) const {
    CompressionInput in;
    in.context = &context;
    in.last_queries = last_queries;
    in.last_query_positions = positions;
    in.anchor_queries = anchors;
    in.last_logits = logits;
    in.rope_inv_freq = inv_freq;
    in.decoder = decoder;
    return in;
  }
};

// Random keys, every context query (so every policy has what it needs), random anchors.
Inputs RandomInputs(int layers, int64_t n, uint64_t seed) {
  at::manual_seed(seed);
  Inputs in;
  std::vector<at::Tensor> keys;
  for (int l = 0; l < layers; ++l) {
    keys.push_back(at::randn({kGroups, n, kDim}));
    in.last_queries.push_back(at::randn({kHeads, n, kDim}));
    in.anchors.push_back(at::randn({kHeads, kDim}));
  }
  in.context = MakeContext(keys);
  in.positions = Iota(0, n);
  in.logits = at::randn({kVocab});
  return in;
}

std::unique_ptr<FakeDecoder> RandomDecoder(int layers) {
  auto dec = std::make_unique<FakeDecoder>(layers, kHeads, kGroups, kDim, kVocab);
  dec->queries = [](int step, int layer) {
    return at::sin(at::arange(kHeads * kDim).reshape({kHeads, kDim}).to(at::kFloat) *
                   (0.37f * static_cast<float>(step + 1) + static_cast<float>(layer))) * 3.0f;
  };
  return dec;
}

// |I| per layer, unique, ascending, within range.
void ExpectValidSelection(const CompressionResult& r, const model::KvCache& ctx,
                          const std::vector<int64_t>& expected_sizes) {
  ASSERT_EQ(static_cast<int>(r.indices.size()), ctx.num_layers());
  for (int l = 0; l < ctx.num_layers(); ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const at::Tensor& idx = r.indices[l];
    EXPECT_EQ(idx.scalar_type(), at::kLong);
    EXPECT_TRUE(idx.device().is_cpu());
    ASSERT_EQ(idx.dim(), 2);
    ASSERT_EQ(idx.size(0), kGroups);
    EXPECT_EQ(idx.size(1), expected_sizes[l]);
    EXPECT_EQ(r.report.retained_per_layer[l], idx.size(1));
    for (int64_t g = 0; g < kGroups; ++g) {
      std::vector<int64_t> row = Row(idx, g);
      for (size_t i = 0; i < row.size(); ++i) {
        EXPECT_GE(row[i], 0);
        EXPECT_LT(row[i], ctx.size(l));
        if (i > 0) {
          EXPECT_LT(row[i - 1], row[i]) << "not strictly ascending in group " << g;
        }
      }
    }
  }
}

std::vector<std::string> PhaseNames(const CompressionReport& r) {
  std::vector<std::string> names;
  for (const PhaseTime& p : r.phases) names.push_back(p.phase);
  return names;
}

// Expected entries per layer: min(B, n) (PyramidKV: its per-layer budgets; Full: n).
std::vector<int64_t> ExpectedSizes(const CompressionConfig& cfg, const model::KvCache& ctx) {
  std::vector<int64_t> out;
  int64_t max_n = 0;
  for (int l = 0; l < ctx.num_layers(); ++l) max_n = std::max(max_n, ctx.size(l));
  std::vector<int64_t> pyramid =
      internal::PyramidKvBudgets(cfg.budget, cfg.snapkv_window, ctx.num_layers());
  for (int l = 0; l < ctx.num_layers(); ++l) {
    const int64_t n = ctx.size(l);
    if (cfg.policy == PolicyKind::kFull || max_n <= cfg.budget) {
      out.push_back(n);
    } else if (cfg.policy == PolicyKind::kPyramidKv) {
      out.push_back(std::min(pyramid[l], n));
    } else {
      out.push_back(std::min<int64_t>(cfg.budget, n));
    }
  }
  return out;
}

// ---- invariants (docs/ALGORITHM.md §3) ----------------------------------------


// ---- float64 oracles (independent of kernels/: hand loops over plain vectors) -------

// A [rows, d] float tensor as row vectors of doubles.
std::vector<std::vector<double>> Rows2D(const at::Tensor& t) {
  at::Tensor c = t.to(at::kDouble).contiguous();
  std::vector<std::vector<double>> out(c.size(0), std::vector<double>(c.size(1)));
  for (int64_t i = 0; i < c.size(0); ++i) {
    for (int64_t j = 0; j < c.size(1); ++j) out[i][j] = c.data_ptr<double>()[i * c.size(1) + j];
  }
  return out;
}

// HF rotate_half RoPE of `v` to absolute position `pos`, angles pos * theta^(-2i/d) in double.
std::vector<double> HandRope(const std::vector<double>& v, int64_t pos, double theta) {
  const int d = static_cast<int>(v.size()), half = d / 2;
  std::vector<double> out(d);
  for (int i = 0; i < half; ++i) {
    const double angle = static_cast<double>(pos) * std::pow(theta, -2.0 * i / d);
    out[i] = v[i] * std::cos(angle) - v[i + half] * std::sin(angle);
    out[i + half] = v[i + half] * std::cos(angle) + v[i] * std::sin(angle);
  }
  return out;
}

// softmax_j(q . k_j / sqrt(d)) over keys[0 .. count-1].
std::vector<double> HandSoftmax(const std::vector<double>& q, const std::vector<std::vector<double>>& keys,
                                size_t count) {
  std::vector<double> s(count);
  double mx = -INFINITY;
  for (size_t j = 0; j < count; ++j) {
    double dot = 0;
    for (size_t i = 0; i < q.size(); ++i) dot += q[i] * keys[j][i];
    s[j] = dot / std::sqrt(static_cast<double>(q.size()));
    mx = std::max(mx, s[j]);
  }
  double den = 0;
  for (double& v : s) den += (v = std::exp(v - mx));
  for (double& v : s) v /= den;
  return s;
}

// TopK_k of scores[0 .. candidates-1] (ties to the lower index), sorted ascending, and
// the gap between the k-th and (k+1)-th largest score (how far the choice is from a tie).
std::vector<int64_t> HandTopK(const std::vector<double>& scores, size_t candidates, size_t k, double* gap) {
  std::vector<int64_t> order(candidates);
  for (size_t i = 0; i < candidates; ++i) order[i] = static_cast<int64_t>(i);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return scores[a] > scores[b]; });
  if (gap != nullptr) *gap = k < candidates ? scores[order[k - 1]] - scores[order[k]] : INFINITY;
  std::vector<int64_t> top(order.begin(), order.begin() + std::min(k, candidates));
  std::sort(top.begin(), top.end());
  return top;
}

TEST(Invariants, EveryPolicyKeepsMinBLUniqueAscendingInRange) {
  const Inputs in = RandomInputs(/*layers=*/3, /*n=*/64, /*seed=*/1);
  for (PolicyKind kind : AllPolicies()) {
    for (int budget : {1, 5, 16, 33, 63}) {
      for (int workspace : {0, 40}) {  // 0 = default (echokv 1024 >= L, laq = B)
        SCOPED_TRACE(std::string(PolicyName(kind)) + " B=" + std::to_string(budget) +
                     " B1=" + std::to_string(workspace));
        CompressionConfig cfg;
        cfg.policy = kind;
        cfg.budget = budget;
        cfg.lookahead = 4;
        cfg.snapkv_window = 8;
        if (workspace >= budget) cfg.workspace = workspace;
        auto dec = RandomDecoder(3);
        ASSERT_OK_AND_ASSIGN(CompressionResult r, Compress(cfg, in.Make(dec.get())));
        ExpectValidSelection(r, in.context, ExpectedSizes(cfg, in.context));
        EXPECT_EQ(r.report.context_tokens, 64);
        EXPECT_TRUE(r.report.evicted || kind == PolicyKind::kFull);
        const bool lookahead = kind == PolicyKind::kLaq || kind == PolicyKind::kEchoKv;
        EXPECT_EQ(static_cast<int>(dec->calls.size()), lookahead ? 4 : 0);
        EXPECT_EQ(r.report.forward_passes, lookahead ? 4 : 0);
        EXPECT_EQ(static_cast<int>(r.report.lookahead_tokens.size()), lookahead ? 4 : 0);
      }
    }
  }
}

TEST(Invariants, EchoKvRunsExactlyTStepsAndThreeScoringPasses) {
  const Inputs in = RandomInputs(2, 80, 2);
  for (int t : {2, 4, 8, 16}) {
    for (bool repair : {true, false}) {
      SCOPED_TRACE("T=" + std::to_string(t) + " repair=" + std::to_string(repair));
      CompressionConfig cfg;
      cfg.budget = 16;
      cfg.workspace = 32;
      cfg.lookahead = t;
      cfg.repair = repair;
      auto dec = RandomDecoder(2);
      ASSERT_OK_AND_ASSIGN(CompressionResult r, Compress(cfg, in.Make(dec.get())));
      EXPECT_EQ(static_cast<int>(dec->calls.size()), t);
      EXPECT_EQ(r.report.forward_passes, t);
      EXPECT_EQ(r.report.scoring_passes, repair ? 3 : 2);
      // The steps run at the true positions L, L+1, ..., L+T-1.
      for (int k = 0; k < t; ++k) EXPECT_EQ(dec->calls[k].position, 80 + k);
      if (repair) {
        EXPECT_THAT(PhaseNames(r.report),
                    ::testing::ElementsAre("bootstrap", "round1", "repair", "round2", "final"));
      } else {
        EXPECT_THAT(PhaseNames(r.report),
                    ::testing::ElementsAre("bootstrap", "round1", "round2", "final"));
      }
      EXPECT_GE(r.report.overlap_w1_w2, 0.0);
      EXPECT_LE(r.report.overlap_w1_w2, 1.0);
      if (!repair) {
        EXPECT_DOUBLE_EQ(r.report.overlap_w1_w2, 1.0);
      }
      EXPECT_GE(r.report.overlap_w2_final, 0.0);
      EXPECT_GE(r.report.overlap_w1_final, 0.0);
    }
  }
}

TEST(Invariants, LaqRunsExactlyTStepsPlusItsScoring) {
  const Inputs in = RandomInputs(2, 80, 3);
  CompressionConfig cfg;
  cfg.policy = PolicyKind::kLaq;
  cfg.budget = 20;
  cfg.lookahead = 8;
  cfg.snapkv_window = 8;
  auto dec = RandomDecoder(2);
  ASSERT_OK_AND_ASSIGN(CompressionResult r, Compress(cfg, in.Make(dec.get())));
  EXPECT_EQ(dec->calls.size(), 8u);
  EXPECT_EQ(r.report.forward_passes, 8);
  EXPECT_EQ(r.report.scoring_passes, 2);  // SnapKV workspace + final
  EXPECT_EQ(r.report.config.workspace.value_or(-1), 20);  // resolved: LAQ's B1 = B
  EXPECT_THAT(PhaseNames(r.report), ::testing::ElementsAre("bootstrap", "round1", "final"));
  EXPECT_GE(r.report.overlap_w1_final, 0.0);
  EXPECT_DOUBLE_EQ(r.report.overlap_w1_w2, -1.0);
}

TEST(Invariants, ContextWithinBudgetKeepsEverythingAndRunsNoLookahead) {
  const Inputs in = RandomInputs(3, 20, 4);
  for (PolicyKind kind : AllPolicies()) {
    for (int budget : {20, 64}) {
      SCOPED_TRACE(std::string(PolicyName(kind)) + " B=" + std::to_string(budget));
      CompressionConfig cfg;
      cfg.policy = kind;
      cfg.budget = budget;
      auto dec = RandomDecoder(3);
      ASSERT_OK_AND_ASSIGN(CompressionResult r, Compress(cfg, in.Make(dec.get())));
      ExpectValidSelection(r, in.context, {20, 20, 20});
      for (int l = 0; l < 3; ++l) {
        for (int g = 0; g < kGroups; ++g) EXPECT_EQ(Row(r.indices[l], g), Iota(0, 20));
      }
      EXPECT_TRUE(dec->calls.empty());
      EXPECT_EQ(r.report.forward_passes, 0);
      EXPECT_FALSE(r.report.evicted);
      EXPECT_EQ(r.report.retained_entries, r.report.total_entries);
      EXPECT_EQ(r.report.retained_kv_bytes, r.report.full_kv_bytes);
    }
  }
}

TEST(Invariants, DeterministicAcrossRuns) {
  const Inputs in = RandomInputs(2, 96, 5);
  for (PolicyKind kind : AllPolicies()) {
    SCOPED_TRACE(PolicyName(kind));
    CompressionConfig cfg;
    cfg.policy = kind;
    cfg.budget = 24;
    cfg.workspace = 48;
    cfg.lookahead = 6;
    cfg.snapkv_window = 8;
    auto dec1 = RandomDecoder(2);
    auto dec2 = RandomDecoder(2);
    ASSERT_OK_AND_ASSIGN(CompressionResult a, Compress(cfg, in.Make(dec1.get())));
    ASSERT_OK_AND_ASSIGN(CompressionResult b, Compress(cfg, in.Make(dec2.get())));
    for (int l = 0; l < 2; ++l) EXPECT_TRUE(at::equal(a.indices[l], b.indices[l]));
    EXPECT_EQ(a.report.lookahead_tokens, b.report.lookahead_tokens);
    EXPECT_EQ(a.report.overlap_w1_w2, b.report.overlap_w1_w2);
  }
}

TEST(Invariants, ReportBytesFollowSection7) {
  const Inputs in = RandomInputs(3, 70, 6);
  for (PolicyKind kind : AllPolicies()) {
    SCOPED_TRACE(PolicyName(kind));
    CompressionConfig cfg;
    cfg.policy = kind;
    cfg.budget = 40;
    cfg.lookahead = 2;
    auto dec = RandomDecoder(3);
    ASSERT_OK_AND_ASSIGN(CompressionResult r, Compress(cfg, in.Make(dec.get())));
    int64_t kept = 0;
    for (const at::Tensor& idx : r.indices) kept += idx.size(1);
    const int64_t per_entry = 2 * kDim * 4;  // K and V, float32
    EXPECT_EQ(r.report.retained_entries, kGroups * kept);
    EXPECT_EQ(r.report.total_entries, kGroups * 3 * 70);
    EXPECT_EQ(r.report.retained_kv_bytes, kGroups * kept * per_entry);
    EXPECT_EQ(r.report.full_kv_bytes, kGroups * 3 * 70 * per_entry);
    EXPECT_EQ(r.report.num_layers, 3);
    EXPECT_EQ(r.report.num_kv_heads, kGroups);
    // The bytes ratio is the entries ratio exactly.
    EXPECT_EQ(static_cast<double>(r.report.retained_kv_bytes) / r.report.full_kv_bytes,
              static_cast<double>(r.report.retained_entries) / r.report.total_entries);
    // The compact cache built from the indices holds exactly the reported bytes.
    ASSERT_OK_AND_ASSIGN(model::KvCache compact, model::KvCache::Gather(in.context, r.indices));
    EXPECT_EQ(compact.KvBytes(), r.report.retained_kv_bytes);
    EXPECT_EQ(in.context.KvBytes(), r.report.full_kv_bytes);
    const std::string json = ReportToJson(r.report);
    EXPECT_THAT(json, ::testing::HasSubstr("\"policy\":\"" + std::string(PolicyName(kind)) + "\""));
    EXPECT_THAT(json, ::testing::HasSubstr("\"retained_kv_bytes\":" +
                                           std::to_string(r.report.retained_kv_bytes)));
  }
}

// ---- crafted baselines ----------------------------------------------------------

TEST(StreamingLlm, KeepsSinksAndRecent) {
  Inputs in = RandomInputs(1, 30, 7);
  CompressionConfig cfg;
  cfg.policy = PolicyKind::kStreamingLlm;
  cfg.budget = 10;
  ASSERT_OK_AND_ASSIGN(CompressionResult r, Compress(cfg, in.Make(nullptr)));
  for (int g = 0; g < kGroups; ++g) {
    EXPECT_EQ(Row(r.indices[0], g), Concat(Iota(0, 4), Iota(24, 30)));
  }
  cfg.budget = 3;  // fewer than 4 sinks fit
  ASSERT_OK_AND_ASSIGN(r, Compress(cfg, in.Make(nullptr)));
  EXPECT_EQ(Row(r.indices[0], 0), Iota(0, 3));
  EXPECT_THAT(PhaseNames(r.report), ::testing::ElementsAre("select"));
}

// Keys zero except a planted key per group; queries of group 0 point at e_0, group 1 at e_1.
Inputs PlantedInputs(int64_t n, int64_t planted0, int64_t planted1, int64_t num_queries) {
  Inputs in;
  at::Tensor keys = at::zeros({kGroups, n, kDim});
  keys[0][planted0] = Unit(0, 4.0f);
  keys[1][planted1] = Unit(1, 4.0f);
  in.context = MakeContext({keys});
  if (num_queries > 0) {
    in.last_queries = {GroupQueries(0, 1, 4.0f, num_queries)};
    in.positions = Iota(n - num_queries, n);
  }
  in.anchors = {at::zeros({kHeads, kDim})};  // proposals score every key equally
  return in;
}

TEST(SnapKv, KeepsPlantedKeyAndItsPooledNeighboursPlusWindow) {
  const Inputs in = PlantedInputs(64, 40, 45, 8);
  CompressionConfig cfg;
  cfg.policy = PolicyKind::kSnapKv;
  cfg.budget = 16;
  cfg.snapkv_window = 8;
  ASSERT_OK_AND_ASSIGN(CompressionResult r, Compress(cfg, in.Make(nullptr)));
  // Prefix 0..55, TopK_8 of the pooled scores: the 7 pooled neighbours of the planted
  // key tie at its score and come before every other key; the 8th is the lowest index.
  EXPECT_EQ(Row(r.indices[0], 0), Concat(Concat({0}, Iota(37, 44)), Iota(56, 64)));
  EXPECT_EQ(Row(r.indices[0], 1), Concat(Concat({0}, Iota(42, 49)), Iota(56, 64)));
  EXPECT_EQ(r.report.scoring_passes, 1);

  // Without pooling only the planted key itself stands out.
  cfg.snapkv_kernel = 1;
  ASSERT_OK_AND_ASSIGN(r, Compress(cfg, in.Make(nullptr)));
  EXPECT_EQ(Row(r.indices[0], 0), Concat(Concat(Iota(0, 7), {40}), Iota(56, 64)));

  // B == window keeps only the window.
  cfg.budget = 8;
  ASSERT_OK_AND_ASSIGN(r, Compress(cfg, in.Make(nullptr)));
  EXPECT_EQ(Row(r.indices[0], 0), Iota(56, 64));
}

TEST(SnapKv, MissingWindowQueriesIsAnError) {
  Inputs in = PlantedInputs(64, 40, 45, 0);
  CompressionConfig cfg;
  cfg.policy = PolicyKind::kSnapKv;
  cfg.budget = 16;
  EXPECT_THAT(Compress(cfg, in.Make(nullptr)),
              StatusIs(StatusCode::kInvalidArgument, "last_queries"));
}

TEST(H2o, KeepsHeavyHitterAndRecent) {
  Inputs in;
  at::Tensor keys = at::zeros({kGroups, 32, kDim});
  keys[0][10] = Unit(0, 4.0f);
  keys[1][12] = Unit(1, 4.0f);
  in.context = MakeContext({keys});
  in.last_queries = {GroupQueries(0, 1, 4.0f, 32)};
  in.positions = Iota(0, 32);
  CompressionConfig cfg;
  cfg.policy = PolicyKind::kH2o;
  cfg.budget = 8;
  ASSERT_OK_AND_ASSIGN(CompressionResult r, Compress(cfg, in.Make(nullptr)));
  // recent = 4 (28..31); heavy = 4 from 0..27: the planted key (attended by every later
  // query) and then the oldest keys (the longest harmonic tails of uniform attention).
  EXPECT_EQ(Row(r.indices[0], 0), std::vector<int64_t>({0, 1, 2, 10, 28, 29, 30, 31}));
  EXPECT_EQ(Row(r.indices[0], 1), std::vector<int64_t>({0, 1, 2, 12, 28, 29, 30, 31}));
  EXPECT_EQ(r.report.scoring_passes, 1);
}

// docs/ALGORITHM.md §8.5 with odd budgets (where floor(B/2) and ceil(B/2) differ) against a
// float64 oracle: recent = floor(B/2) newest entries, heavy = B - recent from 0 ... L-recent-1
// by the group sum of causal column sums (diagonal included) of every context query.
// The test checks that the ceil(B/2) split would keep a different set.
TEST(H2o, OddBudgetKeepsExactlyFloorHalfRecentAndTheHeaviestOfTheRest) {
  constexpr int kLayers = 2;
  constexpr int64_t kL = 40;
  const Inputs in = RandomInputs(kLayers, kL, 31);
  for (int budget : {5, 7, 9}) {
    CompressionConfig cfg;
    cfg.policy = PolicyKind::kH2o;
    cfg.budget = budget;
    ASSERT_OK_AND_ASSIGN(CompressionResult r, Compress(cfg, in.Make(nullptr)));
    int differs = 0;
    for (int l = 0; l < kLayers; ++l) {
      for (int g = 0; g < kGroups; ++g) {
        SCOPED_TRACE("B=" + std::to_string(budget) + " layer " + std::to_string(l) + " group " + std::to_string(g));
        const std::vector<std::vector<double>> keys = Rows2D(in.context.keys(l).select(0, g));  // [L][d]
        std::vector<double> col(kL, 0.0);
        for (int h = 0; h < kHeads; ++h) {
          if (h / (kHeads / kGroups) != g) continue;
          const std::vector<std::vector<double>> q = Rows2D(in.last_queries[l].select(0, h));  // [L][d]
          for (int64_t j = 0; j < kL; ++j) {
            const std::vector<double> p = HandSoftmax(q[j], keys, j + 1);  // causal: keys 0 ... j
            for (int64_t i = 0; i <= j; ++i) col[i] += p[i];
          }
        }
        auto kept_for = [&](int64_t recent, double* gap) {
          std::vector<int64_t> kept = HandTopK(col, kL - recent, budget - recent, gap);
          for (int64_t i = kL - recent; i < kL; ++i) kept.push_back(i);
          return kept;
        };
        double gap = 0;
        const std::vector<int64_t> want = kept_for(budget / 2, &gap);
        EXPECT_GT(gap, 1e-4);
        EXPECT_EQ(Row(r.indices[l], g), want);
        if (kept_for((budget + 1) / 2, nullptr) != want) ++differs;
      }
    }
    EXPECT_GE(differs, 1) << "B=" << budget << ": the ceil(B/2) split keeps the same sets";
  }
}

TEST(PyramidKv, BudgetsFollowTheFormula) {
  EXPECT_EQ(internal::PyramidKvBudgets(64, 32, 5), std::vector<int64_t>({95, 80, 64, 48, 33}));
  // B=128: C=96, B_min=4, B_max=188 -> 188, 142, 96, 50, 4 (+32).
  EXPECT_EQ(internal::PyramidKvBudgets(128, 32, 5),
            std::vector<int64_t>({220, 174, 128, 82, 36}));
  // Against the formula evaluated in double with round-half-to-even (nearbyint).
  for (int budget : {33, 64, 100, 128, 512, 1000}) {
    for (int layers : {2, 3, 5, 8, 22, 32}) {
      SCOPED_TRACE("B=" + std::to_string(budget) + " layers=" + std::to_string(layers));
      const std::vector<int64_t> b = internal::PyramidKvBudgets(budget, 32, layers);
      ASSERT_EQ(static_cast<int>(b.size()), layers);
      const int64_t c = budget - 32;
      const int64_t bmin = c / 20;
      const int64_t bmax = 2 * c - bmin;
      int64_t sum = 0;
      for (int l = 0; l < layers; ++l) {
        const double x = bmax - static_cast<double>(bmax - bmin) * l / (layers - 1);
        EXPECT_EQ(b[l], static_cast<int64_t>(std::nearbyint(x)) + 32) << "layer " << l;
        sum += b[l];
      }
      EXPECT_EQ(sum, static_cast<int64_t>(budget) * layers);  // mean = B
    }
  }
}

TEST(PyramidKv, PerLayerRetentionAndWindow) {
  const Inputs in = RandomInputs(5, 200, 8);
  CompressionConfig cfg;
  cfg.policy = PolicyKind::kPyramidKv;
  cfg.budget = 64;
  ASSERT_OK_AND_ASSIGN(CompressionResult r, Compress(cfg, in.Make(nullptr)));
  EXPECT_EQ(r.report.retained_per_layer, std::vector<int64_t>({95, 80, 64, 48, 33}));
  ExpectValidSelection(r, in.context, {95, 80, 64, 48, 33});
  EXPECT_EQ(r.report.retained_entries, kGroups * 64 * 5);  // averages to B
  for (int l = 0; l < 5; ++l) {
    for (int g = 0; g < kGroups; ++g) {
      std::vector<int64_t> row = Row(r.indices[l], g);
      std::vector<int64_t> tail(row.end() - 32, row.end());
      EXPECT_EQ(tail, Iota(168, 200));  // the observation window is always kept
    }
  }
  // A short context: layers whose budget exceeds L keep everything.
  const Inputs small = RandomInputs(5, 90, 9);
  ASSERT_OK_AND_ASSIGN(r, Compress(cfg, small.Make(nullptr)));
  EXPECT_EQ(r.report.retained_per_layer, std::vector<int64_t>({90, 80, 64, 48, 33}));
}

// ---- lookahead policies with planted keys ----------------------------------------

// Lookahead queries: group 0's heads point at e_0 (planted key 40), group 1's at e_1 (45).
std::unique_ptr<FakeDecoder> PlantedDecoder() {
  auto dec = std::make_unique<FakeDecoder>(1, kHeads, kGroups, kDim, kVocab);
  dec->queries = [](int, int) { return GroupQueries(0, 1, 4.0f, 0); };
  dec->next_token = [](int step) { return (5 * step + 1) % kVocab; };
  return dec;
}

TEST(Laq, FinalSetContainsKeysTheLookaheadQueriesPointAt) {
  // Window queries are zero: the SnapKV workspace is blind to the planted keys.
  Inputs in = PlantedInputs(64, 40, 45, 0);
  in.last_queries = {at::zeros({kHeads, 8, kDim})};
  in.positions = Iota(56, 64);
  CompressionConfig cfg;
  cfg.policy = PolicyKind::kLaq;
  cfg.budget = 12;
  cfg.lookahead = 4;
  cfg.snapkv_window = 4;
  auto dec = PlantedDecoder();
  ASSERT_OK_AND_ASSIGN(CompressionResult r, Compress(cfg, in.Make(dec.get())));
  ASSERT_EQ(dec->calls.size(), 4u);
  // Frozen workspace: TopK_8 of a uniform pooled prefix (lowest indices) + window 60..63.
  for (const FakeDecoder::Call& c : dec->calls) {
    for (int g = 0; g < kGroups; ++g) {
      std::vector<int64_t> view = Row(c.view_positions[0], g);
      std::vector<int64_t> ctx_part(view.begin(), view.begin() + 12);
      EXPECT_EQ(ctx_part, Concat(Iota(0, 8), Iota(60, 64)));
      EXPECT_EQ(view.back(), c.position);
    }
  }
  // Final: TopK_4 of the pooled prefix 0..55 -> the planted key's pooled neighbourhood,
  // lowest first (37..40 / 42..45), plus the last 8 entries.
  EXPECT_EQ(Row(r.indices[0], 0), Concat(Iota(37, 41), Iota(56, 64)));
  EXPECT_EQ(Row(r.indices[0], 1), Concat(Iota(42, 46), Iota(56, 64)));
  EXPECT_DOUBLE_EQ(r.report.overlap_w1_final, 4.0 / 12.0);
  EXPECT_EQ(r.report.lookahead_tokens, std::vector<int>({1, 6, 11, 0}));
}

TEST(EchoKv, FinalSetContainsPlantedKeysPerGroupIndependently) {
  Inputs in = PlantedInputs(64, 40, 45, 0);
  in.logits = at::zeros({kVocab});
  in.logits[3] = 2.0f;  // a tie: x_0 is the lowest id
  in.logits[9] = 2.0f;
  CompressionConfig cfg;
  cfg.budget = 8;
  cfg.workspace = 16;
  cfg.lookahead = 4;
  auto dec = PlantedDecoder();
  ASSERT_OK_AND_ASSIGN(CompressionResult r, Compress(cfg, in.Make(dec.get())));
  // Zero anchor: W1 = the 16 lowest indices (ties -> lower index) in both groups.
  EXPECT_EQ(Row(dec->calls[0].view_positions[0], 0), Concat(Iota(0, 16), {64}));
  // Final: TopK_8 of [Q1;Q2] with no pooling: the planted key + the lowest indices.
  EXPECT_EQ(Row(r.indices[0], 0), Concat(Iota(0, 7), {40}));
  EXPECT_EQ(Row(r.indices[0], 1), Concat(Iota(0, 7), {45}));
  // Greedy lookahead: x_0 from the prefill logits (tie -> 3), then the scripted argmaxes.
  ASSERT_EQ(dec->calls.size(), 4u);
  EXPECT_EQ(dec->calls[0].token, 3);
  EXPECT_EQ(dec->calls[1].token, 1);
  EXPECT_EQ(dec->calls[2].token, 6);
  EXPECT_EQ(dec->calls[3].token, 11);
  EXPECT_EQ(r.report.lookahead_tokens, std::vector<int>({1, 6, 11, 0}));
  EXPECT_DOUBLE_EQ(r.report.overlap_w1_w2, 15.0 / 16.0);
  EXPECT_DOUBLE_EQ(r.report.overlap_w1_final, 7.0 / 8.0);
  EXPECT_DOUBLE_EQ(r.report.overlap_w2_final, 1.0);
}

TEST(EchoKv, RepairAddsKeysW1MissedAndRoundTwoKeepsRoundOneKv) {
  const Inputs in = PlantedInputs(64, 40, 45, 0);
  for (bool repair : {true, false}) {
    SCOPED_TRACE(repair ? "repair=on" : "repair=off");
    CompressionConfig cfg;
    cfg.budget = 8;
    cfg.workspace = 16;
    cfg.lookahead = 4;
    cfg.repair = repair;
    auto dec = PlantedDecoder();
    ASSERT_OK_AND_ASSIGN(CompressionResult r, Compress(cfg, in.Make(dec.get())));
    ASSERT_EQ(dec->calls.size(), 4u);
    // Round 2's first step (call 2): W2 + round 1's two lookahead entries + its own.
    const FakeDecoder::Call& c = dec->calls[2];
    std::vector<int64_t> w2_group0 = repair ? Concat(Iota(0, 15), {40}) : Iota(0, 16);
    std::vector<int64_t> w2_group1 = repair ? Concat(Iota(0, 15), {45}) : Iota(0, 16);
    EXPECT_EQ(Row(c.view_positions[0], 0), Concat(w2_group0, {64, 65, 66}));
    EXPECT_EQ(Row(c.view_positions[0], 1), Concat(w2_group1, {64, 65, 66}));
    EXPECT_EQ(Contains(Row(c.view_positions[0], 0), 40), repair);
    // Round 1's lookahead KV exactly as round 1 computed it.
    const at::Tensor k = c.view_keys[0];  // [G, 19, d]
    ASSERT_EQ(k.size(1), 19);
    EXPECT_TRUE(at::equal(k.narrow(1, 16, 1), at::full({kGroups, 1, kDim}, FakeDecoder::AppendedKey(0))));
    EXPECT_TRUE(at::equal(k.narrow(1, 17, 1), at::full({kGroups, 1, kDim}, FakeDecoder::AppendedKey(1))));
    EXPECT_TRUE(at::equal(k.narrow(1, 18, 1), at::full({kGroups, 1, kDim}, FakeDecoder::AppendedKey(2))));
    // The context part of the round-2 view holds the context's own keys.
    EXPECT_TRUE(at::equal(k.select(0, 0).select(0, repair ? 15 : 0),
                          repair ? Unit(0, 4.0f) : at::zeros({kDim})));
    // Last step sees all 4 lookahead entries.
    EXPECT_EQ(Row(dec->calls[3].view_positions[0], 0).back(), 67);
    EXPECT_EQ(dec->calls[3].view_positions[0].size(1), 20);
    EXPECT_EQ(r.report.scoring_passes, repair ? 3 : 2);
    // The final selection is the same either way (§8.8): it scores the full context.
    EXPECT_EQ(Row(r.indices[0], 0), Concat(Iota(0, 7), {40}));
  }
}

TEST(EchoKv, StageTwoWindowKeepsTheLastW) {
  const Inputs in = PlantedInputs(64, 40, 45, 0);
  CompressionConfig cfg;
  cfg.budget = 8;
  cfg.workspace = 16;
  cfg.lookahead = 4;
  cfg.stage2_window = 3;
  auto dec = PlantedDecoder();
  ASSERT_OK_AND_ASSIGN(CompressionResult r, Compress(cfg, in.Make(dec.get())));
  EXPECT_EQ(Row(r.indices[0], 0), Concat(Concat(Iota(0, 4), {40}), Iota(61, 64)));
  EXPECT_EQ(Row(r.indices[0], 1), Concat(Concat(Iota(0, 4), {45}), Iota(61, 64)));
}

TEST(EchoKv, SnapKvBootstrapUsesTheSnapKvSelectionAsW1) {
  // Window queries point at the planted keys, so SnapKV's W1 (capacity 16, window 8)
  // is {0, pooled neighbourhood, window} per group.
  const Inputs in = PlantedInputs(64, 40, 45, 8);
  CompressionConfig cfg;
  cfg.budget = 8;
  cfg.workspace = 16;
  cfg.lookahead = 4;
  cfg.snapkv_window = 8;
  cfg.bootstrap = Bootstrap::kSnapKv;
  auto dec = PlantedDecoder();
  ASSERT_OK_AND_ASSIGN(CompressionResult r, Compress(cfg, in.Make(dec.get())));
  EXPECT_EQ(Row(dec->calls[0].view_positions[0], 0),
            Concat(Concat(Concat({0}, Iota(37, 44)), Iota(56, 64)), {64}));
  EXPECT_EQ(Row(dec->calls[0].view_positions[0], 1),
            Concat(Concat(Concat({0}, Iota(42, 49)), Iota(56, 64)), {64}));
  EXPECT_EQ(r.report.scoring_passes, 3);
  EXPECT_EQ(Row(r.indices[0], 0), Concat(Iota(0, 7), {40}));
}

TEST(EchoKv, WorkspaceCoveringTheContextStillRunsTheSteps) {
  const Inputs in = PlantedInputs(64, 40, 45, 0);
  CompressionConfig cfg;  // B1 = 1024 >= L > B (§8.10)
  cfg.budget = 8;
  cfg.lookahead = 4;
  auto dec = PlantedDecoder();
  ASSERT_OK_AND_ASSIGN(CompressionResult r, Compress(cfg, in.Make(dec.get())));
  EXPECT_EQ(dec->calls.size(), 4u);
  EXPECT_EQ(Row(dec->calls[0].view_positions[0], 0), Concat(Iota(0, 64), {64}));
  EXPECT_EQ(r.report.config.workspace.value_or(-1), 1024);
  EXPECT_EQ(Row(r.indices[0], 1), Concat(Iota(0, 7), {45}));
}

TEST(EchoKv, ProposalsAreTheAnchorRotatedToFuturePositions) {
  // One key equals the anchor rotated to position L (the first proposal): it must be
  // in W1 even though the anchor itself (unrotated) points elsewhere.
  Inputs in = PlantedInputs(64, 40, 45, 0);
  at::Tensor anchor = at::zeros({kHeads, kDim});
  for (int h = 0; h < kHeads; ++h) anchor[h] = Unit(2, 4.0f);
  in.anchors = {anchor};
  std::vector<int64_t> future = {64};
  at::Tensor rotated = kernels::RotateToPositions(anchor, future, in.inv_freq);  // [H, 1, d]
  at::Tensor keys = in.context.keys(0).clone();
  keys[0][50] = rotated[0][0];
  keys[1][20] = rotated[2][0];
  model::KvCache ctx = MakeContext({keys});
  in.context = std::move(ctx);
  CompressionConfig cfg;
  cfg.budget = 4;
  cfg.workspace = 4;
  cfg.lookahead = 2;
  auto dec = std::make_unique<FakeDecoder>(1, kHeads, kGroups, kDim, kVocab);
  ASSERT_OK_AND_ASSIGN(CompressionResult r, Compress(cfg, in.Make(dec.get())));
  EXPECT_TRUE(Contains(Row(dec->calls[0].view_positions[0], 0), 50));
  EXPECT_TRUE(Contains(Row(dec->calls[0].view_positions[0], 1), 20));
  EXPECT_FALSE(Contains(Row(dec->calls[0].view_positions[0], 0), 20));
}

// docs/ALGORITHM.md §3 step 2 with an independent oracle: W1 (the view of the first lookahead
// step, minus that step's own entry) equals TopK_B1 of the Eq. 3 group scores of the
// anchor rotated by hand, in double, to exactly L ... L+T-1. The default frequencies at
// d = 8 include 1 rad per position (pair 0), so proposals one position off (L+1 ... L+T)
// give a different W1 here; the test checks that it can tell them apart, and that no
// chosen score is within float32 round-off of a tie.
TEST(EchoKv, Stage1IsTopKOfTheAnchorRotatedToExactlyLThroughLPlusTMinus1) {
  constexpr int kLayers = 3;
  constexpr int64_t kL = 64;
  constexpr double kTheta = 10000.0;
  const Inputs in = RandomInputs(kLayers, kL, 21);
  CompressionConfig cfg;  // echokv, bootstrap = proposals
  cfg.budget = 8;
  cfg.workspace = 12;
  cfg.lookahead = 4;
  FakeDecoder dec(kLayers, kHeads, kGroups, kDim, kVocab);
  ASSERT_OK_AND_ASSIGN(CompressionResult r, Compress(cfg, in.Make(&dec)));
  ASSERT_EQ(dec.calls.size(), 4u);
  ASSERT_EQ(dec.calls[0].position, kL);
  int differs = 0;  // (layer, group) pairs where shifted proposals would pick another W1
  for (int l = 0; l < kLayers; ++l) {
    const std::vector<std::vector<double>> anchor = Rows2D(in.anchors[l]);  // [H][d]
    for (int g = 0; g < kGroups; ++g) {
      SCOPED_TRACE("layer " + std::to_string(l) + " group " + std::to_string(g));
      const std::vector<std::vector<double>> keys = Rows2D(in.context.keys(l).select(0, g));  // [L][d]
      auto w1_for = [&](int64_t first, double* gap) {
        std::vector<double> score(kL, 0.0);
        for (int h = 0; h < kHeads; ++h) {
          if (h / (kHeads / kGroups) != g) continue;
          for (int t = 0; t < cfg.lookahead; ++t) {
            // Future queries see all L context keys (§8.1).
            const std::vector<double> p = HandSoftmax(HandRope(anchor[h], first + t, kTheta), keys, kL);
            for (int64_t i = 0; i < kL; ++i) score[i] += p[i];
          }
        }
        return HandTopK(score, kL, *cfg.workspace, gap);
      };
      double gap = 0;
      const std::vector<int64_t> want = w1_for(kL, &gap);
      EXPECT_GT(gap, 1e-4);  // far from a tie: float32 scoring cannot flip the choice
      std::vector<int64_t> got = Row(dec.calls[0].view_positions[l], g);
      ASSERT_EQ(got.back(), kL);  // the lookahead step's own entry
      got.pop_back();
      EXPECT_EQ(got, want);
      if (w1_for(kL + 1, nullptr) != want) ++differs;
    }
  }
  // Proposals at L+1 ... L+T would choose a different workspace somewhere.
  EXPECT_GE(differs, 2);
}

// ---- grown sessions (docs/ALGORITHM.md §6) -------------------------------------------

TEST(GrownSession, PerGroupPositionsAndPerLayerSizes) {
  // Layer 0 keeps 50 entries per group, layer 1 keeps 40, groups keep different ones;
  // then 10 new tokens (positions 80..89) are appended to every group.
  const Inputs base = RandomInputs(2, 80, 10);
  std::vector<at::Tensor> keep;
  {
    std::vector<int64_t> g0 = Iota(0, 50), g1 = Iota(30, 80);
    keep.push_back(at::stack({at::tensor(g0, at::kLong), at::tensor(g1, at::kLong)}));
    std::vector<int64_t> h0, h1;
    for (int64_t i = 0; i < 80; i += 2) h0.push_back(i);
    for (int64_t i = 1; i < 80; i += 2) h1.push_back(i);
    keep.push_back(at::stack({at::tensor(h0, at::kLong), at::tensor(h1, at::kLong)}));
  }
  Inputs in;
  ASSERT_OK_AND_ASSIGN(in.context, model::KvCache::Gather(base.context, keep));
  at::manual_seed(11);
  const std::vector<int64_t> fresh = Iota(80, 90);
  for (int l = 0; l < 2; ++l) {
    at::Tensor k = at::randn({kGroups, 10, kDim});
    ASSERT_THAT(in.context.Append(l, k, k, fresh), IsOk());
    in.last_queries.push_back(at::randn({kHeads, 10, kDim}));  // fewer than the window
    in.anchors.push_back(at::randn({kHeads, kDim}));
  }
  in.context.set_next_position(90);
  in.positions = fresh;
  in.logits = at::randn({kVocab});
  for (PolicyKind kind : AllPolicies()) {
    SCOPED_TRACE(PolicyName(kind));
    CompressionConfig cfg;
    cfg.policy = kind;
    cfg.budget = 24;
    cfg.workspace = 36;
    cfg.lookahead = 4;
    auto dec = RandomDecoder(2);
    ASSERT_OK_AND_ASSIGN(CompressionResult r, Compress(cfg, in.Make(dec.get())));
    ExpectValidSelection(r, in.context, ExpectedSizes(cfg, in.context));
    EXPECT_EQ(r.report.context_tokens, 60);
    EXPECT_EQ(r.report.total_entries, kGroups * (60 + 50));
    // The compact cache keeps original positions, continuing at 90.
    ASSERT_OK_AND_ASSIGN(model::KvCache compact, model::KvCache::Gather(in.context, r.indices));
    EXPECT_EQ(compact.next_position(), 90);
    if (kind == PolicyKind::kLaq || kind == PolicyKind::kEchoKv) {
      ASSERT_EQ(dec->calls.size(), 4u);
      EXPECT_EQ(dec->calls[0].position, 90);
      // Each group's view holds only that group's own context positions.
      for (int l = 0; l < 2; ++l) {
        for (int g = 0; g < kGroups; ++g) {
          std::vector<int64_t> held = Row(in.context.positions(l), g);
          std::vector<int64_t> view = Row(dec->calls[0].view_positions[l], g);
          for (size_t i = 0; i + 1 < view.size(); ++i) EXPECT_TRUE(Contains(held, view[i]));
          EXPECT_EQ(view.back(), 90);
        }
      }
    }
  }
}

// ---- errors and callbacks -----------------------------------------------------------

// ---- the fidelity signal: retained attention mass -------------------------------

// Float64 reference of CompressionReport::retained_mass for one layer: each probe query
// (its heads' vectors, at `position`, or -1 = after the context: every key visible) puts
// softmax(q.k / sqrt(d)) on the keys it sees; a group sums its heads; the share on the
// kept entries of every group.
std::vector<double> ReferenceMass(const at::Tensor& keys /*[G, n, d]*/, const std::vector<at::Tensor>& queries,
                                  const std::vector<int64_t>& positions, const at::Tensor& kept /*[G, k]*/) {
  const at::Tensor kt = keys.to(at::kDouble).contiguous();
  const auto k = kt.accessor<double, 3>();
  const int64_t n = kt.size(1);
  std::vector<std::vector<double>> s(kGroups, std::vector<double>(n, 0.0));
  for (size_t qi = 0; qi < queries.size(); ++qi) {
    const at::Tensor qt = queries[qi].to(at::kDouble).contiguous();  // [H, d]
    const auto q = qt.accessor<double, 2>();
    for (int h = 0; h < kHeads; ++h) {
      const int g = h / (kHeads / kGroups);
      std::vector<double> logit(n, -INFINITY);
      double mx = -INFINITY;
      for (int64_t i = 0; i < n; ++i) {
        if (positions[qi] >= 0 && i > positions[qi]) continue;  // context keys sit at positions 0..n-1
        double dot = 0;
        for (int d = 0; d < kDim; ++d) dot += q[h][d] * k[g][i][d];
        logit[i] = dot / std::sqrt(static_cast<double>(kDim));
        mx = std::max(mx, logit[i]);
      }
      double z = 0;
      for (int64_t i = 0; i < n; ++i) z += std::isinf(logit[i]) ? 0.0 : std::exp(logit[i] - mx);
      for (int64_t i = 0; i < n; ++i) s[g][i] += std::isinf(logit[i]) ? 0.0 : std::exp(logit[i] - mx) / z;
    }
  }
  std::vector<double> mass;
  for (int g = 0; g < kGroups; ++g) {
    double total = 0, held = 0;
    for (int64_t i = 0; i < n; ++i) total += s[g][i];
    for (int64_t i : Row(kept, g)) held += s[g][i];
    mass.push_back(held / total);
  }
  return mass;
}

// The last `count` context queries of layer l as [H, d] slices with their positions.
void ContextProbes(const Inputs& in, int l, int64_t count, std::vector<at::Tensor>* q, std::vector<int64_t>* pos) {
  const int64_t n = in.last_queries[l].size(1);
  for (int64_t i = std::max<int64_t>(0, n - count); i < n; ++i) {
    q->push_back(in.last_queries[l].select(1, i));
    pos->push_back(in.positions[i]);
  }
}

TEST(RetainedMass, MatchesAFloat64ReferenceForEveryScoringPolicy) {
  constexpr int kLayers = 2;
  constexpr int64_t kN = 96;
  const Inputs in = RandomInputs(kLayers, kN, /*seed=*/7);
  for (PolicyKind kind : {PolicyKind::kSnapKv, PolicyKind::kPyramidKv, PolicyKind::kH2o, PolicyKind::kLaq,
                          PolicyKind::kEchoKv}) {
    SCOPED_TRACE(PolicyName(kind));
    CompressionConfig cfg;
    cfg.policy = kind;
    cfg.budget = 30;  // PyramidKV: 55 and 5 entries in the two layers, both scored
    cfg.lookahead = 4;
    cfg.snapkv_window = 4;
    cfg.stage2_window = 2;
    auto dec = RandomDecoder(kLayers);
    ASSERT_OK_AND_ASSIGN(CompressionResult r, Compress(cfg, in.Make(dec.get())));
    ASSERT_EQ(r.report.retained_mass.size(), static_cast<size_t>(kLayers * kGroups));
    for (int l = 0; l < kLayers; ++l) {
      SCOPED_TRACE("layer " + std::to_string(l));
      std::vector<at::Tensor> q;
      std::vector<int64_t> pos;
      if (kind == PolicyKind::kSnapKv || kind == PolicyKind::kPyramidKv) ContextProbes(in, l, 4, &q, &pos);
      if (kind == PolicyKind::kH2o) ContextProbes(in, l, kN, &q, &pos);
      if (kind == PolicyKind::kLaq || kind == PolicyKind::kEchoKv) {
        for (int t = 0; t < cfg.lookahead; ++t) {
          q.push_back(dec->queries(t, l));
          pos.push_back(-1);
        }
      }
      if (kind == PolicyKind::kLaq) ContextProbes(in, l, 8, &q, &pos);  // LAQ's last 8 context queries
      const std::vector<double> want = ReferenceMass(in.context.keys(l), q, pos, r.indices[l]);
      for (int g = 0; g < kGroups; ++g) {
        const double got = r.report.retained_mass[l * kGroups + g];
        EXPECT_NEAR(got, want[g], 1e-5) << "group " << g;
        EXPECT_GT(got, 0.0);
        EXPECT_LT(got, 1.0);  // at most 55 of 96 entries kept: some mass is lost
      }
    }
    EXPECT_NEAR(r.report.RetainedMassMean(),
                std::accumulate(r.report.retained_mass.begin(), r.report.retained_mass.end(), 0.0) /
                    (kLayers * kGroups),
                1e-12);
  }
}

TEST(RetainedMass, OneWhereEverythingIsKeptUnmeasuredWhereNothingScored) {
  const Inputs in = RandomInputs(/*layers=*/2, /*n=*/32, /*seed=*/3);
  auto run = [&](PolicyKind kind, int budget, int window) {
    CompressionConfig cfg;
    cfg.policy = kind;
    cfg.budget = budget;
    cfg.lookahead = 4;
    cfg.snapkv_window = window;
    auto dec = RandomDecoder(2);
    absl::StatusOr<CompressionResult> r = Compress(cfg, in.Make(dec.get()));
    EXPECT_THAT(r, IsOk());
    return r.ok() ? r->report : CompressionReport{};
  };
  for (PolicyKind kind : AllPolicies()) {
    SCOPED_TRACE(PolicyName(kind));
    const CompressionReport all = run(kind, 64, 4);  // L = 32 <= B: nothing evicted
    EXPECT_EQ(all.retained_mass, std::vector<double>(4, 1.0));
    EXPECT_EQ(all.RetainedMassMean(), 1.0);
  }
  EXPECT_EQ(run(PolicyKind::kFull, 8, 4).retained_mass, std::vector<double>(4, 1.0));
  const CompressionReport streaming = run(PolicyKind::kStreamingLlm, 8, 4);
  EXPECT_EQ(streaming.retained_mass, std::vector<double>(4, -1.0));
  EXPECT_EQ(streaming.RetainedMassMean(), -1.0);
  EXPECT_EQ(streaming.RetainedMassMin(), -1.0);
  // A budget no larger than SnapKV's window keeps the window by position, unscored.
  EXPECT_EQ(run(PolicyKind::kSnapKv, 4, 4).retained_mass, std::vector<double>(4, -1.0));
}

TEST(RetainedMass, TravelsThroughTheReportJsonAndOldReportsLoadUnmeasured) {
  const Inputs in = RandomInputs(/*layers=*/2, /*n=*/40, /*seed=*/5);
  CompressionConfig cfg;
  cfg.policy = PolicyKind::kSnapKv;
  cfg.budget = 10;
  cfg.snapkv_window = 4;
  ASSERT_OK_AND_ASSIGN(CompressionResult r, Compress(cfg, in.Make(nullptr)));
  const std::string json = ReportToJson(r.report);
  ASSERT_OK_AND_ASSIGN(CompressionReport back, ReportFromJson(json));
  EXPECT_EQ(back.retained_mass, r.report.retained_mass);
  EXPECT_NE(json.find("\"retained_mass_mean\""), std::string::npos);
  // A report saved before the field existed.
  std::string old = json.substr(0, json.find(",\"retained_mass\"")) + "}";
  ASSERT_OK_AND_ASSIGN(CompressionReport legacy, ReportFromJson(old));
  EXPECT_TRUE(legacy.retained_mass.empty());
  EXPECT_EQ(legacy.RetainedMassMean(), -1.0);
  // A wrong length is refused, naming the field.
  std::string bad = json;
  bad.replace(bad.find("\"retained_mass\":["), 17, "\"retained_mass\":[0.5,");
  EXPECT_THAT(ReportFromJson(bad), StatusIs(StatusCode::kInvalidArgument, "retained_mass"));
}

TEST(CacheDtype, KeptBytesCountInt8RowsAndTheReportJsonCarriesTheDtype) {
  const Inputs in = RandomInputs(/*layers=*/2, /*n=*/40, /*seed=*/6);
  CompressionConfig cfg;
  cfg.policy = PolicyKind::kSnapKv;
  cfg.budget = 10;
  cfg.snapkv_window = 4;
  ASSERT_OK_AND_ASSIGN(CompressionResult f, Compress(cfg, in.Make(nullptr)));
  cfg.cache_dtype = kernels::KvDtype::kInt8;
  ASSERT_OK_AND_ASSIGN(CompressionResult q, Compress(cfg, in.Make(nullptr)));
  // The same selection (full-precision scores); int8 rows cost 2 (d + 4) bytes per entry.
  ASSERT_EQ(q.report.retained_entries, f.report.retained_entries);
  for (size_t l = 0; l < f.indices.size(); ++l) EXPECT_TRUE(at::equal(q.indices[l], f.indices[l]));
  const int64_t d = in.context.head_dim();
  EXPECT_EQ(q.report.retained_kv_bytes, q.report.retained_entries * 2 * (d + 4));
  EXPECT_EQ(f.report.retained_kv_bytes, f.report.retained_entries * 2 * d * 4);
  EXPECT_EQ(q.report.full_kv_bytes, f.report.full_kv_bytes);
  const std::string json = ReportToJson(q.report);
  ASSERT_OK_AND_ASSIGN(CompressionReport back, ReportFromJson(json));
  EXPECT_EQ(back.config.cache_dtype, kernels::KvDtype::kInt8);
  // A report saved before the field existed reads as float32.
  std::string old = json;
  old.erase(old.find(",\"cache_dtype\":\"int8\""), std::string(",\"cache_dtype\":\"int8\"").size());
  ASSERT_OK_AND_ASSIGN(CompressionReport legacy, ReportFromJson(old));
  EXPECT_EQ(legacy.config.cache_dtype, kernels::KvDtype::kFloat32);
  // Only float32 and int8 are storages.
  cfg.cache_dtype = kernels::KvDtype::kBFloat16;
  EXPECT_THAT(cfg.Validate(), StatusIs(StatusCode::kInvalidArgument, "cache_dtype"));
}

// ---- the quality-targeted budget (target_mass, docs/ALGORITHM.md §9) ----------------

TEST(TargetMass, MassTargetCountByHand) {
  // One group: rank order 1, 2, 3, 0 holds mass 4, 2, 1, 1 of the prefix; the tail
  // (entry 4) holds 2 of the total 10.
  const at::Tensor rank = at::tensor({0.1f, 0.9f, 0.5f, 0.3f, 0.0f}).reshape({1, 5});
  const at::Tensor mass = at::tensor({1.0f, 4.0f, 2.0f, 1.0f, 2.0f}).reshape({1, 5});
  EXPECT_EQ(internal::MassTargetCount(rank, mass, 4, 4, 0.2), 1);  // the tail alone: still 1
  EXPECT_EQ(internal::MassTargetCount(rank, mass, 4, 4, 0.6), 1);  // 2 + 4
  EXPECT_EQ(internal::MassTargetCount(rank, mass, 4, 4, 0.61), 2);
  EXPECT_EQ(internal::MassTargetCount(rank, mass, 4, 4, 0.8), 2);  // 2 + 4 + 2
  EXPECT_EQ(internal::MassTargetCount(rank, mass, 4, 4, 0.9), 3);  // + 1
  EXPECT_EQ(internal::MassTargetCount(rank, mass, 4, 4, 1.0), 4);
  EXPECT_EQ(internal::MassTargetCount(rank, mass, 4, 2, 1.0), 2);  // the ceiling
  // Two groups: the layer keeps what the neediest group needs; a group without mass
  // asks for nothing.
  const at::Tensor rank2 = at::cat({rank, at::tensor({0.4f, 0.3f, 0.2f, 0.1f, 0.0f}).reshape({1, 5})});
  const at::Tensor mass2 = at::cat({mass, at::tensor({0.0f, 0.0f, 0.0f, 8.0f, 2.0f}).reshape({1, 5})});
  EXPECT_EQ(internal::MassTargetCount(rank2, mass2, 4, 4, 0.6), 4);  // group 1's mass is last in its order
  const at::Tensor none = at::cat({mass, at::zeros({1, 5})});
  EXPECT_EQ(internal::MassTargetCount(rank2, none, 4, 4, 0.6), 1);
}

TEST(TargetMass, FewestEntriesReachingTheTargetAgainstAFloat64Reference) {
  // For every layer the policy keeps k_l <= the ceiling; a float64 reference of the
  // probes' attention says the k_l entries hold the target in every group, and that the
  // fixed budget k_l - 1 (the same ranking, one entry fewer) misses it in some group.
  constexpr int kLayers = 2;
  constexpr int64_t kN = 96;
  constexpr int kCeiling = 60;
  const Inputs in = RandomInputs(kLayers, kN, /*seed=*/11);
  int below_ceiling = 0;
  for (PolicyKind kind : {PolicyKind::kEchoKv, PolicyKind::kSnapKv}) {
    const int64_t tail = kind == PolicyKind::kEchoKv ? 2 : 4;  // stage2_window / snapkv_window
    auto run = [&](int budget, std::optional<double> target) {
      CompressionConfig cfg;
      cfg.policy = kind;
      cfg.budget = budget;
      cfg.lookahead = 4;
      cfg.snapkv_window = 4;
      if (kind == PolicyKind::kEchoKv) cfg.stage2_window = 2;
      cfg.target_mass = target;
      auto dec = RandomDecoder(kLayers);
      absl::StatusOr<CompressionResult> r = Compress(cfg, in.Make(dec.get()));
      EXPECT_THAT(r, IsOk());
      return r.ok() ? *std::move(r) : CompressionResult{};
    };
    auto probes = [&](int l, std::vector<at::Tensor>* q, std::vector<int64_t>* pos) {
      if (kind == PolicyKind::kSnapKv) return ContextProbes(in, l, 4, q, pos);
      auto dec = RandomDecoder(kLayers);
      for (int t = 0; t < 4; ++t) {
        q->push_back(dec->queries(t, l));
        pos->push_back(-1);
      }
    };
    for (double target : {0.3, 0.6, 0.9, 1.0}) {
      SCOPED_TRACE(absl::StrCat(PolicyName(kind), " target ", target));
      const CompressionResult r = run(kCeiling, target);
      ASSERT_EQ(r.indices.size(), static_cast<size_t>(kLayers));
      double min_mass = 2.0;
      for (int l = 0; l < kLayers; ++l) {
        SCOPED_TRACE(absl::StrCat("layer ", l));
        std::vector<at::Tensor> q;
        std::vector<int64_t> pos;
        probes(l, &q, &pos);
        const int64_t k = r.indices[l].size(1);
        EXPECT_EQ(r.report.retained_per_layer[l], k);
        EXPECT_GE(k, tail + 1);
        EXPECT_LE(k, kCeiling);
        const std::vector<double> mass = ReferenceMass(in.context.keys(l), q, pos, r.indices[l]);
        for (double m : mass) min_mass = std::min(min_mass, m);
        if (target == 1.0) EXPECT_EQ(k, kCeiling);  // every entry holds some mass
        if (k == kCeiling) continue;
        ++below_ceiling;
        for (int g = 0; g < kGroups; ++g) EXPECT_GE(mass[g], target - 1e-6) << "group " << g;
        // The fixed budget k keeps the same entries; k - 1 misses the target.
        const CompressionResult same = run(static_cast<int>(k), std::nullopt);
        for (int g = 0; g < kGroups; ++g) EXPECT_EQ(Row(same.indices[l], g), Row(r.indices[l], g));
        if (k >= tail + 2) {
          const CompressionResult fewer = run(static_cast<int>(k) - 1, std::nullopt);
          const std::vector<double> less = ReferenceMass(in.context.keys(l), q, pos, fewer.indices[l]);
          EXPECT_LT(*std::min_element(less.begin(), less.end()), target);
        }
      }
      EXPECT_NEAR(r.report.RetainedMassMin(), min_mass, 1e-5);
      // The report says which budget ran; reports without the field load with none.
      const std::string json = ReportToJson(r.report);
      ASSERT_OK_AND_ASSIGN(CompressionReport back, ReportFromJson(json));
      EXPECT_EQ(back.config.target_mass, std::optional<double>(target));
    }
  }
  EXPECT_GE(below_ceiling, 8);  // the targets below 1 were reached under the ceiling
  const CompressionResult fixed = [&] {
    CompressionConfig cfg;
    cfg.policy = PolicyKind::kSnapKv;
    cfg.budget = 10;
    cfg.snapkv_window = 4;
    absl::StatusOr<CompressionResult> r = Compress(cfg, in.Make(nullptr));
    EXPECT_THAT(r, IsOk());
    return r.ok() ? *std::move(r) : CompressionResult{};
  }();
  const std::string json = ReportToJson(fixed.report);
  EXPECT_EQ(json.find("target_mass"), std::string::npos);
  ASSERT_OK_AND_ASSIGN(CompressionReport back, ReportFromJson(json));
  EXPECT_FALSE(back.config.target_mass.has_value());
}

TEST(Errors, MissingInputsNameTheField) {
  const Inputs in = RandomInputs(1, 40, 12);
  CompressionConfig cfg;
  cfg.budget = 8;
  cfg.lookahead = 2;
  // echokv without a decoder
  EXPECT_THAT(Compress(cfg, in.Make(nullptr)), StatusIs(StatusCode::kInvalidArgument, "decoder"));
  auto dec = RandomDecoder(1);
  CompressionInput ci = in.Make(dec.get());
  ci.anchor_queries.clear();
  EXPECT_THAT(Compress(cfg, ci), StatusIs(StatusCode::kInvalidArgument, "anchor_queries"));
  ci = in.Make(dec.get());
  ci.rope_inv_freq = at::Tensor();
  EXPECT_THAT(Compress(cfg, ci), StatusIs(StatusCode::kInvalidArgument, "rope_inv_freq"));
  ci = in.Make(dec.get());
  ci.last_logits = at::Tensor();
  EXPECT_THAT(Compress(cfg, ci), StatusIs(StatusCode::kInvalidArgument, "last_logits"));
  ci = in.Make(dec.get());
  ci.context = nullptr;
  EXPECT_THAT(Compress(cfg, ci), StatusIs(StatusCode::kInvalidArgument, "context"));
  // snapkv without queries, and with mismatched positions
  cfg.policy = PolicyKind::kSnapKv;
  ci = in.Make(nullptr);
  ci.last_queries.clear();
  EXPECT_THAT(Compress(cfg, ci), StatusIs(StatusCode::kInvalidArgument, "last_queries"));
  ci = in.Make(nullptr);
  ci.last_query_positions.pop_back();
  EXPECT_THAT(Compress(cfg, ci), StatusIs(StatusCode::kInvalidArgument, "last_query_positions"));
  // invalid config is rejected before anything runs
  cfg.lookahead = 7;
  EXPECT_THAT(Compress(cfg, in.Make(nullptr)),
              StatusIs(StatusCode::kInvalidArgument, "lookahead must be even"));
  cfg.lookahead = 8;
  cfg.budget = 16;
  cfg.workspace = 8;
  EXPECT_THAT(Compress(cfg, in.Make(nullptr)), StatusIs(StatusCode::kInvalidArgument, "workspace"));
}

TEST(Errors, DecoderFailurePropagates) {
  const Inputs in = RandomInputs(1, 40, 13);
  CompressionConfig cfg;
  cfg.budget = 8;
  cfg.lookahead = 4;
  auto dec = RandomDecoder(1);
  dec->fail_at = 2;
  EXPECT_THAT(Compress(cfg, in.Make(dec.get())),
              StatusIs(StatusCode::kInternal, "fake decoder failure"));
}

TEST(Progress, ReportsEachPhase) {
  const Inputs in = RandomInputs(1, 40, 14);
  CompressionConfig cfg;
  cfg.budget = 8;
  cfg.lookahead = 4;
  auto dec = RandomDecoder(1);
  CompressionInput ci = in.Make(dec.get());
  std::vector<std::string> seen;
  ci.progress = [&seen](const std::string& phase, int64_t done, int64_t total) {
    EXPECT_LE(done, total);
    if (done == total) seen.push_back(phase);
  };
  ASSERT_OK_AND_ASSIGN(CompressionResult r, Compress(cfg, ci));
  EXPECT_THAT(seen, ::testing::ElementsAre("bootstrap", "round1", "repair", "round2", "final"));
  for (const PhaseTime& p : r.report.phases) EXPECT_GE(p.seconds, 0.0);
}

}  // namespace
}  // namespace echokv::compression
