// The int8 retained tier (model/kv_cache_int8.h): appends quantize exactly the appended
// rows (the bits QuantizeRowsInt8 gives them alone), growth keeps every row, Select keeps
// the surviving rows' bits and scales (no re-quantization) and their positions, bad
// appends and selections change nothing, Truncate, the byte count, and the decode
// attention over AttentionArgs equals the kernel over the same rows laid out by hand.
#include "model/kv_cache_int8.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/attention_int8.h"
#include "kernels/kv_quant.h"

namespace echokv::model {
namespace {

constexpr int kLayers = 2, kG = 3;
constexpr int64_t kD = 64;

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

// Row i of group g of `layer`, as the cache holds it.
std::vector<int8_t> KeyRow(const KvCacheInt8& c, int layer, int64_t g, int64_t i) {
  const int8_t* p = c.KeyData(layer) + g * c.GroupStride(layer) + i * kD;
  return std::vector<int8_t>(p, p + kD);
}

// Appends n tokens at positions 0..n-1 in 4 calls (so the storage grows past 16 rows),
// returning the float32 rows [G, n, d] it appended, per group.
std::vector<float> Fill(KvCacheInt8& c, int layer, int64_t n, std::vector<float>* values) {
  std::vector<float> keys(kG * n * kD);
  values->assign(kG * n * kD, 0.0f);
  int64_t done = 0;
  for (int call = 0; call < 4; ++call) {
    const int64_t m = (n * (call + 1)) / 4 - done;
    const std::vector<float> k = Random(kG * m * kD, 100 * layer + call), v = Random(kG * m * kD, 200 + call);
    std::vector<int64_t> pos(m);
    for (int64_t i = 0; i < m; ++i) pos[i] = done + i;
    EXPECT_TRUE(c.Append(layer, k.data(), v.data(), m, pos).ok());
    for (int64_t g = 0; g < kG; ++g) {
      std::copy_n(k.data() + g * m * kD, m * kD, keys.data() + (g * n + done) * kD);
      std::copy_n(v.data() + g * m * kD, m * kD, values->data() + (g * n + done) * kD);
    }
    done += m;
  }
  return keys;
}

TEST(KvCacheInt8Test, AppendQuantizesOnlyTheNewRows) {
  KvCacheInt8 c(kLayers, kG, kD);
  std::vector<float> v;
  const std::vector<float> k = Fill(c, 1, 50, &v);
  ASSERT_EQ(c.size(1), 50);
  EXPECT_EQ(c.size(0), 0);
  for (int64_t g = 0; g < kG; ++g) {
    for (int64_t i = 0; i < 50; ++i) {
      std::vector<int8_t> q(kD);
      float s;
      kernels::QuantizeRowsInt8(k.data() + (g * 50 + i) * kD, 1, kD, q.data(), &s);
      ASSERT_EQ(KeyRow(c, 1, g, i), q) << g << " " << i;
      ASSERT_EQ(c.KeyScales(1)[g * c.ScaleGroupStride(1) + i], s);
      EXPECT_EQ(c.cells().positions(1, static_cast<int>(g))[i], i);
    }
  }
  std::vector<float> kd, vd;
  c.Dequantize(1, &kd, &vd);
  for (size_t i = 0; i < k.size(); ++i) ASSERT_NEAR(kd[i], k[i], 0.05) << i;  // |x| < ~5: half a step < 0.02
  EXPECT_EQ(c.KvBytes(), 50 * kG * kernels::KvEntryBytes(kernels::KvDtype::kInt8, kD));
  // A position that is not after the held ones: refused, nothing changed.
  const std::vector<float> row(kG * kD, 1.0f);
  const std::vector<int64_t> stale = {49};
  EXPECT_FALSE(c.Append(1, row.data(), row.data(), 1, stale).ok());
  EXPECT_EQ(c.size(1), 50);
  EXPECT_FALSE(c.Append(1, row.data(), row.data(), 2, stale).ok());  // 2 rows, 1 position
  EXPECT_FALSE(c.Append(2, row.data(), row.data(), 1, {50}).ok());
}

TEST(KvCacheInt8Test, SelectMovesRowsWithoutRequantizing) {
  KvCacheInt8 c(kLayers, kG, kD);
  std::vector<float> v;
  Fill(c, 0, 40, &v);
  std::vector<std::vector<int8_t>> before[kG];
  std::vector<float> scales_before[kG];
  for (int64_t g = 0; g < kG; ++g) {
    for (int64_t i = 0; i < 40; ++i) {
      before[g].push_back(KeyRow(c, 0, g, i));
      scales_before[g].push_back(c.ValueScales(0)[g * c.ScaleGroupStride(0) + i]);
    }
  }
  const std::vector<std::vector<int64_t>> keep = {{0, 3, 4, 39}, {1, 2, 3, 4}, {10, 20, 30, 38}};
  ASSERT_TRUE(c.Select(0, keep).ok());
  ASSERT_EQ(c.size(0), 4);
  for (int64_t g = 0; g < kG; ++g) {
    for (int64_t i = 0; i < 4; ++i) {
      EXPECT_EQ(KeyRow(c, 0, g, i), before[g][keep[g][i]]);
      EXPECT_EQ(c.ValueScales(0)[g * c.ScaleGroupStride(0) + i], scales_before[g][keep[g][i]]);
      EXPECT_EQ(c.cells().positions(0, static_cast<int>(g))[i], keep[g][i]);
    }
  }
  EXPECT_EQ(c.KvBytes(), 4 * kG * kernels::KvEntryBytes(kernels::KvDtype::kInt8, kD));
  // Unequal counts: refused, nothing changed.
  EXPECT_FALSE(c.Select(0, {{0}, {0, 1}, {0}}).ok());
  EXPECT_EQ(c.size(0), 4);
  // Appends continue after the selection.
  const std::vector<float> row = Random(kG * kD, 9);
  ASSERT_TRUE(c.Append(0, row.data(), row.data(), 1, {40}).ok());
  EXPECT_EQ(c.size(0), 5);
  ASSERT_TRUE(c.Truncate(0, 2).ok());
  EXPECT_EQ(c.size(0), 2);
  EXPECT_FALSE(c.Truncate(0, 3).ok());
}

TEST(KvCacheInt8Test, AttentionArgsReadTheCacheInPlace) {
  KvCacheInt8 c(kLayers, kG, kD);
  std::vector<float> v;
  const std::vector<float> k = Fill(c, 0, 70, &v);
  ASSERT_TRUE(c.Select(0, {{0, 5, 9, 60, 69}, {1, 2, 3, 4, 5}, {7, 17, 27, 37, 47}}).ok());
  const int64_t H = 6, n = 5;
  const std::vector<float> q = Random(H * kD, 77);
  std::vector<float> out(H * kD), expected(H * kD);
  std::vector<const int64_t*> kpos;
  kernels::DecodeAttentionInt8Args a = c.AttentionArgs(0, &kpos);
  a.num_heads = H;
  a.q = q.data();
  a.q_head_stride = kD;
  a.q_position = 69;
  a.scale = 0.125f;
  a.out = out.data();
  a.out_head_stride = kD;
  kernels::DecodeAttentionInt8(a, 0, kernels::DecodeAttentionInt8WorkItems(a));
  // The same rows copied into a dense [G, n, d] layout.
  std::vector<int8_t> kd(kG * n * kD), vd(kG * n * kD);
  std::vector<float> ks(kG * n), vs(kG * n);
  for (int64_t g = 0; g < kG; ++g) {
    std::memcpy(kd.data() + g * n * kD, c.KeyData(0) + g * c.GroupStride(0), n * kD);
    std::memcpy(vd.data() + g * n * kD, c.ValueData(0) + g * c.GroupStride(0), n * kD);
    std::memcpy(ks.data() + g * n, c.KeyScales(0) + g * c.ScaleGroupStride(0), n * sizeof(float));
    std::memcpy(vs.data() + g * n, c.ValueScales(0) + g * c.ScaleGroupStride(0), n * sizeof(float));
  }
  kernels::DecodeAttentionInt8Args b = a;
  b.k = kd.data();
  b.v = vd.data();
  b.k_scales = ks.data();
  b.v_scales = vs.data();
  b.kv_group_stride = n * kD;
  b.k_scale_group_stride = b.v_scale_group_stride = n;
  b.out = expected.data();
  kernels::DecodeAttentionInt8(b, 0, kernels::DecodeAttentionInt8WorkItems(b));
  EXPECT_EQ(out, expected);
  // A window of 10 positions at position 69: group 0 sees only 60 and 69, groups 1 and 2
  // see nothing (their heads get zeros). The positions AttentionArgs points at are used.
  a.sliding_window = 10;
  kernels::DecodeAttentionInt8(a, 0, kernels::DecodeAttentionInt8WorkItems(a));
  EXPECT_NE(out, expected);
  for (int64_t i = 2 * kD; i < H * kD; ++i) ASSERT_EQ(out[i], 0.0f) << i;
}

}  // namespace
}  // namespace echokv::model
