#include "kernels/matmul_rows.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "kernels/cpu_isa.h"
#include "kernels/vec16.h"

namespace echokv::kernels {
namespace {

using vec16::Load;
using vec16::V16;

// RT weight rows x CT inputs (kPrefetchNext: also prefetch the RT rows after them);
// every (row, input) pair in the same order of operations:
// 16 lanes accumulated over the columns, vec16::Reduce, then the remaining columns one by
// one. Compiled into each ISA's entry point below (always_inline), so `a += b * c`
// becomes an FMA where the entry point's target has one (-ffp-contract=fast on this file).
template <int RT, int CT, bool kMany, bool kPrefetchNext = false>
__attribute__((always_inline)) inline void Tile(const float* w, const float* x, const float* bias, int64_t rows,
                                                int64_t cols, float* y) {
  V16 acc[RT][CT];
  for (int r = 0; r < RT; ++r) {
    for (int c = 0; c < CT; ++c) acc[r][c] = V16{};
  }
  int64_t k = 0;
  for (; k + 16 <= cols; k += 16) {
    V16 xv[CT];
    for (int c = 0; c < CT; ++c) xv[c] = Load(x + c * cols + k);
    if constexpr (kPrefetchNext) {
      for (int r = 0; r < RT; ++r) __builtin_prefetch(w + (RT + r) * cols + k, 0, 3);
    }
    for (int r = 0; r < RT; ++r) {
      const V16 wv = Load(w + r * cols + k);
      for (int c = 0; c < CT; ++c) acc[r][c] += wv * xv[c];
    }
  }
  // The accumulators' sums: one by one, or (kMany: builds with 512-bit two-source
  // shuffles) 16 at a time by vec16::ReduceMany, the same bits in fewer instructions.
  constexpr int kSums = RT * CT;
  static_assert(kSums <= 32, "tiles of at most 32 accumulators");
  float sums[32];
  if constexpr (kMany && kSums > 1) {
    constexpr int kLow = kSums < 16 ? kSums : 16;  // ReduceMany sums at most 16
    const V16* flat = &acc[0][0];
    const V16 lo = vec16::ReduceMany<kLow>(flat);
    for (int i = 0; i < kLow; ++i) sums[i] = lo[i];
    if constexpr (kSums > 16) {
      const V16 hi = vec16::ReduceMany<kSums - 16>(flat + 16);
      for (int i = 0; i < kSums - 16; ++i) sums[16 + i] = hi[i];
    }
  } else {
    for (int i = 0; i < kSums; ++i) sums[i] = vec16::Reduce((&acc[0][0])[i]);
  }
  for (int r = 0; r < RT; ++r) {
    for (int c = 0; c < CT; ++c) {
      float s = sums[r * CT + c];
      for (int64_t t = k; t < cols; ++t) s += w[r * cols + t] * x[c * cols + t];
      y[c * rows + r] = s + (bias ? bias[r] : 0.0f);
    }
  }
}

// The inputs [i, n) left after whole CT-wide tiles (fewer than CT): one tile of exactly
// that width, so a batch of 16 is 6 + 6 + 4 inputs, not 6 + 6 + 1 + 1 + 1 + 1.
template <int RT, int CT, bool kMany>
__attribute__((always_inline)) inline void Rest(int64_t left, const float* w, const float* x, const float* bias,
                                                int64_t rows, int64_t cols, float* y) {
  if constexpr (CT > 1) {
    if (left == CT - 1) return Tile<RT, CT - 1, kMany>(w, x, bias, rows, cols, y);
    return Rest<RT, CT - 1, kMany>(left, w, x, bias, rows, cols, y);
  }
}

// Rows [r0, r1) against all n inputs: RT x CT tiles for batches (each tile's RT weight
// rows stay in L1 while a block of inputs passes), RV x 1 for n = 1.
template <int RT, int CT, int RV, bool kMany>
__attribute__((always_inline)) inline void Drive(const float* w, const float* x, const float* bias, int64_t n,
                                                 int64_t rows, int64_t cols, float* y, int64_t r0, int64_t r1) {
  // Tile writes y[c * rows + r] relative to its arguments: pass y shifted to (r, i).
  auto at = [&](int64_t r, int64_t i) { return y + i * rows + r; };
  const float* no_bias = nullptr;
  auto b = [&](int64_t r) { return bias ? bias + r : no_bias; };
  if (n == 1) {
    int64_t r = r0;
    for (; r + RV <= r1; r += RV) Tile<RV, 1, kMany>(w + r * cols, x, b(r), rows, cols, at(r, 0));
    for (; r < r1; ++r) Tile<1, 1, kMany>(w + r * cols, x, b(r), rows, cols, at(r, 0));
    return;
  }
  // Inputs in blocks of 2 CT: a block's inputs stay in L1 while the range's rows pass
  // (the range's weights come from L2 once per block). With all inputs in the inner
  // loop, 64 of them (128 KB at 512 columns) were re-read from L2 for every row tile,
  // which capped 64-row products at L2 bandwidth.
  constexpr int64_t kBlock = 2 * CT;
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const int64_t i1 = std::min(n, i0 + kBlock);
    int64_t r = r0;
    for (; r + RT <= r1; r += RT) {
      int64_t i = i0;
      // The first tile of a row tile's first pass also prefetches the next row tile's
      // weights (from memory), so they arrive while this one computes: +14 % for 16
      // streams of the 40M model, +4 % for 64 (a two-tile distance was slower at 16).
      if (i0 == 0 && i + CT <= i1 && r + 2 * RT <= r1) {
        Tile<RT, CT, kMany, true>(w + r * cols, x + i * cols, b(r), rows, cols, at(r, i));
        i += CT;
      }
      for (; i + CT <= i1; i += CT) Tile<RT, CT, kMany>(w + r * cols, x + i * cols, b(r), rows, cols, at(r, i));
      if (i < i1) Rest<RT, CT, kMany>(i1 - i, w + r * cols, x + i * cols, b(r), rows, cols, at(r, i));
    }
    for (; r < r1; ++r) {
      int64_t i = i0;
      for (; i + CT <= i1; i += CT) Tile<1, CT, kMany>(w + r * cols, x + i * cols, b(r), rows, cols, at(r, i));
      if (i < i1) Rest<1, CT, kMany>(i1 - i, w + r * cols, x + i * cols, b(r), rows, cols, at(r, i));
    }
  }
}

using Fn = void (*)(const float*, const float*, const float*, int64_t, int64_t, int64_t, float*, int64_t, int64_t);

// Weight rows per batch tile of each build (MatMulRowsBlock reports them).
constexpr int kAvx512Rows = 4, kAvx2Rows = 2, kScalarRows = 1;

// Tile shapes: AVX-512 has 32 vector registers (4 x 6 = 24 accumulators, the rest for
// loads); AVX2 has 16 of half the width, so a pair takes 2 (2 x 3 = 12).
#if defined(__x86_64__)
__attribute__((target("avx512f,fma"))) void RunAvx512(const float* w, const float* x, const float* bias, int64_t n,
                                                      int64_t rows, int64_t cols, float* y, int64_t r0, int64_t r1) {
  Drive<kAvx512Rows, 6, 8, true>(w, x, bias, n, rows, cols, y, r0, r1);
}
__attribute__((target("avx2,fma"))) void RunAvx2(const float* w, const float* x, const float* bias, int64_t n,
                                                 int64_t rows, int64_t cols, float* y, int64_t r0, int64_t r1) {
  Drive<kAvx2Rows, 3, 4, false>(w, x, bias, n, rows, cols, y, r0, r1);
}
#endif
void RunScalar(const float* w, const float* x, const float* bias, int64_t n, int64_t rows, int64_t cols, float* y,
               int64_t r0, int64_t r1) {
  Drive<kScalarRows, 2, 2, false>(w, x, bias, n, rows, cols, y, r0, r1);
}

struct Choice {
  const char* isa;
  Fn fn;
  int64_t block;
};

#if defined(__x86_64__)
constexpr Choice kAvx512{"avx512", RunAvx512, kAvx512Rows};
constexpr Choice kAvx2{"avx2", RunAvx2, kAvx2Rows};
#endif
constexpr Choice kScalar{"scalar", RunScalar, kScalarRows};

const Choice* Find(const std::string& isa) {
  if (!CpuRunsIsa(isa)) return nullptr;
#if defined(__x86_64__)
  if (isa == "avx512") return &kAvx512;
  if (isa == "avx2") return &kAvx2;
#endif
  return &kScalar;
}

const Choice* Best() {
  for (const char* isa : {"avx512", "avx2"}) {
    if (const Choice* c = Find(isa)) return c;
  }
  return &kScalar;
}

// The build every call uses: the best the CPU has, or ECHOKV_MATMUL_ISA when that names
// one it supports.
std::atomic<const Choice*>& Current() {
  static std::atomic<const Choice*> choice = [] {
    const char* env = std::getenv("ECHOKV_MATMUL_ISA");
    const Choice* c = env != nullptr ? Find(env) : nullptr;
    return c != nullptr ? c : Best();
  }();
  return choice;
}

}  // namespace

void MatMulRows(const float* w, const float* x, const float* bias, int64_t n, int64_t rows, int64_t cols, float* y,
                int64_t row_begin, int64_t row_end) {
  if (n <= 0 || row_begin >= row_end) return;
  Current().load(std::memory_order_relaxed)->fn(w, x, bias, n, rows, cols, y, row_begin, row_end);
}

int64_t MatMulRowsBlock() { return Current().load(std::memory_order_relaxed)->block; }

std::string MatMulRowsIsa() { return Current().load(std::memory_order_relaxed)->isa; }

bool SetMatMulRowsIsa(const std::string& isa) {
  const Choice* c = isa == "auto" ? Best() : Find(isa);
  if (c == nullptr) return false;
  Current().store(c);
  return true;
}

}  // namespace echokv::kernels
