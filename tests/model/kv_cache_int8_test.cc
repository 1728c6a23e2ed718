// KvCache's int8 storage (issue 31), against kernels/kv_quant.h's quantizer run on each
// row alone: appends (tensor and raw-row) quantize exactly the new rows, growth keeps
// every row, Gather / Clone / ClonePrefix / AppendTail move rows with their scales (never
// re-quantizing), ToStorage converts both ways, SetLayerInt8 restores bit for bit, bad
// inputs change nothing, the byte count includes the scales, and the decode attention's
// arguments read the rows where they lie. Then the model: Decode and DecodeBatch over
// int8 caches (mixed with float32 rows in one batch) on the tiny random models.
#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention_int8.h"
#include "kernels/kv_quant.h"
#include "model/kv_cache.h"
#include "model/transformer.h"
#include "tests/model/rel_diff.h"
#include "tests/model/naive_reference.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_data.h"

namespace echokv::model {
namespace {

using kernels::KvDtype;

constexpr int kLayers = 2, kG = 3;
constexpr int64_t kD = 64;

at::Tensor Random(std::vector<int64_t> shape, uint64_t seed) {
  at::manual_seed(seed);
  return at::randn(shape, at::kFloat);
}

KvCache Int8Cache() {
  absl::StatusOr<KvCache> c = KvCache::WithStorage(kLayers, kG, kD, at::TensorOptions().dtype(at::kFloat), KvDtype::kInt8);
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(*c);
}

// What QuantizeRowsInt8 makes of `rows` [G, n, d] alone: int8 [G, n, d] and scales [G, n].
void QuantizeAlone(const at::Tensor& rows, at::Tensor* q, at::Tensor* s) {
  const at::Tensor x = rows.contiguous();
  *q = at::empty(x.sizes(), at::kChar);
  *s = at::empty({x.size(0), x.size(1)}, at::kFloat);
  kernels::QuantizeRowsInt8(x.data_ptr<float>(), x.size(0) * x.size(1), x.size(2), q->data_ptr<int8_t>(),
                            s->data_ptr<float>());
}

std::vector<int64_t> Range(int64_t from, int64_t to) {
  std::vector<int64_t> p;
  for (int64_t i = from; i < to; ++i) p.push_back(i);
  return p;
}

// Appends n tokens (positions 0..n-1) to `layer` in 4 calls, so the storage grows past
// its first 16 rows; returns the float32 keys and values [G, n, d] appended.
std::pair<at::Tensor, at::Tensor> Fill(KvCache& c, int layer, int64_t n) {
  std::vector<at::Tensor> ks, vs;
  int64_t done = 0;
  for (int call = 0; call < 4; ++call) {
    const int64_t m = (n * (call + 1)) / 4 - done;
    at::Tensor k = Random({kG, m, kD}, 100 * layer + call), v = Random({kG, m, kD}, 200 * layer + call) * 3;
    EXPECT_OK(c.Append(layer, k, v, Range(done, done + m)));
    ks.push_back(k);
    vs.push_back(v);
    done += m;
  }
  return {at::cat(ks, 1), at::cat(vs, 1)};
}

TEST(KvCacheInt8Test, AppendQuantizesExactlyTheNewRows) {
  KvCache c = Int8Cache();
  ASSERT_TRUE(c.is_int8());
  auto [k, v] = Fill(c, 1, 50);
  ASSERT_EQ(c.size(1), 50);
  EXPECT_EQ(c.size(0), 0);
  at::Tensor qk, sk, qv, sv;
  QuantizeAlone(k, &qk, &sk);
  QuantizeAlone(v, &qv, &sv);
  EXPECT_TRUE(at::equal(c.Int8Keys(1), qk));
  EXPECT_TRUE(at::equal(c.KeyScales(1), sk));
  EXPECT_TRUE(at::equal(c.Int8Values(1), qv));
  EXPECT_TRUE(at::equal(c.ValueScales(1), sv));
  // keys() / values() dequantize: within half a step (s / 2) of each row's float32 value.
  const at::Tensor kerr = (c.keys(1) - k).abs(), verr = (c.values(1) - v).abs();
  EXPECT_TRUE((kerr <= sk.unsqueeze(-1) * 0.5001 + 1e-7).all().item<bool>());
  EXPECT_TRUE((verr <= sv.unsqueeze(-1) * 0.5001 + 1e-7).all().item<bool>());
  EXPECT_GT(kerr.max().item<float>(), 0.0f);  // really quantized
  EXPECT_EQ(c.keys(1).scalar_type(), at::kFloat);
  // Bytes: (d + 4) per key row and per value row, i.e. KvEntryBytes per entry and group.
  EXPECT_EQ(c.KvBytes(), 50 * kG * kernels::KvEntryBytes(KvDtype::kInt8, kD));
  EXPECT_EQ(c.KvBytes(), 50 * kG * 2 * (kD + 4));
  // The reference a saving is measured against stays the float32 full cache.
  EXPECT_EQ(c.FullEquivalentKvBytes(50), 50 * kLayers * kG * kD * 2 * 4);
  EXPECT_EQ(c.KeyData(1), nullptr);  // no float32 rows to hand out
  // A position that is not after the held ones: refused, nothing changed.
  EXPECT_FALSE(c.Append(1, Random({kG, 1, kD}, 5), Random({kG, 1, kD}, 6), {49}).ok());
  EXPECT_EQ(c.size(1), 50);
  EXPECT_TRUE(at::equal(c.Int8Keys(1), qk));
}

TEST(KvCacheInt8Test, AppendRowEqualsAppend) {
  KvCache a = Int8Cache(), b = Int8Cache();
  for (int64_t p = 0; p < 20; ++p) {
    const at::Tensor k = Random({kG, 1, kD}, 300 + p), v = Random({kG, 1, kD}, 400 + p);
    ASSERT_OK(a.Append(0, k, v, {p}));
    ASSERT_OK(b.AppendRow(0, k.contiguous().data_ptr<float>(), v.contiguous().data_ptr<float>(), p));
  }
  EXPECT_TRUE(at::equal(a.Int8Keys(0), b.Int8Keys(0)));
  EXPECT_TRUE(at::equal(a.Int8Values(0), b.Int8Values(0)));
  EXPECT_TRUE(at::equal(a.KeyScales(0), b.KeyScales(0)));
  EXPECT_TRUE(at::equal(a.ValueScales(0), b.ValueScales(0)));
}

TEST(KvCacheInt8Test, GatherCloneAndPrefixMoveRowsWithTheirScales) {
  KvCache c = Int8Cache();
  Fill(c, 0, 40);
  Fill(c, 1, 40);
  const std::vector<std::vector<int64_t>> keep = {{0, 3, 4, 39}, {1, 2, 3, 4}, {10, 20, 30, 38}};
  at::Tensor idx = at::empty({kG, 4}, at::kLong);
  for (int g = 0; g < kG; ++g) {
    for (int j = 0; j < 4; ++j) idx[g][j] = keep[g][j];
  }
  ASSERT_OK_AND_ASSIGN(KvCache kept, KvCache::Gather(c, {idx, idx}));
  ASSERT_TRUE(kept.is_int8());
  for (int l = 0; l < kLayers; ++l) {
    for (int g = 0; g < kG; ++g) {
      for (int j = 0; j < 4; ++j) {
        EXPECT_TRUE(at::equal(kept.Int8Keys(l)[g][j], c.Int8Keys(l)[g][keep[g][j]]));
        EXPECT_TRUE(at::equal(kept.Int8Values(l)[g][j], c.Int8Values(l)[g][keep[g][j]]));
        EXPECT_EQ(kept.KeyScales(l)[g][j].item<float>(), c.KeyScales(l)[g][keep[g][j]].item<float>());
        EXPECT_EQ(kept.ValueScales(l)[g][j].item<float>(), c.ValueScales(l)[g][keep[g][j]].item<float>());
        EXPECT_EQ(kept.cells().positions(l, g)[j], keep[g][j]);
      }
    }
  }
  EXPECT_EQ(kept.KvBytes(), 2 * 4 * kG * kernels::KvEntryBytes(KvDtype::kInt8, kD));
  // Appends continue after the selection, at the next position.
  ASSERT_OK(kept.Append(0, Random({kG, 1, kD}, 7), Random({kG, 1, kD}, 8), {40}));
  EXPECT_EQ(kept.size(0), 5);

  KvCache clone = c.Clone();
  ASSERT_TRUE(clone.is_int8());
  EXPECT_TRUE(at::equal(clone.Int8Keys(1), c.Int8Keys(1)));
  EXPECT_TRUE(at::equal(clone.ValueScales(1), c.ValueScales(1)));
  ASSERT_OK(clone.Append(1, Random({kG, 1, kD}, 9), Random({kG, 1, kD}, 10), {40}));
  EXPECT_EQ(c.size(1), 40);  // a deep copy

  ASSERT_OK_AND_ASSIGN(KvCache prefix, c.ClonePrefix(25));
  EXPECT_TRUE(prefix.is_int8());
  EXPECT_EQ(prefix.size(0), 25);
  EXPECT_EQ(prefix.next_position(), 25);
  EXPECT_TRUE(at::equal(prefix.Int8Keys(0), c.Int8Keys(0).narrow(1, 0, 25)));
  EXPECT_TRUE(at::equal(prefix.KeyScales(0), c.KeyScales(0).narrow(1, 0, 25)));

  // AppendTail between int8 caches: the tail's bits and scales, unchanged.
  ASSERT_OK_AND_ASSIGN(KvCache head, c.ClonePrefix(30));
  ASSERT_OK(head.AppendTail(c, 10));
  EXPECT_TRUE(at::equal(head.Int8Keys(1), c.Int8Keys(1)));
  EXPECT_TRUE(at::equal(head.ValueScales(1), c.ValueScales(1)));
  EXPECT_EQ(head.next_position(), c.next_position());
}

TEST(KvCacheInt8Test, ToStorageQuantizesAndDequantizes) {
  KvCache f(kLayers, kG, kD, at::TensorOptions().dtype(at::kFloat));
  at::Tensor k = Random({kG, 33, kD}, 11), v = Random({kG, 33, kD}, 12);
  ASSERT_OK(f.Append(0, k, v, Range(0, 33)));
  f.set_next_position(33);
  ASSERT_OK_AND_ASSIGN(KvCache q, f.ToStorage(KvDtype::kInt8));
  ASSERT_TRUE(q.is_int8());
  EXPECT_EQ(q.next_position(), 33);
  EXPECT_EQ(q.size(1), 0);
  at::Tensor qk, sk;
  QuantizeAlone(k, &qk, &sk);
  EXPECT_TRUE(at::equal(q.Int8Keys(0), qk));
  EXPECT_TRUE(at::equal(q.KeyScales(0), sk));
  EXPECT_LT(q.KvBytes() * 100, f.KvBytes() * 27);  // 136 / 512 = 0.266 at d = 64
  ASSERT_OK_AND_ASSIGN(KvCache back, q.ToStorage(KvDtype::kFloat32));
  EXPECT_FALSE(back.is_int8());
  EXPECT_TRUE(at::equal(back.keys(0), q.keys(0)));
  ASSERT_NE(back.KeyData(0), nullptr);
  // Re-quantizing a float32 row gives its bits again (per-token scales never change).
  ASSERT_OK_AND_ASSIGN(KvCache again, f.ToStorage(KvDtype::kInt8));
  EXPECT_TRUE(at::equal(again.Int8Keys(0), q.Int8Keys(0)));
  // Refused storages name the field.
  EXPECT_FALSE(f.ToStorage(KvDtype::kBFloat16).ok());
  absl::StatusOr<KvCache> bad =
      KvCache::WithStorage(kLayers, kG, kD, at::TensorOptions().dtype(at::kBFloat16), KvDtype::kInt8);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("cache_dtype"), std::string::npos) << bad.status();
}

TEST(KvCacheInt8Test, SetLayerInt8RestoresBitForBit) {
  KvCache c = Int8Cache();
  Fill(c, 0, 20);
  KvCache r = Int8Cache();
  std::vector<std::vector<int64_t>> pos(kG, Range(0, 20));
  ASSERT_OK(r.SetLayerInt8(0, c.Int8Keys(0), c.KeyScales(0), c.Int8Values(0), c.ValueScales(0), pos));
  EXPECT_TRUE(at::equal(r.Int8Keys(0), c.Int8Keys(0)));
  EXPECT_TRUE(at::equal(r.ValueScales(0), c.ValueScales(0)));
  // Wrong dtype or shape: refused, nothing changed.
  EXPECT_FALSE(r.SetLayerInt8(1, c.keys(0), c.KeyScales(0), c.Int8Values(0), c.ValueScales(0), pos).ok());
  EXPECT_FALSE(r.SetLayerInt8(1, c.Int8Keys(0), c.KeyScales(0).narrow(1, 0, 3), c.Int8Values(0), c.ValueScales(0), pos)
                   .ok());
  EXPECT_EQ(r.size(1), 0);
  // A float32 layer given to an int8 cache is quantized as an append would.
  KvCache s = Int8Cache();
  at::Tensor k = Random({kG, 20, kD}, 21), v = Random({kG, 20, kD}, 22);
  ASSERT_OK(s.SetLayer(0, k, v, pos));
  at::Tensor qk, sk;
  QuantizeAlone(k, &qk, &sk);
  EXPECT_TRUE(at::equal(s.Int8Keys(0), qk));
}

TEST(KvCacheInt8Test, AttentionArgsReadTheCacheInPlace) {
  KvCache c = Int8Cache();
  Fill(c, 0, 70);
  at::Tensor idx = at::tensor({0, 5, 9, 60, 69, 1, 2, 3, 4, 5, 7, 17, 27, 37, 47}, at::kLong).view({kG, 5});
  ASSERT_OK_AND_ASSIGN(KvCache kept, KvCache::Gather(c, {idx, at::empty({kG, 0}, at::kLong)}));
  ASSERT_OK(kept.Append(0, Random({kG, 1, kD}, 31), Random({kG, 1, kD}, 32), {70}));  // grows the storage
  const int64_t H = 6, n = 6;
  const at::Tensor q = Random({H, kD}, 77);
  std::vector<float> out(H * kD), expected(H * kD);
  std::vector<const int64_t*> kpos;
  kernels::DecodeAttentionInt8Args a = kept.Int8AttentionArgs(0, &kpos);
  ASSERT_EQ(a.n, n);
  a.num_heads = H;
  a.q = q.data_ptr<float>();
  a.q_head_stride = kD;
  a.q_position = 70;
  a.scale = 0.125f;
  a.out = out.data();
  a.out_head_stride = kD;
  kernels::DecodeAttentionInt8(a, 0, kernels::DecodeAttentionInt8WorkItems(a));
  // The same rows copied into a dense [G, n, d] layout.
  const at::Tensor kd = kept.Int8Keys(0).contiguous(), vd = kept.Int8Values(0).contiguous();
  const at::Tensor ks = kept.KeyScales(0).contiguous(), vs = kept.ValueScales(0).contiguous();
  kernels::DecodeAttentionInt8Args b = a;
  b.k = kd.data_ptr<int8_t>();
  b.v = vd.data_ptr<int8_t>();
  b.k_scales = ks.data_ptr<float>();
  b.v_scales = vs.data_ptr<float>();
  b.kv_group_stride = n * kD;
  b.k_scale_group_stride = b.v_scale_group_stride = n;
  b.out = expected.data();
  kernels::DecodeAttentionInt8(b, 0, kernels::DecodeAttentionInt8WorkItems(b));
  EXPECT_EQ(out, expected);
  // A window of 10 positions at 70: group 0 sees 60, 69 and 70, groups 1 and 2 only 70.
  a.sliding_window = 10;
  kernels::DecodeAttentionInt8(a, 0, kernels::DecodeAttentionInt8WorkItems(a));
  EXPECT_NE(out, expected);
}

// ---- the model over int8 caches ----

using ::echokv::testing::MakeRandomModel;
using ::echokv::testing::RelDiff;
using ::echokv::testing::TinyConfig;

constexpr double kInt8Tol = 0.08;

class Int8DecodeTest : public ::testing::TestWithParam<ModelType> {
 protected:
  void SetUp() override {
    ref_ = MakeRandomModel(TinyConfig(GetParam()), 4242 + static_cast<int>(GetParam()));
    dir_ = testing::MakeTempDir("echokv_int8_decode_");
    testing::WriteModelDir(ref_, dir_);
    DeviceOptions dev;
    dev.num_threads = 2;
    auto m = Transformer::Load(dir_, dev);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
  }
  std::vector<int> Prompt(int n, int salt) const {
    std::vector<int> t;
    for (int i = 0; i < n; ++i) t.push_back((i * 11 + salt * 7 + (i * i) % 3) % ref_.config.vocab_size);
    return t;
  }
  testing::NaiveModel ref_;
  std::string dir_;
  std::unique_ptr<Transformer> model_;
};

// Decode over an int8 cache is decode over its dequantized rows: the logits stay within
// kInt8Tol (relative to max(1, max |logit|)) of the float32 cache's, and are not the same
// bits (the int8 path ran). These models have d = 8, so a row's step is 1/127 of its
// largest value over only 8 values (the scalar kernel): measured worst 0.042 (qwen2),
// 0.022 (mistral), 0.018 (llama). Broken on purpose in decode_cpu.cc, every group read
// group 0's keys: 0.73-1.44; every group took group 0's value scales: 0.10-1.28.
// The kernel's own bound, derived from the quantization steps, is attention_int8_test's. A batch mixing int8 and float32 rows gives each row what
// Decode gives it alone, bit for bit; appends quantize the new entry.
TEST_P(Int8DecodeTest, DecodeAndMixedBatchOverInt8Caches) {
  constexpr int kSteps = 4, kRows = 4;
  std::vector<std::vector<int>> prompts;
  std::vector<KvCache> f32, int8, batch;
  for (int i = 0; i < kRows; ++i) {
    prompts.push_back(Prompt(9 + 5 * i, i));
    KvCache c = model_->NewCache();
    ASSERT_OK(model_->Forward(prompts.back(), &c).status());
    ASSERT_OK_AND_ASSIGN(KvCache q, c.ToStorage(KvDtype::kInt8));
    batch.push_back(i % 2 == 0 ? q.Clone() : c.Clone());
    int8.push_back(std::move(q));
    f32.push_back(std::move(c));
  }
  double worst = 0, least = 1e9;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<DecodeRow> rows;
    for (int i = 0; i < kRows; ++i) rows.push_back({(step * 5 + i) % ref_.config.vocab_size, &batch[i], false});
    ASSERT_OK_AND_ASSIGN(std::vector<DecodeResult> got, model_->DecodeBatch(rows));
    for (int i = 0; i < kRows; ++i) {
      SCOPED_TRACE(::testing::Message() << "row " << i << " step " << step);
      const int token = rows[i].token;
      ASSERT_OK_AND_ASSIGN(DecodeResult a, model_->Decode(token, &int8[i], false));
      ASSERT_OK_AND_ASSIGN(DecodeResult b, model_->Decode(token, &f32[i], false));
      const double d = RelDiff(a.logits, b.logits);
      EXPECT_LT(d, kInt8Tol);
      worst = std::max(worst, d);
      least = std::min(least, d);
      EXPECT_TRUE(at::equal(got[i].logits, i % 2 == 0 ? a.logits : b.logits));
    }
  }
  EXPECT_GT(least, 0.0);  // the int8 rows did not run the float32 path
  for (int i = 0; i < kRows; ++i) {
    EXPECT_TRUE(int8[i].is_int8());
    EXPECT_EQ(int8[i].size(0), static_cast<int64_t>(prompts[i].size()) + kSteps);
    EXPECT_TRUE(at::equal(batch[i].keys(0), i % 2 == 0 ? int8[i].keys(0) : f32[i].keys(0)));
  }
  std::printf("int8 vs float32 cache, worst logit difference %.3g (relative), least %.3g\n", worst, least);
  // A prefill chunk appended onto an int8 cache (an append turn) attends over its
  // dequantized rows: the next logits stay within the same bound of the float32 path.
  const std::vector<int> more = Prompt(6, 9);
  ASSERT_OK_AND_ASSIGN(ForwardResult fa, model_->Forward(more, &int8[0]));
  ASSERT_OK_AND_ASSIGN(ForwardResult fb, model_->Forward(more, &f32[0]));
  EXPECT_LT(RelDiff(fa.logits, fb.logits), kInt8Tol);
  EXPECT_TRUE(int8[0].is_int8());
}

INSTANTIATE_TEST_SUITE_P(Families, Int8DecodeTest,
                         ::testing::Values(ModelType::kLlama, ModelType::kMistral, ModelType::kQwen2),
                         [](const ::testing::TestParamInfo<ModelType>& i) {
                           return std::string(ModelTypeName(i.param));
                         });

}  // namespace
}  // namespace echokv::model
