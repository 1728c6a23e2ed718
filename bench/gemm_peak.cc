// The machine's float32 matrix-product peak through the same LibTorch + OpenBLAS the
// model uses, in the batched-product pool setting (OpenMP 1, OpenBLAS N threads): the
// yardstick the server benchmark's aggregate decode FLOP/s is reported against
// (docs/BENCHMARKS.md, issue 14). Prints GFLOP/s of a large square product and of the
// 16- and 64-row products a batched decode step of the 40M model runs, and the read
// bandwidth of a weight-sized buffer: the roofline of single-stream decode, which reads
// every weight once per token (issue 13).
//
//   echokv-bench-gemm --threads 2 --seconds 2
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/blas_env.h"
#include "common/huge_pages.h"
#include "kernels/matmul_rows.h"

namespace {

// GFLOP/s of `product` (which does `flop` floating-point operations), repeated for at
// least `seconds` after one warm-up call; the best of three such runs.
template <typename Fn>
double BestRate(double flop, double seconds, Fn product) {
  product();
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    int64_t iters = 0;
    const auto t0 = std::chrono::steady_clock::now();
    double elapsed = 0;
    while (elapsed < seconds / 3) {
      product();
      ++iters;
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    best = std::max(best, flop * iters / elapsed / 1e9);
  }
  return best;
}

// GFLOP/s of out [m, n] = a [m, k] b[n, k]^T (the layout of a linear layer) through
// OpenBLAS.
double Measure(int64_t m, int64_t n, int64_t k, double seconds) {
  at::Tensor a = at::randn({m, k}), b = at::randn({n, k}), out = at::empty({m, n});
  return BestRate(2.0 * m * n * k, seconds, [&] { at::mm_out(out, a, b.t()); });
}

// The same for kernels::MatMulRows: row blocks of 24 split over the OpenMP pool.
double MeasureRows(int64_t m, int64_t n, int64_t k, double seconds) {
  at::Tensor a = at::randn({m, k}), b = at::randn({n, k}), out = at::empty({m, n});
  const int64_t block = 24, blocks = (n + block - 1) / block;
  return BestRate(2.0 * m * n * k, seconds, [&] {
    at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
      echokv::kernels::MatMulRows(b.data_ptr<float>(), a.data_ptr<float>(), nullptr, m, n, k, out.data_ptr<float>(),
                                  b0 * block, std::min(n, b1 * block));
    });
  });
}

// XOR of words [begin, end) (multiples of 8): 64-byte vectors in four independent
// chains, compiled for the widest vectors the CPU has (the loop must outrun memory).
__attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4"))) uint64_t XorWords(
    const uint64_t* words, int64_t begin, int64_t end) {
  typedef uint64_t V __attribute__((vector_size(64), aligned(64)));
  const V* v = reinterpret_cast<const V*>(words + begin);
  const int64_t n = (end - begin) / 8;
  V x[4] = {};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int c = 0; c < 4; ++c) x[c] ^= v[i + c];
  }
  for (; i < n; ++i) x[0] ^= v[i];
  const V all = x[0] ^ x[1] ^ x[2] ^ x[3];
  uint64_t folded = 0;  // every lane, so no part of a load is dead code
  for (int lane = 0; lane < 8; ++lane) folded ^= all[lane];
  return folded;
}

// GB/s of reading `mb` MiB (on huge pages, as the model's weights) split over `threads`
// OpenMP threads, 64-bit words XORed together (cheap enough that memory, not the loop,
// is the limit): the best of three runs of `seconds` / 3.
double ReadBandwidth(int64_t mb, int threads, double seconds) {
  echokv::HugePageBuffer buffer = echokv::HugePageBuffer::Allocate(static_cast<size_t>(mb) << 20);
  if (!buffer.ok()) return 0;
  auto* words = static_cast<uint64_t*>(buffer.data());
  const int64_t n = static_cast<int64_t>(buffer.size() / sizeof(uint64_t));
  for (int64_t i = 0; i < n; ++i) words[i] = static_cast<uint64_t>(i);
  uint64_t sink = 0;
  const double rate = BestRate(n * 8.0, seconds, [&] {
    at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        __atomic_fetch_xor(&sink, XorWords(words, n * t / threads / 8 * 8, n * (t + 1) / threads / 8 * 8),
                           __ATOMIC_RELAXED);
      }
    });
  });
  if (sink == 1) std::printf(" ");  // keeps the reads
  return rate;
}

}  // namespace

int main(int argc, char** argv) {
  // The OpenBLAS setup every echokv program gets (the core it would pick for itself);
  // ECHOKV_NO_REEXEC=1 measures OpenBLAS exactly as the environment leaves it.
  echokv::ConfigureBlasWorkersOrReexec(argv);
  int threads = 2;
  double seconds = 2.0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--threads") == 0) threads = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--seconds") == 0) seconds = std::atof(argv[i + 1]);
  }
  at::set_num_threads(1);
  using SetFn = void (*)(int);
  auto set_blas = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (set_blas != nullptr) set_blas(threads);
  // OpenBLAS picks its kernels by CPU detection; on a virtual CPU with a generic name it
  // may pick an older core than the CPU's flags allow (OPENBLAS_CORETYPE overrides it).
  using NameFn = char* (*)();
  auto corename = reinterpret_cast<NameFn>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  std::printf("float32 GEMM, OpenMP 1, %s %d threads, core %s, OPENBLAS_CORETYPE=%s\n",
              set_blas != nullptr ? "OpenBLAS" : "BLAS (not OpenBLAS)", threads,
              corename != nullptr ? corename() : "?",
              std::getenv("OPENBLAS_CORETYPE") ? std::getenv("OPENBLAS_CORETYPE") : "(unset)");
  std::printf("%s\n", echokv::DescribeBlasSetup().c_str());
  std::printf("2048x2048x2048: %.1f GFLOP/s (peak)\n", Measure(2048, 2048, 2048, seconds));
  for (int64_t rows : {1, 16, 64}) {
    std::printf("%3lld x 512 x 1376 (one MLP up-projection of the 40M model, %lld rows): %.1f GFLOP/s\n",
                static_cast<long long>(rows), static_cast<long long>(rows), Measure(rows, 1376, 512, seconds / 2));
  }
  // The decode products' own kernel (kernels/matmul_rows.h) on the same shapes, rows in
  // blocks over LibTorch's OpenMP pool (as a batched decode step runs them).
  at::set_num_threads(threads);
  if (set_blas != nullptr) set_blas(1);
  for (int64_t rows : {1, 16, 64}) {
    std::printf("%3lld x 512 x 1376, echokv MatMulRows (%s, OpenMP %d threads): %.1f GFLOP/s\n",
                static_cast<long long>(rows), echokv::kernels::MatMulRowsIsa().c_str(), at::get_num_threads(),
                MeasureRows(rows, 1376, 512, seconds / 2));
  }
  for (int64_t mb : {4, 160}) {
    std::printf("memory read, %lld MiB on huge pages, %d threads: %.1f GB/s%s\n", static_cast<long long>(mb),
                at::get_num_threads(), ReadBandwidth(mb, at::get_num_threads(), seconds / 2),
                mb == 160 ? " (the 40M model's weights: single-stream decode reads them once per token)" : "");
  }
  return 0;
}
