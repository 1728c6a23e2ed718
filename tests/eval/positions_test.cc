// The evaluator's position limit at its exact boundary, on the embedded stories260K
// (models/ in the source tree; max_position_embeddings 512), and echokv-eval's progress
// reporter (terminal: one redrawn line; elsewhere: separate, rate-limited lines).
#include <memory>
#include <string>
#include <vector>

#include "bench/eval/evaluator.h"
#include "bench/eval/progress.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace echokv::eval {
namespace {

using ::echokv::testing::IsOk;
using ::echokv::testing::StatusIs;

std::vector<int> Ids(int n) {
  std::vector<int> ids = {1};
  for (int i = 1; i < n; ++i) ids.push_back(259 + (i * 37) % 253);
  return ids;
}

EvalCase Case(const std::string& id, int prompt, int answer) {
  EvalCase c;
  c.id = id;
  c.line = 7;
  c.prompt_ids = Ids(prompt);
  for (int i = 0; i < answer; ++i) c.answer_ids.push_back(300 + i);
  return c;
}

class EvaluatorPositionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model::DeviceOptions dev;
    dev.num_threads = 1;
    absl::StatusOr<std::unique_ptr<model::Transformer>> m = model::Transformer::Load(ECHOKV_REPO_MODEL_DIR, dev);
    ASSERT_THAT(m.status(), IsOk());
    model_ = std::move(*m);
    ASSERT_EQ(model_->config().max_position_embeddings, 512);
    opt_.policies = {compression::PolicyKind::kFull, compression::PolicyKind::kStreamingLlm};
    opt_.budgets = {8};
    opt_.steps = 4;
    opt_.lookahead = 2;
    opt_.oracle_steps = 1;
    opt_.table1 = false;
    absl::StatusOr<std::unique_ptr<Evaluator>> ev = Evaluator::Create(model_.get(), opt_);
    ASSERT_THAT(ev.status(), IsOk());
    ev_ = std::move(*ev);
    ASSERT_EQ(opt_.DecodeSteps(), 4);
  }
  std::unique_ptr<model::Transformer> model_;
  EvalOptions opt_;
  std::unique_ptr<Evaluator> ev_;
};

// The reference feeds x_0 .. x_3 at positions L .. L+3 and samples x_4 without feeding
// it: L = 508 uses positions 0 .. 511 exactly; 509 would need 512.
TEST_F(EvaluatorPositionsTest, PromptPlusDecodeStepsFillsThePositionsExactly) {
  const EvalCase fits = Case("fits", 508, 0);
  EXPECT_EQ(ev_->PositionsNeeded(fits), 512);
  EXPECT_THAT(ev_->CheckFits(fits), IsOk());
  absl::StatusOr<std::vector<MetricRow>> rows = ev_->EvaluateCase(fits);
  ASSERT_THAT(rows.status(), IsOk());
  EXPECT_FALSE(rows->empty());

  const EvalCase over = Case("over", 509, 0);
  EXPECT_EQ(ev_->PositionsNeeded(over), 513);
  const char* want = "case over (line 7): prompt_ids holds 509 tokens; with 4 decode steps";
  EXPECT_THAT(ev_->CheckFits(over), StatusIs(absl::StatusCode::kInvalidArgument, want));
  EXPECT_THAT(ev_->CheckFits(over), StatusIs(absl::StatusCode::kInvalidArgument, "max_position_embeddings (512)"));
  EXPECT_THAT(ev_->EvaluateCase(over).status(), StatusIs(absl::StatusCode::kInvalidArgument, want));
}

// An answer of |A| tokens is generated free-running and its last token is never fed
// back: prompt + |A| may be 513 (= 512 + 1), as echokv-generate and llama2.c allow.
TEST_F(EvaluatorPositionsTest, AnAnswersLastTokenNeedsNoPosition) {
  const EvalCase fits = Case("answer-fits", 500, 13);
  EXPECT_EQ(ev_->PositionsNeeded(fits), 512);
  EXPECT_THAT(ev_->CheckFits(fits), IsOk());
  absl::StatusOr<std::vector<MetricRow>> rows = ev_->EvaluateCase(fits);
  ASSERT_THAT(rows.status(), IsOk());
  int exact = 0;
  for (const MetricRow& r : *rows) exact += r.metric == kMetricExactMatch ? 1 : 0;
  EXPECT_EQ(exact, 2);  // one per (policy, budget)

  const EvalCase over = Case("answer-over", 500, 14);
  EXPECT_EQ(ev_->PositionsNeeded(over), 513);
  EXPECT_THAT(ev_->CheckFits(over),
              StatusIs(absl::StatusCode::kInvalidArgument, "case answer-over (line 7): prompt_ids holds 500 tokens; "
                                                           "answer_ids (14 tokens"));
}

TEST(ProgressReporterTest, OffATerminalLinesAreSeparateAndRateLimited) {
  ProgressReporter p(/*terminal=*/false, /*min_interval_s=*/5);
  const std::string first = p.Update(1, 10, 0.4);
  EXPECT_EQ(first, "[echokv-eval] 1/10 cases  elapsed 0s  ETA 4s\n");
  EXPECT_EQ(p.Update(2, 10, 1.0), "");
  EXPECT_EQ(p.Update(3, 10, 5.3), "");  // 4.9 s after the last line
  EXPECT_EQ(p.Update(4, 10, 5.6), "[echokv-eval] 4/10 cases  elapsed 6s  ETA 8s\n");
  EXPECT_EQ(p.Update(5, 10, 6.0), "");
  EXPECT_EQ(p.Update(10, 10, 7.0), "[echokv-eval] 10/10 cases  elapsed 7s  ETA 0s\n");  // the last always
  EXPECT_EQ(p.Finish(), "");
}

TEST(ProgressReporterTest, OnATerminalOneLineIsRedrawn) {
  ProgressReporter p(/*terminal=*/true, /*min_interval_s=*/5);
  for (size_t i = 1; i <= 3; ++i) {
    const std::string s = p.Update(i, 3, 0.1 * static_cast<double>(i));
    ASSERT_FALSE(s.empty());
    EXPECT_EQ(s.front(), '\r');
    EXPECT_EQ(s.find('\n'), std::string::npos);
  }
  EXPECT_EQ(p.Finish(), "\n");
  EXPECT_EQ(FormatSeconds(125), "2m05s");
}

}  // namespace
}  // namespace echokv::eval
