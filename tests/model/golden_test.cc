// stories260K against the independent reference (llama2.c run.c, float32): greedy
// generation token for token and the final-prompt logits, for every case of every
// golden*.json in $ECHOKV_TEST_DATA/models/stories260K.
#include <ATen/ATen.h>

#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/sampler.h"
#include "model/transformer.h"
#include "nlohmann/json.hpp"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_data.h"

namespace echokv::model {
namespace {

TEST(StoriesGolden, GreedyGenerationAndLogitsMatchReference) {
  ECHOKV_REQUIRE_TEST_DATA(data);
  const std::string dir = data + "/models/stories260K";
  ASSERT_OK_AND_ASSIGN(auto model, Transformer::Load(dir, DeviceOptions()));
  const auto files = testing::ListFiles(dir, "golden", ".json");
  ASSERT_FALSE(files.empty()) << "no golden*.json in " << dir;
  int cases = 0, logit_cases = 0;
  for (const std::string& file : files) {
    const nlohmann::json golden = nlohmann::json::parse(testing::ReadFileOrDie(file));
    for (const auto& c : golden.at("cases")) {
      const std::string name = c.at("name");
      SCOPED_TRACE(file + " case " + name);
      const std::vector<int> prompt = c.at("prompt_ids");
      const std::vector<int> expected = c.at("generated_ids");
      KvCache cache = model->NewCache();
      ASSERT_OK_AND_ASSIGN(ForwardResult pre, model->Forward(prompt, &cache));
      if (c.contains("final_prompt_logits")) {
        const std::vector<float> ref = c.at("final_prompt_logits");
        ASSERT_EQ(ref.size(), static_cast<size_t>(pre.logits.numel()));
        const float* got = pre.logits.data_ptr<float>();
        double worst = 0;
        for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::abs(static_cast<double>(got[i]) - ref[i]));
        EXPECT_LT(worst, 1e-4) << "final prompt logits differ by " << worst;
        ++logit_cases;
      }
      at::Tensor logits = pre.logits;
      std::vector<int> generated;
      for (size_t i = 0; i < expected.size(); ++i) {
        int next = Argmax(absl::MakeConstSpan(logits.data_ptr<float>(), logits.numel()));
        generated.push_back(next);
        if (next != expected[i]) break;
        ASSERT_OK_AND_ASSIGN(DecodeResult step, model->Decode(next, &cache));
        logits = step.logits;
      }
      EXPECT_EQ(generated, expected);
      if (generated == expected && c.at("stop_reason") == "bos") {
        // The reference stopped because the next greedy token was BOS (1).
        EXPECT_EQ(Argmax(absl::MakeConstSpan(logits.data_ptr<float>(), logits.numel())), 1);
      }
      ++cases;
    }
  }
  EXPECT_GE(cases, 2);
  EXPECT_GE(logit_cases, 1);
}

}  // namespace
}  // namespace echokv::model
