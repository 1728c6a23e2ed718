// echokv's CUDA kernels (kernels/cuda) against the CPU kernels they mirror and float64
// references (label `cuda`: needs a CUDA device; without one every test fails, never
// skips). Inputs are seeded, non-zero, and for bf16 / fp16 rounded to that dtype before
// the reference sees them. Every launcher-level run poisons its output first (NaN bits)
// and checks that every element was written, runs twice and requires the same bits,
// and checks every CUDA call and cudaGetLastError.
//
// Bounds (relative to the largest reference value of the output, fp32 accumulation):
//   decode attention fp32 2e-6, bf16 / fp16 outputs NMSE <= 2e-5 (bf16 inputs carry 2^-9 relative error);
//   Eq. 3 scores fp32 1e-5 of the row maximum (tests/kernels/score_test.cc's criterion);
//   top-k, gather: exact; RoPE fp32: within 2 ulp of the pair's magnitude.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/ops.h"
#include "kernels/gather.h"
#include "kernels/prefill_attention.h"
#include "kernels/rope.h"
#include "kernels/score.h"
#include "tests/testing/status_matchers.h"

namespace echokv::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cuda::DeviceAvailable()) << "no CUDA device: the `cuda` tests need one (scripts/gpu-check.sh runs them)";
  }
  const at::Device dev_{at::kCUDA, 0};
};

at::Tensor RandN(std::vector<int64_t> sizes, uint64_t seed, double scale = 1.0) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randn(sizes, gen, at::TensorOptions().dtype(at::kFloat)) * scale;
}

void Sync() {
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// NaN in every element (all bits set is a NaN for fp32, bf16 and fp16).
void Poison(at::Tensor& t) { ASSERT_EQ(cudaMemset(t.data_ptr(), 0xff, t.nbytes()), cudaSuccess); }

double MaxRel(const at::Tensor& got, const at::Tensor& want) {
  at::Tensor g = got.to(at::kCPU, at::kDouble), w = want.to(at::kCPU, at::kDouble);
  const double scale = std::max(w.abs().max().item<double>(), 1e-30);
  return (g - w).abs().max().item<double>() / scale;
}

double Nmse(const at::Tensor& got, const at::Tensor& want) {
  at::Tensor g = got.to(at::kCPU, at::kDouble), w = want.to(at::kCPU, at::kDouble);
  return (g - w).pow(2).sum().item<double>() / std::max(w.pow(2).sum().item<double>(), 1e-300);
}

// ---- decode attention ----

// One query row over one session's cache, float64: q [H, d], k, v [G, n, d], kpos [G, n];
// lengths[g] entries of group g; window > 0 masks keys qpos - kp >= window.
at::Tensor DecodeReference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& kpos,
                           int64_t qpos, int64_t window, const std::vector<int64_t>& lengths) {
  const int64_t H = q.size(0), d = q.size(1), G = k.size(0), r = H / G;
  at::Tensor out = at::zeros({H, d}, at::kDouble);
  at::Tensor qd = q.to(at::kDouble), kd = k.to(at::kDouble), vd = v.to(at::kDouble);
  for (int64_t h = 0; h < H; ++h) {
    const int64_t g = h / r, n = lengths[g];
    if (n == 0) continue;
    at::Tensor logits = kd[g].narrow(0, 0, n).matmul(qd[h]) / std::sqrt(static_cast<double>(d));  // [n]
    if (window > 0) {
      at::Tensor kp = kpos[g].narrow(0, 0, n);
      logits.masked_fill_((kp > qpos).logical_or(kp.neg().add(qpos) >= window), -std::numeric_limits<double>::infinity());
      if (std::isinf(logits.max().item<double>())) continue;
    }
    out[h] = at::softmax(logits, 0).matmul(vd[g].narrow(0, 0, n));
  }
  return out;
}

struct Session {
  at::Tensor k, v, kpos;  // [G, n, d] x2 (CPU float), [G, n] int64
  std::vector<int64_t> lengths;
  int64_t qpos = 0;
};

std::vector<Session> MakeSessions(int64_t G, int64_t d, const std::vector<int64_t>& ns, uint64_t seed) {
  std::vector<Session> out;
  for (size_t b = 0; b < ns.size(); ++b) {
    Session s;
    s.k = RandN({G, ns[b], d}, seed + 2 * b);
    s.v = RandN({G, ns[b], d}, seed + 2 * b + 1);
    s.kpos = (at::arange(ns[b], at::kLong) * 3).unsqueeze(0).repeat({G, 1});  // a compact cache: gaps
    s.lengths.assign(G, ns[b]);
    s.qpos = 3 * ns[b] + 2;
    out.push_back(s);
  }
  return out;
}

cuda::DecodeBatchInput ToDevice(const at::Tensor& q, const std::vector<Session>& sessions, at::ScalarType t,
                                at::Device dev) {
  cuda::DecodeBatchInput in;
  in.q = q.to(dev, t);
  for (const Session& s : sessions) {
    // Stored with room to append (capacity > n), as a compact cache is: strided views.
    const int64_t cap = s.k.size(1) + 5;
    at::Tensor kc = at::zeros({s.k.size(0), cap, s.k.size(2)}, at::TensorOptions().dtype(t).device(dev));
    at::Tensor vc = at::zeros_like(kc);
    kc.narrow(1, 0, s.k.size(1)).copy_(s.k);
    vc.narrow(1, 0, s.v.size(1)).copy_(s.v);
    in.keys.push_back(kc.narrow(1, 0, s.k.size(1)));
    in.values.push_back(vc.narrow(1, 0, s.v.size(1)));
    in.key_positions.push_back(s.kpos);
  }
  return in;
}

TEST_F(CudaKernelsTest, DecodeRaggedBatchMatchesFloat64AndTheCpuKernel) {
  struct Shape {
    int64_t H, G, d;
  };
  uint64_t seed = 100;
  for (const Shape& sh : {Shape{8, 4, 8}, Shape{4, 4, 64}, Shape{32, 8, 128}, Shape{24, 8, 64}, Shape{16, 1, 64},
                          Shape{4, 2, 256}}) {
    const std::vector<int64_t> ns = {0, 1, 37, 513, 2100};  // ragged, across the 512-key splits
    std::vector<Session> sessions = MakeSessions(sh.G, sh.d, ns, seed);
    at::Tensor q = RandN({static_cast<int64_t>(ns.size()), sh.H, sh.d}, seed + 99, 1.5);
    seed += 10;
    auto got = cuda::DecodeAttentionBatch(ToDevice(q, sessions, at::kFloat, dev_));
    ASSERT_OK(got);
    Sync();
    for (size_t b = 0; b < ns.size(); ++b) {
      const Session& s = sessions[b];
      at::Tensor want = DecodeReference(q[b], s.k, s.v, s.kpos, s.qpos, 0, s.lengths);
      EXPECT_LT(MaxRel((*got)[b], want), 2e-6) << "H " << sh.H << " G " << sh.G << " d " << sh.d << " n " << ns[b];
      if (ns[b] == 0) continue;
      // The CPU's fused kernel on the same row (one query at a later position).
      std::vector<const int64_t*> kp;
      at::Tensor kpos = s.kpos.contiguous();
      for (int64_t g = 0; g < sh.G; ++g) kp.push_back(kpos.data_ptr<int64_t>() + g * ns[b]);
      at::Tensor qc = q[b].contiguous(), kc = s.k.contiguous(), vc = s.v.contiguous();
      at::Tensor cpu = at::empty({sh.H, sh.d}, at::kFloat);
      CausalAttentionArgs a;
      a.num_heads = sh.H;
      a.num_kv_heads = sh.G;
      a.head_dim = sh.d;
      a.q = qc.data_ptr<float>();
      a.q_row_stride = sh.H * sh.d;
      a.q_head_stride = sh.d;
      a.m = 1;
      a.q_positions = &s.qpos;
      a.k = kc.data_ptr<float>();
      a.v = vc.data_ptr<float>();
      a.kv_group_stride = ns[b] * sh.d;
      a.n = ns[b];
      a.key_positions = kp.data();
      a.scale = 1.0f / std::sqrt(static_cast<float>(sh.d));
      a.out = cpu.data_ptr<float>();
      a.out_row_stride = sh.H * sh.d;
      a.out_head_stride = sh.d;
      CausalAttention(a, 0, CausalAttentionWorkItems(a));
      EXPECT_LT(MaxRel((*got)[b], cpu), 4e-6) << "vs the CPU kernel: H " << sh.H << " d " << sh.d << " n " << ns[b];
    }
  }
}

TEST_F(CudaKernelsTest, BatchedRaggedDecodeIsPerSessionDecodeBitForBit) {
  const int64_t H = 32, G = 8, d = 128;
  const std::vector<int64_t> ns = {3, 700, 1500, 64, 0, 511, 512, 513};
  std::vector<Session> sessions = MakeSessions(G, d, ns, 7);
  at::Tensor q = RandN({static_cast<int64_t>(ns.size()), H, d}, 8);
  for (at::ScalarType t : {at::kFloat, at::kBFloat16}) {
    auto batched = cuda::DecodeAttentionBatch(ToDevice(q, sessions, t, dev_));
    ASSERT_OK(batched);
    for (size_t b = 0; b < ns.size(); ++b) {
      auto alone = cuda::DecodeAttentionBatch(ToDevice(q.narrow(0, b, 1), {sessions[b]}, t, dev_));
      ASSERT_OK(alone);
      EXPECT_TRUE(alone->squeeze(0).equal((*batched)[b])) << "row " << b << " n " << ns[b] << " dtype " << t;
    }
    Sync();
  }
}

TEST_F(CudaKernelsTest, DecodeRaggedGroupsAndSlidingWindow) {
  const int64_t H = 8, G = 4, d = 64;
  std::vector<Session> sessions = MakeSessions(G, d, {300, 900}, 21);
  sessions[0].lengths = {300, 0, 17, 299};
  sessions[1].lengths = {1, 900, 512, 513};
  at::Tensor q = RandN({2, H, d}, 22);
  for (int64_t window : {int64_t{0}, int64_t{200}}) {
    cuda::DecodeBatchInput in = ToDevice(q, sessions, at::kFloat, dev_);
    in.group_lengths = at::tensor(std::vector<int64_t>{300, 0, 17, 299, 1, 900, 512, 513}, at::kLong).view({2, G});
    in.window = window;
    in.q_positions = at::tensor(std::vector<int64_t>{sessions[0].qpos, sessions[1].qpos}, at::kLong);
    auto got = cuda::DecodeAttentionBatch(in);
    ASSERT_OK(got);
    for (int b = 0; b < 2; ++b) {
      const Session& s = sessions[b];
      at::Tensor want = DecodeReference(q[b], s.k, s.v, s.kpos, s.qpos, window, s.lengths);
      EXPECT_LT(MaxRel((*got)[b], want), 2e-6) << "row " << b << " window " << window;
    }
  }
  Sync();
}

TEST_F(CudaKernelsTest, DecodeBf16Fp16WithinNmseBound) {
  const int64_t H = 32, G = 8, d = 128;
  const std::vector<int64_t> ns = {1000, 4096, 77};
  std::vector<Session> sessions = MakeSessions(G, d, ns, 31);
  at::Tensor q = RandN({3, H, d}, 32);
  for (at::ScalarType t : {at::kBFloat16, at::kHalf}) {
    // The reference sees the rounded inputs.
    std::vector<Session> rounded = sessions;
    for (Session& s : rounded) {
      s.k = s.k.to(t).to(at::kFloat);
      s.v = s.v.to(t).to(at::kFloat);
    }
    at::Tensor qr = q.to(t).to(at::kFloat);
    auto got = cuda::DecodeAttentionBatch(ToDevice(qr, rounded, t, dev_));
    ASSERT_OK(got);
    for (size_t b = 0; b < ns.size(); ++b) {
      const Session& s = rounded[b];
      at::Tensor want = DecodeReference(qr[b], s.k, s.v, s.kpos, s.qpos, 0, s.lengths);
      EXPECT_LT(Nmse((*got)[b], want), 2e-5) << "dtype " << t << " n " << ns[b];
    }
  }
  Sync();
}

TEST_F(CudaKernelsTest, DecodeLauncherWritesEveryElementAndRepeatsItsBits) {
  const int64_t H = 16, G = 4, d = 64;
  const std::vector<int64_t> ns = {0, 5, 1030};
  std::vector<Session> sessions = MakeSessions(G, d, ns, 41);
  at::Tensor q = RandN({3, H, d}, 42).to(dev_);
  std::vector<cuda::KvSpan> spans;
  std::vector<at::Tensor> keep;
  for (const Session& s : sessions) {
    at::Tensor k = s.k.to(dev_).contiguous(), v = s.v.to(dev_).contiguous();
    keep.push_back(k);
    keep.push_back(v);
    for (int64_t g = 0; g < G; ++g) {
      cuda::KvSpan sp;
      sp.k = k.data_ptr<float>() + g * k.size(1) * d;
      sp.v = v.data_ptr<float>() + g * v.size(1) * d;
      sp.n = k.size(1);
      sp.row_stride = d;
      spans.push_back(sp);
    }
  }
  at::Tensor spans_dev = at::empty({static_cast<int64_t>(spans.size() * sizeof(cuda::KvSpan))},
                                   at::TensorOptions().dtype(at::kByte).device(dev_));
  ASSERT_EQ(cudaMemcpy(spans_dev.data_ptr(), spans.data(), spans_dev.nbytes(), cudaMemcpyHostToDevice), cudaSuccess);
  cuda::DecodeAttentionParams p;
  p.batch = 3;
  p.num_heads = H;
  p.num_kv_heads = G;
  p.head_dim = d;
  p.q = q.data_ptr();
  p.spans = static_cast<const cuda::KvSpan*>(spans_dev.data_ptr());
  p.scale = 0.125f;
  p.max_n = 1030;
  at::Tensor ws = at::empty({cuda::DecodeAttentionWorkspaceFloats(p)}, q.options());
  p.workspace = ws.data_ptr<float>();
  at::Tensor first;
  for (int run = 0; run < 2; ++run) {
    at::Tensor out = at::empty_like(q);
    Poison(out);
    Poison(ws);
    p.out = out.data_ptr();
    ASSERT_EQ(cuda::LaunchDecodeAttention(p, nullptr), cudaSuccess);
    Sync();
    EXPECT_FALSE(out.isnan().any().item<bool>()) << "run " << run << ": an element was not written";
    EXPECT_TRUE(out[0].eq(0).all().item<bool>()) << "an empty span gives zeros";
    if (run == 0) first = out.clone();
    else EXPECT_TRUE(out.equal(first)) << "the second run gave other bits";
  }
  p.head_dim = 300;  // bad parameters are refused, not launched
  EXPECT_EQ(cuda::LaunchDecodeAttention(p, nullptr), cudaErrorInvalidValue);
}

TEST_F(CudaKernelsTest, DecodeBadInputIsAnError) {
  std::vector<Session> sessions = MakeSessions(4, 16, {10}, 51);
  at::Tensor q = RandN({1, 8, 16}, 52);
  cuda::DecodeBatchInput in = ToDevice(q, sessions, at::kFloat, dev_);
  in.keys.clear();
  EXPECT_THAT(cuda::DecodeAttentionBatch(in), testing::StatusIs(absl::StatusCode::kInvalidArgument, "keys"));
  in = ToDevice(q, sessions, at::kFloat, dev_);
  in.group_lengths = at::tensor(std::vector<int64_t>{1, 2, 3, 11}, at::kLong).view({1, 4});
  EXPECT_THAT(cuda::DecodeAttentionBatch(in), testing::StatusIs(absl::StatusCode::kInvalidArgument, "group_lengths"));
  in = ToDevice(q, sessions, at::kFloat, dev_);
  in.values[0] = in.values[0].to(at::kHalf);
  EXPECT_THAT(cuda::DecodeAttentionBatch(in), testing::StatusIs(absl::StatusCode::kInvalidArgument, "dtype"));
  in = ToDevice(q, sessions, at::kFloat, dev_);
  in.q = in.q.cpu();
  EXPECT_THAT(cuda::DecodeAttentionBatch(in), testing::StatusIs(absl::StatusCode::kInvalidArgument, "CUDA"));
}

// ---- Eq. 3 scores ----

TEST_F(CudaKernelsTest, ScoresMatchTheCpuKernelCausalAndNot) {
  struct Case {
    int64_t H, G, nq, L, d;
    bool causal;
  };
  uint64_t seed = 200;
  for (const Case& c : {Case{8, 4, 1, 1, 8, false}, Case{8, 4, 32, 1000, 8, true}, Case{32, 8, 8, 5000, 128, false},
                        Case{32, 8, 32, 3000, 128, true}, Case{4, 2, 33, 33, 64, true}, Case{4, 4, 200, 200, 16, true},
                        Case{8, 2, 5, 700, 256, false}}) {
    at::Tensor queries = RandN({c.H, c.nq, c.d}, seed++, 2.0);
    at::Tensor keys = RandN({c.G, c.L, c.d}, seed++);
    ScoreOptions so;
    if (c.causal) {
      // Queries at the last nq positions; group g keeps positions with group-specific gaps.
      std::vector<int64_t> qpos;
      for (int64_t i = 0; i < c.nq; ++i) qpos.push_back(2 * c.L - c.nq + i);
      so.query_positions = at::tensor(qpos, at::kLong);
      at::Tensor kp = at::empty({c.G, c.L}, at::kLong);
      for (int64_t g = 0; g < c.G; ++g) kp[g] = at::arange(c.L, at::kLong) * 2 - (g % 2) * 7;
      so.key_positions = kp;
    }
    at::Tensor want = AttentionScores(queries, keys, so);  // CPU
    auto got = cuda::AttentionScores(queries.to(dev_), keys.to(dev_), so);
    ASSERT_OK(got);
    auto again = cuda::AttentionScores(queries.to(dev_), keys.to(dev_), so);
    ASSERT_OK(again);
    Sync();
    EXPECT_TRUE(got->equal(*again)) << "two runs gave other bits";
    for (int64_t h = 0; h < c.H; ++h) {
      EXPECT_LT(MaxRel((*got)[h], want[h]), 1e-5) << "H " << c.H << " nq " << c.nq << " L " << c.L << " d " << c.d
                                                  << " causal " << c.causal << " head " << h;
    }
  }
}

TEST_F(CudaKernelsTest, ScoresH2oColumnSumsAndBf16Keys) {
  // H2O: every context query, causal, diagonal included.
  const int64_t H = 8, G = 2, L = 777, d = 64;
  at::Tensor q = RandN({H, L, d}, 301);
  at::Tensor k = RandN({G, L, d}, 302);
  at::Tensor pos = at::arange(L, at::kLong);
  at::Tensor want = CausalColumnSums(q, pos, k, pos.unsqueeze(0).repeat({G, 1}));
  ScoreOptions so;
  so.query_positions = pos;
  so.key_positions = pos.unsqueeze(0).repeat({G, 1});
  auto got = cuda::AttentionScores(q.to(dev_), k.to(dev_), so);
  ASSERT_OK(got);
  EXPECT_LT(MaxRel(*got, want), 1e-5);
  // bf16 keys: against the CPU on the rounded keys.
  at::Tensor kb = k.to(at::kBFloat16);
  at::Tensor want_b = AttentionScores(q.narrow(1, L - 16, 16), kb.to(at::kFloat), ScoreOptions());
  auto got_b = cuda::AttentionScores(q.narrow(1, L - 16, 16).to(dev_), kb.to(dev_), ScoreOptions());
  ASSERT_OK(got_b);
  EXPECT_LT(MaxRel(*got_b, want_b), 1e-5);
  Sync();
}

TEST_F(CudaKernelsTest, ScoreLauncherWritesEveryElement) {
  const int64_t H = 4, G = 2, nq = 9, L = 2500, d = 32;
  at::Tensor q = RandN({H, nq, d}, 311).to(dev_);
  at::Tensor k = RandN({G, L, d}, 312).to(dev_);
  cuda::ScoreParams p;
  p.num_heads = H;
  p.num_kv_heads = G;
  p.head_dim = d;
  p.num_queries = nq;
  p.num_keys = L;
  p.queries = q.data_ptr<float>();
  p.keys = k.data_ptr();
  p.key_row_stride = d;
  p.key_group_stride = L * d;
  p.scale = 0.2f;
  at::Tensor ws = at::empty({cuda::ScoreWorkspaceFloats(p)}, q.options());
  p.workspace = ws.data_ptr<float>();
  at::Tensor first;
  for (int run = 0; run < 2; ++run) {
    at::Tensor out = at::empty({H, L}, q.options());
    Poison(out);
    Poison(ws);
    p.out = out.data_ptr<float>();
    ASSERT_EQ(cuda::LaunchAttentionScores(p, nullptr), cudaSuccess);
    Sync();
    EXPECT_FALSE(out.isnan().any().item<bool>());
    // Each query's probabilities sum to 1: every head's row sums to nq.
    EXPECT_LT((out.sum(1) - nq).abs().max().item<float>(), 1e-3f);
    if (run == 0) first = out.clone();
    else EXPECT_TRUE(out.equal(first));
  }
}

// ---- top-k ----

TEST_F(CudaKernelsTest, TopKMatchesTopKIndicesExactly) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::vector<float>> rows = {{1, 1, 1, 1, 1, 1, 1, 1},
                                          {5, 3, 3, 3, 1, 3, 0, 3},
                                          {-kInf, kInf, -kInf, 2, kInf, -1, 0, -kInf},
                                          {0.0f, -0.0f, -0.0f, 0.0f, -1e-45f, 1e-45f, 0, 0},
                                          {nan, 1, nan, -kInf, 0, nan, -kInf, 2}};
  for (size_t r = 0; r < rows.size(); ++r) {
    at::Tensor s = at::tensor(rows[r], at::kFloat).unsqueeze(0);
    for (int64_t k = 0; k <= 9; ++k) {
      auto got = cuda::TopKIndices(s.to(dev_), k);
      ASSERT_OK(got);
      EXPECT_TRUE(got->cpu().equal(TopKIndices(s, k))) << "row " << r << " k " << k;
    }
  }
  // Long rows with many exact ties (coarse values), several rows, k up to 1024.
  std::mt19937 rng(61);
  std::uniform_int_distribution<int> coarse(-50, 50);
  for (int64_t n : {int64_t{1000}, int64_t{131072}}) {
    std::vector<float> v(3 * n);
    for (float& x : v) x = static_cast<float>(coarse(rng)) / 8.0f;
    v[17] = nan;
    at::Tensor s = at::tensor(v, at::kFloat).view({3, n});
    for (int64_t k : {int64_t{1}, int64_t{256}, int64_t{1024}, n - 1}) {
      auto got = cuda::TopKIndices(s.to(dev_), k);
      ASSERT_OK(got);
      EXPECT_TRUE(got->cpu().equal(TopKIndices(s, k))) << "n " << n << " k " << k;
    }
  }
  Sync();
}

// ---- gather ----

TEST_F(CudaKernelsTest, GatherKvIsGatherEntriesBitForBit) {
  const int64_t G = 4, L = 300, d = 64, n = 77, cap = 100;
  for (at::ScalarType t : {at::kFloat, at::kBFloat16}) {
    at::Tensor k = RandN({G, L, d}, 71).to(t), v = RandN({G, L, d}, 72).to(t);
    at::Tensor pos = (at::arange(L, at::kLong) * 5).unsqueeze(0).repeat({G, 1});
    at::Tensor idx = at::empty({G, n}, at::kLong);
    for (int64_t g = 0; g < G; ++g) idx[g] = std::get<0>(at::sort(at::randperm(L, at::kLong).narrow(0, 0, n)));
    auto got = cuda::GatherKv(k.to(dev_), v.to(dev_), pos, idx, cap);
    ASSERT_OK(got);
    Sync();
    EXPECT_EQ(got->k.size(1), cap);
    EXPECT_TRUE(got->k.narrow(1, 0, n).cpu().equal(GatherEntries(k, idx)));
    EXPECT_TRUE(got->v.narrow(1, 0, n).cpu().equal(GatherEntries(v, idx)));
    EXPECT_TRUE(got->positions.cpu().equal(at::gather(pos, 1, idx)));
  }
  at::Tensor k = RandN({2, 10, 8}, 73).to(dev_);
  at::Tensor bad = at::tensor(std::vector<int64_t>{0, 10}, at::kLong).view({1, 2}).repeat({2, 1});
  EXPECT_THAT(cuda::GatherKv(k, k, at::zeros({2, 10}, at::kLong), bad, 4),
              testing::StatusIs(absl::StatusCode::kInvalidArgument, "outside"));
}

// ---- RoPE ----

TEST_F(CudaKernelsTest, RopeAtPositionsMatchesApplyRope) {
  const int64_t d = 128;
  at::Tensor inv = RopeInvFreq(d, 500000.0);
  // Prefill layout [H, m, d] at m positions; decode layout [B, H, d] at B positions.
  const std::vector<int64_t> pos = {0, 5, 1000, 131071, 77};
  at::Tensor x = RandN({8, 5, d}, 81, 3.0);
  at::Tensor want = ApplyRope(x, pos, inv);
  auto got = cuda::RopeAtPositions(x.to(dev_), at::tensor(pos, at::kLong), 1, inv);
  ASSERT_OK(got);
  EXPECT_LT(MaxRel(*got, want), 2.5e-7);
  at::Tensor rows = RandN({5, 8, d}, 82, 3.0);  // [B, H, d]: row b at pos[b]
  at::Tensor ref = at::empty_like(rows);
  for (int64_t b = 0; b < 5; ++b) ref[b] = ApplyRope(rows[b].unsqueeze(1), {pos[b]}, inv).squeeze(1);
  auto got_rows = cuda::RopeAtPositions(rows.to(dev_), at::tensor(pos, at::kLong), 8, inv);
  ASSERT_OK(got_rows);
  EXPECT_LT(MaxRel(*got_rows, ref), 2.5e-7);
  auto got_bf16 = cuda::RopeAtPositions(x.to(dev_, at::kBFloat16), at::tensor(pos, at::kLong), 1, inv);
  ASSERT_OK(got_bf16);
  EXPECT_LT(MaxRel(got_bf16->to(at::kFloat), ApplyRope(x.to(at::kBFloat16), pos, inv).to(at::kFloat)), 8e-3);
  Sync();
}

// ---- prefill attention through SDPA's fused backends ----

TEST_F(CudaKernelsTest, ChunkAttentionOnFlashAndEfficientBackends) {
  const int64_t H = 32, G = 8, d = 64, m = 128, old = 1000;
  at::Tensor q = RandN({H, m, d}, 91), k = RandN({G, old + m, d}, 92), v = RandN({G, old + m, d}, 93);
  // The CPU reference path of the same function (tests/kernels/prefill_attention_test.cc
  // checks it against the fused CPU kernel).
  auto want = ChunkAttention(q.to(at::kDouble), k.to(at::kDouble), v.to(at::kDouble));
  ASSERT_OK(want);
  EXPECT_EQ(ChunkAttentionBackend(q.to(dev_)), "efficient");
  auto f32 = ChunkAttention(q.to(dev_), k.to(dev_), v.to(dev_));
  ASSERT_OK(f32);
  EXPECT_LT(MaxRel(*f32, *want), 1e-5);
  EXPECT_EQ(ChunkAttentionBackend(q.to(dev_, at::kBFloat16)), "flash");
  at::Tensor qb = q.to(at::kBFloat16), kb = k.to(at::kBFloat16), vb = v.to(at::kBFloat16);
  auto want_b = ChunkAttention(qb.to(at::kDouble), kb.to(at::kDouble), vb.to(at::kDouble));
  ASSERT_OK(want_b);
  auto b16 = ChunkAttention(qb.to(dev_), kb.to(dev_), vb.to(dev_));
  ASSERT_OK(b16);
  EXPECT_LT(Nmse(*b16, *want_b), 2e-5);
  Sync();
}

}  // namespace
}  // namespace echokv::kernels
