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

// The largest of n values (-inf for n = 0; a NaN is never taken, as by std::max(mx, x[j])
// from -inf). The same value as that sequential loop: only which zero, +0 or -0, is
// returned when both tie for the largest may differ. 16 lanes instead of one chain of
// compare latencies (a 4-cycle maxss per value, ~16 us of a 320-position stories260K token).
float MaxOf(const float* x, int64_t n);

// x[j] *= s for n values (each product rounded as the scalar loop's).
void ScaleInPlace(float* x, int64_t n, float s);

// out[j] = scale * (q . rows[j]) for n rows of d floats (rows[j] = rows + j * d).
void ScaledDots(const float* q, const float* rows, int64_t n, int64_t d, float scale, float* out);

}  // namespace echokv::kernels

#endif  // ECHOKV_KERNELS_SOFTMAX_H_
