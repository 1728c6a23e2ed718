// The real model, SmolLM2-135M-Instruct (Q4_1 GGUF, Q8_0 embedding / LM head), with
// DeviceOptions::weights = "native" (decode on the stored blocks, inputs quantized to
// int8 per 32 values: kernels/block_matmul.h) against the exact float32 path:
//   - prefill logits (products on the blocks decoded to float32, the LM head on the
//     blocks) and 32 decode steps teacher-forced on float32's greedy tokens, over three
//     prompts: top-1 agreement >= 90 % of all positions, mean KL(float32 || native)
//     <= 0.01 nats, every position's KL <= 0.1 (the figures are printed);
//   - 32 free-running greedy tokens of each path: the common prefix is printed (a
//     record: greedy paths part at the first near-tie);
//   - a stream's native logits are the same bits decoded alone or in a batch of three
//     (DecodeBatch), as on the float32 path;
//   - the native matrices hold fewer bytes than float32 (5.5x fewer for this file);
//   - the stored rows as the kernels decode them = ReadFloat32's values, bit for bit.
// The model file comes from the models folder (scripts/setup.sh fetches it): the test
// skips without it, which CI counts as a failure. ECHOKV_NATIVE_GGUF=FILE runs the first
// test on another GGUF (a hand check; docs/ARCHITECTURE.md has the figures).
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "common/default_model.h"
#include "gtest/gtest.h"
#include "kernels/block_matmul.h"
#include "model/gguf_model.h"
#include "model/sampler.h"
#include "model/tokenizer.h"
#include "model/transformer.h"
#include "tests/testing/status_matchers.h"

namespace echokv::model {
namespace {

// KL(p || q) of the softmaxes of two logit vectors, in nats (float64).
double Kl(const at::Tensor& p_logits, const at::Tensor& q_logits) {
  const at::Tensor lp = at::log_softmax(p_logits.to(at::kDouble), 0), lq = at::log_softmax(q_logits.to(at::kDouble), 0);
  return (lp.exp() * (lp - lq)).sum().item<double>();
}

int Top1(const at::Tensor& logits) {
  return Argmax(absl::MakeConstSpan(logits.data_ptr<float>(), logits.numel()));
}

// ECHOKV_NATIVE_GGUF names another GGUF for this test (a hand check on other stored
// types, e.g. llama-quantize's F16 / Q8_0 / Q4_K_M of the same model; the byte ratio
// is then printed, not checked).
std::optional<std::string> NativeTestGguf() {
  if (const char* env = std::getenv("ECHOKV_NATIVE_GGUF"); env != nullptr && *env != '\0') return std::string(env);
  return FindDefaultGguf();
}

TEST(NativeWeightsTest, SmolLM2NativeStaysCloseToFloat32) {
  const std::optional<std::string> path = NativeTestGguf();
  if (!path) GTEST_SKIP() << "the real model " << kDefaultGgufName << " is in no models folder: run scripts/setup.sh";
  DeviceOptions f32_opts, native_opts;
  native_opts.weights = "native";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Transformer> f32, Transformer::Load(*path, f32_opts));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Transformer> native, Transformer::Load(*path, native_opts));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> tok, LoadTokenizer(*path));
  std::printf("decode weight bytes: float32 %.1f MB, native %.1f MB\n", f32->DecodeWeightBytes() / 1e6,
              native->DecodeWeightBytes() / 1e6);
  if (std::getenv("ECHOKV_NATIVE_GGUF") == nullptr) {
    EXPECT_LT(native->DecodeWeightBytes() * 5, f32->DecodeWeightBytes());
  }

  const char* prompts[] = {
      "The capital of France is",
      "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
      "Once upon a time, in a small village by the sea, there lived an old fisherman who",
  };
  constexpr int kSteps = 32;
  int positions = 0, agree = 0;
  double kl_sum = 0, kl_max = 0;
  std::vector<KvCache> batch_caches;
  std::vector<int> batch_tokens;
  for (const char* text : prompts) {
    ASSERT_OK_AND_ASSIGN(std::vector<int> ids, tok->Encode(text));
    KvCache cf = f32->NewCache(), cn = native->NewCache(), free_run = native->NewCache();
    ASSERT_OK_AND_ASSIGN(ForwardResult pf, f32->Forward(ids, &cf, ForwardOptions()));
    ASSERT_OK_AND_ASSIGN(ForwardResult pn, native->Forward(ids, &cn, ForwardOptions()));
    batch_caches.push_back(cn);  // the native cache after the prompt, for the batch check
    ASSERT_OK_AND_ASSIGN(ForwardResult pr, native->Forward(ids, &free_run, ForwardOptions()));
    at::Tensor lf = pf.logits, ln = pn.logits;
    std::vector<int> greedy_f32, greedy_native;
    int next_native = Top1(pr.logits);
    for (int s = 0; s <= kSteps; ++s) {
      const double kl = Kl(lf, ln);
      kl_sum += kl;
      kl_max = std::max(kl_max, kl);
      ++positions;
      const int next = Top1(lf);
      agree += next == Top1(ln);
      greedy_f32.push_back(next);
      greedy_native.push_back(next_native);
      if (s == kSteps) break;
      if (s == 0) batch_tokens.push_back(next);
      ASSERT_OK_AND_ASSIGN(DecodeResult df, f32->Decode(next, &cf));
      ASSERT_OK_AND_ASSIGN(DecodeResult dn, native->Decode(next, &cn));  // teacher-forced
      ASSERT_OK_AND_ASSIGN(DecodeResult dr, native->Decode(next_native, &free_run));
      lf = df.logits;
      ln = dn.logits;
      next_native = Top1(dr.logits);
    }
    size_t common = 0;
    while (common < greedy_f32.size() && greedy_f32[common] == greedy_native[common]) ++common;
    std::printf("prompt %zu tokens: greedy %d tokens, common prefix float32 vs native %zu\n", ids.size(),
                kSteps + 1, common);
  }
  const double top1 = static_cast<double>(agree) / positions, kl_mean = kl_sum / positions;
  std::printf("native vs float32 over %d positions: top-1 agreement %.3f, KL mean %.5f max %.5f nats\n", positions,
              top1, kl_mean, kl_max);
  EXPECT_GE(top1, 0.90);
  EXPECT_LE(kl_mean, 0.01);
  EXPECT_LE(kl_max, 0.1);

  // A stream's logits alone and in a batch of three: the same bits.
  std::vector<KvCache> alone = batch_caches;
  std::vector<DecodeRow> rows;
  for (size_t i = 0; i < batch_caches.size(); ++i) rows.push_back({batch_tokens[i], &batch_caches[i], false});
  ASSERT_OK_AND_ASSIGN(std::vector<DecodeResult> batched, native->DecodeBatch(rows));
  for (size_t i = 0; i < alone.size(); ++i) {
    ASSERT_OK_AND_ASSIGN(DecodeResult one, native->Decode(batch_tokens[i], &alone[i]));
    ASSERT_EQ(one.logits.numel(), batched[i].logits.numel());
    EXPECT_EQ(0, std::memcmp(one.logits.data_ptr<float>(), batched[i].logits.contiguous().data_ptr<float>(),
                             one.logits.numel() * sizeof(float)))
        << "stream " << i << ": alone vs batched";
  }
}

// The stored rows (GGUF's q/k permutation undone on whole rows) decoded by the kernels
// equal the float32 path's ReadFloat32 bit for bit (the `gguf` package's dequantization).
TEST(NativeWeightsTest, StoredRowsDecodeToTheFloat32PathsValues) {
  const std::optional<std::string> path = FindDefaultGguf();
  if (!path) GTEST_SKIP() << "the real model " << kDefaultGgufName << " is in no models folder: run scripts/setup.sh";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GgufModel> gguf, GgufModel::Open(*path));
  for (const char* name : {"model.layers.0.self_attn.q_proj.weight", "model.layers.3.self_attn.k_proj.weight",
                           "model.layers.0.mlp.down_proj.weight", "model.embed_tokens.weight"}) {
    SCOPED_TRACE(name);
    const std::vector<int64_t>& shape = *gguf->Shape(name);
    kernels::BlockType type{};
    ASSERT_TRUE(kernels::BlockTypeFromGgml(static_cast<uint32_t>(gguf->StoredGgmlType(name)), &type));
    const kernels::BlockMatrix probe{type, nullptr, shape[0], shape[1]};
    std::vector<uint8_t> blocks(probe.Bytes());
    ASSERT_OK(gguf->ReadStoredRows(name, blocks.data()));
    const kernels::BlockMatrix m{type, blocks.data(), shape[0], shape[1]};
    std::vector<float> ours(shape[0] * shape[1]), reference(shape[0] * shape[1]);
    kernels::DequantizeBlockRows(m, 0, shape[0], ours.data());
    ASSERT_OK(gguf->ReadFloat32(name, reference.data()));
    EXPECT_EQ(0, std::memcmp(ours.data(), reference.data(), ours.size() * sizeof(float)));
  }
}

TEST(NativeWeightsTest, RejectsNativeOffTheCpuFloat32Path) {
  DeviceOptions o;
  o.weights = "native";
  o.dtype = "bfloat16";
  EXPECT_FALSE(o.Validate().ok());
  o.dtype = "float32";
  EXPECT_TRUE(o.Validate().ok());
  o.weights = "int4";
  EXPECT_FALSE(o.Validate().ok());
}

}  // namespace
}  // namespace echokv::model
