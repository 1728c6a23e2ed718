// echokv-generate as a user runs it: JSON shape, agreement with the library on
// stories260K, flag errors that name the field (non-zero exit, stderr), the position
// limit at its exact boundary, and the embedded default model (no --model).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/testing/test_data.h"
#include "tools/gguf_export.h"
#include "tools/make_test_model.h"

namespace echokv {
namespace {

// Runs the CLI under test with `args` (already shell-quoted).
testing::CommandResult RunCli(const std::string& args) {
  return testing::RunCommand(std::string(ECHOKV_GENERATE_BIN) + " " + args);
}

class GenerateCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto data = testing::TestDataDir();
    if (!data) GTEST_SKIP() << "ECHOKV_TEST_DATA is not set: this test needs models/stories260K";
    model_ = *data + "/models/stories260K";
  }
  std::string model_;
};

TEST_F(GenerateCliTest, JsonHasTheDocumentedFieldsAndReproducesGolden) {
  const nlohmann::json golden =
      nlohmann::json::parse(testing::ReadFileOrDie(model_ + "/golden_public.json"));
  const auto& c = golden.at("cases").at(1);  // "Lily and Tom went to the park. They saw"
  const std::vector<int> expected = c.at("generated_ids");
  testing::CommandResult r = RunCli("--model " + model_ + " --prompt '" + c.at("prompt").get<std::string>() +
                    "' --max-tokens 20 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("prompt_ids").get<std::vector<int>>(), c.at("prompt_ids").get<std::vector<int>>());
  EXPECT_EQ(j.at("output_ids").get<std::vector<int>>(), std::vector<int>(expected.begin(), expected.begin() + 20));
  EXPECT_EQ(j.at("stop_reason"), "length");
  EXPECT_FALSE(j.at("text").get<std::string>().empty());
  EXPECT_GE(j.at("timings_ms").at("prefill").get<double>(), 0.0);
  EXPECT_GE(j.at("timings_ms").at("decode").get<double>(), 0.0);
  EXPECT_EQ(j.at("compression").at("policy"), "full");
}

// Issue 25 defect 1: the output's first token keeps its leading space (the prompt is
// the decoder's context): "Once" continues " upon a time", in --json's text and in the
// streamed text alike; it printed "upon a time".
TEST_F(GenerateCliTest, TheFirstGeneratedTokenKeepsItsLeadingSpace) {
  testing::CommandResult json = RunCli("--model " + model_ + " --prompt Once --max-tokens 8 --json");
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const std::string text = nlohmann::json::parse(json.out).at("text");
  EXPECT_EQ(text.rfind(" upon a time", 0), 0u) << text;
  testing::CommandResult streamed = RunCli("--model " + model_ + " --prompt Once --max-tokens 8 2>/dev/null");
  ASSERT_EQ(streamed.exit_code, 0) << streamed.err;
  EXPECT_EQ(streamed.out, text + "\n");
}

// The start-up choice of OpenBLAS settings (common/blas_env.h), as --json reports it:
// with OPENBLAS_THREAD_TIMEOUT already set the process starts without re-exec (and so
// leaves the core to OpenBLAS); with nothing set it re-execs once and sets both.
TEST_F(GenerateCliTest, RuntimeSaysWhatStartUpChoseAndReexecsOnlyWhenNeeded) {
  const std::string args = " " + std::string(ECHOKV_GENERATE_BIN) + " --model " + model_ +
                           " --prompt-ids 1,403,407 --max-tokens 1 --json";
  testing::CommandResult set = testing::RunCommand(
      "env -u OPENBLAS_CORETYPE -u ECHOKV_BLAS_SET -u ECHOKV_NO_REEXEC OPENBLAS_THREAD_TIMEOUT=4" + args);
  ASSERT_EQ(set.exit_code, 0) << set.err;
  const nlohmann::json rt = nlohmann::json::parse(set.out).at("runtime");
  EXPECT_GE(rt.at("threads").get<int>(), 1);
  const std::string kernel = rt.at("attention_kernel");
  EXPECT_TRUE(kernel == "avx512" || kernel == "avx2" || kernel == "scalar") << kernel;
  const std::string blas = rt.at("blas");
  EXPECT_EQ(blas.rfind("OpenBLAS core ", 0), 0u) << blas;
  EXPECT_NE(blas.find("OPENBLAS_CORETYPE=(unset: OpenBLAS's own detection"), std::string::npos) << blas;
  EXPECT_NE(blas.find("OPENBLAS_THREAD_TIMEOUT=4"), std::string::npos) << blas;
  EXPECT_EQ(blas.find("set by echokv"), std::string::npos) << blas;  // no re-exec

  testing::CommandResult unset = testing::RunCommand(
      "env -u OPENBLAS_CORETYPE -u OPENBLAS_THREAD_TIMEOUT -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u ECHOKV_BLAS_SET "
      "-u ECHOKV_NO_REEXEC" +
      args);
  ASSERT_EQ(unset.exit_code, 0) << unset.err;
  const std::string reexec = nlohmann::json::parse(unset.out).at("runtime").at("blas");
  EXPECT_NE(reexec.find("OPENBLAS_THREAD_TIMEOUT=4 (set by echokv, re-exec)"), std::string::npos) << reexec;
  EXPECT_NE(reexec.find("GOMP_SPINCOUNT=3000 (set by echokv, re-exec)"), std::string::npos) << reexec;
  // Whatever OpenBLAS would have picked, the re-exec'ed process runs a core this CPU
  // deserves: never the fallback that the first process reports above.
  EXPECT_EQ(reexec.find("fell back to"), std::string::npos) << reexec;
  if (blas.find("fell back to") != std::string::npos) {
    EXPECT_NE(reexec.find("(set by echokv, re-exec: OpenBLAS chose"), std::string::npos) << reexec;
  }
}

TEST_F(GenerateCliTest, CompressionReportAndRetainedDump) {
  testing::CommandResult r = RunCli("--model " + model_ +
                    " --prompt-ids 1,403,407,261,378,432,383,286,261,376,298,315,421,395,317,426,338,401,"
                    "270,261,308,400,272,442,500,311,263,380,290,292 --max-tokens 8 --json --policy echokv "
                    "--budget 8 --lookahead 4 --workspace 16 --dump-retained");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const auto& rep = j.at("compression");
  EXPECT_EQ(rep.at("policy"), "echokv");
  EXPECT_EQ(rep.at("forward_passes"), 4);
  EXPECT_EQ(rep.at("retained_entries").get<int64_t>() * rep.at("full_kv_bytes").get<int64_t>(),
            rep.at("total_entries").get<int64_t>() * rep.at("retained_kv_bytes").get<int64_t>());
  const auto& retained = j.at("retained");
  ASSERT_EQ(retained.size(), 5u * 4u);  // layers x KV groups, layer-major
  for (const auto& group : retained) {
    std::vector<int> pos = group;
    ASSERT_EQ(pos.size(), 8u);
    for (size_t i = 0; i < pos.size(); ++i) {
      EXPECT_GE(pos[i], 0);
      EXPECT_LT(pos[i], 30);
      if (i > 0) {
        EXPECT_LT(pos[i - 1], pos[i]);
      }
    }
  }
  EXPECT_EQ(j.at("output_ids").size(), 8u);
}

// --logprobs reports raw log-probabilities: at the first step they are log_softmax of
// the logits after the prompt, which llama2.c recorded independently (golden
// final_prompt_logits, float32, ~1e-4). Sampling options do not change them.
TEST_F(GenerateCliTest, LogprobsAreTheModelsAgainstLlama2cLogits) {
  const nlohmann::json golden =
      nlohmann::json::parse(testing::ReadFileOrDie(model_ + "/golden_public.json"));
  const auto& c = golden.at("cases").at(1);
  const std::vector<double> logits = c.at("final_prompt_logits").get<std::vector<double>>();
  double mx = -1e300, sum = 0;
  for (double l : logits) mx = std::max(mx, l);
  for (double l : logits) sum += std::exp(l - mx);
  const double lse = mx + std::log(sum);
  std::vector<int> order(logits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  const std::string prompt = " --prompt '" + c.at("prompt").get<std::string>() + "' --max-tokens 3 --json --logprobs --top-logprobs 5";
  for (const std::string& options : {std::string(""), std::string(" --temperature 0.7 --seed 5 --top-k 3 --repetition-penalty 1.5 --presence-penalty 1")}) {
    testing::CommandResult r = RunCli("--model " + model_ + prompt + options);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    const auto& lp = j.at("logprobs");
    ASSERT_EQ(lp.size(), 3u) << options;
    const int first = lp[0].at("token").get<int>();
    EXPECT_EQ(first, j.at("output_ids")[0].get<int>());
    EXPECT_NEAR(lp[0].at("logprob").get<double>(), logits[first] - lse, 2e-4) << options;
    const auto& top = lp[0].at("top_logprobs");
    ASSERT_EQ(top.size(), 5u);
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(top[i].at("token").get<int>(), order[i]) << options << " rank " << i;
      EXPECT_NEAR(top[i].at("logprob").get<double>(), logits[order[i]] - lse, 2e-4) << options << " rank " << i;
    }
    if (options.empty()) {  // greedy: the golden continuation
      EXPECT_EQ(first, c.at("generated_ids")[0].get<int>());
    }
  }
  // Without --logprobs the field is absent.
  testing::CommandResult plain = RunCli("--model " + model_ + " --prompt 'Once' --max-tokens 2 --json");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_FALSE(nlohmann::json::parse(plain.out).contains("logprobs"));
}

TEST_F(GenerateCliTest, BadFlagsNameTheField) {
  struct Case {
    std::string flags;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"--policy echokv --lookahead 7", "lookahead"},
      {"--policy echokv --budget 64 --workspace 32", "workspace"},
      {"--policy echokv --budget 16 --window 16", "window"},
      {"--policy nosuch", "policy"},
      {"--policy echokv --budget 0", "budget"},
      {"--max-tokens 0", "max-tokens"},
      {"--temperature -1", "temperature"},
      {"--repetition-penalty 0", "repetition_penalty"},  // the other ranges: model_sampler_test
      {"--top-logprobs 2", "needs logprobs"},
      {"--repair maybe", "repair"},
      {"--prompt-ids 1,x", "prompt-ids"},
      {"--prompt-ids 1,99999", "token id 99999"},
  };
  for (const Case& c : cases) {
    const std::string prompt = c.flags.find("--prompt-ids") == std::string::npos ? " --prompt 'Once upon a time'" : "";
    testing::CommandResult r = RunCli("--model " + model_ + prompt + " " + c.flags);
    EXPECT_NE(r.exit_code, 0) << c.flags;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.flags << " -> stderr: " << r.err;
    EXPECT_TRUE(r.out.empty()) << c.flags;
  }
  testing::CommandResult missing = RunCli("--model /nonexistent/dir --prompt hi");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("/nonexistent/dir"), std::string::npos) << missing.err;
}

// ---- tests on the embedded model (models/stories260K in the source tree; no data) ----

// The shell prefix that runs the CLI as a user without $ECHOKV_MODEL would.
// No $ECHOKV_MODEL, and a models folder without the default GGUF: the embedded
// stories260K is the default then.
std::string NoEnvModel() { return "env -u ECHOKV_MODEL ECHOKV_MODELS=/nonexistent/echokv-models "; }

std::string IdList(int n) {
  std::string out = "1";
  // Valid merged-piece ids (259 .. 511), a deterministic pattern.
  for (int i = 1; i < n; ++i) out += "," + std::to_string(259 + (i * 37) % 253);
  return out;
}

// stories260K has max_position_embeddings 512. The prompt fills positions 0 .. P-1 and
// every generated token but the last is fed back, so P + N <= 513: with P = 402 the
// model generates exactly 111 tokens (llama2.c's run.c -n 512 does the same).
TEST(GenerateCliPositionsTest, PromptPlusMaxTokensMayExceedThePositionsByOne) {
  const std::string model = std::string(ECHOKV_REPO_MODEL_DIR);
  const std::string ids402 = " --prompt-ids " + IdList(402);
  testing::CommandResult ok = RunCli("--model " + model + ids402 + " --max-tokens 111 --json");
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  const nlohmann::json j = nlohmann::json::parse(ok.out);
  EXPECT_EQ(j.at("prompt_ids").size(), 402u);
  // BOS (1) ends a TinyStories story but is not an EOS id here, so all 111 come out.
  EXPECT_EQ(j.at("output_ids").size(), 111u);
  EXPECT_EQ(j.at("stop_reason"), "length");

  testing::CommandResult over = RunCli("--model " + model + ids402 + " --max-tokens 112 --json");
  EXPECT_EQ(over.exit_code, 1);
  EXPECT_TRUE(over.out.empty());
  EXPECT_NE(over.err.find("--max-tokens"), std::string::npos) << over.err;
  EXPECT_NE(over.err.find("at most 111"), std::string::npos) << over.err;

  // The extreme: a prompt of all 512 positions still samples one token; 513 cannot.
  testing::CommandResult full = RunCli("--model " + model + " --prompt-ids " + IdList(512) + " --max-tokens 1 --json");
  ASSERT_EQ(full.exit_code, 0) << full.err;
  EXPECT_EQ(nlohmann::json::parse(full.out).at("output_ids").size(), 1u);
  testing::CommandResult beyond = RunCli("--model " + model + " --prompt-ids " + IdList(513) + " --max-tokens 1");
  EXPECT_EQ(beyond.exit_code, 1);
  EXPECT_NE(beyond.err.find("--max-tokens"), std::string::npos) << beyond.err;
  EXPECT_NE(beyond.err.find("at most 0"), std::string::npos) << beyond.err;
}

// Without --model (and without $ECHOKV_MODEL or the default GGUF) the CLI runs the embedded stories260K and
// writes its known English: the greedy story from BOS that llama2.c's
// doc/stories260K.md documents (an oracle independent of this code base).
TEST(GenerateCliDefaultModelTest, NoModelFlagRunsTheEmbeddedStoriesModel) {
  testing::CommandResult r = testing::RunCommand(NoEnvModel() + ECHOKV_GENERATE_BIN + " --prompt-ids 1 --max-tokens 30 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string text = nlohmann::json::parse(r.out).at("text");
  EXPECT_EQ(text.rfind("Once upon a time, there was a little girl named Lily. She loved to play outside", 0), 0u)
      << text;
  // Plain text mode streams the same story to stdout.
  testing::CommandResult plain =
      testing::RunCommand(NoEnvModel() + ECHOKV_GENERATE_BIN + " --prompt 'Once upon a time' --max-tokens 14");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_EQ(plain.out.rfind(", there was a little girl named Lily", 0), 0u) << plain.out;
}

// The default GGUF in $ECHOKV_MODELS comes before the embedded model: a folder whose
// SmolLM2-135M-Instruct.Q4_1.gguf is a tiny model's GGUF twin runs that model (its
// vocabulary of 320 ids shows which one ran; stories260K has 512).
TEST(GenerateCliDefaultModelTest, TheDefaultGgufInTheModelsFolderComesFirst) {
  const std::string root = testing::MakeTempDir("generate-models");
  tools::TestModelOptions o;
  o.out_dir = root + "/hf";
  ASSERT_TRUE(tools::MakeTestModel(o).ok());
  ASSERT_TRUE(tools::ExportGguf(o.out_dir, root + "/SmolLM2-135M-Instruct.Q4_1.gguf", {}).ok());
  testing::CommandResult r = testing::RunCommand("env -u ECHOKV_MODEL ECHOKV_MODELS=" + root + " " +
                                                 ECHOKV_GENERATE_BIN + " --prompt-ids 319 --max-tokens 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  testing::CommandResult stories = testing::RunCommand(NoEnvModel() + ECHOKV_GENERATE_BIN +
                                                       " --prompt-ids 400 --max-tokens 2 --json");
  ASSERT_EQ(stories.exit_code, 0) << stories.err;
  testing::CommandResult too_big = testing::RunCommand("env -u ECHOKV_MODEL ECHOKV_MODELS=" + root + " " +
                                                       ECHOKV_GENERATE_BIN + " --prompt-ids 400 --max-tokens 2");
  EXPECT_NE(too_big.exit_code, 0);  // 400 is outside the tiny model's vocabulary
  EXPECT_NE(too_big.err.find("400"), std::string::npos) << too_big.err;
  std::filesystem::remove_all(root);
}

// $ECHOKV_MODEL overrides the embedded model, and --model overrides both.
TEST(GenerateCliDefaultModelTest, EnvironmentAndFlagOverrideTheDefault) {
  testing::CommandResult env =
      testing::RunCommand(std::string("ECHOKV_MODEL=/nonexistent/env-model ") + ECHOKV_GENERATE_BIN + " --prompt hi");
  EXPECT_NE(env.exit_code, 0);
  EXPECT_NE(env.err.find("/nonexistent/env-model"), std::string::npos) << env.err;
  testing::CommandResult flag = testing::RunCommand(std::string("ECHOKV_MODEL=/nonexistent/env-model ") +
                                                    ECHOKV_GENERATE_BIN + " --model " + ECHOKV_REPO_MODEL_DIR +
                                                    " --prompt-ids 1 --max-tokens 2 --json");
  EXPECT_EQ(flag.exit_code, 0) << flag.err;
}

// An installed tree (bin/ and models/ side by side, like /opt/echokv in the image)
// takes its own models/ before the source tree's. The installed copy here is broken on
// purpose, so the error proves which directory was read.
TEST(GenerateCliDefaultModelTest, AnInstalledTreeUsesItsOwnModelsDir) {
  namespace fs = std::filesystem;
  const std::string root = testing::MakeTempDir("generate-installed");
  fs::create_directories(root + "/bin");
  fs::create_directories(root + "/models/stories260K");
  fs::copy_file(ECHOKV_GENERATE_BIN, root + "/bin/echokv-generate");
  fs::permissions(root + "/bin/echokv-generate", fs::perms::owner_all, fs::perm_options::add);
  testing::WriteFileOrDie(root + "/models/stories260K/config.json", "{\"model_type\": \"llama\"}");
  testing::CommandResult r =
      testing::RunCommand(NoEnvModel() + root + "/bin/echokv-generate --prompt-ids 1 --max-tokens 2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find(root + "/bin/../models/stories260K"), std::string::npos) << r.err;
  // Without its models/ folder it falls back to the source tree's copy.
  fs::remove_all(root + "/models");
  testing::CommandResult fallback =
      testing::RunCommand(NoEnvModel() + root + "/bin/echokv-generate --prompt-ids 1 --max-tokens 2 --json");
  EXPECT_EQ(fallback.exit_code, 0) << fallback.err;
  fs::remove_all(root);
}

// The embedded copy is the shared data's stories260K: the default run reproduces
// llama2.c's golden greedy output (run.c, float32) token for token.
TEST_F(GenerateCliTest, TheEmbeddedModelReproducesTheSharedGoldenOutput) {
  const nlohmann::json golden =
      nlohmann::json::parse(testing::ReadFileOrDie(model_ + "/golden_public.json"));
  for (const auto& c : golden.at("cases")) {
    const std::vector<int> prompt = c.at("prompt_ids");
    const std::vector<int> expected = c.at("generated_ids");
    std::string ids;
    for (int t : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(t);
    const std::string args = " --prompt-ids " + ids + " --max-tokens " + std::to_string(expected.size()) + " --json";
    testing::CommandResult embedded = testing::RunCommand(NoEnvModel() + ECHOKV_GENERATE_BIN + args);
    testing::CommandResult shared = RunCli("--model " + model_ + args);
    ASSERT_EQ(embedded.exit_code, 0) << embedded.err;
    ASSERT_EQ(shared.exit_code, 0) << shared.err;
    const std::vector<int> got = nlohmann::json::parse(embedded.out).at("output_ids");
    EXPECT_EQ(got, expected) << c.dump().substr(0, 200);
    EXPECT_EQ(got, nlohmann::json::parse(shared.out).at("output_ids").get<std::vector<int>>());
  }
}

}  // namespace
}  // namespace echokv
