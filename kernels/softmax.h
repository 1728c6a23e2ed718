// Row primitives of the CPU float32 softmax paths (the decode fast path's per-head
// attention, the Eq. 3 scores of kernels/score.h): torch-free, vectorised by the
// compiler into AVX2 and AVX-512 clones chosen at load.
#ifndef ECHOKV_KERNELS_SOFTMAX_H_
#define ECHOKV_KERNELS_SOFTMAX_H_

#include <cstdint>

namespace echokv::kernels {

// x[j] = exp(x[j] - mx) for n values (all <= mx; -inf gives 0), returning their sum.
// exp(z) = 2^(z log2 e) by kernels/exp2_poly.h: relative error ~2e-7, z < -88 gives 0.
float ExpShiftSum(float* x, int64_t n, float mx);

// out[j] = scale * (q . rows[j]) for n rows of d floats (rows[j] = rows + j * d).
void ScaledDots(const float* q, const float* rows, int64_t n, int64_t d, float scale, float* out);

}  // namespace echokv::kernels

#endif  // ECHOKV_KERNELS_SOFTMAX_H_
