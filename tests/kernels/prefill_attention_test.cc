// kernels::ChunkAttention (the two-part, log-sum-exp-merged prefill attention that runs
// on SDPA's fused backends on CUDA) on the CPU, where it takes its reference path,
// against kernels::CausalAttention over the same compressed caches: older entries at
// per-group positions with gaps, then the chunk's own. The CUDA build's `cuda` tests
// run the same comparison on the flash and memory-efficient backends.
#include "kernels/prefill_attention.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention.h"

namespace echokv::kernels {
namespace {

struct Chunk {
  at::Tensor q;  // [H, m, d]
  at::Tensor k;  // [G, old + m, d]
  at::Tensor v;
  std::vector<std::vector<int64_t>> kpos;  // [G][old + m]
  std::vector<int64_t> qpos;               // [m]
};

Chunk MakeChunk(int64_t H, int64_t G, int64_t d, int64_t m, int64_t old, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const at::TensorOptions f32 = at::TensorOptions().dtype(at::kFloat);
  Chunk c;
  c.q = at::randn({H, m, d}, gen, f32) * 1.5;
  c.k = at::randn({G, old + m, d}, gen, f32);
  c.v = at::randn({G, old + m, d}, gen, f32);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  const int64_t history = 3 * old + 1;  // the older entries were kept from a longer history
  for (int64_t g = 0; g < G; ++g) {
    std::vector<int64_t> all(history);
    for (int64_t i = 0; i < history; ++i) all[i] = i;
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(old);
    std::sort(all.begin(), all.end());
    for (int64_t i = 0; i < m; ++i) all.push_back(history + i);
    c.kpos.push_back(all);
  }
  for (int64_t i = 0; i < m; ++i) c.qpos.push_back(history + i);
  return c;
}

at::Tensor FusedCpu(const Chunk& c) {
  const int64_t H = c.q.size(0), m = c.q.size(1), d = c.q.size(2), G = c.k.size(0), n = c.k.size(1);
  at::Tensor q = c.q.transpose(0, 1).contiguous();  // [m, H, d]
  at::Tensor k = c.k.contiguous(), v = c.v.contiguous();
  at::Tensor out = at::empty({m, H, d}, at::kFloat);
  std::vector<const int64_t*> kp;
  for (const auto& p : c.kpos) kp.push_back(p.data());
  CausalAttentionArgs a;
  a.num_heads = H;
  a.num_kv_heads = G;
  a.head_dim = d;
  a.q = q.data_ptr<float>();
  a.q_row_stride = H * d;
  a.q_head_stride = d;
  a.m = m;
  a.q_positions = c.qpos.data();
  a.k = k.data_ptr<float>();
  a.v = v.data_ptr<float>();
  a.kv_group_stride = n * d;
  a.n = n;
  a.key_positions = kp.data();
  a.scale = 1.0f / std::sqrt(static_cast<float>(d));
  a.out = out.data_ptr<float>();
  a.out_row_stride = H * d;
  a.out_head_stride = d;
  CausalAttention(a, 0, CausalAttentionWorkItems(a));
  return out.transpose(0, 1);  // [H, m, d]
}

TEST(ChunkAttentionTest, MatchesTheFusedCpuKernelOverCompressedCaches) {
  struct Shape {
    int64_t H, G, d, m, old;
  };
  uint64_t seed = 1;
  for (const Shape& s : {Shape{8, 4, 8, 5, 0}, Shape{8, 4, 8, 1, 7}, Shape{4, 4, 16, 9, 33}, Shape{32, 8, 64, 40, 100},
                         Shape{6, 2, 24, 17, 3}}) {
    Chunk c = MakeChunk(s.H, s.G, s.d, s.m, s.old, seed++);
    auto got = ChunkAttention(c.q, c.k, c.v);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(ChunkAttentionBackend(c.q), "reference");
    at::Tensor want = FusedCpu(c);
    const float err = (*got - want).abs().max().item<float>();
    EXPECT_LT(err, 2e-5f) << "H " << s.H << " G " << s.G << " d " << s.d << " m " << s.m << " old " << s.old;
  }
}

TEST(ChunkAttentionTest, EmptyChunkAndBadInputs) {
  Chunk c = MakeChunk(4, 2, 8, 3, 5, 9);
  auto empty = ChunkAttention(c.q.narrow(1, 0, 0), c.k, c.v);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->size(1), 0);
  EXPECT_FALSE(ChunkAttention(c.q, c.k.narrow(1, 0, 2), c.v.narrow(1, 0, 2)).ok());  // n < m
  EXPECT_FALSE(ChunkAttention(c.q.narrow(0, 0, 3), c.k, c.v).ok());                  // H % G != 0
  EXPECT_FALSE(ChunkAttention(c.q, c.k, c.v.narrow(2, 0, 4)).ok());                  // k, v shapes differ
  EXPECT_FALSE(ChunkAttention(c.q.to(at::kDouble), c.k, c.v).ok());                  // dtypes differ
  EXPECT_FALSE(ChunkAttention(c.q, c.k, c.v, -1.0).ok());
}

}  // namespace
}  // namespace echokv::kernels
