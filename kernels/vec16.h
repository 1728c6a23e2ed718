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

}  // namespace echokv::kernels::vec16

#endif  // ECHOKV_KERNELS_VEC16_H_
