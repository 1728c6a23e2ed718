// The two ceilings of a decode step on this machine, measured: the float32 matrix-product
// peak (a 2048^3 OpenBLAS product, OpenMP 1 and OpenBLAS N threads: the batched-product
// pool setting) and the read bandwidth of a weight-sized buffer on huge pages (N OpenMP
// threads). A step that does F floating-point operations and reads B bytes (weights once,
// every row's KV cache) takes at least max(F / peak, B / bandwidth): BoundGflops.
//
//   Roofline r = MeasureRoofline(/*threads=*/2, /*seconds=*/2);   // before loading a model
//   double best = BoundGflops(flop_per_step, bytes_per_step, r);  // GFLOP/s no step exceeds
#ifndef ECHOKV_BENCH_ROOFLINE_H_
#define ECHOKV_BENCH_ROOFLINE_H_

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace echokv::bench {

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
// LibTorch's BLAS, with the pools as they are set.
double MeasureProduct(int64_t m, int64_t n, int64_t k, double seconds);

// GB/s of reading `mib` MiB on huge pages (as the model's weights), split over `threads`
// OpenMP threads: the best of three runs of `seconds` / 3. 0 if no memory.
double ReadBandwidth(int64_t mib, int threads, double seconds);

// OpenMP's team for this thread and OpenBLAS's pool (false, and OpenMP only, when the
// BLAS is not OpenBLAS).
bool SetBenchPools(int openmp, int openblas);

struct Roofline {
  int threads = 0;
  double peak_gflops = 0;  // 2048^3 product, OpenBLAS `threads` threads
  double read_gbs = 0;     // 160 MiB read, `threads` OpenMP threads
};

// Sets the pools for each measurement (OpenMP 1 + OpenBLAS `threads` for the product,
// OpenMP `threads` for the read). Run it before a model is loaded: the model's pool
// switching remembers what it last set.
Roofline MeasureRoofline(int threads, double seconds);

// The most GFLOP/s a step of `flop` operations reading `bytes` can reach.
inline double BoundGflops(double flop, double bytes, const Roofline& r) {
  const double seconds = std::max(flop / (r.peak_gflops * 1e9), bytes / (r.read_gbs * 1e9));
  return seconds > 0 ? flop / seconds / 1e9 : 0;
}

}  // namespace echokv::bench

#endif  // ECHOKV_BENCH_ROOFLINE_H_
