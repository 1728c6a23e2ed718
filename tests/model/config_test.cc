// Tests of config.json / generation_config.json parsing (model/config.h): every rule
// gets a malformed input whose error must carry the right code and name the field.
#include "model/config.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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

// transformers 5 writes rope_theta and the scaling into one "rope_parameters" object
// (SmolLM2's export, tests/model/testdata/smollm2/hf_export/config.json, has
// {"rope_theta": 100000.0, "rope_type": "default"}).
TEST(ModelConfigTest, Transformers5RopeParameters) {
  Json j = BaseConfig();
  j["rope_parameters"] = {{"rope_theta", 100000.0}, {"rope_type", "default"}};
  ASSERT_OK_AND_ASSIGN(ModelConfig cfg, Parse(j));
  EXPECT_DOUBLE_EQ(cfg.rope_theta, 100000.0);
  EXPECT_EQ(cfg.rope_scaling.type, RopeScalingType::kNone);
  j["rope_parameters"] = {{"rope_theta", 500000.0}, {"rope_type", "llama3"}, {"factor", 8.0},
                          {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                          {"original_max_position_embeddings", 8192}};
  ASSERT_OK_AND_ASSIGN(cfg, Parse(j));
  EXPECT_DOUBLE_EQ(cfg.rope_theta, 500000.0);
  EXPECT_EQ(cfg.rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_EQ(cfg.rope_scaling.original_max_position_embeddings, 8192);
  j["rope_parameters"].erase("factor");
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, "field 'rope_parameters.factor' is missing"));
  j["rope_parameters"] = {{"rope_theta", 100000.0}, {"rope_type", "yarn"}};
  EXPECT_THAT(Parse(j), StatusIs(kUnimplemented, "field 'rope_parameters.rope_type'"));
  j["rope_parameters"] = {{"rope_theta", 100000.0}, {"rope_type", "default"}};
  j["rope_theta"] = 10000.0;
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, "disagrees with rope_parameters.rope_theta"));
  j.erase("rope_theta");
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, "'rope_parameters' and 'rope_scaling' are both set"));
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_theta", -1.0}, {"rope_type", "default"}};
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, "rope_parameters.rope_theta' must be a positive finite number"));
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

TEST(ModelConfigTest, UnsupportedRopeScalingIsRefusedByType) {
  Json j = BaseConfig();
  for (const char* type : {"yarn", "longrope", "ntk", "su"}) {
    j["rope_scaling"] = {{"rope_type", type}, {"factor", 4.0}};
    EXPECT_THAT(Parse(j), StatusIs(kUnimplemented, absl::StrCat("rope_scaling type '", type,
                                                                "' (field 'rope_scaling.rope_type') is not supported")));
  }
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
  EXPECT_THAT(Parse(j), StatusIs(kUnimplemented, "(field 'rope_scaling.type') is not supported"));
  // dynamic NTK: refused, and the message says why.
  j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
  EXPECT_THAT(Parse(j), StatusIs(kUnimplemented, "rope_scaling type 'dynamic'"));
  EXPECT_THAT(Parse(j), StatusIs(kUnimplemented, "current sequence length"));
  EXPECT_THAT(Parse(j), StatusIs(kUnimplemented, "post-RoPE"));
  j["rope_scaling"] = {{"factor", 2.0}};
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, "'rope_scaling' has no 'rope_type' or 'type'"));
  j["rope_scaling"] = "yarn";
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, "'rope_scaling' must be an object or null"));
  j["rope_scaling"] = {{"rope_type", 3}};
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, "'rope_scaling.rope_type' must be a string"));
  j["rope_scaling"] = {{"type", false}};
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, "'rope_scaling.type' must be a string"));
  // transformers' two readers disagree on which key wins: refused, not guessed.
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"type", "linear"}, {"factor", 8.0}};
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, "has rope_type 'llama3' and type 'linear', which disagree"));
}

TEST(ModelConfigTest, DefaultRopeScalingIsPlainRope) {
  Json j = BaseConfig();
  j["rope_scaling"] = {{"rope_type", "default"}};
  ASSERT_OK_AND_ASSIGN(ModelConfig cfg, Parse(j));
  EXPECT_EQ(cfg.rope_scaling.type, RopeScalingType::kNone);
  j["rope_scaling"] = nullptr;
  ASSERT_OK_AND_ASSIGN(cfg, Parse(j));
  EXPECT_EQ(cfg.rope_scaling.type, RopeScalingType::kNone);
  EXPECT_EQ(RopeScalingTypeName(cfg.rope_scaling.type), "none");
}

Json Llama3Scaling() {
  return Json{{"rope_type", "llama3"},
              {"factor", 8.0},
              {"low_freq_factor", 1.0},
              {"high_freq_factor", 4.0},
              {"original_max_position_embeddings", 8192}};
}

TEST(ModelConfigTest, Llama3RopeScalingIsParsedUnderEitherKey) {
  Json j = BaseConfig();
  j["rope_scaling"] = Llama3Scaling();
  ASSERT_OK_AND_ASSIGN(ModelConfig cfg, Parse(j));
  EXPECT_EQ(cfg.rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_EQ(RopeScalingTypeName(cfg.rope_scaling.type), "llama3");
  EXPECT_DOUBLE_EQ(cfg.rope_scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(cfg.rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(cfg.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(cfg.rope_scaling.original_max_position_embeddings, 8192);

  // The older "type" key, integer-valued factors, and both keys when they agree.
  j["rope_scaling"] = {{"type", "llama3"}, {"factor", 32}, {"low_freq_factor", 2},
                       {"high_freq_factor", 8.5}, {"original_max_position_embeddings", 4096}};
  ASSERT_OK_AND_ASSIGN(cfg, Parse(j));
  EXPECT_EQ(cfg.rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_DOUBLE_EQ(cfg.rope_scaling.factor, 32.0);
  EXPECT_DOUBLE_EQ(cfg.rope_scaling.low_freq_factor, 2.0);
  EXPECT_DOUBLE_EQ(cfg.rope_scaling.high_freq_factor, 8.5);
  EXPECT_EQ(cfg.rope_scaling.original_max_position_embeddings, 4096);
  j["rope_scaling"] = Llama3Scaling();
  j["rope_scaling"]["type"] = "llama3";
  ASSERT_OK_AND_ASSIGN(cfg, Parse(j));
  EXPECT_EQ(cfg.rope_scaling.type, RopeScalingType::kLlama3);
  // Keys of other types are ignored (transformers only warns about them).
  j["rope_scaling"]["attention_factor"] = 1.0;
  EXPECT_OK(Parse(j).status());
}

TEST(ModelConfigTest, LinearRopeScalingIsParsed) {
  Json j = BaseConfig();
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.5}};
  ASSERT_OK_AND_ASSIGN(ModelConfig cfg, Parse(j));
  EXPECT_EQ(cfg.rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_EQ(RopeScalingTypeName(cfg.rope_scaling.type), "linear");
  EXPECT_DOUBLE_EQ(cfg.rope_scaling.factor, 2.5);
  j["rope_scaling"] = {{"rope_type", "linear"}};
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, "'rope_scaling.factor' is missing (required for rope_type 'linear')"));
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", -2.0}};
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, "'rope_scaling.factor' must be a finite number >= 1, got -2"));
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", "2"}};
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, "'rope_scaling.factor' must be a number, got a string"));
}

TEST(ModelConfigTest, MalformedLlama3RopeScalingNamesTheField) {
  struct Case {
    const char* key;
    Json value;  // null erases the key
    const char* error;
  };
  const std::vector<Case> cases = {
      {"factor", nullptr, "'rope_scaling.factor' is missing (required for rope_type 'llama3')"},
      {"low_freq_factor", nullptr, "'rope_scaling.low_freq_factor' is missing"},
      {"high_freq_factor", nullptr, "'rope_scaling.high_freq_factor' is missing"},
      {"original_max_position_embeddings", nullptr,
       "'rope_scaling.original_max_position_embeddings' is missing"},
      {"factor", -8.0, "'rope_scaling.factor' must be a finite number >= 1, got -8"},
      {"factor", 0.0, "'rope_scaling.factor' must be a finite number >= 1, got 0"},
      {"factor", 0.5, "'rope_scaling.factor' must be a finite number >= 1, got 0.5"},
      {"factor", "8.0", "'rope_scaling.factor' must be a number, got a string"},
      {"factor", true, "'rope_scaling.factor' must be a number, got a boolean"},
      {"factor", Json::array({8.0}), "'rope_scaling.factor' must be a number, got an array"},
      {"low_freq_factor", 0.0, "'rope_scaling.low_freq_factor' must be positive and finite, got 0"},
      {"low_freq_factor", -1.0, "'rope_scaling.low_freq_factor' must be positive and finite, got -1"},
      {"low_freq_factor", 4.0,
       "'rope_scaling.high_freq_factor' must be finite and greater than low_freq_factor (4), got 4"},
      {"low_freq_factor", 5.0,
       "'rope_scaling.high_freq_factor' must be finite and greater than low_freq_factor (5), got 4"},
      {"high_freq_factor", 0.5,
       "'rope_scaling.high_freq_factor' must be finite and greater than low_freq_factor (1), got 0.5"},
      {"high_freq_factor", "4", "'rope_scaling.high_freq_factor' must be a number, got a string"},
      {"original_max_position_embeddings", 0,
       "'rope_scaling.original_max_position_embeddings' must be positive, got 0"},
      {"original_max_position_embeddings", -8192,
       "'rope_scaling.original_max_position_embeddings' must be positive, got -8192"},
      {"original_max_position_embeddings", 8192.5,
       "'rope_scaling.original_max_position_embeddings' must be an integer, got a floating-point number"},
      {"original_max_position_embeddings", "8192",
       "'rope_scaling.original_max_position_embeddings' must be an integer, got a string"},
      {"original_max_position_embeddings", 1e12,
       "'rope_scaling.original_max_position_embeddings' must be an integer"},
  };
  for (const Case& c : cases) {
    Json j = BaseConfig();
    j["rope_scaling"] = Llama3Scaling();
    if (c.value.is_null()) {
      j["rope_scaling"].erase(c.key);
    } else {
      j["rope_scaling"][c.key] = c.value;
    }
    EXPECT_THAT(Parse(j), StatusIs(kInvalid, c.error)) << c.key << " = " << c.value.dump();
  }
  // A present-but-null field is missing too.
  Json j = BaseConfig();
  j["rope_scaling"] = Llama3Scaling();
  j["rope_scaling"]["factor"] = nullptr;
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, "'rope_scaling.factor' is missing"));
}

// config.json + generation_config.json of meta-llama/Llama-3.1-8B-Instruct as published.
constexpr char kLlama31Config[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.42.3",
  "use_cache": true,
  "vocab_size": 128256
})";
constexpr char kLlama31Generation[] = R"({
  "bos_token_id": 128000,
  "do_sample": true,
  "eos_token_id": [128001, 128008, 128009],
  "temperature": 0.6,
  "top_p": 0.9,
  "transformers_version": "4.42.3"
})";

// meta-llama/Llama-3.2-1B-Instruct: tied embeddings, an explicit head_dim, factor 32.
constexpr char kLlama32Config[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";
constexpr char kLlama32Generation[] = R"({
  "bos_token_id": 128000,
  "do_sample": true,
  "eos_token_id": [128001, 128008, 128009],
  "temperature": 0.6,
  "top_p": 0.9,
  "transformers_version": "4.45.0.dev0"
})";

TEST(ModelConfigTest, Llama31Config) {
  ASSERT_OK_AND_ASSIGN(ModelConfig cfg, ParseModelConfig(kLlama31Config, kLlama31Generation));
  EXPECT_EQ(cfg.type, ModelType::kLlama);
  EXPECT_EQ(cfg.hidden_size, 4096);
  EXPECT_EQ(cfg.intermediate_size, 14336);
  EXPECT_EQ(cfg.num_layers, 32);
  EXPECT_EQ(cfg.num_heads, 32);
  EXPECT_EQ(cfg.num_kv_heads, 8);
  EXPECT_EQ(cfg.head_dim, 128);  // hidden_size / num_attention_heads
  EXPECT_EQ(cfg.vocab_size, 128256);
  EXPECT_EQ(cfg.max_position_embeddings, 131072);
  EXPECT_DOUBLE_EQ(cfg.rope_theta, 500000.0);
  EXPECT_EQ(cfg.rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_DOUBLE_EQ(cfg.rope_scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(cfg.rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(cfg.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(cfg.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_FALSE(cfg.tie_word_embeddings);
  EXPECT_FALSE(cfg.qkv_bias);
  EXPECT_FALSE(cfg.o_bias);
  EXPECT_EQ(cfg.sliding_window, 0);
  EXPECT_EQ(cfg.bos_token_id, 128000);
  EXPECT_THAT(cfg.eos_token_ids, ElementsAre(128001, 128008, 128009));
  EXPECT_EQ(cfg.torch_dtype, "bfloat16");
}

TEST(ModelConfigTest, Llama32Config) {
  ASSERT_OK_AND_ASSIGN(ModelConfig cfg, ParseModelConfig(kLlama32Config, kLlama32Generation));
  EXPECT_EQ(cfg.hidden_size, 2048);
  EXPECT_EQ(cfg.num_layers, 16);
  EXPECT_EQ(cfg.num_heads, 32);
  EXPECT_EQ(cfg.num_kv_heads, 8);
  EXPECT_EQ(cfg.head_dim, 64);
  EXPECT_TRUE(cfg.tie_word_embeddings);
  EXPECT_EQ(cfg.rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_DOUBLE_EQ(cfg.rope_scaling.factor, 32.0);
  EXPECT_EQ(cfg.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(cfg.bos_token_id, 128000);
  EXPECT_THAT(cfg.eos_token_ids, ElementsAre(128001, 128008, 128009));
  // Without generation_config.json the ids of config.json alone.
  ASSERT_OK_AND_ASSIGN(cfg, ParseModelConfig(kLlama32Config, ""));
  EXPECT_THAT(cfg.eos_token_ids, ElementsAre(128001, 128008, 128009));
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

  // rope_scaling: only the fields of its type are checked.
  cfg = good;
  cfg.rope_scaling.factor = -1;  // type kNone: unused
  EXPECT_OK(cfg.Validate());
  cfg.rope_scaling.type = RopeScalingType::kLinear;
  EXPECT_THAT(cfg.Validate(), StatusIs(kInvalid, "model config: field 'rope_scaling.factor'"));
  cfg.rope_scaling.factor = 4;
  cfg.rope_scaling.original_max_position_embeddings = 0;  // unused by linear
  EXPECT_OK(cfg.Validate());
  cfg.rope_scaling.type = RopeScalingType::kLlama3;
  EXPECT_THAT(cfg.Validate(), StatusIs(kInvalid, "rope_scaling.original_max_position_embeddings"));
  cfg.rope_scaling.original_max_position_embeddings = 64;
  EXPECT_OK(cfg.Validate());
  cfg.rope_scaling.high_freq_factor = std::numeric_limits<double>::infinity();
  EXPECT_THAT(cfg.Validate(), StatusIs(kInvalid, "rope_scaling.high_freq_factor"));
  cfg.rope_scaling.high_freq_factor = 4;
  cfg.rope_scaling.low_freq_factor = std::nan("");
  EXPECT_THAT(cfg.Validate(), StatusIs(kInvalid, "rope_scaling.low_freq_factor"));
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
  EXPECT_THAT(LoadModelConfig(dir), StatusIs(kUnimplemented, dir + ": config.json"));
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
