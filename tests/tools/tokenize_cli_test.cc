// echokv-tokenize as a user runs it: golden cases of the Qwen2.5 and GPT-2 folders
// through the binary (ids and tokens; ids_no_special with --no-special), --decode,
// and clear errors. The library test checks every case; this one checks the CLI's
// plumbing on a few (each run loads LibTorch and a 7 MB tokenizer.json).
#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/testing/test_data.h"

namespace echokv {
namespace {

// Runs the CLI under test with `args` (already shell-quoted).
testing::CommandResult RunTokenize(const std::string& args) {
  return testing::RunCommand(std::string(ECHOKV_TOKENIZE_BIN) + " " + args);
}

TEST(TokenizeCliTest, GoldenCasesThroughTheBinary) {
  ECHOKV_REQUIRE_TEST_DATA(data);
  const std::string scratch = testing::MakeTempDir("echokv_tok_text_");
  int checked = 0;
  for (const char* name : {"qwen2.5", "gpt2"}) {
    const std::string dir = data + "/tokenizers/" + name;
    for (const std::string& file : testing::ListFiles(dir, "golden", ".json")) {
      const nlohmann::json golden = nlohmann::json::parse(testing::ReadFileOrDie(file));
      int taken = 0;
      for (const auto& c : golden.at("cases")) {
        // The first two cases, and every case with special-token text.
        if (taken >= 2 && !c.contains("ids_no_special")) continue;
        ++taken;
        SCOPED_TRACE(std::string(name) + " " + c.at("id").get<std::string>());
        const std::string path = scratch + "/text";
        testing::WriteFileOrDie(path, c.at("text").get<std::string>());
        testing::CommandResult r = RunTokenize("--tokenizer " + dir + " --text-file " + path + " --json");
        ASSERT_EQ(r.exit_code, 0) << r.err;
        const nlohmann::json j = nlohmann::json::parse(r.out);
        EXPECT_EQ(j.at("ids").get<std::vector<int>>(), c.at("ids").get<std::vector<int>>());
        if (c.contains("tokens")) {
          EXPECT_EQ(j.at("tokens").get<std::vector<std::string>>(), c.at("tokens").get<std::vector<std::string>>());
        }
        if (c.contains("ids_no_special")) {
          testing::CommandResult plain = RunTokenize("--tokenizer " + dir + " --text-file " + path + " --no-special --json");
          ASSERT_EQ(plain.exit_code, 0) << plain.err;
          EXPECT_EQ(nlohmann::json::parse(plain.out).at("ids").get<std::vector<int>>(),
                    c.at("ids_no_special").get<std::vector<int>>());
        }
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 4);
}

TEST(TokenizeCliTest, DecodeAndErrors) {
  ECHOKV_REQUIRE_TEST_DATA(data);
  const std::string qwen = data + "/tokenizers/qwen2.5";
  testing::CommandResult r = RunTokenize("--tokenizer " + qwen + " --decode 9707,1879 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out).at("text"), "Hello world");
  testing::CommandResult bad_id = RunTokenize("--tokenizer " + qwen + " --decode 1,x");
  EXPECT_NE(bad_id.exit_code, 0);
  EXPECT_NE(bad_id.err.find("--decode"), std::string::npos) << bad_id.err;
  testing::CommandResult missing = RunTokenize("--tokenizer /nonexistent/tok --text hi");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("/nonexistent/tok"), std::string::npos) << missing.err;
  testing::CommandResult no_file = RunTokenize("--tokenizer " + qwen + " --text-file /nonexistent/file");
  EXPECT_NE(no_file.exit_code, 0);
  EXPECT_NE(no_file.err.find("--text-file"), std::string::npos) << no_file.err;
}

}  // namespace
}  // namespace echokv
