// The session-memory invariant (docs/SESSION_MEMORY.md §2), on the turn jobs the engine
// runs: a tiered session built by Create(c1) + Append(c2) ... + Append(ck) holds the same
// cold tier, the same hot positions per layer and group, and generates the same greedy
// tokens as a session created in one shot on c1 + ... + ck — for every policy, on tiny
// random llama / mistral (sliding window) / qwen2 (biases) models and on stories260K,
// with k = 2, 4, 8 and pieces that do and do not straddle prefill-chunk boundaries.
// Where a hot position differs, both runs' final ranking scores must show a near-tie
// (within 1e-5 relative of the selection threshold); anything else fails.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compression/config.h"
#include "model/transformer.h"
#include "server/engine/session_data.h"
#include "server/engine/turn_job.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_data.h"
#include "tools/make_test_model.h"

namespace echokv::server {
namespace {

using ::echokv::testing::IsOk;

constexpr int kPrefillChunk = 16;

const model::Transformer& LoadModel(const std::string& name) {
  static auto* cache = new std::map<std::string, std::unique_ptr<model::Transformer>>();
  auto it = cache->find(name);
  if (it != cache->end()) return *it->second;
  std::string dir;
  if (name == "stories260K") {
    dir = *echokv::testing::TestDataDir() + "/models/stories260K";
  } else {
    dir = echokv::testing::MakeTempDir("session-memory-" + name);
    tools::TestModelOptions o;
    o.arch = name;
    o.out_dir = dir;
    o.max_pos = 1024;
    EXPECT_THAT(tools::MakeTestModel(o), IsOk());
  }
  model::DeviceOptions dev;
  dev.num_threads = 1;
  absl::StatusOr<std::unique_ptr<model::Transformer>> m = model::Transformer::Load(dir, dev);
  EXPECT_THAT(m.status(), IsOk());
  return *cache->emplace(name, std::move(*m)).first->second;
}

struct TurnOutcome {
  std::shared_ptr<SessionData> data;
  std::vector<at::Tensor> kept;          // per layer [G, n] indices == positions (cold tier)
  std::vector<at::Tensor> final_scores;  // per layer [G, m] or undefined
};

// Runs one turn to completion the way the engine's steps do, with odd prefill slices.
TurnOutcome RunTurn(const model::Transformer& model, TurnSpec spec) {
  spec.prefill_chunk = kPrefillChunk;
  spec.record_scores = true;
  absl::StatusOr<std::unique_ptr<TurnJob>> job = TurnJob::Start(&model, std::move(spec));
  EXPECT_THAT(job.status(), IsOk());
  TurnJob& j = **job;
  while (!j.done()) {
    switch (j.next()) {
      case JobView::Next::kPrefill:
        EXPECT_THAT(j.Prefill(37), IsOk());
        break;
      case JobView::Next::kDecode: {
        auto req = j.pending_decode();
        absl::StatusOr<model::DecodeResult> r = model.Decode(req->token, req->view, /*return_queries=*/true);
        EXPECT_THAT(r.status(), IsOk());
        compression::LookaheadDecoder::Step step;
        step.logits = r->logits;
        step.queries = r->queries;
        EXPECT_THAT(j.SupplyDecode(std::move(step)), IsOk());
        break;
      }
      case JobView::Next::kPhase:
        EXPECT_THAT(j.RunPhase(), IsOk());
        break;
      case JobView::Next::kWaiting:
        ADD_FAILURE() << "a job that is not done waits";
        return {};
    }
    if (::testing::Test::HasFailure()) return {};
  }
  TurnOutcome out;
  out.kept = j.kept();
  out.final_scores = j.final_scores();
  out.data = j.TakeSessionData();
  j.Committed();
  return out;
}

std::vector<int> Tokens(int n, int vocab) {
  std::vector<int> ids;
  uint32_t x = 12345;
  for (int i = 0; i < n; ++i) {
    x = x * 1103515245u + 12345u;
    ids.push_back(1 + static_cast<int>((x >> 8) % static_cast<uint32_t>(vocab - 1)));
  }
  return ids;
}

// Pieces of `n` tokens: k parts, either multiples of the prefill chunk (aligned) or
// uneven sizes that straddle chunk boundaries.
std::vector<int> Split(int n, int k, bool aligned) {
  std::vector<int> sizes;
  if (aligned) {
    const int chunks = n / kPrefillChunk;
    int left = chunks;
    for (int i = 0; i < k; ++i) {
      const int c = i + 1 == k ? left : std::max(1, chunks / k);
      sizes.push_back(c * kPrefillChunk);
      left -= c;
    }
    sizes.back() += n - chunks * kPrefillChunk;
  } else {
    int left = n;
    for (int i = 0; i < k; ++i) {
      int s = i + 1 == k ? left : std::max(1, (n / k) + ((i % 2 == 0) ? 5 : -3));
      sizes.push_back(s);
      left -= s;
    }
  }
  return sizes;
}

std::vector<int> Greedy(const model::Transformer& model, const SessionData& d, int steps) {
  model::KvCache cache = d.hot.Clone();
  at::Tensor logits = d.last_logits;
  std::vector<int> out;
  for (int i = 0; i < steps; ++i) {
    const int t = static_cast<int>(logits.argmax().item<int64_t>());
    out.push_back(t);
    absl::StatusOr<model::DecodeResult> r = model.Decode(t, &cache);
    EXPECT_THAT(r.status(), IsOk());
    logits = r->logits;
  }
  return out;
}

// The smallest score among positions `kept` selected from the ranked prefix.
float Threshold(const at::Tensor& scores_g, const std::set<int64_t>& kept, int64_t prefix) {
  float t = std::numeric_limits<float>::infinity();
  for (int64_t p : kept) {
    if (p < prefix) t = std::min(t, scores_g[p].item<float>());
  }
  return t;
}

bool NearTie(float a, float b) {
  const float scale = std::max({std::fabs(a), std::fabs(b), 1e-30f});
  return std::fabs(a - b) <= 1e-5f * scale;
}

struct Case {
  std::string model;
  compression::PolicyKind policy;
};

class SessionMemoryInvariantTest : public ::testing::TestWithParam<Case> {};

TEST_P(SessionMemoryInvariantTest, IncrementalTurnsEqualOneShot) {
  const Case& c = GetParam();
  if (c.model == "stories260K") {
    ECHOKV_REQUIRE_TEST_DATA(data_dir);
    (void)data_dir;
  }
  const model::Transformer& model = LoadModel(c.model);
  compression::CompressionConfig cfg;
  cfg.policy = c.policy;
  cfg.budget = 32;
  cfg.lookahead = 4;
  cfg.workspace = 64;
  cfg.snapkv_window = 8;
  if (c.policy == compression::PolicyKind::kLaq) cfg.workspace = 48;
  const int total = 200;
  const std::vector<int> tokens = Tokens(total, model.config().vocab_size);

  TurnSpec one;
  one.kind = TurnKind::kCreate;
  one.tokens = tokens;
  one.config = cfg;
  one.memory = MemoryMode::kTiered;
  TurnOutcome a = RunTurn(model, one);
  ASSERT_NE(a.data, nullptr);
  ASSERT_NE(a.data->cold, nullptr);
  const std::vector<int> greedy_a = Greedy(model, *a.data, 12);

  int near_ties = 0;
  for (int k : {2, 4, 8}) {
    for (bool aligned : {true, false}) {
      SCOPED_TRACE(absl::StrCat("k=", k, aligned ? " aligned" : " straddling"));
      const std::vector<int> sizes = Split(total, k, aligned);
      TurnOutcome b;
      int offset = 0;
      for (size_t i = 0; i < sizes.size(); ++i) {
        TurnSpec s;
        s.kind = i == 0 ? TurnKind::kCreate : TurnKind::kAppend;
        s.tokens.assign(tokens.begin() + offset, tokens.begin() + offset + sizes[i]);
        s.config = cfg;
        s.memory = MemoryMode::kTiered;
        s.base = b.data;
        offset += sizes[i];
        b = RunTurn(model, s);
        ASSERT_NE(b.data, nullptr);
      }
      ASSERT_EQ(offset, total);
      // Cold tier: every token, the same KV up to chunking rounding.
      const model::KvCache& ca = *a.data->cold;
      const model::KvCache& cb = *b.data->cold;
      ASSERT_EQ(b.data->cold_len, total);
      EXPECT_EQ(ca.cells(), cb.cells());
      EXPECT_EQ(b.data->tokens, tokens);
      for (int l = 0; l < ca.num_layers(); ++l) {
        for (bool keys : {true, false}) {
          at::Tensor x = keys ? ca.keys(l) : ca.values(l);
          at::Tensor y = keys ? cb.keys(l) : cb.values(l);
          const double scale = x.abs().max().item<double>();
          const double diff = (x - y).abs().max().item<double>();
          // Both are float32 prefills of the same tokens; only the chunk boundaries
          // differ, which changes summation order in attention: a few ulps.
          EXPECT_LE(diff, 1e-5 * scale) << "layer " << l << (keys ? " keys" : " values");
        }
      }
      // Hot positions per layer and group.
      bool identical = true;
      for (int l = 0; l < ca.num_layers(); ++l) {
        for (int g = 0; g < ca.num_kv_heads(); ++g) {
          const auto& pa = a.data->hot.cells().positions(l, g);
          const auto& pb = b.data->hot.cells().positions(l, g);
          if (pa == pb) continue;
          identical = false;
          // Differences must be near-ties of the final ranking.
          ASSERT_TRUE(a.final_scores.size() > static_cast<size_t>(l) && a.final_scores[l].defined())
              << "layer " << l << " group " << g << " differs and was not ranked by scores";
          ASSERT_TRUE(b.final_scores[l].defined());
          const int64_t prefix = a.final_scores[l].size(1);
          const std::set<int64_t> sa(pa.begin(), pa.end()), sb(pb.begin(), pb.end());
          const at::Tensor sga = a.final_scores[l][g], sgb = b.final_scores[l][g];
          const float ta = Threshold(sga, sa, prefix), tb = Threshold(sgb, sb, prefix);
          for (int64_t p : sa) {
            if (sb.count(p) == 0) {
              EXPECT_TRUE(NearTie(sgb[p].item<float>(), tb))
                  << "layer " << l << " group " << g << " position " << p << " kept one-shot only: score "
                  << sgb[p].item<float>() << " vs threshold " << tb;
            }
          }
          for (int64_t p : sb) {
            if (sa.count(p) == 0) {
              EXPECT_TRUE(NearTie(sga[p].item<float>(), ta))
                  << "layer " << l << " group " << g << " position " << p << " kept incrementally only";
            }
          }
          ++near_ties;
        }
      }
      if (identical) {
        EXPECT_EQ(Greedy(model, *b.data, 12), greedy_a);
      }
    }
  }
  RecordProperty("near_tie_groups", near_ties);
}

std::vector<Case> Cases() {
  std::vector<Case> out;
  for (const char* m : {"llama", "mistral", "qwen2", "stories260K"}) {
    for (compression::PolicyKind p : compression::AllPolicies()) out.push_back({m, p});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(ModelsAndPolicies, SessionMemoryInvariantTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) {
                           return absl::StrCat(info.param.model, "_", compression::PolicyName(info.param.policy));
                         });

// A failed turn changes nothing: the cold tier is rolled back to the committed length.
TEST(SessionMemoryTest, AbortedTieredTurnRollsTheColdTierBack) {
  const model::Transformer& model = LoadModel("llama");
  compression::CompressionConfig cfg;
  cfg.policy = compression::PolicyKind::kSnapKv;
  cfg.budget = 16;
  cfg.snapkv_window = 8;
  TurnSpec s;
  s.kind = TurnKind::kCreate;
  s.tokens = Tokens(40, model.config().vocab_size);
  s.config = cfg;
  s.memory = MemoryMode::kTiered;
  TurnOutcome base = RunTurn(model, s);
  ASSERT_NE(base.data, nullptr);
  const at::Tensor keys_before = base.data->cold->keys(0).clone();
  {
    TurnSpec a;
    a.kind = TurnKind::kAppend;
    a.tokens = Tokens(30, model.config().vocab_size);
    a.config = cfg;
    a.memory = MemoryMode::kTiered;
    a.base = base.data;
    a.prefill_chunk = kPrefillChunk;
    absl::StatusOr<std::unique_ptr<TurnJob>> job = TurnJob::Start(&model, a);
    ASSERT_THAT(job.status(), IsOk());
    ASSERT_THAT((*job)->Prefill(20), IsOk());
    EXPECT_EQ(base.data->cold->size(0), 60);  // appended in place while the turn runs
    // The job is dropped (cancelled) without Committed(): its destructor rolls back.
  }
  EXPECT_EQ(base.data->cold->size(0), 40);
  EXPECT_EQ(base.data->cold->next_position(), 40);
  EXPECT_TRUE(at::equal(base.data->cold->keys(0), keys_before));
  // And the session still takes a turn normally.
  TurnSpec again;
  again.kind = TurnKind::kAppend;
  again.tokens = Tokens(5, model.config().vocab_size);
  again.config = cfg;
  again.memory = MemoryMode::kTiered;
  again.base = base.data;
  TurnOutcome next = RunTurn(model, again);
  ASSERT_NE(next.data, nullptr);
  EXPECT_EQ(next.data->cold_len, 45);
}

}  // namespace
}  // namespace echokv::server
