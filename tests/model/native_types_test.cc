// --weights native on the newer stored types (F16, BF16, Q4_K, Q6_K; Q4_K with a Q6_K
// embedding; a fused q/k/v whose attn_v is another type: Q4_K + Q8_0, F16 + Q6_K, kept
// as parts, as llama-quantize's Q4_K_M mixes them) on a tiny random llama made
// by echokv-make-test-model (hidden 256, so the K-quants' rows are whole super-blocks)
// and written as GGUF by tools/gguf_export.h, against the float32 path on the same file:
//   - the native matrices hold the stored bytes (DecodeWeightBytes: F16 / BF16 2x fewer
//     than float32, Q6_K > 4.5x, Q4_K > 6.5x);
//   - prefill logits and 16 teacher-forced decode steps of two prompts (34 positions):
//     top-1 agreement and mean / max KL(float32 || native) within each type's bound
//     (F16 / BF16 read the float32 inputs, so only summation order differs: all top-1
//     the same, KL mean <= 1e-10, max <= 1e-9, seen ~1e-14; the K-quants quantize the
//     inputs to int8 per 32 values: top-1 >= 97 %, KL mean <= 1e-4, max <= 2e-4, seen
//     ~1.3e-5 / 2.3e-5; the random model's logits are flat, so these KLs are small:
//     the real-model figures are in docs/ARCHITECTURE.md);
//   - a stream's native logits are the same bits decoded alone or in a batch of two.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/sampler.h"
#include "model/transformer.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_data.h"
#include "tools/gguf_export.h"
#include "tools/make_test_model.h"

namespace echokv::model {
namespace {

double Kl(const at::Tensor& p_logits, const at::Tensor& q_logits) {
  const at::Tensor lp = at::log_softmax(p_logits.to(at::kDouble), 0), lq = at::log_softmax(q_logits.to(at::kDouble), 0);
  return (lp.exp() * (lp - lq)).sum().item<double>();
}

int Top1(const at::Tensor& logits) {
  return Argmax(absl::MakeConstSpan(logits.data_ptr<float>(), logits.numel()));
}

struct Case {
  const char* type;
  const char* embedding;  // "" = type
  const char* v_type;     // attn_v's type, "" = type (a fused q/k/v of two types)
  double min_shrink;      // float32 decode bytes / native decode bytes
  double max_kl_mean, max_kl, min_top1;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.type << " (embedding " << (*c.embedding ? c.embedding : c.type) << ", v " << (*c.v_type ? c.v_type : c.type)
      << ")";
}

class NativeTypesTest : public ::testing::TestWithParam<Case> {};

TEST_P(NativeTypesTest, DecodesCloseToFloat32OnTheSameFile) {
  const Case& c = GetParam();
  const std::string root = echokv::testing::MakeTempDir("echokv-native-types");
  tools::TestModelOptions o;
  o.out_dir = root + "/hf";
  o.seed = 3;
  o.hidden = 256;
  o.heads = 4;
  o.kv_heads = 2;
  o.intermediate = 512;
  o.layers = 2;
  o.weights_only = true;
  ASSERT_OK(tools::MakeTestModel(o));
  tools::GgufExportOptions e;
  e.type = c.type;
  e.embedding_type = c.embedding;
  e.v_type = c.v_type;
  const std::string path = root + "/model.gguf";
  ASSERT_OK(tools::ExportGguf(o.out_dir, path, e));

  DeviceOptions f32_opts, native_opts;
  f32_opts.num_threads = native_opts.num_threads = 1;
  native_opts.weights = "native";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Transformer> f32, Transformer::Load(path, f32_opts));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Transformer> native, Transformer::Load(path, native_opts));
  const double shrink = static_cast<double>(f32->DecodeWeightBytes()) / native->DecodeWeightBytes();
  EXPECT_GT(shrink, c.min_shrink);

  const int vocab = f32->config().vocab_size;
  int positions = 0, agree = 0;
  double kl_sum = 0, kl_max = 0;
  std::vector<KvCache> caches;
  std::vector<int> next_tokens;
  for (int prompt = 0; prompt < 2; ++prompt) {
    std::vector<int> ids;
    for (int i = 0; i < 24; ++i) ids.push_back((i * (31 + 6 * prompt) + 7) % vocab);
    KvCache cf = f32->NewCache(), cn = native->NewCache();
    ASSERT_OK_AND_ASSIGN(ForwardResult pf, f32->Forward(ids, &cf, ForwardOptions()));
    ASSERT_OK_AND_ASSIGN(ForwardResult pn, native->Forward(ids, &cn, ForwardOptions()));
    caches.push_back(cn);
    next_tokens.push_back(Top1(pf.logits));
    at::Tensor lf = pf.logits, ln = pn.logits;
    for (int s = 0; s <= 16; ++s) {
      const double kl = Kl(lf, ln);
      kl_sum += kl;
      kl_max = std::max(kl_max, kl);
      ++positions;
      const int next = Top1(lf);
      agree += next == Top1(ln);
      if (s == 16) break;
      ASSERT_OK_AND_ASSIGN(DecodeResult df, f32->Decode(next, &cf));
      ASSERT_OK_AND_ASSIGN(DecodeResult dn, native->Decode(next, &cn));
      lf = df.logits;
      ln = dn.logits;
    }
  }
  const double top1 = static_cast<double>(agree) / positions, kl_mean = kl_sum / positions;
  std::printf("%s (embedding %s, v %s): decode bytes %.2fx fewer; over %d positions top-1 %.3f, KL mean %.2e max %.2e\n",
              c.type, *c.embedding ? c.embedding : c.type, *c.v_type ? c.v_type : c.type, shrink, positions, top1, kl_mean, kl_max);
  EXPECT_GE(top1, c.min_top1);
  EXPECT_LE(kl_mean, c.max_kl_mean);
  EXPECT_LE(kl_max, c.max_kl);

  std::vector<KvCache> alone = caches;
  std::vector<DecodeRow> rows;
  for (size_t i = 0; i < caches.size(); ++i) rows.push_back({next_tokens[i], &caches[i], false});
  ASSERT_OK_AND_ASSIGN(std::vector<DecodeResult> batched, native->DecodeBatch(rows));
  for (size_t i = 0; i < alone.size(); ++i) {
    ASSERT_OK_AND_ASSIGN(DecodeResult one, native->Decode(next_tokens[i], &alone[i]));
    EXPECT_EQ(0, std::memcmp(one.logits.data_ptr<float>(), batched[i].logits.contiguous().data_ptr<float>(),
                             one.logits.numel() * sizeof(float)))
        << "stream " << i << ": alone vs batched";
  }
}

INSTANTIATE_TEST_SUITE_P(Types, NativeTypesTest,
                         ::testing::Values(Case{"f16", "", "", 1.9, 1e-10, 1e-9, 1.0},
                                           Case{"bf16", "", "", 1.9, 1e-10, 1e-9, 1.0},
                                           Case{"q6_k", "", "", 4.5, 1e-4, 2e-4, 0.97},
                                           Case{"q4_k", "", "", 6.5, 1e-4, 2e-4, 0.97},
                                           Case{"q4_k", "q6_k", "", 6.5, 1e-4, 2e-4, 0.97},
                                           Case{"q4_k", "", "q8_0", 6.0, 1e-4, 2e-4, 0.97},
                                           Case{"f16", "", "q6_k", 1.9, 1e-4, 2e-4, 0.97}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.type) + (*info.param.embedding ? "_emb_" : "") +
                                  info.param.embedding + (*info.param.v_type ? "_v_" : "") + info.param.v_type;
                         });

}  // namespace
}  // namespace echokv::model
