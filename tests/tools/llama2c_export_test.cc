// echokv-export-llama2c against Karpathy's own files: stories260K's HF checkpoint must
// come back as llama2.c's stories260K.bin (written by llama2.c's export.py from the
// trained PyTorch model, an independent oracle) and its tokenizer.model as tok512.bin.
#include "tools/llama2c_export.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_data.h"

namespace echokv::tools {
namespace {

using ::echokv::testing::IsOk;
using ::echokv::testing::ReadFileOrDie;

int32_t Int32At(const std::string& bytes, size_t offset) {
  int32_t v;
  std::memcpy(&v, bytes.data() + offset, 4);
  return v;
}

TEST(UnpermuteRotaryRows, InterleavesTheTwoHalvesOfEachHead) {
  // Two heads of head_dim 4, one column: HF keeps each head's rotary pairs as
  // (first half, second half) = rows (0,2),(1,3); llama2.c interleaves them.
  const std::vector<float> hf = {0, 1, 2, 3, 10, 11, 12, 13};
  std::vector<float> out(8, -1);
  UnpermuteRotaryRows(hf, /*n_heads=*/2, /*head_dim=*/4, /*cols=*/1, absl::MakeSpan(out));
  EXPECT_EQ(out, (std::vector<float>{0, 2, 1, 3, 10, 12, 11, 13}));
}

TEST(Llama2cExport, Stories260KCheckpointIsKarpathysBinBitForBit) {
  ECHOKV_REQUIRE_TEST_DATA(data);
  const std::string model = data + "/models/stories260K";
  const std::string out = ::echokv::testing::MakeTempDir("llama2c_export") + "/stories260K.bin";
  ASSERT_THAT(WriteLlama2cCheckpoint(model, out), IsOk());
  const std::string got = ReadFileOrDie(out);
  const std::string want = ReadFileOrDie(model + "/llama2c/stories260K.bin");
  std::filesystem::remove_all(std::filesystem::path(out).parent_path());
  ASSERT_EQ(got.size(), want.size());
  // Header: dim 64, hidden 172, 5 layers, 8 heads, 4 kv heads, +512 (shared classifier), 512.
  for (int i = 0; i < 7; ++i) EXPECT_EQ(Int32At(got, 4 * i), Int32At(want, 4 * i)) << "header field " << i;
  const int dim = Int32At(want, 0), hidden = Int32At(want, 4), layers = Int32At(want, 8), heads = Int32At(want, 12);
  const int kv_heads = Int32At(want, 16), vocab = Int32At(want, 20), seq_len = Int32At(want, 24);
  const int head_dim = dim / heads, kv_dim = kv_heads * head_dim;
  const size_t weights = static_cast<size_t>(vocab) * dim +
                         static_cast<size_t>(layers) * (2 * dim + 2 * dim * dim + 2 * dim * kv_dim + 3 * dim * hidden) +
                         dim;
  const size_t weights_end = 28 + weights * 4;
  const size_t rope_floats = static_cast<size_t>(seq_len) * head_dim;  // cos and sin tables
  ASSERT_EQ(want.size(), weights_end + rope_floats * 4) << "stories260K.bin is not the shared-classifier layout";
  // Every weight byte, the q/k row order included.
  size_t first_diff = 0;
  while (first_diff < weights_end && got[first_diff] == want[first_diff]) ++first_diff;
  EXPECT_EQ(first_diff, weights_end) << "first differing byte " << first_diff << " (weights end at " << weights_end
                                     << "; q/k of layer 0 start at " << 28 + 4 * (vocab * dim + layers * dim) << ")";
  // The RoPE tables (unread by run.c and llama.cpp): PyTorch's CPU cos/sin are not
  // correctly rounded, ours are; they may differ by one unit in the last place, no more.
  int off_by_one = 0;
  for (size_t i = 0; i < rope_floats; ++i) {
    int32_t a, b;
    std::memcpy(&a, got.data() + weights_end + 4 * i, 4);
    std::memcpy(&b, want.data() + weights_end + 4 * i, 4);
    ASSERT_LE(std::abs(a - b), 1) << "RoPE table entry " << i;
    off_by_one += a != b;
  }
  // Measured: 193 of 4096 entries are one ulp apart; far more would mean wrong angles.
  EXPECT_LT(off_by_one, static_cast<int>(rope_floats / 10));
}

TEST(Llama2cExport, Stories260KTokenizerIsTok512BinBitForBit) {
  ECHOKV_REQUIRE_TEST_DATA(data);
  const std::string model = data + "/models/stories260K";
  const std::string dir = ::echokv::testing::MakeTempDir("llama2c_tok");
  ASSERT_THAT(WriteLlama2cTokenizer(model + "/tokenizer.model", dir + "/tok512.bin"), IsOk());
  const std::string got = ReadFileOrDie(dir + "/tok512.bin");
  std::filesystem::remove_all(dir);
  EXPECT_TRUE(got == ReadFileOrDie(model + "/llama2c/tok512.bin"));
}

TEST(Llama2cExport, RefusesWhatTheFormatCannotHold) {
  const std::string dir = ::echokv::testing::MakeTempDir("llama2c_refuse");
  ::echokv::testing::WriteFileOrDie(dir + "/config.json", R"({"model_type": "llama", "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 4,
      "head_dim": 8, "vocab_size": 32, "max_position_embeddings": 64, "rms_norm_eps": 1e-5})");
  absl::Status s = WriteLlama2cCheckpoint(dir, dir + "/out.bin");
  std::filesystem::remove_all(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("head_dim"), std::string::npos) << s;
}

}  // namespace
}  // namespace echokv::tools
