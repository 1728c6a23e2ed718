// echokv-bench-kernels: CPU throughput of the Eq. 3 scoring kernel (AttentionScores)
// at Llama-8B-like shapes (H=32, G=8, d=128, nq=64) for L = 4096 and 16384, plus
// TopKIndices on the group sums. Prints milliseconds per call. Then decode attention's
// weighted sum of value rows (kernels/weighted_sum.h) at head dims 8 and 128, its
// portable and AVX-512 builds side by side (the same bits; before the AVX-512 build,
// decode ran the portable loop on every CPU).
//
//   build/bin/echokv-bench-kernels            # 3 timed calls per shape
//   build/bin/echokv-bench-kernels 10         # 10 timed calls per shape
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "kernels/score.h"
#include "kernels/weighted_sum.h"

namespace {

double MillisecondsPerCall(int iters, const std::function<void()>& fn) {
  fn();  // warm-up (allocator, thread pool)
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) fn();
  const std::chrono::duration<double, std::milli> elapsed =
      std::chrono::steady_clock::now() - start;
  return elapsed.count() / iters;
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 3;
  if (argc > 1) {
    iters = std::atoi(argv[1]);
    if (iters < 1 || iters > 1000) {
      std::fprintf(stderr, "usage: %s [iterations in 1..1000]\n", argv[0]);
      return 2;
    }
  }
  const int64_t h = 32, g = 8, d = 128, nq = 64;
  at::Generator gen = at::detail::createCPUGenerator(7);
  std::printf("AttentionScores CPU, H=%lld G=%lld d=%lld nq=%lld, %d threads, %d calls\n",
              static_cast<long long>(h), static_cast<long long>(g), static_cast<long long>(d),
              static_cast<long long>(nq), at::get_num_threads(), iters);
  for (int64_t l : {int64_t{4096}, int64_t{16384}}) {
    at::Tensor q = at::randn({h, nq, d}, gen, at::kFloat);
    at::Tensor k = at::randn({g, l, d}, gen, at::kFloat);
    echokv::kernels::ScoreOptions all_visible;
    const double ms = MillisecondsPerCall(
        iters, [&] { (void)echokv::kernels::AttentionScores(q, k, all_visible); });

    // Causal variant: queries are the last nq context positions (SnapKV's window).
    echokv::kernels::ScoreOptions causal;
    causal.query_positions = at::arange(l - nq, l, at::kLong);
    causal.key_positions = at::arange(l, at::kLong).unsqueeze(0).repeat({g, 1});
    const double ms_causal = MillisecondsPerCall(
        iters, [&] { (void)echokv::kernels::AttentionScores(q, k, causal); });

    at::Tensor group_scores =
        echokv::kernels::SumHeadsPerGroup(echokv::kernels::AttentionScores(q, k, all_visible), g);
    const double ms_topk = MillisecondsPerCall(
        iters, [&] { (void)echokv::kernels::TopKIndices(group_scores, 1024); });

    const double gflop = 2.0 * 2.0 * h * nq * d * static_cast<double>(l) * 1e-9;  // two passes
    std::printf("L=%6lld  scores %9.2f ms (%.1f GFLOP/s)  causal %9.2f ms  top-1024 %7.2f ms\n",
                static_cast<long long>(l), ms, gflop / (ms * 1e-3), ms_causal, ms_topk);
  }

  // Decode attention's weighted sums: one call per (head, token) over a group's value
  // rows, which are in L1/L2 at these sizes (as in decode).
  std::printf("\nWeightedSumRowsChains (decode attention, one head): ns per value row\n");
  std::printf("%5s %6s %10s %10s %8s\n", "d", "rows", "portable", "avx512", "ratio");
  for (const int64_t dim : {int64_t{8}, int64_t{128}}) {
    for (const int64_t rows : {int64_t{128}, int64_t{1024}}) {
      at::Tensor p = at::rand({rows}, gen, at::kFloat);
      at::Tensor v = at::randn({rows, dim}, gen, at::kFloat);
      std::vector<float> out(dim);
      const int reps = static_cast<int>(std::max<int64_t>(1, (1 << 22) / (rows * dim)));
      double ns[2] = {0, 0};
      const char* builds[2] = {"portable", "avx512"};
      for (int b = 0; b < 2; ++b) {
        bool ok = true;
        const double ms = MillisecondsPerCall(iters, [&] {
          for (int r = 0; r < reps; ++r) {
            ok = ok && echokv::kernels::WeightedSumRowsChainsWith(builds[b], p.data_ptr<float>(), v.data_ptr<float>(),
                                                                 rows, dim, out.data());
          }
        });
        ns[b] = ok ? ms * 1e6 / (static_cast<double>(reps) * rows) : 0;
      }
      std::printf("%5lld %6lld %10.2f %10.2f %7.2fx\n", static_cast<long long>(dim), static_cast<long long>(rows),
                  ns[0], ns[1], ns[1] > 0 ? ns[0] / ns[1] : 0.0);
    }
  }
  return 0;
}
