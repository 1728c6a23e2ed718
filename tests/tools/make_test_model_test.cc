// echokv-make-test-model: every architecture's directory loads through the real
// loaders (config, safetensors, checkpoint validation, tokenizer), the output is
// byte-identical for the same options, and bad options are rejected by name.
#include "tools/make_test_model.h"

#include <ATen/ATen.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/tokenizer.h"
#include "model/transformer.h"
#include "model/weights.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_data.h"

namespace echokv::tools {
namespace {

using ::echokv::testing::IsOk;
using ::echokv::testing::ReadFileOrDie;
using ::echokv::testing::StatusIs;

// A scratch directory removed when the test ends.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& prefix)
      : path_(::echokv::testing::MakeTempDir(prefix)) {}
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;  // created by MakeTempDir
};

// Mean and standard deviation of an F32 tensor.
void Moments(const model::TensorView& t, double* mean, double* stddev) {
  const size_t n = t.nbytes / 4;
  double sum = 0, sq = 0;
  for (size_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, t.data + 4 * i, 4);
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  *mean = sum / n;
  *stddev = std::sqrt(std::max(0.0, sq / n - *mean * *mean));
}

class MakeTestModelArchTest : public ::testing::TestWithParam<const char*> {};

TEST_P(MakeTestModelArchTest, LoadsThroughTheRealLoaders) {
  const std::string arch = GetParam();
  TestModelOptions options;
  options.arch = arch;
  ScratchDir scratch("make_test_model_" + arch);
  options.out_dir = scratch.path();
  std::vector<std::string> written;
  ASSERT_THAT(MakeTestModel(options, &written), IsOk());
  EXPECT_THAT(written, ::testing::Contains(options.out_dir + "/model.safetensors"));
  EXPECT_THAT(written, ::testing::Contains(options.out_dir + "/tokenizer.model"));

  ASSERT_OK_AND_ASSIGN(model::ModelConfig cfg, model::LoadModelConfig(options.out_dir));
  EXPECT_EQ(model::ModelTypeName(cfg.type), arch);
  EXPECT_EQ(cfg.num_layers, options.layers);
  EXPECT_EQ(cfg.hidden_size, options.hidden);
  EXPECT_EQ(cfg.num_heads, options.heads);
  EXPECT_EQ(cfg.num_kv_heads, options.kv_heads);
  EXPECT_EQ(cfg.head_dim, options.hidden / options.heads);
  EXPECT_EQ(cfg.intermediate_size, options.intermediate);
  EXPECT_EQ(cfg.vocab_size, options.vocab);
  EXPECT_EQ(cfg.max_position_embeddings, options.max_pos);
  EXPECT_EQ(cfg.bos_token_id, 1);
  EXPECT_THAT(cfg.eos_token_ids, ::testing::ElementsAre(2));
  EXPECT_EQ(cfg.qkv_bias, arch == "qwen2");
  EXPECT_FALSE(cfg.o_bias);
  EXPECT_EQ(cfg.sliding_window, arch == "mistral" ? options.sliding_window : 0);

  ASSERT_OK_AND_ASSIGN(auto ckpt, model::Checkpoint::Open(options.out_dir));
  EXPECT_THAT(model::ValidateCheckpoint(*ckpt, cfg), IsOk());
  EXPECT_EQ(ckpt->Find("model.layers.0.self_attn.q_proj.bias") != nullptr, arch == "qwen2");
  // Norm weights around 1, matrices small and centred, every value finite.
  for (const std::string& name : ckpt->Names()) {
    const model::TensorView* t = ckpt->Find(name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->dtype, model::DType::kF32) << name;
    double mean = 0, stddev = 0;
    Moments(*t, &mean, &stddev);
    ASSERT_TRUE(std::isfinite(mean) && std::isfinite(stddev)) << name;
    if (name.find("norm") != std::string::npos) {
      EXPECT_NEAR(mean, 1.0, 0.05) << name;
      EXPECT_GT(stddev, 0.01) << name;
      EXPECT_LT(stddev, 0.2) << name;
    } else {
      EXPECT_NEAR(mean, 0.0, 0.02) << name;
      EXPECT_GT(stddev, 0.01) << name;
      EXPECT_LT(stddev, 0.15) << name;
    }
  }

  ASSERT_OK_AND_ASSIGN(auto tok, model::LoadTokenizer(options.out_dir));
  EXPECT_EQ(tok->kind(), "sentencepiece");
  EXPECT_EQ(tok->vocab_size(), options.vocab);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_THAT(tok->eos_ids(), ::testing::ElementsAre(2));
  const std::string text = "Once upon a time";
  ASSERT_OK_AND_ASSIGN(std::vector<int> ids, tok->Encode(text));
  ASSERT_GE(ids.size(), 2u);
  EXPECT_EQ(ids.front(), 1);  // tokenizer_config.json: add_bos_token
  // BPE merges were trained and applied: some piece spans several characters (the
  // default vocabulary of 320 leaves room for only ~20 merges beside 256 byte pieces).
  bool merged = false;
  for (size_t i = 1; i < ids.size(); ++i) {
    const std::string piece = tok->IdToPiece(ids[i]);
    merged |= piece.size() > 1 && piece.rfind("<0x", 0) != 0 && piece != "\xE2\x96\x81";
  }
  EXPECT_TRUE(merged);
  for (int id : ids) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, cfg.vocab_size);
  }
  ASSERT_OK_AND_ASSIGN(std::string decoded, tok->Decode(ids));
  EXPECT_EQ(decoded, text);
  // Text outside the corpus alphabet goes through byte fallback and still round-trips.
  const std::string other = "Zebra 42 caf\xC3\xA9";
  ASSERT_OK_AND_ASSIGN(std::vector<int> other_ids, tok->Encode(other));
  ASSERT_OK_AND_ASSIGN(std::string other_decoded, tok->Decode(other_ids));
  EXPECT_EQ(other_decoded, other);
}

INSTANTIATE_TEST_SUITE_P(Archs, MakeTestModelArchTest,
                         ::testing::Values("llama", "mistral", "qwen2"));

TEST(MakeTestModelTest, SameOptionsGiveIdenticalFiles) {
  TestModelOptions a;
  a.arch = "qwen2";
  a.seed = 7;
  ScratchDir dir_a("make_test_model_a"), dir_b("make_test_model_b"), dir_c("make_test_model_c");
  a.out_dir = dir_a.path();
  TestModelOptions b = a;
  b.out_dir = dir_b.path();
  ASSERT_THAT(MakeTestModel(a), IsOk());
  ASSERT_THAT(MakeTestModel(b), IsOk());
  for (const char* file : {"model.safetensors", "config.json", "generation_config.json",
                           "tokenizer_config.json"}) {
    EXPECT_EQ(ReadFileOrDie(a.out_dir + "/" + file), ReadFileOrDie(b.out_dir + "/" + file))
        << file;
  }
  // Writing again over an existing directory gives the same bytes too.
  const std::string before = ReadFileOrDie(a.out_dir + "/model.safetensors");
  ASSERT_THAT(MakeTestModel(a), IsOk());
  EXPECT_EQ(ReadFileOrDie(a.out_dir + "/model.safetensors"), before);
  // The tokenizer (its file embeds the temporary training paths) has the same pieces.
  ASSERT_OK_AND_ASSIGN(auto ta, model::LoadTokenizer(a.out_dir));
  ASSERT_OK_AND_ASSIGN(auto tb, model::LoadTokenizer(b.out_dir));
  ASSERT_EQ(ta->vocab_size(), tb->vocab_size());
  for (int id = 0; id < ta->vocab_size(); ++id) {
    ASSERT_EQ(ta->IdToPiece(id), tb->IdToPiece(id)) << id;
  }

  // Another seed changes the weights, not the config.
  TestModelOptions c = a;
  c.seed = 8;
  c.out_dir = dir_c.path();
  ASSERT_THAT(MakeTestModel(c), IsOk());
  EXPECT_NE(ReadFileOrDie(c.out_dir + "/model.safetensors"), before);
  EXPECT_EQ(ReadFileOrDie(c.out_dir + "/config.json"), ReadFileOrDie(a.out_dir + "/config.json"));
}

TEST(MakeTestModelTest, TiedEmbeddingsAndLargeVocab) {
  TestModelOptions o;
  o.arch = "llama";
  o.tie_word_embeddings = true;
  o.vocab = 1000;  // beyond what the corpus trains: padded with <extra_N> pieces
  ScratchDir scratch("make_test_model_tied");
  o.out_dir = scratch.path();
  ASSERT_THAT(MakeTestModel(o), IsOk());
  ASSERT_OK_AND_ASSIGN(model::ModelConfig cfg, model::LoadModelConfig(o.out_dir));
  EXPECT_TRUE(cfg.tie_word_embeddings);
  ASSERT_OK_AND_ASSIGN(auto ckpt, model::Checkpoint::Open(o.out_dir));
  EXPECT_EQ(ckpt->Find("lm_head.weight"), nullptr);
  EXPECT_THAT(model::ValidateCheckpoint(*ckpt, cfg), IsOk());
  ASSERT_OK_AND_ASSIGN(auto tok, model::LoadTokenizer(o.out_dir));
  EXPECT_EQ(tok->vocab_size(), 1000);
  ASSERT_OK_AND_ASSIGN(std::string text, tok->Decode(std::vector<int>{1, 999}));
  EXPECT_FALSE(text.empty());
  // With room for hundreds of merges, each word of the corpus is one piece.
  ASSERT_OK_AND_ASSIGN(std::vector<int> ids, tok->Encode("Once upon a time"));
  EXPECT_EQ(ids.size(), 5u);
  ASSERT_OK_AND_ASSIGN(std::string decoded, tok->Decode(ids));
  EXPECT_EQ(decoded, "Once upon a time");
}

// Llama 3.1/3.2-style checkpoints (rope_scaling llama3, tied embeddings) and linear
// scaling load through the real loaders, and the model uses the scaled frequencies.
TEST(MakeTestModelTest, RopeScalingLlama3AndLinear) {
  TestModelOptions o;
  o.arch = "llama";
  o.tie_word_embeddings = true;
  o.max_pos = 2048;
  o.rope_scaling = "llama3";
  o.rope_factor = 32;
  o.rope_low_freq_factor = 1;
  o.rope_high_freq_factor = 4;
  o.rope_original_max_pos = 256;
  ScratchDir scratch("make_test_model_llama3");
  o.out_dir = scratch.path();
  ASSERT_THAT(MakeTestModel(o), IsOk());
  const std::string text = ReadFileOrDie(o.out_dir + "/config.json");
  EXPECT_THAT(text, ::testing::HasSubstr("\"rope_type\": \"llama3\""));
  ASSERT_OK_AND_ASSIGN(model::ModelConfig cfg, model::LoadModelConfig(o.out_dir));
  EXPECT_EQ(cfg.rope_scaling.type, model::RopeScalingType::kLlama3);
  EXPECT_EQ(cfg.rope_scaling.factor, 32.0);
  EXPECT_EQ(cfg.rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(cfg.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(cfg.rope_scaling.original_max_position_embeddings, 256);
  EXPECT_TRUE(cfg.tie_word_embeddings);
  ASSERT_OK_AND_ASSIGN(auto m, model::Transformer::Load(o.out_dir, model::DeviceOptions()));
  at::Tensor inv = m->RopeInvFreq();
  EXPECT_TRUE(inv.equal(model::ComputeRopeInvFreq(cfg)));
  // d = 16, theta 1e4: the last frequency (wavelength ~19000 > 256) is divided by 32.
  model::ModelConfig plain = cfg;
  plain.rope_scaling = model::RopeScaling();
  at::Tensor base = model::ComputeRopeInvFreq(plain);
  EXPECT_EQ(inv[0].item<float>(), base[0].item<float>());
  EXPECT_EQ(inv[7].item<float>(), base[7].item<float>() / 32.0f);

  for (const char* arch : {"llama", "mistral", "qwen2"}) {
    TestModelOptions l;
    l.arch = arch;
    l.rope_scaling = "linear";
    l.rope_factor = 4;
    ScratchDir dir(std::string("make_test_model_linear_") + arch);
    l.out_dir = dir.path();
    ASSERT_THAT(MakeTestModel(l), IsOk());
    ASSERT_OK_AND_ASSIGN(model::ModelConfig lc, model::LoadModelConfig(l.out_dir));
    EXPECT_EQ(lc.rope_scaling.type, model::RopeScalingType::kLinear) << arch;
    EXPECT_EQ(lc.rope_scaling.factor, 4.0) << arch;
  }
  // Without the option: rope_scaling null (mistral: absent), as before.
  TestModelOptions n;
  ScratchDir dir_n("make_test_model_norope");
  n.out_dir = dir_n.path();
  ASSERT_THAT(MakeTestModel(n), IsOk());
  EXPECT_THAT(ReadFileOrDie(n.out_dir + "/config.json"), ::testing::HasSubstr("\"rope_scaling\": null"));
}

TEST(MakeTestModelTest, BadOptionsNameTheField) {
  TestModelOptions o;
  ScratchDir scratch("make_test_model_bad");
  o.out_dir = scratch.path();
  EXPECT_THAT(o.Validate(), IsOk());
  auto expect_bad = [&](TestModelOptions bad, const char* field) {
    EXPECT_THAT(MakeTestModel(bad), StatusIs(absl::StatusCode::kInvalidArgument, field));
  };
  TestModelOptions b = o;
  b.arch = "gpt2";
  expect_bad(b, "arch");
  b = o;
  b.out_dir = "";
  expect_bad(b, "out_dir");
  b = o;
  b.kv_heads = 3;
  expect_bad(b, "kv_heads");
  b = o;
  b.hidden = 66;
  expect_bad(b, "hidden");
  b = o;
  b.hidden = 60;  // head_dim 15: odd
  b.heads = 4;
  expect_bad(b, "head_dim");
  b = o;
  b.vocab = 100;
  expect_bad(b, "vocab");
  b = o;
  b.layers = 0;
  expect_bad(b, "layers");
  b = o;
  b.arch = "mistral";
  b.sliding_window = 0;
  expect_bad(b, "sliding_window");
  b = o;
  b.rms_norm_eps = -1;
  expect_bad(b, "rms_norm_eps");
  b = o;
  b.rope_scaling = "yarn";
  expect_bad(b, "rope_scaling must be empty, linear or llama3");
  b = o;
  b.rope_scaling = "linear";
  b.rope_factor = 0.5;
  expect_bad(b, "rope_factor");
  b = o;
  b.rope_scaling = "llama3";
  b.rope_original_max_pos = 0;
  expect_bad(b, "rope_original_max_pos");
  b.rope_original_max_pos = b.max_pos + 1;
  expect_bad(b, "rope_original_max_pos");
  b.rope_original_max_pos = 64;
  EXPECT_THAT(b.Validate(), IsOk());
  b.rope_low_freq_factor = 0;
  expect_bad(b, "rope_low_freq_factor");
  b.rope_low_freq_factor = 4;
  expect_bad(b, "rope_high_freq_factor");
  b.rope_low_freq_factor = 1;
  b.rope_high_freq_factor = std::nan("");
  expect_bad(b, "rope_high_freq_factor");
  b = o;
  b.hidden = 16384;
  b.intermediate = 65536;
  b.layers = 256;
  expect_bad(b, "parameters");
}

// Runs a shell command; returns its exit status and fills `output` with stdout+stderr.
int RunCommand(const std::string& command, std::string* output) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output->append(buffer, n);
  int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(MakeTestModelCliTest, WritesAndReports) {
  ScratchDir scratch("make_test_model_cli");
  const std::string& dir = scratch.path();
  std::string output;
  const int rc = RunCommand(std::string(ECHOKV_MAKE_TEST_MODEL_BIN) +
                                " --arch mistral --seed 3 --out " + dir + "/m",
                            &output);
  EXPECT_EQ(rc, 0) << output;
  EXPECT_THAT(output, ::testing::HasSubstr(dir + "/m/model.safetensors"));
  EXPECT_THAT(output, ::testing::HasSubstr("meaningless"));
  // The binary and the library function agree byte for byte.
  TestModelOptions o;
  o.arch = "mistral";
  o.seed = 3;
  o.out_dir = dir + "/lib";
  ASSERT_THAT(MakeTestModel(o), IsOk());
  EXPECT_EQ(ReadFileOrDie(dir + "/m/model.safetensors"),
            ReadFileOrDie(dir + "/lib/model.safetensors"));

  std::string bad_output;
  EXPECT_NE(RunCommand(std::string(ECHOKV_MAKE_TEST_MODEL_BIN) + " --arch gpt2 --out " + dir +
                           "/x",
                       &bad_output),
            0);
  EXPECT_THAT(bad_output, ::testing::HasSubstr("arch"));
  std::string no_out;
  EXPECT_NE(RunCommand(std::string(ECHOKV_MAKE_TEST_MODEL_BIN) + " --arch llama", &no_out), 0);
  EXPECT_THAT(no_out, ::testing::HasSubstr("--out"));

  // rope_scaling flags reach config.json.
  std::string rope_output;
  EXPECT_EQ(RunCommand(std::string(ECHOKV_MAKE_TEST_MODEL_BIN) + " --out " + dir +
                           "/r --rope_scaling llama3 --rope_factor 16 --rope_low_freq_factor 2"
                           " --rope_high_freq_factor 6 --rope_original_max_pos 512",
                       &rope_output),
            0)
      << rope_output;
  ASSERT_OK_AND_ASSIGN(model::ModelConfig cfg, model::LoadModelConfig(dir + "/r"));
  EXPECT_EQ(cfg.rope_scaling.type, model::RopeScalingType::kLlama3);
  EXPECT_EQ(cfg.rope_scaling.factor, 16.0);
  EXPECT_EQ(cfg.rope_scaling.low_freq_factor, 2.0);
  EXPECT_EQ(cfg.rope_scaling.high_freq_factor, 6.0);
  EXPECT_EQ(cfg.rope_scaling.original_max_position_embeddings, 512);
  std::string bad_rope;
  EXPECT_NE(RunCommand(std::string(ECHOKV_MAKE_TEST_MODEL_BIN) + " --out " + dir +
                           "/r2 --rope_scaling llama3",
                       &bad_rope),
            0);
  EXPECT_THAT(bad_rope, ::testing::HasSubstr("rope_original_max_pos"));
}

}  // namespace
}  // namespace echokv::tools
