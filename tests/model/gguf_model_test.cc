// The GGUF model path (model/gguf_model.h) on tiny random models: a checkpoint from
// echokv-make-test-model and its GGUF twin written in llama.cpp's layout
// (tools/gguf_export.h: q/k rows permuted by the converter's LlamaModel.permute,
// llama.cpp's tensor names and metadata keys) must load to the same config and give
// the same logits -- bit for bit in F32, since the reader's un-permutation must restore
// every row exactly. The real model against transformers is gguf_golden_test.cc.
#include <ATen/ATen.h>

#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/gguf_model.h"
#include "model/tokenizer.h"
#include "model/transformer.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_data.h"
#include "tools/gguf_export.h"
#include "tools/make_test_model.h"

namespace echokv::model {
namespace {

using ::echokv::testing::StatusIs;

struct Twin {
  std::string dir, gguf;
};

Twin MakeTwin(tools::TestModelOptions o, const std::string& type = "f32") {
  const std::string root = echokv::testing::MakeTempDir("echokv-gguf-twin");
  o.out_dir = root + "/hf";
  EXPECT_OK(tools::MakeTestModel(o));
  tools::GgufExportOptions e;
  e.type = type;
  EXPECT_OK(tools::ExportGguf(o.out_dir, root + "/model.gguf", e));
  return {o.out_dir, root + "/model.gguf"};
}

std::vector<int> Prompt(int vocab) {
  std::vector<int> ids;
  for (int i = 0; i < 40; ++i) ids.push_back((i * 37 + 11) % vocab);
  return ids;
}

// Prefill logits and the logits of 8 greedy decode steps.
std::vector<at::Tensor> RunModel(const std::string& path) {
  DeviceOptions dev;
  dev.num_threads = 1;
  absl::StatusOr<std::unique_ptr<Transformer>> m = Transformer::Load(path, dev);
  EXPECT_OK(m.status());
  if (!m.ok()) return {};
  KvCache cache = (*m)->NewCache();
  std::vector<at::Tensor> out;
  absl::StatusOr<ForwardResult> f = (*m)->Forward(Prompt((*m)->config().vocab_size), &cache);
  EXPECT_OK(f.status());
  if (!f.ok()) return {};
  out.push_back(f->logits);
  for (int s = 0; s < 8; ++s) {
    const int next = static_cast<int>(out.back().argmax().item<int64_t>());
    absl::StatusOr<DecodeResult> d = (*m)->Decode(next, &cache);
    EXPECT_OK(d.status());
    if (!d.ok()) return out;
    out.push_back(d->logits);
  }
  return out;
}

void ExpectSameConfig(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.type, b.type);
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_heads, b.num_heads);
  EXPECT_EQ(a.num_kv_heads, b.num_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_FLOAT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_FLOAT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.qkv_bias, b.qkv_bias);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
  ASSERT_FALSE(b.eos_token_ids.empty());
  EXPECT_EQ(a.eos_token_ids.front(), b.eos_token_ids.front());
}

class GgufTwinTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GgufTwinTest, SameConfigAndTheSameLogitsBitForBit) {
  tools::TestModelOptions o;
  o.arch = GetParam();
  o.seed = 7;
  const Twin t = MakeTwin(o);
  ASSERT_OK_AND_ASSIGN(ModelConfig hf, LoadModelConfig(t.dir));
  ASSERT_OK_AND_ASSIGN(auto gguf, GgufModel::Open(t.gguf));
  ExpectSameConfig(gguf->config(), hf);
  const std::vector<at::Tensor> a = RunModel(t.dir), b = RunModel(t.gguf);
  ASSERT_EQ(a.size(), 9u);
  ASSERT_EQ(b.size(), 9u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i], b[i])) << "step " << i;
}

INSTANTIATE_TEST_SUITE_P(Archs, GgufTwinTest, ::testing::Values("llama", "mistral", "qwen2"));

TEST(GgufModelTest, TiedEmbeddingsHaveNoOutputTensor) {
  tools::TestModelOptions o;
  o.tie_word_embeddings = true;
  const Twin t = MakeTwin(o);
  ASSERT_OK_AND_ASSIGN(auto file, GgufFile::Open(t.gguf));
  EXPECT_EQ(file->FindTensor("output.weight"), nullptr);
  ASSERT_OK_AND_ASSIGN(auto gguf, GgufModel::Open(t.gguf));
  EXPECT_TRUE(gguf->config().tie_word_embeddings);
  const std::vector<at::Tensor> a = RunModel(t.dir), b = RunModel(t.gguf);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i], b[i])) << "step " << i;
}

// Undoing the permutation is what makes the twins agree: read without it (the rows as
// the file stores them), q differs from the checkpoint's; read through GgufModel, equal.
TEST(GgufModelTest, QueryRowsAreUnpermuted) {
  tools::TestModelOptions o;
  const Twin t = MakeTwin(o);
  ASSERT_OK_AND_ASSIGN(auto ckpt, Checkpoint::Open(t.dir));
  ASSERT_OK_AND_ASSIGN(auto gguf, GgufModel::Open(t.gguf));
  const std::string name = "model.layers.1.self_attn.q_proj.weight";
  const TensorView* hf = ckpt->Find(name);
  ASSERT_NE(hf, nullptr);
  std::vector<float> got(hf->nbytes / 4);
  ASSERT_OK(gguf->ReadFloat32(name, got.data()));
  EXPECT_EQ(std::memcmp(got.data(), hf->data, hf->nbytes), 0);
  EXPECT_EQ(gguf->View(name), nullptr);  // permuted rows have no in-place view
  const GgufTensor* raw = gguf->Tensor(name);
  ASSERT_NE(raw, nullptr);
  EXPECT_NE(std::memcmp(gguf->file().TensorBytes(*raw).data(), hf->data, hf->nbytes), 0);
  EXPECT_NE(gguf->View("model.layers.1.self_attn.v_proj.weight"), nullptr);  // F32, not permuted
}

// Llama 3.1's rope scaling travels as rope_freqs.weight (factors computed like
// llama.cpp's converter); the frequencies match Hugging Face's llama3 formula closely.
TEST(GgufModelTest, Llama3RopeScalingAsRopeFreqs) {
  tools::TestModelOptions o;
  o.rope_scaling = "llama3";
  o.rope_factor = 8;
  o.rope_original_max_pos = 64;
  o.max_pos = 1024;
  const Twin t = MakeTwin(o);
  ASSERT_OK_AND_ASSIGN(ModelConfig hf, LoadModelConfig(t.dir));
  ASSERT_OK_AND_ASSIGN(auto gguf, GgufModel::Open(t.gguf));
  EXPECT_EQ(gguf->config().rope_scaling.type, RopeScalingType::kNone);
  ASSERT_EQ(gguf->config().rope_freq_factors.size(), static_cast<size_t>(hf.head_dim / 2));
  const at::Tensor a = ComputeRopeInvFreq(hf), b = ComputeRopeInvFreq(gguf->config());
  EXPECT_TRUE(at::allclose(a, b, /*rtol=*/1e-6, /*atol=*/0)) << a << b;
  ModelConfig plain = hf;
  plain.rope_scaling = RopeScaling{};
  EXPECT_FALSE(at::allclose(a, ComputeRopeInvFreq(plain), 1e-6, 0));  // the scaling is there at all
}

// Q8_0 storage: decoded at load, the logits stay close to the F32 twin's.
TEST(GgufModelTest, Q8_0WeightsStayCloseToF32) {
  tools::TestModelOptions o;
  o.seed = 3;
  const Twin f32 = MakeTwin(o, "f32"), q8 = MakeTwin(o, "q8_0");
  const std::vector<at::Tensor> a = RunModel(f32.gguf), b = RunModel(q8.gguf);
  ASSERT_EQ(a.size(), b.size());
  const double scale = a[0].abs().max().item<double>();
  EXPECT_LT((a[0] - b[0]).abs().max().item<double>() / scale, 0.05);
  EXPECT_FALSE(at::equal(a[0], b[0]));
}

TEST(GgufModelTest, ErrorsNameTheKeyOrTensor) {
  tools::TestModelOptions o;
  const Twin t = MakeTwin(o);
  std::string bytes = echokv::testing::ReadFileOrDie(t.gguf);
  // Rename the architecture (the value's bytes are "llama" -> "gpt-j").
  const size_t at_arch = bytes.find("llama");
  ASSERT_NE(at_arch, std::string::npos);
  std::string wrong = bytes;
  wrong.replace(at_arch, 5, "gpt-j");
  ASSERT_OK_AND_ASSIGN(auto f, GgufFile::Parse(wrong));
  EXPECT_THAT(GgufModelConfig(*f), StatusIs(absl::StatusCode::kUnimplemented,
                                            "metadata 'general.architecture' is 'gpt-j'"));
  // A tensor name llama.cpp never writes for these models.
  std::string renamed = bytes;
  const size_t at_gate = renamed.find("blk.0.ffn_gate.weight");
  ASSERT_NE(at_gate, std::string::npos);
  renamed.replace(at_gate, 8, "blk.0.xx");
  std::shared_ptr<const GgufFile> rf(GgufFile::Parse(renamed)->release());
  EXPECT_THAT(GgufModel::FromFile(rf), StatusIs(absl::StatusCode::kInvalidArgument, "blk.0.xxn_gate.weight"));
  EXPECT_EQ(GgufToHfName("blk.3.ffn_up.weight"), "model.layers.3.mlp.up_proj.weight");
  EXPECT_EQ(GgufToHfName("blk.03.ffn_up.weight"), "");
  EXPECT_EQ(GgufToHfName("output.weight"), "lm_head.weight");
}

// A SentencePiece tokenizer travels as tokenizer.ggml.model "llama" (tokens, scores,
// types, add_space_prefix) and comes back as a ModelProto that libsentencepiece loads:
// on stories260K's real tokenizer.model and on the test model's, the GGUF's tokenizer
// encodes and decodes a mixed corpus exactly as the original file does. One setting a
// GGUF cannot carry: stories260K's model collapses runs of spaces
// (remove_extra_whitespaces, SentencePiece's default), which llama.cpp's SPM tokenizer
// never does (Llama's own tokenizer.model has it off); the GGUF keeps every space then.
TEST(GgufModelTest, SentencePieceTokenizerRoundTrip) {
  tools::TestModelOptions o;
  const Twin tiny = MakeTwin(o);
  const std::string root = echokv::testing::MakeTempDir("echokv-gguf-spm");
  ASSERT_OK(tools::ExportGguf(ECHOKV_STORIES_DIR, root + "/stories.gguf", {}));
  const std::vector<std::string> corpus = {
      "", "Once upon a time, there was a little girl named Lily.", "a tab\tand\n\nnew lines",
      "numbers 12345 and 3.14", "unicode: héllo wörld 你好 🙂", "<s> not special </s>", "x"};
  const std::string spaces = "  two  spaces and a trailing one ";
  for (const auto& [dir, gguf] : {std::pair<std::string, std::string>{ECHOKV_STORIES_DIR, root + "/stories.gguf"},
                                  {tiny.dir, tiny.gguf}}) {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> want, LoadTokenizer(dir));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> got, LoadTokenizer(gguf));
    EXPECT_EQ(got->kind(), "sentencepiece");
    EXPECT_EQ(got->vocab_size(), want->vocab_size());
    EXPECT_EQ(got->bos_id(), want->bos_id());
    EXPECT_EQ(got->eos_ids(), want->eos_ids());
    for (int id = 0; id < want->vocab_size(); ++id) {
      ASSERT_EQ(got->IdToPiece(id), want->IdToPiece(id)) << id;
      ASSERT_EQ(got->IsSpecial(id), want->IsSpecial(id)) << id;
    }
    for (const std::string& text : corpus) {
      for (bool special : {true, false}) {
        EncodeOptions e;
        e.add_special_tokens = special;
        ASSERT_OK_AND_ASSIGN(std::vector<int> a, want->Encode(text, e));
        ASSERT_OK_AND_ASSIGN(std::vector<int> b, got->Encode(text, e));
        EXPECT_EQ(a, b) << dir << ": '" << text << "'";
        ASSERT_OK_AND_ASSIGN(std::string da, want->Decode(a));
        ASSERT_OK_AND_ASSIGN(std::string db, got->Decode(a));
        EXPECT_EQ(da, db) << text;
      }
    }
    ASSERT_OK_AND_ASSIGN(std::vector<int> kept, got->Encode(spaces, EncodeOptions{false, true}));
    ASSERT_OK_AND_ASSIGN(std::string back, got->Decode(kept));
    EXPECT_EQ(back, spaces) << dir << ": the GGUF's tokenizer keeps every space";
  }
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> original, LoadTokenizer(ECHOKV_STORIES_DIR));
  ASSERT_OK_AND_ASSIGN(std::vector<int> collapsed, original->Encode(spaces, EncodeOptions{false, true}));
  ASSERT_OK_AND_ASSIGN(std::string squeezed, original->Decode(collapsed));
  EXPECT_EQ(squeezed, "two spaces and a trailing one");  // stories260K's own model collapses them
}

}  // namespace
}  // namespace echokv::model
