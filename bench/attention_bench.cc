// echokv-bench-attention: the fused causal prefill attention kernel (kernels/attention.h)
// per instruction set, against the unfused ATen composition the model used before it
// (bmm -> scale -> masked_fill -> softmax -> bmm per block of queries), on one prefill
// chunk of m new tokens against a history of L tokens, in one run. Prints ms per call and
// GFLOP/s (4 m L' d H flops, L' = keys visible on average; the causal half of the chunk
// counted exactly).
//
//   build/bin/echokv-bench-attention                 # 40M shape, L = 512, 2048, 8192, 1 and 2 threads
//   build/bin/echokv-bench-attention --iters 5 --shape stories|40m|7b
//
// --decode: decode attention (one query per head) over int8 caches
// (kernels/attention_int8.h) against float32 caches, see RunDecode below.
//   build/bin/echokv-bench-attention --decode [--rounds 5] [--shape smollm2|7b]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "kernels/attention.h"
#include "kernels/attention_int8.h"
#include "kernels/kv_quant.h"
#include "kernels/softmax.h"
#include "kernels/vec16.h"
#include "kernels/weighted_sum.h"

namespace {

struct Shape {
  const char* name;
  int64_t H, G, d;
};

double MillisecondsPerCall(int iters, const std::function<void()>& fn) {
  fn();  // warm-up
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    const std::chrono::duration<double, std::milli> e = std::chrono::steady_clock::now() - start;
    best = std::min(best, e.count());
  }
  return best;
}


// ---- Decode attention: int8 against float32 caches (issue 31) ----
//
// One "token" is one decode step's attention in every layer of the shape (each layer its
// own cache, so the caches are read from memory as in a real decode, not from a cache
// level the previous layer warmed), one thread. float32: the CPU decode path's loops
// (AttendGroup in model/decode_cpu.cc at 48b0d15, copied below: scores per 64-key block
// and head, kernels/softmax.h, the weighted sum); int8: DecodeAttentionInt8. Rounds are
// paired and interleaved (int8 then float32, then the other order), each the best of
// --iters tokens; the load average is printed per round.

// Copied from model/decode_cpu.cc (ScoreRowsFixed / ScoreRows for d = 64 and 128).
template <int kDim>
__attribute__((always_inline)) inline void F32ScoreRowsFixed(const float* q, const float* keys, int64_t n,
                                                             float scale, float* scores) {
  using echokv::kernels::vec16::V16;
  constexpr int kVecs = kDim / 16, kKeys = 4;
  V16 qv[kVecs];
  for (int i = 0; i < kVecs; ++i) qv[i] = echokv::kernels::vec16::Load(q + 16 * i);
  int64_t j = 0;
  for (; j + kKeys <= n; j += kKeys) {
    V16 acc[kKeys] = {};
    for (int i = 0; i < kVecs; ++i) {
      for (int t = 0; t < kKeys; ++t) acc[t] += qv[i] * echokv::kernels::vec16::Load(keys + (j + t) * kDim + 16 * i);
    }
    for (int t = 0; t < kKeys; ++t) scores[j + t] = echokv::kernels::vec16::Reduce(acc[t]) * scale;
  }
  for (; j < n; ++j) {
    V16 acc = {};
    for (int i = 0; i < kVecs; ++i) acc += qv[i] * echokv::kernels::vec16::Load(keys + j * kDim + 16 * i);
    scores[j] = echokv::kernels::vec16::Reduce(acc) * scale;
  }
}

__attribute__((target_clones("default", "arch=haswell", "arch=x86-64-v4"))) void F32ScoreRows(
    const float* q, const float* keys, int64_t n, int64_t d, float scale, float* scores) {
  if (d == 64) return F32ScoreRowsFixed<64>(q, keys, n, scale, scores);
  return F32ScoreRowsFixed<128>(q, keys, n, scale, scores);
}

// Copied from model/decode_cpu.cc (WeightedSumRows: d = 64 here, d = 128 in kernels/).
__attribute__((target_clones("default", "arch=haswell", "arch=x86-64-v4"))) void F32WeightedSumRows(
    const float* p, const float* values, int64_t n, int64_t d, float* out) {
  if (echokv::kernels::WeightedSumRowsChainsHandles(d)) {
    return echokv::kernels::WeightedSumRowsChains(p, values, n, d, out);
  }
  float acc[64] = {};
  for (int64_t j = 0; j < n; ++j) {
    const float w = p[j];
    const float* v = values + j * 64;
    for (int i = 0; i < 64; ++i) acc[i] += w * v[i];
  }
  for (int i = 0; i < 64; ++i) out[i] = acc[i];
}

// AttendGroup's float32 loop for every group of one layer (no window).
void F32DecodeAttention(int64_t H, int64_t G, int64_t d, int64_t n, const float* q, const float* k, const float* v,
                        float* out, std::vector<float>& scores) {
  const int64_t r = H / G;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  scores.resize(r * n);
  for (int64_t g = 0; g < G; ++g) {
    const float* keys = k + g * n * d;
    const float* values = v + g * n * d;
    for (int64_t j0 = 0; j0 < n; j0 += 64) {
      const int64_t m = std::min<int64_t>(64, n - j0);
      for (int64_t h = 0; h < r; ++h) {
        F32ScoreRows(q + (g * r + h) * d, keys + j0 * d, m, d, scale, scores.data() + h * n + j0);
      }
    }
    for (int64_t h = 0; h < r; ++h) {
      float* s = scores.data() + h * n;
      const float mx = echokv::kernels::MaxOf(s, n);
      const float den = echokv::kernels::ExpShiftSum(s, n, mx);
      echokv::kernels::ScaleInPlace(s, n, 1.0f / den);
      F32WeightedSumRows(s, values, n, d, out + (g * r + h) * d);
    }
  }
}

int RunDecode(const std::string& shape_name, int rounds, int iters) {
  struct DecodeShape {
    const char* name;
    int64_t H, G, d, layers;
  };
  const DecodeShape shapes[] = {{"smollm2", 9, 3, 64, 30}, {"7b", 32, 8, 128, 8}};
  const DecodeShape* shape = nullptr;
  for (const DecodeShape& s : shapes) {
    if (shape_name == s.name) shape = &s;
  }
  if (shape == nullptr) {
    std::fprintf(stderr, "--decode --shape: unknown '%s' (smollm2, 7b)\n", shape_name.c_str());
    return 2;
  }
  const int64_t H = shape->H, G = shape->G, d = shape->d, layers = shape->layers;
  using echokv::kernels::KvDtype;
  using echokv::kernels::KvEntryBytes;
  std::printf("decode attention, shape %s (H %ld, G %ld, d %ld, %ld layers, one cache each), 1 thread, "
              "int8 isa %s; bytes per entry (key + value, one group): float32 %ld, int8 %ld (%.3fx)\n",
              shape->name, H, G, d, layers, echokv::kernels::DecodeAttentionInt8Isa().c_str(),
              KvEntryBytes(KvDtype::kFloat32, d), KvEntryBytes(KvDtype::kInt8, d),
              static_cast<double>(KvEntryBytes(KvDtype::kInt8, d)) / KvEntryBytes(KvDtype::kFloat32, d));
  // int8: keys per token; int8-pc: keys per channel block of 64. x: speed-up over float32.
  std::printf("%-6s %-5s %8s %12s %12s %12s %10s %10s %7s %7s\n", "n", "round", "load1", "f32 us/tok", "int8 us/tok",
              "int8-pc us", "f32 tok/s", "int8 tok/s", "x int8", "x pc");
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (int64_t n : {512, 2048, 8192}) {
    std::vector<std::vector<float>> k(layers), v(layers);
    std::vector<std::vector<int8_t>> kq(layers), vq(layers);
    std::vector<std::vector<float>> ks(layers), vs(layers);
    // Keys per channel block (Int8KeyScaling::kPerChannelBlock), the same values.
    const int64_t blocks = (n + echokv::kernels::kInt8KeyBlock - 1) / echokv::kernels::kInt8KeyBlock;
    std::vector<std::vector<int8_t>> kc(layers);
    std::vector<std::vector<float>> kcs(layers);
    for (int64_t l = 0; l < layers; ++l) {
      k[l].resize(G * n * d);
      v[l].resize(G * n * d);
      for (int64_t i = 0; i < G * n * d; ++i) {
        k[l][i] = normal(rng) * ((i % d) % 13 == 5 ? 10.0f : 1.0f);
        v[l][i] = normal(rng);
      }
      kq[l].resize(G * n * d);
      vq[l].resize(G * n * d);
      ks[l].resize(G * n);
      vs[l].resize(G * n);
      echokv::kernels::QuantizeRowsInt8(k[l].data(), G * n, d, kq[l].data(), ks[l].data());
      echokv::kernels::QuantizeRowsInt8(v[l].data(), G * n, d, vq[l].data(), vs[l].data());
      kc[l].resize(G * n * d);
      kcs[l].resize(G * blocks * d);
      for (int64_t g = 0; g < G; ++g) {
        echokv::kernels::QuantizeChannelBlocksInt8(k[l].data() + g * n * d, n, d, echokv::kernels::kInt8KeyBlock,
                                                   kc[l].data() + g * n * d, kcs[l].data() + g * blocks * d);
      }
    }
    std::vector<float> q(H * d), out(H * d), scores;
    for (float& x : q) x = normal(rng);
    auto f32_token = [&] {
      for (int64_t l = 0; l < layers; ++l) {
        F32DecodeAttention(H, G, d, n, q.data(), k[l].data(), v[l].data(), out.data(), scores);
      }
    };
    auto int8_token = [&](bool per_channel) {
      for (int64_t l = 0; l < layers; ++l) {
        echokv::kernels::DecodeAttentionInt8Args a;
        if (per_channel) a.key_scaling = echokv::kernels::Int8KeyScaling::kPerChannelBlock;
        a.num_heads = H;
        a.num_kv_heads = G;
        a.head_dim = d;
        a.q = q.data();
        a.q_head_stride = d;
        a.q_position = n;
        a.k = per_channel ? kc[l].data() : kq[l].data();
        a.k_scales = per_channel ? kcs[l].data() : ks[l].data();
        a.v = vq[l].data();
        a.v_scales = vs[l].data();
        a.kv_group_stride = n * d;
        a.k_scale_group_stride = per_channel ? blocks * d : n;
        a.v_scale_group_stride = n;
        a.n = n;
        a.scale = 1.0f / std::sqrt(static_cast<float>(d));
        a.out = out.data();
        a.out_head_stride = d;
        echokv::kernels::DecodeAttentionInt8(a, 0, echokv::kernels::DecodeAttentionInt8WorkItems(a));
      }
    };
    for (int round = 0; round < rounds; ++round) {
      const double load = echokv::bench::LoadAverage1();
      double f32 = 0, i8 = 0, pc = 0;
      const auto per_token = [&] { int8_token(false); };
      const auto per_channel = [&] { int8_token(true); };
      if (round % 2 == 0) {
        i8 = MillisecondsPerCall(iters, per_token);
        pc = MillisecondsPerCall(iters, per_channel);
        f32 = MillisecondsPerCall(iters, f32_token);
      } else {
        f32 = MillisecondsPerCall(iters, f32_token);
        pc = MillisecondsPerCall(iters, per_channel);
        i8 = MillisecondsPerCall(iters, per_token);
      }
      std::printf("%-6ld %-5d %8.2f %12.1f %12.1f %12.1f %10.1f %10.1f %7.2f %7.2f\n", n, round, load, f32 * 1e3,
                  i8 * 1e3, pc * 1e3, 1e3 / f32, 1e3 / i8, f32 / i8, f32 / pc);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 3, rounds = 5;
  bool decode = false;
  std::string shape_name = "40m";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--decode") {
      decode = true;
      if (shape_name == "40m") shape_name = "smollm2";
    } else if (a == "--rounds" && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else if (a == "--iters" && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else if (a == "--shape" && i + 1 < argc) {
      shape_name = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--iters N] [--shape stories|40m|7b] | --decode [--rounds N] [--shape smollm2|7b]\n",
                   argv[0]);
      return 2;
    }
  }
  if (iters < 1) {
    std::fprintf(stderr, "--iters must be >= 1\n");
    return 2;
  }
  if (decode) return RunDecode(shape_name, rounds, iters);
  const Shape shapes[] = {{"stories", 8, 4, 8}, {"40m", 8, 4, 64}, {"7b", 32, 8, 128}};
  const Shape* shape = nullptr;
  for (const Shape& s : shapes) {
    if (shape_name == s.name) shape = &s;
  }
  if (shape == nullptr) {
    std::fprintf(stderr, "--shape: unknown '%s' (stories, 40m, 7b)\n", shape_name.c_str());
    return 2;
  }
  const int64_t H = shape->H, G = shape->G, d = shape->d, m = 256;
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  std::printf("fused causal attention, shape %s (H %ld, G %ld, d %ld), chunk m = %ld; OPENBLAS_CORETYPE=%s; "
              "best of %d; load1 %.2f\n",
              shape->name, H, G, d, m, coretype ? coretype : "(unset)", iters, echokv::bench::LoadAverage1());
  std::printf("%-7s %-3s %-12s %10s %10s\n", "L", "thr", "impl", "ms", "GFLOP/s");
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (int64_t L : {512, 2048, 8192}) {
    const int64_t n = L + m;
    std::vector<float> q(m * H * d), k(G * n * d), v(G * n * d), out(m * H * d);
    for (float& x : q) x = normal(rng);
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    std::vector<int64_t> kp(n), qp(m);
    for (int64_t j = 0; j < n; ++j) kp[j] = j;
    for (int64_t i = 0; i < m; ++i) qp[i] = L + i;
    std::vector<const int64_t*> kpos(G, kp.data());
    echokv::kernels::CausalAttentionArgs a;
    a.num_heads = H;
    a.num_kv_heads = G;
    a.head_dim = d;
    a.q = q.data();
    a.q_row_stride = H * d;
    a.q_head_stride = d;
    a.m = m;
    a.q_positions = qp.data();
    a.k = k.data();
    a.v = v.data();
    a.kv_group_stride = n * d;
    a.n = n;
    a.key_positions = kpos.data();
    a.scale = 1.0f / std::sqrt(static_cast<float>(d));
    a.out = out.data();
    a.out_row_stride = H * d;
    a.out_head_stride = d;
    const double visible = static_cast<double>(m) * L + m * (m + 1) / 2.0;
    const double gflop = 4.0 * visible * d * H / 1e9;
    const int64_t items = echokv::kernels::CausalAttentionWorkItems(a);
    for (int threads : {1, 2}) {
      for (const char* isa : {"avx512", "avx2", "scalar"}) {
        if (!echokv::kernels::SetAttentionIsa(isa)) continue;
        const double ms = MillisecondsPerCall(iters, [&] {
          std::vector<std::thread> pool;
          for (int t = 0; t < threads; ++t) {
            pool.emplace_back([&, t] {
              echokv::kernels::CausalAttention(a, items * t / threads, items * (t + 1) / threads);
            });
          }
          for (auto& th : pool) th.join();
        });
        std::printf("%-7ld %-3d fused-%-6s %10.2f %10.1f\n", L, threads, isa, ms, gflop / (ms / 1e3));
      }
      echokv::kernels::SetAttentionIsa("auto");
      // The ATen composition (what Transformer::Forward ran before): OpenMP threads for
      // the elementwise ops, the BLAS for bmm; scores for a block of queries at once.
      at::set_num_threads(threads);
      at::Tensor qt = at::from_blob(q.data(), {m, H, d}).transpose(0, 1).reshape({G, (H / G) * m, d});
      at::Tensor kt = at::from_blob(k.data(), {G, n, d}).transpose(1, 2);
      at::Tensor vt = at::from_blob(v.data(), {G, n, d});
      at::Tensor qpos = at::from_blob(qp.data(), {1, m, 1}, at::kLong);
      at::Tensor kpos_t = at::from_blob(kp.data(), {1, 1, n}, at::kLong);
      const double ms = MillisecondsPerCall(iters, [&] {
        at::Tensor scores = at::bmm(qt, kt).mul_(a.scale);
        at::Tensor allowed = (kpos_t <= qpos).unsqueeze(1).expand({G, H / G, m, n}).reshape({G, (H / G) * m, n});
        scores.masked_fill_(allowed.logical_not(), -std::numeric_limits<float>::infinity());
        at::Tensor o = at::bmm(at::softmax(scores, -1), vt);
        (void)o;
      });
      std::printf("%-7ld %-3d %-12s %10.2f %10.1f\n", L, threads, "aten", ms, gflop / (ms / 1e3));
    }
  }
  return 0;
}
