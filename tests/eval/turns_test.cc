// The agent flow of `echokv-eval --turns K` (label `model`): the split of a case into
// turns is the documented one (hand-computed sizes), K = 1 reproduces the one-shot rows
// bit for bit in both memory modes, and a tiered FullKV session grown over K turns
// scores exactly as the one-shot full cache does.
#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "bench/eval/dataset.h"
#include "bench/eval/evaluator.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace echokv::eval {
namespace {

using compression::PolicyKind;
using ::echokv::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

EvalCase Case(int length, std::vector<std::pair<int64_t, int64_t>> spans = {}) {
  EvalCase c;
  c.id = "c";
  c.line = 7;
  for (int i = 0; i < length; ++i) c.prompt_ids.push_back(3 + i % 50);
  c.evidence_spans = std::move(spans);
  return c;
}

TEST(SplitTurns, EqualPartsThenTheLastEightTokens) {
  // 20 tokens, K = 4: question = the last 8, the 12 before it in 3 parts of 4.
  EXPECT_THAT(*SplitTurns(Case(20), 4, std::nullopt), ElementsAre(4, 4, 4, 8));
  // 24 tokens: 16 history tokens in 3 parts -> 6, 5, 5 (larger parts first).
  EXPECT_THAT(*SplitTurns(Case(24), 4, std::nullopt), ElementsAre(6, 5, 5, 8));
  // 23 tokens: 15 -> 5, 5, 5.
  EXPECT_THAT(*SplitTurns(Case(23), 4, std::nullopt), ElementsAre(5, 5, 5, 8));
  // K = 2: the history as one turn, then the question.
  EXPECT_THAT(*SplitTurns(Case(20), 2, std::nullopt), ElementsAre(12, 8));
}

TEST(SplitTurns, OneTurnIsTheWholePrompt) {
  EXPECT_THAT(*SplitTurns(Case(20), 1, std::nullopt), ElementsAre(20));
  EXPECT_THAT(*SplitTurns(Case(30, {{3, 6}}), 1, 4), ElementsAre(30));
}

TEST(SplitTurns, QuestionIsWhatFollowsTheLastEvidenceSpan) {
  // Spans end at 6 and 12 (listed out of order): the question is tokens 12..29 (18).
  EXPECT_THAT(*SplitTurns(Case(30, {{10, 12}, {3, 6}}), 3, std::nullopt), ElementsAre(6, 6, 18));
  // Evidence running to the end leaves no question after it: the last 8 then.
  EXPECT_THAT(*SplitTurns(Case(30, {{3, 6}, {25, 30}}), 3, std::nullopt), ElementsAre(11, 11, 8));
  // An explicit question length wins over the spans.
  EXPECT_THAT(*SplitTurns(Case(30, {{10, 12}}), 3, 5), ElementsAre(13, 12, 5));
}

TEST(SplitTurns, TheCaseOwnTurnsWin) {
  EvalCase c = Case(20);
  c.turns = {3, 9, 8};
  EXPECT_THAT(*SplitTurns(c, 4, std::nullopt), ElementsAre(3, 9, 8));
  EXPECT_THAT(*SplitTurns(c, 1, std::nullopt), ElementsAre(3, 9, 8));
}

TEST(SplitTurns, TooShortToSplitIsAnErrorNamingTheCase) {
  // 10 tokens, question 8: 2 history tokens cannot make 3 turns.
  EXPECT_THAT(SplitTurns(Case(10), 4, std::nullopt).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "case c (line 7)"));
  EXPECT_THAT(*SplitTurns(Case(10), 3, std::nullopt), ElementsAre(1, 1, 8));
  EXPECT_THAT(SplitTurns(Case(10), 2, 10).status(), StatusIs(absl::StatusCode::kInvalidArgument, "question"));
  EXPECT_THAT(SplitTurns(Case(10), 2, 0).status(), StatusIs(absl::StatusCode::kInvalidArgument, "question_tokens"));
  EXPECT_THAT(SplitTurns(Case(10), 0, std::nullopt).status(), StatusIs(absl::StatusCode::kInvalidArgument, "turns"));
}

TEST(ParseCase, TurnsAreTokenCountsAddingUpToThePrompt) {
  auto c = ParseCase(R"({"id": "a", "prompt_ids": [1, 2, 3, 4, 5], "turns": [2, 1, 2]})", 3, nullptr, 100);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->turns, ElementsAre(2, 1, 2));
  EXPECT_THAT(CaseToJsonLine(*c), HasSubstr(R"("turns":[2,1,2])"));
  auto again = ParseCase(CaseToJsonLine(*c), 1, nullptr, 100);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->turns, c->turns);
  EXPECT_THAT(ParseCase(R"({"id": "a", "prompt_ids": [1, 2, 3], "turns": [2, 2]})", 3, nullptr, 100).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "line 3: field \"turns\": the token counts must add up"));
  EXPECT_THAT(ParseCase(R"({"id": "a", "prompt_ids": [1, 2, 3], "turns": [2]})", 3, nullptr, 100).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "add up to the prompt's 3 tokens (they add up to 2)"));
  EXPECT_THAT(ParseCase(R"({"id": "a", "prompt_ids": [1, 2, 3], "turns": [3, 0]})", 3, nullptr, 100).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "element 1 is not a positive integer"));
  EXPECT_THAT(ParseCase(R"({"id": "a", "prompt_ids": [1, 2, 3], "turns": []})", 3, nullptr, 100).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "turns"));
}

// ---- on stories260K (the copy in the repository) and the committed eval set ----

struct Loaded {
  std::unique_ptr<model::Transformer> model;
  std::vector<EvalCase> cases;  // a sampled story and a planted case (answer + evidence)
};

const Loaded& Data() {
  static Loaded* loaded = [] {
    auto* out = new Loaded;
    model::DeviceOptions dev;
    dev.num_threads = 1;
    auto m = model::Transformer::Load(ECHOKV_REPO_MODEL_DIR, dev);
    EXPECT_TRUE(m.ok()) << m.status();
    out->model = std::move(*m);
    auto all = ReadDataset(std::string(ECHOKV_SOURCE_DIR) + "/bench/data/stories_eval.jsonl", nullptr,
                           out->model->config().vocab_size);
    EXPECT_TRUE(all.ok()) << all.status();
    out->cases = {all->front(), all->back()};
    return out;
  }();
  return *loaded;
}

using Key = std::tuple<std::string, int, std::string>;  // policy, budget, metric
std::map<Key, double> ByKey(const std::vector<MetricRow>& rows) {
  std::map<Key, double> out;
  for (const MetricRow& r : rows) out[{r.policy, r.budget, r.metric}] = r.value;
  return out;
}

TEST(AgentFlow, OneTurnEqualsTheOneShotRowsExactly) {
  const Loaded& d = Data();
  ASSERT_NE(d.model, nullptr);
  EvalOptions opt;
  opt.budgets = {32, 128};
  opt.steps = 16;
  opt.workspace = 128;
  opt.table1 = false;
  opt.turns = 1;
  opt.one_shot = true;
  ASSERT_OK_AND_ASSIGN(auto ev, Evaluator::Create(d.model.get(), opt));
  for (const EvalCase& c : d.cases) {
    SCOPED_TRACE(c.id);
    ASSERT_OK_AND_ASSIGN(std::vector<MetricRow> rows, ev->EvaluateCase(c));
    const std::map<Key, double> v = ByKey(rows);
    int compared = 0;
    for (PolicyKind p : opt.policies) {
      const std::string name(compression::PolicyName(p));
      for (server::MemoryMode mode : opt.memory_modes) {
        for (int b : opt.budgets) {
          for (const char* metric : {kMetricKl, kMetricTop1, kMetricMatchLength, kMetricExactMatch, kMetricEvidence,
                                     kMetricOracleOverlap}) {
            auto one = v.find({name, b, metric});
            auto turn = v.find({TurnRowName(p, mode), b, metric});
            ASSERT_EQ(one == v.end(), turn == v.end()) << name << " " << metric;
            if (one == v.end()) continue;
            // Bit for bit: one kCreate turn is the one-shot compression (same prefill
            // chunks, same policy code), whatever the memory mode.
            EXPECT_EQ(turn->second, one->second) << TurnRowName(p, mode) << " B=" << b << " " << metric;
            ++compared;
          }
        }
      }
    }
    EXPECT_GE(compared, 7 * 2 * 2 * 4);
  }
}

TEST(AgentFlow, TieredFullKvOverTurnsEqualsOneShot) {
  const Loaded& d = Data();
  ASSERT_NE(d.model, nullptr);
  EvalOptions opt;
  opt.policies = {PolicyKind::kFull, PolicyKind::kSnapKv};
  opt.budgets = {32};
  opt.steps = 16;
  opt.table1 = false;
  opt.turns = 4;
  opt.prefill_chunk = 64;  // turns straddle prefill chunks
  ASSERT_OK_AND_ASSIGN(auto ev, Evaluator::Create(d.model.get(), opt));
  bool evict_differs = false;
  for (const EvalCase& c : d.cases) {
    SCOPED_TRACE(c.id);
    ASSERT_OK_AND_ASSIGN(std::vector<MetricRow> rows, ev->EvaluateCase(c));
    const std::map<Key, double> v = ByKey(rows);
    for (const char* metric : {kMetricKl, kMetricTop1, kMetricMatchLength, kMetricExactMatch, kMetricEvidence,
                               kMetricOracleOverlap}) {
      auto one = v.find({"full", 32, metric});
      auto tiered = v.find({"full/tiered", 32, metric});
      ASSERT_EQ(one == v.end(), tiered == v.end()) << metric;
      if (one == v.end()) continue;
      if (std::string(metric) == kMetricKl) {
        // The cold tier is the full cache up to the rounding of other chunk boundaries.
        EXPECT_NEAR(tiered->second, one->second, 1e-7) << metric;
      } else {
        EXPECT_EQ(tiered->second, one->second) << metric;
      }
    }
    // The full cache is perfect, so the tiered session is too.
    EXPECT_EQ(v.at({"full/tiered", 32, kMetricTop1}), 1.0);
    EXPECT_EQ(v.at({"full/tiered", 32, kMetricMatchLength}), opt.steps);
    // The same turns in evict mode with SnapKV at B = 32 lose what the one-shot keeps:
    // the rows do come from the turn flow, not from the one-shot compression.
    for (const char* metric : {kMetricOracleOverlap, kMetricKl}) {
      evict_differs = evict_differs || v.at({"snapkv/evict", 32, metric}) != v.at({"snapkv", 32, metric});
    }
  }
  EXPECT_TRUE(evict_differs);
}

}  // namespace
}  // namespace echokv::eval
