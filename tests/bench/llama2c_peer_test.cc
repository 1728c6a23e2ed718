// bench/llama2c_peer: the files written for llama2.c's `run`, the parsing of what it
// prints, and the timing, driven by a fake peer (a shell script that prints what run.c
// prints for these inputs) since no llama2.c binary is part of the repository or CI.
#include "bench/llama2c_peer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/testing/status_matchers.h"
#include "tests/testing/test_data.h"

namespace echokv::bench {
namespace {

using ::echokv::testing::IsOk;
using ::echokv::testing::StatusIs;
using ::testing::ElementsAre;

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string WriteScript(const std::string& dir, const std::string& name, const std::string& body) {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << "#!/bin/sh\n" << body;
  chmod(path.c_str(), 0755);
  return path;
}

// run.c's output for a forced prompt of N (the -n value) steps: nothing at position 0,
// one "[100]" per later position, each written on its own (run.c flushes every step), a
// newline, and its rate on stderr. Arguments as run.c gets them: ckpt -z tok -t 0 -n N -i
// PROMPT.
constexpr char kFakeForced[] =
    "[ \"$2\" = -z ] && [ \"$6\" = -n ] || { echo bad args >&2; exit 2; }\n"
    "n=$7; i=1\n"
    "while [ $i -lt $n ]; do printf '[100]'; sleep 0.001; i=$((i+1)); done\n"
    "printf '\\n'; echo \"achieved tok/s: 123.500000\" >&2\n";

TEST(Llama2cPeerTest, IdTokenizerNamesEveryIdAndTheSpace) {
  const std::string dir = ::echokv::testing::MakeTempDir("llama2c_peer_tok");
  ASSERT_THAT(WriteIdTokenizer(512, dir + "/tok.bin"), IsOk());
  const std::string b = ReadFile(dir + "/tok.bin");
  int32_t max_len = 0;
  std::memcpy(&max_len, b.data(), 4);
  EXPECT_EQ(max_len, 5);  // "[511]"
  // Walk the entries: score, length, bytes.
  size_t at = 4;
  std::vector<std::string> pieces;
  while (at < b.size()) {
    float score = 1;
    int32_t len = 0;
    std::memcpy(&score, b.data() + at, 4);
    std::memcpy(&len, b.data() + at + 4, 4);
    EXPECT_EQ(score, 0.0f);
    pieces.push_back(b.substr(at + 8, static_cast<size_t>(len)));
    at += 8 + static_cast<size_t>(len);
  }
  ASSERT_EQ(pieces.size(), 512u);
  EXPECT_EQ(pieces[0], "[0]");
  EXPECT_EQ(pieces[1], "[1]");
  EXPECT_EQ(pieces[35], " ");
  EXPECT_EQ(pieces[100], "[100]");
  EXPECT_EQ(pieces[511], "[511]");
  // 'a' must fall back to id 100: no piece may be "a" or any two pieces' concatenation.
  for (const std::string& p : pieces) EXPECT_NE(p, "a");
  EXPECT_THAT(WriteIdTokenizer(100, dir + "/small.bin"), StatusIs(absl::StatusCode::kInvalidArgument, ""));
}

TEST(Llama2cPeerTest, ParsesPrintedIdsAndRefusesAnythingElse) {
  ASSERT_OK_AND_ASSIGN(std::vector<int> ids, ParseIdPieces("[12][7] [3]\n"));
  EXPECT_THAT(ids, ElementsAre(12, 7, 35, 3));
  ASSERT_OK_AND_ASSIGN(ids, ParseIdPieces(""));
  EXPECT_TRUE(ids.empty());
  EXPECT_THAT(ParseIdPieces("[12]Once upon"), StatusIs(absl::StatusCode::kInvalidArgument, "byte 4"));
  EXPECT_THAT(ParseIdPieces("[12"), StatusIs(absl::StatusCode::kInvalidArgument, ""));
  EXPECT_THAT(ParseIdPieces("[-3]"), StatusIs(absl::StatusCode::kInvalidArgument, ""));
  EXPECT_THAT(Llama2cPromptIds(3), ElementsAre(1, 35, 100, 100, 100));
}

TEST(Llama2cPeerTest, BinariesTakeALabelOrTheirFileName) {
  const std::string dir = ::echokv::testing::MakeTempDir("llama2c_peer_bins");
  const std::string run = WriteScript(dir, "run", "exit 0\n");
  ASSERT_OK_AND_ASSIGN(std::vector<Llama2cBinary> bins, ParseLlama2cBinaries("fast=" + run + "," + run, "--x"));
  ASSERT_EQ(bins.size(), 2u);
  EXPECT_EQ(bins[0].label, "fast");
  EXPECT_EQ(bins[0].path, run);
  EXPECT_EQ(bins[1].label, "run");
  ASSERT_OK_AND_ASSIGN(bins, ParseLlama2cBinaries("", "--x"));
  EXPECT_TRUE(bins.empty());
  std::ofstream(dir + "/plain") << "not executable";
  EXPECT_THAT(ParseLlama2cBinaries(dir + "/plain", "--llama2c-bin"),
              StatusIs(absl::StatusCode::kInvalidArgument, "--llama2c-bin"));
  EXPECT_THAT(ParseLlama2cBinaries("x=" + dir + "/missing", "--llama2c-bin"),
              StatusIs(absl::StatusCode::kInvalidArgument, ""));
  EXPECT_THAT(ParseLlama2cBinaries(run + ",", "--llama2c-bin"), StatusIs(absl::StatusCode::kInvalidArgument, ""));
}

TEST(Llama2cPeerTest, TimesTheAskedPositionsFromWhatThePeerPrints) {
  const std::string dir = ::echokv::testing::MakeTempDir("llama2c_peer_time");
  Llama2cInputs in{dir + "/model.bin", dir + "/tok.bin", 64};
  const Llama2cBinary fake{"fake", WriteScript(dir, "run", kFakeForced)};
  ASSERT_OK_AND_ASSIGN(Llama2cTiming t, TimeLlama2c(in, fake, 1, 40, 20));
  EXPECT_EQ(t.first_position, 40);
  EXPECT_EQ(t.end_position, 60);
  EXPECT_GT(t.decode_tokens_per_second, 0);
  EXPECT_DOUBLE_EQ(t.run_c_tokens_per_second, 123.5);
  // Position 0 prints nothing, so a context of 1 is timed from position 2.
  ASSERT_OK_AND_ASSIGN(t, TimeLlama2c(in, fake, 1, 1, 8));
  EXPECT_EQ(t.first_position, 2);
  EXPECT_EQ(t.end_position, 9);
  EXPECT_THAT(TimeLlama2c(in, fake, 1, 60, 8), StatusIs(absl::StatusCode::kInvalidArgument, "64"));
  EXPECT_THAT(TimeLlama2c(in, fake, 1, 10, 0), StatusIs(absl::StatusCode::kInvalidArgument, ""));
  // A binary that prints something else, or fails, is not taken for a peer.
  const Llama2cBinary chatty{"chatty", WriteScript(dir, "chatty", "echo 'Once upon a time'\n")};
  EXPECT_THAT(TimeLlama2c(in, chatty, 1, 8, 8), StatusIs(absl::StatusCode::kInternal, "llama2.c's run"));
  const Llama2cBinary broken{"broken", WriteScript(dir, "broken", "echo 'no checkpoint' >&2; exit 1\n")};
  EXPECT_THAT(TimeLlama2c(in, broken, 1, 8, 8),
              StatusIs(absl::StatusCode::kInternal, "no checkpoint"));
}

TEST(Llama2cPeerTest, GreedyIdsFollowTheForcedPromptAndThreadsReachThePeer) {
  const std::string dir = ::echokv::testing::MakeTempDir("llama2c_peer_greedy");
  Llama2cInputs in{dir + "/model.bin", dir + "/tok.bin", 64};
  // 3 'a's, prompt 1 35 100 100 100: position 0 prints nothing (the space after BOS is
  // stripped), positions 1..3 the forced 100s, then what it sampled (here 7, the space,
  // and OMP_NUM_THREADS as an id).
  const Llama2cBinary fake{"fake", WriteScript(dir, "run",
                                               "printf '[100][100][100][7] [%s]\\n' \"$OMP_NUM_THREADS\"\n")};
  ASSERT_OK_AND_ASSIGN(std::vector<int> ids, Llama2cGreedy(in, fake, 3, 3, 3));
  EXPECT_THAT(ids, ElementsAre(7, 35, 3));
  const Llama2cBinary other{"other", WriteScript(dir, "other", "printf '[9][100][100][100]\\n'\n")};
  EXPECT_THAT(Llama2cGreedy(in, other, 1, 3, 3), StatusIs(absl::StatusCode::kInternal, "encode"));
  EXPECT_THAT(Llama2cGreedy(in, fake, 1, 40, 40), StatusIs(absl::StatusCode::kInvalidArgument, ""));
}

}  // namespace
}  // namespace echokv::bench
