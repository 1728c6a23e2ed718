#include "kernels/weighted_sum.h"

#include <cstring>
#include <string>

#include "kernels/cpu_isa.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace echokv::kernels {
namespace {

// The portable build: plain loops. This file is compiled with -ffp-contract=off
// (kernels/CMakeLists.txt), so `acc += w * v` is a rounded product then a sum in every
// build, intrinsics included, whatever -march says.
template <int kDim>
void Portable(const float* p, const float* values, int64_t n, float* out) {
  constexpr int kChains = kDim >= 32 ? 1 : 4;
  float acc[kChains][kDim] = {};
  int64_t j = 0;
  for (; j + kChains <= n; j += kChains) {
    for (int c = 0; c < kChains; ++c) {
      const float w = p[j + c];
      const float* v = values + (j + c) * kDim;
      for (int i = 0; i < kDim; ++i) acc[c][i] += w * v[i];
    }
  }
  for (; j < n; ++j) {
    const float w = p[j];
    const float* v = values + j * kDim;
    for (int i = 0; i < kDim; ++i) acc[0][i] += w * v[i];
  }
  for (int c = 1; c < kChains; ++c) {
    for (int i = 0; i < kDim; ++i) acc[0][i] += acc[c][i];
  }
  std::memcpy(out, acc[0], sizeof(float) * kDim);
}

#if defined(__x86_64__)
// GCC 12's _mm512_undefined_ps (inside permutexvar and extractf64x4) trips its own
// uninitialized-use warnings (clang, for the fuzz build, has no such group).
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// d = 8: rows j and j + 1 are one 16-float load. Register a holds chains 0|1 (rows
// j = 0, 1 mod 4), b chains 2|3; each lane does exactly the portable build's operations.
__attribute__((target("avx512f"))) void Avx512Dim8(const float* p, const float* values, int64_t n, float* out) {
  __m512 a = _mm512_setzero_ps(), b = _mm512_setzero_ps();
  // Lane i of pair m's weights: p[2m + i / 8] of a 16-row block.
  const __m512i pair0 = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i two = _mm512_set1_epi32(2);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 pv = _mm512_loadu_ps(p + j);
    __m512i idx = pair0;
    for (int m = 0; m < 8; m += 2) {
      const __m512 wa = _mm512_permutexvar_ps(idx, pv);
      idx = _mm512_add_epi32(idx, two);
      const __m512 wb = _mm512_permutexvar_ps(idx, pv);
      idx = _mm512_add_epi32(idx, two);
      a = _mm512_add_ps(a, _mm512_mul_ps(wa, _mm512_loadu_ps(values + (j + 2 * m) * 8)));
      b = _mm512_add_ps(b, _mm512_mul_ps(wb, _mm512_loadu_ps(values + (j + 2 * m + 2) * 8)));
    }
  }
  for (; j + 4 <= n; j += 4) {
    const __m512 wa = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(p[j]), _mm512_set1_ps(p[j + 1]));
    const __m512 wb = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(p[j + 2]), _mm512_set1_ps(p[j + 3]));
    a = _mm512_add_ps(a, _mm512_mul_ps(wa, _mm512_loadu_ps(values + j * 8)));
    b = _mm512_add_ps(b, _mm512_mul_ps(wb, _mm512_loadu_ps(values + (j + 2) * 8)));
  }
  for (; j < n; ++j) {  // the last n mod 4 rows: chain 0 (a's low half) only
    const __m512 prod = _mm512_mul_ps(_mm512_set1_ps(p[j]), _mm512_maskz_loadu_ps(0x00FF, values + j * 8));
    a = _mm512_mask_add_ps(a, 0x00FF, a, prod);
  }
  // ((c0 + c1) + c2) + c3.
  const __m256 a_high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
  const __m256 b_high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(b), 1));
  __m256 s = _mm256_add_ps(_mm512_castps512_ps256(a), a_high);
  s = _mm256_add_ps(s, _mm512_castps512_ps256(b));
  s = _mm256_add_ps(s, b_high);
  _mm256_storeu_ps(out, s);
}

// d = 128: one chain, eight 16-lane accumulators, one row at a time.
__attribute__((target("avx512f"))) void Avx512Dim128(const float* p, const float* values, int64_t n, float* out) {
  __m512 acc[8];
  for (__m512& r : acc) r = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    const __m512 w = _mm512_set1_ps(p[j]);
    const float* v = values + j * 128;
    for (int i = 0; i < 8; ++i) acc[i] = _mm512_add_ps(acc[i], _mm512_mul_ps(w, _mm512_loadu_ps(v + 16 * i)));
  }
  for (int i = 0; i < 8; ++i) _mm512_storeu_ps(out + 16 * i, acc[i]);
}
#pragma GCC diagnostic pop
#endif

bool RunPortable(const float* p, const float* values, int64_t n, int64_t d, float* out) {
  if (d == 8) return Portable<8>(p, values, n, out), true;
  if (d == 128) return Portable<128>(p, values, n, out), true;
  return false;
}

bool RunAvx512(const float* p, const float* values, int64_t n, int64_t d, float* out) {
#if defined(__x86_64__)
  if (d == 8) return Avx512Dim8(p, values, n, out), true;
  if (d == 128) return Avx512Dim128(p, values, n, out), true;
#endif
  return false;
}

}  // namespace

void WeightedSumRowsChains(const float* p, const float* values, int64_t n, int64_t d, float* out) {
  static const bool avx512 = CpuRunsIsa("avx512");
  if (avx512) {
    RunAvx512(p, values, n, d, out);
  } else {
    RunPortable(p, values, n, d, out);
  }
}

bool WeightedSumRowsChainsWith(const char* isa, const float* p, const float* values, int64_t n, int64_t d,
                               float* out) {
  const std::string name = isa;
  if (name == "portable") return RunPortable(p, values, n, d, out);
  if (name == "avx512" && CpuRunsIsa("avx512")) return RunAvx512(p, values, n, d, out);
  return false;
}

}  // namespace echokv::kernels
