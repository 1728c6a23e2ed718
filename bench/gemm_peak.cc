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

#include "bench/roofline.h"
#include "common/blas_env.h"
#include "kernels/matmul_rows.h"

namespace {

// The same for kernels::MatMulRows: row blocks of 24 split over the OpenMP pool.
double MeasureRows(int64_t m, int64_t n, int64_t k, double seconds) {
  at::Tensor a = at::randn({m, k}), b = at::randn({n, k}), out = at::empty({m, n});
  const int64_t block = 24, blocks = (n + block - 1) / block;
  return echokv::bench::BestRate(2.0 * m * n * k, seconds, [&] {
    at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
      echokv::kernels::MatMulRows(b.data_ptr<float>(), a.data_ptr<float>(), nullptr, m, n, k, out.data_ptr<float>(),
                                  b0 * block, std::min(n, b1 * block));
    });
  });
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
  const bool openblas = echokv::bench::SetBenchPools(/*openmp=*/1, /*openblas=*/threads);
  // OpenBLAS picks its kernels by CPU detection; on a virtual CPU with a generic name it
  // may pick an older core than the CPU's flags allow (OPENBLAS_CORETYPE overrides it).
  using NameFn = char* (*)();
  auto corename = reinterpret_cast<NameFn>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  std::printf("float32 GEMM, OpenMP 1, %s %d threads, core %s, OPENBLAS_CORETYPE=%s\n",
              openblas ? "OpenBLAS" : "BLAS (not OpenBLAS)", threads,
              corename != nullptr ? corename() : "?",
              std::getenv("OPENBLAS_CORETYPE") ? std::getenv("OPENBLAS_CORETYPE") : "(unset)");
  std::printf("%s\n", echokv::DescribeBlasSetup().c_str());
  std::printf("2048x2048x2048: %.1f GFLOP/s (peak)\n", echokv::bench::MeasureProduct(2048, 2048, 2048, seconds));
  for (int64_t rows : {1, 16, 64}) {
    std::printf("%3lld x 512 x 1376 (one MLP up-projection of the 40M model, %lld rows): %.1f GFLOP/s\n",
                static_cast<long long>(rows), static_cast<long long>(rows),
                echokv::bench::MeasureProduct(rows, 1376, 512, seconds / 2));
  }
  // The decode products' own kernel (kernels/matmul_rows.h) on the same shapes, rows in
  // blocks over LibTorch's OpenMP pool (as a batched decode step runs them).
  echokv::bench::SetBenchPools(/*openmp=*/threads, /*openblas=*/1);
  for (int64_t rows : {1, 16, 64}) {
    std::printf("%3lld x 512 x 1376, echokv MatMulRows (%s, OpenMP %d threads): %.1f GFLOP/s\n",
                static_cast<long long>(rows), echokv::kernels::MatMulRowsIsa().c_str(), at::get_num_threads(),
                MeasureRows(rows, 1376, 512, seconds / 2));
  }
  for (int64_t mb : {4, 160}) {
    std::printf("memory read, %lld MiB on huge pages, %d threads: %.1f GB/s%s\n", static_cast<long long>(mb),
                at::get_num_threads(), echokv::bench::ReadBandwidth(mb, at::get_num_threads(), seconds / 2),
                mb == 160 ? " (the 40M model's weights: single-stream decode reads them once per token)" : "");
  }
  return 0;
}
