// The per-element math of the CUDA kernels (kernels/cuda/*.cu), as __host__ __device__
// functions with no torch and no CUDA header, so that the CPU build compiles them too
// and tests/kernels/cuda_math_test.cc checks each against the CPU kernels it mirrors
// (kernels/score.h's tie rule, kernels/rope.h's angles and rotation) and a float64
// reference, on a machine without a GPU.
//
//   int64_t key = TopKKey(score, index);        // larger key = kept first
//   int64_t index = TopKKeyIndex(key);
//   float c, s; RopeCosSin(position, inv_freq[i], &c, &s);
//   float o1, o2; RopeRotate(x[i], x[i + d/2], c, s, &o1, &o2);
//   SoftmaxState st; st.Add(logit); ... st.Merge(other); float lse = st.Lse();
//
// Roundings are spelled out (the device's __fmul_rn / __fadd_rn, never a contracted
// FMA) wherever the CPU code's result is matched bit for bit.
#ifndef ECHOKV_KERNELS_CUDA_DEVICE_MATH_H_
#define ECHOKV_KERNELS_CUDA_DEVICE_MATH_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define ECHOKV_HD __host__ __device__ __forceinline__
#else
#define ECHOKV_HD inline
#endif

namespace echokv::kernels::cuda_math {

// ---- exact float arithmetic (one rounding each, never fused) ----
ECHOKV_HD float MulRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
ECHOKV_HD float AddRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
ECHOKV_HD float NegInf() { return -INFINITY; }
ECHOKV_HD bool IsNan(float x) { return x != x; }
ECHOKV_HD uint32_t FloatBits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
#endif
}
ECHOKV_HD float ExpF(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  return std::exp(x);
#endif
}
ECHOKV_HD float LogF(float x) {
#if defined(__CUDA_ARCH__)
  return logf(x);
#else
  return std::log(x);
#endif
}

// ---- top-k with kernels::TopKIndices' rule ----
// The k largest scores of a row, ties to the lower index, NaN ranked as -inf (and so
// tied with a real -inf), +0 and -0 equal. One int64 key per entry makes that order a
// plain integer order, so any exact top-k of the keys (LibTorch's topk on CUDA, a radix
// select) returns exactly TopKIndices' set, whatever its internal order:
//   high 32 bits: the score's bits mapped to a signed int32 that orders like the float;
//   low 32 bits: ~index (a lower index is a larger key). Indices must be < 2^31.
ECHOKV_HD uint32_t OrderedScoreBits(float s) {
  if (IsNan(s)) s = NegInf();
  if (s == 0.0f) s = 0.0f;  // -0 -> +0
  const uint32_t b = FloatBits(s);
  // Negative floats order backwards by their bits: flip them all; positives: set the top bit.
  return (b & 0x80000000u) != 0 ? ~b : (b | 0x80000000u);
}
ECHOKV_HD int64_t TopKKey(float score, int64_t index) {
  const uint32_t hi = OrderedScoreBits(score) ^ 0x80000000u;  // unsigned order -> signed order
  const uint32_t lo = ~static_cast<uint32_t>(index);
  return static_cast<int64_t>((static_cast<uint64_t>(hi) << 32) | static_cast<uint64_t>(lo));
}
ECHOKV_HD int64_t TopKKeyIndex(int64_t key) {
  return static_cast<int64_t>(~static_cast<uint32_t>(static_cast<uint64_t>(key) & 0xffffffffu));
}

// ---- RoPE (kernels/rope.h: HF rotate_half, float32 angles) ----
// The angle as the CPU computes it: float(position) * inv_freq, one float32 rounding.
ECHOKV_HD float RopeAngle(int64_t position, float inv_freq) {
  return MulRn(static_cast<float>(position), inv_freq);
}
// cos and sin of that float32 angle, evaluated in double and rounded once: the correctly
// rounded value in all but rare halfway cases (LibTorch's CPU cos/sin are within 1 ulp
// of it). The device's double sincos costs nothing next to the loads around it.
ECHOKV_HD void RopeCosSin(int64_t position, float inv_freq, float* c, float* s) {
  const double a = static_cast<double>(RopeAngle(position, inv_freq));
#if defined(__CUDA_ARCH__)
  double sd, cd;
  sincos(a, &sd, &cd);
  *c = static_cast<float>(cd);
  *s = static_cast<float>(sd);
#else
  *c = static_cast<float>(std::cos(a));
  *s = static_cast<float>(std::sin(a));
#endif
}
// x' = x * cos + rotate_half(x) * sin for the pair (x_i, x_{i + d/2}) in float32, each
// product and the sum rounded as LibTorch rounds `xf * cos + rotated * sin`:
//   o1 = x1 c - x2 s,  o2 = x2 c + x1 s.
ECHOKV_HD void RopeRotate(float x1, float x2, float c, float s, float* o1, float* o2) {
  *o1 = AddRn(MulRn(x1, c), -MulRn(x2, s));
  *o2 = AddRn(MulRn(x2, c), MulRn(x1, s));
}

// ---- causal visibility (kernels/attention.h, kernels/score.h) ----
// A query at position qp sees a key at kp iff kp <= qp and, with window > 0, qp - kp < window.
ECHOKV_HD bool KeyVisible(int64_t key_position, int64_t query_position, int64_t window) {
  return key_position <= query_position && (window <= 0 || query_position - key_position < window);
}

// ---- online softmax ----
// Running max m and sum l = sum exp(s_j - m) of the logits seen so far; m = -inf and
// l = 0 while none was seen (then every weight below is 0, never NaN).
struct SoftmaxState {
  float m = -INFINITY;
  float l = 0.0f;
  // The factor that rescales what was accumulated against the old max.
  ECHOKV_HD static float Rescale(float m_old, float m_new) {
    return m_old == -INFINITY ? 0.0f : ExpF(m_old - m_new);
  }
  // Adds one logit; returns its weight exp(s - m_new) and sets *alpha to the factor
  // that the accumulated sums must be multiplied by first.
  ECHOKV_HD float Add(float s, float* alpha) {
    if (s == -INFINITY) {
      *alpha = 1.0f;
      return 0.0f;
    }
    const float m_new = s > m ? s : m;
    *alpha = Rescale(m, m_new);
    const float p = ExpF(s - m_new);
    l = l * *alpha + p;
    m = m_new;
    return p;
  }
  // Folds in another state (a split, a warp); *self_scale and *other_scale receive the
  // factors for this state's and the other's accumulated outputs.
  ECHOKV_HD void Merge(const SoftmaxState& o, float* self_scale, float* other_scale) {
    const float m_new = o.m > m ? o.m : m;
    if (m_new == -INFINITY) {
      *self_scale = 0.0f;
      *other_scale = 0.0f;
      return;
    }
    *self_scale = Rescale(m, m_new);
    *other_scale = Rescale(o.m, m_new);
    l = l * *self_scale + o.l * *other_scale;
    m = m_new;
  }
  // log(sum exp(s_j)): +inf when no logit was seen, so that exp(s - Lse()) is 0 (the
  // scores' convention for a query that sees no key).
  ECHOKV_HD float Lse() const { return l > 0.0f ? m + LogF(l) : INFINITY; }
};

// exp(logit - lse): a key's probability for a query whose log-sum-exp is lse (0 for an
// invisible key, logit = -inf, or a query that saw none, lse = +inf).
ECHOKV_HD float ProbFromLse(float logit, float lse) {
  if (logit == -INFINITY || lse == INFINITY) return 0.0f;
  return ExpF(logit - lse);
}

// ---- splits ----
// Splits of `split` keys over n keys (0 for n = 0).
ECHOKV_HD int64_t NumSplits(int64_t n, int64_t split) { return n <= 0 ? 0 : (n + split - 1) / split; }

}  // namespace echokv::kernels::cuda_math

#endif  // ECHOKV_KERNELS_CUDA_DEVICE_MATH_H_
