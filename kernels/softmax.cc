#include "kernels/softmax.h"

#include "kernels/exp2_poly.h"

namespace echokv::kernels {

// A plain loop over the polynomial of exp2_poly.h that the clones vectorise; the sum in
// a second loop with 16 partial sums (a single running sum would keep it scalar
// without -ffast-math).
__attribute__((target_clones("default", "arch=haswell", "arch=x86-64-v4"))) float ExpShiftSum(float* x, int64_t n,
                                                                                              float mx) {
  namespace e = exp2_poly;
  for (int64_t j = 0; j < n; ++j) {
    float t = (x[j] - mx) * e::kLog2e;
    t = t < e::kMin ? e::kMin : t;
    const float r = t + e::kRoundMagic;
    const float f = t - (r - e::kRoundMagic);
    float p = e::kCoeffs[0];
    for (int k = 1; k < 8; ++k) p = p * f + e::kCoeffs[k];
    int32_t bits;
    __builtin_memcpy(&bits, &r, sizeof(bits));
    bits = (bits - e::kRoundMagicBits + 127) << 23;  // 2^round(t); round(t) = -127 gives 0
    float scale;
    __builtin_memcpy(&scale, &bits, sizeof(scale));
    x[j] = p * scale;
  }
  constexpr int kLanes = 16;
  float acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int i = 0; i < kLanes; ++i) acc[i] += x[j + i];
  }
  for (int width = kLanes / 2; width >= 1; width /= 2) {
    for (int i = 0; i < width; ++i) acc[i] += acc[i + width];
  }
  float sum = acc[0];
  for (; j < n; ++j) sum += x[j];
  return sum;
}

__attribute__((target_clones("default", "arch=haswell", "arch=x86-64-v4"))) float MaxOf(const float* x, int64_t n) {
  constexpr int kLanes = 16;
  constexpr float kNegInf = -__builtin_inff();
  float acc[kLanes];
  for (int i = 0; i < kLanes; ++i) acc[i] = kNegInf;
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int i = 0; i < kLanes; ++i) acc[i] = acc[i] < x[j + i] ? x[j + i] : acc[i];
  }
  float mx = kNegInf;
  for (int i = 0; i < kLanes; ++i) mx = mx < acc[i] ? acc[i] : mx;
  for (; j < n; ++j) mx = mx < x[j] ? x[j] : mx;
  return mx;
}

__attribute__((target_clones("default", "arch=haswell", "arch=x86-64-v4"))) void ScaleInPlace(float* x, int64_t n,
                                                                                              float s) {
  for (int64_t j = 0; j < n; ++j) x[j] *= s;
}

// 16 partial sums per row (the clones keep them in one or two vector registers).
__attribute__((target_clones("default", "arch=haswell", "arch=x86-64-v4"))) void ScaledDots(
    const float* q, const float* rows, int64_t n, int64_t d, float scale, float* out) {
  for (int64_t j = 0; j < n; ++j) {
    const float* k = rows + j * d;
    float acc[16] = {};
    int64_t t = 0;
    for (; t + 16 <= d; t += 16) {
      for (int i = 0; i < 16; ++i) acc[i] += q[t + i] * k[t + i];
    }
    for (int width = 8; width >= 1; width /= 2) {
      for (int i = 0; i < width; ++i) acc[i] += acc[i + width];
    }
    float s = acc[0];
    for (; t < d; ++t) s += q[t] * k[t];
    out[j] = s * scale;
  }
}

}  // namespace echokv::kernels
