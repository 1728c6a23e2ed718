// Tests of config.json / generation_config.json parsing (model/config.h): every rule
// gets a malformed input whose error must carry the right code and name the field.
#include "model/config.h"

#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_data.h"

namespace echokv::model {
namespace {

using ::echokv::testing::StatusIs;
using ::testing::ElementsAre;
using Json = nlohmann::json;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
constexpr auto kUnimplemented = absl::StatusCode::kUnimplemented;

// A minimal valid llama config.json.
Json BaseConfig() {
  return Json{
      {"model_type", "llama"},
      {"hidden_size", 64},
      {"intermediate_size", 172},
      {"num_hidden_layers", 3},
      {"num_attention_heads", 8},
      {"num_key_value_heads", 4},
      {"vocab_size", 512},
      {"max_position_embeddings", 256},
      {"rms_norm_eps", 1e-5},
  };
}

absl::StatusOr<ModelConfig> Parse(const Json& config, const std::string& generation = "") {
  return ParseModelConfig(config.dump(), generation);
}

TEST(ModelConfigTest, MinimalLlamaAndDefaults) {
  Json j = BaseConfig();
  j.erase("num_key_value_heads");
  ASSERT_OK_AND_ASSIGN(ModelConfig cfg, Parse(j));
  EXPECT_EQ(cfg.type, ModelType::kLlama);
  EXPECT_EQ(ModelTypeName(cfg.type), "llama");
  EXPECT_EQ(cfg.hidden_size, 64);
  EXPECT_EQ(cfg.intermediate_size, 172);
  EXPECT_EQ(cfg.num_layers, 3);
  EXPECT_EQ(cfg.num_heads, 8);
  EXPECT_EQ(cfg.num_kv_heads, 8);  // defaults to num_attention_heads
  EXPECT_EQ(cfg.head_dim, 8);      // 64 / 8
  EXPECT_EQ(cfg.vocab_size, 512);
  EXPECT_EQ(cfg.max_position_embeddings, 256);
  EXPECT_DOUBLE_EQ(cfg.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(cfg.rope_theta, 10000.0);
  EXPECT_FALSE(cfg.tie_word_embeddings);
  EXPECT_FALSE(cfg.qkv_bias);
  EXPECT_FALSE(cfg.o_bias);
  EXPECT_EQ(cfg.sliding_window, 0);
  EXPECT_FALSE(cfg.UsesSlidingWindow(0));
  EXPECT_EQ(cfg.bos_token_id, -1);
  EXPECT_TRUE(cfg.eos_token_ids.empty());
  EXPECT_OK(cfg.Validate());
}

TEST(ModelConfigTest, ExplicitFieldsAndNullDefaults) {
  Json j = BaseConfig();
  j["head_dim"] = 16;  // differs from hidden/heads: allowed when given
  j["rope_theta"] = 500000;
  j["tie_word_embeddings"] = true;
  j["rope_scaling"] = nullptr;
  j["hidden_act"] = "silu";
  j["torch_dtype"] = "bfloat16";
  j["bos_token_id"] = 1;
  j["eos_token_id"] = 2;
  ASSERT_OK_AND_ASSIGN(ModelConfig cfg, Parse(j));
  EXPECT_EQ(cfg.head_dim, 16);
  EXPECT_EQ(cfg.queries_per_kv(), 2);
  EXPECT_DOUBLE_EQ(cfg.rope_theta, 500000.0);
  EXPECT_TRUE(cfg.tie_word_embeddings);
  EXPECT_EQ(cfg.torch_dtype, "bfloat16");
  EXPECT_EQ(cfg.bos_token_id, 1);
  EXPECT_THAT(cfg.eos_token_ids, ElementsAre(2));

  j["head_dim"] = nullptr;  // null -> hidden / heads
  j["num_key_value_heads"] = nullptr;
  ASSERT_OK_AND_ASSIGN(cfg, Parse(j));
  EXPECT_EQ(cfg.head_dim, 8);
  EXPECT_EQ(cfg.num_kv_heads, 8);
}

TEST(ModelConfigTest, EachMissingRequiredFieldIsNamed) {
  for (const char* field :
       {"model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "vocab_size", "max_position_embeddings", "rms_norm_eps"}) {
    SCOPED_TRACE(field);
    Json j = BaseConfig();
    j.erase(field);
    EXPECT_THAT(Parse(j), StatusIs(kInvalid, std::string("'") + field + "' is missing"));
    j[field] = nullptr;  // null counts as missing for required fields
    EXPECT_THAT(Parse(j), StatusIs(kInvalid, std::string("'") + field + "' is missing"));
  }
}

TEST(ModelConfigTest, WrongJsonTypesAreNamed) {
  struct Case {
    const char* field;
    Json value;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"hidden_size", "64", "'hidden_size' must be an integer, got a string"},
      {"hidden_size", 64.5, "'hidden_size' must be an integer, got a floating-point number"},
      {"num_hidden_layers", Json::array({3}), "'num_hidden_layers' must be an integer"},
      {"num_key_value_heads", true, "'num_key_value_heads' must be an integer"},
      {"head_dim", "8", "'head_dim' must be an integer"},
      {"vocab_size", Json::object(), "'vocab_size' must be an integer"},
      {"rms_norm_eps", "1e-5", "'rms_norm_eps' must be a number"},
      {"rope_theta", "10000", "'rope_theta' must be a number"},
      {"tie_word_embeddings", "yes", "'tie_word_embeddings' must be true or false"},
      {"tie_word_embeddings", 1, "'tie_word_embeddings' must be true or false"},
      {"attention_bias", "false", "'attention_bias' must be true or false"},
      {"model_type", 7, "'model_type' must be a string"},
      {"hidden_act", 1, "'hidden_act' must be a string"},
      {"eos_token_id", "2", "'eos_token_id' must be an integer, a list of integers or null"},
      {"eos_token_id", Json::array({2, "3"}), "'eos_token_id' must be an integer"},
      {"bos_token_id", 1.5, "'bos_token_id' must be an integer"},
      {"eos_token_id", -2, "'eos_token_id' holds a negative token id"},
      {"max_position_embeddings", 1ULL << 40, "'max_position_embeddings' is too large"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.field) + " = " + c.value.dump());
    Json j = BaseConfig();
    j[c.field] = c.value;
    EXPECT_THAT(Parse(j), StatusIs(kInvalid, c.message));
  }
}

TEST(ModelConfigTest, NonPositiveSizesAreNamed) {
  for (const char* field : {"hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "num_key_value_heads", "vocab_size",
                            "max_position_embeddings", "head_dim"}) {
    for (int value : {0, -4}) {
      SCOPED_TRACE(std::string(field) + " = " + std::to_string(value));
      Json j = BaseConfig();
      j[field] = value;
      EXPECT_THAT(Parse(j), StatusIs(kInvalid, std::string("'") + field + "' must be positive"));
    }
  }
  Json j = BaseConfig();
  j["rms_norm_eps"] = 0.0;
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, "'rms_norm_eps' must be positive"));
  j = BaseConfig();
  j["rope_theta"] = -1.0;
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, "'rope_theta' must be positive"));
}

TEST(ModelConfigTest, HeadGeometryIsChecked) {
  Json j = BaseConfig();
  j["num_key_value_heads"] = 3;  // 8 % 3 != 0
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, "'num_key_value_heads' (3) must divide"));

  j = BaseConfig();
  j["hidden_size"] = 60;  // 60 / 8 is not whole and head_dim is absent
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, "'hidden_size' (60) is not a multiple"));

  j["head_dim"] = 8;  // with head_dim given, hidden_size need not be heads * head_dim
  EXPECT_THAT(Parse(j), ::echokv::testing::IsOk());

  j = BaseConfig();
  j["head_dim"] = 7;
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, "'head_dim' must be even"));

  j = BaseConfig();
  j["hidden_size"] = 56;  // 56 / 8 = 7: odd derived head_dim
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, "'head_dim' must be even"));
}

TEST(ModelConfigTest, RopeScalingIsRefusedByType) {
  Json j = BaseConfig();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_THAT(Parse(j), StatusIs(kUnimplemented, "rope_scaling type 'yarn' is not supported"));
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  EXPECT_THAT(Parse(j), StatusIs(kUnimplemented, "rope_scaling type 'linear' is not supported"));
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"type", "llama3"}, {"factor", 8.0}};
  EXPECT_THAT(Parse(j), StatusIs(kUnimplemented, "rope_scaling type 'llama3'"));
  j["rope_scaling"] = {{"factor", 2.0}};
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, "'rope_scaling' has no 'rope_type' or 'type'"));
  j["rope_scaling"] = "yarn";
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, "'rope_scaling' must be an object or null"));
}

TEST(ModelConfigTest, UnsupportedModelTypeIsNamed) {
  Json j = BaseConfig();
  j["model_type"] = "gpt2";
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, "'model_type' 'gpt2' is not supported"));
}

TEST(ModelConfigTest, MlpBiasAndActivationAreRefused) {
  Json j = BaseConfig();
  j["mlp_bias"] = true;
  EXPECT_THAT(Parse(j), StatusIs(kUnimplemented, "mlp_bias"));
  j["mlp_bias"] = false;
  EXPECT_THAT(Parse(j), ::echokv::testing::IsOk());
  j["hidden_act"] = "gelu";
  EXPECT_THAT(Parse(j), StatusIs(kUnimplemented, "'hidden_act' is 'gelu'"));
}

TEST(ModelConfigTest, LlamaAttentionBias) {
  Json j = BaseConfig();
  j["attention_bias"] = true;
  ASSERT_OK_AND_ASSIGN(ModelConfig cfg, Parse(j));
  EXPECT_TRUE(cfg.qkv_bias);
  EXPECT_TRUE(cfg.o_bias);
}

TEST(ModelConfigTest, Qwen2BiasesAndSlidingWindow) {
  Json j = BaseConfig();
  j["model_type"] = "qwen2";
  j["sliding_window"] = 32;  // ignored unless use_sliding_window is true
  j["use_sliding_window"] = false;
  j["max_window_layers"] = 1;
  ASSERT_OK_AND_ASSIGN(ModelConfig cfg, Parse(j));
  EXPECT_EQ(cfg.type, ModelType::kQwen2);
  EXPECT_TRUE(cfg.qkv_bias);
  EXPECT_FALSE(cfg.o_bias);
  EXPECT_EQ(cfg.sliding_window, 0);
  for (int layer = 0; layer < 3; ++layer) EXPECT_FALSE(cfg.UsesSlidingWindow(layer));

  j["use_sliding_window"] = true;
  ASSERT_OK_AND_ASSIGN(cfg, Parse(j));
  EXPECT_EQ(cfg.sliding_window, 32);
  EXPECT_EQ(cfg.sliding_window_first_layer, 1);
  EXPECT_FALSE(cfg.UsesSlidingWindow(0));  // layers < max_window_layers: full attention
  EXPECT_TRUE(cfg.UsesSlidingWindow(1));
  EXPECT_TRUE(cfg.UsesSlidingWindow(2));

  j["max_window_layers"] = 3;  // no layer reaches it: no window anywhere
  ASSERT_OK_AND_ASSIGN(cfg, Parse(j));
  for (int layer = 0; layer < 3; ++layer) EXPECT_FALSE(cfg.UsesSlidingWindow(layer));

  j["max_window_layers"] = 0;
  j["sliding_window"] = nullptr;
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, "'sliding_window' is missing"));
  j["sliding_window"] = "32";
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, "'sliding_window' must be an integer"));
  j["sliding_window"] = 32;
  j["use_sliding_window"] = "true";
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, "'use_sliding_window' must be true or false"));
}

TEST(ModelConfigTest, MistralSlidingWindow) {
  Json j = BaseConfig();
  j["model_type"] = "mistral";
  j["sliding_window"] = 4;
  ASSERT_OK_AND_ASSIGN(ModelConfig cfg, Parse(j));
  EXPECT_EQ(cfg.type, ModelType::kMistral);
  EXPECT_EQ(cfg.sliding_window, 4);
  for (int layer = 0; layer < 3; ++layer) EXPECT_TRUE(cfg.UsesSlidingWindow(layer));
  EXPECT_FALSE(cfg.qkv_bias);

  j["sliding_window"] = nullptr;
  ASSERT_OK_AND_ASSIGN(cfg, Parse(j));
  EXPECT_EQ(cfg.sliding_window, 0);
  EXPECT_FALSE(cfg.UsesSlidingWindow(0));

  j["sliding_window"] = -1;
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, "'sliding_window' must be positive or null"));
  j["sliding_window"] = "4096";
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, "'sliding_window' must be an integer"));
}

TEST(ModelConfigTest, EosIdsAreMergedFromGenerationConfig) {
  Json j = BaseConfig();
  j["bos_token_id"] = 1;
  j["eos_token_id"] = Json::array({2, 5});
  ASSERT_OK_AND_ASSIGN(ModelConfig cfg,
                       Parse(j, R"({"bos_token_id": 3, "eos_token_id": [5, 7, 2, 7]})"));
  EXPECT_THAT(cfg.eos_token_ids, ElementsAre(2, 5, 7));  // union, order kept, no duplicates
  EXPECT_EQ(cfg.bos_token_id, 3);                          // generation_config wins

  j["eos_token_id"] = 2;
  ASSERT_OK_AND_ASSIGN(cfg, Parse(j, R"({"eos_token_id": 9})"));
  EXPECT_THAT(cfg.eos_token_ids, ElementsAre(2, 9));
  EXPECT_EQ(cfg.bos_token_id, 1);  // absent in generation_config: config.json's

  j["eos_token_id"] = nullptr;
  ASSERT_OK_AND_ASSIGN(cfg, Parse(j, R"({"eos_token_id": null, "do_sample": true})"));
  EXPECT_TRUE(cfg.eos_token_ids.empty());
}

TEST(ModelConfigTest, GenerationConfigErrorsAreNamed) {
  Json j = BaseConfig();
  EXPECT_THAT(Parse(j, "{oops"), StatusIs(kInvalid, "generation_config.json: invalid JSON"));
  EXPECT_THAT(Parse(j, "[2]"), StatusIs(kInvalid, "generation_config.json: expected a JSON object"));
  EXPECT_THAT(Parse(j, R"({"eos_token_id": "2"})"),
              StatusIs(kInvalid, "generation_config.json: field 'eos_token_id'"));
  EXPECT_THAT(Parse(j, R"({"bos_token_id": [1, 4]})"),
              StatusIs(kInvalid, "'bos_token_id' lists several different ids"));
}

TEST(ModelConfigTest, TokenIdsMustBeInsideTheVocabulary) {
  Json j = BaseConfig();
  j["eos_token_id"] = 512;
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, "eos_token_id (512) must be in [0, vocab_size=512)"));
  j["eos_token_id"] = 2;
  j["bos_token_id"] = 600;
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, "bos_token_id (600)"));
}

TEST(ModelConfigTest, InvalidJsonIsReported) {
  EXPECT_THAT(ParseModelConfig("{\"model_type\": \"llama\",", ""),
              StatusIs(kInvalid, "config.json: invalid JSON"));
  EXPECT_THAT(ParseModelConfig("", ""), StatusIs(kInvalid, "config.json: invalid JSON"));
  EXPECT_THAT(ParseModelConfig("[1, 2]", ""),
              StatusIs(kInvalid, "config.json: expected a JSON object"));
}

TEST(ModelConfigTest, ValidateNamesTheBadField) {
  ASSERT_OK_AND_ASSIGN(ModelConfig good, Parse(BaseConfig()));
  EXPECT_OK(good.Validate());

  ModelConfig cfg = good;
  cfg.num_kv_heads = 0;
  EXPECT_THAT(cfg.Validate(), StatusIs(kInvalid, "num_key_value_heads must be positive"));
  cfg = good;
  cfg.num_kv_heads = 3;
  EXPECT_THAT(cfg.Validate(), StatusIs(kInvalid, "num_key_value_heads (3) must divide"));
  cfg = good;
  cfg.head_dim = 5;
  EXPECT_THAT(cfg.Validate(), StatusIs(kInvalid, "head_dim must be even"));
  cfg = good;
  cfg.vocab_size = -1;
  EXPECT_THAT(cfg.Validate(), StatusIs(kInvalid, "vocab_size must be positive"));
  cfg = good;
  cfg.rms_norm_eps = 0;
  EXPECT_THAT(cfg.Validate(), StatusIs(kInvalid, "rms_norm_eps"));
  cfg = good;
  cfg.sliding_window = -3;
  EXPECT_THAT(cfg.Validate(), StatusIs(kInvalid, "sliding_window must be >= 0"));
  cfg = good;
  cfg.sliding_window_first_layer = 4;  // num_layers is 3
  EXPECT_THAT(cfg.Validate(), StatusIs(kInvalid, "sliding_window_first_layer"));
  cfg = good;
  cfg.eos_token_ids = {1, 9999};
  EXPECT_THAT(cfg.Validate(), StatusIs(kInvalid, "eos_token_id (9999)"));
}

TEST(LoadModelConfigTest, MissingConfigIsNotFoundNamingThePath) {
  const std::string dir = ::echokv::testing::MakeTempDir("echokv_config_test_");
  EXPECT_THAT(LoadModelConfig(dir),
              StatusIs(absl::StatusCode::kNotFound, dir + "/config.json"));
  EXPECT_THAT(LoadModelConfig(dir + "/does-not-exist"),
              StatusIs(absl::StatusCode::kNotFound, "does-not-exist/config.json"));
  std::filesystem::remove_all(dir);
}

TEST(LoadModelConfigTest, ReadsBothFiles) {
  const std::string dir = ::echokv::testing::MakeTempDir("echokv_config_test_");
  Json j = BaseConfig();
  j["eos_token_id"] = 2;
  ::echokv::testing::WriteFileOrDie(dir + "/config.json", j.dump(2));
  ASSERT_OK_AND_ASSIGN(ModelConfig cfg, LoadModelConfig(dir));
  EXPECT_THAT(cfg.eos_token_ids, ElementsAre(2));

  ::echokv::testing::WriteFileOrDie(dir + "/generation_config.json",
                                    R"({"eos_token_id": [2, 3]})");
  ASSERT_OK_AND_ASSIGN(cfg, LoadModelConfig(dir));
  EXPECT_THAT(cfg.eos_token_ids, ElementsAre(2, 3));

  ::echokv::testing::WriteFileOrDie(dir + "/generation_config.json", "not json");
  EXPECT_THAT(LoadModelConfig(dir), StatusIs(kInvalid, "generation_config.json: invalid JSON"));

  j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
  ::echokv::testing::WriteFileOrDie(dir + "/config.json", j.dump());
  EXPECT_THAT(LoadModelConfig(dir), StatusIs(kUnimplemented, "rope_scaling type 'dynamic'"));
  std::filesystem::remove_all(dir);
}

TEST(LoadModelConfigTest, Stories260K) {
  ECHOKV_REQUIRE_TEST_DATA(data);
  ASSERT_OK_AND_ASSIGN(ModelConfig cfg, LoadModelConfig(data + "/models/stories260K"));
  // Values from the model's README / config.json: 5 layers, 8 heads / 4 KV heads, d=8.
  EXPECT_EQ(cfg.type, ModelType::kLlama);
  EXPECT_EQ(cfg.hidden_size, 64);
  EXPECT_EQ(cfg.intermediate_size, 172);
  EXPECT_EQ(cfg.num_layers, 5);
  EXPECT_EQ(cfg.num_heads, 8);
  EXPECT_EQ(cfg.num_kv_heads, 4);
  EXPECT_EQ(cfg.head_dim, 8);
  EXPECT_EQ(cfg.vocab_size, 512);
  EXPECT_EQ(cfg.max_position_embeddings, 512);
  EXPECT_TRUE(cfg.tie_word_embeddings);
  EXPECT_FALSE(cfg.qkv_bias);
  EXPECT_EQ(cfg.bos_token_id, 1);
  EXPECT_THAT(cfg.eos_token_ids, ElementsAre(2));
  EXPECT_EQ(cfg.torch_dtype, "float32");
}

}  // namespace
}  // namespace echokv::model
