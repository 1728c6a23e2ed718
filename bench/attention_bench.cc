// echokv-bench-attention: the fused causal prefill attention kernel (kernels/attention.h)
// per instruction set, against the unfused ATen composition the model used before it
// (bmm -> scale -> masked_fill -> softmax -> bmm per block of queries), on one prefill
// chunk of m new tokens against a history of L tokens, in one run. Prints ms per call and
// GFLOP/s (4 m L' d H flops, L' = keys visible on average; the causal half of the chunk
// counted exactly).
//
//   build/bin/echokv-bench-attention                 # 40M shape, L = 512, 2048, 8192, 1 and 2 threads
//   build/bin/echokv-bench-attention --iters 5 --shape stories|40m|7b
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

}  // namespace

int main(int argc, char** argv) {
  int iters = 3;
  std::string shape_name = "40m";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--iters" && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else if (a == "--shape" && i + 1 < argc) {
      shape_name = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--iters N] [--shape stories|40m|7b]\n", argv[0]);
      return 2;
    }
  }
  if (iters < 1) {
    std::fprintf(stderr, "--iters must be >= 1\n");
    return 2;
  }
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
