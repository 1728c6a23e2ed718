#include "bench/roofline.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <omp.h>

#include <cstdio>

#include "common/huge_pages.h"

namespace echokv::bench {
namespace {

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

}  // namespace

// Not at::set_num_threads: LibTorch 1.13 also re-creates caffe2's pthreadpool on every
// call (model/transformer.cc, ThreadPools), whose new threads spin for a while, in the
// middle of what is measured next. at::get_num_threads() first runs LibTorch's
// per-thread set-up, which would otherwise undo this at the first parallel region.
bool SetBenchPools(int openmp, int openblas) {
  at::get_num_threads();
  omp_set_num_threads(openmp);
  using SetFn = void (*)(int);
  auto set_blas = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (set_blas == nullptr) return false;
  set_blas(openblas);
  return true;
}

double MeasureProduct(int64_t m, int64_t n, int64_t k, double seconds) {
  at::Tensor a = at::randn({m, k}), b = at::randn({n, k}), out = at::empty({m, n});
  return BestRate(2.0 * m * n * k, seconds, [&] { at::mm_out(out, a, b.t()); });
}

double ReadBandwidth(int64_t mib, int threads, double seconds) {
  HugePageBuffer buffer = HugePageBuffer::Allocate(static_cast<size_t>(mib) << 20);
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

Roofline MeasureRoofline(int threads, double seconds) {
  Roofline r;
  r.threads = threads;
  SetBenchPools(/*openmp=*/1, /*openblas=*/threads);
  r.peak_gflops = MeasureProduct(2048, 2048, 2048, seconds);
  SetBenchPools(/*openmp=*/threads, /*openblas=*/1);
  r.read_gbs = ReadBandwidth(160, threads, seconds);
  return r;
}

}  // namespace echokv::bench
