#include "bench/eval/dataset.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_data.h"

namespace echokv::eval {
namespace {

using ::echokv::testing::IsOk;
using ::echokv::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::Pair;

constexpr int kVocab = 100;

// One id per byte ('a' = 97 -> 97 % 100); BOS = 1 when asked for.
class FakeTokenizer : public model::Tokenizer {
 public:
  absl::StatusOr<std::vector<int>> Encode(absl::string_view text,
                                          const model::EncodeOptions& options) const override {
    std::vector<int> ids;
    if (options.add_special_tokens) ids.push_back(1);
    for (char c : text) ids.push_back(static_cast<unsigned char>(c) % kVocab);
    return ids;
  }
  absl::StatusOr<std::string> Decode(absl::Span<const int> ids, const model::DecodeOptions&) const override {
    std::string s;
    for (int id : ids) {
      if (id == 1) continue;
      s += static_cast<char>(id < 32 ? id + 100 : id);
    }
    return s;
  }
  std::string IdToPiece(int id) const override { return std::string(1, static_cast<char>(id)); }
  int vocab_size() const override { return kVocab; }
  std::optional<int> bos_id() const override { return 1; }
  std::vector<int> eos_ids() const override { return {2}; }
  bool IsSpecial(int id) const override { return id < 3; }
  absl::string_view kind() const override { return "fake"; }
};

TEST(ParseCase, IdsWithAnswerAndSpans) {
  ASSERT_OK_AND_ASSIGN(EvalCase c, ParseCase(R"({"id": "a", "prompt_ids": [1, 5, 6, 7], "answer_ids": [9],
                                                "evidence_spans": [[1, 3], [3, 4]], "text": "ignored"})",
                                             4, nullptr, kVocab));
  EXPECT_EQ(c.id, "a");
  EXPECT_THAT(c.prompt_ids, ElementsAre(1, 5, 6, 7));
  EXPECT_THAT(c.answer_ids, ElementsAre(9));
  EXPECT_THAT(c.evidence_spans, ElementsAre(Pair(1, 3), Pair(3, 4)));
  EXPECT_EQ(c.line, 4);
}

TEST(ParseCase, TextPromptAndAnswerAreTokenizedTogether) {
  FakeTokenizer tok;
  ASSERT_OK_AND_ASSIGN(EvalCase c, ParseCase(R"({"id": "t", "prompt": "ab", "answer": "cd"})", 1, &tok, kVocab));
  EXPECT_THAT(c.prompt_ids, ElementsAre(1, 97, 98));
  EXPECT_THAT(c.answer_ids, ElementsAre(99, 0));  // 'c' = 99, 'd' = 100 % 100
  EXPECT_TRUE(c.evidence_spans.empty());
}

TEST(ParseCase, RejectsMalformedLinesNamingLineAndField) {
  EXPECT_THAT(ParseCase("{not json", 3, nullptr, kVocab), StatusIs(absl::StatusCode::kInvalidArgument, "line 3"));
  EXPECT_THAT(ParseCase("[1, 2]", 3, nullptr, kVocab), StatusIs(absl::StatusCode::kInvalidArgument, "object"));
  EXPECT_THAT(ParseCase(R"({"prompt_ids": [1]})", 5, nullptr, kVocab),
              StatusIs(absl::StatusCode::kInvalidArgument, "line 5: field \"id\""));
  EXPECT_THAT(ParseCase(R"({"id": "x"})", 6, nullptr, kVocab),
              StatusIs(absl::StatusCode::kInvalidArgument, "line 6: field \"prompt\""));
  EXPECT_THAT(ParseCase(R"({"id": "x", "prompt": "a", "prompt_ids": [1]})", 7, nullptr, kVocab),
              StatusIs(absl::StatusCode::kInvalidArgument, "exactly one"));
  EXPECT_THAT(ParseCase(R"({"id": "x", "prompt_ids": [1, "b"]})", 8, nullptr, kVocab),
              StatusIs(absl::StatusCode::kInvalidArgument, "line 8: field \"prompt_ids\": element 1"));
  EXPECT_THAT(ParseCase(R"({"id": "x", "prompt_ids": []})", 8, nullptr, kVocab),
              StatusIs(absl::StatusCode::kInvalidArgument, "empty"));
  EXPECT_THAT(ParseCase(R"({"id": "x", "prompt_ids": [1, 100]})", 9, nullptr, kVocab),
              StatusIs(absl::StatusCode::kInvalidArgument, "out of range [0, 100)"));
  EXPECT_THAT(ParseCase(R"({"id": "x", "prompt": "abc"})", 10, nullptr, kVocab),
              StatusIs(absl::StatusCode::kInvalidArgument, "no tokenizer"));
  EXPECT_THAT(ParseCase(R"({"id": "x", "prompt_ids": [1], "answer": "a", "answer_ids": [3]})", 11, nullptr, kVocab),
              StatusIs(absl::StatusCode::kInvalidArgument, "not both"));
  EXPECT_THAT(ParseCase(R"({"id": "x", "prompt_ids": [1], "evidence_spans": [[0]]})", 12, nullptr, kVocab),
              StatusIs(absl::StatusCode::kInvalidArgument, "line 12: field \"evidence_spans\""));
}

TEST(ParseCase, AnswerAndEvidenceOutOfRangeAreErrors) {
  // Answer ids outside the vocabulary.
  EXPECT_THAT(ParseCase(R"({"id": "x", "prompt_ids": [1, 2], "answer_ids": [3, -1]})", 2, nullptr, kVocab),
              StatusIs(absl::StatusCode::kInvalidArgument, "line 2: field \"answer_ids\": element 1 = -1"));
  // Span past the prompt (3 tokens), empty span, negative start.
  EXPECT_THAT(ParseCase(R"({"id": "x", "prompt_ids": [1, 2, 3], "evidence_spans": [[1, 4]]})", 2, nullptr, kVocab),
              StatusIs(absl::StatusCode::kInvalidArgument, "out of range for 3 prompt tokens"));
  EXPECT_THAT(ParseCase(R"({"id": "x", "prompt_ids": [1, 2, 3], "evidence_spans": [[0, 1], [2, 2]]})", 2, nullptr,
                        kVocab),
              StatusIs(absl::StatusCode::kInvalidArgument, "element 1 = [2, 2)"));
  EXPECT_THAT(ParseCase(R"({"id": "x", "prompt_ids": [1, 2, 3], "evidence_spans": [[-1, 2]]})", 2, nullptr, kVocab),
              StatusIs(absl::StatusCode::kInvalidArgument, "evidence_spans"));
  EXPECT_THAT(ParseCase(R"({"id": "x", "prompt_ids": [1, 2, 3], "evidence_spans": [[0, 3]]})", 2, nullptr, kVocab),
              IsOk());
}

TEST(ParseDataset, LineNumbersCountBlankLinesAndDuplicatesFail) {
  const std::string ok = "{\"id\": \"a\", \"prompt_ids\": [1]}\n\n{\"id\": \"b\", \"prompt_ids\": [2, 3]}\n";
  ASSERT_OK_AND_ASSIGN(std::vector<EvalCase> cases, ParseDataset(ok, nullptr, kVocab));
  ASSERT_EQ(cases.size(), 2u);
  EXPECT_EQ(cases[1].line, 3);
  EXPECT_THAT(ParseDataset(ok + "{\"id\": \"c\", \"prompt_ids\": [1], \"evidence_spans\": [[0, 2]]}\n", nullptr, kVocab),
              StatusIs(absl::StatusCode::kInvalidArgument, "line 4"));
  EXPECT_THAT(ParseDataset(ok + "{\"id\": \"a\", \"prompt_ids\": [1]}", nullptr, kVocab),
              StatusIs(absl::StatusCode::kInvalidArgument, "line 4: field \"id\": duplicate"));
  EXPECT_THAT(ParseDataset("\n\n", nullptr, kVocab), StatusIs(absl::StatusCode::kInvalidArgument, "no cases"));
}

TEST(ReadDataset, FileRoundTripAndMissingFile) {
  EvalCase c;
  c.id = "r1";
  c.prompt_ids = {1, 4, 5, 6};
  c.answer_ids = {7};
  c.evidence_spans = {{1, 3}};
  const std::string dir = ::echokv::testing::MakeTempDir("eval_dataset");
  const std::string path = dir + "/set.jsonl";
  ::echokv::testing::WriteFileOrDie(path, CaseToJsonLine(c, {{"text", "hello"}}) + "\n");
  ASSERT_OK_AND_ASSIGN(std::vector<EvalCase> back, ReadDataset(path, nullptr, kVocab));
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].id, "r1");
  EXPECT_EQ(back[0].prompt_ids, c.prompt_ids);
  EXPECT_EQ(back[0].answer_ids, c.answer_ids);
  EXPECT_EQ(back[0].evidence_spans, c.evidence_spans);
  EXPECT_THAT(ReadDataset(dir + "/missing.jsonl", nullptr, kVocab), StatusIs(absl::StatusCode::kNotFound, "missing"));
}

}  // namespace
}  // namespace echokv::eval
