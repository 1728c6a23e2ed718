// echokv-eval as a user runs it, on the embedded stories260K (models/ in the source
// tree): a case that does not fit the model's 512 positions is skipped with one warning
// line naming it and counted in summary.md while the others are evaluated; --strict
// keeps the hard error; with stderr not a terminal (here: a file) progress comes as
// separate lines, never a carriage-return stream.
#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/test_data.h"

namespace echokv {
namespace {

std::string IdsJson(int n) {
  std::string out = "[1";
  for (int i = 1; i < n; ++i) out += "," + std::to_string(259 + (i * 37) % 253);
  return out + "]";
}

class EvalCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("eval-cli");
    // DecodeSteps = max(steps 4, lookahead 2, oracle_steps 2) = 4: 508 + 4 = 512 fits,
    // 509 + 4 does not.
    testing::WriteFileOrDie(dir_ + "/cases.jsonl",
                            "{\"id\": \"short\", \"prompt_ids\": " + IdsJson(40) + "}\n" +
                                "{\"id\": \"too-long\", \"prompt_ids\": " + IdsJson(509) + "}\n" +
                                "{\"id\": \"at-the-limit\", \"prompt_ids\": " + IdsJson(508) + "}\n");
  }
  testing::CommandResult Run(const std::string& extra) {
    return testing::RunCommand(std::string(ECHOKV_EVAL_BIN) + " --model " + ECHOKV_REPO_MODEL_DIR + " --data " +
                               dir_ + "/cases.jsonl --policies full,snapkv --budgets 8 --steps 4 --lookahead 2 "
                               "--oracle_steps 2 --table1=false --plots=false --resamples 50 --threads 1 --out " +
                               dir_ + "/out" + extra);
  }
  std::string dir_;
};

TEST_F(EvalCliTest, ACaseThatDoesNotFitIsSkippedWithOneWarningAndCounted) {
  const auto t0 = std::chrono::steady_clock::now();
  testing::CommandResult r = Run("");
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  int warnings = 0, progress = 0;
  for (absl::string_view line : absl::StrSplit(r.err, '\n')) {
    if (absl::StrContains(line, "warning: skipping")) {
      ++warnings;
      EXPECT_TRUE(absl::StrContains(line, "case too-long (line 2)")) << line;
      EXPECT_TRUE(absl::StrContains(line, "max_position_embeddings (512)")) << line;
    }
    if (absl::StrContains(line, "cases  elapsed")) ++progress;
  }
  EXPECT_EQ(warnings, 1) << r.err;
  // Not a terminal: no carriage returns; the first and the last case print, and at most
  // one more line per 5 s (--progress_interval's default) of the run.
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << r.err;
  EXPECT_GE(progress, 2) << r.err;
  EXPECT_LE(progress, 2 + static_cast<int>(wall / 5.0)) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "3/3 cases")) << r.err;

  const std::string summary = testing::ReadFileOrDie(dir_ + "/out/summary.md");
  EXPECT_TRUE(absl::StrContains(summary, "(3 cases, 2 evaluated)")) << summary;
  EXPECT_TRUE(absl::StrContains(summary, "- skipped: 1 (too-long: ")) << summary;
  const std::string csv = testing::ReadFileOrDie(dir_ + "/out/results.csv");
  EXPECT_TRUE(absl::StrContains(csv, "\nshort,")) << csv.substr(0, 300);
  EXPECT_TRUE(absl::StrContains(csv, "\nat-the-limit,"));
  EXPECT_FALSE(absl::StrContains(csv, "too-long"));
}

TEST_F(EvalCliTest, StrictKeepsTheError) {
  testing::CommandResult r = Run(" --strict");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(r.err, "error: case too-long (line 2): prompt_ids holds 509 tokens")) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "--strict")) << r.err;
}

TEST_F(EvalCliTest, NothingSkippedSaysSo) {
  testing::WriteFileOrDie(dir_ + "/cases.jsonl", "{\"id\": \"short\", \"prompt_ids\": " + IdsJson(40) + "}\n");
  testing::CommandResult r = Run("");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(testing::ReadFileOrDie(dir_ + "/out/summary.md"), "- skipped: 0\n"));
}

// --turns: rows per memory mode next to the one-shot rows; bad --memory values are
// refused naming the flag.
TEST_F(EvalCliTest, TurnsReportEveryMemoryMode) {
  testing::WriteFileOrDie(dir_ + "/cases.jsonl", "{\"id\": \"short\", \"prompt_ids\": " + IdsJson(40) + "}\n");
  testing::CommandResult r = Run(" --turns 4 --memory oneshot,tiered,evict");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string csv = testing::ReadFileOrDie(dir_ + "/out/results.csv");
  for (const char* row : {"\nshort,snapkv,8,kl,", "\nshort,snapkv/tiered,8,kl,", "\nshort,snapkv/evict,8,kl,",
                          "\nshort,full/tiered,8,top1,1\n"}) {
    EXPECT_TRUE(absl::StrContains(csv, row)) << row << "\n" << csv;
  }
  const std::string summary = testing::ReadFileOrDie(dir_ + "/out/summary.md");
  EXPECT_TRUE(absl::StrContains(summary, "agent flow: 4 turns per case")) << summary;
  EXPECT_TRUE(absl::StrContains(summary, "| snapkv/evict |")) << summary;

  r = Run(" --turns 4 --memory tiered,bogus");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(r.err, "--memory: \"bogus\"")) << r.err;
  r = Run(" --turns 4 --memory oneshot");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(r.err, "--memory")) << r.err;
}

}  // namespace
}  // namespace echokv
