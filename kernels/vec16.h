// 16-float vectors in GCC's vector extension and the one horizontal sum every decode
// dot product ends with (kernels/matmul_rows.cc, the decode attention scores): lanes
// added pairwise, j += j + w for w = 8, 4, 2, 1, as vector halves (4 adds, 3 shuffles
// instead of 15 dependent scalar adds). Always inlined, so each caller's target (AVX-512
// registers, two AVX2 halves, four SSE quarters) compiles it; the result is the same bits
// in all of them.
#ifndef ECHOKV_KERNELS_VEC16_H_
#define ECHOKV_KERNELS_VEC16_H_

// Passing these by value across a call would depend on the target's ABI (GCC's -Wpsabi
// note, reported at each call site, so it stays off for the including file); every
// function here is always inlined, so no such call exists.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace echokv::kernels::vec16 {

// aligned(4): dereferences are unaligned loads and stores.
typedef float V16 __attribute__((vector_size(64), aligned(4)));
typedef float V8 __attribute__((vector_size(32), aligned(4)));
typedef float V4 __attribute__((vector_size(16), aligned(4)));

__attribute__((always_inline)) inline V16 Load(const float* p) { return *reinterpret_cast<const V16*>(p); }

__attribute__((always_inline)) inline float Reduce(const V16& v) {
  const V8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
               __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const V4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}

// Reduce(v[k]) for k < kCount (1 <= kCount <= 16) in lane k of the result, the same
// bits as kCount calls of Reduce: the same pairwise tree (lanes j and j + 8, then j and
// j + 4, then (0 + 2) + (1 + 3)), but each level's shuffles gather the same half of two
// accumulators into one vector, so 16 sums cost 15 adds and 30 two-source shuffles
// instead of 16 x (4 adds, 5 shuffles and extracts). Lanes >= kCount are unspecified.
// For targets with 512-bit two-source permutes (AVX-512); elsewhere the shuffles split.
template <int kCount>
__attribute__((always_inline)) inline V16 ReduceMany(const V16* v) {
  static_assert(kCount >= 1 && kCount <= 16, "ReduceMany sums 1 to 16 vectors");
  constexpr int n1 = (kCount + 1) / 2, n2 = (n1 + 1) / 2, n3 = (n2 + 1) / 2;
  const V16 zero = {};
  V16 a[8], b[4], c[2];
  for (int m = 0; m < n1; ++m) {  // a[m]: lanes 8h + i = lane i + lane i + 8 of v[2m + h]
    const V16 x = v[2 * m], y = 2 * m + 1 < kCount ? v[2 * m + 1] : zero;
    a[m] = __builtin_shufflevector(x, y, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           __builtin_shufflevector(x, y, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  }
  for (int m = 0; m < n2; ++m) {  // b[m]: lanes 4h + i = a's i + a's i + 4 of v[4m + h]
    const V16 x = a[2 * m], y = 2 * m + 1 < n1 ? a[2 * m + 1] : zero;
    b[m] = __builtin_shufflevector(x, y, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           __builtin_shufflevector(x, y, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  }
  for (int m = 0; m < n3; ++m) {  // c[m]: lanes 2h, 2h + 1 = b's 0 + 2, b's 1 + 3 of v[8m + h]
    const V16 x = b[2 * m], y = 2 * m + 1 < n2 ? b[2 * m + 1] : zero;
    c[m] = __builtin_shufflevector(x, y, 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
           __builtin_shufflevector(x, y, 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  }
  const V16 x = c[0], y = n3 > 1 ? c[1] : zero;
  return __builtin_shufflevector(x, y, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         __builtin_shufflevector(x, y, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

}  // namespace echokv::kernels::vec16

#endif  // ECHOKV_KERNELS_VEC16_H_
